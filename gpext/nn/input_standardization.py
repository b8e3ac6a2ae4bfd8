r"""Input standardisation carried by a network itself: buffers and a forward pre-hook.

The data contract of gpext (:class:`gpext.fit.Standardizer`) for networks trained in weight
space (:mod:`gpext.subspace`): the network standardises its own inputs,

.. math::
    f(x) = g\big((x - \mu_x) / s_x\big),

with :math:`\mu_x, s_x` the column means and standard deviations of the training inputs
(inputs with more than two dimensions, such as images or sets, one location and scale over all
their entries; constant columns keep scale 1 with a :class:`~gpext.errors.DataWarning`).

The statistics are two *buffers* of the network's root module, ``gpext_input_loc`` and
``gpext_input_scale``, read by a forward pre-hook on the root module; nothing else changes:

* no parameter is added, so the flat weight vector of
  :class:`~gpext.subspace.FlatParameters` (and every SWAG, subspace or factor analysis built on
  it) is unchanged;
* no submodule is added, so an ``nn.Sequential`` network runs its layers as before;
* every evaluation of the network standardises, whoever calls it: ``module(x)``,
  :func:`torch.func.functional_call` (hence :func:`~gpext.subspace.predict_weight_samples`,
  :class:`~gpext.subspace.SubspaceModel`, ``vmap`` over weights),
  :func:`~gpext.subspace.refresh_batch_norm`, :class:`~gpext.subspace.BayesianLastLayer`;
* the statistics travel with ``module.state_dict()``, ``.to(device, dtype)`` and
  ``copy.deepcopy`` (a fresh network loads a saved state after
  :func:`attach_input_standardization`).

Integer inputs (e.g. token indices) are passed through unchanged.

Example:
    >>> net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))
    >>> x = torch.tensor([[1.0, 100.0], [3.0, 300.0]])
    >>> _ = standardize_inputs(net, x)
    >>> input_standardization(net)[1]
    tensor([  1.4142, 141.4214])
    >>> len(list(net.parameters()))  # no parameter added
    4
"""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, expected_got

__all__ = [
    "INPUT_LOC",
    "INPUT_SCALE",
    "attach_input_standardization",
    "has_input_standardization",
    "input_standardization",
    "remove_input_standardization",
    "standardize_inputs",
]

#: Names of the buffers on the network's root module.
INPUT_LOC, INPUT_SCALE = "gpext_input_loc", "gpext_input_scale"


def _standardize_hook(module: nn.Module, args: tuple) -> tuple | None:
    """Forward pre-hook: replace the first (floating) argument by ``(x - loc) / scale``."""
    if not args:
        return None
    x = args[0]
    loc = getattr(module, INPUT_LOC, None)
    if loc is None or loc.numel() == 0 or not torch.is_tensor(x) or not x.is_floating_point():
        return None
    scale = getattr(module, INPUT_SCALE)
    return ((x - loc.to(x.dtype)) / scale.to(x.dtype), *args[1:])


def _resize_on_load(module, state_dict, prefix, *_args) -> None:
    """Load pre-hook: give the (possibly empty) buffers the shapes of the state being loaded."""
    for key in (INPUT_LOC, INPUT_SCALE):
        value = state_dict.get(prefix + key)
        own = module._buffers.get(key)
        if value is not None and own is not None and value.shape != own.shape:
            module._buffers[key] = torch.empty(value.shape, dtype=own.dtype, device=own.device)


def _check_module(module: object, name: str) -> nn.Module:
    if not isinstance(module, nn.Module):
        raise InputTypeError(expected_got(name, "a torch.nn.Module", type(module).__name__))
    return module


def has_input_standardization(module: nn.Module) -> bool:
    """Whether ``module`` carries the input standardisation (fitted or not)."""
    return any(hook is _standardize_hook for hook in module._forward_pre_hooks.values())


def attach_input_standardization(module: nn.Module) -> nn.Module:
    """Give ``module`` the (unfitted, identity) input standardisation, if it has none.

    The buffers are empty until :func:`standardize_inputs` fits them or a state dict that
    holds them is loaded (``module.load_state_dict(saved)`` on a freshly built network).

    Returns:
        ``module``.

    Raises:
        InputTypeError: If ``module`` is not a :class:`torch.nn.Module`.
    """
    module = _check_module(module, "attach_input_standardization(module)")
    if has_input_standardization(module):
        return module
    like = next(iter(module.parameters()), None)
    kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
    if not (like is None or like.is_floating_point()):
        kwargs.pop("dtype")
    for key in (INPUT_LOC, INPUT_SCALE):
        module.register_buffer(key, torch.empty(0, **kwargs))
    module.register_forward_pre_hook(_standardize_hook)
    module.register_load_state_dict_pre_hook(_resize_on_load)
    return module


def standardize_inputs(
    module: nn.Module, x: torch.Tensor, *, kind: str = "standardize", name: str | None = None
) -> nn.Module:
    r"""Fit the input standardisation of ``module`` on training inputs ``x`` (attached if absent).

    * ``kind="standardize"`` (default): :math:`\mu_x, s_x` are :class:`gpext.fit.Standardizer`'s
      (float64 column means and standard deviations; constant columns keep scale 1 with a
      :class:`~gpext.errors.DataWarning`).
    * ``kind="unit_cube"``: :math:`\mu_x = \min_n x_n`, :math:`s_x = \max_n x_n - \min_n x_n`
      per column, so the training inputs fill :math:`[0, 1]^d` (BoTorch's ``Normalize``
      learned on the data; a constant column keeps scale 1, with the same warning).

    The statistics are stored in the network's dtype.  Integer inputs are left alone (nothing
    is fitted).

    Args:
        module: The network (changed in place).
        x: Training inputs. # shape: (N, ...)
        kind: ``"standardize"`` or ``"unit_cube"``.
        name: Name of the caller, for messages.

    Returns:
        ``module``.

    Raises:
        InputTypeError: If ``module`` is not a :class:`torch.nn.Module`.
        InputDataError: For inputs without rows or with non-finite values, or another
            ``kind``.
    """
    from gpext.fit.standardize import Standardizer  # gpext.fit imports much; keep gpext.nn light

    module = _check_module(module, "standardize_inputs(module)")
    if kind not in ("standardize", "unit_cube"):
        raise InputDataError(
            expected_got("standardize_inputs.kind", "'standardize' or 'unit_cube'", repr(kind))
        )
    if not (torch.is_tensor(x) and x.is_floating_point()):
        return module
    # the checks and the warning on constant columns are the Standardizer's in both cases
    stats = Standardizer(inputs=True, targets=False, name=name or "standardize_inputs").fit(x)
    loc, scale = stats.x_loc, stats.x_scale
    if kind == "unit_cube":
        v = x.detach().to(torch.float64)
        v = v.reshape(v.shape[0], -1) if x.dim() == 2 else v.reshape(-1, 1)
        low, span = v.min(0).values, v.max(0).values - v.min(0).values
        const = ~(span > 16 * torch.finfo(x.dtype).eps * low.abs().clamp_min(1e-300))
        loc, scale = low, torch.where(const, torch.ones_like(span), span)
    attach_input_standardization(module)
    dtype = getattr(module, INPUT_LOC).dtype
    dtype = dtype if dtype.is_floating_point else x.dtype
    setattr(module, INPUT_LOC, loc.to(device=x.device, dtype=dtype))
    setattr(module, INPUT_SCALE, scale.to(device=x.device, dtype=dtype))
    return module


def input_standardization(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(loc, scale)`` of a fitted input standardisation, else ``None``."""
    if not has_input_standardization(module):
        return None
    loc = getattr(module, INPUT_LOC)
    return None if loc.numel() == 0 else (loc, getattr(module, INPUT_SCALE))


def remove_input_standardization(module: nn.Module) -> nn.Module:
    """Remove the input standardisation (hook and buffers) from ``module``.

    Returns:
        ``module``.
    """
    for key, hook in list(module._forward_pre_hooks.items()):
        if hook is _standardize_hook:
            del module._forward_pre_hooks[key]
    for key, hook in list(module._load_state_dict_pre_hooks.items()):
        if getattr(hook, "hook", hook) is _resize_on_load:
            del module._load_state_dict_pre_hooks[key]
    for key in (INPUT_LOC, INPUT_SCALE):
        module._buffers.pop(key, None)
    return module

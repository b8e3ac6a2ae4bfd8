r"""Checks and the ``fantasize`` recipe shared by the adapters (BoTorch's ``Model.fantasize``).

The recipe is BoTorch's: draw fantasy observations :math:`\mathbf y \sim p(\mathbf y(X) \mid
\mathcal D)` with a sampler, then condition the model on them,

.. math::

    \text{fantasize}(X) = \big\{\, p(\,\cdot \mid \mathcal D \cup (X, \mathbf y^{(i)}))
        \,\big\}_{i=1}^{F}, \qquad \mathbf y^{(i)} = \text{sampler}(p(\mathbf y(X)
        \mid \mathcal D))_i,

so the fantasy model has batch shape ``F x batch`` (``F = sampler.sample_shape``).  How the
draws are made and how the conditioning is done is each adapter's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from botorch import settings as botorch_settings
from botorch.models.model import Model
from botorch.models.utils.assorted import fantasize as fantasize_flag
from botorch.sampling.base import MCSampler
from linear_operator import settings as lo_settings

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query, model_dtype

__all__ = ["check_observations", "noise_floor", "run_fantasize", "transform_outcomes"]

#: Relative noise floor for dtypes linear_operator's ``cholesky_jitter`` has no value for.
_RELATIVE_FLOOR_DEFAULT = 1e-6


def noise_floor(variances: torch.Tensor) -> torch.Tensor:
    r"""Smallest noise variance used in a conditioning: :math:`\rho\,\bar v`.

    :math:`\bar v` is the mean of ``variances`` over the last dimension (the prior variances at
    the conditioning points) and :math:`\rho` is ``linear_operator.settings.cholesky_jitter``
    for their dtype (``1e-6`` float32, ``1e-8`` float64), so noise-free observations are
    conditioned on with a jitter on the scale of the model's own variance.

    Args:
        variances: Prior variances at the conditioning points. # shape: (*batch, p)

    Returns:
        The floor. # shape: (*batch, 1)
    """
    try:
        rho = lo_settings.cholesky_jitter.value(variances.dtype)
    except RuntimeError:  # a dtype the setting does not cover
        rho = None
    rho = _RELATIVE_FLOOR_DEFAULT if rho is None else float(rho)
    tiny = torch.finfo(variances.dtype).tiny
    return rho * variances.mean(-1, keepdim=True).clamp_min(tiny)


def check_observations(
    model: Model,
    X: object,
    Y: object,
    noise: object,
    dtype: torch.dtype | None,
    what: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validate the arguments of ``condition_on_observations``.

    Args:
        model: The adapter being conditioned (for ``num_outputs``, ``batch_shape`` and ``d``).
        X: New inputs. # shape: (*batch_x, n, d)
        Y: New observations. # shape: (*batch_y, n, m)
        noise: ``None`` or noise variances broadcastable to ``Y``.
        dtype: The model's dtype.
        what: Name used in messages, e.g. ``"IGNSurrogate.condition_on_observations"``.

    Returns:
        ``(X, Y, noise)``, with ``noise`` expanded to ``broadcast(noise, Y)``.

    Raises:
        InputTypeError: If an argument is not a floating tensor of the model's dtype.
        ShapeError: If ``n``, ``m`` or the batch dimensions do not match.
        InputDataError: For non-finite values or negative noise variances.
    """
    check_query(X, getattr(model, "_input_dim", None), dtype, f"{what}(X)")
    m = model.num_outputs
    if not isinstance(Y, torch.Tensor) or not Y.is_floating_point():
        raise InputTypeError(
            expected_got(f"{what}(Y)", "a floating torch.Tensor", getattr(Y, "dtype", type(Y)))
        )
    if Y.dtype != X.dtype:
        raise InputTypeError(expected_got(f"{what}(Y)", f"dtype {X.dtype} like X", Y.dtype))
    n = X.shape[-2]
    if Y.dim() < 2 or Y.shape[-2] != n or Y.shape[-1] != m:
        raise ShapeError(
            expected_got(
                f"{what}(Y)",
                f"shape (*batch, {n}, {m}) (n points of X, num_outputs columns)",
                tuple(Y.shape),
                "Use Y.unsqueeze(-1) for a single output.",
            )
        )
    if not bool(torch.isfinite(Y).all()):
        raise InputDataError(expected_got(f"{what}(Y)", "finite entries", "NaN or inf"))
    try:
        torch.broadcast_shapes(X.shape[:-2], Y.shape[:-2], model.batch_shape)
    except RuntimeError as err:
        raise ShapeError(
            expected_got(
                what,
                f"batch shapes of X, Y and the model ({tuple(model.batch_shape)}) that broadcast",
                f"X {tuple(X.shape)} and Y {tuple(Y.shape)}",
            )
        ) from err
    if noise is None:
        return X, Y, None
    if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
        raise InputTypeError(
            expected_got(f"{what}(noise)", "None or a floating torch.Tensor", type(noise).__name__)
        )
    try:
        shape = torch.broadcast_shapes(noise.shape, Y.shape)
    except RuntimeError:
        shape = None
    if shape is None or shape[-2:] != Y.shape[-2:]:
        raise ShapeError(
            expected_got(
                f"{what}(noise)",
                f"variances broadcastable to Y's shape {tuple(Y.shape)}",
                tuple(noise.shape),
            )
        )
    if not bool(torch.isfinite(noise).all()) or bool((noise < 0).any()):
        raise InputDataError(
            expected_got(f"{what}(noise)", "finite non-negative variances", "other values")
        )
    return X, Y, noise.to(Y).expand(shape)


def transform_outcomes(model: Model, Y: torch.Tensor, Xt: torch.Tensor) -> torch.Tensor:
    """``Y`` in the outcome-transformed space (as BoTorch's ``condition_on_observations``).

    Args:
        model: The adapter (in eval mode).
        Y: Observations in the original space. # shape: (*batch, n, m)
        Xt: Transformed inputs. # shape: (*batch, n, d)

    Returns:
        The transformed observations (``Y`` itself without an outcome transform).
    """
    octf = getattr(model, "outcome_transform", None)
    if octf is None:
        return Y
    octf.eval()
    return octf(Y, X=Xt)[0]


def prepare_conditioning(
    base: Model,
    X: torch.Tensor,
    Y: torch.Tensor,
    noise: torch.Tensor | None,
    *,
    base_class: type,
    conditioned_class: type,
    what: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """The checks and transforms every conditioned adapter starts with.

    Checks that ``base`` is a ``base_class`` and, when it is already conditioned, that it
    exposes all its outputs; validates ``(X, Y, noise)`` (:func:`check_observations`); puts
    ``base`` in eval mode; and returns ``(X, Y, noise, Xt, Yt)`` with the inputs through the
    base's input transform and the targets through its outcome transform.

    Raises:
        InputTypeError: If ``base`` is not a ``base_class``.
        InputDataError: If ``base`` was restricted by ``subset_output``.
    """
    if not isinstance(base, base_class):
        raise InputTypeError(
            expected_got(f"{what}.base", f"a {base_class.__name__}", type(base).__name__)
        )
    if isinstance(base, conditioned_class) and base._output_subset is not None:
        raise InputDataError(
            f"{what}: expected a conditioned model exposing all its outputs, got one "
            "restricted by subset_output. Condition the full model, then subset it."
        )
    X, Y, noise = check_observations(base, X, Y, noise, model_dtype(base.model), what)
    base.eval()
    Xt = base.transform_inputs(X)
    return X, Y, noise, Xt, transform_outcomes(base, Y, Xt)


def run_fantasize(
    model: Model,
    X: object,
    sampler: object,
    observation_noise: object,
    draw: Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor],
    kwargs: dict[str, Any],
) -> Model:
    """BoTorch's fantasize contract on a gpext adapter.

    Args:
        model: The adapter (owes ``condition_on_observations``, ``num_outputs``, ``batch_shape``,
            ``model`` and ``_input_dim``).
        X: Points to fantasize at. # shape: (*batch, n, d)
        sampler: A BoTorch ``MCSampler``.
        observation_noise: ``None`` or noise variances (outcome-transformed space) of shape
            ``(*batch, 1, m)`` or ``(*batch, n, m)``.
        draw: ``draw(X, noise) -> Y`` returns the fantasy observations in the original outcome
            space, shape ``sampler.sample_shape x batch x n x m`` (``noise`` expanded to
            ``(*batch, n, m)`` or ``None``).
        kwargs: Options; ``propagate_grads`` is used here, the rest goes to
            ``condition_on_observations``.

    Returns:
        The fantasy model.

    Raises:
        InputTypeError: For a boolean ``observation_noise`` or a sampler that is not an
            ``MCSampler``.
        ShapeError: If ``observation_noise`` has the wrong shape.
    """
    name = f"{type(model).__name__}.fantasize"
    if observation_noise is not None and not isinstance(observation_noise, torch.Tensor):
        raise InputTypeError(
            expected_got(
                f"{name}(observation_noise)",
                "None (the model's own noise) or a tensor of noise variances",
                repr(observation_noise),
                "BoTorch's fantasize no longer takes booleans; pass None for the default.",
            )
        )
    if not isinstance(sampler, MCSampler):
        raise InputTypeError(
            expected_got(f"{name}(sampler)", "a BoTorch MCSampler", type(sampler).__name__)
        )
    X = check_query(X, getattr(model, "_input_dim", None), model_dtype(model.model), f"{name}(X)")
    n, m = X.shape[-2], model.num_outputs
    noise = None
    if observation_noise is not None:
        if (
            observation_noise.dim() < 2
            or observation_noise.shape[-1] != m
            or (observation_noise.shape[-2] not in (1, n))
        ):
            raise ShapeError(
                expected_got(
                    f"{name}(observation_noise)",
                    f"shape (*batch, 1, {m}) or (*batch, {n}, {m})",
                    tuple(observation_noise.shape),
                )
            )
        noise = observation_noise.to(X).expand(*observation_noise.shape[:-2], n, m)
    propagate_grads = kwargs.pop("propagate_grads", False)
    if n == 0:
        batch = torch.broadcast_shapes(X.shape[:-2], model.batch_shape)
        Y = X.new_empty(*sampler.sample_shape, *batch, 0, m)
    else:
        with fantasize_flag(), botorch_settings.propagate_grads(propagate_grads):
            Y = draw(X, noise)
    if noise is not None:
        kwargs["noise"] = noise.expand(Y.shape[1:])
    with fantasize_flag():
        return model.condition_on_observations(X=X, Y=Y, **kwargs)

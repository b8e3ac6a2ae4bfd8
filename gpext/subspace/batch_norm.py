"""Refreshing batch-norm statistics for sampled weights (from tensors or a loader)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from gpext.errors import ShapeError, expected_got
from gpext.subspace.data import _inputs_of, _is_loader, _merge_single_rows
from gpext.utils import check_positive_int

__all__ = ["has_batch_norm", "refresh_batch_norm"]


def has_batch_norm(module: nn.Module) -> bool:
    """Whether ``module`` contains a batch-norm layer with running statistics."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
        for m in module.modules()
    )


@torch.no_grad()
def refresh_batch_norm(
    module: nn.Module, inputs: torch.Tensor | Iterable, *, batch_size: int = 256
) -> nn.Module:
    r"""Recompute every batch-norm layer's running statistics with the current weights.

    Weights drawn from SWAG or a subspace differ from the ones the running statistics were
    accumulated with, so the statistics are reset and re-estimated by one pass over ``inputs``
    with a cumulative average (``momentum=None``), as SWAG does after each sample: after
    :math:`B` batches each layer holds

    .. math::

        \hat\mu = \frac1B \sum_{b=1}^B \bar x_b, \qquad
        \hat\sigma^2 = \frac1B \sum_{b=1}^B s_b^2

    (:math:`\bar x_b`, :math:`s_b^2` the mean and unbiased variance of batch :math:`b`).  The
    module's training mode and the layers' momenta are restored afterwards.

    ``inputs`` is a tensor, cut into batches of ``batch_size`` rows, or a loader of batches
    (:mod:`gpext.subspace.data`: tensors, or tuples whose first element is the input), read
    once with the loader's own batches.  Either way a batch of one row (no batch variance) is
    merged into its neighbour.

    Args:
        module: The network, with the sampled weights already assigned.
        inputs: Training inputs, or a loader of input batches. # shape: (N, ...)
        batch_size: Mini-batch size of the pass (tensor inputs only).

    Returns:
        ``module``.

    Raises:
        ShapeError: If ``inputs`` is empty or a batch is empty.
        InputDataError: For an empty loader or non-finite inputs in a loader.
        InputTypeError: For a loader whose batches hold no tensor.
    """
    batch_size = check_positive_int(batch_size, "refresh_batch_norm.batch_size")
    loader = _is_loader(inputs)
    if not loader and (inputs.dim() == 0 or inputs.shape[0] == 0):
        raise ShapeError(
            expected_got("refresh_batch_norm(inputs)", "at least one row", tuple(inputs.shape))
        )
    layers = [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not layers:
        if loader:  # still check the loader, as with batch norm
            for _ in _inputs_of(inputs, "refresh_batch_norm(inputs)"):
                break
        return module
    momenta = [m.momentum for m in layers]
    was_training = module.training
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    module.train()
    try:
        if loader:
            device = _device_of(module)
            batches = _inputs_of(inputs, "refresh_batch_norm(inputs)")
            for (xb,) in _merge_single_rows((b,) for b in batches):
                module(xb if device is None else xb.to(device))
        else:
            n = inputs.shape[0]
            starts = list(range(0, n, batch_size))
            if len(starts) > 1 and n - starts[-1] == 1:
                starts.pop()  # a batch of one point has no batch variance: merge it
            for i, start in enumerate(starts):
                stop = starts[i + 1] if i + 1 < len(starts) else n
                module(inputs[start:stop])
    finally:
        for m, mom in zip(layers, momenta):
            m.momentum = mom
        module.train(was_training)
    return module


def _device_of(module: nn.Module) -> torch.device | None:
    """Device of the module's first parameter (``None`` without parameters)."""
    for p in module.parameters():
        return p.device
    return None

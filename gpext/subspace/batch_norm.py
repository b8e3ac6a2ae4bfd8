"""Refreshing batch-norm statistics for sampled weights."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import ShapeError, expected_got
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
    module: nn.Module, inputs: torch.Tensor, *, batch_size: int = 256
) -> nn.Module:
    r"""Recompute every batch-norm layer's running statistics with the current weights.

    Weights drawn from SWAG or a subspace differ from the ones the running statistics were
    accumulated with, so the statistics are reset and re-estimated by one pass over ``inputs``
    with a cumulative average (``momentum=None``), as SWAG does after each sample. The module's
    training mode and the layers' momenta are restored afterwards.

    Args:
        module: The network, with the sampled weights already assigned.
        inputs: Training inputs. # shape: (N, ...)
        batch_size: Mini-batch size of the pass.

    Returns:
        ``module``.

    Raises:
        ShapeError: If ``inputs`` is empty.
    """
    batch_size = check_positive_int(batch_size, "refresh_batch_norm.batch_size")
    if inputs.dim() == 0 or inputs.shape[0] == 0:
        raise ShapeError(
            expected_got("refresh_batch_norm(inputs)", "at least one row", tuple(inputs.shape))
        )
    layers = [
        m
        for m in module.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    if not layers:
        return module
    momenta = [m.momentum for m in layers]
    was_training = module.training
    for m in layers:
        m.reset_running_stats()
        m.momentum = None
    module.train()
    n = inputs.shape[0]
    starts = list(range(0, n, batch_size))
    if len(starts) > 1 and n - starts[-1] == 1:
        starts.pop()  # a batch of one point has no batch variance: merge it into the previous
    for i, start in enumerate(starts):
        stop = starts[i + 1] if i + 1 < len(starts) else n
        module(inputs[start:stop])
    for m, mom in zip(layers, momenta):
        m.momentum = mom
    module.train(was_training)
    return module

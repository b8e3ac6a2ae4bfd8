"""An MLP regressor with a heteroscedastic Gaussian output."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.nn.mlp import MLP

__all__ = ["HeteroscedasticMLP"]


class HeteroscedasticMLP(nn.Module):
    r"""MLP whose two outputs parameterise :math:`p(y \mid x) = \mathcal{N}(\mu(x), \sigma^2(x))`.

    .. math::

        [\mu(x), \rho(x)] = g(x), \qquad \sigma^2(x) = \operatorname{softplus}(\rho(x)) + \sigma^2_{\min}

    (the heteroscedastic output of the drbayes UCI networks; 000 Sec. IV-B). The forward pass
    returns the raw ``(N, 2)`` output, which is what weight-space methods evaluate functionally;
    :meth:`mean_variance` reads it, identically to
    ``gpext.subspace.OutputLikelihood("heteroscedastic_gaussian")``.

    Args:
        in_features: Input dimension.
        hidden_features: Hidden widths (drbayes UCI: ``[50]``; 000 toy: ``[200, 50, 50, 50]``; one
            integer: one hidden layer).
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        min_variance: Variance floor :math:`\sigma^2_{\min}`.
        normalize_last_hidden: Unit-norm last hidden layer (see :class:`~gpext.nn.MLP`).

    Example:
        >>> net = HeteroscedasticMLP(3, [50])
        >>> mean, var = net.mean_variance(net(torch.randn(4, 3)))
        >>> mean.shape, bool((var > 0).all())
        (torch.Size([4]), True)
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: Sequence[int] = (50,),
        *,
        activation: str = "relu",
        min_variance: float = 1e-6,
        normalize_last_hidden: bool = False,
    ) -> None:
        super().__init__()
        if not min_variance >= 0:
            raise InputDataError(
                expected_got("HeteroscedasticMLP.min_variance", "a number >= 0", min_variance)
            )
        self.body = MLP(in_features, hidden_features, 2, activation=activation,
                        normalize_last_hidden=normalize_last_hidden)  # fmt: skip
        self.min_variance = float(min_variance)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Raw output ``[mu, rho]``. ``(N, D) -> (N, 2)``."""
        return self.body(x)

    def mean_variance(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance from the raw output. ``(..., 2) -> (...), (...)``."""
        if output.shape[-1] != 2:
            raise ShapeError(
                expected_got(
                    "HeteroscedasticMLP.mean_variance(output)",
                    "shape (..., 2)",
                    tuple(output.shape),
                )
            )
        return output[..., 0], F.softplus(output[..., 1]) + self.min_variance

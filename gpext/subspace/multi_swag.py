"""MultiSWAG: an equally weighted mixture of independently trained SWAG posteriors."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, expected_got
from gpext.subspace.swag import SWAG
from gpext.utils import check_positive_int

__all__ = ["MultiSWAG"]


class MultiSWAG(nn.Module):
    r"""Mixture :math:`\frac1M \sum_{m=1}^M \mathcal{N}(\bar w_m, \Sigma_m)` of SWAG posteriors.

    Each component comes from a separate training run (Wilson & Izmailov 2020). Samples are
    drawn in equal numbers from every component, so a Bayesian model average over them weights
    the components equally.

    Args:
        components: The SWAG posteriors (same number of weights).

    Raises:
        InputTypeError: If a component is not a :class:`SWAG`.
        InputDataError: If the list is empty or the weight dimensions differ.

    Example:
        >>> multi = MultiSWAG([swag_a, swag_b])  # doctest: +SKIP
        >>> multi.sample(5).shape               # doctest: +SKIP
        torch.Size([10, D])
    """

    def __init__(self, components: Sequence[SWAG]) -> None:
        super().__init__()
        components = list(components)
        if not components:
            raise InputDataError(expected_got("MultiSWAG(components)", "at least one SWAG", 0))
        for c in components:
            if not isinstance(c, SWAG):
                raise InputTypeError(
                    expected_got("MultiSWAG(components)", "SWAG instances", type(c).__name__)
                )
        dims = {c.num_parameters for c in components}
        if len(dims) != 1:
            raise InputDataError(
                expected_got("MultiSWAG(components)", "equal numbers of weights", sorted(dims))
            )
        self.components = nn.ModuleList(components)

    @property
    def num_components(self) -> int:
        """Number of mixture components ``M``."""
        return len(self.components)

    def sample(
        self,
        num_samples_per_component: int,
        *,
        scale: float = 0.5,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Draw the same number of weight vectors from every component.

        Args:
            num_samples_per_component: Draws ``S`` per component.
            scale: Covariance scale of each SWAG.
            generator: Random generator.

        Returns:
            Samples, component by component. # shape: (M * S, D)
        """
        s = check_positive_int(
            num_samples_per_component, "MultiSWAG.sample.num_samples_per_component"
        )
        return torch.cat([c.sample(s, scale=scale, generator=generator) for c in self.components])

    def mean(self) -> torch.Tensor:
        """Mixture mean. # shape: (D,)"""
        return torch.stack([c.mean for c in self.components]).mean(0)

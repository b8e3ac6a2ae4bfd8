"""MultiSWAG: a mixture of independently trained weight posteriors (SWAG or factor analysis)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpext.subspace.weight_posterior import WeightMixture, WeightPosterior

__all__ = ["MultiSWAG"]


class MultiSWAG(WeightMixture):
    r"""Mixture :math:`\frac1M \sum_{m=1}^M \mathcal{N}(\bar w_m, \Sigma_m)` of weight posteriors.

    Each component comes from a separate training run (Wilson & Izmailov 2020): usually a
    :class:`~gpext.subspace.SWAG`, but any :class:`~gpext.subspace.WeightPosterior` mixes,
    e.g. :class:`~gpext.subspace.OnlineFactorAnalysis` posteriors (004 argues for mixing
    factor-analysis posteriors).  A :class:`~gpext.subspace.WeightMixture` with equal weights:
    :meth:`sample` draws ``S`` weight vectors **in total**, ``S / M`` from every component
    when ``M`` divides ``S`` (component by component), so a Bayesian model average over them
    weights the components equally; ``mean`` is the mixture mean (a tensor, as for SWAG);
    :meth:`covariance` a low-rank-plus-diagonal LinearOperator.

    Args:
        components: The weight posteriors (same number of weights).

    Raises:
        InputTypeError: If a component is not a weight posterior.
        InputDataError: If the list is empty or the weight dimensions differ.

    Example:
        >>> multi = MultiSWAG([swag_a, swag_b])  # doctest: +SKIP
        >>> multi.sample(10).shape               # doctest: +SKIP
        torch.Size([10, D])
    """

    def __init__(self, components: Sequence[WeightPosterior]) -> None:
        super().__init__(components)

    def sample(
        self,
        num_samples: int,
        *,
        scale: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """``num_samples`` draws in all, split equally over the components.

        Args:
            num_samples: Total draws ``S``.
            scale: Covariance scale of every component (default: each component's own).
            generator: Random generator.

        Returns:
            Samples, component by component. # shape: (S, D)
        """
        kwargs = {} if scale is None else {"scale": scale}
        return super().sample(num_samples, generator=generator, **kwargs)

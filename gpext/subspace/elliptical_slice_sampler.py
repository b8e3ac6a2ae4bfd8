"""Elliptical slice sampling under an isotropic Gaussian prior (Murray, Adams & MacKay 2010)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from gpext.errors import InputDataError, NumericalError, ShapeError, expected_got
from gpext.utils import check_positive_int, progress_bar

__all__ = ["EllipticalSliceSampler"]


class EllipticalSliceSampler:
    r"""Markov chain for :math:`p(\theta \mid \mathcal{D}) \propto L(\theta)\, \mathcal{N}(\theta; 0, \sigma_p^2 I)`.

    One transition (Murray et al. 2010, Fig. 2; 000 Sec. III-C): draw
    :math:`\nu \sim \mathcal{N}(0, \sigma_p^2 I)`, a level
    :math:`\log y = \log L(\theta) + \log u`, :math:`u \sim U(0, 1)`, and an angle
    :math:`\phi \sim U(0, 2\pi)`; propose

    .. math::

        \theta' = \theta \cos\phi + \nu \sin\phi

    and shrink the angle bracket towards 0 until :math:`\log L(\theta') > \log y`. The chain
    leaves the posterior invariant and has no step size. Tempering is the caller's choice: pass
    :math:`\log L / T`.

    Args:
        log_likelihood: Function of ``theta`` (shape ``(r,)``) returning a scalar (tensor or
            float); it is called without gradients.
        dim: Dimension ``r``.
        prior_std: Prior standard deviation :math:`\sigma_p` (the same parameterisation as
            :class:`~gpext.subspace.MeanFieldGaussian`'s KL).
        max_shrinks: Shrinkage steps before giving up with a
            :class:`~gpext.errors.NumericalError` (a non-finite likelihood near the current
            state is the usual cause).
        generator: Random generator.

    Example:
        >>> ess = EllipticalSliceSampler(lambda t: -0.5 * (t - 1).pow(2).sum(), dim=2)
        >>> ess.sample(100).shape
        torch.Size([100, 2])
    """

    def __init__(
        self,
        log_likelihood: Callable[[torch.Tensor], torch.Tensor | float],
        dim: int,
        *,
        prior_std: float = 1.0,
        max_shrinks: int = 200,
        dtype: torch.dtype = torch.float64,
        generator: torch.Generator | None = None,
    ) -> None:
        if not callable(log_likelihood):
            raise InputDataError(
                expected_got(
                    "EllipticalSliceSampler.log_likelihood",
                    "a callable",
                    type(log_likelihood).__name__,
                )
            )
        self.log_likelihood = log_likelihood
        self.dim = check_positive_int(dim, "EllipticalSliceSampler.dim")
        if not prior_std > 0:
            raise InputDataError(
                expected_got("EllipticalSliceSampler.prior_std", "a number > 0", prior_std)
            )
        self.prior_std = float(prior_std)
        self.max_shrinks = check_positive_int(max_shrinks, "EllipticalSliceSampler.max_shrinks")
        self.dtype = dtype
        self.generator = generator
        self.num_evaluations = 0

    def _loglik(self, theta: torch.Tensor) -> float:
        self.num_evaluations += 1
        with torch.no_grad():
            return float(self.log_likelihood(theta))

    def _uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def step(self, theta: torch.Tensor, loglik: float) -> tuple[torch.Tensor, float]:
        """One elliptical slice transition from ``theta`` with ``loglik = log L(theta)``.

        Returns:
            ``(theta_new, loglik_new)``.

        Raises:
            NumericalError: If no acceptable point is found within ``max_shrinks`` shrinkages.
        """
        nu = self.prior_std * torch.randn(self.dim, generator=self.generator, dtype=self.dtype).to(
            theta
        )
        log_y = loglik + math.log(max(self._uniform(), 1e-300))
        phi = 2 * math.pi * self._uniform()
        lo, hi = phi - 2 * math.pi, phi
        for _ in range(self.max_shrinks):
            prop = theta * math.cos(phi) + nu * math.sin(phi)
            ll = self._loglik(prop)
            if ll > log_y:
                return prop, ll
            if phi < 0:
                lo = phi
            else:
                hi = phi
            phi = lo + (hi - lo) * self._uniform()
        raise NumericalError(
            f"EllipticalSliceSampler: no point above the slice after {self.max_shrinks} "
            "shrinkages; the log-likelihood is probably non-finite near the current state."
        )

    def sample(
        self,
        num_samples: int,
        *,
        initial: torch.Tensor | None = None,
        burn_in: int = 0,
        thin: int = 1,
        show_progress: bool | None = None,
    ) -> torch.Tensor:
        """Run the chain and return ``num_samples`` states after ``burn_in``, every ``thin``-th.

        Args:
            num_samples: Number of returned states ``S``.
            initial: Initial state (default zeros, i.e. the subspace centre). # shape: (r,)
            burn_in: Transitions discarded first.
            thin: Keep every ``thin``-th state.
            show_progress: Progress bar (``None``: only on a terminal).

        Returns:
            The states. # shape: (S, r)

        Raises:
            ShapeError: If ``initial`` has the wrong shape.
            NumericalError: If the initial log-likelihood is not finite.
        """
        num_samples = check_positive_int(num_samples, "EllipticalSliceSampler.num_samples")
        burn_in = check_positive_int(burn_in, "EllipticalSliceSampler.burn_in", minimum=0)
        thin = check_positive_int(thin, "EllipticalSliceSampler.thin")
        theta = (
            torch.zeros(self.dim, dtype=self.dtype) if initial is None else initial.detach().clone()
        )
        if theta.shape != (self.dim,):
            raise ShapeError(
                expected_got(
                    "EllipticalSliceSampler.initial", f"shape ({self.dim},)", tuple(theta.shape)
                )
            )
        ll = self._loglik(theta)
        if not math.isfinite(ll):
            raise NumericalError(
                f"EllipticalSliceSampler: log-likelihood at the initial state is {ll}; start from "
                "a state with a finite likelihood."
            )
        out = []
        total = burn_in + num_samples * thin
        for i in progress_bar(range(total), desc="ESS", show=show_progress):
            theta, ll = self.step(theta, ll)
            if i >= burn_in and (i - burn_in) % thin == thin - 1:
                out.append(theta)
        return torch.stack(out)

r"""One protocol for distributions over a network's flattened weights.

Every weight posterior in gpext (:class:`~gpext.subspace.SWAG`,
:class:`~gpext.subspace.OnlineFactorAnalysis`, and mixtures of them such as
:class:`~gpext.subspace.MultiSWAG`) is a :class:`WeightPosterior`:

* ``mean``: the posterior mean, a ``(D,)`` tensor;
* ``sample(num_samples, *, generator=None)``: ``(S, D)`` draws;
* ``log_prob(weights)``: the log density of ``(..., D)`` weight vectors;
* ``covariance()``: the ``D x D`` covariance as a :class:`~linear_operator.LinearOperator`
  (never a dense matrix unless asked for with ``.to_dense()``).

SWAG and factor analysis are both low-rank-plus-diagonal Gaussians,
:class:`LowRankGaussianWeightPosterior`; :class:`WeightMixture` mixes any of them.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence

import torch
from linear_operator import LinearOperator
from linear_operator.operators import (
    DiagLinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
)
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_positive_int
from gpext.utils.validation import as_float_tensor, check_finite, check_not_low_precision

__all__ = ["LowRankGaussianWeightPosterior", "WeightMixture", "WeightPosterior"]


class WeightPosterior(nn.Module):
    """Base class of distributions over flat weight vectors (see the module docstring)."""

    @property
    @abstractmethod
    def num_parameters(self) -> int:
        """Number of weights ``D``."""

    @property
    def posterior_mean(self) -> torch.Tensor:
        """The mean, ``(D,)`` (the same as ``mean``; a name no subclass buffer shadows)."""
        return self.mean

    @abstractmethod
    def sample(self, num_samples: int, *, generator: torch.Generator | None = None):
        """``(num_samples, D)`` draws."""

    @abstractmethod
    def log_prob(self, weights: torch.Tensor) -> torch.Tensor:
        """Log density of ``(..., D)`` weight vectors, shape ``(...)``."""

    @abstractmethod
    def covariance(self) -> LinearOperator:
        """The ``(D, D)`` covariance as a LinearOperator."""

    def _check_weights(self, weights: torch.Tensor, where: str) -> torch.Tensor:
        """Weight vectors ``(..., D)``: numpy, sequences and integers converted, at least
        single precision, at least one vector, finite."""
        weights = check_not_low_precision(as_float_tensor(weights, where), where)
        if weights.dim() < 1 or weights.shape[-1] != self.num_parameters:
            raise ShapeError(
                expected_got(where, f"shape (..., {self.num_parameters})", tuple(weights.shape))
            )
        if weights.numel() == 0:
            raise InputDataError(
                expected_got(where, "at least one weight vector", f"shape {tuple(weights.shape)}")
            )
        check_finite(weights, where)
        return weights


class LowRankGaussianWeightPosterior(WeightPosterior):
    r"""A Gaussian :math:`\mathcal N\big(\mu,\ s\,(F F^\top + \operatorname{diag}(\psi))\big)`.

    ``F`` is ``(D, K)`` and :math:`\psi \ge 0` (``None`` when there is no diagonal part);
    ``s`` is the covariance ``scale``.  Samples are
    :math:`\mu + \sqrt s\,(F z_1 + \psi^{1/2} \odot z_2)` with
    :math:`z_1 \sim \mathcal N(0, I_K)`, :math:`z_2 \sim \mathcal N(0, I_D)`; the log density
    uses the Woodbury identity and the matrix-determinant lemma with the ``K x K`` capacitance
    :math:`C = I_K + s F^\top (s\Psi)^{-1} F = I_K + F^\top \Psi^{-1} F`:

    .. math::

        \log p(w) = -\tfrac12\Big(D \log 2\pi + D \log s + \textstyle\sum_i \log\psi_i
        + \log\det C + \tfrac1s\big(r^\top \Psi^{-1} r - b^\top C^{-1} b\big)\Big),

    :math:`r = w - \mu`, :math:`b = F^\top \Psi^{-1} r`.  Without a positive diagonal the
    Gaussian is singular and has no density (:meth:`log_prob` raises).

    Subclasses provide :meth:`factor`, :meth:`diagonal_variance` and ``mean``, and set
    ``self.scale``.
    """

    scale: float = 1.0

    @abstractmethod
    def factor(self) -> torch.Tensor:
        """The factor ``F``, ``(D, K)`` (without the scale)."""

    @abstractmethod
    def diagonal_variance(self) -> torch.Tensor | None:
        r"""The diagonal :math:`\psi`, ``(D,)``, or ``None`` (without the scale)."""

    def _scale(self, scale: float | None, where: str) -> float:
        s = self.scale if scale is None else scale
        if not (isinstance(s, (int, float)) and math.isfinite(s) and s >= 0):
            raise InputDataError(expected_got(where, "a finite number >= 0", scale))
        return float(s)

    def sample(
        self,
        num_samples: int,
        *,
        scale: float | None = None,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        r"""Draw :math:`\mu + \sqrt s\,(F z_1 + \psi^{1/2} \odot z_2)`.

        Args:
            num_samples: Number of draws ``S``.
            scale: Covariance scale ``s`` (default: ``self.scale``).
            generator: Random generator.

        Returns:
            Samples. # shape: (S, D)
        """
        name = type(self).__name__
        num_samples = check_positive_int(num_samples, f"{name}.sample.num_samples")
        s = self._scale(scale, f"{name}.sample.scale")
        f, psi, mean = self.factor(), self.diagonal_variance(), self.mean
        kw = {"dtype": mean.dtype, "generator": generator}
        out = torch.randn(num_samples, f.shape[-1], **kw).to(mean.device) @ f.mT
        if psi is not None:
            z2 = torch.randn(num_samples, self.num_parameters, **kw).to(mean.device)
            out = out + z2 * psi.sqrt()
        return mean + math.sqrt(s) * out

    def covariance(self, *, scale: float | None = None) -> LinearOperator:
        r""":math:`s\,(F F^\top + \operatorname{diag}(\psi))` as a LinearOperator.

        A :class:`~linear_operator.operators.LowRankRootAddedDiagLinearOperator` (Woodbury
        solves, cheap log-determinants) when there is a diagonal part, else a
        :class:`~linear_operator.operators.LowRankRootLinearOperator`; ``.to_dense()`` gives the
        ``(D, D)`` matrix (small ``D`` only).

        Args:
            scale: Covariance scale ``s`` (default: ``self.scale``).
        """
        s = self._scale(scale, f"{type(self).__name__}.covariance.scale")
        root = LowRankRootLinearOperator(math.sqrt(s) * self.factor())
        psi = self.diagonal_variance()
        if psi is None:
            return root
        return LowRankRootAddedDiagLinearOperator(root, DiagLinearOperator(s * psi))

    def log_prob(self, weights: torch.Tensor, *, scale: float | None = None) -> torch.Tensor:
        """Log density (see the class docstring).

        Args:
            weights: Weight vectors. # shape: (..., D)
            scale: Covariance scale ``s`` (default: ``self.scale``).

        Returns:
            Log densities. # shape: (...)

        Raises:
            InputDataError: If the Gaussian is singular (no diagonal part, a zero entry of
                :math:`\\psi`, or ``s = 0``).
        """
        name = type(self).__name__
        weights = self._check_weights(weights, f"{name}.log_prob(weights)")
        s = self._scale(scale, f"{name}.log_prob.scale")
        psi = self.diagonal_variance()
        if psi is None or s == 0 or not bool((psi > 0).all()):
            raise InputDataError(
                f"{name}.log_prob: the Gaussian is singular (a low-rank covariance without a "
                "positive diagonal, or scale 0) and has no density. Use a posterior with a "
                "diagonal part (e.g. SWAG(..., diagonal=True))."
            )
        f = self.factor()
        r = (weights - self.mean).to(f.dtype)
        r_psi = r / psi
        b = r_psi @ f  # shape: (..., K)
        cap = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device) + (f.mT / psi) @ f
        chol = torch.linalg.cholesky(cap)
        c_inv_b = torch.cholesky_solve(b.unsqueeze(-1), chol).squeeze(-1)
        quad = (r * r_psi).sum(-1) - (b * c_inv_b).sum(-1)
        logdet = (
            self.num_parameters * math.log(s)
            + psi.log().sum()
            + 2 * chol.diagonal(dim1=-2, dim2=-1).log().sum()
        )
        return -0.5 * (self.num_parameters * math.log(2 * math.pi) + logdet + quad / s)


class WeightMixture(WeightPosterior):
    r"""A mixture :math:`\sum_m \pi_m\, p_m(w)` of weight posteriors (MultiSWAG's form).

    ``log_prob`` is :math:`\log \sum_m \pi_m p_m(w)` (log-sum-exp), the mean
    :math:`\mu = \sum_m \pi_m \mu_m` and the covariance

    .. math::

        \Sigma = \sum_m \pi_m \Sigma_m + \sum_m \pi_m (\mu_m - \mu)(\mu_m - \mu)^\top,

    a single low-rank-plus-diagonal LinearOperator when every component is a
    :class:`LowRankGaussianWeightPosterior` (roots :math:`\sqrt{\pi_m s_m} F_m` and
    :math:`\sqrt{\pi_m}(\mu_m - \mu)` side by side), else a sum of LinearOperators.
    :meth:`sample` is stratified: component ``m`` gets :math:`\lfloor S \pi_m \rfloor` draws and
    the remaining ones go to the components with the largest remainders, so with equal weights
    and ``S`` a multiple of ``M`` every component gets ``S / M`` (draws are returned component by
    component).

    Args:
        components: Weight posteriors over the same ``D`` weights (any mix of SWAG, factor
            analysis, or other :class:`WeightPosterior` s).
        mixing_weights: :math:`\pi` (non-negative, normalised here; default equal).

    Raises:
        InputTypeError: If a component is not a :class:`WeightPosterior`.
        InputDataError: For no components, different ``D`` or bad mixing weights.
    """

    def __init__(
        self,
        components: Sequence[WeightPosterior],
        mixing_weights: Sequence[float] | torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        components = list(components)
        if not components:
            raise InputDataError(
                expected_got(f"{name}(components)", "at least one weight posterior", 0)
            )
        for c in components:
            if not isinstance(c, WeightPosterior):
                raise InputTypeError(
                    expected_got(f"{name}(components)", "WeightPosterior instances (SWAG, "
                                 "OnlineFactorAnalysis, ...)", type(c).__name__)
                )  # fmt: skip
        dims = {c.num_parameters for c in components}
        if len(dims) != 1:
            raise InputDataError(
                expected_got(f"{name}(components)", "equal numbers of weights", sorted(dims))
            )
        if mixing_weights is None:
            pi = torch.full((len(components),), 1.0 / len(components), dtype=torch.float64)
        else:
            pi = torch.as_tensor(mixing_weights, dtype=torch.float64).flatten()
            ok = pi.shape[0] == len(components) and bool(torch.isfinite(pi).all())
            if not ok or bool((pi < 0).any()) or float(pi.sum()) <= 0:
                raise InputDataError(
                    expected_got(f"{name}.mixing_weights",
                                 f"{len(components)} finite non-negative numbers, not all 0",
                                 mixing_weights)
                )  # fmt: skip
            pi = pi / pi.sum()
        self.components = nn.ModuleList(components)
        self.register_buffer("mixing_weights", pi)

    @property
    def num_components(self) -> int:
        """Number of components ``M``."""
        return len(self.components)

    @property
    def num_parameters(self) -> int:
        """Number of weights ``D``."""
        return self.components[0].num_parameters

    @property
    def mean(self) -> torch.Tensor:
        r"""Mixture mean :math:`\sum_m \pi_m \mu_m`. # shape: (D,)"""
        means = torch.stack([c.posterior_mean for c in self.components])
        return (self.mixing_weights.to(means) @ means.flatten(1)).reshape(means.shape[1:])

    def allocation(self, num_samples: int) -> list[int]:
        """Draws per component in :meth:`sample` (largest-remainder rounding of ``S * pi``)."""
        exact = [num_samples * float(p) for p in self.mixing_weights]
        counts = [math.floor(e) for e in exact]
        order = sorted(range(len(exact)), key=lambda m: counts[m] - exact[m])
        for m in order[: num_samples - sum(counts)]:
            counts[m] += 1
        return counts

    def sample(
        self,
        num_samples: int,
        *,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """Stratified draws (see the class docstring).

        Args:
            num_samples: Total number of draws ``S``.
            generator: Random generator.
            **kwargs: Passed to every component's ``sample`` (e.g. ``scale``).

        Returns:
            Samples, component by component. # shape: (S, D)
        """
        s = check_positive_int(num_samples, f"{type(self).__name__}.sample.num_samples")
        parts = [
            c.sample(n, generator=generator, **kwargs)
            for c, n in zip(self.components, self.allocation(s))
            if n > 0
        ]
        return torch.cat(parts)

    def log_prob(self, weights: torch.Tensor, **kwargs) -> torch.Tensor:
        r""":math:`\log \sum_m \pi_m p_m(w)`. # weights shape: (..., D); returns (...)"""
        weights = self._check_weights(weights, f"{type(self).__name__}.log_prob(weights)")
        logs = torch.stack([c.log_prob(weights, **kwargs) for c in self.components], -1)
        return (logs + self.mixing_weights.to(logs).log()).logsumexp(-1)

    def covariance(self, **kwargs) -> LinearOperator:
        """The mixture covariance (see the class docstring) as a LinearOperator."""
        pi = self.mixing_weights
        mean = self.mean
        between = [
            math.sqrt(float(p)) * (c.posterior_mean - mean).unsqueeze(-1)
            for p, c in zip(pi, self.components)
        ]
        if all(isinstance(c, LowRankGaussianWeightPosterior) for c in self.components):
            roots, diag = [], None
            for p, c in zip(pi, self.components):
                s = c._scale(kwargs.get("scale"), f"{type(self).__name__}.covariance.scale")
                roots.append(math.sqrt(float(p) * s) * c.factor())
                psi = c.diagonal_variance()
                if psi is not None:
                    term = float(p) * s * psi
                    diag = term if diag is None else diag + term
            root = LowRankRootLinearOperator(torch.cat(roots + between, dim=-1))
            if diag is None:
                return root
            return LowRankRootAddedDiagLinearOperator(root, DiagLinearOperator(diag))
        total = LowRankRootLinearOperator(torch.cat(between, dim=-1))
        for p, c in zip(pi, self.components):
            total = total + c.covariance(**kwargs) * float(p)
        return total

"""Laplace approximation of a probit GP classifier with a non-zero prior mean (002, section 2.4)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import torch

from gpext.errors import InputDataError, NumericalWarning, ShapeError, expected_got
from gpext.utils import check_positive_int
from gpext.variational.feature_space_inducing_gp import _safe_cholesky

__all__ = ["ProbitLaplace"]

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class _LaplaceMode:
    """Newton's result: mode ``f``, ``a = Sigma^{-1}(f - mu)``, iterations and convergence."""

    f: torch.Tensor  # shape: (*b, N)
    a: torch.Tensor  # shape: (*b, N)
    iterations: int
    converged: bool


class ProbitLaplace:
    r"""Laplace approximation for :math:`y_i \sim \mathrm{Bernoulli}(\Phi(f_i))`, :math:`f \sim \mathcal{N}(\mu, \Sigma)`.

    In an inducing GP network the prior of the latent values of a minibatch is the conditional
    of 002 Eq. 2-4 without noise: :math:`\mu = K_{XZ}K_{ZZ}^{-1}\mathbf{r}`,
    :math:`\Sigma = K_{XX} - K_{XZ}K_{ZZ}^{-1}K_{ZX}`.  The mode
    :math:`\hat f = \arg\max_f \Psi(f)`, :math:`\Psi(f) = \log p(y \mid f) + \log \mathcal{N}(f; \mu, \Sigma)`,
    is found by Newton's method in the numerically stable form of Rasmussen & Williams (2006,
    Algorithm 3.1), extended to a prior mean and written in :math:`a = \Sigma^{-1}(f - \mu)` so that
    :math:`\Sigma` is never inverted (it may be singular):

    .. math::

        B = I + W^{1/2}\Sigma W^{1/2}, \quad b = W(f - \mu) + \nabla \log p(y \mid f), \quad
        a \leftarrow b - W^{1/2} B^{-1} W^{1/2} \Sigma b, \quad f \leftarrow \mu + \Sigma a,

    with :math:`W = -\nabla\nabla \log p(y \mid f)` (step halving if :math:`\Psi` decreases).  The
    approximate log marginal likelihood (002, section 2.4) is

    .. math::

        \log q(y \mid X, \theta) = \log p(y \mid \hat f) - \tfrac12 a^\top(\hat f - \mu)
        - \sum_i \log L_{ii}, \qquad L L^\top = B.

    :meth:`log_marginal_likelihood` finds the mode without gradients and then takes *one*
    differentiable Newton step from it.  Newton's map has zero Jacobian at its fixed point, so
    the gradient of that step with respect to :math:`(\mu, \Sigma)` equals the implicit
    derivative of the mode, and autograd through the objective at that step yields the exact
    total gradient of R&W Eq. 5.22-5.23, including the dependence of :math:`W` on :math:`\hat f`.
    Training alternates this mode search with a minibatch gradient step (002, section 2.4).

    Args:
        max_iter: Maximum Newton iterations.
        tol: Convergence tolerance on the largest change of :math:`\Psi` per point.
        jitter: Diagonal jitter added to :math:`\Sigma`.

    Example:
        >>> lap = ProbitLaplace()
        >>> mu, cov = torch.zeros(3), torch.eye(3)
        >>> lap.log_marginal_likelihood(mu, cov, torch.tensor([0, 1, 1])).shape
        torch.Size([])
    """

    def __init__(self, max_iter: int = 30, tol: float = 1e-6, jitter: float = 1e-6) -> None:
        self.max_iter = check_positive_int(max_iter, "ProbitLaplace.max_iter")
        if not (tol > 0 and jitter >= 0):
            raise InputDataError(
                expected_got("ProbitLaplace(tol, jitter)", "tol > 0 and jitter >= 0", (tol, jitter))
            )
        self.tol = float(tol)
        self.jitter = float(jitter)

    @staticmethod
    def log_likelihood_terms(
        f: torch.Tensor, signs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        r"""Per-point :math:`\log\Phi(s f)`, its gradient and :math:`W = -\partial^2/\partial f^2`.

        Args:
            f: Latent values, shape ``(*b, N)``.
            signs: :math:`s_i = 2 y_i - 1 \in \{-1, 1\}`, broadcastable to ``f``.

        Returns:
            ``(log_lik, grad, w)``, each of shape ``(*b, N)``.
        """
        z = signs * f
        log_cdf = torch.special.log_ndtr(z)
        ratio = torch.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_cdf)  # N(z) / Phi(z)
        grad = signs * ratio
        w = ratio * (ratio + z)
        return log_cdf, grad, w

    def _check(self, mu: torch.Tensor, cov: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        if cov.shape[-2:] != (mu.shape[-1], mu.shape[-1]) or cov.shape[:-2] != mu.shape[:-1]:
            raise ShapeError(
                expected_got(
                    "ProbitLaplace covariance",
                    f"shape {(*mu.shape, mu.shape[-1])}",
                    tuple(cov.shape),
                )
            )
        labels = torch.as_tensor(labels, device=mu.device)
        if labels.is_floating_point() and not bool(((labels == 0) | (labels == 1)).all()):
            raise InputDataError(
                expected_got("ProbitLaplace labels", "values in {0, 1}", "other values")
            )
        if not labels.is_floating_point() and not bool(((labels == 0) | (labels == 1)).all()):
            raise InputDataError(
                expected_got("ProbitLaplace labels", "values in {0, 1}", "other values")
            )
        return (2.0 * labels.to(mu.dtype) - 1.0).expand(mu.shape)

    def _newton_step(
        self, mu: torch.Tensor, cov: torch.Tensor, f: torch.Tensor, signs: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One Newton step from ``f``; returns the new ``(a, f)``."""
        _, grad, w = self.log_likelihood_terms(f, signs)
        sw = w.clamp_min(0.0).sqrt()  # shape: (*b, N)
        eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
        bmat = eye + sw.unsqueeze(-1) * cov * sw.unsqueeze(-2)
        chol = _safe_cholesky(bmat, 0.0 if self.jitter == 0 else 1e-10, "ProbitLaplace B")
        b = w * (f - mu) + grad
        c = sw * (cov @ b.unsqueeze(-1)).squeeze(-1)
        c = torch.cholesky_solve(c.unsqueeze(-1), chol).squeeze(-1)
        a = b - sw * c
        return a, mu + (cov @ a.unsqueeze(-1)).squeeze(-1)

    def _psi(self, mu, cov, a, signs) -> torch.Tensor:
        f = mu + (cov @ a.unsqueeze(-1)).squeeze(-1)
        log_lik, _, _ = self.log_likelihood_terms(f, signs)
        return log_lik.sum(-1) - 0.5 * (a * (f - mu)).sum(-1)

    @torch.no_grad()
    def find_mode(self, mu: torch.Tensor, cov: torch.Tensor, labels: torch.Tensor) -> _LaplaceMode:
        """Newton's method for the posterior mode, without gradients.

        Args:
            mu: Prior mean, shape ``(*b, N)``.
            cov: Prior covariance, shape ``(*b, N, N)``.
            labels: Binary labels in ``{0, 1}``, broadcastable to ``(*b, N)``.

        Returns:
            The mode (fields ``f``, ``a``, ``iterations``, ``converged``).  If ``max_iter`` is
            reached first a :class:`~gpext.errors.NumericalWarning` is issued.
        """
        mu, cov = mu.detach(), cov.detach()
        signs = self._check(mu, cov, labels)
        cov = cov + self.jitter * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        a = torch.zeros_like(mu)
        psi = self._psi(mu, cov, a, signs)
        n = mu.shape[-1]
        for it in range(1, self.max_iter + 1):
            a_new, _ = self._newton_step(mu, cov, mu + (cov @ a.unsqueeze(-1)).squeeze(-1), signs)
            step = a_new - a
            psi_new = self._psi(mu, cov, a_new, signs)
            for _ in range(10):  # step halving where the objective went down
                worse = psi_new < psi - 1e-12 * psi.abs()
                if not bool(worse.any()):
                    break
                step = torch.where(worse.unsqueeze(-1), 0.5 * step, step)
                a_new = a + step
                psi_new = self._psi(mu, cov, a_new, signs)
            gain = (psi_new - psi).abs().max() / n
            a, psi = a_new, psi_new
            if float(gain) < self.tol:
                return _LaplaceMode(mu + (cov @ a.unsqueeze(-1)).squeeze(-1), a, it, True)
        warnings.warn(
            f"ProbitLaplace: Newton did not converge in {self.max_iter} iterations "
            f"(last change of Psi per point {float(gain):.2e} > tol {self.tol:.1e}).",
            NumericalWarning,
            stacklevel=2,
        )
        return _LaplaceMode(mu + (cov @ a.unsqueeze(-1)).squeeze(-1), a, self.max_iter, False)

    def log_marginal_likelihood(
        self, mu: torch.Tensor, cov: torch.Tensor, labels: torch.Tensor
    ) -> torch.Tensor:
        r"""Laplace approximation of :math:`\log p(y \mid X, \theta)`, differentiable in ``mu``, ``cov``.

        Args:
            mu: Prior mean, shape ``(*b, N)``.
            cov: Prior covariance, shape ``(*b, N, N)``.
            labels: Binary labels in ``{0, 1}``, broadcastable to ``(*b, N)``.

        Returns:
            The approximate log marginal likelihood, shape ``(*b,)``.

        Raises:
            ShapeError: If ``cov`` does not match ``mu``.
            InputDataError: If a label is not 0 or 1.
        """
        signs = self._check(mu, cov, labels)
        mode = self.find_mode(mu, cov, labels)
        cov = cov + self.jitter * torch.eye(cov.shape[-1], dtype=cov.dtype, device=cov.device)
        a, f = self._newton_step(mu, cov, mode.f, signs)  # differentiable, value = mode
        log_lik, _, w = self.log_likelihood_terms(f, signs)
        sw = w.clamp_min(0.0).sqrt()
        eye = torch.eye(f.shape[-1], dtype=f.dtype, device=f.device)
        chol = _safe_cholesky(
            eye + sw.unsqueeze(-1) * cov * sw.unsqueeze(-2), 1e-10, "ProbitLaplace B"
        )
        half_logdet = chol.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        return log_lik.sum(-1) - 0.5 * (a * (f - mu)).sum(-1) - half_logdet

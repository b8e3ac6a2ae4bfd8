"""Closed-form variational-bootstrap particles against the exact linear-Gaussian posterior."""

import pytest
import torch

from gpext.bootstrap import solve_perturbed_map
from gpext.bootstrap.perturbed_map import _cholesky
from gpext.errors import InputDataError, NumericalError, NumericalWarning, ShapeError


def _problem(n=40, d=6, c=1, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    phi = torch.randn(n, d, generator=gen, dtype=torch.float64).to(dtype)
    y = torch.randn(n, c, generator=gen, dtype=torch.float64).to(dtype)
    return phi, y


def _exact_posterior(phi, y, noise, alpha2):
    """001 Eq. (3)/(9) with per-point noise: mean A^{-1} Phi^T S^{-1} y, covariance A^{-1}."""
    prec = 1.0 / noise
    a = phi.T @ (prec[:, None] * phi) + torch.eye(phi.shape[1], dtype=phi.dtype) / alpha2
    cov = torch.linalg.inv(a)
    return cov @ (phi.T @ (prec * y)), cov


class TestPosteriorMoments:
    """As K grows, particle mean and covariance approach the exact posterior (001 Eq. 9)."""

    seed = 11

    @pytest.mark.parametrize("heteroscedastic", [False, True])
    def test_moments_within_monte_carlo_error(self, heteroscedastic):
        phi, y = _problem(seed=self.seed)
        noise = torch.full_like(y, 0.3)
        if heteroscedastic:
            noise = 0.05 + torch.rand(
                y.shape, generator=torch.Generator().manual_seed(1), dtype=y.dtype
            )
        alpha2 = 1.5
        k = 20000
        w = solve_perturbed_map(
            phi, y, noise, alpha2, k, generator=torch.Generator().manual_seed(self.seed)
        )[:, 0]  # shape: (K, D)
        mean, cov = _exact_posterior(phi, y[:, 0], noise[:, 0], alpha2)
        # mean: each coordinate within 4.5 standard errors
        se_mean = (cov.diagonal() / k).sqrt()
        assert ((w.mean(0) - mean).abs() / se_mean).max() < 4.5
        # covariance: Var(S_ij) = (S_ii S_jj + S_ij^2) / K for Gaussian samples
        emp = torch.cov(w.T)
        se_cov = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / k).sqrt()
        assert ((emp - cov).abs() / se_cov).max() < 5.0

    def test_error_shrinks_with_more_particles(self):
        phi, y = _problem(seed=self.seed)
        noise = torch.full_like(y, 0.3)
        mean, cov = _exact_posterior(phi, y[:, 0], noise[:, 0], 1.0)
        errs = []
        for k in (100, 10000):
            w = solve_perturbed_map(
                phi, y, noise, 1.0, k, generator=torch.Generator().manual_seed(3)
            )[:, 0]
            errs.append(float(torch.linalg.norm(torch.cov(w.T) - cov) / torch.linalg.norm(cov)))
        assert errs[1] < errs[0] / 4  # expected ratio ~ sqrt(100) = 10


class TestSolverPaths:
    seed = 5

    def _dirichlet_like(self, dtype):
        phi, _ = _problem(n=60, d=12, c=3, dtype=dtype, seed=self.seed)
        labels = torch.arange(60) % 3
        alpha = torch.nn.functional.one_hot(labels, 3).to(dtype) + 0.01
        noise = torch.log1p(1.0 / alpha)
        return phi, alpha.log() - noise / 2, noise

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_primal_grouped_deviation_and_dual_agree(self, dtype):
        phi, y, noise = self._dirichlet_like(dtype)
        k = 7
        gen = torch.Generator().manual_seed(0)
        anchors = torch.randn(k, 3, 12, generator=gen, dtype=torch.float64).to(dtype)
        eps = (torch.randn(k, 60, 3, generator=gen, dtype=torch.float64).to(dtype)) * noise.sqrt()
        kw = dict(anchors=anchors, perturbations=eps)
        grouped = solve_perturbed_map(phi, y, noise, 2.0, k, method="primal", **kw)
        deviation = solve_perturbed_map(phi, y, noise, 2.0, k, method="primal", gram_memory=0, **kw)
        dual = solve_perturbed_map(phi, y, noise, 2.0, k, method="dual", **kw)
        tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(grouped, deviation, **tol)
        torch.testing.assert_close(grouped, dual, **tol)
        assert grouped.dtype == dtype

    def test_particle_is_the_perturbed_map(self):
        """Each particle minimises 001 Eq. (7): compare with a least-squares reference."""
        phi, y, noise = self._dirichlet_like(torch.float64)
        k, alpha2 = 3, 0.7
        gen = torch.Generator().manual_seed(1)
        anchors = torch.randn(k, 3, 12, generator=gen, dtype=torch.float64)
        eps = torch.randn(k, 60, 3, generator=gen, dtype=torch.float64) * noise.sqrt()
        w = solve_perturbed_map(phi, y, noise, alpha2, k, anchors=anchors, perturbations=eps)
        for j in range(k):
            for c in range(3):
                s = noise[:, c].rsqrt()
                lhs = torch.cat([s[:, None] * phi, torch.eye(12, dtype=phi.dtype) / alpha2**0.5])
                rhs = torch.cat([s * (y[:, c] + eps[j, :, c]), anchors[j, c] / alpha2**0.5])
                ref = torch.linalg.lstsq(lhs, rhs[:, None]).solution[:, 0]
                torch.testing.assert_close(w[j, c], ref, rtol=1e-8, atol=1e-8)

    def test_seeded_generator_reproduces(self):
        phi, y = _problem()
        noise = torch.full_like(y, 0.2)
        a = solve_perturbed_map(phi, y, noise, 1.0, 4, generator=torch.Generator().manual_seed(9))
        b = solve_perturbed_map(phi, y, noise, 1.0, 4, generator=torch.Generator().manual_seed(9))
        torch.testing.assert_close(a, b)


class TestErrors:
    def test_bad_inputs(self):
        phi, y = _problem()
        noise = torch.full_like(y, 0.2)
        with pytest.raises(ShapeError, match="features/targets"):
            solve_perturbed_map(phi, y[:-1], noise, 1.0, 2)
        with pytest.raises(ShapeError, match="noise"):
            solve_perturbed_map(phi, y, noise[:-1], 1.0, 2)
        with pytest.raises(InputDataError, match="finite positive"):
            solve_perturbed_map(phi, y, -noise, 1.0, 2)
        with pytest.raises(InputDataError, match="prior_variance"):
            solve_perturbed_map(phi, y, noise, 0.0, 2)
        with pytest.raises(InputDataError, match="method"):
            solve_perturbed_map(phi, y, noise, 1.0, 2, method="qr")
        with pytest.raises(InputDataError, match="num_particles"):
            solve_perturbed_map(phi, y, noise, 1.0, 0)
        with pytest.raises(ShapeError, match="anchors"):
            solve_perturbed_map(
                phi, y, noise, 1.0, 2, anchors=torch.zeros(3, 1, 6, dtype=phi.dtype)
            )
        bad = phi.clone()
        bad[0, 0] = float("nan")
        with pytest.raises(InputDataError, match="NaN"):
            solve_perturbed_map(bad, y, noise, 1.0, 2)

    def test_cholesky_fallback_warns_then_fails(self):
        singular = torch.ones(4, 4, dtype=torch.float64)
        with pytest.warns(NumericalWarning, match="jitter"):
            chol = _cholesky(singular, "test", None)
        assert torch.isfinite(chol).all()
        with pytest.raises(NumericalError, match="Cholesky"):
            _cholesky(-torch.eye(3, dtype=torch.float64), "test", None)

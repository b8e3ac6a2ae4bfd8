"""Tests for the probit Laplace approximation of inducing GP networks (002, section 2.4)."""

import warnings

import numpy as np
import pytest
import scipy.optimize
import scipy.stats
import torch

from gpext.errors import InputDataError, NumericalWarning, ShapeError
from gpext.models.ign_probit_laplace import ProbitLaplace


def _problem(n=10, dtype=torch.float64, seed=0, ls=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, generator=gen, dtype=dtype)
    mu = 0.5 * torch.randn(n, generator=gen, dtype=dtype)
    y = (torch.rand(n, generator=gen) < 0.5).long()
    return x, mu, y


def _cov(x, ls):
    return 2.0 * torch.exp(-0.5 * (x - x.T) ** 2 / ls**2) + 0.3 * torch.eye(
        x.shape[0], dtype=x.dtype
    )


def _reference_log_marginal(mu, cov, y, f):
    s = 2 * y - 1
    z = s * f
    ratio = scipy.stats.norm.pdf(z) / scipy.stats.norm.cdf(z)
    w = ratio * (ratio + z)
    d = f - mu
    quad = d @ np.linalg.solve(cov, d)
    sw = np.sqrt(w)
    logdet = np.linalg.slogdet(np.eye(len(f)) + sw[:, None] * cov * sw[None])[1]
    return scipy.stats.norm.logcdf(z).sum() - 0.5 * quad - 0.5 * logdet


class TestProbitLaplace:
    def setup_method(self):
        torch.manual_seed(3)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_mode_finding_converges_to_the_maximiser(self, dtype):
        x, mu, y = _problem(dtype=dtype)
        cov = _cov(x, 1.0)
        lap = ProbitLaplace(jitter=0.0, tol=1e-7)
        mode = lap.find_mode(mu, cov, y)
        assert mode.converged and mode.iterations < 10
        # stationarity: grad log p(y|f) = Sigma^{-1} (f - mu) = a
        _, grad, _ = lap.log_likelihood_terms(mode.f, 2.0 * y.to(dtype) - 1.0)
        torch.testing.assert_close(
            grad, mode.a, atol=1e-4 if dtype == torch.float32 else 1e-7, rtol=0
        )
        c, m, s = cov.double().numpy(), mu.double().numpy(), 2 * y.numpy() - 1
        ci = np.linalg.inv(c)

        def neg_psi(f):
            return -(scipy.stats.norm.logcdf(s * f).sum() - 0.5 * (f - m) @ ci @ (f - m))

        ref = scipy.optimize.minimize(neg_psi, m, method="BFGS", options={"gtol": 1e-10}).x
        np.testing.assert_allclose(
            mode.f.double().numpy(), ref, atol=1e-3 if dtype == torch.float32 else 1e-5
        )

    def test_log_marginal_value_against_numpy(self):
        x, mu, y = _problem(n=12, seed=1)
        cov = _cov(x, 0.8)
        lap = ProbitLaplace(jitter=0.0, tol=1e-10)
        val = lap.log_marginal_likelihood(mu, cov, y)
        f = lap.find_mode(mu, cov, y).f.numpy()
        ref = _reference_log_marginal(mu.numpy(), cov.numpy(), y.numpy(), f)
        np.testing.assert_allclose(float(val), ref, rtol=1e-8)

    def test_gradient_is_the_total_derivative(self):
        """One differentiable Newton step from the mode gives the exact implicit gradient."""
        x, mu, y = _problem(n=12, seed=2)
        lap = ProbitLaplace(jitter=0.0, tol=1e-12)
        ls = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)
        shift = torch.tensor(0.2, dtype=torch.float64, requires_grad=True)
        val = lap.log_marginal_likelihood(mu + shift, _cov(x, ls), y)
        g_ls, g_shift = torch.autograd.grad(val, [ls, shift])
        eps = 1e-5
        with torch.no_grad():

            def f(a, b):
                return float(
                    lap.log_marginal_likelihood(
                        mu + b, _cov(x, torch.tensor(a, dtype=torch.float64)), y
                    )
                )

            fd_ls = (f(0.9 + eps, 0.2) - f(0.9 - eps, 0.2)) / (2 * eps)
            fd_shift = (f(0.9, 0.2 + eps) - f(0.9, 0.2 - eps)) / (2 * eps)
        np.testing.assert_allclose(float(g_ls), fd_ls, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(float(g_shift), fd_shift, rtol=1e-5, atol=1e-7)

    def test_batched_equals_separate(self):
        x, mu, y = _problem(n=8, seed=4)
        covs = torch.stack([_cov(x, 0.5), _cov(x, 2.0)])
        mus = torch.stack([mu, -mu])
        ys = torch.stack([y, 1 - y])
        lap = ProbitLaplace(tol=1e-10)
        batched = lap.log_marginal_likelihood(mus, covs, ys)
        assert batched.shape == (2,)
        for i in range(2):
            torch.testing.assert_close(
                batched[i], lap.log_marginal_likelihood(mus[i], covs[i], ys[i])
            )

    def test_singular_prior_covariance(self):
        """A rank-one Sigma (e.g. K_X|Z of points at the same place) needs no inverse."""
        n = 6
        v = torch.randn(n, 1, dtype=torch.float64)
        cov = v @ v.T
        y = torch.tensor([0, 1, 1, 0, 1, 1])
        val = ProbitLaplace(jitter=0.0).log_marginal_likelihood(
            torch.zeros(n, dtype=torch.float64), cov, y
        )
        assert torch.isfinite(val)

    def test_non_convergence_warns(self):
        x, mu, y = _problem()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            mode = ProbitLaplace(max_iter=1, tol=1e-14).find_mode(mu, 50 * _cov(x, 1.0), y)
        assert not mode.converged
        assert any(issubclass(w.category, NumericalWarning) for w in rec)

    def test_errors(self):
        lap = ProbitLaplace()
        with pytest.raises(InputDataError, match="values in"):
            lap.log_marginal_likelihood(torch.zeros(3), torch.eye(3), torch.tensor([0, 2, 1]))
        with pytest.raises(ShapeError, match="covariance"):
            lap.log_marginal_likelihood(torch.zeros(3), torch.eye(4), torch.tensor([0, 1, 1]))
        with pytest.raises(InputDataError, match="tol"):
            ProbitLaplace(tol=-1.0)

"""Precision of the W2 estimator: float32 against float64, and no silent clamping."""

from __future__ import annotations

import warnings

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.errors import NumericalWarning
from gpext.variational import (
    WassersteinVariationalDistribution,
    WassersteinVariationalStrategy,
    wasserstein2_estimate,
)


class _GWI(gpytorch.models.ApproximateGP):
    def __init__(self, z, kernel, **kwargs):
        dist = WassersteinVariationalDistribution(z.shape[-2])
        super().__init__(WassersteinVariationalStrategy(self, z, dist, **kwargs))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x):
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _dense_1d_model(dtype, n, init, w2_jitter, seed=0):
    """``n`` dense points on [0, 1], RBF prior (lengthscale 0.1), 15 inducing data points.

    ``init="data"``: ``L`` at the sparse posterior that the GWI models start from;
    ``init="random"``: a random ``L`` (``Q`` far from ``P``).  Built in float64 and cast, with
    one ``K_ZZ`` jitter for both dtypes, so that both dtypes see the same model and inputs.
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=gen, dtype=torch.float64)
    z = x[torch.randperm(n, generator=gen)[:15]].clone()
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kernel.base_kernel.lengthscale = 0.1
    model = _GWI(z, kernel, w2_jitter=w2_jitter, jitter_val=1e-6).double()
    strategy = model.variational_strategy
    if init == "data":
        strategy.initialize_from_data(x, 0.01)
    else:
        with torch.no_grad():
            strategy._variational_distribution.chol_factor.normal_(generator=gen).mul_(0.3)
        strategy.variational_params_initialized.fill_(1)
    return model.to(dtype), x.to(dtype)


def _estimate(dtype, n, init, w2_jitter):
    model, x = _dense_1d_model(dtype, n, init, w2_jitter)
    subsample = torch.randperm(n, generator=torch.Generator().manual_seed(1))[:100]
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)  # jitter escalation with jitter 0
        return model.variational_strategy.wasserstein_distance(x, subsample=subsample)


@pytest.mark.parametrize(
    "n, init, w2_jitter",
    [(100, "data", None), (100, "data", 0.0), (300, "random", None), (100, "random", 0.0)],
)
def test_float32_estimate_matches_float64_on_dense_1d_inputs(n, init, w2_jitter):
    # Regression test: the float32 estimate was 5% (default jitter) to 15% (w2_jitter=0) low
    # on these inputs, and with Q far from P clamped to 0 (100% low) without a word.
    ref = _estimate(torch.float64, n, init, w2_jitter)
    est = _estimate(torch.float32, n, init, w2_jitter)
    assert est.dtype == torch.float32 and float(ref) > 0.1
    assert abs(float(est) / float(ref) - 1) < 0.01


def test_float32_estimate_has_finite_gradients():
    model, x = _dense_1d_model(torch.float32, 200, "random", None)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        model(x)
        w2 = model.variational_strategy.kl_divergence()
    w2.backward()
    grads = [p.grad for p in model.variational_strategy.parameters() if p.grad is not None]
    assert w2.dtype == torch.float32 and grads
    assert all(bool(torch.isfinite(g).all()) for g in grads)


def _gram(n=30, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    k = gpytorch.kernels.MaternKernel(nu=0.5).double()(x).to_dense().detach()
    return k


def test_negative_estimate_warns_instead_of_silently_clamping():
    # inconsistent inputs (r(x, x) = 0 on the diagonal, yet r(X_S, X) = k): the raw estimate
    # is -tr(K)/N; it used to be clamped to 0 silently
    k = _gram()
    n = k.shape[0]
    zero = torch.zeros(n, dtype=torch.float64)
    with pytest.warns(NumericalWarning, match="negative"):
        est = wasserstein2_estimate(zero, zero, k.diagonal(), zero, k, k, k, k, jitter=0.0)
    assert float(est) == 0.0


def test_zero_distance_does_not_warn():
    # Q = P: the estimate is 0 up to rounding, which is clamped without a warning
    k = _gram(seed=1)
    n = k.shape[0]
    m = torch.randn(n, dtype=torch.float64)
    for dtype in (torch.float64, torch.float32):
        args = [t.to(dtype) for t in (m, m, k.diagonal(), k.diagonal(), k, k, k, k)]
        with warnings.catch_warnings():
            warnings.simplefilter("error", NumericalWarning)
            est = wasserstein2_estimate(*args, jitter=1e-6)
        assert 0.0 <= float(est) < 1e-5

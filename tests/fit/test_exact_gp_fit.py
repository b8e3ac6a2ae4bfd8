"""fit_exact_gp: MAP optimum, restarts, and no silent collapse of the signal variance."""

import warnings

import pytest
import torch
from scipy.optimize import minimize

from gpext.errors import ConstantPredictionWarning, VarianceCollapseWarning
from gpext.fit import (
    StopReason,
    build_exact_gp,
    check_predictions_vary,
    check_signal_to_noise,
    fit_exact_gp,
)
from gpext.fit.exact_gp import _map_loss


def _data(dtype=torch.float64, n=40, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=dtype)
    y = torch.sin(6 * x[:, 0]) + 0.5 * x[:, -1] + 0.05 * torch.randn(n, generator=gen, dtype=dtype)
    return x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_reaches_the_map_optimum_of_a_reference_optimiser(dtype):
    x, y = _data(dtype)
    model = build_exact_gp(x, y)
    res = fit_exact_gp(model, num_restarts=3)
    assert res.stop_reason == StopReason.CONVERGED and len(res.restarts) == 3
    assert res.final_loss == min(r.loss for r in res.restarts)
    # scipy's L-BFGS-B from the fitted point cannot improve the MAP loss
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()

    def f(v):
        with torch.no_grad():
            off = 0
            for p in params:
                p.copy_(torch.as_tensor(v[off : off + p.numel()]).view_as(p))
                off += p.numel()
        for p in params:
            p.grad = None
        loss = _map_loss(model)
        loss.backward()
        return float(loss), torch.cat([p.grad.reshape(-1) for p in params]).double().numpy()

    start = torch.cat([p.detach().reshape(-1) for p in params]).double().numpy()
    ref = minimize(f, start, jac=True, method="L-BFGS-B", options={"maxiter": 500})
    tol = 1e-4 if dtype == torch.float32 else 1e-7
    assert res.final_loss <= ref.fun + tol * max(1.0, abs(ref.fun))
    assert res.grad_norm < (1e-2 if dtype == torch.float32 else 1e-4)


def test_multi_output_and_fixed_noise_shapes():
    x, y = _data()
    y2 = torch.stack([y, -y, 2 * y], -1)
    model = build_exact_gp(x, y2, shared_noise=False)
    fit_exact_gp(model, num_restarts=1)
    assert model.mean_module.constant.shape == (3,)
    assert model.likelihood.noise.shape[0] == 3
    fixed = build_exact_gp(x, y2, noise=torch.full_like(y2, 0.01))
    res = fit_exact_gp(fixed, num_restarts=2)
    assert res.stop_reason == StopReason.CONVERGED


def _hartmann(seed, n=20):
    hartmann = pytest.importorskip("botorch.test_functions").Hartmann(dim=6)
    x = torch.quasirandom.SobolEngine(6, scramble=True, seed=seed).draw(n).double()
    y = hartmann(x)
    return x, (y - y.mean()) / y.std()


@pytest.mark.parametrize("seed", [2, 3, 7])
def test_small_design_does_not_collapse_with_defaults(seed):
    """Hartmann-6 with 20 Sobol points: maximum likelihood from one start collapses here.

    (outputscale ~1e-5, noise 0.95: the old ``fit_rbf_hyperparameters``); that optimum is
    now reported, and the default MAP fit with restarts avoids it.
    """
    x, y = _hartmann(seed)
    ml = build_exact_gp(x, y, priors=False, standardize=False)
    with pytest.warns(VarianceCollapseWarning, match="collapsed into the noise"):
        res = fit_exact_gp(ml, num_restarts=1)
    assert "VarianceCollapseWarning" in res.problems
    model = build_exact_gp(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("error", VarianceCollapseWarning)
        warnings.simplefilter("error", ConstantPredictionWarning)
        res = fit_exact_gp(model)
    assert float(model.covar_module.outputscale) / float(model.likelihood.noise) > 10
    assert res.ok


def test_checks_warn_and_record():
    from gpext.fit import FitResult

    r = FitResult()
    with pytest.warns(VarianceCollapseWarning):
        assert not check_signal_to_noise(1e-9, 1.0, name="m", result=r)
    with pytest.warns(ConstantPredictionWarning):
        assert not check_predictions_vary(torch.full((10,), 0.3), torch.randn(10), name="m",
                                          result=r)  # fmt: skip
    assert r.problems == ["VarianceCollapseWarning", "ConstantPredictionWarning"]
    assert check_signal_to_noise(1.0, 0.1, name="m")
    assert check_predictions_vary(torch.arange(5.0), torch.arange(5.0), name="m")


def test_log_prior_at_an_underflowed_value_is_finite_not_an_error():
    """A line-search trial point with outputscale softplus(-1000) = 0 raised ValueError."""
    from gpext.fit import log_prior

    x, y = _data()
    model = build_exact_gp(x, y)
    with torch.no_grad():
        model.covar_module.raw_outputscale.fill_(-1000.0)
    assert float(model.covar_module.outputscale) == 0.0
    value = log_prior(model)
    assert torch.isfinite(value) and float(value) < -1e4


def test_gap_toy_that_crashed_the_fit_now_fits():
    """1-D gap toy of benchmarks/robustness.py (seed 2): the fit raised ValueError before."""
    gen = torch.Generator().manual_seed(1002)
    side = torch.randint(0, 2, (300,), generator=gen).double()
    x = ((torch.rand(300, generator=gen, dtype=torch.float64) * 4 + 2) * (2 * side - 1))[:, None]
    y = torch.sin(x[:, 0]) + 0.15 * torch.randn(300, generator=gen, dtype=torch.float64)
    x, y = (x - x.mean()) / x.std(), (y - y.mean()) / y.std()
    model = build_exact_gp(x, y)
    res = fit_exact_gp(model, generator=torch.Generator().manual_seed(2))
    assert res.ok and res.stop_reason == StopReason.CONVERGED


def test_log_prior_counts_a_submodule_reached_twice_once():
    """NystromKPCAKernel holds its base kernel under two names; its prior counts once."""
    import gpytorch
    from gpytorch.priors import LogNormalPrior

    from gpext.fit.exact_gp import log_prior
    from gpext.kernels import NystromKPCAKernel

    base = gpytorch.kernels.MaternKernel(nu=2.5, lengthscale_prior=LogNormalPrior(0.0, 1.0))
    kernel = NystromKPCAKernel(base, torch.randn(10, 2))
    assert len(list(kernel.named_priors())) == 2  # GPyTorch lists it twice
    torch.testing.assert_close(log_prior(kernel), log_prior(base))


def test_a_model_without_priors_is_fitted_from_one_start():
    # restarts are prior draws: without priors each would repeat the first start
    x, y = _data()
    model = build_exact_gp(x, y, priors=False)
    res = fit_exact_gp(model, num_restarts=4)
    assert len(res.restarts) == 1
    with_priors = fit_exact_gp(build_exact_gp(x, y), num_restarts=3)
    assert len(with_priors.restarts) == 3

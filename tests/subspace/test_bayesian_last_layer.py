"""BayesianLastLayer: the exact last-layer posterior against scikit-learn's BayesianRidge and the
closed-form evidence; sampling, prediction, state and input contract."""

import math
import warnings

import numpy as np
import pytest
import torch
from scipy.stats import multivariate_normal
from sklearn.linear_model import BayesianRidge

from gpext.errors import (
    ConvergenceWarning,
    InputDataError,
    InputTypeError,
    NotFittedError,
    ShapeError,
)
from gpext.nn import MLP
from gpext.subspace import BayesianLastLayer, FlatParameters


def _net(dtype=torch.float64, bias=True, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1, bias=bias)
    ).to(dtype)


def _data(n=40, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 3, generator=g, dtype=dtype)
    y = x.sum(-1).sin() + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    return x, y


@pytest.mark.parametrize("bias", (True, False))
def test_matches_sklearn_bayesian_ridge_and_closed_form_evidence(bias):
    net = _net(bias=bias)
    x, y = _data()
    bll = BayesianLastLayer(net, tol=1e-12, max_iter=5000).fit(x, y)
    phi = bll.features(x).numpy()
    assert phi.shape == (40, 9 if bias else 8)
    # scikit-learn's names: alpha_ = noise precision, lambda_ = weight precision; no Gamma
    # hyperpriors, the same starting point
    ref = BayesianRidge(fit_intercept=False, alpha_1=0, alpha_2=0, lambda_1=0, lambda_2=0,
                        tol=1e-14, max_iter=5000, alpha_init=1 / np.var(y.numpy()),
                        lambda_init=1.0).fit(phi, y.numpy())  # fmt: skip
    assert math.isclose(float(bll.prior_precision), ref.lambda_, rel_tol=1e-8)
    assert math.isclose(float(bll.noise_precision), ref.alpha_, rel_tol=1e-8)
    np.testing.assert_allclose(bll.posterior_mean.numpy(), ref.coef_, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(bll.covariance().numpy(), ref.sigma_, rtol=1e-7, atol=1e-12)
    a, b = float(bll.prior_precision), float(bll.noise_precision)
    cov = phi @ phi.T / a + np.eye(40) / b  # y ~ N(0, Phi Phi^T / alpha + I / beta)
    expected = multivariate_normal(np.zeros(40), cov).logpdf(y.numpy())
    assert math.isclose(float(bll.log_evidence), expected, rel_tol=1e-10)
    # the evidence is maximal: nudging either precision lowers it
    for fa, fb in ((1.1, 1), (0.9, 1), (1, 1.1), (1, 0.9)):
        nudged = BayesianLastLayer(net, prior_precision=a * fa, noise_precision=b * fb).fit(x, y)
        assert float(nudged.log_evidence) < float(bll.log_evidence)


def test_predict_and_samples_agree_with_the_gaussian():
    net = _net()
    x, y = _data()
    bll = BayesianLastLayer(net).fit(x, y)
    xt = torch.rand(7, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mean, var = bll.predict(xt)
    phi = bll.features(xt)
    assert torch.allclose(mean, phi @ bll.posterior_mean)
    assert torch.allclose(var, torch.einsum("nm,mk,nk->n", phi, bll.covariance(), phi))
    w = bll.sample(20000, generator=torch.Generator().manual_seed(0))
    flat = FlatParameters(net)
    assert w.shape == (20000, flat.num_parameters)
    body = flat.flatten()
    head = torch.tensor([flat.num_parameters - 9 + i for i in range(9)])
    keep = torch.ones(flat.num_parameters, dtype=torch.bool)
    keep[head] = False
    assert torch.equal(w[:, keep], body[keep].expand(20000, -1))  # the body is fixed
    heads = w[:, head]
    assert torch.allclose(
        heads.mean(0), bll.posterior_mean, atol=4 * bll.covariance().diagonal().max().sqrt() / 100
    )
    assert torch.allclose(
        torch.cov(heads.T),
        bll.covariance(),
        rtol=0.1,
        atol=0.05 * float(bll.covariance().abs().max()),
    )
    # functions of the draws: their spread is the predictive epistemic variance
    outs = torch.stack([flat.functional_call(wi, xt).squeeze(-1) for wi in w[:4000]])
    assert torch.allclose(outs.var(0), var, rtol=0.1)


def test_body_is_the_one_fitted_on():
    net = _net()
    x, y = _data()
    bll = BayesianLastLayer(net).fit(x, y)
    xt = x[:5]
    before = bll.predict(xt)
    w0 = bll.sample(3, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        net[0].weight.add_(1.0)  # the user moves the network afterwards
    after = bll.predict(xt)
    assert torch.allclose(before[0], after[0]) and torch.allclose(before[1], after[1])
    assert torch.equal(w0, bll.sample(3, generator=torch.Generator().manual_seed(0)))


def test_variance_grows_where_features_leave_the_training_span():
    """Features spanning fewer directions than the layer has: the prior variance remains in
    the others, so a query whose features leave the training span is more uncertain."""
    torch.manual_seed(0)
    net = MLP(1, [16], 1).double()
    x = torch.linspace(-1, 1, 20, dtype=torch.float64)[:, None]
    y = torch.sin(3 * x[:, 0])
    bll = BayesianLastLayer(net).fit(x, y)
    _, var_in = bll.predict(x)
    _, var_out = bll.predict(torch.tensor([[4.0], [-4.0]], dtype=torch.float64))
    assert float(var_out.min()) > 10 * float(var_in.max())


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_dtypes_and_state_dict_round_trip(dtype):
    net = _net(dtype)
    x, y = _data(dtype=dtype)
    bll = BayesianLastLayer(net).fit(x, y[:, None])  # (N, 1) targets too
    mean, var = bll.predict(x[:3])
    assert mean.dtype == var.dtype == dtype
    assert bll.sample(2).dtype == dtype
    state = bll.state_dict()
    assert "module" not in " ".join(state) and "_layer" not in " ".join(state)
    fresh = BayesianLastLayer(_net(dtype, seed=1))  # another body: the state carries it
    fresh.load_state_dict(state)
    m2, v2 = fresh.predict(x[:3])
    assert torch.allclose(m2, mean, atol=1e-5) and torch.allclose(v2, var, rtol=1e-4)


def test_fixed_precisions_and_convergence_warning():
    net = _net()
    x, y = _data()
    fixed = BayesianLastLayer(net, prior_precision=2.0, noise_precision=50.0).fit(x, y)
    assert float(fixed.prior_precision) == 2.0 and float(fixed.noise_precision) == 50.0
    assert int(fixed.num_iterations) == 0  # nothing to tune
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        BayesianLastLayer(net, max_iter=1).fit(x, y)
    assert any(issubclass(w.category, ConvergenceWarning) for w in caught)


def test_interpolating_body_caps_the_noise_precision():
    net = _net()
    x, _ = _data(n=5)  # 5 points, 9 features: the layer interpolates
    y = torch.arange(5.0, dtype=torch.float64)
    bll = BayesianLastLayer(net, max_noise_precision=1e6).fit(x, y)
    assert float(bll.noise_precision) <= 1e6 / float(y.var()) * (1 + 1e-12)
    assert bool(torch.isfinite(bll.predict(x)[1]).all())


def test_errors():
    with pytest.raises(InputTypeError, match="Linear"):
        BayesianLastLayer(MLP(2, [4], 3))  # three outputs
    conv = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Conv1d(1, 1, 1))
    with pytest.raises(InputTypeError):
        BayesianLastLayer(conv)
    with pytest.raises(InputTypeError):
        BayesianLastLayer("net")
    with pytest.raises(InputDataError, match="prior_precision"):
        BayesianLastLayer(_net(), prior_precision=-1.0)
    bll = BayesianLastLayer(_net())
    with pytest.raises(NotFittedError):
        bll.sample(2)
    with pytest.raises(NotFittedError):
        bll.predict(torch.rand(2, 3))
    x, y = _data()
    with pytest.raises(ShapeError):
        bll.fit(x, y[:-1])
    with pytest.raises(InputDataError, match="finite"):
        bll.fit(x, y.clone().index_fill_(0, torch.tensor([0]), float("nan")))
    with pytest.raises(InputTypeError, match="float32 or float64"):
        bll.fit(x.half(), y)
    with pytest.raises(InputDataError, match="at least 2"):
        bll.fit(x[:1], y[:1])


def test_evidence_preferring_pure_noise_is_reported():
    """A body whose features are constant (first layer zero: tanh(0) = 0) explains nothing of
    centred targets: the evidence drives alpha to infinity; fit stops and says so."""
    from gpext.errors import VarianceCollapseWarning

    net = _net()
    with torch.no_grad():
        net[0].weight.zero_()
        net[0].bias.zero_()
    x, y = _data()
    y = y - y.mean()
    with pytest.warns(VarianceCollapseWarning, match="as noise"):
        bll = BayesianLastLayer(net).fit(x, y)
    assert bool(bll.collapsed)
    assert float(bll.posterior_mean.abs().max()) < 1e-6
    assert math.isclose(bll.noise_variance, float(y.pow(2).mean()), rel_tol=1e-6)
    mean, var = bll.predict(x[:3])
    assert float(mean.abs().max()) < 1e-6 and float(var.max()) < 1e-6


def test_sample_conditional_draws_each_rows_exact_last_layer_posterior():
    """Row s of sample_conditional is a draw of N(m_s, S_s) at the fitted precisions, with m_s,
    S_s the closed form on row s's body: the same draw as a fixed-precision fit at that body
    sampled from the same generator state, the mean the numpy ridge solution."""
    net = _net()
    x, y = _data()
    bll = BayesianLastLayer(net).fit(x, y)
    alpha, beta = float(bll.prior_precision), float(bll.noise_precision)
    flat = FlatParameters(net)
    base = flat.flatten().clone()
    g = torch.Generator().manual_seed(1)
    weights = base + 0.3 * torch.randn(3, base.numel(), generator=g, dtype=base.dtype)
    out = bll.sample_conditional(weights, x, y, generator=torch.Generator().manual_seed(7))
    head = FlatParameters(net, "last_layer").num_parameters  # weight row then bias, last
    assert out.shape == weights.shape
    assert torch.equal(out[:, :-head], weights[:, :-head])  # the bodies are kept
    ref_gen = torch.Generator().manual_seed(7)
    for s in range(3):
        flat.assign(weights[s])
        ref = BayesianLastLayer(net, prior_precision=alpha, noise_precision=beta).fit(x, y)
        torch.testing.assert_close(out[s], ref.sample(1, generator=ref_gen)[0])
        phi = ref.features(x).numpy()
        m = np.linalg.solve(
            alpha * np.eye(phi.shape[1]) + beta * phi.T @ phi, beta * phi.T @ y.numpy()
        )
        np.testing.assert_allclose(ref.posterior_mean.numpy(), m, rtol=1e-8, atol=1e-10)
    flat.assign(base)
    # the spread of many draws of one body is the posterior covariance
    many = bll.sample_conditional(base.expand(4000, -1), x, y,
                                  generator=torch.Generator().manual_seed(2))  # fmt: skip
    heads = many[:, -head:]
    torch.testing.assert_close(heads.mean(0), bll.posterior_mean, atol=0.05, rtol=0)
    cov = torch.cov(heads.T)
    torch.testing.assert_close(
        cov, bll.covariance(), atol=0.1 * float(cov.diagonal().max()), rtol=0
    )


def test_sample_conditional_errors():
    net = _net()
    x, y = _data()
    bll = BayesianLastLayer(net)
    w = FlatParameters(net).flatten().expand(2, -1)
    with pytest.raises(NotFittedError):
        bll.sample_conditional(w, x, y)
    bll.fit(x, y)
    with pytest.raises(ShapeError, match="weights"):
        bll.sample_conditional(w[:, :-1], x, y)
    with pytest.raises(ShapeError, match="weights"):
        bll.sample_conditional(w[0], x, y)
    with pytest.raises(ShapeError):
        bll.sample_conditional(w, x, y[:-1])
    with pytest.raises(InputDataError, match="finite"):
        bll.sample_conditional(w.clone().fill_(float("nan")), x, y)

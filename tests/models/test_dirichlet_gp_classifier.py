"""Tests of DirichletGPClassifier: structured solvers against dense references, fit, errors."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import gpext.errors
from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.likelihoods import DirichletTransform
from gpext.models import DirichletGPClassifier
from gpext.models import _dirichlet_gp_solvers as solvers


def _setup(n=40, m=12, c=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 2, generator=gen, dtype=torch.float64)
    labels = torch.sort(torch.randint(0, c, (n,), generator=gen)).values
    counts = torch.bincount(labels, minlength=c).tolist()
    offsets = [0]
    for k in counts:
        offsets.append(offsets[-1] + k)
    k_full = torch.exp(-0.5 * torch.cdist(x, x) ** 2)
    z = x[:m] + 0.1
    mu = torch.tensor([-3.0, -2.5, -4.0], dtype=torch.float64)[:c]
    t = DirichletTransform(c, 0.05)
    v = t.values()
    extra = 0.02
    nv = solvers.NoiseValues(
        r_pos=v["pos_target"] - mu,
        r_neg=v["neg_target"] - mu,
        s_pos=torch.tensor(v["pos_noise"] + extra, dtype=torch.float64),
        s_neg=torch.tensor(v["neg_noise"] + extra, dtype=torch.float64),
    )
    targets, noise = t(labels, class_dim=-2)
    return x, z, labels, offsets, k_full, mu, nv, targets, noise + extra


def test_exact_solver_matches_dense_reference():
    x, _, labels, offsets, k, mu, nv, targets, noise = _setup()
    nll = solvers.exact_nll(k, offsets, nv)
    ref = 0.0
    for c in range(3):
        cov = k + torch.diag(noise[c])
        ref -= torch.distributions.MultivariateNormal(mu[c].expand(40), cov).log_prob(targets[c])
    assert nll.item() == pytest.approx(ref.item(), rel=1e-8)
    xs = torch.randn(7, 2, dtype=torch.float64)
    ks = torch.exp(-0.5 * torch.cdist(x, xs) ** 2)
    a_inv = solvers.exact_inverse(k, nv)
    mean, var = solvers.exact_predict(a_inv, ks, torch.ones(7, dtype=torch.float64), offsets, nv)
    for c in range(3):
        cov = k + torch.diag(noise[c])
        ref_mean = ks.T @ torch.linalg.solve(cov, targets[c] - mu[c])
        ref_var = 1.0 - (ks * torch.linalg.solve(cov, ks)).sum(0)
        assert torch.allclose(mean[:, c], ref_mean, atol=1e-8)
        assert torch.allclose(var[:, c], ref_var, atol=1e-8)


def test_sparse_bound_matches_dense_titsias_reference():
    x, z, labels, offsets, k, mu, nv, targets, noise = _setup()
    kern = lambda a, b: torch.exp(-0.5 * torch.cdist(a, b) ** 2)  # noqa: E731
    k_mm, k_mn = kern(z, z), kern(z, x)
    bound = solvers.sparse_neg_bound(
        k_mm, k_mn, torch.ones(40, dtype=torch.float64), offsets, nv, 1e-8
    )
    q = k_mn.T @ torch.linalg.solve(k_mm + 1e-8 * torch.eye(12, dtype=torch.float64), k_mn)
    ref = 0.0
    for c in range(3):
        cov = q + torch.diag(noise[c])
        ref -= torch.distributions.MultivariateNormal(mu[c].expand(40), cov).log_prob(targets[c])
        ref += 0.5 * ((1.0 - q.diagonal()) / noise[c]).sum()
    assert bound.item() == pytest.approx(ref.item(), rel=1e-6)
    # with Z = X the collapsed posterior equals the exact one
    xs = torch.randn(5, 2, dtype=torch.float64)
    m_s, v_s = solvers.sparse_predict(
        k, k, kern(x, xs), torch.ones(5, dtype=torch.float64), offsets, nv, 1e-10
    )
    m_e, v_e = solvers.exact_predict(
        solvers.exact_inverse(k, nv), kern(x, xs), torch.ones(5, dtype=torch.float64), offsets, nv
    )
    assert torch.allclose(m_s, m_e, atol=1e-5) and torch.allclose(v_s, v_e, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("sparse", [False, True])
def test_fit_predict_toy(dtype, sparse):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(150, 2, generator=gen, dtype=dtype) * 4 - 2
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    clf = DirichletGPClassifier(
        3, num_inducing=20 if sparse else None, num_inducing_final=40 if sparse else None
    )
    clf.fit(x[:100], y[:100], max_iter=15, generator=torch.Generator().manual_seed(0))
    assert clf.is_sparse == sparse
    probs = clf.predict_proba(x[100:], generator=torch.Generator().manual_seed(1), num_samples=300)
    assert probs.dtype == dtype and probs.shape == (50, 3)
    assert (probs.argmax(-1) == y[100:]).to(torch.float64).mean() > 0.85
    approx = clf.predict_proba(x[100:], method="approx")
    assert (approx - probs).abs().max() < 0.1
    mean, var = clf.predict_latent(x[100:])
    assert (var >= 0).all() and torch.isfinite(mean).all()
    # hyperparameters on a subset, posterior on everything
    clf2 = DirichletGPClassifier(3)
    clf2.fit(x[:100], y[:100], max_iter=5, hyper_subset=50)
    assert clf2._train["x"].shape[0] == 100
    assert math.isfinite(float(clf2.extra_noise))


def test_errors():
    clf = DirichletGPClassifier(3)
    with pytest.raises(NotFittedError, match="fit"):
        clf.predict_latent(torch.zeros(2, 2))
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        clf.fit(torch.zeros(4, 2), torch.tensor([0, 1, 2, 3]))
    with pytest.raises(InputTypeError, match="integer class labels"):
        clf.fit(torch.zeros(4, 2), torch.tensor([0.0, 1.5, 2.0, 1.0]))
    with pytest.raises(ShapeError, match=r"shape \(4,\)"):
        clf.fit(torch.zeros(4, 2), torch.tensor([0, 1, 2]))
    with pytest.raises(ShapeError, match=r"shape \(N, D\)"):
        clf.fit(torch.zeros(4), torch.tensor([0, 1, 2, 1]))
    with pytest.raises(InputDataError, match="finite"):
        clf.fit(torch.full((4, 2), float("nan")), torch.tensor([0, 1, 2, 1]))


def test_extend_inverse_matches_direct_inverse():
    x, _, labels, offsets, k, mu, nv, targets, noise = _setup(n=50)
    a_inv = solvers.exact_inverse(k[:35, :35], nv)
    grown = solvers.extend_inverse(a_inv, k[:35, 35:], k[35:, 35:], nv)
    ref = torch.linalg.inv(k + nv.s_neg * torch.eye(50, dtype=torch.float64))
    assert torch.allclose(grown, ref, atol=1e-10)


def _dense_posterior(clf, x, y, x_test, alpha_epsilon):
    """Exact posterior of every class by dense solves, with the classifier's hyperparameters."""
    targets, noise = DirichletTransform(clf.num_classes, alpha_epsilon)(y, dtype=x.dtype)
    # the kernel acts on the inputs standardised with the classifier's training statistics
    x, x_test = clf.standardizer.transform_inputs(x), clf.standardizer.transform_inputs(x_test)
    with torch.no_grad():
        k = clf.kernel(x).to_dense()
        ks = clf.kernel(x, x_test).to_dense()
        kss = clf.kernel(x_test, diag=True)
        means, variances = [], []
        for c in range(clf.num_classes):
            cov = k + torch.diag(noise[:, c] + clf.extra_noise)
            mu = clf.class_means[c]
            means.append(mu + ks.T @ torch.linalg.solve(cov, targets[:, c] - mu))
            variances.append(kss - (ks * torch.linalg.solve(cov, ks)).sum(0))
    return torch.stack(means, -1), torch.stack(variances, -1)


def _fantasy_data(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(60, 2, generator=gen, dtype=dtype) * 4 - 2
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    x_new = torch.rand(12, 2, generator=gen, dtype=dtype) * 4 - 2
    y_new = torch.randint(0, 3, (12,), generator=gen)
    x_test = torch.rand(25, 2, generator=gen, dtype=dtype) * 4 - 2
    return x, y, x_new, y_new, x_test


def test_fantasy_model_equals_exact_posterior_on_union():
    x, y, x_new, y_new, x_test = _fantasy_data(torch.float64)
    clf = DirichletGPClassifier(3, alpha_epsilon=0.05)
    clf.fit(x, y, max_iter=8)
    before = clf.predict_latent(x_test)
    fant = clf.get_fantasy_model(x_new, y_new)
    mean, var = fant.predict_latent(x_test)
    x_all, y_all = torch.cat([x, x_new]), torch.cat([y, y_new])
    ref_mean, ref_var = _dense_posterior(clf, x_all, y_all, x_test, alpha_epsilon=0.05)
    assert torch.allclose(mean, ref_mean, atol=1e-6) and torch.allclose(var, ref_var, atol=1e-6)
    # the user's alpha_epsilon matters: the default 0.01 gives a different posterior
    other, _ = _dense_posterior(clf, x_all, y_all, x_test, alpha_epsilon=0.01)
    assert (other - mean).abs().max() > 1e-2
    # hyperparameters are fixed and the original model is unchanged
    assert torch.equal(fant.class_means, clf.class_means)
    after = clf.predict_latent(x_test)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
    # conditioning twice equals conditioning once on both sets
    twice = clf.get_fantasy_model(x_new[:5], y_new[:5]).get_fantasy_model(x_new[5:], y_new[5:])
    assert torch.allclose(twice.predict_latent(x_test)[0], mean, atol=1e-8)
    probs = fant.predict_proba(x_test, method="approx")
    assert probs.shape == (25, 3) and torch.allclose(
        probs.sum(-1), torch.ones(25, dtype=torch.float64)
    )


def test_fantasy_model_float32_and_sparse():
    x, y, x_new, y_new, x_test = _fantasy_data(torch.float32, seed=1)
    clf = DirichletGPClassifier(3)
    clf.fit(x, y, max_iter=5)
    mean, var = clf.get_fantasy_model(x_new, y_new).predict_latent(x_test)
    ref_mean, ref_var = _dense_posterior(
        clf, torch.cat([x, x_new]), torch.cat([y, y_new]), x_test, alpha_epsilon=0.01
    )
    assert mean.dtype == torch.float32
    assert torch.allclose(mean, ref_mean, atol=1e-3) and torch.allclose(var, ref_var, atol=1e-3)
    # sparse: the collapsed posterior of the union with the same inducing points
    x64, y64, xn64, yn64, xt64 = _fantasy_data(torch.float64, seed=2)
    sp = DirichletGPClassifier(3, num_inducing=15)
    sp.fit(x64, y64, max_iter=5)
    fant = sp.get_fantasy_model(xn64, yn64)
    assert torch.equal(fant.inducing_points, sp.inducing_points)
    # the classifier keeps its data (and inducing points) in standardised inputs
    st = sp.standardizer
    union = sp._sorted_data(st.transform_inputs(torch.cat([x64, xn64])), torch.cat([y64, yn64]))
    xt64_std = st.transform_inputs(xt64)
    with torch.no_grad():
        z = sp.inducing_points
        ref_mean, _ = solvers.sparse_predict(
            sp.kernel(z).to_dense(), sp.kernel(z, union["x"]).to_dense(),
            sp.kernel(z, xt64_std).to_dense(), sp.kernel(xt64_std, diag=True), union["offsets"],
            sp._noise_values(torch.float64), sp.jitter,
        )  # fmt: skip
    assert torch.allclose(fant.predict_latent(xt64)[0], ref_mean + sp.class_means, atol=1e-8)


def test_fantasy_model_errors():
    x, y, x_new, y_new, _ = _fantasy_data(torch.float64)
    with pytest.raises(NotFittedError, match="fit"):
        DirichletGPClassifier(3).get_fantasy_model(x_new, y_new)
    clf = DirichletGPClassifier(3)
    clf.fit(x, y, max_iter=2)
    with pytest.raises(ShapeError, match="2 features"):
        clf.get_fantasy_model(torch.zeros(3, 4, dtype=torch.float64), torch.tensor([0, 1, 2]))
    with pytest.raises(ShapeError, match=r"shape \(12,\)"):
        clf.get_fantasy_model(x_new, y_new[:5])
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        clf.get_fantasy_model(x_new[:2], torch.tensor([0, 3]))
    with pytest.raises(InputTypeError, match="integer class labels"):
        clf.get_fantasy_model(x_new[:2], torch.tensor([0.5, 1.0]))


def _digits_subset(n=300):
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    x = torch.tensor(x[:n], dtype=torch.float64)
    sd = x.std(0)
    sd[sd == 0] = 1
    return (x - x.mean(0)) / sd, torch.tensor(y[:n])


def test_default_fit_reaches_the_optimum_of_a_reference_optimiser():
    """The old ``LBFGS(max_iter=1)`` loop stopped after about 12 evaluations, far from it."""
    from scipy.optimize import minimize

    x, y = _digits_subset()
    clf = DirichletGPClassifier(10)
    res = clf.fit(x, y, max_iter=200)
    assert res.stop_reason.value == "converged", res
    clf.train()
    clf._train = clf._sorted_data(x, y)
    params = [p for p in clf.parameters() if p.requires_grad]

    def f(v):
        with torch.no_grad():
            off = 0
            for p in params:
                p.copy_(torch.as_tensor(v[off : off + p.numel()]).view_as(p))
                off += p.numel()
        for p in params:
            p.grad = None
        loss = clf._loss()
        for _, module, prior, get, _ in clf.named_priors():
            loss = loss - prior.log_prob(get(module)).sum() / x.shape[0]
        loss.backward()
        return float(loss), torch.cat([p.grad.reshape(-1) for p in params]).numpy()

    start = torch.cat([p.detach().reshape(-1) for p in params]).numpy()
    ref = minimize(f, start, jac=True, method="L-BFGS-B", options={"maxiter": 300})
    assert res.final_loss <= ref.fun + 1e-5 * abs(ref.fun)
    assert res.grad_norm < 1e-3
    assert res.num_evaluations > 30  # a real line-search budget was used


def test_default_fit_records_a_healthy_result():
    x, y = _digits_subset(200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpext.errors.FitWarning)
        res = DirichletGPClassifier(10).fit(x, y)
    assert res.ok and res.losses[-1] < res.losses[0] and res is not None


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("fantasy", [False, True])
def test_state_dict_round_trip_through_torch_save(sparse, fantasy, tmp_path):
    # before: the kernel built inside fit, the training data and the factor were not in the
    # state, so a fresh instance could not load it (unexpected keys) nor predict
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 2, generator=g, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    kwargs = {"num_inducing": 8, "num_inducing_final": 12} if sparse else {}
    clf = DirichletGPClassifier(3, **kwargs)
    clf.fit(x, y, max_iter=5)
    if fantasy:
        clf = clf.get_fantasy_model(x[:3] + 0.1, y[:3])
    test_x = torch.randn(6, 2, generator=g, dtype=torch.float64)
    mean, var = clf.predict_latent(test_x)
    torch.save(clf.state_dict(), tmp_path / "clf.pt")
    restored = DirichletGPClassifier(3, **kwargs)
    restored.load_state_dict(torch.load(tmp_path / "clf.pt"))
    mean2, var2 = restored.predict_latent(test_x)
    assert restored.class_means.dtype == torch.float64 and restored.is_sparse == sparse
    torch.testing.assert_close(mean2, mean, rtol=0, atol=0)
    torch.testing.assert_close(var2, var, rtol=0, atol=0)
    p = clf.predict_proba(test_x, method="approx")
    torch.testing.assert_close(restored.predict_proba(test_x, method="approx"), p)


def test_input_contract():
    clf = DirichletGPClassifier(3)
    y = torch.tensor([0, 1, 2, 1])
    with pytest.raises(InputDataError, match="at least one row"):  # raw torch error before
        clf.fit(torch.zeros(0, 2), y[:0])
    with pytest.raises(InputTypeError, match="float32 or float64"):  # 'Half' not implemented
        clf.fit(torch.zeros(4, 2, dtype=torch.float16), y)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g, dtype=torch.float64)
    clf.fit(x.numpy(), (torch.arange(30) % 3).tolist(), max_iter=2)
    assert clf.predict_latent(x[:3].tolist())[0].dtype == torch.float64
    with pytest.raises(InputDataError, match="at least one row"):
        clf.predict_latent(x[:0])
    with pytest.raises(ShapeError, match="2 features"):  # raw matmul error before
        clf.predict_latent(torch.zeros(3, 5, dtype=torch.float64))
    with pytest.raises(InputTypeError, match="float64"):  # silently converted before
        clf.predict_latent(x[:3].float())

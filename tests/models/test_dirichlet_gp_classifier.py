"""Tests of DirichletGPClassifier: structured solvers against dense references, fit, errors."""

from __future__ import annotations

import math

import pytest
import torch

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
    mean, var = solvers.exact_predict(k, ks, torch.ones(7, dtype=torch.float64), offsets, nv)
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
        k, kern(x, xs), torch.ones(5, dtype=torch.float64), offsets, nv
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
    clf2 = DirichletGPClassifier(3).fit(x[:100], y[:100], max_iter=5, hyper_subset=50)
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

"""Tests of RobustMaxLikelihood: GPyTorch's likelihood suite, quadrature vs Monte Carlo, numerics."""

from __future__ import annotations

import itertools
import math
import unittest

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.test.base_likelihood_test_case import BaseLikelihoodTestCase
from torch.distributions import Distribution

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.likelihoods import RobustMaxLikelihood

J, N = 4, 5
_EMPTY = torch.Size()


def _mtmvn(mean: torch.Tensor, var: torch.Tensor) -> MultitaskMultivariateNormal:
    """Independent MultitaskMultivariateNormal with marginals (..., N, J)."""
    batch_mvn = MultivariateNormal(mean.transpose(-1, -2), torch.diag_embed(var.transpose(-1, -2)))
    return MultitaskMultivariateNormal.from_batch_mvn(batch_mvn, task_dim=-1)


def _mc_s(mean, var, y, num_samples=1_000_000, seed=0):
    """Monte Carlo P(f_y is the largest) and E[log p(y|f)] for one epsilon."""
    gen = torch.Generator().manual_seed(seed)
    hits = torch.zeros(mean.shape[:-1], dtype=torch.float64)
    block = 50_000
    for _ in range(num_samples // block):
        f = mean + var.sqrt() * torch.randn(block, *mean.shape, dtype=mean.dtype, generator=gen)
        hits += (f.argmax(-1) == y).double().sum(0)
    return hits / num_samples


class TestRobustMaxLikelihood(BaseLikelihoodTestCase, unittest.TestCase):
    seed = 0

    def create_likelihood(self, **kwargs):
        return RobustMaxLikelihood(num_classes=J, epsilon=0.05, **kwargs)

    def _create_conditional_input(self, batch_shape=_EMPTY):
        return torch.randn(*batch_shape, N, J)

    def _create_marginal_input(self, batch_shape=_EMPTY):
        mat = torch.randn(*batch_shape, J, N, N)
        mvn = MultivariateNormal(
            torch.randn(*batch_shape, J, N), mat @ mat.transpose(-1, -2) / N + torch.eye(N)
        )
        return MultitaskMultivariateNormal.from_batch_mvn(mvn)

    def _create_targets(self, batch_shape=_EMPTY):
        return torch.randint(0, J, (*batch_shape, N))

    def _test_conditional(self, batch_shape):
        likelihood = self.create_likelihood()
        f = self._create_conditional_input(batch_shape)
        output = likelihood(f)
        self.assertIsInstance(output, Distribution)
        self.assertEqual(output.sample().shape, torch.Size([*batch_shape, N]))
        # real check: 1 - eps on the argmax, eps / (J - 1) elsewhere
        expected = torch.full((*batch_shape, N, J), 0.05 / (J - 1))
        expected.scatter_(-1, f.argmax(-1, keepdim=True), 0.95)
        self.assertAllClose(output.probs, expected, atol=1e-6, rtol=0)

    def _test_log_marginal(self, batch_shape):
        likelihood = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        y = self._create_targets(batch_shape)
        out = likelihood.log_marginal(y, q)
        self.assertEqual(out.shape, torch.Size([*batch_shape, N]))
        with gpytorch.settings.num_likelihood_samples(20000):
            default = Likelihood.log_marginal(likelihood, y, q)
        self.assertAllClose(out, default, atol=0.05, rtol=0.05)

    def _test_log_prob(self, batch_shape):
        likelihood = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        y = self._create_targets(batch_shape)
        out = likelihood.expected_log_prob(y, q)
        self.assertEqual(out.shape, torch.Size([*batch_shape, N]))
        with gpytorch.settings.num_likelihood_samples(20000):
            default = Likelihood.expected_log_prob(likelihood, y, q)
        self.assertAllClose(out, default, atol=0.1, rtol=0.05)

    def _test_marginal(self, batch_shape):
        likelihood = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        output = likelihood(q)
        self.assertIsInstance(output, Distribution)
        self.assertEqual(output.sample().shape, torch.Size([*batch_shape, N]))
        with gpytorch.settings.num_likelihood_samples(20000):
            default = Likelihood.marginal(likelihood, q)
        self.assertAllClose(output.probs, default.probs.mean(0), atol=0.02, rtol=0)


@pytest.mark.parametrize("num_classes", [2, 10, 100])
def test_quadrature_matches_monte_carlo(num_classes):
    torch.manual_seed(num_classes)
    j = num_classes
    mean = torch.randn(6, j, dtype=torch.float64)
    var = torch.rand(6, j, dtype=torch.float64) + 0.5
    y = torch.randint(0, j, (6,))
    rows = torch.arange(6)
    mean[rows, y] += 0.5 * math.log(j)
    var[0] *= 1e-8  # tiny variances
    var[1] *= 100.0  # large variances
    var[2, y[2]] *= 100.0  # v_y >> v_j: formula (b)
    var[3, y[3]] *= 1e-4  # v_y << v_j
    mean[4] *= 30.0  # extreme means
    mean[5, y[5]] += 40.0  # f_y far above: S close to 1
    lik = RobustMaxLikelihood(j, epsilon=1e-3).double()
    q = _mtmvn(mean, var)
    s = lik.log_s(q, y).exp()
    s_mc = _mc_s(mean, var, y, num_samples=1_000_000 if j < 100 else 400_000)
    assert (s - s_mc).abs().max() <= 2e-3
    eps = 1e-3
    ell_mc = math.log(1 - eps) * s_mc + math.log(eps / (j - 1)) * (1 - s_mc)
    ell = lik.expected_log_prob(y, q)
    # E log p is linear in S, so its MC error is |log(1-eps) - log(eps/(J-1))| times that of S
    scale = math.log(1 - eps) - math.log(eps / (j - 1))
    assert ((ell - ell_mc).abs() / abs(scale)).max() <= 2e-3
    # marginal probabilities sum to one and match (1 - eps) S + eps / (J - 1) (1 - S), also in
    # row 3, where one class has a 1e4 times smaller variance than the others (a near-step in the
    # integrals of the other classes, resolved by the composite rule)
    probs = lik(q).probs
    assert torch.allclose(probs.sum(-1), torch.ones(6, dtype=torch.float64), atol=1e-6)
    expected = (1 - eps) * s + eps / (j - 1) * (1 - s)
    assert torch.allclose(probs[rows, y], expected, atol=2e-3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_extreme_inputs_finite_gradients(dtype):
    j = 10
    mean = torch.tensor(
        [[0.0] * j, [1e4] + [0.0] * (j - 1), [-1e4] + [0.0] * (j - 1), [0.0] * j], dtype=dtype
    )
    var = torch.tensor([[1e-12] * j, [1e-12] * j, [1.0] * j, [1e6] * j], dtype=dtype)
    mean.requires_grad_(True)
    var.requires_grad_(True)
    lik = RobustMaxLikelihood(j, learn_epsilon=True).to(dtype)
    y = torch.zeros(4, dtype=torch.long)
    q = _mtmvn(mean, var)
    ell = lik.expected_log_prob(y, q)
    lm = lik.log_marginal(y, q)
    assert torch.isfinite(ell).all() and torch.isfinite(lm).all()
    (ell.sum() + lm.sum()).backward()
    assert torch.isfinite(mean.grad).all() and torch.isfinite(var.grad).all()
    assert torch.isfinite(lik.raw_epsilon.grad)
    # f_0 far above the rest: S = 1; far below: S = 0
    s = lik.log_s(q, y).exp().detach()
    assert s[1] == pytest.approx(1.0, abs=1e-6) and s[2] == pytest.approx(0.0, abs=1e-6)


def test_svgp_training_with_variational_elbo():
    torch.manual_seed(1)
    x = torch.randn(120, 2, dtype=torch.float64)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()  # 3 classes
    from gpext_bench.baselines import SVGPModel, fit_svgp

    model = SVGPModel(x[:16].clone(), num_latents=3).double()
    lik = RobustMaxLikelihood(3, learn_epsilon=True).double()
    fit_svgp(
        model,
        lik,
        x,
        y,
        epochs=60,
        batch_size=40,
        lr=0.05,
        generator=torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        probs = lik(model(x)).probs
    assert (probs.argmax(-1) == y).double().mean() > 0.85
    state = lik.state_dict()
    lik2 = RobustMaxLikelihood(3, learn_epsilon=True).double()
    lik2.load_state_dict(state)
    assert torch.equal(lik2.epsilon, lik.epsilon)


def test_bad_inputs():
    lik = RobustMaxLikelihood(3)
    q = _mtmvn(torch.zeros(4, 3), torch.ones(4, 3))
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        lik.expected_log_prob(torch.tensor([0, 1, 2, 3]), q)
    with pytest.raises(InputTypeError, match="integer class labels"):
        lik.expected_log_prob(torch.tensor([0.5, 1.0, 2.0, 0.0]), q)
    with pytest.raises(ShapeError, match="broadcastable"):
        lik.expected_log_prob(torch.tensor([0, 1, 2]), q)
    with pytest.raises(ShapeError, match="3 latent functions"):
        lik(torch.zeros(4, 5))
    with pytest.raises(InputDataError, match="epsilon"):
        RobustMaxLikelihood(3, epsilon=1.5)
    with pytest.raises(InputDataError, match="num_classes"):
        RobustMaxLikelihood(1)


def test_ndtr_product_gradcheck_and_infinite_entries():
    from gpext.likelihoods.robust_max_likelihood import _ndtr_product

    gen = torch.Generator().manual_seed(3)
    z = (3.0 * torch.randn(4, 5, 6, generator=gen, dtype=torch.float64)).requires_grad_(True)
    assert torch.autograd.gradcheck(_ndtr_product, (z,))
    ref = torch.special.ndtr(z).prod(-1)
    assert torch.allclose(_ndtr_product(z), ref, rtol=1e-12, atol=0)
    # +inf is a factor 1 with zero gradient; -40 underflows without NaN gradients
    z2 = torch.tensor([[math.inf, 0.3, -40.0], [math.inf, 0.3, 1.0]], dtype=torch.float64)
    z2.requires_grad_(True)
    out = _ndtr_product(z2)
    out.sum().backward()
    assert torch.isfinite(z2.grad).all() and (z2.grad[:, 0] == 0).all()
    expected_grad = math.exp(-0.5) / math.sqrt(2 * math.pi) * torch.special.ndtr(torch.tensor(0.3))
    assert z2.grad[1, 2].item() == pytest.approx(expected_grad.item(), rel=1e-6)


@pytest.mark.parametrize("num_classes", [2, 10, 100])
def test_elbo_path_matches_log_space_path(num_classes):
    """``expected_log_prob`` (probability space) equals the log-space ``log_s`` route."""
    torch.manual_seed(10 + num_classes)
    j = num_classes
    mean = 3.0 * torch.randn(8, j, dtype=torch.float64)
    var = (torch.randn(8, j, dtype=torch.float64)).exp()
    y = torch.randint(0, j, (8,))
    var[0] *= 1e-8
    var[1, y[1]] *= 100.0  # formula (b)
    var[2, y[2]] *= 1.3  # formula (a) just under the switch ratio
    mean[3] *= 30.0
    mean.requires_grad_(True)
    var.requires_grad_(True)
    lik = RobustMaxLikelihood(j, epsilon=0.01).double()
    q = _mtmvn(mean, var)
    ell = lik.expected_log_prob(y, q)
    g_ell = torch.autograd.grad(ell.sum(), (mean, var))
    s = lik.log_s(_mtmvn(mean, var), y).exp()
    eps = float(lik.epsilon)  # 0.01 up to its float32 initialisation
    log_hit, log_miss = math.log1p(-eps), math.log(eps / (j - 1))
    ref = log_miss + (log_hit - log_miss) * s
    g_ref = torch.autograd.grad(ref.sum(), (mean, var))
    assert torch.allclose(ell, ref, atol=1e-10, rtol=0)
    for a, b in zip(g_ell, g_ref, strict=True):
        assert torch.allclose(a, b, atol=1e-8, rtol=1e-6)


def test_two_classes_closed_form_matches_quadrature_and_scipy():
    """J = 2 uses S_y = Phi((m_y - m_o) / sqrt(v_y + v_o)); it agrees with the 20-node quadrature
    where that is accurate (variance ratio <= 1.5) and with scipy's normal CDF everywhere."""
    from scipy.stats import norm

    torch.manual_seed(7)
    mean = 2.0 * torch.randn(64, 2, dtype=torch.float64)
    var = torch.empty(64, 2, dtype=torch.float64).uniform_(0.5, 1.0)
    y = torch.randint(0, 2, (64,))
    lik = RobustMaxLikelihood(2).double()
    s_closed = lik.log_s(_mtmvn(mean, var), y).exp()
    sd, xi, logw = lik._prepare(mean, var)
    s_quad = (lik._factors_over_y(mean, sd, y, xi, log_space=True) + logw).logsumexp(-1).exp()
    assert torch.allclose(s_closed, s_quad, atol=1e-6, rtol=0)
    m_y, m_o = mean.gather(-1, y[:, None]).squeeze(-1), mean.gather(-1, 1 - y[:, None]).squeeze(-1)
    ref = norm.cdf(((m_y - m_o) / var.sum(-1).sqrt()).numpy())
    assert torch.allclose(s_closed, torch.from_numpy(ref), atol=1e-12, rtol=0)
    # extreme: a far-away mean and a tiny variance stay finite in log space, in both tails
    log_s = lik.log_s(
        _mtmvn(
            torch.tensor([[40.0, 0.0]], dtype=torch.float64),
            torch.tensor([[1e-12, 1e-12]], dtype=torch.float64),
        ),
        torch.tensor([1]),
    )
    assert torch.isfinite(log_s).all() and log_s.item() < -1e3


def _quad_reference_s(mean: np.ndarray, var: np.ndarray, y: int) -> float:
    """S_y = int phi(z) prod_{j != y} Phi((m_y + s_y z - m_j) / s_j) dz by adaptive scipy quad.

    Independent of the likelihood's quadrature: QUADPACK on [-12, 12] (outside, N(0, 1) has mass
    4e-33), told where every factor turns (its kink and +-3 of its widths).
    """
    from scipy import integrate
    from scipy.special import log_ndtr

    sd = np.sqrt(var)
    other = np.arange(len(mean)) != y
    a = (mean[y] - mean[other]) / sd[other]
    b = sd[y] / sd[other]

    def integrand(z: float) -> float:
        return math.exp(-0.5 * z * z + float(log_ndtr(a + b * z).sum())) / math.sqrt(2 * math.pi)

    kinks = [k + c / bb for k, bb in zip(-a / b, b, strict=True) for c in (-3.0, 0.0, 3.0)]
    points = sorted({0.0, *(k for k in kinks if -12.0 < k < 12.0)})
    value, _ = integrate.quad(
        integrand, -12.0, 12.0, points=points, limit=2000, epsabs=1e-13, epsrel=1e-11
    )
    return value


def _multiscale_cases() -> list[tuple[np.ndarray, np.ndarray]]:
    """Rows of J = 3, 5, 10 latents whose variances span 1e-4 .. 1e2 (ratio 1e6) in one row."""
    rng = np.random.default_rng(2024)
    cases = []
    for j in (3, 5, 10):
        for scale in (0.01, 0.1, 0.5, 1.0, 3.0, 10.0):
            for _ in range(2):
                log_var = rng.uniform(-4.0, 2.0, size=j)
                log_var[:2] = (-4.0, 2.0)
                var = 10.0 ** rng.permutation(log_var)
                cases.append((scale * rng.standard_normal(j), var))
    return cases


def test_multiscale_variances_match_deterministic_reference():
    """S_y and the class probabilities for every class, when the latent variances of one point
    differ by up to 1e6, agree with an adaptive (scipy quad) reference to 2e-3 without any
    renormalisation.  (The former 20-node Gauss-Hermite rule over f_y was up to 0.1 off in S
    and 0.05 in the renormalised probabilities on such points.)"""
    eps = 1e-3
    err_s = err_ell = err_p = err_sum = err_marginal = 0.0
    for mean_np, var_np in _multiscale_cases():
        j = mean_np.shape[0]
        ref = torch.tensor([_quad_reference_s(mean_np, var_np, c) for c in range(j)])
        assert abs(float(ref.sum()) - 1.0) < 1e-6  # the reference itself
        ref_p = (1 - eps) * ref + eps / (j - 1) * (1 - ref)
        lik = RobustMaxLikelihood(j, epsilon=eps).double()
        # every class of the one point, as a batch of j copies with labels 0 .. j-1
        mean = torch.from_numpy(mean_np).expand(j, 1, j)
        var = torch.from_numpy(var_np).expand(j, 1, j)
        q = _mtmvn(mean, var)
        labels = torch.arange(j)[:, None]
        s = lik.log_s(q, labels).exp().squeeze(-1)
        p_raw = lik.log_marginal(labels, q).exp().squeeze(-1)  # not renormalised
        log_hit, log_miss = math.log1p(-eps), math.log(eps / (j - 1))
        s_elbo = (lik.expected_log_prob(labels, q).squeeze(-1) - log_miss) / (log_hit - log_miss)
        probs = lik(_mtmvn(mean[:1], var[:1])).probs.squeeze(0).squeeze(0)
        err_s = max(err_s, float((s - ref).abs().max()))
        err_ell = max(err_ell, float((s_elbo - ref).abs().max()))
        err_p = max(err_p, float((p_raw - ref_p).abs().max()))
        err_sum = max(err_sum, abs(float(s.sum()) - 1.0), abs(float(p_raw.sum()) - 1.0))
        err_marginal = max(err_marginal, float((probs - ref_p).abs().max()))
    assert err_s <= 2e-3, err_s
    assert err_ell <= 2e-3, err_ell
    assert err_p <= 2e-3, err_p
    assert err_sum <= 2e-3, err_sum
    assert err_marginal <= 2e-3, err_marginal


def test_many_similar_classes_sum_to_one():
    """With 50 classes of similar variances the product of CDFs is steeper than each factor; the
    default node count (40 above 20 classes) keeps sum_y S_y within 2e-3 of one."""
    gen = torch.Generator().manual_seed(5)
    j = 50
    mean = 0.3 * torch.randn(2, j, generator=gen, dtype=torch.float64)
    var = 1.0 + 0.5 * torch.rand(2, j, generator=gen, dtype=torch.float64)
    lik = RobustMaxLikelihood(j).double()
    assert lik.num_locs == 40
    classes = torch.arange(j).expand(2, j)
    log_s = lik.log_s(_mtmvn(mean[:, None].expand(2, j, j), var[:, None].expand(2, j, j)), classes)
    assert (log_s.exp().sum(-1) - 1.0).abs().max() <= 2e-3
    ref = [_quad_reference_s(mean[0].numpy(), var[0].numpy(), c) for c in (0, 1, 2)]
    assert torch.allclose(log_s[0, :3].exp(), torch.tensor(ref, dtype=torch.float64), atol=2e-3)


@pytest.mark.parametrize("num_classes", [2, 3, 5, 10])
def test_float32_gradients_finite_for_extreme_means_and_tiny_variances(num_classes):
    """float32 ``log_marginal`` and ``expected_log_prob`` keep finite gradients with means near
    +-30 and variances near 1e-8 (torch's own log_ndtr derivative is NaN there)."""
    j = num_classes
    gen = torch.Generator().manual_seed(j)
    patterns = torch.tensor(
        list(itertools.product([-30.0, 0.0, 30.0], repeat=min(j, 3))), dtype=torch.float32
    )
    mean = torch.zeros(patterns.shape[0], j)
    mean[:, : patterns.shape[1]] = patterns
    mean = mean + 0.01 * torch.randn(mean.shape, generator=gen)
    rows = mean.shape[0]
    for var in (
        torch.full((rows, j), 1e-8),
        torch.where(torch.rand(rows, j, generator=gen) < 0.5, 1e-8, 3e-8),
        torch.where(torch.rand(rows, j, generator=gen) < 0.5, 1e-8, 1.0),
        torch.where(torch.rand(rows, j, generator=gen) < 0.5, 1e-8, 100.0),
    ):
        for label in range(j):
            m = mean.clone().requires_grad_(True)
            v = var.clone().requires_grad_(True)
            lik = RobustMaxLikelihood(j, learn_epsilon=True)
            y = torch.full((rows,), label)
            q = _mtmvn(m, v)
            lm = lik.log_marginal(y, q)
            ell = lik.expected_log_prob(y, q)
            assert torch.isfinite(lm).all() and torch.isfinite(ell).all()
            grads = torch.autograd.grad(lm.sum() + ell.sum(), (m, v, lik.raw_epsilon))
            assert all(torch.isfinite(g).all() for g in grads)


def test_float32_log_marginal_gradient_matches_float64():
    """At means +-30 and standard deviations 1e-3 (float32's variance floor) the float32 gradient
    of ``log_marginal`` agrees with float64's."""
    j = 4
    grid = torch.tensor(list(itertools.product([-30.0, 0.0, 30.0], repeat=j)))
    out = {}
    for dtype in (torch.float32, torch.float64):
        mean = (grid.to(dtype) + 1e-3 * torch.arange(j, dtype=dtype)).requires_grad_(True)
        var = torch.full_like(mean, 1e-6)
        var[:, 0] = 3e-6
        var.requires_grad_(True)
        lik = RobustMaxLikelihood(j, epsilon=0.01).to(dtype)
        y = torch.arange(grid.shape[0]) % j
        lm = lik.log_marginal(y, _mtmvn(mean, var))
        g_mean, g_var = torch.autograd.grad(lm.sum(), (mean, var))
        out[dtype] = (lm.double(), g_mean.double(), g_var.double())
    (lm32, gm32, gv32), (lm64, gm64, gv64) = out[torch.float32], out[torch.float64]
    assert torch.isfinite(gm32).all() and torch.isfinite(gv32).all()
    assert (lm32 - lm64).abs().max() < 1e-2
    assert ((gm32 - gm64).abs() / (1.0 + gm64.abs())).max() < 1e-2
    assert ((gv32 - gv64).abs() / (1.0 + gv64.abs())).max() < 1e-2


def test_log_ndtr_gradient_stable_in_float32():
    from gpext.likelihoods.robust_max_likelihood import _log_ndtr

    z64 = torch.tensor([-6e4, -4.64e4, -1e3, -30.0, -1.0, 0.0, 2.0, 30.0], dtype=torch.float64)
    z64.requires_grad_(True)
    (g64,) = torch.autograd.grad(_log_ndtr(z64).sum(), z64)
    z32 = z64.detach().float().requires_grad_(True)
    (g32,) = torch.autograd.grad(_log_ndtr(z32).sum(), z32)
    assert torch.allclose(g32.double(), g64, rtol=1e-5, atol=1e-30)
    # d/dz log Phi(z) = phi(z) / Phi(z) -> -z for z -> -inf
    assert g64[0].item() == pytest.approx(6e4, rel=1e-6)
    assert torch.allclose(_log_ndtr(z64), torch.special.log_ndtr(z64))
    z = torch.tensor([-40.0, -3.0, 0.5, 5.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(_log_ndtr, (z,))
    assert torch.autograd.gradgradcheck(_log_ndtr, (z,))
    zinf = torch.tensor([math.inf], requires_grad=True)
    (g_inf,) = torch.autograd.grad(_log_ndtr(zinf).sum(), zinf)
    assert torch.isfinite(g_inf).all() and g_inf.abs().max() < 1e-30

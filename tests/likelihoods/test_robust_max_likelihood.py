"""Tests of RobustMaxLikelihood: GPyTorch's likelihood suite, quadrature vs Monte Carlo, numerics."""

from __future__ import annotations

import math
import unittest

import gpytorch
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
    # marginal probabilities sum to one and match (1 - eps) S + eps / (J - 1) (1 - S).
    # Row 3 is excluded: there one class has a 1e4 times smaller variance than the others, and
    # S_c of the *other* classes (integrated over f_c) cannot resolve that step with 20 nodes, so
    # the renormalised marginal differs by up to ~0.02 (documented limitation).
    probs = lik(q).probs
    assert torch.allclose(probs.sum(-1), torch.ones(6, dtype=torch.float64), atol=1e-6)
    expected = (1 - eps) * s + eps / (j - 1) * (1 - s)
    keep = torch.tensor([0, 1, 2, 4, 5])
    assert torch.allclose(probs[rows, y][keep], expected[keep], atol=2e-3)


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
    from gpext.bench.baselines import SVGPModel, fit_svgp

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

"""Tests of DirichletTransformLikelihood: GPyTorch's suite, exact and minibatch variational GPs."""

from __future__ import annotations

import math
import unittest

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import Likelihood
from gpytorch.test.base_likelihood_test_case import BaseLikelihoodTestCase
from torch.distributions import Distribution

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.likelihoods import DirichletTransform, DirichletTransformLikelihood

C, N = 3, 5
_EMPTY = torch.Size()


class TestDirichletTransformLikelihood(BaseLikelihoodTestCase, unittest.TestCase):
    seed = 0

    def create_likelihood(self, **kwargs):
        return DirichletTransformLikelihood(C, learn_additional_noise=True, **kwargs)

    def _create_conditional_input(self, batch_shape=_EMPTY):
        return torch.randn(*batch_shape, C, N)

    def _create_marginal_input(self, batch_shape=_EMPTY):
        mat = torch.randn(*batch_shape, C, N, N)
        return MultivariateNormal(
            torch.randn(*batch_shape, C, N), mat @ mat.transpose(-1, -2) / N + torch.eye(N)
        )

    def _create_targets(self, batch_shape=_EMPTY):
        return torch.randint(0, C, (*batch_shape, N))

    def _test_conditional(self, batch_shape):
        lik = self.create_likelihood()
        f = self._create_conditional_input(batch_shape)
        labels = self._create_targets(batch_shape)
        out = lik(f, labels=labels)
        self.assertIsInstance(out, Distribution)
        self.assertEqual(out.sample().shape, f.shape)
        _, noise = DirichletTransform(C)(labels, dtype=f.dtype, class_dim=-2)
        self.assertAllClose(
            out.variance, noise + lik.second_noise_covar.noise.detach(), rtol=1e-5, atol=1e-6
        )

    def _test_log_marginal(self, batch_shape):
        lik = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        labels = self._create_targets(batch_shape)
        out = lik.log_marginal(labels, q)
        self.assertEqual(out.shape, torch.Size([*batch_shape, C, N]))
        targets, _ = lik.transform_labels(labels)
        lik.train_labels = labels  # the default implementation passes no keywords
        with gpytorch.settings.num_likelihood_samples(4000):
            default = Likelihood.log_marginal(lik, targets, q)
        self.assertAllClose(out, default, rtol=0.1, atol=0.1)

    def _test_log_prob(self, batch_shape):
        lik = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        labels = self._create_targets(batch_shape)
        out = lik.expected_log_prob(labels, q)
        self.assertEqual(out.shape, torch.Size([*batch_shape, C, N]))
        targets, _ = lik.transform_labels(labels)
        # float targets with labels= give the same result
        self.assertAllClose(out, lik.expected_log_prob(targets, q, labels=labels))
        lik.train_labels = labels
        with gpytorch.settings.num_likelihood_samples(4000):
            default = Likelihood.expected_log_prob(lik, targets, q)
        self.assertAllClose(out, default, rtol=0.1, atol=0.1)

    def _test_marginal(self, batch_shape):
        lik = self.create_likelihood()
        q = self._create_marginal_input(batch_shape)
        labels = self._create_targets(batch_shape)
        out = lik(q, labels=labels)
        self.assertIsInstance(out, MultivariateNormal)
        _, noise = lik.transform_labels(labels)
        expected = q.variance + noise + lik.second_noise_covar.noise.detach()
        self.assertAllClose(out.variance, expected, rtol=1e-5, atol=1e-5)
        self.assertAllClose(out.mean, q.mean)


class _BatchExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, targets, lik):
        super().__init__(x, targets, lik)
        b = torch.Size([lik.num_classes])
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=b)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=b), batch_shape=b
        )

    def forward(self, x):
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


class _BatchSVGP(gpytorch.models.ApproximateGP):
    def __init__(self, z, c):
        b = torch.Size([c])
        dist = gpytorch.variational.CholeskyVariationalDistribution(z.shape[0], batch_shape=b)
        strat = gpytorch.variational.VariationalStrategy(
            self, z.expand(c, *z.shape).clone(), dist, True
        )
        super().__init__(strat)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=b)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=b), batch_shape=b
        )

    def forward(self, x):
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _toy(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=gen, dtype=dtype) * 6 - 3
    y = torch.bucketize(x.squeeze(-1), torch.tensor([-1.0, 1.0], dtype=dtype))
    return x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_gp_training_prediction_and_new_labels(dtype):
    torch.manual_seed(0)
    x, y = _toy(60, dtype)
    lik = DirichletTransformLikelihood(
        C, alpha_epsilon=0.05, train_labels=y, learn_additional_noise=True
    ).to(dtype)
    targets = lik.transformed_targets
    assert targets.dtype == dtype and targets.shape == (C, 60)
    model = _BatchExactGP(x, targets, lik).to(dtype)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model.train()
    for _ in range(30):
        opt.zero_grad()
        loss = -mll(model(x), targets).sum()
        loss.backward()
        opt.step()
    model.eval()
    x_test, y_test = _toy(50, dtype, seed=1)
    with torch.no_grad():
        f = model(x_test)
        probs = lik.class_probs(f, num_samples=500, generator=torch.Generator().manual_seed(0))
        approx = lik.class_probs(f, method="approx")
        # new labels at prediction time use this likelihood's alpha_epsilon (0.05)
        marg = lik(f, labels=y_test)
    assert probs.shape == (50, C)
    assert (probs.argmax(-1) == y_test).double().mean() > 0.9
    assert (approx - probs).abs().max() < 0.05
    noise = DirichletTransform(C, 0.05)(y_test, dtype=dtype, class_dim=-2).noise
    assert torch.allclose(
        marg.variance - f.variance, noise + lik.second_noise_covar.noise, atol=1e-4
    )
    # conditioning on new labels: the fantasy likelihood knows all labels
    fant_lik = lik.get_fantasy_likelihood(labels=y_test[:5])
    assert fant_lik.train_labels.shape == (65,)
    assert fant_lik.alpha_epsilon == 0.05
    with torch.no_grad():
        both = torch.cat([x, x_test[:5]])
        m = fant_lik(model(both))
    assert m.variance.shape == (C, 65)


def test_minibatch_variational_training_uses_each_batch_noise():
    torch.manual_seed(0)
    x, y = _toy(200, torch.float64)
    lik = DirichletTransformLikelihood(C).double()
    model = _BatchSVGP(x[:12].clone(), C).double()
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=200)
    # the likelihood gives each minibatch the noise of its own labels
    with torch.no_grad():
        f = model(x[:7])
        elp = lik.expected_log_prob(y[:7], f)
        t, noise = DirichletTransform(C)(y[:7], class_dim=-2)
        direct = -0.5 * (
            ((t - f.mean) ** 2 + f.variance) / noise + noise.log() + math.log(2 * math.pi)
        )
    assert torch.allclose(elp, direct)
    opt = torch.optim.Adam([*model.parameters(), *lik.parameters()], lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for _ in range(40):
        perm = torch.randperm(200, generator=gen)
        for idx in perm.split(50):
            opt.zero_grad()
            loss = -mll(model(x[idx]), y[idx]).sum()
            loss.backward()
            opt.step()
    model.eval()
    with torch.no_grad():
        probs = lik.class_probs(model(x), num_samples=300, generator=gen)
    assert (probs.argmax(-1) == y).double().mean() > 0.9


def test_bad_inputs():
    lik = DirichletTransformLikelihood(C, train_labels=torch.tensor([0, 1, 2, 1]))
    q = MultivariateNormal(torch.zeros(C, 4), torch.eye(4).expand(C, 4, 4))
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        lik.expected_log_prob(torch.tensor([0, 1, 2, 5]), q)
    with pytest.raises(InputTypeError, match="integer class labels"):
        lik(q, labels=torch.tensor([0.2, 1.0, 2.0, 1.0]))
    with pytest.raises(ShapeError, match="batch of 3 outputs"):
        lik(MultivariateNormal(torch.zeros(2, 4), torch.eye(4).expand(2, 4, 4)))
    with pytest.raises(InputDataError, match="labels= or noise="):
        lik(MultivariateNormal(torch.zeros(C, 6), torch.eye(6).expand(C, 6, 6)))
    with pytest.raises(ShapeError, match="noise"):
        lik(q, noise=torch.ones(C, 3))
    with pytest.raises(ShapeError, match="broadcastable"):
        lik.expected_log_prob(torch.zeros(C, 7), q)
    # the stored labels serve calls with matching N; num_classes is never inferred
    assert lik(q).variance.shape == (C, 4)
    lik2 = DirichletTransformLikelihood(5, train_labels=torch.tensor([0, 1]))
    assert lik2.transformed_targets.shape == (5, 2)


def test_exact_gp_fantasy_model_equals_refit_on_union():
    """``ExactGP.get_fantasy_model`` with ``noise=`` equals the exact GP on the union."""
    torch.manual_seed(0)
    dtype = torch.float64
    x, y = _toy(30, dtype)
    x_new, y_new = _toy(6, dtype, seed=2)
    x_test, _ = _toy(9, dtype, seed=3)
    lik = DirichletTransformLikelihood(
        C, alpha_epsilon=0.05, train_labels=y, learn_additional_noise=True
    ).to(dtype)
    model = _BatchExactGP(x, lik.transformed_targets, lik).to(dtype)
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = 0.7
        lik.second_noise_covar.noise = 0.03
    model.eval()
    with torch.no_grad():
        model(x_test)  # build the prediction caches that the fantasy update extends
        targets, noise = lik.transform_labels(y_new)
        # inputs expanded to the C outputs (GPyTorch takes the batch shape from the inputs)
        fant = model.get_fantasy_model(x_new.expand(C, *x_new.shape), targets, noise=noise)
        got = fant(x_test)
        union = DirichletTransformLikelihood(
            C, alpha_epsilon=0.05, train_labels=torch.cat([y, y_new]), learn_additional_noise=True
        ).to(dtype)
        ref_model = _BatchExactGP(torch.cat([x, x_new]), union.transformed_targets, union).to(dtype)
        state = {k: v for k, v in model.state_dict().items() if "train_labels" not in k}
        ref_model.load_state_dict(state, strict=False)
        ref_model.eval()
        ref = ref_model(x_test)
    assert torch.allclose(got.mean, ref.mean, atol=1e-6)
    assert torch.allclose(got.variance, ref.variance, atol=1e-6)
    # the fantasy likelihood knows the noise of all 36 points, with alpha_epsilon = 0.05
    full = DirichletTransform(C, 0.05)(torch.cat([y, y_new]), dtype=dtype, class_dim=-2).noise
    assert torch.allclose(fant.likelihood.train_noise, full)


def test_fantasy_likelihood_errors():
    lik = DirichletTransformLikelihood(C)
    with pytest.raises(InputDataError, match="train_labels"):
        lik.get_fantasy_likelihood(noise=torch.ones(C, 2))
    lik = DirichletTransformLikelihood(C, train_labels=torch.tensor([0, 1, 2]))
    with pytest.raises(ShapeError, match=r"shape \(\.\.\., 3, M\)"):
        lik.get_fantasy_likelihood(noise=torch.ones(2, 2))
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        lik.get_fantasy_likelihood(labels=torch.tensor([3]))

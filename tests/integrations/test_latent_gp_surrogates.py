"""BoTorch conformance of the GP adapters (IGN, GWI, Dirichlet and robust-max classifiers)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from _botorch_fixtures import D, all_classifiers, data, dirichlet, gwi, ign
from botorch.acquisition.objective import ScalarizedPosteriorTransform
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.utils.testing import BotorchTestCase

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.integrations.botorch import (
    DirichletClassifierSurrogate,
    GWISurrogate,
    IGNSurrogate,
    fit_gpext_surrogate,
)
from gpext.models import DirichletGPClassifier, InducingGPNetwork
from gpext.nn import MLP

DTYPES = (torch.float32, torch.float64)


def gp_adapters(dtype):
    out = {"ign": ign(dtype), "gwi": gwi(dtype)}
    out.update({k: v for k, v in all_classifiers(dtype).items() if not k.startswith("vboot")})
    return out


class TestLatentGPSurrogates(BotorchTestCase):
    def setUp(self):
        super().setUp()
        torch.manual_seed(0)

    def test_posterior_shapes_batch_q_d(self):
        for dtype in DTYPES:
            for name, model in gp_adapters(dtype).items():
                m = model.num_outputs
                for batch in ((), (3,), (2, 3)):
                    X = torch.rand(*batch, 4, D, dtype=dtype)
                    post = model.posterior(X)
                    self.assertIsInstance(post, GPyTorchPosterior, name)
                    self.assertEqual(post.mean.shape, torch.Size([*batch, 4, m]), name)
                    self.assertEqual(post.variance.shape, torch.Size([*batch, 4, m]), name)
                    self.assertEqual(post.mean.dtype, dtype)
                    cov = post.distribution.covariance_matrix
                    self.assertEqual(cov.shape, torch.Size([*batch, 4 * m, 4 * m]), name)
                    self.assertTrue(torch.allclose(cov, cov.transpose(-1, -2), atol=1e-5))
                    samples = post.rsample(torch.Size([5]))
                    self.assertEqual(samples.shape, torch.Size([5, *batch, 4, m]), name)
                    self.assertTrue(bool((post.variance >= 0).all()), name)

    def test_ign_matches_predict(self):
        for dtype in DTYPES:
            model = ign(dtype)
            x = torch.rand(7, D, dtype=dtype)
            mean, var = model.model.predict(x, include_noise=False)
            post = model.posterior(x.unsqueeze(-2))
            tol = {"atol": 1e-5, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-10}
            self.assertTrue(torch.allclose(post.mean.reshape(-1), mean, **tol))
            self.assertTrue(torch.allclose(post.variance.reshape(-1), var, **tol))
            _, var_noisy = model.model.predict(x, include_noise=True)
            post = model.posterior(x.unsqueeze(-2), observation_noise=True)
            self.assertTrue(torch.allclose(post.variance.reshape(-1), var_noisy, **tol))
            # joint posterior of q points: marginals agree with the pointwise prediction
            joint = model.posterior(x.unsqueeze(0))
            self.assertTrue(torch.allclose(joint.variance.reshape(-1), var, **tol))

    def test_gwi_regression_matches_predict(self):
        model = gwi(torch.float64)
        x = torch.rand(6, D, dtype=torch.float64)
        model.model.temperature.fill_(1.7)  # the adapter must carry the temperature
        try:
            mean, var = model.model.predict(model.likelihood, x)
            post = model.posterior(x.unsqueeze(-2), observation_noise=True)
            self.assertTrue(torch.allclose(post.mean.reshape(-1), mean, atol=1e-10))
            self.assertTrue(torch.allclose(post.variance.reshape(-1), var, atol=1e-10))
        finally:
            model.model.temperature.fill_(1.0)

    def test_gwi_robust_max_matches_predict_proba(self):
        for dtype in DTYPES:
            model = gwi(dtype, classification=True)
            x = torch.rand(5, D, dtype=dtype)
            probs = model.model.predict_proba(model.likelihood, x)
            got = model.class_probabilities(x.unsqueeze(-2)).squeeze(-2)
            self.assertTrue(torch.allclose(got, probs, atol=1e-5))
            with torch.no_grad():
                q = model.model(x)
            post = model.posterior(x.unsqueeze(-2))
            self.assertTrue(torch.allclose(post.mean.squeeze(-2), q.mean.T, atol=1e-5))
            # batched evaluation equals one batch at a time
            X = torch.rand(3, 4, D, dtype=dtype)
            batched = model.posterior(X).distribution.covariance_matrix
            for i in range(3):
                single = model.posterior(X[i]).distribution.covariance_matrix
                self.assertTrue(torch.allclose(batched[i], single, atol=1e-5))

    def test_dirichlet_joint_posterior_against_solvers_and_numpy(self):
        for sparse in (False, True):
            model = dirichlet(torch.float64, sparse=sparse)
            x = torch.rand(6, D, dtype=torch.float64)
            mean, var = model.model.predict_latent(x)  # the classifier's own (marginal) solver
            post = model.posterior(x.unsqueeze(-2))
            self.assertTrue(torch.allclose(post.mean.squeeze(-2), mean, atol=1e-8))
            self.assertTrue(torch.allclose(post.variance.squeeze(-2), var, atol=1e-8))
            probs = model.model.predict_proba(x, method="approx")
            got = model.class_probabilities(x.unsqueeze(-2)).squeeze(-2)
            self.assertTrue(torch.allclose(got, probs, atol=1e-8))
        # exact joint covariance against a dense numpy computation
        model = dirichlet(torch.float64)
        clf = model.model
        labels = clf._train["labels"].numpy()
        v = clf.transform.values()
        x = torch.rand(5, D, dtype=torch.float64)
        with torch.no_grad():
            k = clf.kernel(clf._train["x"]).to_dense().numpy()
            # the classifier's kernel acts on its standardised inputs (its data contract)
            z = clf.standardizer.transform_inputs(x)
            ks = clf.kernel(clf._train["x"], z).to_dense().numpy()
            kss = clf.kernel(z).to_dense().numpy()
            extra = float(clf.extra_noise)
        post = model.posterior(x)
        cov = post.distribution.covariance_matrix.detach().numpy()  # interleaved (q*C)
        for c in range(2):
            noise = np.where(labels == c, v["pos_noise"], v["neg_noise"]) + extra
            ref = kss - ks.T @ np.linalg.solve(k + np.diag(noise), ks)
            np.testing.assert_allclose(cov[c::2, c::2], ref, atol=1e-8)

    def test_dirichlet_training_factors_cached_in_eval_mode(self):
        for sparse in (False, True):
            model = copy.deepcopy(dirichlet(torch.float64, sparse=sparse))  # mutated below
            x = torch.rand(3, 2, D, dtype=torch.float64)
            model._factor_cache = None
            first = model.posterior(x).mean
            factors = model._factor_cache[2]
            self.assertIs(model._train_factors(x), factors)  # reused, not recomputed
            # the cached path equals a fresh computation (train mode recomputes)
            model.train()
            fresh = model.posterior(x).mean
            model.eval()
            self.assertTrue(torch.allclose(first, fresh, atol=1e-12))
            # gradients reach the query points through the cached factors, twice in a row
            for _ in range(2):
                xq = x.clone().requires_grad_(True)
                model.posterior(xq).mean.sum().backward()
                self.assertTrue(torch.isfinite(xq.grad).all() and xq.grad.abs().sum() > 0)
            # an in-place parameter change (an optimiser step) invalidates the cache
            with torch.no_grad():
                model.model.kernel.base_kernel.raw_lengthscale.add_(0.5)
            changed = model.posterior(x).mean
            self.assertIsNot(model._factor_cache[2], factors)
            self.assertFalse(torch.allclose(changed, first))
            model.train()
            self.assertTrue(torch.allclose(model.posterior(x).mean, changed, atol=1e-12))
            model.eval()
        # train mode: gradients reach the hyperparameters
        model = copy.deepcopy(dirichlet(torch.float64))
        model.train()
        model.posterior(torch.rand(2, 1, D, dtype=torch.float64)).mean.sum().backward()
        grad = model.model.kernel.base_kernel.raw_lengthscale.grad
        self.assertTrue(grad is not None and bool(grad.abs().sum() > 0))
        model.eval()

    def test_transforms_follow_botorch(self):
        for dtype in DTYPES:
            x, y, _ = data(dtype)
            x_raw, y_raw = 10.0 * x + 3.0, 5.0 * y - 2.0
            torch.manual_seed(3)
            net = InducingGPNetwork(MLP(D, [8], 3), num_inducing=6).to(dtype)
            model = IGNSurrogate(
                net,
                train_X=x_raw,
                train_Y=y_raw,
                input_transform=Normalize(D),
                outcome_transform=Standardize(1),
            )
            model = fit_gpext_surrogate(model, epochs=2, batch_size=12)
            self.assertFalse(model.training)
            self.assertTrue(torch.allclose(model.input_transform.mins, x_raw.min(0).values))
            xq = 10.0 * torch.rand(4, D, dtype=dtype) + 3.0
            mean, var = net.predict(model.input_transform(xq), include_noise=False)
            mu, sd = (
                model.outcome_transform.means.squeeze(),
                model.outcome_transform.stdvs.squeeze(),
            )
            post = model.posterior(xq.unsqueeze(-2))
            tol = 1e-4 if dtype == torch.float32 else 1e-9
            self.assertTrue(
                torch.allclose(post.mean.reshape(-1), mean * sd + mu, rtol=tol, atol=tol)
            )
            self.assertTrue(
                torch.allclose(post.variance.reshape(-1), var * sd**2, rtol=tol, atol=tol)
            )
            # the standardised training targets are what the network saw
            self.assertTrue(
                torch.allclose(model.train_Y.mean(), torch.zeros((), dtype=dtype), atol=1e-5)
            )

    def test_output_indices_noise_tensor_and_posterior_transform(self):
        model = dirichlet(torch.float64)
        X = torch.rand(3, 2, D, dtype=torch.float64)
        full = model.posterior(X)
        one = model.posterior(X, output_indices=[1])
        self.assertEqual(one.mean.shape, torch.Size([3, 2, 1]))
        self.assertTrue(torch.allclose(one.mean[..., 0], full.mean[..., 1]))
        noise = torch.full((3, 2, 2), 0.25, dtype=torch.float64)
        noisy = model.posterior(X, observation_noise=noise)
        self.assertTrue(torch.allclose(noisy.variance, full.variance + 0.25))
        w = torch.tensor([-1.0, 1.0], dtype=torch.float64)
        diff = model.posterior(X, posterior_transform=ScalarizedPosteriorTransform(w))
        self.assertTrue(torch.allclose(diff.mean[..., 0], full.mean[..., 1] - full.mean[..., 0]))

    def test_errors(self):
        model = ign(torch.float64)
        with pytest.raises(InputTypeError, match="dtype"):
            model.posterior(torch.rand(2, 1, D, dtype=torch.float32))
        with pytest.raises(ShapeError, match="columns"):
            model.posterior(torch.rand(2, 1, D + 1, dtype=torch.float64))
        with pytest.raises(ShapeError, match="batch_shape x q x d"):
            model.posterior(torch.rand(D, dtype=torch.float64))
        with pytest.raises(InputDataError, match="finite"):
            model.posterior(torch.full((2, 1, D), float("nan"), dtype=torch.float64))
        with pytest.raises(InputTypeError, match="torch.Tensor"):
            model.posterior([[0.1, 0.2]])
        with pytest.raises(InputDataError, match="output_indices"):
            model.posterior(torch.rand(2, 1, D, dtype=torch.float64), output_indices=[3])
        with pytest.raises(InputDataError, match="observation-noise"):
            dirichlet(torch.float64).posterior(
                torch.rand(2, 1, D, dtype=torch.float64), observation_noise=True
            )
        with pytest.raises(InputDataError, match="classifier"):
            model.class_probabilities(torch.rand(2, 1, D, dtype=torch.float64))
        with pytest.raises(InputTypeError, match="InducingGPNetwork"):
            IGNSurrogate(torch.nn.Linear(2, 2))
        with pytest.raises(InputTypeError, match="DirichletGPClassifier"):
            DirichletClassifierSurrogate(torch.nn.Linear(2, 2))
        with pytest.raises(InputTypeError, match="GWI"):
            GWISurrogate(torch.nn.Linear(2, 2), None)
        with pytest.raises(NotFittedError, match="no training data"):
            fit_gpext_surrogate(DirichletClassifierSurrogate(DirichletGPClassifier(2)))
        with pytest.raises(NotFittedError, match="fit the classifier"):
            DirichletClassifierSurrogate(DirichletGPClassifier(2)).posterior(torch.rand(2, 1, D))
        x, y, _ = data(torch.float64)
        with pytest.raises(ShapeError, match="explicit output dimension"):
            IGNSurrogate(model.model, train_X=x, train_Y=y.squeeze(-1))
        bad = DirichletClassifierSurrogate(DirichletGPClassifier(2), train_X=x, train_Y=y)
        with pytest.raises(InputDataError, match="whole numbers"):
            fit_gpext_surrogate(bad)

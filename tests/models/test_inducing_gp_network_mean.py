"""InducingGPNetwork's prior mean (``mean_module``), and GPyTorch's model test case for IGN."""

import io
import unittest

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.test.model_test_case import BaseModelTestCase

from gpext.errors import InputTypeError, ShapeError
from gpext.fit import StandardizedGaussianLikelihood
from gpext.models import InducingGPNetwork
from gpext.nn import MLP

DTYPES = [torch.float32, torch.float64]


def _data(n=160, dtype=torch.float64, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=dtype) * 4 - 2
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=gen, dtype=dtype)
    return x, y


def _fixed_constant(c, batch_shape=None):
    batch_shape = torch.Size(batch_shape or ())
    mean = gpytorch.means.ConstantMean(batch_shape=batch_shape)
    mean.constant = torch.full(batch_shape, float(c))
    mean.raw_constant.requires_grad_(False)  # fixed: training must not move it
    return mean


def _model(mean_module=None, dtype=torch.float64, seed=0, **kwargs):
    torch.manual_seed(seed)
    kwargs.setdefault("num_inducing", 8)
    return InducingGPNetwork(MLP(2, [16], 3), mean_module=mean_module, **kwargs).to(dtype)


def _dense_eq7_with_mean(model, x):
    """numpy reference: m(g) + K_gZ K_ZZ^{-1} (r - m(Z)) and K_gg - K_gZ K_ZZ^{-1} K_Zg."""
    with torch.no_grad():
        g = model.features(x)
        z = model.gp.inducing_points  # shape: (*h, m, d)
        k = model.gp.covar_module
        jitter = model.gp._jitter(z.dtype)
        kzz = k(z).to_dense().double().numpy() + jitter * np.eye(z.shape[-2])
        kgz = k(g, z).to_dense().double().numpy()  # shape: (*h, N, m)
        kgg = k(g).to_dense().double().numpy()
        r = model.gp.pseudo_labels().double().numpy()
        mg = model.mean_module(g).double().numpy()
        mz = model.mean_module(z).double().numpy()
    mean = mg + (kgz @ np.linalg.solve(kzz, (r - mz)[..., None]))[..., 0]
    return mean, kgg - kgz @ np.linalg.solve(kzz, np.swapaxes(kgz, -1, -2))


class TestConstantMeanShift:
    def setup_method(self):
        torch.manual_seed(60)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_a_fixed_constant_mean_on_shifted_data_shifts_the_predictions(self, dtype):
        """Fit (with hold-out, noise calibration and the closed-form refit) of a ConstantMean c
        on y + c equals the zero-mean fit on y, shifted by c."""
        c = 3.5
        x, y = _data(dtype=dtype)
        kwargs = {"epochs": 8, "batch_size": 40, "lr": 5e-3, "validation_fraction": 0.2,
                  "min_steps": 0}  # fmt: skip
        # on the data as given: with the (default) standardisation the prior mean is in the
        # standardised units, and y + c is standardised to the same targets as y
        zero = _model(dtype=dtype, standardize=False)
        zero.fit(x, y, generator=torch.Generator().manual_seed(1), **kwargs)
        shifted = _model(_fixed_constant(c), dtype=dtype, standardize=False)
        shifted.fit(x, y + c, generator=torch.Generator().manual_seed(1), **kwargs)
        assert shifted.noise_calibration_ is not None
        assert float(shifted.mean_module.constant) == c  # fixed
        xt = torch.linspace(-2, 2, 25, dtype=dtype).unsqueeze(-1).expand(25, 2).contiguous()
        m0, v0 = zero.predict(xt)
        m1, v1 = shifted.predict(xt)
        tol = (
            {"atol": 2e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-8, "rtol": 1e-8}
        )
        torch.testing.assert_close(m1, m0 + c, **tol)
        torch.testing.assert_close(v1, v0, **tol)
        torch.testing.assert_close(shifted.likelihood.noise, zero.likelihood.noise, **tol)
        # the pseudo-labels carry the mean: r = m(Z) + residual (in float32 rounding of the
        # shifted targets is amplified by the conditioning of K_ZZ; the predictions agree)
        r_tol = tol if dtype == torch.float64 else {"atol": 5e-3, "rtol": 1e-3}
        torch.testing.assert_close(shifted.gp.pseudo_labels(), zero.gp.pseudo_labels() + c, **r_tol)
        # the loss is that of the zero-mean model on the unshifted data
        with torch.no_grad():
            torch.testing.assert_close(shifted.loss(x, y + c), zero.loss(x, y), **tol)

    def test_zero_mean_default_equals_a_constant_mean_at_zero(self):
        x, y = _data()
        a = _model()
        b = _model(_fixed_constant(0.0))
        assert isinstance(a.mean_module, gpytorch.means.ZeroMean)
        a.initialize(x, y, generator=torch.Generator().manual_seed(0))
        b.initialize(x, y, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(a.predict(x[:7]), b.predict(x[:7]))
        torch.testing.assert_close(a.refit_pseudo_labels(x, y), b.refit_pseudo_labels(x, y))


class TestLinearMeanOnFeatures:
    def setup_method(self):
        torch.manual_seed(61)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_forward_predict_and_loss_use_the_mean_of_the_features(self, dtype):
        x, y = _data(dtype=dtype)
        model = _model(gpytorch.means.LinearMean(5), dtype=dtype)  # 3 features + 2 inputs
        with torch.no_grad():
            model.mean_module.weights.normal_()
            model.mean_module.bias.fill_(0.7)
            model.gp.pseudo_label_weight.normal_()
        model._fitted = True  # parameters set by hand
        ref_mean, ref_cov = _dense_eq7_with_mean(model, x[:9])
        tol = (
            {"atol": 1e-4, "rtol": 1e-4} if dtype == torch.float32 else {"atol": 1e-8, "rtol": 1e-8}
        )
        out = model(x[:9])
        np.testing.assert_allclose(out.mean.detach().double().numpy(), ref_mean, **tol)
        np.testing.assert_allclose(out.covariance_matrix.detach().double().numpy(), ref_cov, **tol)
        mean, var = model.predict(x[:9], include_noise=False)
        np.testing.assert_allclose(mean.double().numpy(), ref_mean, **tol)
        np.testing.assert_allclose(var.double().numpy(), np.diag(ref_cov), **tol)
        # the loss is the Gaussian NLL of those marginals plus the noise
        noise = float(model.likelihood.noise.detach())
        yb = y[:9].double().numpy()
        v = np.diag(ref_cov) + noise
        ref_nll = np.mean(0.5 * ((yb - ref_mean) ** 2 / v + np.log(2 * np.pi * v)))
        np.testing.assert_allclose(float(model.loss(x[:9], y[:9])), ref_nll, **tol)
        # its parameters get gradients from the loss
        model.loss(x, y).backward()
        assert model.mean_module.weights.grad.abs().sum() > 0

    def test_refit_is_the_weighted_least_squares_of_the_residuals(self):
        x, y = _data()
        model = _model(gpytorch.means.LinearMean(5))  # 3 network features + 2 appended inputs
        with torch.no_grad():
            model.mean_module.weights.normal_()
            model.likelihood.noise = 0.05
        model.initialize(x, y, generator=torch.Generator().manual_seed(0))
        r = model.refit_pseudo_labels(x, y, ridge=0.0)
        with torch.no_grad():
            g, z, k = model.features(x), model.gp.inducing_points, model.gp.covar_module
            kzz = k(z).to_dense().numpy() + model.gp._jitter(z.dtype) * np.eye(8)
            kgz = k(g, z).to_dense().numpy()
            a = np.linalg.solve(kzz, kgz.T).T  # shape: (N, m)
            w = 1.0 / (k(g, diag=True).numpy() - (a * kgz).sum(-1) + 0.05)
            # the targets as the model sees them (standardised by initialize)
            resid = (model.standardizer.transform_targets(y) - model.mean_module(g)).numpy()
            mz = model.mean_module(z).numpy()
        ref = np.linalg.solve((a * w[:, None]).T @ a, a.T @ (w * resid)) + mz
        np.testing.assert_allclose(r.numpy(), ref, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(model.gp.pseudo_labels(), r)

    def test_fit_learns_a_linear_trend_that_the_mean_carries_outside_the_data(self):
        """With a LinearMean on features a fit follows a linear trend; the mean module is
        trained and round-trips through torch.save into a fresh instance."""
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(240, 2, generator=gen, dtype=torch.float64) * 4 - 2
        y = 2.0 * x[:, 0] - x[:, 1] + 0.05 * torch.randn(240, generator=gen, dtype=torch.float64)
        model = _model(gpytorch.means.LinearMean(5))
        before = model.mean_module.weights.detach().clone()
        model.fit(x, y, epochs=30, batch_size=60, lr=5e-3, generator=gen, min_steps=0)
        assert not torch.equal(model.mean_module.weights.detach(), before)
        mean, _ = model.predict(x)
        assert float((mean - y).pow(2).mean()) < 0.05 * float(y.var())
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        fresh = _model(gpytorch.means.LinearMean(5), seed=123)
        fresh.load_state_dict(torch.load(buf, weights_only=True))
        torch.testing.assert_close(fresh.predict(x[:11]), model.predict(x[:11]), rtol=0, atol=0)


class TestMulticlassMean:
    @pytest.mark.parametrize("task", ["one_vs_all", "dirichlet"])
    def test_batch_mean_per_class_and_state_dict(self, task):
        torch.manual_seed(0)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(60, 2, generator=gen, dtype=torch.float64)
        y = torch.randint(0, 3, (60,), generator=gen)
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
        model = _model(mean, task=task, num_classes=3, num_inducing=6)
        assert "gp.mean_module.raw_constant" in model.state_dict()
        assert model.state_dict()["gp.mean_module.raw_constant"].shape == (3,)
        model.fit(x, y, epochs=2, batch_size=30, generator=gen)
        with torch.no_grad():
            model.mean_module.constant = torch.tensor([0.5, -1.0, 2.0], dtype=torch.float64)
        out = model(x[:5])
        assert out.mean.shape == (3, 5) and out.covariance_matrix.shape == (3, 5, 5)
        ref_mean, _ = _dense_eq7_with_mean(model, x[:5])
        np.testing.assert_allclose(out.mean.detach().numpy(), ref_mean, rtol=1e-8, atol=1e-8)
        buf = io.BytesIO()
        torch.save(model.state_dict(), buf)
        buf.seek(0)
        fresh = _model(
            gpytorch.means.ConstantMean(batch_shape=torch.Size([3])),
            task=task, num_classes=3, num_inducing=6, seed=9,
        )  # fmt: skip
        fresh.load_state_dict(torch.load(buf, weights_only=True))
        torch.testing.assert_close(fresh.predict(x[:5]), model.predict(x[:5]), rtol=0, atol=0)
        torch.testing.assert_close(fresh.predict_proba(x[:5], generator=torch.Generator().manual_seed(0)),
                                   model.predict_proba(x[:5], generator=torch.Generator().manual_seed(0)))  # fmt: skip

    def test_a_shared_mean_broadcasts_over_the_classes(self):
        model = _model(_fixed_constant(1.5), task="dirichlet", num_classes=3)
        model._fitted = True
        x = torch.randn(4, 2, dtype=torch.float64)
        ref_mean, _ = _dense_eq7_with_mean(model, x)
        mean, _ = model.predict(x)
        assert mean.shape == (3, 4)
        np.testing.assert_allclose(
            mean.numpy(), np.broadcast_to(ref_mean, (3, 4)), rtol=1e-8, atol=1e-8
        )


class TestMeanErrors:
    def test_bad_mean_modules(self):
        with pytest.raises(InputTypeError, match="gpytorch.means.Mean"):
            _model(torch.nn.Linear(3, 1))
        with pytest.raises(ShapeError, match="feature dimension"):
            _model(gpytorch.means.LinearMean(3))  # features have 3 + 2 (appended) columns
        with pytest.raises(ShapeError, match="batch shape"):
            _model(gpytorch.means.ConstantMean(batch_shape=torch.Size([4])), task="dirichlet",
                   num_classes=3)  # fmt: skip
        with pytest.raises(ShapeError):
            _model(gpytorch.means.ConstantMean(batch_shape=torch.Size([3])))  # one head only


class TestIGNModelTestCase(BaseModelTestCase, unittest.TestCase):
    """GPyTorch's model test case: ``model(x)`` is a (batch) MultivariateNormal with a lazy
    covariance, in train and eval mode, with a learned constant prior mean."""

    def create_model(self, train_x, train_y, likelihood):
        torch.manual_seed(0)
        model = InducingGPNetwork(
            MLP(2, [8], 3), num_inducing=5, likelihood=likelihood,
            mean_module=gpytorch.means.ConstantMean(),
        )  # fmt: skip
        model.initialize(train_x.reshape(-1, 2)[:40], train_y.reshape(-1)[:40])
        return model

    def create_test_data(self):
        return torch.randn(50, 2)

    def create_likelihood_and_labels(self):
        # the noise is learned on standardised targets: this likelihood adds it in the units
        # of model(x) (a plain GaussianLikelihood would add it unscaled)
        return StandardizedGaussianLikelihood(torch.tensor(1.0)), torch.randn(50)

    def create_batch_test_data(self, batch_shape=torch.Size([3])):  # noqa: B008 (the base's signature)
        return torch.randn(*batch_shape, 50, 2)

    def create_batch_likelihood_and_labels(self, batch_shape=torch.Size([3])):  # noqa: B008
        return gpytorch.likelihoods.GaussianLikelihood(), torch.randn(*batch_shape, 50)

    def test_likelihood_of_model_is_the_predictive(self):
        x = self.create_test_data()
        likelihood, y = self.create_likelihood_and_labels()
        model = self.create_model(x, y, likelihood)
        model.eval()
        with torch.no_grad():
            pred = model.likelihood(model(x))
        mean, var = model.predict(x)
        torch.testing.assert_close(pred.mean, mean)
        torch.testing.assert_close(pred.variance, var)

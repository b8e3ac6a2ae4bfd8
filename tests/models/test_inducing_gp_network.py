"""Tests for gpext.models.InducingGPNetwork (002 Eq. 5 and 7, Proposition 1, classification)."""

import math

import gpytorch
import numpy as np
import pytest
import scipy.stats
import torch

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.models import InducingGPNetwork
from gpext.nn import MLP, SetEncoder

DTYPES = [torch.float32, torch.float64]


def _regression_model(dtype=torch.float64, m=6, seed=0):
    torch.manual_seed(seed)
    model = InducingGPNetwork(MLP(2, [8], 3), num_inducing=m).to(dtype)
    with torch.no_grad():
        model.gp.pseudo_label_weight.normal_()
        model.likelihood.noise = 0.2
    model._fitted = True  # parameters set by hand: predict without fit
    return model


def _dense_eq7(model, x):
    """Dense numpy reference for 002 Eq. 7 on the model's features."""
    with torch.no_grad():
        g = model.features(x).double()
        z = model.gp.inducing_points.double()
        k = model.gp.covar_module.double()
        jitter = model.gp._jitter(model.gp.inducing_points.dtype)
        kzz = k(z).to_dense().numpy() + jitter * np.eye(z.shape[0])
        kgz = k(g, z).to_dense().numpy()
        kgg = k(g).to_dense().numpy()
        r = model.gp.pseudo_labels().double().numpy()
        model.gp.covar_module.to(model.gp.inducing_points.dtype)
    mean = kgz @ np.linalg.solve(kzz, r)
    cov = kgg - kgz @ np.linalg.solve(kzz, kgz.T)
    return mean, cov


class TestInducingGPNetworkRegression:
    def setup_method(self):
        torch.manual_seed(20)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_predictions_match_dense_eq7(self, dtype):
        model = _regression_model(dtype)
        x = torch.randn(13, 2, dtype=dtype)
        mean_ref, cov_ref = _dense_eq7(model, x)
        tol = (
            {"atol": 2e-4, "rtol": 2e-4} if dtype == torch.float32 else {"atol": 1e-9, "rtol": 1e-9}
        )
        f = model(x)
        np.testing.assert_allclose(f.mean.detach().double().numpy(), mean_ref, **tol)
        np.testing.assert_allclose(f.covariance_matrix.detach().double().numpy(), cov_ref, **tol)
        mean, var = model.predict(x, batch_size=5)
        noise = float(model.likelihood.noise.detach())
        np.testing.assert_allclose(mean.double().numpy(), mean_ref, **tol)
        np.testing.assert_allclose(var.double().numpy(), np.diag(cov_ref) + noise, **tol)
        _, latent = model.predict(x, include_noise=False)
        np.testing.assert_allclose(
            latent.double().numpy(), np.clip(np.diag(cov_ref), 0, None), **tol
        )

    def test_loss_is_scaled_eq5(self):
        model = _regression_model()
        model.minibatch_covariance = "full"
        x, y = torch.randn(9, 2, dtype=torch.float64), torch.randn(9, dtype=torch.float64)
        mean, cov = _dense_eq7(model, x)
        noise = float(model.likelihood.noise.detach())
        ref = -scipy.stats.multivariate_normal(mean, cov + noise * np.eye(9)).logpdf(y.numpy()) / 9
        np.testing.assert_allclose(float(model.loss(x, y).detach()), ref, rtol=1e-9)

    def test_independent_minibatch_covariance_is_eq5_on_single_points(self):
        model = _regression_model()
        model.minibatch_covariance = "independent"
        x, y = torch.randn(6, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
        mean, cov = _dense_eq7(model, x)
        noise = float(model.likelihood.noise.detach())
        ref = -scipy.stats.norm(mean, np.sqrt(np.diag(cov) + noise)).logpdf(y.numpy()).sum() / 6
        np.testing.assert_allclose(float(model.loss(x, y).detach()), ref, rtol=1e-9)
        with pytest.raises(InputDataError, match="minibatch_covariance"):
            InducingGPNetwork(MLP(2, [4], 3), minibatch_covariance="diag")

    @pytest.mark.parametrize("task", ["regression", "binary"])
    def test_proposition1_on_the_network(self, task):
        torch.manual_seed(1)
        model = InducingGPNetwork(MLP(2, [8], 3), num_inducing=5, task=task).double()
        x = torch.randn(12, 2, dtype=torch.float64)
        y = torch.randn(12, dtype=torch.float64) if task == "regression" else (x[:, 0] > 0).long()

        def z_grad():
            model.zero_grad()
            return torch.autograd.grad(model.loss(x, y), model.gp.inducing_points)[0]

        trainable = z_grad()
        emb_grad = torch.autograd.grad(model.loss(x, y), list(model.embedding.parameters()))
        assert any(g.abs().sum() > 0 for g in emb_grad)
        for p in model.embedding.parameters():
            p.requires_grad_(False)
        torch.testing.assert_close(z_grad(), trainable)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_fit_learns_a_nonlinear_function(self, dtype):
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(300, 1, generator=gen, dtype=dtype) * 6 - 3
        y = torch.sin(2 * x[:, 0]) + 0.05 * torch.randn(300, generator=gen, dtype=dtype)
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(1, [32], 2), num_inducing=16).to(dtype)
        hist = model.fit(x, y, epochs=40, batch_size=100, lr=5e-3, generator=gen)
        assert hist.losses[-1] < hist.losses[0]
        mean, var = model.predict(x)
        rmse = float(((mean - y) ** 2).mean().sqrt())
        assert rmse < 0.2
        assert mean.dtype == dtype and bool((var > 0).all())

    def test_state_dict_round_trip_and_input_transform(self):
        class Scale(torch.nn.Module):
            def forward(self, x):
                return 2.0 * x

        a = InducingGPNetwork(MLP(2, [4], 3), num_inducing=4, input_transform=Scale()).double()
        b = InducingGPNetwork(MLP(2, [4], 3), num_inducing=4, input_transform=Scale()).double()
        with pytest.raises(NotFittedError, match="not fitted"):
            a.predict(torch.randn(5, 2, dtype=torch.float64))
        a._fitted = True  # its random initial parameters stand in for fitted ones
        b.load_state_dict(a.state_dict())  # loading a state dict marks b as fitted
        x = torch.randn(5, 2, dtype=torch.float64)
        torch.testing.assert_close(a.predict(x)[0], b.predict(x)[0])
        # the network's features of the transformed inputs, then the inputs it saw appended
        # (input_augmented, the default for vector inputs)
        torch.testing.assert_close(a.features(x), torch.cat([a.embedding(2.0 * x), 2.0 * x], -1))

    def test_set_inputs(self):
        """Variable-size sets through the SetEncoder: the label is the mean of the elements."""
        gen = torch.Generator().manual_seed(0)
        sets = [
            torch.randn(int(torch.randint(2, 8, (1,), generator=gen)), 1, generator=gen)
            for _ in range(200)
        ]
        x = SetEncoder.pad(sets)
        y = torch.stack([s.mean() for s in sets])
        torch.manual_seed(0)
        model = InducingGPNetwork(SetEncoder(1, 4, hidden_features=16), num_inducing=16)
        model.fit(x, y, epochs=40, batch_size=50, lr=5e-3, generator=gen)
        mean, _ = model.predict(x)
        assert float(((mean - y) ** 2).mean()) < 0.3 * float(y.var())

    def test_errors(self):
        model = _regression_model()
        x = torch.randn(4, 2, dtype=torch.float64)
        with pytest.raises(InputDataError, match="task"):
            InducingGPNetwork(MLP(2, [4], 3), task="ordinal")
        with pytest.raises(InputTypeError, match="nn.Module"):
            InducingGPNetwork(lambda x: x)
        with pytest.raises(InputDataError, match="feature_dim"):
            InducingGPNetwork(torch.nn.Tanh())
        wrong = InducingGPNetwork(torch.nn.Linear(2, 3), feature_dim=4)
        wrong._fitted = True
        with pytest.raises(ShapeError, match="feature_dim"):
            wrong.predict(torch.randn(3, 2))
        with pytest.raises(InputTypeError, match="torch.float64"):
            model.predict(torch.randn(3, 2))  # float32 data into a float64 model
        mean_np, _ = model.predict(torch.randn(3, 2, dtype=torch.float64).numpy())
        assert mean_np.dtype == torch.float64 and mean_np.shape == (3,)
        with pytest.raises(ShapeError, match=r"\(x, y\)"):
            model.loss(x, torch.randn(5, dtype=torch.float64))
        with pytest.raises(InputDataError, match="finite"):
            model.loss(x, torch.tensor([0.0, float("nan"), 1.0, 2.0], dtype=torch.float64))
        with pytest.raises(InputDataError, match="classification"):
            model.predict_proba(x)
        with pytest.raises(InputDataError, match="at least num_inducing"):
            model.fit(x, torch.randn(4, dtype=torch.float64), epochs=1)
        with pytest.raises(InputDataError, match="batch_size"):
            model.fit(x, torch.randn(4, dtype=torch.float64), epochs=1, batch_size=1)


class TestInducingGPNetworkFitOptions:
    def setup_method(self):
        torch.manual_seed(40)

    @staticmethod
    def _data(dtype=torch.float64):
        gen = torch.Generator().manual_seed(1)
        x = torch.rand(240, 1, generator=gen, dtype=dtype) * 6 - 3
        y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(240, generator=gen, dtype=dtype)
        return x, y

    def test_early_stopping_restores_the_best_validation_epoch(self):
        x, y = self._data()
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(1, [16], 2), num_inducing=8).double()
        model.fit(
            x, y, epochs=6, batch_size=50, lr=2e-2, validation_fraction=0.25,
            generator=torch.Generator().manual_seed(5), refit_pseudo_labels=False,
            calibrate_noise=False, min_steps=0,  # exactly 6 epochs
        )  # fmt: skip
        assert len(model.validation_history_) == 6
        # the hold-out is the first randperm drawn from the generator
        perm = torch.randperm(240, generator=torch.Generator().manual_seed(5))[:60]
        score = model._validation_nll(x[perm], y[perm])
        np.testing.assert_allclose(score, min(model.validation_history_), rtol=1e-10)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_cosine_schedule_and_gp_lr(self, dtype):
        x, y = self._data(dtype)
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(1, [32], 2), num_inducing=16).to(dtype)
        hist = model.fit(
            x, y, epochs=30, batch_size=60, lr=1e-2, gp_lr=5e-2, lr_schedule="cosine",
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        assert hist.losses[-1] < hist.losses[0]
        mean, _ = model.predict(x)
        assert float(((mean - y) ** 2).mean().sqrt()) < 0.25
        # a 0.05 GP learning rate moves the noise far below its 0.69 start in 120 steps
        assert float(model.likelihood.noise) < 0.1

    def test_fit_option_errors(self):
        x, y = self._data()
        model = InducingGPNetwork(MLP(1, [4], 2), num_inducing=4).double()
        with pytest.raises(InputDataError, match="lr_schedule"):
            model.fit(x, y, epochs=1, lr_schedule="step")
        with pytest.raises(InputDataError, match="validation_fraction"):
            model.fit(x, y, epochs=1, validation_fraction=0.7)


class TestInducingGPNetworkClassification:
    def setup_method(self):
        torch.manual_seed(30)

    @staticmethod
    def _blobs(n_per, centers, dtype=torch.float64, seed=0):
        gen = torch.Generator().manual_seed(seed)
        c = torch.tensor(centers, dtype=dtype)
        x = torch.cat(
            [ci + 0.4 * torch.randn(n_per, c.shape[1], generator=gen, dtype=dtype) for ci in c]
        )
        y = torch.arange(len(centers)).repeat_interleave(n_per)
        return x, y

    def test_binary_probit_prediction_formula(self):
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(2, [4], 3), num_inducing=5, task="binary").double()
        with torch.no_grad():
            model.gp.pseudo_label_weight.normal_()
        model._fitted = True  # parameters set by hand
        x = torch.randn(7, 2, dtype=torch.float64)
        mean, var = model.predict(x)
        probs = model.predict_proba(x)
        ref = scipy.stats.norm.cdf(mean.numpy() / np.sqrt(1 + var.numpy()))
        np.testing.assert_allclose(probs[:, 1].numpy(), ref, rtol=1e-10)
        torch.testing.assert_close(probs.sum(-1), torch.ones(7, dtype=torch.float64))

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_binary_fit(self, dtype):
        x, y = self._blobs(60, [[-1.5, 0.0], [1.5, 0.0]], dtype)
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(2, [16], 2), num_inducing=8, task="binary").to(dtype)
        if dtype == torch.float32:  # per-point Laplace (1-D Newton) path
            model.minibatch_covariance = "independent"
        hist = model.fit(
            x, y, epochs=15, batch_size=40, lr=1e-2, generator=torch.Generator().manual_seed(0)
        )
        assert hist.losses[-1] < hist.losses[0]
        acc = float((model.predict_proba(x).argmax(-1) == y).double().mean())
        assert acc > 0.95

    def test_one_vs_all_fit_and_shapes(self):
        x, y = self._blobs(40, [[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
        torch.manual_seed(0)
        model = InducingGPNetwork(
            MLP(2, [16], 3), num_inducing=6, task="one_vs_all", num_classes=3
        ).double()
        model.fit(
            x, y, epochs=15, batch_size=40, lr=1e-2, generator=torch.Generator().manual_seed(0)
        )
        mean, var = model.predict(x[:5])
        assert mean.shape == (3, 5) and var.shape == (3, 5)
        assert model(x[:5]).covariance_matrix.shape == (3, 5, 5)
        probs = model.predict_proba(x)
        torch.testing.assert_close(probs.sum(-1), torch.ones(120, dtype=torch.float64))
        heads = scipy.stats.norm.cdf(
            (model.predict(x)[0] / torch.sqrt(1 + model.predict(x)[1])).numpy()
        ).T
        np.testing.assert_allclose(probs.numpy(), heads / heads.sum(-1, keepdims=True), rtol=1e-6)
        assert float((probs.argmax(-1) == y).double().mean()) > 0.95

    def test_one_vs_all_loss_is_sum_of_binary_laplace(self):
        torch.manual_seed(0)
        model = InducingGPNetwork(
            MLP(2, [4], 3), num_inducing=4, task="one_vs_all", num_classes=3,
            minibatch_covariance="full",
        ).double()  # fmt: skip
        x = torch.randn(8, 2, dtype=torch.float64)
        y = torch.tensor([0, 1, 2, 2, 1, 0, 0, 1])
        prior = model(x)
        ref = (
            sum(
                -float(
                    model.laplace.log_marginal_likelihood(
                        prior.mean[c], prior.covariance_matrix[c], (y == c).long()
                    )
                )
                for c in range(3)
            )
            / 8
        )
        np.testing.assert_allclose(float(model.loss(x, y)), ref, rtol=1e-8)

    def test_dirichlet_task(self):
        from gpext.likelihoods import DirichletTransform

        x, y = self._blobs(40, [[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
        torch.manual_seed(0)
        model = InducingGPNetwork(
            MLP(2, [16], 3), num_inducing=6, task="dirichlet", num_classes=3
        ).double()
        # the loss is the heteroscedastic Eq. 5 summed over the class heads
        model.minibatch_covariance = "full"
        xb, yb = x[::10], y[::10]
        prior = model(xb)
        t = DirichletTransform(3)(yb, dtype=torch.float64, class_dim=-2)
        ref = 0.0
        for c in range(3):
            cov = prior.covariance_matrix[c].detach().numpy() + np.diag(t.noise[c].numpy())
            ref -= scipy.stats.multivariate_normal(prior.mean[c].detach().numpy(), cov).logpdf(
                t.targets[c].numpy()
            )
        np.testing.assert_allclose(float(model.loss(xb, yb).detach()), ref / len(yb), rtol=1e-8)
        model.minibatch_covariance = "independent"
        model.fit(
            x, y, epochs=15, batch_size=40, lr=1e-2, generator=torch.Generator().manual_seed(0)
        )
        probs = model.predict_proba(x, generator=torch.Generator().manual_seed(0))
        assert probs.shape == (120, 3)
        torch.testing.assert_close(probs.sum(-1), torch.ones(120, dtype=torch.float64))
        assert float((probs.argmax(-1) == y).double().mean()) > 0.95

    @pytest.mark.parametrize("task", ["binary", "one_vs_all", "dirichlet"])
    def test_independent_loss_is_mean_of_single_point_losses(self, task):
        torch.manual_seed(3)
        kwargs = {} if task == "binary" else {"num_classes": 3}
        model = InducingGPNetwork(MLP(2, [4], 3), num_inducing=4, task=task, **kwargs).double()
        with torch.no_grad():
            model.gp.pseudo_label_weight.normal_()
        assert model.minibatch_covariance == "independent"  # the default
        x = torch.randn(7, 2, dtype=torch.float64)
        y = torch.tensor([0, 1, 1, 0, 1, 0, 1]) if task == "binary" else torch.arange(7) % 3
        independent = float(model.loss(x, y))
        model.minibatch_covariance = "full"
        singles = [float(model.loss(x[i : i + 1], y[i : i + 1])) for i in range(7)]
        np.testing.assert_allclose(independent, np.mean(singles), rtol=1e-8)

    def test_label_errors(self):
        with pytest.raises(InputDataError, match="num_classes"):
            InducingGPNetwork(MLP(2, [4], 3), task="binary", num_classes=3)
        with pytest.raises(InputTypeError, match="num_classes"):
            InducingGPNetwork(MLP(2, [4], 3), task="one_vs_all")
        model = InducingGPNetwork(MLP(2, [4], 3), num_inducing=2, task="binary").double()
        with pytest.raises(InputDataError, match="labels in"):
            model.loss(torch.randn(3, 2, dtype=torch.float64), torch.tensor([0, 1, 2]))
        with pytest.raises(InputTypeError, match="integer class labels"):
            model.loss(torch.randn(3, 2, dtype=torch.float64), torch.tensor([0.0, 0.5, 1.0]))
        assert math.isfinite(
            float(model.loss(torch.randn(3, 2, dtype=torch.float64), torch.tensor([0, 1, 1])))
        )


class TestNoiseCalibration:
    """Default fits hold out 10% of >= 200 rows and re-estimate the noise on them."""

    @staticmethod
    def _overfit_data(n=400, sd=0.5, seed=0):
        gen = torch.Generator().manual_seed(seed)
        x = torch.randn(n, 4, generator=gen, dtype=torch.float64)
        y = (
            torch.sin(2 * x[:, 0])
            + 0.5 * x[:, 1]
            + sd * torch.randn(n, generator=gen, dtype=torch.float64)
        )
        return x, y

    def test_default_fit_recovers_the_noise_an_interpolating_network_hides(self):
        """A 64x64 network memorises noisy targets; without the hold-out (the old default)
        the learned noise is several times too small, with it the noise is near the truth."""
        x, y = self._overfit_data()
        torch.manual_seed(0)
        old = InducingGPNetwork(MLP(4, [64, 64], 8), num_inducing=32).double()
        # no hold-out and no calibration (the refit on 80% calibrates by default now)
        old.fit(x, y, epochs=200, validation_fraction=0.0, calibrate_noise=False,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
        torch.manual_seed(0)
        new = InducingGPNetwork(MLP(4, [64, 64], 8), num_inducing=32).double()
        new.fit(x, y, epochs=200, generator=torch.Generator().manual_seed(0))
        assert new.noise_calibration_["num_points"] == 40
        assert old.noise_variance < 0.25 / 2  # the truth is 0.25
        xt, yt = self._overfit_data(n=2000, seed=1)
        cover = {}
        for name, model in (("old", old), ("new", new)):
            mean, var = model.predict(xt)
            cover[name] = float(((yt - mean).abs() <= 1.96 * var.sqrt()).double().mean())
        assert cover["old"] < 0.85
        assert 0.90 <= cover["new"] <= 0.99

    def test_calibrated_noise_minimises_the_held_out_nll(self):
        from scipy.optimize import minimize_scalar

        x, y = self._overfit_data(n=300)
        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(4, [16], 4), num_inducing=16).double()
        model.fit(x[:250], y[:250], epochs=20, validation_fraction=0.0, min_steps=0,
                  calibrate_noise=False, generator=torch.Generator().manual_seed(0))  # fmt: skip
        mean, var = model.predict(x[250:], include_noise=False)
        r2, s = ((y[250:] - mean) ** 2).numpy(), var.numpy()

        def nll(log_noise):
            v = s + np.exp(log_noise)
            return float(np.mean(r2 / v + np.log(v)))

        ref = minimize_scalar(nll, bounds=(-20, 5), method="bounded", options={"xatol": 1e-10})
        got = model.calibrate_noise(x[250:], y[250:], allow_decrease=True)
        np.testing.assert_allclose(np.log(got), ref.x, atol=1e-5)
        # by default the noise is only raised (likelihood.noise is on standardised targets,
        # the returned value in the targets' units)
        _, s_y = model.target_loc_scale
        with torch.no_grad():
            model.likelihood.noise = 4 * got / s_y**2
        assert model.calibrate_noise(x[250:], y[250:]) == pytest.approx(4 * got, rel=1e-6)

    def test_small_data_keeps_every_row_and_errors(self):
        x, y = self._overfit_data(n=100)
        model = InducingGPNetwork(MLP(4, [16], 4), num_inducing=16).double()
        res = model.fit(x, y, epochs=2, generator=torch.Generator().manual_seed(0), min_steps=0)
        assert res.validation_losses == []
        # every row is trained on; the noise is calibrated on 20% left out of a refit
        assert model.noise_calibration_["method"] == "refit"
        assert model.noise_calibration_["num_points"] == 20
        x, y = x[:40], y[:40]  # too few rows for a refit on 80%
        model = InducingGPNetwork(MLP(4, [16], 4), num_inducing=16).double()
        model.fit(x, y, epochs=2, min_steps=0)
        assert not hasattr(model, "noise_calibration_")
        with pytest.raises(InputDataError, match="calibrate_noise"):
            model.fit(x, y, epochs=2, calibrate_noise=True)
        cls = InducingGPNetwork(MLP(4, [16], 4), num_inducing=16, task="binary").double()
        with pytest.raises(InputDataError, match="regression"):
            cls.calibrate_noise(x, (y > 0).long())


class TestDeepKernelView:
    def test_kernel_is_the_feature_map_kernel_of_the_model(self):
        from gpext.kernels import FeatureMapKernel

        torch.manual_seed(0)
        model = InducingGPNetwork(MLP(3, [16], 4), num_inducing=8).double()
        before = set(model.state_dict())
        k = model.kernel
        assert isinstance(k, FeatureMapKernel) and set(model.state_dict()) == before
        x1 = torch.randn(5, 3, dtype=torch.float64)
        x2 = torch.randn(4, 3, dtype=torch.float64)
        ref = model.gp.covar_module(model.features(x1), model.features(x2)).to_dense()
        torch.testing.assert_close(k(x1, x2).to_dense(), ref)
        torch.testing.assert_close(k(x1, diag=True), ref.new_tensor(
            model.gp.covar_module(model.features(x1), diag=True)))  # fmt: skip
        # shares parameters: gradients of the kernel reach the embedding
        k(x1, x2).to_dense().sum().backward()
        assert model.embedding.net[0].weight.grad is not None
        multi = InducingGPNetwork(
            MLP(3, [16], 4), num_inducing=8, task="dirichlet", num_classes=3
        ).double()
        assert multi.kernel(x1, x2).shape == (3, 5, 4)


class TestProbitLikelihoodObject:
    def test_likelihood_of_model_is_the_predictive_for_probit_tasks(self):
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(0)
        x = torch.randn(80, 2, generator=g, dtype=torch.float64)
        y = (x[:, 0] > 0).long()
        model = InducingGPNetwork(MLP(2, [16], 2), num_inducing=8, task="binary").double()
        assert isinstance(model.likelihood, gpytorch.likelihoods.BernoulliLikelihood)
        model.fit(x, y, epochs=3, batch_size=40, generator=g, min_steps=0)
        with torch.no_grad():
            probs = model.likelihood(model(x[:6])).probs
        torch.testing.assert_close(probs, model.predict_proba(x[:6])[:, 1])
        y3 = torch.randint(0, 3, (80,), generator=g)
        ova = InducingGPNetwork(
            MLP(2, [16], 3), num_inducing=6, task="one_vs_all", num_classes=3
        ).double()
        ova.fit(x, y3, epochs=2, batch_size=40, generator=g, min_steps=0)
        with torch.no_grad():
            per_class = ova.likelihood(ova(x[:5])).probs  # shape: (C, N), unnormalised
            mean, var = ova.predict(x[:5])
        assert per_class.shape == (3, 5)
        from scipy.stats import norm

        ref = norm.cdf((mean / (1 + var).sqrt()).numpy())
        torch.testing.assert_close(per_class, torch.from_numpy(ref))

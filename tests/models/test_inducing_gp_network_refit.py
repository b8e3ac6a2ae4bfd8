"""Tests for InducingGPNetwork.refit_pseudo_labels (closed-form pseudo-labels, 002 Eq. 5)."""

import numpy as np
import pytest
import torch

from gpext.errors import InputDataError
from gpext.models import InducingGPNetwork
from gpext.nn import MLP

DTYPES = [torch.float32, torch.float64]


def _data(n=120, dtype=torch.float64, seed=3):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=dtype) * 4 - 2
    y = torch.sin(2 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=gen, dtype=dtype)
    return x, y


def _model(dtype=torch.float64, m=8, seed=0):
    torch.manual_seed(seed)
    model = InducingGPNetwork(MLP(2, [16], 3), num_inducing=m).to(dtype)
    with torch.no_grad():
        model.gp.pseudo_label_weight.normal_()
        model.likelihood.noise = 0.05
    return model


def _dense_refit(model, x, y, ridge):
    """numpy MAP: sum_i (y_i - a_i^T r)^2 / v_i + c (r - r0)^T K_ZZ^{-1} (r - r0) on all the
    data, c = ridge * mean(diag K_ZZ) / var(y), r0 the linear pseudo-labels."""
    with torch.no_grad():
        g = model.features(x).double()
        z = model.gp.inducing_points.double()
        r0 = model.gp._linear_pseudo_labels().double().numpy()
        k = model.gp.covar_module.double()
        jitter = model.gp._jitter(model.gp.inducing_points.dtype)
        kzz0 = k(z).to_dense().numpy()
        kzz = kzz0 + jitter * np.eye(z.shape[0])
        kgz = k(g, z).to_dense().numpy()
        kdiag = k(g, diag=True).numpy()
        noise = float(model.likelihood.noise)
        model.gp.covar_module.to(model.gp.inducing_points.dtype)
    a = np.linalg.solve(kzz, kgz.T).T  # shape: (N, m)
    w = 1.0 / (kdiag - (a * kgz).sum(-1) + noise)
    yn = model.standardizer.transform_targets(y).double().numpy()  # as the model sees them
    prior = ridge * np.diag(kzz0).mean() / np.var(yn) * np.linalg.inv(kzz)
    return np.linalg.solve((a * w[:, None]).T @ a + prior, a.T @ (w * yn) + prior @ r0)


class TestRefitPseudoLabels:
    def setup_method(self):
        torch.manual_seed(50)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_lowers_the_full_data_objective_and_matches_a_dense_solve(self, dtype):
        model = _model(dtype)
        x, y = _data(dtype=dtype)
        with torch.no_grad():
            before = float(model.loss(x, y))
        ref = _dense_refit(model, x, y, ridge=0.5)
        r = model.refit_pseudo_labels(x, y, batch_size=25, ridge=0.5)  # streamed in 5 batches
        tol = (
            {"atol": 2e-3, "rtol": 2e-3} if dtype == torch.float32 else {"atol": 1e-6, "rtol": 1e-5}
        )
        np.testing.assert_allclose(r.double().numpy(), ref, **tol)
        with torch.no_grad():
            after = float(model.loss(x, y))
        # the MAP lowers the objective: the prior penalty is zero at the old (linear) labels
        assert after < before
        # without the prior r is the minimiser: no perturbation lowers the objective
        model.refit_pseudo_labels(x, y, ridge=0.0)
        with torch.no_grad():
            after = float(model.loss(x, y))
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            offset = model.gp.pseudo_label_offset.clone()
            for _ in range(5):
                step = 1e-2 * torch.randn(offset.shape, generator=gen, dtype=dtype)
                model.gp.pseudo_label_offset.copy_(offset + step)
                assert float(model.loss(x, y)) > after - 1e-6
            model.gp.pseudo_label_offset.copy_(offset)
        # predictions are Eq. 7 with the new pseudo-labels
        mean, _ = model.predict(x)
        torch.testing.assert_close(mean, model(x).mean.detach())

    def test_fit_refits_by_default_for_regression_only(self):
        x, y = _data()
        # no noise calibration afterwards: the refit is the closed form for the final noise
        kwargs = {"epochs": 3, "batch_size": 40, "lr": 1e-2, "min_steps": 0}
        model = _model()
        model.fit(x, y, generator=torch.Generator().manual_seed(0), calibrate_noise=False,
                  **kwargs)  # fmt: skip
        offset = model.gp.pseudo_label_offset.detach().clone()
        assert float(offset.abs().max()) > 0
        # the fitted offset is the closed-form one for the final parameters
        ref = _dense_refit(model, x, y, ridge=1.0)
        np.testing.assert_allclose(
            model.gp.pseudo_labels().detach().numpy(), ref, rtol=1e-5, atol=1e-6
        )
        plain = _model()
        plain.fit(x, y, refit_pseudo_labels=False, generator=torch.Generator().manual_seed(0),
                  calibrate_noise=False, **kwargs)  # fmt: skip
        assert float(plain.gp.pseudo_label_offset.abs().max()) == 0.0
        # the same training run up to the refit
        torch.testing.assert_close(plain.gp.inducing_points, model.gp.inducing_points)

        labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        torch.manual_seed(0)
        dirichlet = InducingGPNetwork(MLP(2, [8], 3), num_inducing=6, task="dirichlet",
                                      num_classes=3).double()  # fmt: skip
        dirichlet.fit(x, labels, **kwargs)
        assert float(dirichlet.gp.pseudo_label_offset.abs().max()) == 0.0
        r = dirichlet.refit_pseudo_labels(x, labels)
        assert r.shape == (3, 6) and bool(torch.isfinite(r).all())

    def test_errors(self):
        x, y = _data(n=30)
        binary = InducingGPNetwork(MLP(2, [4], 3), num_inducing=4, task="binary").double()
        labels = (y > 0).long()
        with pytest.raises(InputDataError, match="Gaussian objective"):
            binary.refit_pseudo_labels(x, labels)
        with pytest.raises(InputDataError, match="refit_pseudo_labels"):
            binary.fit(x, labels, epochs=1, refit_pseudo_labels=True)
        model = _model()
        with pytest.raises(InputDataError, match="ridge"):
            model.refit_pseudo_labels(x, y, ridge=-1.0)
        with pytest.raises(InputDataError, match="batch_size"):
            model.refit_pseudo_labels(x, y, batch_size=0)

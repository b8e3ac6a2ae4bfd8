"""End-to-end tests of the GWI regression and robust-max classification models."""

from __future__ import annotations

import math

import pytest
import torch

from gpext.errors import InputDataError, ShapeError
from gpext.models import GWIClassificationModel, GWIRegressionModel


def _regression_data(dtype, n=160, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=gen, dtype=dtype) * 6 - 3
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=dtype)
    return x, y, gen


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_regression_trains_predicts_and_calibrates(dtype):
    torch.manual_seed(0)
    x, y, gen = _regression_data(dtype)
    xv, yv = x[:30], y[:30]
    xt, yt = x[30:], y[30:]
    model, lik = GWIRegressionModel.from_data(
        xt, yt, num_inducing=12, prior_steps=30, generator=gen
    )
    assert model.covar_module.raw_outputscale.requires_grad is False  # prior frozen
    hist = model.fit(
        lik, xt, yt, epochs=25, batch_size=64, lr=3e-2, x_val=xv, y_val=yv, generator=gen
    )
    assert len(hist["w2"]) == 25 and all(math.isfinite(w) and w >= 0 for w in hist["w2"])
    mean, var = model.predict(lik, xv)
    assert mean.dtype == dtype and mean.shape == (30,) and bool((var > 0).all())
    assert float(((mean - yv) ** 2).mean()) < 0.1 * float(yv.var())
    nll_before = model._validation_nll(lik, xv, yv, 1.0)
    t = model.calibrate_temperature(lik, xv, yv)
    assert t > 0 and model._validation_nll(lik, xv, yv, t) <= nll_before + 1e-6
    mean, var = model.predict(lik, xv)
    # state_dict round trip
    other, lik2 = GWIRegressionModel.from_data(
        xt, yt, num_inducing=12, prior_steps=2, generator=gen
    )
    other.load_state_dict(model.state_dict())
    lik2.load_state_dict(lik.state_dict())
    m2, v2 = other.predict(lik2, xv)
    assert torch.allclose(mean, m2) and torch.allclose(var, v2)


def test_robust_max_classification_trains_on_toy_problem():
    pytest.importorskip("gpext.likelihoods.robust_max_likelihood")
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 2.0], [2.0, -1.0], [-2.0, -1.0]], dtype=torch.float64)
    y = torch.arange(3).repeat(60)
    x = centers[y] + 0.6 * torch.randn(180, 2, generator=gen, dtype=torch.float64)
    model, lik = GWIClassificationModel.from_data(
        x[:150], y[:150], 3, prior_steps=20, generator=gen
    )
    out = model(x[:5])
    assert out.batch_shape == (3,) and out.event_shape == (5,)
    hist = model.fit(lik, x[:150], y[:150], epochs=25, batch_size=64, lr=2e-2, generator=gen)
    assert hist["loss"][-1] < hist["loss"][0]
    t = model.calibrate_temperature(lik, x[150:], y[150:])
    probs = model.predict_proba(lik, x[150:])
    assert 0.5 * (1 - 1e-6) <= t <= 100 and probs.shape == (30, 3)
    # a separable validation split must not drive T -> 0 (probabilities far below eps / (J - 1))
    assert float(probs.min()) > 1e-6
    assert torch.allclose(probs.sum(-1), torch.ones(30, dtype=probs.dtype))
    assert float((probs.argmax(-1) == y[150:]).double().mean()) >= 0.9


def test_model_input_errors():
    x, y, gen = _regression_data(torch.float64, n=20)
    with pytest.raises(ShapeError, match="x \\(N, D\\)"):
        GWIRegressionModel.from_data(x[:, 0], y)
    with pytest.raises(InputDataError, match="mean"):
        GWIRegressionModel.from_data(x, y, mean="bogus", prior_steps=1)
    model, lik = GWIRegressionModel.from_data(x, y, prior_steps=1, mean="kernel+network")
    with pytest.raises(InputDataError, match="both x_val and y_val"):
        model.fit(lik, x, y, epochs=1, x_val=x)
    with pytest.raises(InputDataError, match="positive"):
        model.calibrate_temperature(lik, x, y, grid=torch.tensor([-1.0, 1.0]))

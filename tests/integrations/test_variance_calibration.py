"""Cross-validated variance calibration of the BoTorch adapters (small designs)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from botorch.models.transforms import Standardize

from gpext.errors import InputDataError, NotFittedError
from gpext.integrations.botorch import (
    GWISurrogate,
    IGNSurrogate,
    cross_validated_variance_scale,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.models import GWIRegressionModel, InducingGPNetwork
from gpext.nn import MLP


class _FixedPredictor:
    """Duck-typed latent adapter: mean 0, epistemic variance ``v(x) = x_0^2 + 0.1``, noise s."""

    def __init__(self, noise: float) -> None:
        self.noise = noise

    def eval(self) -> _FixedPredictor:
        return self

    def _latent_moments(self, Xq):  # (n, 1, d) -> (n, 1, 1), (n, 1, 1, 1)
        v = Xq[..., 0].square() + 0.1
        return torch.zeros_like(v).unsqueeze(-2), torch.diag_embed(v).unsqueeze(-3)

    def _exposed_noise_variance(self, Xq):
        return torch.full((Xq.shape[0], 1, 1), self.noise, dtype=Xq.dtype)


def _residual_data(kappa0: float, n: int = 4000, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    v = x[:, 0].square() + 0.1
    y = (kappa0 * v).sqrt() * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y.unsqueeze(-1), v


def test_scale_is_the_closed_form_maximum_likelihood_factor_without_noise():
    x, y, v = _residual_data(9.0)
    calls = []

    def fit_fold(xf, yf):
        calls.append(xf.shape[0])
        return _FixedPredictor(0.0)

    res = cross_validated_variance_scale(fit_fold, x, y, num_folds=4)
    expected = float((y[:, 0].square() / v).mean())  # argmax of sum log N(y; 0, k v)
    assert res.num_folds == 4 and sorted(calls) == [3000] * 4
    assert res.scale == pytest.approx(expected, rel=1e-4)
    assert res.heldout_nll_calibrated < res.heldout_nll
    assert res.heldout_coverage90 < 0.6 and res.heldout_coverage90_calibrated == pytest.approx(
        0.9, abs=0.02
    )


def test_scale_with_noise_maximises_the_heldout_likelihood():
    x, y, v = _residual_data(4.0)
    s = 0.5
    y = y + math.sqrt(s) * torch.randn(y.shape, generator=torch.Generator().manual_seed(3),
                                       dtype=y.dtype)  # fmt: skip
    res = cross_validated_variance_scale(lambda a, b: _FixedPredictor(s), x, y, num_folds=3)

    def nll(k):
        total = k * v + s
        return float(0.5 * (total.log() + y[:, 0].square() / total).mean())

    grid = torch.linspace(1.0, 20.0, 2000).tolist()
    best = min(grid, key=nll)
    assert res.scale == pytest.approx(best, rel=0.01)
    assert res.scale == pytest.approx(4.0, rel=0.15)


def test_scale_is_never_below_one_and_tiny_designs_are_left_alone():
    x, y, _ = _residual_data(0.2)
    assert cross_validated_variance_scale(lambda a, b: _FixedPredictor(0.0), x, y).scale == 1.0
    res = cross_validated_variance_scale(lambda a, b: _FixedPredictor(0.0), x[:3], y[:3])
    assert res.scale == 1.0 and res.num_folds == 0
    with pytest.raises(InputDataError, match="num_folds"):
        cross_validated_variance_scale(lambda a, b: _FixedPredictor(0.0), x, y, num_folds=1)


def test_a_factor_at_its_upper_bound_warns():
    """Held-out errors 10^3 times the spread: the factor is capped at 10^4 and says so."""
    from gpext.errors import FitWarning
    from gpext.integrations.botorch.variance_calibration import MAX_VARIANCE_SCALE

    x, y, _ = _residual_data(1e6, n=40)
    with pytest.warns(FitWarning, match="largest factor.*roughly uniform and large"):
        res = cross_validated_variance_scale(lambda a, b: _FixedPredictor(0.0), x, y)
    assert res.scale == pytest.approx(MAX_VARIANCE_SCALE, rel=0.01)
    # combined with the outcome's prior, the message says what the surrogate then is
    with pytest.warns(FitWarning, match="largest factor.*close to that prior"):
        res = cross_validated_variance_scale(
            lambda a, b: _FixedPredictor(0.0), x, y, prior_reversion=True
        )
    assert res.prior_reversion and res.scale == pytest.approx(MAX_VARIANCE_SCALE, rel=0.01)
    x, y, _ = _residual_data(9.0, n=40)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitWarning)
        cross_validated_variance_scale(lambda a, b: _FixedPredictor(0.0), x, y)


def _design(n=14, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = (torch.sin(8 * x[:, :1]) + torch.cos(6 * x[:, 1:])).to(x)
    return x, y


def _ign_adapter(x, y):
    torch.manual_seed(0)
    net = InducingGPNetwork(MLP(2, [16], 4), num_inducing=min(12, x.shape[0])).double()
    return IGNSurrogate(net, train_X=x, train_Y=y, outcome_transform=Standardize(1))


def test_ign_adapter_is_calibrated_by_default_and_scales_only_the_covariance():
    x, y = _design()
    model = fit_gpext_surrogate(_ign_adapter(x, y), epochs=30,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    cal = model.variance_calibration
    assert cal is not None and cal.num_folds == 5 and model.epistemic_scale == cal.scale >= 1.0
    xq = torch.rand(30, 1, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    post = model.posterior(xq)
    mean, var = post.mean.detach().clone(), post.variance.detach().clone()
    kappa = model.epistemic_scale
    model._set_variance_scale(1.0)
    raw = model.posterior(xq)
    # Eq. 7's mean does not depend on the kernel's scale; the covariance is proportional to it
    # (up to the fixed jitter on K_ZZ)
    torch.testing.assert_close(raw.mean, mean, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(var / raw.variance, torch.full_like(var, kappa), rtol=1e-2,
                               atol=0.0)  # fmt: skip
    assert model.epistemic_scale == 1.0


def test_ign_calibration_off_and_large_designs():
    x, y = _design()
    model = fit_gpext_surrogate(_ign_adapter(x, y), calibrate=False, epochs=5)
    assert model.variance_calibration is None and model.epistemic_scale == 1.0


def test_weight_ensemble_spread_is_scaled_about_the_mean():
    x, y = _design(16)
    g = torch.Generator().manual_seed(0)
    model = fit_weight_ensemble(x, y, method="swag", epochs=30, swa_epochs=10, num_samples=8,
                                outcome_transform=Standardize(1), generator=g)  # fmt: skip
    assert model.variance_calibration is not None
    kappa = model.epistemic_scale
    assert kappa >= 1.0 and model.fit_selection["epistemic_scale"] == kappa
    # the calibrated regression ensemble is combined with its outcome's prior (tested in
    # test_prior_reversion.py); here the spread factor alone
    assert model.fit_selection["prior_reversion"] and model.variance_calibration.prior_reversion
    model.prior_reversion = None
    xq = torch.rand(20, 1, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    scaled = model.forward(xq).detach()
    model.epistemic_scale = 1.0
    raw = model.forward(xq).detach()
    torch.testing.assert_close(scaled.mean(-3), raw.mean(-3))
    torch.testing.assert_close(scaled.var(-3), kappa * raw.var(-3))
    off = fit_weight_ensemble(x, y, method="swag", epochs=30, swa_epochs=10, num_samples=8,
                              calibrate=False, generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert off.variance_calibration is None and off.fit_selection["epistemic_scale"] == 1.0


def test_adapters_without_calibration_say_so():
    x, y = _design()
    m, lik = GWIRegressionModel.from_data(x, y.squeeze(-1), prior_steps=3,
                                          generator=torch.Generator().manual_seed(0))  # fmt: skip
    model = GWISurrogate(m, lik, train_X=x, train_Y=y)
    with pytest.raises(NotFittedError, match="calibrat"):
        fit_gpext_surrogate(model, calibrate=True, epochs=2)
    # an adapter that cannot be calibrated keeps no unfitted copy for calibration folds
    fit_gpext_surrogate(model, epochs=2)
    assert "_gpext_unfitted_adapter" not in model.__dict__


def test_fold_warnings_are_recorded_not_raised():
    import warnings as w

    x, y, _ = _residual_data(2.0, n=40)

    def fit_fold(xf, yf):
        w.warn("fold fit is degenerate", UserWarning, stacklevel=1)
        return _FixedPredictor(0.0)

    with w.catch_warnings():
        w.simplefilter("error")  # nothing escapes
        res = cross_validated_variance_scale(fit_fold, x, y, num_folds=4)
    assert res.fold_warnings == ["UserWarning: fold fit is degenerate"] * 4


def test_refitting_a_fitted_adapter_starts_every_fold_from_the_unfitted_weights(monkeypatch):
    x, y = _design()
    model = _ign_adapter(x, y)
    initial = {k: v.clone() for k, v in model.model.state_dict().items()}
    keys, num_params = set(model.state_dict()), len(list(model.parameters()))
    fit_gpext_surrogate(model, epochs=20, generator=torch.Generator().manual_seed(0))
    fitted = {k: v.clone() for k, v in model.model.state_dict().items()}
    assert any(not torch.equal(fitted[k], initial[k]) for k in initial)
    starts = []
    fold_copy = IGNSurrogate._fold_copy

    def spy(self, num_rows):
        starts.append({k: v.clone() for k, v in self.model.state_dict().items()})
        return fold_copy(self, num_rows)

    monkeypatch.setattr(IGNSurrogate, "_fold_copy", spy)
    # the refit's folds start from the weights before the first fit, never from weights that
    # were trained on their held-out rows
    fit_gpext_surrogate(model, epochs=20, generator=torch.Generator().manual_seed(1))
    assert len(starts) == 5
    for start in starts:
        assert all(torch.equal(start[k], initial[k]) for k in initial)
    # the kept copy is not part of the adapter's modules, parameters or state dict
    assert set(model.state_dict()) == keys and len(list(model.parameters())) == num_params
    assert model.variance_calibration is not None and model.epistemic_scale >= 1.0

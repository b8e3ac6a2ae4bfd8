"""PriorReversion: a sample ensemble combined with its outcome's prior N(m0, s0^2)."""

from __future__ import annotations

import math

import pytest
import torch
from botorch.models.transforms import Standardize
from botorch.posteriors.ensemble import EnsemblePosterior

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.integrations.botorch import (
    PriorReversion,
    VBootSurrogate,
    cross_validated_variance_scale,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.integrations.botorch.prior_reversion import attach_prior_reversion

DTYPES = (torch.float32, torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_members_have_the_product_moments_in_closed_form(dtype):
    g = torch.Generator().manual_seed(0)
    values = (3.0 * torch.randn(7, 50, 2, generator=g, dtype=torch.float64)
              + torch.linspace(-4, 4, 50, dtype=torch.float64).reshape(1, -1, 1)).to(dtype)  # fmt: skip
    m0 = torch.tensor([0.5, -1.0], dtype=dtype)
    s0 = torch.tensor([1.0, 2.0], dtype=dtype)
    out = PriorReversion(m0, s0)(values)
    mu, var = values.double().mean(0), values.double().var(0)
    v0 = s0.double().square()
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else {}
    torch.testing.assert_close(out.double().mean(0), (v0 * mu + var * m0.double()) / (v0 + var),
                               **tol)  # fmt: skip
    torch.testing.assert_close(out.double().var(0), v0 * var / (v0 + var), **tol)
    assert out.dtype == dtype and bool((out.double().var(0) < v0).all())
    # members keep their ranks at every point (a positive affine map per point)
    torch.testing.assert_close(out.argsort(0), values.argsort(0))


def test_weighted_members_and_the_limits():
    g = torch.Generator().manual_seed(1)
    values = torch.randn(5, 30, 1, generator=g, dtype=torch.float64)
    w = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    rev = PriorReversion(torch.zeros(1, dtype=torch.float64), torch.ones(1, dtype=torch.float64))
    out = rev(values, w)
    p = (w / w.sum()).reshape(-1, 1, 1)
    mu = (p * values).sum(0)
    var = (p * (values - mu).square()).sum(0) / (1 - p.square().sum())
    torch.testing.assert_close((p * out).sum(0), mu / (1 + var))
    # the weighted posterior of the combined members reports exactly the product's moments
    before = EnsemblePosterior(values.movedim(0, -3), weights=w)
    after = EnsemblePosterior(out.movedim(0, -3), weights=w)
    torch.testing.assert_close(before.variance, var)
    torch.testing.assert_close(after.mean, mu / (1 + var))
    torch.testing.assert_close(after.variance, var / (1 + var))
    # all weight on one member: no spread, the members are returned as they are (not NaN)
    one_hot = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(rev(values, one_hot), values)
    # an ensemble much surer than the prior is unchanged; a far less sure one becomes the prior
    sure = 1.0 + 1e-4 * values
    torch.testing.assert_close(rev(sure), sure, rtol=0, atol=1e-7)
    wild = 1e4 * values + 50.0
    assert float(rev(wild).mean(0).abs().max()) < 0.02
    assert float(rev(wild).var(0).max()) == pytest.approx(1.0, rel=1e-3)
    single = values[:1]
    torch.testing.assert_close(rev(single), single)


def test_bad_arguments_get_gpext_errors():
    one = torch.ones(1, dtype=torch.float64)
    with pytest.raises(InputTypeError):
        PriorReversion([0.0], one)
    with pytest.raises(ShapeError):
        PriorReversion(torch.zeros(2, dtype=torch.float64), one)
    with pytest.raises(InputDataError, match="prior_sd"):
        PriorReversion(one, torch.zeros(1, dtype=torch.float64))
    with pytest.raises(InputDataError, match="prior_mean"):
        PriorReversion(one * math.nan, one)
    rev = PriorReversion(one, one)
    with pytest.raises(ShapeError, match=r"\(S, N, 1\)"):
        rev(torch.zeros(3, 4, 2, dtype=torch.float64))
    with pytest.raises(ShapeError, match="weights"):
        rev(torch.zeros(3, 4, 1, dtype=torch.float64), torch.ones(2, dtype=torch.float64))


class _LatentPredictor:
    """Duck-typed latent adapter: mean 0.3, epistemic variance ``v(x) = x_0^2 + 0.1``."""

    def eval(self):
        return self

    def _latent_moments(self, Xq):  # (n, 1, d) -> (n, 1, 1), (n, 1, 1, 1)
        v = Xq[..., 0].square() + 0.1
        return torch.full_like(v, 0.3).unsqueeze(-2), torch.diag_embed(v).unsqueeze(-3)

    def _exposed_noise_variance(self, Xq):
        return None


def test_the_factor_maximises_the_heldout_likelihood_of_the_combination():
    g = torch.Generator().manual_seed(0)
    n = 60
    x = torch.randn(n, 1, generator=g, dtype=torch.float64)
    v = x[:, 0].square() + 0.1
    y = (0.3 + (9.0 * v).sqrt() * torch.randn(n, generator=g, dtype=torch.float64)).unsqueeze(-1)

    def fit_fold(a, b):
        return _LatentPredictor()

    res = cross_validated_variance_scale(fit_fold, x, y, num_folds=4, prior_reversion=True)
    assert res.prior_reversion and res.num_folds == 4
    # the same folds as the function (its default generator), the fold's targets as prior
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    m0, v0 = torch.empty(n, 1, dtype=torch.float64), torch.empty(n, 1, dtype=torch.float64)
    for fold in range(4):
        test, train = perm[fold::4], perm[torch.arange(n) % 4 != fold]
        m0[test], v0[test] = y[train].mean(), y[train].var(unbiased=False)
    mu, var = torch.full_like(y, 0.3), v.unsqueeze(-1)

    def nll(kappa):
        V = kappa * var
        mean, total = (v0 * mu + V * m0) / (v0 + V), v0 * V / (v0 + V)
        r2 = (y - mean).square()
        return float(0.5 * (total.log() + r2 / total + math.log(2 * math.pi)).mean())

    grid = torch.logspace(0, 4, 4000, dtype=torch.float64).tolist()
    best = min(grid, key=nll)
    assert res.scale == pytest.approx(best, rel=0.02)
    assert res.heldout_nll_calibrated == pytest.approx(nll(res.scale), rel=1e-6)
    plain = cross_validated_variance_scale(fit_fold, x, y, num_folds=4)
    assert not plain.prior_reversion and plain.scale != pytest.approx(res.scale, rel=0.02)


def _design(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    y = (torch.sin(8 * x[:, :1]) + torch.cos(6 * x[:, 1:])).to(x)
    return x, y


def test_fit_weight_ensemble_bounds_the_spread_by_the_targets_and_reverts_far_away():
    x, y = _design()
    model = fit_weight_ensemble(x, y, method="last_layer", epochs=40, swa_epochs=10,
                                num_samples=16, outcome_transform=Standardize(1),
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert model.fit_selection["prior_reversion"]
    rev = model.prior_reversion
    torch.testing.assert_close(
        rev.prior_mean, torch.zeros(1, dtype=torch.float64), atol=1e-12, rtol=0
    )  # fmt: skip  (standardised targets)
    far = torch.tensor([[[40.0, -40.0]]], dtype=torch.float64)
    post = model.posterior(far)
    y_sd = float(y.std())  # Standardize's scale: the unbiased sd
    y_pop_sd = float(y.std(unbiased=False))
    # the spread never exceeds the targets' (in the original space)
    xq = torch.cat([far, torch.rand(200, 1, 2, generator=torch.Generator().manual_seed(1),
                                    dtype=torch.float64)])  # fmt: skip
    assert float(model.posterior(xq).variance.sqrt().max()) <= y_pop_sd + 1e-9
    # far from the data the members disagree wildly: the mean is the targets' mean
    model.prior_reversion = None
    raw = model.posterior(far)
    model.prior_reversion = rev
    if float(raw.variance) > 100 * y_sd**2:
        assert float(post.mean) == pytest.approx(float(y.mean()), abs=0.05 * y_sd)
    # state dict round trip and gradients at a training input
    state = {k: v for k, v in model.state_dict().items() if k.startswith("prior_reversion.")}
    assert set(state) == {"prior_reversion.prior_mean", "prior_reversion.prior_sd"}
    xg = x[:1].clone().unsqueeze(0).requires_grad_(True)
    model.posterior(xg).mean.sum().backward()
    assert bool(torch.isfinite(xg.grad).all())
    off = fit_weight_ensemble(x, y, method="last_layer", epochs=40, swa_epochs=10,
                              num_samples=16, prior_reversion=False,
                              generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert not off.fit_selection["prior_reversion"] and off._modules.get("prior_reversion") is None
    uncal = fit_weight_ensemble(x, y, method="last_layer", epochs=40, swa_epochs=10,
                                num_samples=16, calibrate=False,
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert not uncal.fit_selection["prior_reversion"]


def test_attach_removes_and_replaces():
    x, y = _design()
    model = fit_weight_ensemble(x, y, method="swag", epochs=20, swa_epochs=5, num_samples=4,
                                calibrate=False, generator=torch.Generator().manual_seed(0))  # fmt: skip
    attach_prior_reversion(model, y)
    torch.testing.assert_close(model.prior_reversion.prior_mean, y.mean(0))
    torch.testing.assert_close(model.prior_reversion.prior_sd, y.std(0, unbiased=False))
    attach_prior_reversion(model, None)
    assert model._modules.get("prior_reversion") is None


def test_vboot_mlp_is_combined_and_vboot_rff_is_not():
    from gpext.bootstrap import VBootMLP, VBootRFF

    x, y = _design(12)
    mlp = VBootSurrogate(VBootMLP(4, hidden_sizes=(8,), dtype=torch.float64),
                         train_X=x, train_Y=y, outcome_transform=Standardize(1))  # fmt: skip
    fit_gpext_surrogate(mlp, num_epochs=20)
    assert mlp.variance_calibration.prior_reversion and mlp.prior_reversion is not None
    rff = VBootSurrogate(VBootRFF(num_features=32, num_particles=4), train_X=x, train_Y=y,
                         outcome_transform=Standardize(1))  # fmt: skip
    fit_gpext_surrogate(rff, calibrate=True, generator=torch.Generator().manual_seed(0))
    assert not rff.variance_calibration.prior_reversion
    assert rff._modules.get("prior_reversion") is None

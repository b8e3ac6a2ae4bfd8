"""Issue 38: the data contract, step budgets and the shared held-out checks of ``gpext.fit``.

Each test here failed on the code before the issue: no model standardised its data, the first-order
loop had no step budget and no ConvergenceWarning, and no check looked at rows the fit did not
train on.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.errors import (
    ConvergenceWarning,
    DataWarning,
    GpextWarning,
    NoSignalWarning,
    NotFittedError,
    OverconfidenceWarning,
    ShapeError,
    UnderconfidenceWarning,
)
from gpext.fit import (
    Standardizer,
    build_exact_gp,
    check_heldout,
    exact_gp_loo,
    fit_exact_gp,
    holdout_refit_check,
    still_improving,
    train_loop,
)
from gpext.models import DirichletGPClassifier


def _table(n=120, d=3, seed=0, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=torch.float64)
    f = torch.sin(4 * x[:, 0]) + x[:, 1] ** 2
    return x, f + noise * torch.randn(n, generator=g, dtype=torch.float64)


def _gpext_warnings(record):
    return [w for w in record if issubclass(w.category, GpextWarning)]


# ---------------------------------------------------------------------------- Standardizer
def test_standardizer_round_trip_and_state_dict():
    x = torch.randn(50, 3, dtype=torch.float64) * torch.tensor([1e-4, 1.0, 1e5]) + 7.0
    y = torch.randn(50, dtype=torch.float64) * 1e6 - 3e6
    s = Standardizer().fit(x, y)
    z = s.transform_inputs(x)
    torch.testing.assert_close(z.mean(0), torch.zeros(3, dtype=torch.float64), atol=1e-9, rtol=0)
    torch.testing.assert_close(z.std(0), torch.ones(3, dtype=torch.float64))
    t = s.transform_targets(y.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(s.untransform_targets(t.unsqueeze(-1)).squeeze(-1), y)
    assert float(s.untransform_variance(torch.ones(1))) == pytest.approx(float(y.var()))
    fresh = Standardizer()
    fresh.load_state_dict(s.state_dict())
    assert fresh.fitted
    torch.testing.assert_close(fresh.transform_inputs(x), z)
    with pytest.raises(ShapeError):
        s.transform_inputs(torch.zeros(4, 2, dtype=torch.float64))
    with pytest.raises(NotFittedError):
        Standardizer().transform_inputs(x)


def test_standardizer_warns_on_constant_columns_and_targets():
    x = torch.randn(20, 3, dtype=torch.float64)
    x[:, 1] = 4.0
    with pytest.warns(DataWarning, match="column"):
        s = Standardizer().fit(x, torch.randn(20, dtype=torch.float64))
    assert float(s.x_scale[1]) == 1.0
    with pytest.warns(DataWarning, match="targets are constant"):
        Standardizer().fit(torch.randn(20, 2), torch.full((20,), 3.0))


# ---------------------------------------------------------------------------- exact GP
@pytest.mark.parametrize(
    "scale_x, scale_y, shift_y", [(1.0, 1e-6, 0.0), (1.0, 1e6, 1e6), (1e4, 1.0, 0.0)]
)
def test_exact_gp_scaled_copies_give_scaled_predictions(scale_x, scale_y, shift_y):
    """Targets x 1e-6 ended with relative training RMSE 0.52 (0.001 unscaled), inputs x 1e4
    with test relative RMSE 0.43 against 0.033, silently (issue 38)."""
    x, y = _table()
    xt, yt = _table(40, seed=1)
    base = build_exact_gp(x, y)
    fit_exact_gp(base, num_restarts=1)
    scaled = build_exact_gp(x * scale_x, y * scale_y + shift_y)
    fit_exact_gp(scaled, num_restarts=1)
    with torch.no_grad():
        m0, v0 = base(xt).mean, base(xt).variance
        out = scaled(xt * scale_x)
    torch.testing.assert_close((out.mean - shift_y) / scale_y, m0, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(out.variance / scale_y**2, v0, rtol=1e-3, atol=1e-6)
    rel = float((m0 - yt).pow(2).mean().sqrt() / yt.std())
    assert rel < 0.2
    # the likelihood adds the noise in the original units
    with torch.no_grad():
        pv = scaled.likelihood(scaled(xt * scale_x)).variance / scale_y**2
        pv0 = base.likelihood(base(xt)).variance
    torch.testing.assert_close(pv, pv0, rtol=1e-3, atol=1e-6)


def test_exact_gp_state_dict_round_trip_keeps_the_transform():
    x, y = _table(60)
    model = build_exact_gp(x * 100, y * 1e3)
    fit_exact_gp(model, num_restarts=1)
    other = build_exact_gp(torch.rand(60, 3, dtype=torch.float64), torch.randn(60).double())
    other.load_state_dict(model.state_dict())
    other.set_train_data(model.train_inputs[0], model.train_targets, strict=False)
    other.eval()
    with torch.no_grad():
        torch.testing.assert_close(other(x[:5] * 100).mean, model(x[:5] * 100).mean)


def test_exact_gp_loo_matches_brute_force_refits():
    x, y = _table(25)
    model = build_exact_gp(x, y * 50 + 3)
    fit_exact_gp(model, num_restarts=1)
    mean, var = exact_gp_loo(model)
    for i in (0, 7, 24):
        keep = torch.arange(25) != i
        m = build_exact_gp(x[keep], (y * 50 + 3)[keep])
        m.load_state_dict(model.state_dict(), strict=False)
        # the leave-one-out model with the full fit's hyperparameters and transform
        m.standardizer.load_state_dict(model.standardizer.state_dict())
        m.set_train_data(x[keep], model.train_targets[keep], strict=False)
        m.eval()
        with torch.no_grad():
            p = m.likelihood(m(x[i : i + 1]))
        assert float(mean[i]) == pytest.approx(float(p.mean), rel=1e-6, abs=1e-6)
        assert float(var[i]) == pytest.approx(float(p.variance), rel=1e-5)


def test_exact_gp_on_pure_noise_warns_and_good_fit_is_quiet():
    g = torch.Generator().manual_seed(3)
    x = torch.rand(80, 2, generator=g, dtype=torch.float64)
    y = torch.randn(80, generator=g, dtype=torch.float64) * 1e3
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        res = fit_exact_gp(build_exact_gp(x, y))
    names = {w.category.__name__ for w in _gpext_warnings(rec)}
    assert names & {"NoSignalWarning", "VarianceCollapseWarning"}, names
    assert set(res.problems) & {"NoSignalWarning", "VarianceCollapseWarning"}
    x, y = _table(80)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        fit_exact_gp(build_exact_gp(x, y))
    assert not _gpext_warnings(rec), [str(w.message) for w in _gpext_warnings(rec)]


# ---------------------------------------------------------------------------- held-out checks
def test_check_heldout_fires_on_constructed_cases_and_stays_quiet_on_good_ones():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(200, generator=g, dtype=torch.float64)
    good = check_heldout(y + 0.3 * torch.randn(200, generator=g, dtype=torch.float64),
                         torch.full((200,), 0.09, dtype=torch.float64), y, train_mean=0.0,
                         name="m")  # fmt: skip
    assert good.ok and 0.9 < good.coverage95 <= 1.0
    with pytest.warns(NoSignalWarning):
        bad = check_heldout(torch.randn(200, generator=g, dtype=torch.float64),
                            torch.ones(200, dtype=torch.float64), y, train_mean=0.0, name="m")  # fmt: skip
    assert "NoSignalWarning" in bad.problems
    with pytest.warns(OverconfidenceWarning):
        over = check_heldout(y + 0.3 * torch.randn(200, generator=g, dtype=torch.float64),
                             torch.full((200,), 0.01, dtype=torch.float64), y, train_mean=0.0,
                             name="m")  # fmt: skip
    assert over.coverage95 < 0.7
    with pytest.warns(UnderconfidenceWarning):
        check_heldout(y + 0.3 * torch.randn(200, generator=g, dtype=torch.float64),
                      torch.full((200,), 1.0, dtype=torch.float64), y, train_mean=0.0, name="m")  # fmt: skip


def test_holdout_refit_check_uses_a_copy():
    x, y = _table(60)
    calls = []

    def fit_copy(xa, ya):
        calls.append(xa.shape[0])
        mu = ya.mean()
        return lambda xb: (torch.full((xb.shape[0],), float(mu)), torch.full((xb.shape[0],), 1e-6))

    with pytest.warns(OverconfidenceWarning):
        out = holdout_refit_check(fit_copy, x, y, name="m", generator=torch.Generator())
    assert calls == [48] and out.num_points == 12


# ---------------------------------------------------------------------------- step budgets
def test_train_loop_min_steps_and_convergence_warning():
    w = torch.nn.Parameter(torch.zeros(()))
    holder = torch.nn.ParameterList([w])
    opt = torch.optim.SGD([w], lr=1e-3)
    # 150 rows in one batch of 256: 50 epochs are 50 steps; min_steps makes them 400
    with pytest.warns(ConvergenceWarning, match="still falling"):
        res = train_loop(lambda idx: (w - 10).pow(2), opt, modules=[holder], epochs=50,
                         batches=lambda e: [torch.arange(150)], min_steps=400)  # fmt: skip
    assert res.num_evaluations == 400 and res.num_iterations == 400
    w2 = torch.nn.Parameter(torch.zeros(()))
    opt2 = torch.optim.Adam([w2], lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        train_loop(lambda: (w2 - 1).pow(2), opt2, modules=[torch.nn.ParameterList([w2])],
                   epochs=600)  # fmt: skip
    assert still_improving([5.0, 4.0]) is not None
    assert still_improving([1.0] * 40) is None


# ---------------------------------------------------------------------------- models
@pytest.mark.parametrize("factory", ["rff", "mlp"])
def test_vboot_scaled_copies_give_scaled_predictions(factory):
    x, y = _table(100)
    xt, _ = _table(30, seed=1)

    def fit(xs, ys):
        if factory == "rff":
            m = VBootRFF(256, 8, hyper_restarts=1)
            m.fit(xs, ys, generator=torch.Generator().manual_seed(0))
        else:
            m = VBootMLP(2, (32,), noise=0.01 * float(ys.var()), seed=0, dtype=torch.float64)
            m.fit(xs, ys, num_epochs=300)
        return m

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base, big = fit(x, y), fit(x * 1e4, y * 1e6 + 5e6)
    mb, vb = base.predict_mixture(xt)
    ms, vs = big.predict_mixture(xt * 1e4)
    torch.testing.assert_close((ms - 5e6) / 1e6, mb, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(vs / 1e12, vb, rtol=1e-3, atol=1e-8)


def test_classifiers_do_not_depend_on_input_units():
    """Wine with inputs x 1e4: DirichletGPClassifier 0.98 -> 0.65, VBootRFF 1.00 -> 0.44."""
    g = torch.Generator().manual_seed(0)
    centres = torch.tensor([[0.0, 0.0], [3.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    labels = torch.randint(0, 3, (150,), generator=g)
    x = centres[labels] + torch.randn(150, 2, generator=g, dtype=torch.float64)
    x = x * torch.tensor([1e4, 1e-3], dtype=torch.float64)
    tr, te = slice(0, 100), slice(100, 150)
    clf = DirichletGPClassifier(3)
    clf.fit(x[tr], labels[tr])
    acc = float((clf.predict_proba(x[te]).argmax(-1) == labels[te]).double().mean())
    rff = VBootRFF(256, 8, task="classification", num_classes=3)
    rff.fit(x[tr], labels[tr], generator=torch.Generator().manual_seed(0))
    acc_rff = float((rff.predict_proba(x[te]).argmax(-1) == labels[te]).double().mean())
    assert acc > 0.8 and acc_rff > 0.8


def test_vboot_held_out_checks_fire_on_pure_noise_and_stay_quiet_on_signal():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(150, 3, generator=g, dtype=torch.float64)
    noise = torch.randn(150, generator=g, dtype=torch.float64) * 40 + 7
    signal = torch.sin(5 * x[:, 0]) + 0.1 * torch.randn(150, generator=g, dtype=torch.float64)
    for name, fit in [
        ("rff", lambda y: VBootRFF(512, 16).fit(x, y, generator=torch.Generator().manual_seed(1))),
        ("mlp", lambda y: VBootMLP(3, (64, 64), seed=1, dtype=torch.float64).fit(x, y)),
    ]:
        with pytest.warns(NoSignalWarning):
            res = fit(noise)
        assert "NoSignalWarning" in res.problems, name
        if name == "rff":
            with warnings.catch_warnings(record=True):
                warnings.simplefilter("always")
                res = fit(signal)
            assert not {"NoSignalWarning", "OverconfidenceWarning"} & set(res.problems)

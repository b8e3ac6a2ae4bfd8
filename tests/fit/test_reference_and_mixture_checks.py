"""Issue 38: the exact-GP reference of the held-out checks, the calibration-sized hold-out,
and the held-out calibration and check of weight-sample mixtures.

Before: no check compared a model with anything but the training mean, so a network that lost
0.5-2 nats per point to a plain exact GP on a small table did so silently; a 10% hold-out of a
60-row table was 6 rows, too few to calibrate or check on; and the subspace benchmark arms
never looked at their validation rows after choosing the temperature (variances 10-50 times
too large on some tables, every test point inside the 95% interval, no warning).
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from gpext.errors import (
    GpextWarning,
    OverconfidenceWarning,
    ReferenceGapWarning,
    UnderconfidenceWarning,
)
from gpext.fit import (
    AUTO_VALIDATION_MIN_ROWS,
    MIN_CHECK_POINTS,
    build_exact_gp,
    check_heldout,
    fit_exact_gp,
    reference_heldout_nll,
    validation_rows,
)
from gpext.subspace import (
    check_mixture_heldout,
    regression_mixture_log_likelihood,
    select_mixture_variance_scale,
)


def _table(n=120, seed=0, noise=0.1):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=g, dtype=torch.float64)
    return x, torch.sin(6 * x[:, 0]) + noise * torch.randn(n, generator=g, dtype=torch.float64)


def _gpext(record):
    return [w for w in record if issubclass(w.category, GpextWarning)]


# ---------------------------------------------------------------------------- hold-out size
@pytest.mark.parametrize(
    "n, expected", [(40, 10), (60, 15), (199, 49), (300, 50), (1000, 100), (20000, 2000)]
)
def test_validation_rows_keeps_enough_rows_to_calibrate(n, expected):
    assert validation_rows(n, 0.1) == expected
    assert validation_rows(n, 0.0) == 0
    # the old rule, round(0.1 n), left fewer than MIN_CHECK_POINTS rows below 100 rows
    assert validation_rows(n, 0.1) >= min(AUTO_VALIDATION_MIN_ROWS, n // 4, MIN_CHECK_POINTS)


# ---------------------------------------------------------------------------- exact-GP reference
def test_reference_heldout_nll_matches_the_exact_gp_it_fits():
    x, y = _table(100)
    ref = reference_heldout_nll(x[:80], y[:80], x[80:], y[80:],
                                generator=torch.Generator().manual_seed(0))  # fmt: skip
    model = build_exact_gp(x[:80], y[:80])
    fit_exact_gp(model, generator=torch.Generator().manual_seed(0), check=False)
    model.eval()
    with torch.no_grad():
        pred = model.likelihood(model(x[80:]))
    direct = -torch.distributions.Normal(pred.mean, pred.variance.sqrt()).log_prob(y[80:]).mean()
    assert ref == pytest.approx(float(direct), abs=1e-6)
    # scale equivariance: targets x 1e-6 shift the NLL by log(1e-6), nothing else
    ref_small = reference_heldout_nll(x[:80], 1e-6 * y[:80], x[80:], 1e-6 * y[80:],
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert ref_small == pytest.approx(ref + math.log(1e-6), abs=0.05)
    assert reference_heldout_nll(x[:80], y[:80], x[80:], y[80:], max_points=50) is None


def test_reference_gap_warns_when_the_model_loses_to_the_exact_gp_and_not_otherwise():
    x, y = _table(150)
    xf, yf, xh, yh = x[:100], y[:100], x[100:], y[100:]
    ref = reference_heldout_nll(xf, yf, xh, yh, generator=torch.Generator().manual_seed(0))
    model = build_exact_gp(xf, yf)
    fit_exact_gp(model, generator=torch.Generator().manual_seed(0), check=False)
    model.eval()
    with torch.no_grad():
        pred = model.likelihood(model(xh))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        good = check_heldout(pred.mean, pred.variance, yh, train_mean=float(yf.mean()),
                             name="gp", reference_nll=ref)  # fmt: skip
    assert good.ok and not _gpext(record) and good.nll == pytest.approx(ref, abs=1e-6)
    # a linear fit: explains some of the sine (no NoSignalWarning) but loses to the GP
    design = torch.cat([xf, torch.ones(100, 1, dtype=xf.dtype)], -1)
    coef = torch.linalg.lstsq(design, yf.unsqueeze(-1)).solution
    mean = torch.cat([xh, torch.ones(50, 1, dtype=xh.dtype)], -1) @ coef
    var = torch.full((50,), float((design @ coef - yf.unsqueeze(-1)).pow(2).mean()))
    with pytest.warns(ReferenceGapWarning, match="plain exact GP"):
        bad = check_heldout(mean.reshape(-1), var.to(yh), yh, train_mean=float(yf.mean()),
                            name="linear", reference_nll=ref)  # fmt: skip
    assert "ReferenceGapWarning" in bad.problems and bad.nll > ref + 0.5


# ---------------------------------------------------------------------------- mixtures
def _mixture(scale, n=300, s=20, seed=0):
    """Per-sample predictions whose mixture is calibrated once the variances are x 1/scale."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randn(n, generator=g, dtype=torch.float64)
    means = centre + 0.1 * torch.randn(s, n, generator=g, dtype=torch.float64)
    y = centre + 0.5 * torch.randn(n, generator=g, dtype=torch.float64)
    variances = torch.full((s, n), 0.25 * scale, dtype=torch.float64)
    return means, variances, y


@pytest.mark.parametrize("scale", [1 / 16, 1.0, 16.0])
def test_select_mixture_variance_scale_recovers_the_factor(scale):
    means, variances, y = _mixture(scale)
    kappa, score = select_mixture_variance_scale(means, variances, y)
    assert kappa * scale == pytest.approx(1.0, rel=0.25)
    at_one = float(regression_mixture_log_likelihood(means, variances, y).mean())
    assert score >= at_one - 1e-9


def test_check_mixture_heldout_names_miscalibration_and_cross_fits_the_factor():
    means, variances, y = _mixture(25.0)
    with pytest.warns(UnderconfidenceWarning):
        check_mixture_heldout(means, variances, y, name="m")
    means_o, variances_o, y_o = _mixture(1 / 25)
    with pytest.warns(OverconfidenceWarning):
        check_mixture_heldout(means_o, variances_o, y_o, name="m")
    # a factor cross-fitted on these rows calibrates both: the check is quiet
    for m, v, t in ((means, variances, y), (means_o, variances_o, y_o)):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            out = check_mixture_heldout(m, v, t, cross_fit_variance=True, name="m")
        assert out.ok and not _gpext(record) and 0.5 < out.mean_z2 < 2.0
    # its NLL is the mixture's own, and the reference comparison applies to it
    with pytest.warns(ReferenceGapWarning):
        check_mixture_heldout(means_o, variances_o, y_o, cross_fit_variance=True, name="m",
                              reference_nll=out.nll - 1.0)  # fmt: skip

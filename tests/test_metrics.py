"""Tests for :mod:`gpext.metrics` against independent numpy / scipy / scikit-learn references."""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from scipy import optimize, special, stats
from sklearn import metrics as skm

from gpext import metrics
from gpext.errors import InputDataError, InputTypeError, ShapeError

TOL = 1e-10  # float64 vs reference
RTOL32 = 1e-4  # float32 vs float64 reference (relative)
HYP = settings(max_examples=30, deadline=None, derandomize=True)


# --------------------------------------------------------------------------------------------
# Data helpers (numpy float64; converted to torch in the tests)
# --------------------------------------------------------------------------------------------


def regression_data(seed: int, shape=(60,)):
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=shape)
    var = rng.uniform(0.05, 2.0, size=shape)
    target = mean + 1.3 * np.sqrt(var) * rng.normal(size=shape)
    return mean, var, target


def mixture_data(seed: int, k: int = 4, shape=(30,)):
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(k, *shape)) + rng.normal(size=(k, 1) + (1,) * (len(shape) - 1))
    variances = rng.uniform(0.05, 1.5, size=(k, *shape))
    target = rng.normal(size=shape) * 1.5
    weights = rng.dirichlet(np.ones(k))
    return means, variances, target, weights


def class_data(seed: int, n: int = 300, c: int = 4, temperature: float = 2.0):
    rng = np.random.default_rng(seed)
    logits = temperature * rng.normal(size=(n, c))
    probs = special.softmax(logits, axis=1)
    target = rng.integers(0, c, size=n)
    return logits, probs, target


def t(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def lab(y):
    return torch.as_tensor(np.asarray(y), dtype=torch.long)


def ece_reference(probs: np.ndarray, target: np.ndarray, num_bins: int) -> float:
    """Straightforward loop over bins with explicit masks (independent of the module's code)."""
    conf = probs.max(axis=1)
    pred = probs.argmax(axis=1)
    correct = (pred == target).astype(float)
    n = len(target)
    ece = 0.0
    for b in range(num_bins):
        lo, hi = b / num_bins, (b + 1) / num_bins
        mask = (conf > lo) & (conf <= hi)
        if b == 0:
            mask |= conf == 0.0
        if mask.sum() == 0:
            continue
        ece += mask.sum() / n * abs(correct[mask].mean() - conf[mask].mean())
    return ece


def mixture_cdf(x, mus, sds, w):
    return float(np.sum(w * stats.norm.cdf(x, loc=mus, scale=sds)))


def mixture_quantile_brentq(q, mus, sds, w):
    a, b = np.min(mus - 12 * sds), np.max(mus + 12 * sds)
    return optimize.brentq(lambda x: mixture_cdf(x, mus, sds, w) - q, a, b, xtol=1e-15, rtol=1e-15)


# --------------------------------------------------------------------------------------------
# Regression metrics vs references
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(60,), (40, 3)])
def test_rmse_matches_sklearn_and_numpy(shape):
    mean, _, target = regression_data(0, shape)
    got = metrics.rmse(t(mean), t(target))
    assert got == pytest.approx(math.sqrt(skm.mean_squared_error(target, mean)), abs=TOL)
    assert got == pytest.approx(np.sqrt(np.mean((mean - target) ** 2)), abs=TOL)


@pytest.mark.parametrize("shape", [(60,), (40, 3)])
def test_gaussian_log_likelihood_matches_scipy(shape):
    mean, var, target = regression_data(1, shape)
    ref = stats.norm.logpdf(target, loc=mean, scale=np.sqrt(var))
    args = (t(mean), t(var), t(target))
    assert metrics.gaussian_log_likelihood(*args) == pytest.approx(ref.mean(), abs=TOL)
    assert metrics.gaussian_log_likelihood(*args, reduction="sum") == pytest.approx(
        ref.sum(), abs=1e-9
    )
    per_point = metrics.gaussian_log_likelihood(*args, reduction="none")
    assert isinstance(per_point, torch.Tensor) and per_point.shape == shape
    np.testing.assert_allclose(per_point.numpy(), ref, rtol=0, atol=TOL)


def test_gaussian_log_likelihood_y_scale_reports_original_units():
    z_mean, z_var, z = regression_data(2)
    s, m = 3.7, -12.5
    y, y_mean, y_sd = s * z + m, s * z_mean + m, s * np.sqrt(z_var)
    ref = stats.norm.logpdf(y, loc=y_mean, scale=y_sd)
    for y_scale in (s, torch.tensor(s, dtype=torch.float64), np.array([s])):
        got = metrics.gaussian_log_likelihood(t(z_mean), t(z_var), t(z), y_scale=y_scale)
        assert got == pytest.approx(ref.mean(), abs=TOL)
    per_point = metrics.gaussian_log_likelihood(
        t(z_mean), t(z_var), t(z), y_scale=s, reduction="none"
    )
    np.testing.assert_allclose(per_point.numpy(), ref, rtol=0, atol=TOL)


def test_gaussian_log_likelihood_per_output_y_scale():
    z_mean, z_var, z = regression_data(3, (25, 3))
    s, m = np.array([0.5, 2.0, 10.0]), np.array([1.0, -3.0, 100.0])
    ref = stats.norm.logpdf(s * z + m, loc=s * z_mean + m, scale=s * np.sqrt(z_var))
    got = metrics.gaussian_log_likelihood(t(z_mean), t(z_var), t(z), y_scale=t(s))
    assert got == pytest.approx(ref.mean(), abs=TOL)


@pytest.mark.parametrize("use_weights", [False, True])
@pytest.mark.parametrize("shape", [(30,), (20, 2)])
def test_mixture_log_likelihood_matches_scipy_logsumexp(use_weights, shape):
    means, variances, target, weights = mixture_data(4, k=5, shape=shape)
    w = weights if use_weights else np.full(5, 0.2)
    w_b = w.reshape((5,) + (1,) * len(shape))
    comp = stats.norm.logpdf(target, loc=means, scale=np.sqrt(variances))
    ref = special.logsumexp(comp, axis=0, b=w_b)
    kw = {"weights": t(w)} if use_weights else {}
    got = metrics.mixture_gaussian_log_likelihood(t(means), t(variances), t(target), **kw)
    assert got == pytest.approx(ref.mean(), abs=TOL)
    none = metrics.mixture_gaussian_log_likelihood(
        t(means), t(variances), t(target), reduction="none", **kw
    )
    np.testing.assert_allclose(none.numpy(), ref, rtol=0, atol=TOL)
    total = metrics.mixture_gaussian_log_likelihood(
        t(means), t(variances), t(target), reduction="sum", **kw
    )
    assert total == pytest.approx(ref.sum(), abs=1e-9)


def test_mixture_log_likelihood_y_scale_and_single_component():
    means, variances, target, weights = mixture_data(5, k=3)
    s, m = 2.5, 4.0
    comp = stats.norm.logpdf(s * target + m, loc=s * means + m, scale=s * np.sqrt(variances))
    ref = special.logsumexp(comp, axis=0, b=weights[:, None]).mean()
    got = metrics.mixture_gaussian_log_likelihood(
        t(means), t(variances), t(target), weights=t(weights), y_scale=s
    )
    assert got == pytest.approx(ref, abs=TOL)
    single = metrics.mixture_gaussian_log_likelihood(
        t(means[:1]), t(variances[:1]), t(target), y_scale=s
    )
    gauss = metrics.gaussian_log_likelihood(t(means[0]), t(variances[0]), t(target), y_scale=s)
    assert single == pytest.approx(gauss, abs=TOL)


@pytest.mark.parametrize("level", [0.5, 0.8, 0.95, 0.99])
def test_interval_coverage_matches_scipy_interval(level):
    mean, var, target = regression_data(6, (200,))
    lo, hi = stats.norm.interval(level, loc=mean, scale=np.sqrt(var))
    ref = np.mean((target >= lo) & (target <= hi))
    got = metrics.interval_coverage(t(mean), t(var), t(target), level=level)
    assert got == pytest.approx(ref, abs=TOL)


@pytest.mark.parametrize("level", [0.5, 0.9, 0.99])
def test_mixture_central_interval_matches_brentq(level):
    means, variances, _, weights = mixture_data(7, k=3, shape=(6,))
    sds = np.sqrt(variances)
    lower, upper = metrics.mixture_central_interval(
        t(means), t(variances), weights=t(weights), level=level
    )
    assert lower.shape == upper.shape == (6,)
    for i in range(6):
        ref_lo = mixture_quantile_brentq((1 - level) / 2, means[:, i], sds[:, i], weights)
        ref_hi = mixture_quantile_brentq((1 + level) / 2, means[:, i], sds[:, i], weights)
        assert lower[i].item() == pytest.approx(ref_lo, abs=TOL)
        assert upper[i].item() == pytest.approx(ref_hi, abs=TOL)


def test_mixture_central_interval_single_component_is_gaussian_interval():
    means, variances, _, _ = mixture_data(8, k=1, shape=(10, 2))
    lower, upper = metrics.mixture_central_interval(t(means), t(variances), level=0.9)
    ref_lo, ref_hi = stats.norm.interval(0.9, loc=means[0], scale=np.sqrt(variances[0]))
    np.testing.assert_allclose(lower.numpy(), ref_lo, rtol=0, atol=TOL)
    np.testing.assert_allclose(upper.numpy(), ref_hi, rtol=0, atol=TOL)


@pytest.mark.parametrize("use_weights", [False, True])
def test_mixture_interval_coverage_matches_cdf_reference(use_weights):
    means, variances, target, weights = mixture_data(9, k=4, shape=(80,))
    w = weights if use_weights else np.full(4, 0.25)
    sds = np.sqrt(variances)
    kw = {"weights": t(w)} if use_weights else {}
    level = 0.8
    # y is inside the central interval iff F(y) lies in [(1 - level) / 2, (1 + level) / 2].
    cdf = np.array([mixture_cdf(target[i], means[:, i], sds[:, i], w) for i in range(80)])
    ref = np.mean((cdf >= (1 - level) / 2) & (cdf <= (1 + level) / 2))
    got = metrics.mixture_interval_coverage(t(means), t(variances), t(target), level=level, **kw)
    assert got == pytest.approx(ref, abs=TOL)
    assert 0.0 < got < 1.0


def test_mixture_interval_coverage_single_component_equals_interval_coverage():
    mean, var, target = regression_data(10, (100, 2))
    got = metrics.mixture_interval_coverage(t(mean[None]), t(var[None]), t(target), level=0.7)
    ref = metrics.interval_coverage(t(mean), t(var), t(target), level=0.7)
    assert got == pytest.approx(ref, abs=TOL)


# --------------------------------------------------------------------------------------------
# Classification metrics vs references
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [2, 5])
def test_error_rate_matches_sklearn(c):
    _, probs, target = class_data(11, c=c)
    ref = 1.0 - skm.accuracy_score(target, probs.argmax(axis=1))
    assert metrics.error_rate(t(probs), lab(target)) == pytest.approx(ref, abs=TOL)
    assert metrics.error_rate(lab(probs.argmax(axis=1)), lab(target)) == pytest.approx(ref, abs=TOL)


def test_error_rate_ties_go_to_lowest_index():
    probs = t([[0.5, 0.5]])
    assert metrics.error_rate(probs, lab([0])) == 0.0
    assert metrics.error_rate(probs, lab([1])) == 1.0


@pytest.mark.parametrize("c", [2, 3, 6])
def test_categorical_nll_matches_sklearn_log_loss(c):
    logits, probs, target = class_data(12, c=c)
    ref = skm.log_loss(target, probs, labels=list(range(c)))
    assert metrics.categorical_nll(t(probs), lab(target)) == pytest.approx(ref, abs=TOL)
    assert metrics.categorical_nll_from_logits(t(logits), lab(target)) == pytest.approx(
        ref, abs=TOL
    )


def test_categorical_nll_clamping_rule():
    probs = t([[1.0, 0.0], [0.5, 0.5]])
    target = lab([1, 0])
    tiny = torch.finfo(torch.float64).tiny
    expected = (-math.log(tiny) + math.log(2.0)) / 2
    assert metrics.categorical_nll(probs, target) == pytest.approx(expected, abs=TOL)
    expected_eps = (-math.log(1e-3) + math.log(2.0)) / 2
    assert metrics.categorical_nll(probs, target, eps=1e-3) == pytest.approx(expected_eps, abs=TOL)
    tiny32 = torch.finfo(torch.float32).tiny
    got32 = metrics.categorical_nll(probs.float(), target)
    assert got32 == pytest.approx((-math.log(tiny32) + math.log(2.0)) / 2, rel=RTOL32)


def test_categorical_nll_from_logits_allows_masked_classes():
    logits = t([[0.0, -math.inf, 0.0], [1.0, 2.0, -math.inf]])
    target = lab([0, 1])
    probs = special.softmax(np.array([[0.0, 0.0], [1.0, 2.0]]), axis=1)
    ref = -(np.log(probs[0, 0]) + np.log(probs[1, 1])) / 2
    assert metrics.categorical_nll_from_logits(logits, target) == pytest.approx(ref, abs=TOL)


@pytest.mark.parametrize("num_bins", [1, 5, 10, 15])
@pytest.mark.parametrize("temperature", [0.5, 3.0])
def test_ece_matches_numpy_loop(num_bins, temperature):
    _, probs, target = class_data(13, c=3, temperature=temperature)
    got = metrics.expected_calibration_error(t(probs), lab(target), num_bins=num_bins)
    assert got == pytest.approx(ece_reference(probs, target, num_bins), abs=TOL)


def test_ece_bin_edges_are_right_closed():
    # Confidences exactly on edges: 0.5 belongs to bin (0, 0.5] with B=2, 1.0 to the last bin.
    probs = np.array([[0.5, 0.5], [1.0, 0.0], [0.75, 0.25], [0.25, 0.75]])
    target = np.array([1, 0, 0, 1])
    d = metrics.reliability_diagram_data(t(probs), lab(target), num_bins=2)
    assert d["bin_count"].tolist() == [1, 3]
    got = metrics.expected_calibration_error(t(probs), lab(target), num_bins=2)
    assert got == pytest.approx(ece_reference(probs, target, 2), abs=TOL)
    # A single class with p = 1 lands in the last bin (1.0 is in ((B-1)/B, 1]).
    d1 = metrics.reliability_diagram_data(t([[1.0]]), lab([0]), num_bins=4)
    assert d1["bin_count"].tolist() == [0, 0, 0, 1]


def test_reliability_diagram_data_matches_loop():
    _, probs, target = class_data(14, c=4, temperature=1.0)
    num_bins = 12
    d = metrics.reliability_diagram_data(t(probs), lab(target), num_bins=num_bins)
    assert set(d) == {"bin_edges", "bin_confidence", "bin_accuracy", "bin_count"}
    np.testing.assert_allclose(d["bin_edges"].numpy(), np.arange(num_bins + 1) / num_bins)
    conf, correct = probs.max(axis=1), (probs.argmax(axis=1) == target)
    for b in range(num_bins):
        mask = (conf > b / num_bins) & (conf <= (b + 1) / num_bins)
        assert d["bin_count"][b].item() == mask.sum()
        if mask.any():
            assert d["bin_confidence"][b].item() == pytest.approx(conf[mask].mean(), abs=TOL)
            assert d["bin_accuracy"][b].item() == pytest.approx(correct[mask].mean(), abs=TOL)
        else:
            assert math.isnan(d["bin_confidence"][b].item())
            assert math.isnan(d["bin_accuracy"][b].item())
    assert d["bin_count"].dtype == torch.int64 and d["bin_count"].sum().item() == len(target)
    nonempty = d["bin_count"] > 0
    weights = d["bin_count"][nonempty].double() / len(target)
    gap = (d["bin_accuracy"][nonempty] - d["bin_confidence"][nonempty]).abs()
    ece = metrics.expected_calibration_error(t(probs), lab(target), num_bins=num_bins)
    assert (weights * gap).sum().item() == pytest.approx(ece, abs=TOL)


def test_brier_binary_is_twice_sklearn():
    rng = np.random.default_rng(15)
    p1 = rng.uniform(size=200)
    y = rng.integers(0, 2, size=200)
    probs = np.stack([1.0 - p1, p1], axis=1)
    got = metrics.brier_score(t(probs), lab(y))
    assert got == pytest.approx(2.0 * skm.brier_score_loss(y, p1), abs=TOL)


@pytest.mark.parametrize("c", [2, 3, 7])
def test_brier_multiclass_matches_numpy_one_hot(c):
    _, probs, target = class_data(16, c=c)
    onehot = np.eye(c)[target]
    ref = np.mean(np.sum((probs - onehot) ** 2, axis=1))
    assert metrics.brier_score(t(probs), lab(target)) == pytest.approx(ref, abs=TOL)
    if "scale_by_half" in inspect.signature(skm.brier_score_loss).parameters:
        sk = skm.brier_score_loss(target, probs, labels=list(range(c)), scale_by_half=False)
        assert metrics.brier_score(t(probs), lab(target)) == pytest.approx(sk, abs=TOL)


# --------------------------------------------------------------------------------------------
# dtypes, numpy inputs, conversions
# --------------------------------------------------------------------------------------------


def _all_metric_values(conv_f, conv_i):
    """Every scalar metric on fixed data, with converters for float and integer inputs."""
    mean, var, target = regression_data(17)
    means, variances, mtarget, weights = mixture_data(17)
    _, probs, labels = class_data(17)
    logits = np.log(probs)
    f, i = conv_f, conv_i
    return {
        "rmse": metrics.rmse(f(mean), f(target)),
        "gll": metrics.gaussian_log_likelihood(f(mean), f(var), f(target), y_scale=2.0),
        "mll": metrics.mixture_gaussian_log_likelihood(
            f(means), f(variances), f(mtarget), weights=f(weights)
        ),
        "cov": metrics.interval_coverage(f(mean), f(var), f(target), level=0.9),
        "mcov": metrics.mixture_interval_coverage(
            f(means), f(variances), f(mtarget), weights=f(weights), level=0.9
        ),
        "err": metrics.error_rate(f(probs), i(labels)),
        "nll": metrics.categorical_nll(f(probs), i(labels)),
        "nll_logits": metrics.categorical_nll_from_logits(f(logits), i(labels)),
        "ece": metrics.expected_calibration_error(f(probs), i(labels), num_bins=7),
        "brier": metrics.brier_score(f(probs), i(labels)),
    }


def test_float32_inputs_agree_with_float64():
    ref = _all_metric_values(t, lab)
    got = _all_metric_values(lambda x: t(x, torch.float32), lab)
    for name in ref:
        assert isinstance(got[name], float)
        assert got[name] == pytest.approx(ref[name], rel=RTOL32, abs=RTOL32), name


def test_numpy_inputs_equal_torch_inputs():
    ref = _all_metric_values(t, lab)
    got = _all_metric_values(np.asarray, np.asarray)
    assert got == ref


def test_float32_per_point_result_keeps_dtype_and_half_is_upcast():
    mean, var, target = regression_data(18)
    out32 = metrics.gaussian_log_likelihood(
        t(mean, torch.float32), t(var, torch.float32), t(target, torch.float32), reduction="none"
    )
    assert out32.dtype == torch.float32
    out16 = metrics.gaussian_log_likelihood(
        t(mean, torch.float16), t(var, torch.float16), t(target, torch.float16), reduction="none"
    )
    assert out16.dtype == torch.float32
    assert metrics.interval_coverage(
        t(mean, torch.bfloat16), t(var, torch.bfloat16), t(target, torch.bfloat16)
    ) == pytest.approx(metrics.interval_coverage(t(mean), t(var), t(target)), abs=0.05)


def test_mixed_dtypes_promote_and_int_targets_are_accepted():
    mean, var, _ = regression_data(19)
    target = np.round(mean).astype(np.int64)
    got = metrics.gaussian_log_likelihood(t(mean, torch.float32), t(var), torch.as_tensor(target))
    ref = stats.norm.logpdf(target, loc=mean.astype(np.float32), scale=np.sqrt(var)).mean()
    assert got == pytest.approx(ref, abs=1e-6)
    assert metrics.rmse([1, 2, 3], [1.0, 2.0, 5.0]) == pytest.approx(math.sqrt(4 / 3), abs=TOL)


def test_inputs_with_grad_are_detached():
    mean = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    out = metrics.gaussian_log_likelihood(mean, torch.ones(4), torch.ones(4), reduction="none")
    assert not out.requires_grad


def test_float32_probability_row_sum_tolerance():
    probs = np.array([[0.6, 0.4 + 5e-5], [0.3, 0.7]])
    metrics.brier_score(t(probs, torch.float32), lab([0, 1]))  # within 1e-4: accepted
    with pytest.raises(InputDataError, match=r"rows summing to 1 \(within 1e-06"):
        metrics.brier_score(t(probs), lab([0, 1]))


# --------------------------------------------------------------------------------------------
# Property tests
# --------------------------------------------------------------------------------------------

prob_matrices = st.integers(1, 6).flatmap(
    lambda c: hnp.arrays(
        np.float64,
        st.tuples(st.integers(1, 40), st.just(c)),
        elements=st.floats(1e-3, 1.0, allow_nan=False),
    )
)


@HYP
@given(raw=prob_matrices, seed=st.integers(0, 2**16), num_bins=st.integers(1, 20))
def test_property_ece_and_brier_ranges(raw, seed, num_bins):
    probs = raw / raw.sum(axis=1, keepdims=True)
    target = np.random.default_rng(seed).integers(0, probs.shape[1], size=probs.shape[0])
    ece = metrics.expected_calibration_error(t(probs), lab(target), num_bins=num_bins)
    assert 0.0 <= ece <= 1.0
    assert ece == pytest.approx(ece_reference(probs, target, num_bins), abs=TOL)
    assert 0.0 <= metrics.brier_score(t(probs), lab(target)) <= 2.0
    assert 0.0 <= metrics.error_rate(t(probs), lab(target)) <= 1.0
    assert metrics.categorical_nll(t(probs), lab(target)) >= 0.0


@HYP
@given(
    labels=hnp.arrays(np.int64, st.integers(1, 50), elements=st.integers(0, 4)),
    num_bins=st.integers(1, 20),
)
def test_property_perfect_predictions(labels, num_bins):
    probs = np.eye(5)[labels]
    assert metrics.expected_calibration_error(t(probs), lab(labels), num_bins=num_bins) == 0.0
    assert metrics.error_rate(t(probs), lab(labels)) == 0.0
    assert metrics.error_rate(lab(labels), lab(labels)) == 0.0
    assert metrics.brier_score(t(probs), lab(labels)) == 0.0
    assert metrics.categorical_nll(t(probs), lab(labels)) == 0.0


@HYP
@given(
    seed=st.integers(0, 2**16),
    levels=st.tuples(st.floats(0.01, 0.99), st.floats(0.01, 0.99)).map(sorted),
)
def test_property_coverage_monotone_in_level(seed, levels):
    lo_level, hi_level = levels
    mean, var, target = regression_data(seed, (50,))
    args = (t(mean), t(var), t(target))
    assert metrics.interval_coverage(*args, level=lo_level) <= metrics.interval_coverage(
        *args, level=hi_level
    )
    means, variances, mtarget, weights = mixture_data(seed, k=3, shape=(20,))
    margs = (t(means), t(variances), t(mtarget))
    kw = {"weights": t(weights)}
    low = metrics.mixture_interval_coverage(*margs, level=lo_level, **kw)
    high = metrics.mixture_interval_coverage(*margs, level=hi_level, **kw)
    assert low <= high


@HYP
@given(seed=st.integers(0, 2**16), k=st.integers(1, 5), level=st.floats(0.05, 0.995))
def test_property_mixture_interval_hits_target_cdf_levels(seed, k, level):
    means, variances, _, weights = mixture_data(seed, k=k, shape=(8,))
    lower, upper = metrics.mixture_central_interval(
        t(means), t(variances), weights=t(weights), level=level
    )
    sds = np.sqrt(variances)
    for i in range(8):
        assert lower[i] <= upper[i]
        f_lo = mixture_cdf(lower[i].item(), means[:, i], sds[:, i], weights)
        f_hi = mixture_cdf(upper[i].item(), means[:, i], sds[:, i], weights)
        assert f_lo == pytest.approx((1 - level) / 2, abs=1e-12)
        assert f_hi == pytest.approx((1 + level) / 2, abs=1e-12)


@HYP
@given(seed=st.integers(0, 2**16), n=st.integers(1, 30))
def test_property_reductions_and_identical_components(seed, n):
    mean, var, target = regression_data(seed, (n,))
    args = (t(mean), t(var), t(target))
    per_point = metrics.gaussian_log_likelihood(*args, reduction="none")
    assert metrics.gaussian_log_likelihood(*args) == pytest.approx(per_point.mean().item(), abs=TOL)
    assert metrics.gaussian_log_likelihood(*args, reduction="sum") == pytest.approx(
        per_point.sum().item(), abs=1e-9
    )
    stacked = (t(np.stack([mean] * 3)), t(np.stack([var] * 3)), t(target))
    assert metrics.mixture_gaussian_log_likelihood(*stacked) == pytest.approx(
        per_point.mean().item(), abs=TOL
    )
    assert metrics.rmse(t(mean), t(mean)) == 0.0
    assert metrics.rmse(t(mean), t(target)) >= 0.0


# --------------------------------------------------------------------------------------------
# Error paths
# --------------------------------------------------------------------------------------------

_v3 = torch.ones(3, dtype=torch.float64)
_v4 = torch.ones(4, dtype=torch.float64)
_p = torch.tensor([[0.2, 0.8], [0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
_y = torch.tensor([0, 1, 1])
_nan3 = torch.tensor([0.0, float("nan"), 1.0], dtype=torch.float64)
_mix = torch.zeros(2, 3, dtype=torch.float64)

ERROR_CASES = [
    # shapes
    (lambda: metrics.rmse(_v4, _v3), ShapeError, r"target\.shape=\(3,\), got mean\.shape=\(4,\)"),
    (lambda: metrics.rmse(torch.ones(2, 2, 2), torch.ones(2, 2, 2)), ShapeError, r"\(N,\) or"),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, _v4, _v3),
        ShapeError,
        r"variance\.shape=\(4,\)",
    ),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, _v3, _v3, y_scale=torch.ones(3)),
        ShapeError,
        r"y_scale: expected a scalar, got shape \(3,\)",
    ),
    (
        lambda: metrics.gaussian_log_likelihood(
            torch.ones(3, 2), torch.ones(3, 2), torch.ones(3, 2), y_scale=torch.ones(3)
        ),
        ShapeError,
        r"\(T,\) = \(2,\)",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(_v3, _v3, _v3),
        ShapeError,
        r"means: expected shape \(K, \*target\.shape\).*means\.shape=\(3,\)",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(torch.zeros(2, 4), _mix, _v3),
        ShapeError,
        r"\(K, \*target\.shape\).*means\.shape=\(2, 4\)",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(_mix, torch.ones(3, 3), _v3),
        ShapeError,
        r"variances\.shape=\(3, 3\)",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(
            _mix, _mix + 1, _v3, weights=torch.ones(3) / 3
        ),
        ShapeError,
        r"weights: expected shape \(K,\) = \(2,\)",
    ),
    (
        lambda: metrics.mixture_central_interval(_v3, _v3),
        ShapeError,
        r"\(K, N\) or \(K, N, T\)",
    ),
    (lambda: metrics.error_rate(torch.ones(2, 2, 2), _y), ShapeError, r"\(N, C\) or"),
    (lambda: metrics.error_rate(_p, torch.tensor([0, 1])), ShapeError, r"\(N,\) = \(3,\)"),
    (lambda: metrics.categorical_nll(_v3, _y), ShapeError, r"probs: expected a tensor"),
    (lambda: metrics.brier_score(_p, _y[:, None]), ShapeError, r"target\.shape=\(3, 1\)"),
    # values
    (lambda: metrics.rmse(_nan3, _v3), InputDataError, r"1 non-finite entries \(1 NaN\)"),
    (
        lambda: metrics.rmse(_v3, torch.tensor([1.0, math.inf, 0.0])),
        InputDataError,
        r"target: expected finite values.*\(0 NaN\)",
    ),
    (lambda: metrics.rmse(torch.ones(0), torch.ones(0)), InputDataError, r"non-empty"),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, torch.tensor([1.0, -1.0, 0.0]), _v3),
        InputDataError,
        r"strictly positive, finite variances, got 2 of 3 entries",
    ),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, torch.tensor([1.0, math.inf, 1.0]), _v3),
        InputDataError,
        r"1 of 3 entries",
    ),
    (lambda: metrics.gaussian_log_likelihood(_v3, _nan3, _v3), InputDataError, r"variance"),
    (lambda: metrics.gaussian_log_likelihood(_v3, _v3, _nan3), InputDataError, r"NaN"),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, _v3, _v3, reduction="avg"),
        InputDataError,
        r"one of 'mean', 'sum', 'none', got 'avg'",
    ),
    (
        lambda: metrics.gaussian_log_likelihood(_v3, _v3, _v3, y_scale=-1.0),
        InputDataError,
        r"strictly positive, finite target scale",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(_mix, _mix, _v3),
        InputDataError,
        r"variances: expected strictly positive",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(
            _mix, _mix + 1, _v3, weights=torch.tensor([0.3, 0.3])
        ),
        InputDataError,
        r"summing to 1.*sum=0\.6",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(
            _mix, _mix + 1, _v3, weights=torch.tensor([1.5, -0.5])
        ),
        InputDataError,
        r"non-negative weights.*min=-0\.5",
    ),
    (
        lambda: metrics.mixture_gaussian_log_likelihood(torch.zeros(0, 3), torch.ones(0, 3), _v3),
        InputDataError,
        r"non-empty",
    ),
    (
        lambda: metrics.mixture_interval_coverage(_mix, _mix + 1, _nan3),
        InputDataError,
        r"target: expected finite",
    ),
    (lambda: metrics.interval_coverage(_v3, _v3, _v3, level=1.0), InputDataError, r"\(0, 1\)"),
    (lambda: metrics.interval_coverage(_v3, _v3, _v3, level=0.0), InputDataError, r"got 0\.0"),
    (
        lambda: metrics.mixture_central_interval(_mix, _mix + 1, level=-0.5),
        InputDataError,
        r"level: expected a float in the open interval",
    ),
    (
        lambda: metrics.mixture_interval_coverage(_mix, _mix + 1, _v3, level=float("nan")),
        InputDataError,
        r"got nan",
    ),
    (
        lambda: metrics.categorical_nll(_p * 2, _y),
        InputDataError,
        r"in \[0, 1\], got 2 entries outside.*max=2",
    ),
    (
        lambda: metrics.brier_score(_p * 0.5, _y),
        InputDataError,
        r"rows summing to 1.*3 of 3 rows.*probs / probs\.sum",
    ),
    (
        lambda: metrics.expected_calibration_error(torch.tensor([[0.5, float("nan")]]), _y[:1]),
        InputDataError,
        r"without NaN",
    ),
    (lambda: metrics.brier_score(torch.ones(0, 2), _y[:0]), InputDataError, r"non-empty"),
    (lambda: metrics.brier_score(_p, torch.tensor([0, 2, 1])), InputDataError, r"\[0, 2\)"),
    (lambda: metrics.error_rate(_p, torch.tensor([0, -1, 1])), InputDataError, r"min=-1"),
    (lambda: metrics.error_rate(torch.zeros(0, dtype=torch.long), _y[:0]), InputDataError, "non"),
    (lambda: metrics.categorical_nll(_p, _y, eps=0.0), InputDataError, r"eps: expected a float"),
    (
        lambda: metrics.categorical_nll_from_logits(torch.tensor([[0.0, math.nan]]), _y[:1]),
        InputDataError,
        r"without NaN or \+inf",
    ),
    (
        lambda: metrics.categorical_nll_from_logits(torch.tensor([[0.0, math.inf]]), _y[:1]),
        InputDataError,
        r"1 such entries",
    ),
    (
        lambda: metrics.categorical_nll_from_logits(torch.tensor([[-math.inf, -math.inf]]), _y[:1]),
        InputDataError,
        r"at least one finite logit",
    ),
    (
        lambda: metrics.expected_calibration_error(_p, _y, num_bins=0),
        InputDataError,
        r"num_bins: expected an integer >= 1, got 0",
    ),
    (
        lambda: metrics.reliability_diagram_data(_p, _y, num_bins=-3),
        InputDataError,
        r"got -3",
    ),
    # types
    (lambda: metrics.error_rate(_p, _y.double()), InputTypeError, r"integer class labels"),
    (lambda: metrics.error_rate(_v3, _y), InputTypeError, r"integer predicted labels"),
    (lambda: metrics.categorical_nll(_p, _y, eps="x"), InputTypeError, r"eps"),
    (lambda: metrics.expected_calibration_error(_p, _y, num_bins=2.5), InputTypeError, "2.5"),
    (lambda: metrics.interval_coverage(_v3, _v3, _v3, level="high"), InputTypeError, r"level"),
    (lambda: metrics.rmse(torch.ones(3, dtype=torch.cfloat), _v3), InputTypeError, r"real"),
    (lambda: metrics.rmse(np.array(["a", "b"]), _v3), InputTypeError, r"dtype <U1"),
]


@pytest.mark.parametrize(("call", "exc", "match"), ERROR_CASES)
def test_error_paths(call, exc, match):
    with pytest.raises(exc, match=match) as info:
        call()
    message = str(info.value)
    assert "expected" in message and "got" in message
    # every input error is also a built-in ValueError/TypeError
    assert isinstance(info.value, (ValueError, TypeError))


# --------------------------------------------------------------------------------------------
# API surface
# --------------------------------------------------------------------------------------------


def test_public_names_are_exported_and_documented():
    assert set(metrics.__all__) == {
        name
        for name, obj in vars(metrics).items()
        if inspect.isfunction(obj)
        and obj.__module__.startswith(metrics.__name__ + ".")
        and name[0] != "_"
    }
    for name in metrics.__all__:
        doc = inspect.getdoc(getattr(metrics, name))
        assert doc is not None, name
        for section in ("Args:", "Returns:", "Raises:", "Example:", ".. math::"):
            assert section in doc, (name, section)


def test_rmse_does_not_overflow_on_large_finite_values():
    """Issue 40 fuzz: ``rmse([2e200, 0], [0, 0])`` was inf (the squares overflow)."""
    from gpext.metrics import rmse

    assert rmse([2e200, 0.0], [0.0, 0.0]) == pytest.approx(2e200 / 2**0.5, rel=1e-12)
    big = torch.tensor([3e30, -4e30], dtype=torch.float32)
    assert rmse(big, torch.zeros(2)) == pytest.approx((12.5e60) ** 0.5, rel=1e-5)
    assert rmse([1.0, 1.0], [1.0, 1.0]) == 0.0

"""gpext's jittered Cholesky follows linear_operator's settings, and its warnings are theirs.

Resolution order of the retry count and the retry jitter floor: explicit argument, then
``linear_operator.settings.cholesky_max_tries`` / ``cholesky_jitter``, then gpext's default.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from linear_operator import settings as lo_settings
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.warnings import NumericalWarning as LONumericalWarning

from gpext.bootstrap.perturbed_map import _cholesky as perturbed_map_cholesky
from gpext.errors import (
    GpextError,
    GpextWarning,
    InputDataError,
    NumericalError,
    NumericalWarning,
)
from gpext.utils import safe_cholesky
from gpext.utils.linalg import _relative_floor_setting
from gpext.variational import wasserstein2_estimate
from gpext.variational.feature_space_inducing_gp import _safe_cholesky as fsigp_cholesky

DTYPES = (torch.float32, torch.float64)
#: linear_operator's default cholesky_jitter, which gpext uses as its relative retry floor
DEFAULT_FLOOR = {torch.float32: 1e-6, torch.float64: 1e-8}


def _rank_one(dtype: torch.dtype) -> torch.Tensor:
    """Singular PSD matrix with mean diagonal 1: the first retry's jitter succeeds."""
    return torch.ones(3, 3, dtype=dtype)


def _needs_five_retries(dtype: torch.dtype) -> torch.Tensor:
    """diag(1, -1e-3): with floor 1e-6 (mean |diag| 0.5005) the 5th retry, 5.005e-3, works."""
    return torch.diag(torch.tensor([1.0, -1e-3], dtype=dtype))


def _added_jitter(chol: torch.Tensor, a: torch.Tensor) -> float:
    """The eps of L L^T = A + eps I."""
    return float((chol.double() @ chol.double().mT - a.double()).diagonal().mean())


def _call(fn):
    """Run ``fn`` showing every warning; return its result (or error) and the warnings."""
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        try:
            out = fn()
        except NumericalError as err:
            out = err
    return out, [w for w in rec if issubclass(w.category, NumericalWarning)]


@pytest.mark.parametrize("dtype", DTYPES)
class TestSettingsAreTheDefault:
    def test_default_floor_is_linear_operators_default(self, dtype):
        a = _rank_one(dtype)
        chol, rec = _call(lambda: safe_cholesky(a))
        assert len(rec) == 1
        assert f"at least {DEFAULT_FLOOR[dtype]:.0e} of the mean diagonal" in str(rec[0].message)
        assert _added_jitter(chol, a) == pytest.approx(DEFAULT_FLOOR[dtype], rel=0.2)

    def test_cholesky_jitter_sets_the_retry_floor(self, dtype):
        a = _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-4):
            chol, rec = _call(lambda: safe_cholesky(a, name="K"))
        want = {torch.float32: 1e-3, torch.float64: 1e-4}[dtype]
        assert len(rec) == 1
        assert f"at least {want:.0e} of the mean diagonal" in str(rec[0].message)
        assert _added_jitter(chol, a) == pytest.approx(want, rel=1e-3)

    def test_cholesky_jitter_is_relative_to_the_mean_diagonal(self, dtype):
        a = 250.0 * _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-3):
            chol, _ = _call(lambda: safe_cholesky(a))
        assert _added_jitter(chol, a) == pytest.approx(0.25, rel=1e-3)

    def test_setting_of_the_other_dtype_does_not_apply(self, dtype):
        other = {torch.float32: {"double_value": 1e-2}, torch.float64: {"float_value": 1e-2}}
        with lo_settings.cholesky_jitter(**other[dtype]):
            _, rec = _call(lambda: safe_cholesky(_rank_one(dtype)))
        assert f"at least {DEFAULT_FLOOR[dtype]:.0e}" in str(rec[0].message)

    @pytest.mark.parametrize("tries, succeeds", [(4, False), (5, True), (6, True)])
    def test_cholesky_max_tries_sets_the_retries(self, dtype, tries, succeeds):
        a = _needs_five_retries(dtype)
        with lo_settings.cholesky_max_tries(tries):
            out, rec = _call(lambda: safe_cholesky(a, relative_floor=1e-6))
        assert len(rec) == min(tries, 5)
        if succeeds:
            assert _added_jitter(out, a) == pytest.approx(1e-6 * 0.5005 * 10**4, rel=1e-3)
        else:
            assert isinstance(out, NumericalError)

    def test_default_retries_are_the_settings_value(self, dtype):
        # 3 by default, 6 once botorch is imported (it sets the global value); -I needs a
        # jitter above 1, i.e. 8 retries from 1e-6
        tries = lo_settings.cholesky_max_tries.value()
        assert tries < 8
        a = -torch.eye(2, dtype=dtype)
        out, rec = _call(lambda: safe_cholesky(a, relative_floor=1e-6))
        assert isinstance(out, NumericalError)
        assert len(rec) == tries


@pytest.mark.parametrize("dtype", DTYPES)
class TestExplicitArgumentsWin:
    def test_relative_floor_wins_over_cholesky_jitter(self, dtype):
        a = _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-1, double_value=1e-1):
            chol, rec = _call(lambda: safe_cholesky(a, relative_floor=1e-3))
        assert "at least 1e-03 of the mean diagonal" in str(rec[0].message)
        assert _added_jitter(chol, a) == pytest.approx(1e-3, rel=1e-3)

    def test_max_tries_wins_over_cholesky_max_tries(self, dtype):
        a = _needs_five_retries(dtype)
        with lo_settings.cholesky_max_tries(10):
            out, rec = _call(lambda: safe_cholesky(a, relative_floor=1e-6, max_tries=1))
        assert isinstance(out, NumericalError)
        assert len(rec) == 1
        with lo_settings.cholesky_max_tries(10):
            out, rec = _call(lambda: safe_cholesky(a, max_tries=0))
        assert isinstance(out, NumericalError) and not rec

    def test_starting_jitter_is_not_overridden(self, dtype):
        a = _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-1, double_value=1e-1):
            chol, rec = _call(lambda: safe_cholesky(a, jitter=1e-3))
        assert not rec
        assert _added_jitter(chol, a) == pytest.approx(1e-3, rel=1e-3)


class TestFailureError:
    def test_error_is_gpexts_and_names_the_settings(self):
        a = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)  # eigenvalue -1
        with lo_settings.cholesky_max_tries(2), warnings.catch_warnings():
            warnings.simplefilter("ignore", NumericalWarning)
            with pytest.raises(NumericalError) as info:
                safe_cholesky(a, name="K_test", hint="Use float64.")
        assert isinstance(info.value, GpextError) and isinstance(info.value, RuntimeError)
        msg = str(info.value)
        assert msg.startswith("K_test: expected a positive semi-definite matrix")
        assert "jitter up to 1.0e-07 after 2 jitter increase(s)" in msg
        assert "Use float64." in msg
        assert "linear_operator.settings.cholesky_max_tries" in msg

    def test_explicit_max_tries_error_does_not_blame_the_settings(self):
        with pytest.raises(NumericalError, match="after 0 jitter increase") as info:
            safe_cholesky(-torch.eye(2, dtype=torch.float64), max_tries=0)
        assert "linear_operator.settings" not in str(info.value)

    @pytest.mark.parametrize(
        "context",
        [
            lambda: lo_settings.cholesky_max_tries(-1),
            lambda: lo_settings.cholesky_jitter(-1.0, -1.0),
        ],
    )
    def test_invalid_setting_raises_input_error_naming_it(self, context):
        with context(), pytest.raises(InputDataError, match="linear_operator.settings"):
            safe_cholesky(torch.eye(2, dtype=torch.float64))

    def test_dtypes_without_a_setting_use_gpexts_default(self):
        # linear_operator has no cholesky_jitter for float16 (None) and rejects bfloat16
        assert lo_settings.cholesky_jitter.value(torch.float16) is None
        assert _relative_floor_setting(torch.float16) == 1e-6
        assert _relative_floor_setting(torch.bfloat16) == 1e-6


class TestWarningsAreLinearOperators:
    def test_hierarchy(self):
        assert issubclass(NumericalWarning, LONumericalWarning)
        assert issubclass(NumericalWarning, GpextWarning)
        assert issubclass(NumericalWarning, RuntimeWarning)

    def test_linear_operator_filter_silences_gpext(self):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=LONumericalWarning)
            safe_cholesky(_rank_one(torch.float64), name="K")
        assert not rec

    def test_linear_operator_category_catches_gpext(self):
        with pytest.warns(LONumericalWarning, match="K is not positive definite"):
            safe_cholesky(_rank_one(torch.float64), name="K")

    def test_gpext_filter_leaves_linear_operator_alone(self):
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            warnings.filterwarnings("ignore", category=NumericalWarning)
            safe_cholesky(_rank_one(torch.float64))
            psd_safe_cholesky(_rank_one(torch.float64))
        assert [w.category for w in rec] == [LONumericalWarning]


class TestHelpersFollowTheSettings:
    """The model-specific wrappers that leave the floor / retries open take the settings."""

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_feature_space_wrapper(self, dtype):
        a = _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-3):
            chol, rec = _call(lambda: fsigp_cholesky(a, 0.0, "K_X|Z"))
        assert len(rec) == 1
        assert _added_jitter(chol, a) == pytest.approx(1e-3, rel=1e-3)
        with lo_settings.cholesky_max_tries(1):
            out, rec = _call(lambda: fsigp_cholesky(_needs_five_retries(dtype), 0.0, "K"))
        assert isinstance(out, NumericalError) and len(rec) == 1

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_perturbed_map_default_jitter(self, dtype):
        a = 4.0 * _rank_one(dtype)
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-3):
            chol, rec = _call(lambda: perturbed_map_cholesky(a, "test", None))
        assert len(rec) == 1
        assert _added_jitter(chol, a) == pytest.approx(4e-3, rel=1e-3)
        # an explicit relative jitter wins (one retry)
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-3):
            chol, rec = _call(lambda: perturbed_map_cholesky(a, "test", 1e-2))
        assert len(rec) == 1
        assert _added_jitter(chol, a) == pytest.approx(4e-2, rel=1e-3)

    def test_perturbed_map_keeps_its_three_x100_steps(self):
        # x100 per retry: botorch's cholesky_max_tries of 6 would reach 1e2 of the diagonal
        with lo_settings.cholesky_max_tries(6):
            out, rec = _call(
                lambda: perturbed_map_cholesky(-torch.eye(3, dtype=torch.float64), "t", None)
            )
        assert isinstance(out, NumericalError) and len(rec) == 3

    def test_perturbed_map_float32_default_floor(self):
        # float32 starts at linear_operator's 1e-6 (1e-8 of the mean diagonal is below float32
        # resolution), then 100x per retry
        a = _rank_one(torch.float32)
        chol, rec = _call(lambda: perturbed_map_cholesky(a, "test", None))
        assert len(rec) == 1
        assert _added_jitter(chol, a) == pytest.approx(1e-6, rel=0.2)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_wasserstein_estimate_floor_follows_the_inputs_dtype_setting(self, dtype):
        n = 3
        k = _rank_one(dtype)
        r = torch.eye(n, dtype=dtype)
        args = (torch.zeros(n, dtype=dtype),) * 2 + (k.diagonal(), r.diagonal(), k, r, k, r)
        floor = {torch.float32: 1e-3, torch.float64: 1e-4}[dtype]
        with lo_settings.cholesky_jitter(float_value=1e-3, double_value=1e-4):
            _, rec = _call(lambda: wasserstein2_estimate(*args, jitter=0.0))
        texts = [str(w.message) for w in rec if "not positive definite" in str(w.message)]
        assert any(t.startswith("k(X_S, X_S)") for t in texts)
        assert all(f"at least {floor:.0e} of the mean diagonal" in t for t in texts)

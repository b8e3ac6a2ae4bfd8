"""gpext.utils.safe_cholesky: the one jitter-escalating Cholesky every model uses."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg
import torch

from gpext.bootstrap.perturbed_map import _cholesky as perturbed_map_cholesky
from gpext.errors import InputDataError, NumericalError, NumericalWarning, ShapeError
from gpext.models._dirichlet_gp_solvers import _chol as dirichlet_chol
from gpext.utils import safe_cholesky
from gpext.variational import safe_cholesky as variational_safe_cholesky
from gpext.variational.feature_space_inducing_gp import _safe_cholesky as fsigp_cholesky


def _spd(n: int, batch=(), dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(*batch, n, n + 2, generator=gen, dtype=dtype)
    return a @ a.mT / n


def _added_jitter(chol: torch.Tensor, a: torch.Tensor) -> float:
    """The eps of L L^T = A + eps I."""
    return float((chol.double() @ chol.double().mT - a.double()).diagonal().mean())


class TestSafeCholesky:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_positive_definite_matches_scipy_without_warning(self, dtype):
        a = _spd(6, dtype=dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            chol = safe_cholesky(a, jitter=1e-3)
        ref = scipy.linalg.cholesky(a.double().numpy() + 1e-3 * np.eye(6), lower=True)
        tol = 1e-10 if dtype == torch.float64 else 1e-5
        np.testing.assert_allclose(chol.double().numpy(), ref, atol=tol, rtol=tol)

    def test_batch_shape(self):
        a = _spd(5, batch=(3, 2))
        chol = safe_cholesky(a)
        assert chol.shape == (3, 2, 5, 5)
        torch.testing.assert_close(chol @ chol.mT, a)

    def test_zero_jitter_escalates_on_the_matrix_scale(self):
        # rank one: singular, PSD.  Starting at 0 the first retry is floor * mean diagonal.
        v = torch.arange(1.0, 5.0, dtype=torch.float64)
        a = 1e3 * torch.outer(v, v)
        with pytest.warns(NumericalWarning, match="rank one is not positive definite") as rec:
            chol = safe_cholesky(a, jitter=0.0, name="rank one")
        eps = _added_jitter(chol, a)
        scale = float(a.diagonal().mean())
        # the first retry is 1e-8 * scale, each further one 10x larger
        assert eps == pytest.approx(1e-8 * scale * 10 ** (len(rec) - 1), rel=1e-3)
        torch.testing.assert_close(chol @ chol.mT, a + eps * torch.eye(4, dtype=a.dtype))

    def test_repeated_failures_warn_with_one_text(self):
        a = torch.ones(3, 3, dtype=torch.float64)
        with pytest.warns(NumericalWarning) as rec:
            safe_cholesky(a, name="K")
            safe_cholesky(2 * a, name="K")
        assert len({str(w.message) for w in rec}) == 1

    def test_float32_floor_is_larger(self):
        a = torch.ones(3, 3)
        with pytest.warns(NumericalWarning, match="1e-06 of the mean diagonal"):
            chol = safe_cholesky(a)
        assert _added_jitter(chol, a) > 0.5e-6  # float32 round-off in L L^T

    def test_indefinite_raises_with_name_and_hint(self):
        a = torch.tensor([[1.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
        with (
            pytest.warns(NumericalWarning),
            pytest.raises(NumericalError, match="K_test.*positive semi-definite.*Use float64"),
        ):
            safe_cholesky(a, name="K_test", max_tries=2, hint="Use float64.")

    def test_no_fallback_raises_without_warning(self):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(NumericalError, match="not positive definite"):
                safe_cholesky(-torch.eye(2, dtype=torch.float64), max_tries=0)

    @pytest.mark.parametrize("bad", [float("nan"), float("inf")])
    def test_non_finite_raises(self, bad):
        a = torch.eye(3, dtype=torch.float64)
        a[1, 2] = a[2, 1] = bad
        with pytest.raises(NumericalError, match="finite"):
            safe_cholesky(a)

    @pytest.mark.parametrize(
        "kwargs",
        [{"jitter": -1.0}, {"growth": 1.0}, {"max_tries": -1}, {"relative_floor": -1e-8}],
    )
    def test_bad_settings_raise(self, kwargs):
        with pytest.raises(InputDataError, match="safe_cholesky"):
            safe_cholesky(torch.eye(2, dtype=torch.float64), **kwargs)

    def test_non_square_raises(self):
        with pytest.raises(ShapeError, match="square"):
            safe_cholesky(torch.ones(2, 3, dtype=torch.float64), name="K")

    def test_gradient_flows(self):
        a = _spd(4).requires_grad_(True)
        safe_cholesky(a).diagonal().log().sum().backward()
        # d/dA (1/2 log det A) = A^{-1} / 2 (symmetrised)
        torch.testing.assert_close(a.grad + a.grad.mT, torch.linalg.inv(a.detach()))


class TestCallersShareTheHelper:
    """The model-specific wrappers keep their policies but escalate the same way."""

    def test_variational_reexport_is_the_helper(self):
        assert variational_safe_cholesky is safe_cholesky

    def test_feature_space_wrapper_escalates_from_zero_jitter(self):
        # InducingGPNetwork and the probit Laplace call it with jitter 0: before the shared
        # helper, 0 * 10^k never grew and a singular K_X|Z raised instead of being rescued.
        a = torch.ones(3, 3, dtype=torch.float64)
        with pytest.warns(NumericalWarning):
            chol = fsigp_cholesky(a, 0.0, "K_X|Z")
        assert torch.isfinite(chol).all()

    def test_dirichlet_wrapper_has_no_fallback(self):
        with pytest.raises(NumericalError, match="DirichletGPClassifier: K_ZZ"):
            dirichlet_chol(torch.ones(3, 3, dtype=torch.float64), "K_ZZ")

    def test_perturbed_map_relative_jitters(self):
        a = 4.0 * torch.ones(3, 3, dtype=torch.float64)
        with pytest.warns(NumericalWarning, match="jitter") as rec:
            chol = perturbed_map_cholesky(a, "test", None)
        # 1e-8, 1e-6, 1e-4 times the mean diagonal (4), the first that works
        assert _added_jitter(chol, a) == pytest.approx(4e-8 * 100 ** (len(rec) - 1), rel=1e-3)
        with pytest.warns(NumericalWarning) as rec:
            chol = perturbed_map_cholesky(a, "test", 1e-3)
        assert len(rec) == 1
        assert _added_jitter(chol, a) == pytest.approx(4e-3, rel=1e-6)

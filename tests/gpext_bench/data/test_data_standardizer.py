"""Tests of gpext_bench.data.Standardizer against numpy references."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from gpext.errors import DataWarning, InputDataError, InputTypeError, ShapeError
from gpext_bench.data import Standardizer

DTYPES = (torch.float32, torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fit_matches_numpy(dtype: torch.dtype) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(loc=[3.0, -50.0, 0.1], scale=[2.0, 10.0, 0.01], size=(200, 3))
    s = Standardizer.fit(torch.tensor(x, dtype=dtype))
    assert s.mean.dtype == dtype and s.mean.shape == (3,)
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    np.testing.assert_allclose(s.mean.double().numpy(), x.mean(0), rtol=tol)
    np.testing.assert_allclose(s.std.double().numpy(), x.std(0), rtol=tol)
    z = s.transform(torch.tensor(x, dtype=dtype))
    assert z.dtype == dtype
    np.testing.assert_allclose(z.mean(0).double().numpy(), 0.0, atol=10 * tol)
    np.testing.assert_allclose(z.std(0, correction=0).double().numpy(), 1.0, atol=10 * tol)


def test_batched_inputs_reduce_all_but_last_dim() -> None:
    x = torch.randn(4, 25, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    s = Standardizer.fit(x)
    flat = x.reshape(-1, 2).numpy()
    np.testing.assert_allclose(s.mean.numpy(), flat.mean(0))
    np.testing.assert_allclose(s.std.numpy(), flat.std(0))
    assert s.transform(x).shape == (4, 25, 2)


def test_targets_get_scalar_statistics() -> None:
    y = torch.tensor([1.0, 2.0, 4.0, 9.0], dtype=torch.float64)
    s = Standardizer.fit(y)
    assert s.mean.shape == () and s.std.shape == ()
    assert float(s.mean) == pytest.approx(4.0)
    assert float(s.std) == pytest.approx(np.std([1.0, 2.0, 4.0, 9.0]))
    assert torch.allclose(s.inverse_transform(s.transform(y)), y)
    # Scalar statistics broadcast over any target shape, e.g. (samples, M).
    assert s.transform(y.expand(3, 4)).shape == (3, 4)


@pytest.mark.filterwarnings("ignore::gpext.errors.DataWarning")
@settings(max_examples=40, deadline=None)
@given(
    arrays(
        np.float64,
        st.tuples(st.integers(2, 20), st.integers(1, 4)),
        elements=st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
    )
)
def test_inverse_transform_round_trip(x: np.ndarray) -> None:
    t = torch.tensor(x)
    s = Standardizer.fit(t)
    assert bool((s.std > 0).all())
    back = s.inverse_transform(s.transform(t))
    np.testing.assert_allclose(back.numpy(), x, rtol=1e-9, atol=1e-9 * max(1.0, np.abs(x).max()))


def test_inverse_transform_variance_matches_sample_variance() -> None:
    y = torch.tensor([10.0, 20.0, 30.0, 55.0], dtype=torch.float64)
    s = Standardizer.fit(y)
    z = torch.randn(100_000, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    var_z = torch.tensor(0.25, dtype=torch.float64)
    samples = s.inverse_transform(z * var_z.sqrt())
    assert float(s.inverse_transform_variance(var_z)) == pytest.approx(
        float(samples.var()), rel=0.02
    )
    assert float(s.inverse_transform_variance(var_z)) == pytest.approx(0.25 * np.var(y.numpy()))


def test_constant_column_keeps_unit_std_without_warning() -> None:
    x = torch.tensor([[1.0, 5.0], [2.0, 5.0], [4.0, 5.0]], dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s = Standardizer.fit(x)
    assert s.std[1] == 1.0 and s.mean[1] == 5.0
    assert torch.equal(s.transform(x)[:, 1], torch.zeros(3, dtype=torch.float64))


def test_all_constant_columns_warn() -> None:
    x = torch.full((5, 2), 3.0)
    with pytest.warns(DataWarning, match="constant"):
        s = Standardizer.fit(x)
    assert torch.equal(s.std, torch.ones(2))


@pytest.mark.parametrize("dtype", DTYPES)
def test_identity(dtype: torch.dtype) -> None:
    s = Standardizer.identity(3, dtype)
    x = torch.randn(4, 3, dtype=dtype)
    assert s.is_identity and s.mean.dtype == dtype
    assert torch.equal(s.transform(x), x) and torch.equal(s.inverse_transform(x), x)
    assert Standardizer.identity(None).mean.shape == ()
    assert not Standardizer.fit(torch.tensor([1.0, 3.0])).is_identity


def test_to_changes_dtype() -> None:
    s = Standardizer.fit(torch.tensor([[1.0], [3.0]], dtype=torch.float64)).to(torch.float32)
    assert s.mean.dtype == torch.float32 and s.std.dtype == torch.float32


def test_invalid_inputs() -> None:
    with pytest.raises(InputTypeError, match="floating-point"):
        Standardizer.fit(torch.tensor([1, 2, 3]))
    with pytest.raises(InputDataError, match="NaN"):
        Standardizer.fit(torch.tensor([1.0, float("nan")]))
    with pytest.raises(ShapeError):
        Standardizer.fit(torch.tensor(1.0))
    with pytest.raises(ShapeError):
        Standardizer(torch.zeros(2), torch.ones(3))
    with pytest.raises(InputDataError, match="positive"):
        Standardizer(torch.zeros(2), torch.tensor([1.0, 0.0]))

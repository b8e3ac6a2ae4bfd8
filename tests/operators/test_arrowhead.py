"""The bordered (arrowhead) eigenproblem behind adding a point to IncrementalKPCA."""

from __future__ import annotations

import pytest
import torch

from gpext.errors import NumericalError
from gpext.operators._arrowhead import arrowhead_eigvals_factor

D64 = torch.float64


def _arrow(d: torch.Tensor, z: torch.Tensor, alpha: float) -> torch.Tensor:
    n = d.shape[0]
    a = torch.zeros(n + 1, n + 1, dtype=D64)
    a[:n, :n] = torch.diag(d.double())
    a[:n, n] = a[n, :n] = z.double()
    a[n, n] = alpha
    return a


def _check(d, z, alpha, dtype=D64, tol=None):
    d, z = d.to(dtype), z.to(dtype)
    n = d.shape[0]
    lam, factor = arrowhead_eigvals_factor(d, z, alpha)
    a = _arrow(d, z, alpha)
    ref = torch.linalg.eigvalsh(a)
    eps = torch.finfo(dtype).eps
    tol = tol if tol is not None else 64 * eps * (n + 1)
    scale = ref.abs().max()
    assert lam.dtype == dtype and bool((lam[1:] >= lam[:-1]).all())
    torch.testing.assert_close(lam.double(), ref, rtol=0, atol=float(tol * scale))
    q = factor.apply(torch.eye(n + 1, dtype=dtype)).double()
    torch.testing.assert_close(q.T @ q, torch.eye(n + 1, dtype=D64), rtol=0, atol=tol)
    torch.testing.assert_close(q @ torch.diag(lam.double()) @ q.T, a, rtol=0,
                               atol=float(tol * scale))  # fmt: skip
    y = torch.randn(n + 1, dtype=dtype, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(factor.apply_transpose(y).double(), q.T @ y.double(), rtol=0,
                               atol=float(tol * y.abs().max()))  # fmt: skip
    return lam


@pytest.mark.parametrize("n", [1, 2, 3, 17, 120])
@pytest.mark.parametrize("alpha", [-5.0, 0.3, 5.0, 40.0])
def test_matches_eigh_and_the_factor_is_orthogonal(n, alpha):
    g = torch.Generator().manual_seed(n)
    d = torch.sort(10 * torch.rand(n, generator=g, dtype=D64)).values
    z = torch.randn(n, generator=g, dtype=D64)
    _check(d, z, alpha)


def test_deflation_of_zero_border_entries_and_equal_poles():
    d = torch.tensor([1.0, 2.0, 2.0, 2.0, 3.0, 4.0, 4.0], dtype=D64)
    z = torch.tensor([0.5, 0.3, 0.2, 0.0, 1e-20, 0.4, 0.4], dtype=D64)
    lam = _check(d, z, 2.5)
    # the untouched poles stay exact eigenvalues
    assert (lam == 3.0).any() and (lam == 2.0).any()
    # every entry of the border zero: the corner is an eigenvalue of its own
    lam = _check(d, torch.zeros(7, dtype=D64), 2.5)
    assert (lam == 2.5).sum() == 1


def test_corner_zero_is_the_degenerate_point():
    g = torch.Generator().manual_seed(3)
    d = torch.sort(torch.rand(30, generator=g, dtype=D64)).values
    _check(d, 0.1 * torch.randn(30, generator=g, dtype=D64), 0.0)


@pytest.mark.parametrize("scale", [1e-150, 1.0, 1e150])
def test_kernel_like_spectra_at_extreme_scales(scale):
    # a geometric spectrum over 16 decades, as an RBF kernel matrix has; the small
    # eigenvalues keep their relative accuracy
    n = 300
    g = torch.Generator().manual_seed(4)
    d = torch.logspace(-14, 2, n, dtype=D64)
    z = torch.randn(n, generator=g, dtype=D64) * d.sqrt()
    lam = _check(d * scale, z * scale, scale)
    ref = torch.linalg.eigvalsh(_arrow(d, z, 1.0))
    big = ref.abs() > 1e-8 * ref.abs().max()
    rel = ((lam.double() / scale - ref).abs() / ref.abs())[big].max()
    assert rel < 1e-11


def test_float32():
    g = torch.Generator().manual_seed(5)
    d = torch.sort(torch.rand(100, generator=g)).values
    _check(d, torch.randn(100, generator=g), 0.5, dtype=torch.float32, tol=5e-5)


def test_non_finite_input_is_a_clear_error():
    d = torch.tensor([0.0, 1.0], dtype=D64)
    with pytest.raises(NumericalError, match="non-finite"):
        arrowhead_eigvals_factor(d, torch.tensor([1.0, float("inf")], dtype=D64), 1.0)

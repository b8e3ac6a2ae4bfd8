"""Tests of gpext.operators.rank_one_eigh_update against torch.linalg.eigh."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from gpext.errors import InputDataError, ShapeError
from gpext.operators import _secular, rank_one_eigh_update


@pytest.fixture(autouse=True)
def _secular_path(monkeypatch):
    """These tests check the secular (rank-one) algorithm: keep method="auto" off the batched
    eigh that it takes for small problems (the dispatch has its own tests)."""
    monkeypatch.setattr(_secular, "prefer_eigh", lambda n, num=1: False)


D64 = torch.float64


def _orth(n, gen, dtype=D64):
    return torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=dtype)).Q


def _check(d, u, v, sigma, rel_tol=1e-10, orth_tol=1e-9, floor=0.0):
    a = u @ torch.diag(d) @ u.T + sigma * torch.outer(v, v)
    lam, u2 = rank_one_eigh_update(d, u, v, sigma)
    ref = torch.linalg.eigvalsh((a + a.T) / 2)
    keep = ref.abs() > floor * ref.abs().max()
    rel = ((lam - ref).abs() / ref.abs())[keep].max()
    eye = torch.eye(len(d), dtype=d.dtype)
    orth = (u2.T @ u2 - eye).abs().max()
    resid = (u2 @ torch.diag(lam) @ u2.T - a).abs().max() / a.abs().max()
    assert bool((lam[1:] >= lam[:-1]).all())
    assert rel <= rel_tol, f"eigenvalue relative error {rel:.2e}"
    assert orth <= orth_tol, f"orthogonality {orth:.2e}"
    assert resid <= 100 * orth_tol, f"residual {resid:.2e}"


class TestRankOneEighUpdate:
    seed = 0

    def setup_method(self):
        self.gen = torch.Generator().manual_seed(self.seed)

    @pytest.mark.parametrize("sigma", [1.0, 0.3, -0.05])
    def test_random_spd(self, sigma):
        n = 120
        x = torch.randn(n, n, generator=self.gen, dtype=D64)
        a = x @ x.T / n + 0.5 * torch.eye(n, dtype=D64)
        d, u = torch.linalg.eigh(a)
        v = torch.randn(n, generator=self.gen, dtype=D64)
        _check(d, u, v, sigma)

    @pytest.mark.parametrize("sigma", [0.7, -0.01])
    def test_repeated_eigenvalues(self, sigma):
        n = 90
        d = torch.cat([torch.ones(30), 2 * torch.ones(30), torch.linspace(3, 4, 30)]).to(D64)
        u = _orth(n, self.gen)
        v = torch.randn(n, generator=self.gen, dtype=D64)
        _check(d, u, v, sigma)

    def test_clustered_eigenvalues(self):
        n = 80
        d = 1.0 + 1e-9 * torch.randn(n, generator=self.gen, dtype=D64)
        d[:40] += 1.0
        u = _orth(n, self.gen)
        v = torch.randn(n, generator=self.gen, dtype=D64)
        _check(d, u, v, 0.4)
        _check(d, u, v, -0.001)

    def test_tiny_z_and_vector_in_span(self):
        n = 60
        d = torch.linspace(1, 5, n, dtype=D64)
        u = _orth(n, self.gen)
        coef = torch.randn(n, generator=self.gen, dtype=D64)
        coef[::2] = 1e-18  # z_i tiny for half of the directions
        v = u @ coef
        _check(d, u, v, 0.8)
        # v exactly an eigenvector: only one eigenvalue moves.
        lam, u2 = rank_one_eigh_update(d, u, u[:, 5], 2.0)
        expected = d.clone()
        expected[5] += 2.0
        torch.testing.assert_close(lam, expected.sort().values, rtol=1e-14, atol=0)

    def test_unsorted_input_and_zero_sigma(self):
        n = 30
        d = torch.randn(n, generator=self.gen, dtype=D64)
        u = _orth(n, self.gen)
        v = torch.randn(n, generator=self.gen, dtype=D64)
        lam, u2 = rank_one_eigh_update(d, u, v, 0.0)
        torch.testing.assert_close(lam, d.sort().values)
        torch.testing.assert_close(u2 @ torch.diag(lam) @ u2.T, u @ torch.diag(d) @ u.T)
        _check(d + 3.0, u, v, 0.5)
        _check(d + 3.0, u, v, -0.05)  # unsorted input and a negative weight
        # Descending input (the permutation is a reversal) with both signs.
        desc = d.sort(descending=True).values + 3.0
        _check(desc, u, v, 0.5)
        _check(desc, u, v, -0.05)

    def test_batch_mixed_signs(self):
        n, b = 40, 3
        x = torch.randn(b, n, n, generator=self.gen, dtype=D64)
        a = x @ x.mT / n + torch.eye(n, dtype=D64)
        d, u = torch.linalg.eigh(a)
        v = torch.randn(b, n, generator=self.gen, dtype=D64)
        sigma = torch.tensor([0.5, -0.02, 1.5], dtype=D64)
        lam, u2 = rank_one_eigh_update(d, u, v, sigma)
        ref = torch.linalg.eigvalsh(a + sigma[:, None, None] * v[:, :, None] * v[:, None, :])
        torch.testing.assert_close(lam, ref, rtol=1e-12, atol=0)
        eye = torch.eye(n, dtype=D64)
        assert (u2.mT @ u2 - eye).abs().max() < 1e-12

    def test_float32(self):
        n = 50
        x = torch.randn(n, n, generator=self.gen)
        a = x @ x.T / n + torch.eye(n)
        d, u = torch.linalg.eigh(a)
        v = torch.randn(n, generator=self.gen)
        lam, u2 = rank_one_eigh_update(d, u, v, -0.1)
        assert lam.dtype == torch.float32
        ref = torch.linalg.eigvalsh(a.double() - 0.1 * torch.outer(v, v).double())
        assert ((lam.double() - ref).abs() / ref.abs()).max() < 1e-5
        assert (u2.T @ u2 - torch.eye(n)).abs().max() < 1e-5

    def test_large_m_log_space(self):
        # Products over 600 factors would overflow without logs; orthogonality must hold.
        n = 600
        d = torch.logspace(-3, 3, n, dtype=D64)
        u = torch.eye(n, dtype=D64)
        v = torch.randn(n, generator=self.gen, dtype=D64)
        # eigh itself is only accurate to ~eps * lambda_max: compare above 1e-5 * lambda_max.
        _check(d, u, v, 2.0, floor=1e-5)

    def test_errors(self):
        d = torch.ones(3, dtype=D64)
        u = torch.eye(3, dtype=D64)
        with pytest.raises(ShapeError, match="eigenvectors"):
            rank_one_eigh_update(d, torch.eye(4, dtype=D64), torch.ones(3, dtype=D64), 1.0)
        with pytest.raises(ShapeError, match="v"):
            rank_one_eigh_update(d, u, torch.ones(4, dtype=D64), 1.0)
        with pytest.raises(InputDataError, match="finite"):
            rank_one_eigh_update(d, u, torch.tensor([1.0, float("nan"), 0.0]), 1.0)
        with pytest.raises(InputDataError, match="float32 or float64"):
            rank_one_eigh_update(d.half(), u.half(), torch.ones(3).half(), 1.0)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 12),
    sigma=st.floats(-3, 3).filter(lambda s: abs(s) > 1e-3),
    seed=st.integers(0, 2**16),
    repeat=st.booleans(),
)
def test_property_matches_eigh(n, sigma, seed, repeat):
    gen = torch.Generator().manual_seed(seed)
    d = torch.randn(n, generator=gen, dtype=D64)
    if repeat and n > 2:
        d[: n // 2] = d[0]
    u = _orth(n, gen)
    v = torch.randn(n, generator=gen, dtype=D64)
    a = u @ torch.diag(d) @ u.T + sigma * torch.outer(v, v)
    lam, u2 = rank_one_eigh_update(d, u, v, sigma)
    ref = torch.linalg.eigvalsh((a + a.T) / 2)
    scale = a.abs().max()
    assert (lam - ref).abs().max() <= 1e-12 * scale
    assert (u2.T @ u2 - torch.eye(n, dtype=D64)).abs().max() <= 1e-12
    assert (u2 @ torch.diag(lam) @ u2.T - a).abs().max() <= 1e-12 * scale

"""PCA and incremental-KPCA weight subspaces."""

import math

import gpytorch
import pytest
import torch

from gpext.errors import DataWarning, InputDataError, NotFittedError, NumericalWarning, ShapeError
from gpext.subspace import InKPCASubspace, PCASubspace, randomized_svd


def _trajectory_like(k=12, d=300, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    basis = torch.randn(6, d, generator=g, dtype=dtype)
    scales = torch.tensor([5.0, 3.0, 2.0, 1.0, 0.5, 0.2], dtype=dtype)
    return (torch.randn(k, 6, generator=g, dtype=dtype) * scales) @ basis + 0.01 * torch.randn(
        k, d, generator=g, dtype=dtype
    )


def _largest_principal_angle(a, b):
    qa, _ = torch.linalg.qr(a.T)
    qb, _ = torch.linalg.qr(b.T)
    s = torch.linalg.svdvals(qa.T @ qb).clamp(max=1.0)
    return float(torch.acos(s.min()))


class TestRandomizedSVD:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_matches_exact_svd(self, dtype):
        a = _trajectory_like(dtype=dtype)
        u, s, vh = randomized_svd(a, 4, generator=torch.Generator().manual_seed(0))
        s_ref = torch.linalg.svdvals(a)[:4]
        torch.testing.assert_close(s, s_ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(u.T @ u, torch.eye(4, dtype=dtype), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close((u * s) @ vh, u @ (u.T @ a), rtol=1e-3, atol=1e-3)

    def test_errors(self):
        with pytest.raises(InputDataError, match="rank"):
            randomized_svd(torch.randn(3, 10), 4)
        with pytest.raises(ShapeError):
            randomized_svd(torch.randn(3), 1)


class TestPCASubspace:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_projection_definition(self, dtype):
        dev = _trajectory_like(dtype=dtype)
        sub = PCASubspace(rank=3).fit(dev, generator=torch.Generator().manual_seed(0))
        p = sub.projection
        assert p.shape == (3, 300) and p.dtype == dtype
        _, s, vh = torch.linalg.svd(dev / math.sqrt(dev.shape[0] - 1), full_matrices=False)
        torch.testing.assert_close(
            p @ p.T, torch.diag(s[:3] ** 2), rtol=1e-3, atol=1e-3 * float(s[0] ** 2)
        )
        assert _largest_principal_angle(p, vh[:3]) < (1e-3 if dtype == torch.float32 else 1e-8)

    def test_state_dict_round_trip(self):
        sub = PCASubspace(rank=2).fit(_trajectory_like())
        other = PCASubspace(rank=2)
        other.load_state_dict(sub.state_dict())
        torch.testing.assert_close(other.projection, sub.projection)

    def test_errors(self):
        dev = _trajectory_like(k=5)
        with pytest.raises(InputDataError, match="collected deviations"):
            PCASubspace(rank=6).fit(dev)
        with pytest.raises(InputDataError, match="at least 2"):
            PCASubspace(rank=1).fit(dev[:1])
        with pytest.raises(InputDataError, match="finite"):
            PCASubspace(rank=1).fit(torch.full((3, 4), float("nan")))
        with pytest.raises(ShapeError):
            PCASubspace(rank=1).fit(torch.zeros(4))
        with pytest.raises(NotFittedError):
            _ = PCASubspace().projection


class TestInKPCASubspace:
    def test_linear_kernel_spans_pca_subspace(self):
        dev = _trajectory_like(k=15)
        inc = InKPCASubspace(rank=5)
        for d in dev:  # one collection at a time, in arrival order
            inc.update(d)
        pca = PCASubspace(rank=5).fit(dev, generator=torch.Generator().manual_seed(0))
        assert _largest_principal_angle(inc.projection, pca.projection) <= 1e-6
        # same scaled directions up to sign
        sign = torch.sign((inc.projection * pca.projection).sum(-1, keepdim=True))
        torch.testing.assert_close(inc.projection * sign, pca.projection, rtol=1e-6, atol=1e-8)

    def test_incremental_equals_batch_and_float32_input(self):
        dev = _trajectory_like(k=10).float()
        a = InKPCASubspace(rank=3).fit(dev)
        b = InKPCASubspace(rank=3)
        b.update(dev[:4])
        b.update(dev[4:])
        assert a.projection.dtype == torch.float32
        assert _largest_principal_angle(a.projection.double(), b.projection.double()) < 1e-6

    def test_centered_linear_matches_centered_pca(self):
        dev = _trajectory_like(k=10)
        inc = InKPCASubspace(rank=3, centered=True).fit(dev)
        centred = dev - dev.mean(0)
        ref = PCASubspace(rank=3).fit(centred).projection
        assert _largest_principal_angle(inc.projection, ref) <= 1e-6

    def test_rbf_kernel_directions_lie_in_deviation_span(self):
        dev = _trajectory_like(k=10)
        kernel = gpytorch.kernels.RBFKernel()
        kernel.lengthscale = float(dev.norm(dim=-1).mean())
        p = InKPCASubspace(rank=4, kernel=kernel).fit(dev).projection
        assert p.shape == (4, 300) and torch.isfinite(p).all()
        q, _ = torch.linalg.qr(dev.T)
        resid = p.T - q @ (q.T @ p.T)
        assert float(resid.norm() / p.norm()) < 1e-10

    def test_overflow_rebuilds_from_most_recent(self):
        dev = _trajectory_like(k=8)
        sub = InKPCASubspace(rank=3, max_points=5)
        with pytest.warns(DataWarning, match="max_points"):
            sub.update(dev)
        assert sub.num_points == 5
        torch.testing.assert_close(sub.kpca.points, dev[-5:])
        ref = PCASubspace(rank=3).fit(dev[-5:]).projection
        assert _largest_principal_angle(sub.projection, ref) <= 1e-6

    def test_degenerate_and_errors(self):
        dev = _trajectory_like(k=3)
        rep = torch.cat([dev[:2], dev[:2], dev[:2]])  # rank 2 with 6 rows
        with pytest.warns(NumericalWarning, match="non-zero"):
            p = InKPCASubspace(rank=4).fit(rep).projection
        assert p.shape[0] == 2
        with pytest.raises(InputDataError, match="collected deviations"):
            _ = InKPCASubspace(rank=4).fit(dev).projection
        with pytest.raises(InputDataError, match="at least 2"):
            _ = InKPCASubspace(rank=1).fit(dev[:1]).projection
        with pytest.raises(InputDataError, match="finite"):
            InKPCASubspace(rank=1).update(torch.tensor([1.0, float("inf")]))
        sub = InKPCASubspace(rank=1).fit(dev)
        with pytest.raises(ShapeError):
            sub.update(torch.zeros(7))


class TestInKPCAStorage:
    def test_preallocated_block_is_never_copied(self):
        dev = _trajectory_like(k=8)
        sub = InKPCASubspace(rank=2, max_points=10)
        sub.update(dev[0])
        ptr = sub.kpca._store.data_ptr()
        assert sub.kpca._store.shape == (10, 300)
        for d in dev[1:]:
            sub.update(d)
        assert sub.kpca._store.data_ptr() == ptr  # deviations written in place, no torch.cat
        torch.testing.assert_close(sub.kpca.points, dev, rtol=0, atol=0)
        ref = PCASubspace(rank=2).fit(dev).projection
        assert _largest_principal_angle(sub.projection, ref) <= 1e-6

    def test_nan_deviation_is_rejected_before_any_change(self):
        dev = _trajectory_like(k=4)
        sub = InKPCASubspace(rank=2).fit(dev)
        bad = dev[0].clone()
        bad[7] = float("nan")
        with pytest.raises(InputDataError, match="1 NaN"):
            sub.update(bad)
        assert sub.num_points == 4


class TestInKPCAStateDict:
    def test_state_dict_round_trip(self):
        dev = _trajectory_like(k=8)
        sub = InKPCASubspace(rank=3).fit(dev)
        other = InKPCASubspace(rank=3)
        state = sub.state_dict()
        # Only the stored deviations are saved, not the spare capacity of the block.
        assert state["kpca._points"].shape == (8, 300)
        other.load_state_dict(state)
        torch.testing.assert_close(other.projection, sub.projection)
        other.update(dev[0])  # keeps updating incrementally after loading
        assert other.num_points == 9

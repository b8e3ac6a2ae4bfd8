"""Deferred basis, add-point dispatch and the batched eigh path of the rank-one update (issue 21).

Every result is checked against ``torch.linalg.eigh`` of the same matrix; no test asserts a
timing (the dispatch is checked through its cost model's decisions).
"""

import importlib

import gpytorch
import pytest
import torch

from gpext.errors import InputDataError
from gpext.operators import IncrementalKPCA, _secular, rank_one_eigh_update
from gpext.operators._secular import Factor, rank_one_basis_update, rank_one_eigvals_factor

D64 = torch.float64
DTYPES = [torch.float32, torch.float64]


def _tol(dtype):
    return 1e-10 if dtype == D64 else 2e-4


def _kmat(kernel, x, centered):
    with torch.no_grad():
        k = kernel(x, x).to_dense()
    if centered:
        k = k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()
    return k


def _rbf(dtype):
    k = gpytorch.kernels.RBFKernel().to(dtype)
    k.lengthscale = 1.5
    return k


class TestFactor:
    """The rank-one update's factor F (U' = U F) against the eager basis product."""

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("sigma", [0.8, -0.3])
    @pytest.mark.parametrize("deflate", [False, True])
    def test_factor_matches_basis_update(self, dtype, sigma, deflate):
        gen = torch.Generator().manual_seed(3)
        n = 30
        d = torch.randn(n, generator=gen, dtype=D64).to(dtype)
        z = torch.randn(n, generator=gen, dtype=D64).to(dtype)
        if deflate:
            d[4:9] = 0.5  # repeated poles: Givens deflation
            z[::5] = 0.0  # zero weights: deflated entries
        u = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=D64)).Q.to(dtype)
        lam, factor = rank_one_eigvals_factor(d, z, sigma)
        lam_ref, u_ref = rank_one_basis_update(d, u, z, sigma)
        assert isinstance(factor, Factor)
        torch.testing.assert_close(lam, lam_ref, rtol=0, atol=0)
        tol = _tol(dtype)
        torch.testing.assert_close(factor.apply(u), u_ref, rtol=0, atol=tol)
        y = torch.randn(n, generator=gen, dtype=D64).to(dtype)
        eye = torch.eye(n, dtype=dtype)
        torch.testing.assert_close(
            factor.apply_transpose(y), factor.apply(eye).T @ y, atol=tol, rtol=0
        )
        a = u @ torch.diag(d) @ u.T + sigma * torch.outer(u @ z, u @ z)
        ref = torch.linalg.eigvalsh(a.double())
        torch.testing.assert_close(lam.double(), ref, rtol=0, atol=tol * ref.abs().max())


class TestDeferredBasis:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("centered", [False, True])
    @pytest.mark.parametrize("how", ["apply", "eigh"])
    def test_flush_matches_eigh(self, dtype, centered, how, monkeypatch):
        monkeypatch.setattr(IncrementalKPCA, "_maybe_flush", lambda self: None)  # keep pending
        gen = torch.Generator().manual_seed(5)
        x = torch.randn(60, 3, generator=gen, dtype=D64).to(dtype)
        kernel = _rbf(dtype)
        kpca = IncrementalKPCA(
            kernel, centered=centered, dtype=dtype, method="rank_one", refresh_every=None
        )
        kpca.fit(x[:40])
        for i in range(40, 48):  # one point at a time: the basis stays pending
            kpca.update(x[i])
        assert kpca._pending, "the basis product should be deferred"
        m = kpca.num_points
        # z through the pending factors equals U^T v with the basis made explicit
        v = torch.randn(m, generator=gen, dtype=D64).to(dtype)
        z = kpca._project(v)
        kpca._flush(how)
        assert not kpca._pending
        u = kpca._evecs
        if how == "apply":  # the same basis (eigh's may differ in sign)
            torch.testing.assert_close(z, u.mT @ v, rtol=0, atol=10 * _tol(dtype))
        k = _kmat(kernel, x[:m], centered).double()
        ref = torch.linalg.eigvalsh(k)
        tol = _tol(dtype) * ref.abs().max()
        torch.testing.assert_close(kpca._evals.double(), ref, rtol=0, atol=tol)
        u, lam = u.double(), kpca._evals.double()
        torch.testing.assert_close(u @ torch.diag(lam) @ u.T, k, rtol=0, atol=10 * tol)
        torch.testing.assert_close(u.T @ u, torch.eye(m, dtype=D64), rtol=0, atol=10 * _tol(dtype))

    def test_public_reads_make_the_basis_explicit(self, monkeypatch):
        monkeypatch.setattr(IncrementalKPCA, "_maybe_flush", lambda self: None)  # keep pending
        gen = torch.Generator().manual_seed(6)
        x = torch.randn(50, 2, generator=gen, dtype=D64)
        kernel = _rbf(D64)
        kpca = IncrementalKPCA(kernel, centered=True, method="rank_one").fit(x[:40])
        for i in range(40, 50):
            kpca.update(x[i])
        kpca.update(x[0] + 0.2)  # one more pending point (the cap may have flushed before)
        assert kpca._pending
        ref = IncrementalKPCA(kernel, centered=True).fit(torch.cat([x, x[:1] + 0.2]))
        torch.testing.assert_close(kpca.eigenvalues, ref.eigenvalues, rtol=0, atol=1e-12)
        xt = torch.randn(5, 2, generator=gen, dtype=D64)
        s1, s2 = kpca.transform(xt, 5), ref.transform(xt, 5)
        torch.testing.assert_close(s1.abs(), s2.abs(), rtol=0, atol=1e-9)  # up to sign
        assert not kpca._pending
        # state dict: the explicit basis, and a loaded copy continues like the original
        kpca.update(x[0] + 0.1)
        clone = IncrementalKPCA(kernel, centered=True, method="rank_one")
        clone.load_state_dict(kpca.state_dict())
        torch.testing.assert_close(clone.eigenvectors, kpca.eigenvectors, rtol=0, atol=0)

    def test_pending_work_is_bounded(self):
        # The ski-rental rule makes the basis explicit once projecting through the pending
        # factors has cost as much as doing so; the pending memory stays below its cap.
        gen = torch.Generator().manual_seed(8)
        x = torch.randn(140, 3, generator=gen, dtype=D64)
        kpca = IncrementalKPCA(_rbf(D64), method="rank_one").fit(x[:40])
        flushes, seen = 0, 0
        for i in range(40, 140):
            kpca.update(x[i])
            n = len(kpca._pending)
            flushes += n < seen
            seen = n
            m = kpca.num_points
            assert kpca._pending_numel <= 8 * m * m + 2 * m * m
        assert flushes >= 1
        ref = torch.linalg.eigvalsh(_kmat(kpca.kernel, x, False))
        torch.testing.assert_close(kpca._evals, ref, rtol=0, atol=1e-11)

    @pytest.mark.parametrize("convert", ["double", "to"])
    def test_dtype_change_with_pending_factors(self, convert):
        gen = torch.Generator().manual_seed(9)
        x = torch.randn(50, 3, generator=gen, dtype=D64)
        kernel = _rbf(torch.float32)
        kpca = IncrementalKPCA(kernel, dtype=torch.float32, method="rank_one").fit(x[:40].float())
        kpca.update(x[40].float())
        assert kpca._pending
        kpca = kpca.double() if convert == "double" else kpca.to(D64)
        kernel.double()
        kpca.refit()  # the kernel's values changed dtype: the record asks for a refit
        kpca.update(x[41:])
        assert kpca.dtype == D64 and kpca.eigenvectors.dtype == D64
        x = torch.cat([x[:41].float().double(), x[41:]])  # the stored points were rounded
        ref = torch.linalg.eigvalsh(_kmat(kernel, x, False)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-10)


class TestAddPointDispatch:
    def test_cost_model_decisions(self):
        x = torch.randn(700, 2, generator=torch.Generator().manual_seed(1), dtype=D64)
        kernel = gpytorch.kernels.LinearKernel().double()
        small = IncrementalKPCA(kernel).fit(x[:50])
        large = IncrementalKPCA(kernel).fit(x)
        assert small._prefer_eigh(1)  # fixed cost of the updates dominates at m = 50
        assert not large._prefer_eigh(1)  # one point at m = 700: rank-one updates
        assert large._prefer_eigh(700)  # doubling the points: one batch eigh
        assert not IncrementalKPCA(kernel, method="rank_one").fit(x[:50])._prefer_eigh(100)
        assert IncrementalKPCA(kernel, method="eigh").fit(x)._prefer_eigh(1)
        assert not IncrementalKPCA(kernel, max_components=5).fit(x[:50])._prefer_eigh(100)

    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("centered", [False, True])
    def test_all_methods_agree_with_eigh(self, dtype, centered):
        gen = torch.Generator().manual_seed(2)
        x = torch.randn(45, 3, generator=gen, dtype=D64).to(dtype)
        kernel = _rbf(dtype)
        ref = torch.linalg.eigvalsh(_kmat(kernel, x, centered).double()).flip(0)
        for method in ("auto", "rank_one", "eigh"):
            kpca = IncrementalKPCA(kernel, centered=centered, dtype=dtype, method=method)
            kpca.update(x[:30])
            for i in range(30, 45):
                kpca.update(x[i])
            lam = kpca.eigenvalues.double()
            torch.testing.assert_close(lam, ref, rtol=0, atol=_tol(dtype) * ref[0])
            u = kpca.eigenvectors.double()
            k = _kmat(kernel, x, centered).double()
            torch.testing.assert_close(
                u @ torch.diag(lam) @ u.T, k, rtol=0, atol=10 * _tol(dtype) * ref[0]
            )

    def test_degenerate_points_on_the_eigh_path(self):
        x = torch.randn(10, 2, generator=torch.Generator().manual_seed(4), dtype=D64)
        x = torch.cat([x, x[3:4]])  # a duplicate
        kpca = IncrementalKPCA(_rbf(D64), method="eigh", on_degenerate="record").update(x)
        assert [p["kind"] for p in kpca.degenerate_points] == ["duplicate"]
        kpca = IncrementalKPCA(_rbf(D64), method="eigh", on_degenerate="raise").fit(x[:5])
        with pytest.raises(InputDataError):
            kpca.update(x[5:])  # the duplicate is the last point: the first 5 are added
        assert kpca.num_points == 10
        ref = torch.linalg.eigvalsh(_kmat(kpca.kernel, x[:10], False)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-12)

    def test_bad_method(self):
        with pytest.raises(InputDataError, match="method"):
            IncrementalKPCA(_rbf(D64), method="fast")


class TestRankOneEighPath:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("batch", [(), (3,), (2, 4)])
    def test_methods_agree_with_eigh(self, dtype, batch):
        gen = torch.Generator().manual_seed(11)
        n = 12
        a = torch.randn(*batch, n, n, generator=gen, dtype=D64)
        a = a @ a.mT / n
        v = torch.randn(*batch, n, generator=gen, dtype=D64)
        sigma = torch.linspace(-0.4, 0.9, max(1, torch.Size(batch).numel()), dtype=D64)
        sigma = sigma.reshape(batch) if batch else torch.tensor(0.7, dtype=D64)
        s = sigma[..., None, None] if batch else sigma
        ref = torch.linalg.eigvalsh(a + s * v[..., :, None] * v[..., None, :])
        d, u = torch.linalg.eigh(a)
        d, u, v = d.to(dtype), u.to(dtype), v.to(dtype)
        for method in ("auto", "secular", "eigh"):
            lam, u2 = rank_one_eigh_update(d, u, v, sigma.to(dtype), method=method)
            assert lam.shape == (*batch, n) and u2.shape == (*batch, n, n)
            tol = _tol(dtype) * 10
            torch.testing.assert_close(lam.double(), ref, rtol=0, atol=tol * ref.abs().max())
            eye = torch.eye(n, dtype=D64).expand(*batch, n, n)
            u2 = u2.double()
            torch.testing.assert_close(u2.mT @ u2, eye, rtol=0, atol=tol)

    def test_auto_takes_batched_eigh_for_many_small_problems(self, monkeypatch):
        calls = []
        original = _secular.rank_one_basis_update
        module = importlib.import_module("gpext.operators.rank_one_eigh_update")
        monkeypatch.setattr(
            module,
            "rank_one_basis_update",
            lambda *a: calls.append(1) or original(*a),
        )
        gen = torch.Generator().manual_seed(12)
        a = torch.randn(200, 20, 20, generator=gen, dtype=D64)
        d, u = torch.linalg.eigh(a @ a.mT)
        v = torch.randn(200, 20, generator=gen, dtype=D64)
        lam, _ = rank_one_eigh_update(d, u, v, 0.5)
        assert not calls  # one batched eigh, no loop over problems
        assert _secular.prefer_eigh(20, 200) and not _secular.prefer_eigh(1000)
        ref = torch.linalg.eigvalsh(a @ a.mT + 0.5 * v[:, :, None] * v[:, None, :])
        torch.testing.assert_close(lam, ref, rtol=1e-10, atol=1e-10)

    @pytest.mark.parametrize("scale", [1e160, 1e-160, 1e300])
    def test_eigh_path_extreme_scales(self, scale):
        gen = torch.Generator().manual_seed(13)
        n = 8
        a = torch.randn(n, n, generator=gen, dtype=D64)
        a = a @ a.T / n + 0.1 * torch.eye(n, dtype=D64)
        v = torch.randn(n, generator=gen, dtype=D64)
        d, u = torch.linalg.eigh(scale * a)
        lam, u2 = rank_one_eigh_update(d, u, v, -0.05 * scale, method="eigh")
        ref = torch.linalg.eigvalsh(a - 0.05 * torch.outer(v, v))
        torch.testing.assert_close(lam / scale, ref, rtol=1e-12, atol=1e-13)
        assert torch.isfinite(u2).all()

    def test_bad_method(self):
        d, u = torch.ones(3, dtype=D64), torch.eye(3, dtype=D64)
        with pytest.raises(InputDataError, match="method"):
            rank_one_eigh_update(d, u, torch.ones(3, dtype=D64), 1.0, method="lapack")


class TestCenteredOneSolve:
    """The centred variant without max_components: exact null column, one arrowhead solve a
    point."""

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_null_column_and_eigh(self, dtype, monkeypatch):
        monkeypatch.setattr(IncrementalKPCA, "_maybe_flush", lambda self: None)  # keep pending
        gen = torch.Generator().manual_seed(14)
        x = torch.randn(70, 3, generator=gen, dtype=D64).to(dtype)
        kernel = _rbf(dtype)
        kpca = IncrementalKPCA(
            kernel, centered=True, dtype=dtype, method="rank_one", refresh_every=None
        )
        kpca.fit(x[:30])
        for i in range(30, 70):
            before = sum(isinstance(op, Factor) and op.q is not None for op in kpca._pending)
            kpca.update(x[i])
            after = sum(isinstance(op, Factor) and op.q is not None for op in kpca._pending)
            assert after - before == 1  # one arrowhead factor per point, not four updates
        null = kpca._null
        assert kpca._evals[null] == 0
        u = kpca._basis()
        col = u[:, kpca._null] * kpca._null_sign * 70**0.5
        torch.testing.assert_close(col, torch.ones_like(col), rtol=0, atol=10 * _tol(dtype))
        k = _kmat(kernel, x, True).double()
        ref = torch.linalg.eigvalsh(k)
        tol = _tol(dtype) * ref.abs().max()
        torch.testing.assert_close(kpca._evals.double(), ref, rtol=0, atol=tol)
        ud = u.double()
        torch.testing.assert_close(ud @ torch.diag(kpca._evals.double()) @ ud.T, k, rtol=0,
                                   atol=10 * tol)  # fmt: skip

    def test_state_dict_keeps_the_null_column(self):
        gen = torch.Generator().manual_seed(15)
        x = torch.randn(40, 2, generator=gen, dtype=D64)
        a = IncrementalKPCA(_rbf(D64), centered=True, method="rank_one").fit(x[:30])
        a.update(x[30])
        b = IncrementalKPCA(_rbf(D64), centered=True, method="rank_one")
        b.load_state_dict(a.state_dict())
        assert (b._null, b._null_sign) == (a._null, a._null_sign)
        for i in range(31, 40):
            a.update(x[i])
            b.update(x[i])
        torch.testing.assert_close(b.eigenvalues, a.eigenvalues, rtol=0, atol=0)

    @pytest.mark.parametrize("centered", [False, True])
    def test_batch_path_reports_what_the_rank_one_path_reports(self, centered):
        # zero self-similarity (the zero vector, linear kernel), duplicates of a stored point
        # and of a point earlier in the same batch, and a point at the mean of the stored
        # points (centred self-similarity 0): the batch path checks every point against the
        # points before it, as adding them one by one does.
        gen = torch.Generator().manual_seed(21)
        x = torch.randn(12, 3, generator=gen, dtype=D64)
        new = torch.stack([x.mean(0), x[2], torch.zeros(3, dtype=D64), x[5] * 0.5, x[5] * 0.5])
        kernel = gpytorch.kernels.LinearKernel().double()
        reports = []
        for method in ("rank_one", "eigh"):
            kpca = IncrementalKPCA(kernel, centered=centered, method=method, on_degenerate="record")
            kpca.fit(x).update(new)
            reports.append(kpca.degenerate_points)
            xs = torch.cat([x, new])
            ref = torch.linalg.eigvalsh(_kmat(kernel, xs, centered)).flip(0)
            torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-10)
        kinds = [(p["index"], p["kind"]) for p in reports[1]]
        assert (13, "duplicate") in kinds and (14, "zero_self_similarity") in kinds
        assert (15, "duplicate") in kinds and (16, "duplicate") in kinds
        assert ((12, "centered_self_similarity_zero") in kinds) == centered
        for a, b in zip(reports[0], reports[1], strict=True):
            assert (a["index"], a["kind"]) == (b["index"], b["kind"])
            assert a["value"] == pytest.approx(b["value"], rel=1e-9, abs=1e-12)

    def test_batch_path_raise_keeps_the_points_before(self):
        gen = torch.Generator().manual_seed(22)
        x = torch.randn(8, 2, generator=gen, dtype=D64)
        new = torch.cat([torch.randn(3, 2, generator=gen, dtype=D64), x[1:2], x[:2]])
        kpca = IncrementalKPCA(_rbf(D64), method="eigh", on_degenerate="raise").fit(x)
        with pytest.raises(InputDataError, match="point 11 duplicates stored point 1"):
            kpca.update(new)
        assert kpca.num_points == 11 and kpca.degenerate_points == []
        ref = torch.linalg.eigvalsh(_kmat(kpca.kernel, torch.cat([x, new[:3]]), False)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-12)

    def test_centered_degenerate_point(self):
        # a point at the mean of the stored points (linear kernel): centred self-similarity 0
        gen = torch.Generator().manual_seed(16)
        x = torch.randn(20, 3, generator=gen, dtype=D64)
        kernel = gpytorch.kernels.LinearKernel().double()
        kpca = IncrementalKPCA(kernel, centered=True, method="rank_one", on_degenerate="record")
        kpca.fit(x)
        kpca.update(x.mean(0))
        assert [p["kind"] for p in kpca.degenerate_points] == ["centered_self_similarity_zero"]
        xs = torch.cat([x, x.mean(0, keepdim=True)])
        ref = torch.linalg.eigvalsh(_kmat(kernel, xs, True)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-12)

"""Tests of gpext.operators.IncrementalKPCA against eigh, scikit-learn and closed forms."""

import warnings

import gpytorch
import pytest
import torch
from sklearn.decomposition import PCA, KernelPCA
from sklearn.kernel_approximation import Nystroem

from gpext.errors import DataWarning, InputDataError, NotFittedError, ShapeError
from gpext.operators import IncrementalKPCA, NystromKPCALinearOperator

D64 = torch.float64


def _rbf(lengthscale=2.0, dtype=D64):
    k = gpytorch.kernels.RBFKernel().to(dtype)
    k.lengthscale = lengthscale
    return k


def _kmat(kernel, x, centered):
    with torch.no_grad():
        k = kernel(x, x).to_dense()
    if centered:
        k = k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()
    return k


class TestIncrementalKPCA:
    seed = 1

    def setup_method(self):
        self.gen = torch.Generator().manual_seed(self.seed)

    @pytest.mark.slow
    @pytest.mark.parametrize("method", ["rank_one", "auto"])
    @pytest.mark.parametrize("centered", [False, True])
    def test_grow_20_to_500_against_eigh(self, centered, method):
        x = torch.randn(500, 3, generator=self.gen, dtype=D64)
        kernel = _rbf()
        kpca = IncrementalKPCA(kernel, centered=centered, method=method).fit(x[:20])
        kpca.update(x[20:])
        k = _kmat(kernel, x, centered)
        ref = torch.linalg.eigvalsh(k).flip(0)
        lam, u = kpca.eigenvalues, kpca.eigenvectors
        # Relative accuracy above a floor of 1e-4 * lambda_max (eigh's own error is
        # ~eps * lambda_max, so smaller eigenvalues cannot be checked relatively).
        keep = ref > 1e-4 * ref[0]
        assert ((lam - ref).abs() / ref)[keep].max() <= 1e-10
        assert (lam - ref).abs().max() <= 1e-11 * ref[0]
        assert (u.T @ u - torch.eye(500, dtype=D64)).abs().max() <= 1e-9
        assert (u @ torch.diag(lam) @ u.T - k).abs().max() <= 1e-11 * ref[0]
        assert kpca.degenerate_points == []

    @pytest.mark.parametrize("method", ["rank_one", "auto"])
    @pytest.mark.parametrize("centered", [False, True])
    def test_incremental_from_first_point(self, centered, method):
        x = torch.randn(40, 2, generator=self.gen, dtype=D64)
        kernel = _rbf(1.0)
        kpca = IncrementalKPCA(kernel, centered=centered, method=method).update(x)
        k = _kmat(kernel, x, centered)
        torch.testing.assert_close(
            kpca.eigenvalues, torch.linalg.eigvalsh(k).flip(0), rtol=0, atol=1e-12
        )
        u = kpca.eigenvectors
        torch.testing.assert_close(u @ torch.diag(kpca.eigenvalues) @ u.T, k, rtol=0, atol=1e-12)

    def test_nystrom_direct_and_sklearn(self):
        x = torch.randn(200, 3, generator=self.gen, dtype=D64)
        landmarks = x[:60]
        kernel = _rbf(1.5)
        kpca = IncrementalKPCA(kernel).update(landmarks)
        lam_nys, u_nys = kpca.nystrom(x)
        # Direct Eq. 8 from eigh of K_mm.
        kmm = _kmat(kernel, landmarks, False)
        lam, u = torch.linalg.eigh(kmm)
        lam, u = lam.flip(0), u.flip(-1)
        keep = lam > kpca.eigenvalue_rtol * lam[0]
        lam, u = lam[keep], u[:, keep]
        with torch.no_grad():
            knm = kernel(x, landmarks).to_dense()
        n, m = 200, 60
        torch.testing.assert_close(lam_nys, lam * n / m, rtol=1e-10, atol=1e-12 * float(lam_nys[0]))
        direct = (m / n) ** 0.5 * knm @ u / lam
        # Eigenvectors of well-separated eigenvalues (small ones are ill-determined in both).
        top = lam > 1e-5 * lam[0]
        torch.testing.assert_close(u_nys[:, top].abs(), direct[:, top].abs(), rtol=1e-6, atol=1e-9)
        # scikit-learn's Nystroem: features F with F F^T = K_nm K_mm^+ K_mn.
        # scikit-learn's Nystroem (all landmarks as components): F F^T = K_nm K_mm^+ K_mn.
        # A shorter lengthscale keeps K_mm well conditioned, so both keep every eigenpair.
        kernel = _rbf(0.5)
        kpca = IncrementalKPCA(kernel).update(landmarks)
        lam_nys, u_nys = kpca.nystrom(x)
        assert lam_nys.shape[0] == m
        ny = Nystroem(kernel="rbf", gamma=0.5 / 0.5**2, n_components=m, random_state=0)
        feats = torch.from_numpy(ny.fit(landmarks.numpy()).transform(x.numpy()))
        approx = NystromKPCALinearOperator(u_nys, lam_nys).to_dense()
        torch.testing.assert_close(approx, feats @ feats.T, rtol=0, atol=1e-8)

    def test_centered_nystrom_matches_sklearn_kernel_pca(self):
        x = torch.randn(150, 3, generator=self.gen, dtype=D64)
        landmarks = x[:50]
        kpca = IncrementalKPCA(_rbf(1.0), centered=True).update(landmarks)
        lam_nys, u_nys = kpca.nystrom(x, num_components=5)
        skl = KernelPCA(n_components=5, kernel="rbf", gamma=0.5, eigen_solver="dense")
        skl.fit(landmarks.numpy())
        scores = torch.from_numpy(skl.transform(x.numpy()))
        torch.testing.assert_close(lam_nys * 50 / 150, torch.from_numpy(skl.eigenvalues_))
        # U_nys = sqrt(m / n) * scores * L^{-1/2} (landmark-centred kernel).
        expected = (50 / 150) ** 0.5 * scores / torch.from_numpy(skl.eigenvalues_).sqrt()
        torch.testing.assert_close(u_nys.abs(), expected.abs(), rtol=1e-7, atol=1e-9)
        torch.testing.assert_close(kpca.transform(x, 5).abs(), scores.abs(), rtol=1e-7, atol=1e-9)
        # On the landmarks themselves Nystrom reproduces the decomposition exactly.
        lam_l, u_l = kpca.nystrom(landmarks, 5)
        torch.testing.assert_close(lam_l, kpca.eigenvalues[:5])
        torch.testing.assert_close(u_l, kpca.eigenvectors[:, :5], rtol=0, atol=1e-9)

    def test_linear_kernel_reproduces_pca(self):
        x = torch.randn(30, 200, generator=self.gen, dtype=D64) * torch.linspace(3, 0.1, 200)
        linear = gpytorch.kernels.LinearKernel().double()
        linear.variance = 1.0  # feature map phi(x) = x
        kpca = IncrementalKPCA(linear, centered=True)
        kpca.update(x)
        coef = kpca.expansion_coefficients(num_components=5)  # shape: (30, 5)
        axes = x.T @ coef  # unit principal axes in input space
        pca = PCA(n_components=5).fit(x.numpy())
        comp = torch.from_numpy(pca.components_).T
        torch.testing.assert_close(axes.T @ axes, torch.eye(5, dtype=D64), rtol=0, atol=1e-9)
        torch.testing.assert_close((axes * comp).sum(0).abs(), torch.ones(5, dtype=D64))
        torch.testing.assert_close(
            kpca.eigenvalues[:5] / 29, torch.from_numpy(pca.explained_variance_)
        )

    def test_truncation_bounds_memory(self):
        x = torch.randn(120, 2, generator=self.gen, dtype=D64)
        kernel = _rbf(2.0)
        kpca = IncrementalKPCA(kernel, max_components=15).fit(x[:10]).update(x[10:])
        assert kpca.eigenvectors.shape == (120, 15)
        ref = torch.linalg.eigvalsh(_kmat(kernel, x, False)).flip(0)[:5]
        assert ((kpca.eigenvalues[:5] - ref).abs() / ref).max() < 1e-6
        u = kpca.eigenvectors
        assert (u.T @ u - torch.eye(15, dtype=D64)).abs().max() < 1e-10

    def test_state_dict_round_trip(self):
        x = torch.randn(30, 2, generator=self.gen, dtype=D64)
        a = IncrementalKPCA(_rbf(), centered=True).update(x[:20])
        b = IncrementalKPCA(_rbf(), centered=True)
        b.load_state_dict(a.state_dict())
        torch.testing.assert_close(b.eigenvalues, a.eigenvalues)
        a.update(x[20:])
        b.update(x[20:])
        torch.testing.assert_close(b.eigenvalues, a.eigenvalues, rtol=0, atol=0)
        torch.testing.assert_close(b.eigenvectors, a.eigenvectors, rtol=0, atol=0)

    def test_growable_storage_and_reserve(self):
        x = torch.randn(11, 3, generator=self.gen, dtype=D64)
        kpca = IncrementalKPCA(_rbf())
        for i in range(11):
            kpca.update(x[i])
        assert kpca._store.shape[0] >= 11  # capacity doubles, rows beyond m are spare
        torch.testing.assert_close(kpca.points, x, rtol=0, atol=0)
        state = kpca.state_dict()
        assert state["_points"].shape == (11, 3)
        other = IncrementalKPCA(_rbf())
        other.load_state_dict(state)
        torch.testing.assert_close(other.points, x, rtol=0, atol=0)
        other.update(x[0] + 1.0)
        assert other.num_points == 12
        # reserve: one block, filled in place.
        pre = IncrementalKPCA(_rbf()).reserve(20, 3)
        ptr = pre._store.data_ptr()
        pre.update(x)
        assert pre._store.data_ptr() == ptr and pre._store.shape == (20, 3)
        torch.testing.assert_close(pre.eigenvalues, kpca.eigenvalues, rtol=0, atol=1e-12)
        with pytest.raises(ShapeError, match="like the stored points"):
            pre.reserve(40, 4)
        with pytest.raises(InputDataError, match="capacity"):
            pre.reserve(0, 3)

    def test_linear_kernel_row_matches_gpytorch(self):
        x = torch.randn(12, 40, generator=self.gen, dtype=D64)
        linear = gpytorch.kernels.LinearKernel().double()
        linear.variance = 2.5
        kpca = IncrementalKPCA(linear).update(x[:10])
        with torch.no_grad():
            ref = linear(x[10:], x[:10]).to_dense()
            full = linear(x, x).to_dense()
        torch.testing.assert_close(kpca._kernel(x[10:], kpca.points), ref, rtol=1e-13, atol=0)
        kpca.update(x[10:])
        torch.testing.assert_close(
            kpca.eigenvalues, torch.linalg.eigvalsh(full).flip(0), rtol=0, atol=1e-10
        )

    def test_degenerate_points_are_added_and_reported(self):
        x = torch.randn(10, 3, generator=self.gen, dtype=D64)
        kpca = IncrementalKPCA(_rbf(), centered=False).update(x)
        with pytest.warns(DataWarning, match="duplicates stored point 3"):
            kpca.update(x[3])
        assert kpca.num_points == 11
        assert kpca.degenerate_points[-1]["kind"] == "duplicate"
        ref = torch.linalg.eigvalsh(_kmat(kpca.kernel, kpca.points, False)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-12)
        # Linear kernel: a zero vector has k(x, x) = 0; the point at the mean has k_c = 0.
        lin = IncrementalKPCA(gpytorch.kernels.LinearKernel().double(), centered=True)
        lin.update(x[:5])
        with pytest.warns(DataWarning, match="zero_self_similarity"):
            lin.update(torch.zeros(3, dtype=D64))
        with pytest.warns(DataWarning, match="centered_self_similarity_zero"):
            lin.update(lin.points.mean(0))
        assert [r["kind"] for r in lin.degenerate_points] == [
            "zero_self_similarity",
            "centered_self_similarity_zero",
        ]
        ref = torch.linalg.eigvalsh(_kmat(lin.kernel, lin.points, True)).flip(0)
        torch.testing.assert_close(lin.eigenvalues, ref, rtol=0, atol=1e-12)
        strict = IncrementalKPCA(_rbf(), on_degenerate="raise").update(x[:3])
        with pytest.raises(InputDataError, match="duplicates"):
            strict.update(x[1])
        assert strict.num_points == 3
        quiet = IncrementalKPCA(_rbf(), on_degenerate="record").update(x[:3])
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            quiet.update(x[0])
        assert len(quiet.degenerate_points) == 1

    def test_nystrom_operator_and_float32(self):
        x = torch.randn(40, 2, generator=self.gen)
        kpca = IncrementalKPCA(_rbf(1.0, torch.float32), dtype=torch.float32).update(x[:20])
        op = kpca.nystrom_operator(x, num_components=8)
        assert isinstance(op, NystromKPCALinearOperator)
        assert op.shape == (40, 40) and op.dtype == torch.float32
        ref = torch.linalg.eigvalsh(_kmat(kpca.kernel, x[:20], False).double()).flip(0)
        assert ((kpca.eigenvalues.double()[:5] - ref[:5]).abs() / ref[:5]).max() < 1e-4

    def test_errors(self):
        kpca = IncrementalKPCA(_rbf())
        with pytest.raises(NotFittedError, match="no points"):
            kpca.transform(torch.zeros(2, 3, dtype=D64))
        kpca.update(torch.randn(5, 3, generator=self.gen, dtype=D64))
        with pytest.raises(ShapeError, match="3 features"):
            kpca.update(torch.zeros(2, 4, dtype=D64))
        with pytest.raises(InputDataError, match="finite"):
            kpca.update(torch.tensor([[0.0, float("inf"), 1.0]], dtype=D64))
        with pytest.raises(TypeError, match="gpytorch.kernels.Kernel"):
            IncrementalKPCA(lambda a, b: a @ b.T)
        with pytest.raises(InputDataError, match="on_degenerate"):
            IncrementalKPCA(_rbf(), on_degenerate="skip")


class TestNystromOrthogonalized:
    seed = 4

    def test_exact_eigenpairs_of_nystrom_matrix(self):
        gen = torch.Generator().manual_seed(self.seed)
        x = torch.randn(120, 3, generator=gen, dtype=D64)
        kernel = _rbf(1.0)
        kpca = IncrementalKPCA(kernel).update(x[:30])
        lam, u = kpca.nystrom(x, method="orthogonalized")
        with torch.no_grad():
            knm = kernel(x, x[:30]).to_dense()
        approx = knm @ torch.linalg.pinv(_kmat(kernel, x[:30], False), hermitian=True) @ knm.T
        ref = torch.linalg.eigvalsh(approx).flip(0)[: lam.shape[0]]
        torch.testing.assert_close(lam, ref, rtol=1e-8, atol=1e-10 * float(ref[0]))
        r = lam.shape[0]
        torch.testing.assert_close(u.T @ u, torch.eye(r, dtype=D64), rtol=0, atol=1e-8)
        top = kpca.nystrom(x, num_components=3, method="orthogonalized")[0]
        torch.testing.assert_close(top, lam[:3])
        with pytest.raises(InputDataError, match="orthogonalized"):
            kpca.nystrom(x, method="svd")


class TestKernelChangeDetection:
    """The decomposition belongs to the kernel's hyperparameters when it was computed."""

    seed = 6

    def setup_method(self):
        self.gen = torch.Generator().manual_seed(self.seed)

    @pytest.mark.parametrize("centered", [False, True])
    def test_changed_lengthscale_raises_then_refit(self, centered):
        x = torch.randn(30, 2, generator=self.gen, dtype=D64)
        kernel = _rbf(1.0)
        kpca = IncrementalKPCA(kernel, centered=centered).update(x[:20])
        evals = kpca.eigenvalues.clone()
        assert not kpca.kernel_changed()
        kernel.lengthscale = torch.tensor(0.5, dtype=D64)
        assert kpca.kernel_changed()
        # Before this check, the update bordered the old matrix with new-kernel entries (a
        # decomposition of neither kernel, with negative eigenvalues) without a word.
        with pytest.raises(NotFittedError, match=r"hyperparameters changed.*raw_lengthscale"):
            kpca.update(x[20:])
        assert kpca.num_points == 20
        torch.testing.assert_close(kpca.eigenvalues, evals, rtol=0, atol=0)
        with pytest.raises(NotFittedError, match="refit"):
            kpca.transform(x[:3])
        with pytest.raises(NotFittedError, match="refit"):
            kpca.nystrom(x)
        # Restoring the old value makes the state current again.
        kernel.lengthscale = torch.tensor(1.0, dtype=D64)
        assert not kpca.kernel_changed()
        kernel.lengthscale = torch.tensor(0.5, dtype=D64)
        kpca.refit()
        assert not kpca.kernel_changed()
        kpca.update(x[20:])
        ref = torch.linalg.eigvalsh(_kmat(kernel, x, centered)).flip(0)
        torch.testing.assert_close(kpca.eigenvalues, ref, rtol=0, atol=1e-12)

    def test_optimizer_step_and_constraint_buffers_are_seen(self):
        x = torch.randn(10, 2, generator=self.gen, dtype=D64)
        kernel = gpytorch.kernels.ScaleKernel(_rbf(1.0)).double()
        kpca = IncrementalKPCA(kernel).fit(x[:5])
        with torch.no_grad():
            kernel.raw_outputscale.add_(0.1)  # in place, as an optimiser step
        assert kpca.kernel_changed()
        kpca.refit()
        with torch.no_grad():
            kernel.base_kernel.raw_lengthscale_constraint.lower_bound.fill_(1e-3)
        with pytest.raises(NotFittedError, match="lower_bound"):
            kpca.update(x[5:])
        with pytest.raises(NotFittedError, match="no points"):
            IncrementalKPCA(_rbf()).refit()

    def test_record_in_state_dict(self):
        x = torch.randn(12, 2, generator=self.gen, dtype=D64)
        a = IncrementalKPCA(_rbf(1.0)).update(x[:8])
        a.kernel.lengthscale = torch.tensor(0.7, dtype=D64)
        state = a.state_dict()
        assert "_kernel_values.raw_lengthscale" in state
        b = IncrementalKPCA(_rbf(1.0))
        b.load_state_dict(state)  # strict: the record is not an unexpected key
        assert b.kernel_changed()  # the saved state was already stale, and stays so
        b.refit()
        b.update(x[8:])
        ref = torch.linalg.eigvalsh(_kmat(b.kernel, x, False)).flip(0)
        torch.testing.assert_close(b.eigenvalues, ref, rtol=0, atol=1e-12)
        # A state dict without the record (older format) still loads strictly.
        old = {k: v for k, v in IncrementalKPCA(_rbf(1.0)).update(x).state_dict().items()}
        old = {k: v for k, v in old.items() if not k.startswith("_kernel_values.")}
        c = IncrementalKPCA(_rbf(1.0))
        c.load_state_dict(old)
        assert not c.kernel_changed()
        c.update(x[0] + 0.5)
        assert c.num_points == 13

    def test_dtype_follows_module(self):
        x = torch.randn(20, 2, generator=self.gen, dtype=D64)
        kernel = _rbf(1.0, torch.float32)
        kpca = IncrementalKPCA(kernel, dtype=torch.float32).update(x[:10].float())
        assert kpca.eigenvalue_rtol == pytest.approx(torch.finfo(torch.float32).eps ** 0.5)
        kpca.double()
        assert kpca.dtype == D64 and kpca.eigenvalues.dtype == D64
        assert kpca.eigenvalue_rtol == pytest.approx(torch.finfo(D64).eps ** 0.5)
        assert not kpca.kernel_changed()  # converting the kernel is not a change of value
        kpca.refit().update(x[10:])
        assert kpca.points.dtype == D64 and kpca.eigenvalues.dtype == D64
        ref = torch.linalg.eigvalsh(
            _kmat(kernel, torch.cat([x[:10].float().double(), x[10:]]), False)
        )
        torch.testing.assert_close(kpca.eigenvalues, ref.flip(0), rtol=0, atol=1e-12)


def test_numerically_zero_kernel_matrix_is_a_numerical_error():
    """A zero kernel matrix (e.g. an L-BFGS trial point with outputscale 0) must be a
    NumericalError, which minimize_lbfgs rejects as a trial point, not a NotFittedError."""
    import gpytorch

    from gpext.errors import NumericalError
    from gpext.operators import IncrementalKPCA

    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    kpca = IncrementalKPCA(kernel, on_degenerate="record")
    kpca.update(torch.randn(5, 2, dtype=torch.float64))
    with torch.no_grad():
        kernel.raw_outputscale.fill_(-1e4)  # outputscale underflows to 0
    kpca.refit()
    with pytest.raises(NumericalError, match="numerically zero"):
        kpca.transform(torch.randn(3, 2, dtype=torch.float64))

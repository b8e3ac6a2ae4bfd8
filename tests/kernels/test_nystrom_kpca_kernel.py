"""Tests of gpext.kernels.nystrom_kpca_kernel.NystromKPCAKernel.

GPyTorch's kernel suite in float32 and float64, and references: scikit-learn's ``Nystroem`` on
the same landmarks, the base kernel itself (landmarks = points), finite differences, a freshly
built kernel, and an exact GP trained with Adam.
"""

import pickle
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from linear_operator.operators import (
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
)
from sklearn.kernel_approximation import Nystroem

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.kernels.nystrom_kpca_kernel import NystromKPCAKernel

D64 = torch.float64
DTYPES = (torch.float32, torch.float64)
# Agreement with float64 references: rounding of the float32 kernel entries, amplified by
# the condition number of the kept part of K_ZZ.
ATOL = {torch.float32: 2e-4, torch.float64: 1e-10}


def _rbf(lengthscale, dtype=D64, **kwargs):
    k = gpytorch.kernels.RBFKernel(**kwargs).to(dtype)
    # A tensor of the kernel's dtype: a Python float would pass through float32 in gpytorch.
    k.lengthscale = torch.as_tensor(lengthscale, dtype=dtype)
    return k


def _dense(op):
    with torch.no_grad():
        return op.to_dense()


class _KernelSuite(BaseKernelTestCase):
    """GPyTorch's kernel suite; the default dtype is this class's for each test."""

    dtype = torch.float32
    seed = 0
    num_landmarks = 12

    def setUp(self):
        super().setUp()
        self._default_dtype = torch.get_default_dtype()
        torch.set_default_dtype(self.dtype)

    def tearDown(self):
        torch.set_default_dtype(self._default_dtype)
        super().tearDown()

    def _landmarks(self, dims):
        gen = torch.Generator().manual_seed(7)
        return torch.randn(self.num_landmarks, dims, generator=gen) * 1.5

    def create_kernel_no_ard(self, landmark_dims=None, **kwargs):
        dims = landmark_dims or len(kwargs.get("active_dims", ())) or 2
        return NystromKPCAKernel(gpytorch.kernels.RBFKernel(), self._landmarks(dims), **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        base = gpytorch.kernels.RBFKernel(ard_num_dims=num_dims)
        base.lengthscale = torch.linspace(0.6, 1.2, num_dims)
        return NystromKPCAKernel(base, self._landmarks(num_dims), **kwargs)

    # The reference kernel of the active-dims tests needs the same landmarks, in the selected
    # dimensions; otherwise as upstream.
    def _check_active_dims(self, active_dims):
        kernel = self.create_kernel_no_ard(active_dims=active_dims)
        x = self.create_data_no_batch()
        covar = kernel(x).evaluate_kernel().to_dense()
        basic = self.create_kernel_no_ard(landmark_dims=len(active_dims))
        expected = basic(x[:, active_dims]).evaluate_kernel().to_dense()
        self.assertAllClose(covar, expected, rtol=1e-3, atol=1e-5)

    def test_active_dims_list(self):
        self._check_active_dims([0, 2, 4, 6])

    def test_active_dims_range(self):
        self._check_active_dims(list(range(3, 9)))

    # One set of hyperparameters only: batched kernels are refused with a gpext error.
    def _check_batch_kernel_refused(self, batch_shape, ard=False):
        with self.assertRaisesRegex(ShapeError, "empty batch shape"):
            if ard:
                self.create_kernel_ard(num_dims=2, batch_shape=batch_shape)
            else:
                self.create_kernel_no_ard(batch_shape=batch_shape)
        base = gpytorch.kernels.RBFKernel(batch_shape=batch_shape)
        with self.assertRaisesRegex(ShapeError, "empty batch shape"):
            NystromKPCAKernel(base, self._landmarks(2))

    def test_smoke_double_batch_kernel_double_batch_x_no_ard(self):
        self._check_batch_kernel_refused(torch.Size([3, 2]))

    def test_smoke_double_batch_kernel_double_batch_x_ard(self):
        self._check_batch_kernel_refused(torch.Size([3, 2]), ard=True)

    def test_kernel_getitem_single_batch(self):
        self._check_batch_kernel_refused(torch.Size([2]))

    def test_kernel_getitem_double_batch(self):
        self._check_batch_kernel_refused(torch.Size([3, 2]))

    def test_kernel_getitem_broadcast(self):
        self._check_batch_kernel_refused(torch.Size([2]))

    def test_unbatched_getitem_and_pickle_keep_the_decomposition(self):
        kernel = self.create_kernel_no_ard()
        self.assertIs(kernel[0], kernel)
        x = self.create_data_single_batch()[0]
        copy = pickle.loads(pickle.dumps(kernel))
        self.assertAllClose(copy(x).to_dense(), kernel(x).to_dense(), rtol=0, atol=0)


class TestNystromKPCAKernelSuiteFloat(_KernelSuite, unittest.TestCase):
    dtype = torch.float32


class TestNystromKPCAKernelSuiteDouble(_KernelSuite, unittest.TestCase):
    dtype = torch.float64


@pytest.mark.parametrize("dtype", DTYPES)
class TestNystromKPCAKernel:
    def setup_method(self):
        self.gen = torch.Generator().manual_seed(3)

    def _randn(self, *shape, dtype=D64):
        return torch.randn(*shape, generator=self.gen, dtype=D64).to(dtype)

    def test_matches_sklearn_nystroem(self, dtype):
        z, x, y = self._randn(25, 3), self._randn(40, 3), self._randn(9, 3)
        lengthscale = 0.7
        kernel = NystromKPCAKernel(_rbf(lengthscale, dtype), z.to(dtype))
        # All eigenpairs kept (a well-conditioned K_ZZ), as scikit-learn (which only clamps
        # its singular values at 1e-12) does; fitting on the landmarks with n_components = m
        # makes every landmark a component (in a random order, which F F^T does not see).
        assert kernel.features(z.to(dtype)).shape[-1] == 25
        ny = Nystroem(kernel="rbf", gamma=0.5 / lengthscale**2, n_components=25, random_state=0)
        ny.fit(z.numpy())
        assert sorted(ny.component_indices_.tolist()) == list(range(25))
        fx, fy = (torch.from_numpy(ny.transform(t.numpy())) for t in (x, y))
        xs, ys = x.to(dtype), y.to(dtype)
        atol = ATOL[dtype]
        torch.testing.assert_close(_dense(kernel(xs)).double(), fx @ fx.T, rtol=0, atol=atol)
        torch.testing.assert_close(_dense(kernel(xs, ys)).double(), fx @ fy.T, rtol=0, atol=atol)
        torch.testing.assert_close(
            kernel(xs, diag=True).detach().double(), (fx * fx).sum(-1), rtol=0, atol=atol
        )
        with torch.no_grad():
            phi = kernel.features(xs).double()
        torch.testing.assert_close(phi @ phi.T, fx @ fx.T, rtol=0, atol=atol)

    def test_exact_when_landmarks_are_the_points(self, dtype):
        z, x = self._randn(30, 2, dtype=dtype), self._randn(7, 2, dtype=dtype)
        base = _rbf(0.5, dtype)
        kernel = NystromKPCAKernel(base, z)
        with torch.no_grad():
            kzz, kzx = base(z).to_dense(), base(z, x).to_dense()
        atol = 10 * ATOL[dtype]
        torch.testing.assert_close(_dense(kernel(z)), kzz, rtol=0, atol=atol)
        torch.testing.assert_close(_dense(kernel(z, x)), kzx, rtol=0, atol=atol)
        torch.testing.assert_close(
            kernel(z, diag=True).detach(), torch.ones(30, dtype=dtype), rtol=0, atol=atol
        )

    def test_refresh_when_lengthscale_changes(self, dtype):
        z, x = self._randn(20, 2, dtype=dtype), self._randn(15, 2, dtype=dtype)
        y = self._randn(4, 2, dtype=dtype)
        base = _rbf(1.0, dtype)
        kernel = NystromKPCAKernel(base, z)
        before = _dense(kernel(x, y))
        base.lengthscale = torch.tensor(0.6, dtype=dtype)
        assert kernel.is_stale
        fresh = NystromKPCAKernel(_rbf(0.6, dtype), z)
        torch.testing.assert_close(_dense(kernel(x)), _dense(fresh(x)), rtol=0, atol=ATOL[dtype])
        torch.testing.assert_close(
            _dense(kernel(x, y)), _dense(fresh(x, y)), rtol=0, atol=ATOL[dtype]
        )
        assert not kernel.is_stale
        assert (kernel(x, y).to_dense() - before).abs().max() > 1e-2
        # "raise": a gpext error until refresh().
        strict = NystromKPCAKernel(_rbf(1.0, dtype), z, on_hyperparameter_change="raise")
        strict.base_kernel.lengthscale = torch.tensor(0.6, dtype=dtype)
        with pytest.raises(NotFittedError, match="refresh"):
            strict(x).to_dense()
        with pytest.raises(NotFittedError, match="refresh"):
            strict.update(y)
        assert strict.num_landmarks == 20
        strict.refresh()
        torch.testing.assert_close(_dense(strict(x)), _dense(fresh(x)), rtol=0, atol=ATOL[dtype])

    def test_incremental_update_equals_batch(self, dtype):
        z, x = self._randn(24, 2, dtype=dtype), self._randn(30, 2, dtype=dtype)
        batch = NystromKPCAKernel(_rbf(0.8, dtype), z)
        inc = NystromKPCAKernel(_rbf(0.8, dtype), z[:6])
        inc.update(z[6:20])
        for row in z[20:]:
            inc.update(row)
        assert inc.num_landmarks == 24
        torch.testing.assert_close(inc.landmarks, z, rtol=0, atol=0)
        atol = ATOL[dtype]
        torch.testing.assert_close(_dense(inc(x)), _dense(batch(x)), rtol=0, atol=atol)
        torch.testing.assert_close(_dense(inc(x, z)), _dense(batch(x, z)), rtol=0, atol=atol)
        # After a hyperparameter change, update refreshes first, then adds incrementally.
        inc2 = NystromKPCAKernel(_rbf(2.0, dtype), z[:12])
        inc2.base_kernel.lengthscale = torch.tensor(0.8, dtype=dtype)
        inc2.update(z[12:])
        torch.testing.assert_close(_dense(inc2(x)), _dense(batch(x)), rtol=0, atol=atol)

    def test_operators_batches_and_errors(self, dtype):
        z = self._randn(10, 2, dtype=dtype)
        x, y = self._randn(2, 8, 2, dtype=dtype), self._randn(5, 2, dtype=dtype)
        kernel = NystromKPCAKernel(_rbf(0.9, dtype), z)
        train = kernel(x).evaluate_kernel()
        assert isinstance(train, LowRankRootLinearOperator) and train.shape == (2, 8, 8)
        assert train.dtype == dtype
        noisy = train + torch.full((2, 8), 0.1, dtype=dtype).diag_embed()
        assert isinstance(
            kernel(x[0]).evaluate_kernel().add_diagonal(torch.tensor(0.1)),
            LowRankRootAddedDiagLinearOperator,
        )
        cross = kernel(x, y).evaluate_kernel()  # y broadcasts over the batch of x
        assert isinstance(cross, MatmulLinearOperator) and cross.shape == (2, 8, 5)
        for b in range(2):
            torch.testing.assert_close(_dense(cross)[b], _dense(kernel(x[b], y)), rtol=0, atol=1e-6)
        torch.testing.assert_close(
            kernel(x, diag=True).detach(), _dense(train).diagonal(dim1=-2, dim2=-1)
        )
        torch.testing.assert_close(_dense(noisy), _dense(train) + 0.1 * torch.eye(8, dtype=dtype))
        with pytest.raises(InputDataError, match="last_dim_is_batch"):
            kernel.forward(x[0], x[0], last_dim_is_batch=True)
        with pytest.raises(ShapeError, match="2 features like the landmarks"):
            kernel(torch.zeros(3, 4, dtype=dtype)).to_dense()
        with pytest.raises(InputDataError, match="on_hyperparameter_change"):
            NystromKPCAKernel(_rbf(1.0, dtype), z, on_hyperparameter_change="ignore")
        with pytest.raises(InputTypeError, match="gpytorch.kernels.Kernel"):
            NystromKPCAKernel(lambda a, b: a @ b.T, z)
        with pytest.raises(ShapeError, match=r"shape \(m, d\)"):
            NystromKPCAKernel(_rbf(1.0, dtype), z[0])
        with pytest.raises(InputDataError, match="finite"):
            NystromKPCAKernel(_rbf(1.0, dtype), torch.full((3, 2), float("nan"), dtype=dtype))

    def test_state_dict_round_trip(self, dtype):
        z, x = self._randn(16, 2, dtype=dtype), self._randn(10, 2, dtype=dtype)
        a = NystromKPCAKernel(_rbf(0.7, dtype), z[:10]).update(z[10:])
        b = NystromKPCAKernel(_rbf(1.5, dtype), self._randn(3, 2, dtype=dtype))
        b.load_state_dict(a.state_dict())
        assert not b.is_stale
        torch.testing.assert_close(b.landmarks, a.landmarks, rtol=0, atol=0)
        torch.testing.assert_close(b.kpca.eigenvalues, a.kpca.eigenvalues, rtol=0, atol=0)
        torch.testing.assert_close(_dense(b(x)), _dense(a(x)), rtol=0, atol=0)
        torch.testing.assert_close(b.base_kernel.lengthscale, a.base_kernel.lengthscale)

    def test_dtype_and_device_follow_the_module(self, dtype):
        other = torch.float64 if dtype == torch.float32 else torch.float32
        z, x = self._randn(12, 2), self._randn(6, 2)
        kernel = NystromKPCAKernel(_rbf(0.8, dtype), z)  # float64 landmarks, kernel's dtype
        assert kernel.landmarks.dtype == dtype and kernel.dtype == dtype
        kernel.to(other)
        assert kernel.landmarks.dtype == other and kernel.kpca.dtype == other
        assert kernel.kpca.eigenvalues.dtype == other
        kernel.update(self._randn(3, 2))
        assert _dense(kernel(x.to(other))).dtype == other
        ref = NystromKPCAKernel(_rbf(0.8, other), torch.cat([z, kernel.landmarks[12:].double()]))
        torch.testing.assert_close(
            _dense(kernel(x.to(other))), _dense(ref(x.to(other))), rtol=0, atol=ATOL[torch.float32]
        )


def _check_gradients_by_finite_differences(kernel, params, x, y, weights, h=1e-6):
    def loss():
        k_xx = kernel(x).to_dense()
        return (weights * k_xx).sum() + kernel(x, y).to_dense().sum() + kernel(y, diag=True).sum()

    grads = torch.autograd.grad(loss(), params)
    for param, grad in zip(params, grads):
        flat = param.data.view(-1)
        for i in range(flat.numel()):
            old = float(flat[i])
            with torch.no_grad():
                flat[i] = old + h
                up = float(loss())
                flat[i] = old - h
                down = float(loss())
                flat[i] = old
            fd = (up - down) / (2 * h)
            assert abs(float(grad.view(-1)[i]) - fd) <= 1e-6 * max(1.0, abs(fd))


def test_hyperparameter_gradients_match_finite_differences():
    gen = torch.Generator().manual_seed(11)
    z, x, y = (torch.randn(n, 2, generator=gen, dtype=D64) for n in (30, 20, 6))
    weights = torch.randn(20, 20, generator=gen, dtype=D64)
    # ARD lengthscales long enough that K_ZZ has dropped eigenpairs (their gap enters the
    # derivative), inside a ScaleKernel as a model would use it.
    base = gpytorch.kernels.ScaleKernel(_rbf(torch.tensor([1.8, 2.5]), D64, ard_num_dims=2))
    base = base.to(D64)
    base.outputscale = torch.tensor(1.3, dtype=D64)
    kernel = NystromKPCAKernel(base, z)
    rank = kernel.features(z).shape[-1]
    assert rank < 30  # some eigenpairs are dropped
    params = [base.base_kernel.raw_lengthscale, base.raw_outputscale]
    _check_gradients_by_finite_differences(kernel, params, x, y, weights)
    assert kernel.features(z).shape[-1] == rank  # the kept set did not change
    # Landmarks on a symmetric grid: K_ZZ has repeated eigenvalues (no 1/(l_i - l_j) enters).
    grid = torch.stack(
        torch.meshgrid(*[torch.tensor([-1.0, 0.0, 1.0], dtype=D64)] * 2, indexing="ij"), -1
    )
    base = _rbf(0.8, D64)
    kernel = NystromKPCAKernel(base, grid.reshape(9, 2))
    lam = kernel.kpca.eigenvalues
    assert float((lam[:-1] - lam[1:]).abs().min()) < 1e-12 * float(lam[0])
    _check_gradients_by_finite_differences(kernel, [base.raw_lengthscale], x, y, weights)


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, landmarks):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            NystromKPCAKernel(gpytorch.kernels.RBFKernel(), landmarks)
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_gp_trains_the_lengthscale(dtype):
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(40, 1, generator=gen, dtype=D64) * 4
    y = torch.sin(2 * x.squeeze(-1)) + 0.1 * torch.randn(40, generator=gen, dtype=D64)
    landmarks = torch.linspace(0, 4, 10, dtype=D64).unsqueeze(-1)
    x, y, landmarks = x.to(dtype), y.to(dtype), landmarks.to(dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = _ExactGP(x, y, likelihood, landmarks).to(dtype)
    nystrom = model.covar_module.base_kernel
    nystrom.base_kernel.lengthscale = torch.tensor(0.3, dtype=dtype)  # too short for sin(2x)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    # The training covariance plus noise is the Woodbury-friendly low-rank-plus-diagonal form.
    prior = likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel()
    assert isinstance(prior, LowRankRootAddedDiagLinearOperator)
    assert (
        prior.shape == (40, 40) and prior._linear_op.root.shape[-1] == nystrom.features(x).shape[-1]
    )
    if dtype == D64:  # the marginal likelihood's lengthscale gradient, by finite differences
        raw = nystrom.base_kernel.raw_lengthscale
        (grad,) = torch.autograd.grad(-mll(model(x), y), raw)
        with torch.no_grad():
            raw += 1e-6
            up = -mll(model(x), y).item()
            raw -= 2e-6
            down = -mll(model(x), y).item()
            raw += 1e-6
        assert abs(grad.item() - (up - down) / 2e-6) <= 1e-6 * max(1.0, abs(grad.item()))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    lengthscale0 = nystrom.base_kernel.lengthscale.item()
    losses = []
    for _ in range(12):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        assert float(nystrom.base_kernel.raw_lengthscale.grad.abs().sum()) > 0
        optimizer.step()
        losses.append(loss.item())
    assert nystrom.base_kernel.lengthscale.item() > lengthscale0 + 0.2
    assert losses[-1] < losses[0] - 0.1
    model.eval()
    with torch.no_grad():
        pred = likelihood(model(torch.linspace(0, 4, 7, dtype=dtype).unsqueeze(-1)))
    assert pred.mean.shape == (7,) and bool(torch.isfinite(pred.variance).all())

"""RandomFourierFeaturesKernel: GPyTorch's kernel suite, convergence to the exact kernels, errors."""

from __future__ import annotations

import math
import pickle
import unittest
import warnings

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from linear_operator.operators import (
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.kernels.random_fourier_features_kernel import RandomFourierFeaturesKernel

BASES = ("rbf", "matern12", "matern32", "matern52")


def _exact(base: str, **kwargs) -> gpytorch.kernels.Kernel:
    """GPyTorch's exact kernel that ``base`` approximates."""
    if base == "rbf":
        return gpytorch.kernels.RBFKernel(**kwargs)
    nu = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[base]
    return gpytorch.kernels.MaternKernel(nu=nu, **kwargs)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------- GPyTorch's suite
class _SuiteForBase(BaseKernelTestCase):
    """GPyTorch's kernel tests; the kernels share a seed so that separate instances agree."""

    base = "rbf"
    seed = 0

    def create_kernel_no_ard(self, **kwargs):
        return RandomFourierFeaturesKernel(64, self.base, generator=_gen(3), **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return RandomFourierFeaturesKernel(
            64, self.base, ard_num_dims=num_dims, generator=_gen(3), **kwargs
        )


class TestRFFSuiteRBF(_SuiteForBase, unittest.TestCase):
    base = "rbf"


class TestRFFSuiteMatern12(_SuiteForBase, unittest.TestCase):
    base = "matern12"


class TestRFFSuiteMatern32(_SuiteForBase, unittest.TestCase):
    base = "matern32"


class TestRFFSuiteMatern52(_SuiteForBase, unittest.TestCase):
    base = "matern52"


# ---------------------------------------------------------------------- references
@pytest.mark.parametrize("base", BASES)
def test_converges_to_exact_kernel_at_monte_carlo_rate(base):
    """Mean absolute error against GPyTorch's exact kernel falls like S^(-1/2).

    Independent frequency draws for 16 seeds come from one batched kernel; the log-log slope
    of the seed-averaged error over S = 64 ... 4096 is fitted by least squares.  A wrong
    spectral measure (e.g. Matern frequencies off by sqrt(2)) leaves a bias and flattens it.
    """
    seeds, d = 16, 2
    x = torch.randn(12, d, generator=_gen(1), dtype=torch.float64)
    ls = torch.tensor([[0.8, 1.5]], dtype=torch.float64)
    exact = _exact(base, ard_num_dims=d).double()
    exact.lengthscale = ls
    with torch.no_grad():
        k_exact = exact(x).to_dense()
    sizes = [64, 256, 1024, 4096]
    errors = []
    for s in sizes:
        kernel = RandomFourierFeaturesKernel(
            s, base, ard_num_dims=d, batch_shape=torch.Size([seeds]), generator=_gen(s)
        ).double()
        kernel.lengthscale = ls.expand(seeds, 1, d)
        with torch.no_grad():
            phi = kernel.featurize(x)  # shape: (seeds, N, 2S)
        errors.append(float((phi @ phi.mT - k_exact).abs().mean()))
    logs, loge = torch.tensor(sizes).double().log(), torch.tensor(errors).log()
    slope = float(
        ((logs - logs.mean()) * (loge - loge.mean())).sum() / (logs - logs.mean()).square().sum()
    )
    print(f"{base}: errors {errors}, slope {slope:.3f}")
    assert -0.7 <= slope <= -0.3, (slope, errors)
    assert errors[-1] < 0.02  # and it goes to the exact kernel, not to a biased one


def test_spectral_measure_of_matern_is_student_t():
    """E[cos(omega tau)] over 2^17 one-dimensional frequencies matches each exact kernel."""
    tau = torch.linspace(0.0, 4.0, 9, dtype=torch.float64)[:, None]
    for base in BASES:
        kernel = RandomFourierFeaturesKernel(2**17, base, num_dims=1, generator=_gen(5)).double()
        approx = kernel.forward(tau[:1], tau).to_dense()[0]
        exact = _exact(base).double()(tau[:1], tau).to_dense()[0]
        # standard error of the mean of cosines <= (2 * 2^17)^(-1/2) ~ 0.002
        assert (approx - exact).abs().max() < 0.01, base


@pytest.mark.parametrize("base", BASES)
def test_featurize_matches_forward_and_operator_types(base):
    kernel = RandomFourierFeaturesKernel(8, base, ard_num_dims=3, generator=_gen()).double()
    kernel.lengthscale = torch.tensor([0.5, 1.0, 2.0])
    x1 = torch.randn(20, 3, dtype=torch.float64)
    x2 = torch.randn(7, 3, dtype=torch.float64)
    p1, p2 = kernel.featurize(x1), kernel.featurize(x2)
    assert p1.shape == (20, 16)
    square = kernel.forward(x1, x1)
    assert isinstance(square, LowRankRootLinearOperator)  # 16 features < 20 points
    torch.testing.assert_close(square.to_dense(), p1 @ p1.T)
    assert isinstance(kernel.forward(x2, x2), RootLinearOperator)  # 16 features >= 7 points
    cross = kernel.forward(x1, x2)
    assert isinstance(cross, MatmulLinearOperator)
    torch.testing.assert_close(cross.to_dense(), p1 @ p2.T)
    torch.testing.assert_close(kernel(x1, x2).to_dense(), p1 @ p2.T)
    # diag: cos^2 + sin^2 = 1 on the diagonal, and the diagonal of the cross matrix otherwise
    torch.testing.assert_close(kernel(x1, diag=True), torch.ones(20, dtype=torch.float64))
    torch.testing.assert_close(kernel(x2, x1[:7], diag=True), (p2 * p1[:7]).sum(-1))


def test_featurize_applies_active_dims():
    kernel = RandomFourierFeaturesKernel(16, "matern32", active_dims=[0, 2], generator=_gen())
    x = torch.randn(5, 4)
    phi = kernel.featurize(x)
    torch.testing.assert_close(phi @ phi.T, kernel(x).to_dense())
    assert kernel.num_dims == 2


@pytest.mark.parametrize("base", ["rbf", "matern12"])
def test_lengthscale_gradient(base):
    """Autograd gradient = the explicit derivative of (1/S) sum_s cos(omega_s' (x - x') / ell)."""
    kernel = RandomFourierFeaturesKernel(32, base, ard_num_dims=2, generator=_gen()).double()
    ell = torch.tensor([0.7, 1.6], dtype=torch.float64)
    kernel.lengthscale = ell
    x1 = torch.randn(6, 2, dtype=torch.float64, generator=_gen(1))
    x2 = torch.randn(4, 2, dtype=torch.float64, generator=_gen(2))
    weights = torch.randn(6, 4, dtype=torch.float64, generator=_gen(3))
    loss = (kernel(x1, x2).to_dense() * weights).sum()
    (grad_raw,) = torch.autograd.grad(loss, kernel.raw_lengthscale)
    # explicit: d cos(a) / d ell_j = sin(a) omega_j delta_j / ell_j^2, a = sum_j omega_j delta_j / ell_j
    omega = kernel.omega  # shape: (2, S)
    delta = x1[:, None, :] - x2[None, :, :]  # shape: (6, 4, 2)
    a = (delta / ell) @ omega  # shape: (6, 4, S)
    dk = (a.sin()[..., None, :] * omega * (delta / ell.square())[..., None]).mean(-1)
    grad_ell = (weights[..., None] * dk).sum((0, 1))  # shape: (2,)
    # chain rule through the positivity constraint
    raw = kernel.raw_lengthscale.detach().requires_grad_(True)
    (expected_raw,) = torch.autograd.grad(
        kernel.raw_lengthscale_constraint.transform(raw), raw, grad_ell.reshape(1, 2)
    )
    torch.testing.assert_close(grad_raw, expected_raw)
    # finite differences of the loss in ell
    eps = 1e-6
    for j in range(2):
        with torch.no_grad():
            step = torch.zeros(2, dtype=torch.float64)
            step[j] = eps
            kernel.lengthscale = ell + step
            up = float((kernel(x1, x2).to_dense() * weights).sum())
            kernel.lengthscale = ell - step
            down = float((kernel(x1, x2).to_dense() * weights).sum())
        # heavy-tailed Matern-1/2 frequencies make the loss steep: a relative tolerance
        assert (up - down) / (2 * eps) == pytest.approx(float(grad_ell[j]), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("base", BASES)
def test_dtypes_share_frequencies(dtype, base):
    """Drawn frequencies follow .to(dtype), and a seeded kernel is the same in both dtypes."""
    kernel = RandomFourierFeaturesKernel(2048, base, ard_num_dims=2, generator=_gen(7)).to(dtype)
    reference = RandomFourierFeaturesKernel(2048, base, ard_num_dims=2, generator=_gen(7)).double()
    assert kernel.omega.dtype == dtype and kernel.lengthscale.dtype == dtype
    x = torch.randn(10, 2, dtype=torch.float64)
    phi = kernel.featurize(x.to(dtype))
    assert phi.dtype == dtype
    tol = 1e-3 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(phi.double(), reference.featurize(x), rtol=tol, atol=tol)
    exact = _exact(base).double()(x).to_dense()
    assert (kernel(x.to(dtype)).to_dense().double() - exact).abs().max() < 0.15
    kernel.resample(_gen(8))  # a redraw is made in the module's dtype
    assert kernel.omega.dtype == dtype and kernel.featurize(x.to(dtype)).dtype == dtype


def test_batch_shapes_and_last_dim_is_batch():
    kernel = RandomFourierFeaturesKernel(
        16, "matern52", ard_num_dims=3, batch_shape=torch.Size([2]), generator=_gen()
    )
    assert kernel.omega.shape == (2, 3, 16)
    x = torch.randn(2, 5, 3)
    assert kernel.featurize(x).shape == (2, 5, 32)
    assert kernel(x).shape == (2, 5, 5)
    assert kernel(torch.randn(4, 1, 5, 3)).shape == (4, 2, 5, 5)  # broadcast batch
    # last_dim_is_batch: dimension j is a 1-D kernel with frequencies omega[..., j, :]
    x2 = torch.randn(2, 4, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        full = kernel(x, x2, last_dim_is_batch=True).to_dense()
        diag = kernel(x, last_dim_is_batch=True, diag=True)
    assert full.shape == (2, 3, 5, 4) and diag.shape == (2, 3, 5)
    ell = kernel.lengthscale.detach()  # shape: (2, 1, 3)
    for j in range(3):
        one_d = RandomFourierFeaturesKernel(16, "matern52", batch_shape=torch.Size([2]))
        one_d.load_state_dict({"raw_lengthscale": kernel.raw_lengthscale[..., j : j + 1],
                               "omega": kernel.omega[..., j : j + 1, :]})  # fmt: skip
        assert torch.equal(one_d.lengthscale, ell[..., j : j + 1])
        expected = one_d(x[..., j : j + 1], x2[..., j : j + 1]).to_dense()
        torch.testing.assert_close(full[:, j], expected)
    torch.testing.assert_close(diag, torch.ones(2, 3, 5))


def test_seeding_resample_and_lazy_draw():
    x = torch.randn(6, 3)
    lazy = RandomFourierFeaturesKernel(8, "matern32", generator=_gen(1))
    assert lazy.num_dims is None and lazy.omega.shape == (0, 8)
    again = RandomFourierFeaturesKernel(8, "matern32", generator=_gen(1))
    torch.testing.assert_close(lazy(x).to_dense(), again(x).to_dense())  # same seed, same draw
    assert lazy.num_dims == 3 and lazy.omega.shape == (3, 8)
    eager = RandomFourierFeaturesKernel(8, "matern32", num_dims=3, generator=_gen(2))
    before = eager.omega.clone()
    eager.resample(_gen(2))
    assert torch.equal(eager.omega, before)
    eager.resample(_gen(3))
    assert not torch.equal(eager.omega, before)
    # lengthscale is kept by resample
    eager.lengthscale = 2.0
    eager.resample()
    torch.testing.assert_close(eager.lengthscale, torch.tensor([[2.0]]))


def test_state_dict_round_trip_and_pickle():
    kernel = RandomFourierFeaturesKernel(16, "matern12", num_dims=2, generator=_gen())
    kernel.lengthscale = 0.3
    state = kernel.state_dict()
    assert state["omega"].shape == (2, 16) and "raw_lengthscale" in state
    x = torch.randn(5, 2)
    # an eagerly drawn kernel (different frequencies) and an undrawn (lazy) one both adopt them
    for fresh in (
        RandomFourierFeaturesKernel(16, "matern12", num_dims=2, generator=_gen(9)),
        RandomFourierFeaturesKernel(16, "matern12"),
    ):
        fresh.load_state_dict(state)
        assert torch.equal(fresh.omega, kernel.omega)
        torch.testing.assert_close(fresh(x).to_dense(), kernel(x).to_dense())
    copy = pickle.loads(pickle.dumps(kernel))
    torch.testing.assert_close(copy(x).to_dense(), kernel(x).to_dense())
    double = kernel.double()
    assert double.omega.dtype == torch.float64


def test_scale_kernel_in_exact_gp():
    """Wrapped in a ScaleKernel inside an ExactGP, the RFF GP matches the feature-space posterior."""
    gen = _gen(4)
    x = torch.rand(30, 1, generator=gen, dtype=torch.float64) * 4
    y = torch.sin(2 * x[:, 0])
    covar = gpytorch.kernels.ScaleKernel(
        RandomFourierFeaturesKernel(10, "matern32", num_dims=1, generator=gen)
    ).double()
    covar.outputscale = 1.5

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood().double())
            self.covar_module = covar

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(
                torch.zeros(z.shape[:-1], dtype=z.dtype), self.covar_module(z)
            )

    model = GP()
    model.likelihood.noise = 0.1
    model.eval()
    xt = torch.linspace(0, 4, 7, dtype=torch.float64)[:, None]
    with torch.no_grad():
        post = model(xt)
    phi, phit = covar.base_kernel.featurize(x), covar.base_kernel.featurize(xt)
    a = phi.T @ phi / 0.1 + torch.eye(20, dtype=torch.float64) / 1.5
    mean = phit @ torch.linalg.solve(a, phi.T @ y) / 0.1
    var = (phit * torch.linalg.solve(a, phit.T).T).sum(-1)
    torch.testing.assert_close(post.mean, mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(post.variance, var, rtol=1e-4, atol=1e-5)


class TestErrors:
    def test_constructor(self):
        with pytest.raises(InputDataError, match="'matern72'"):
            RandomFourierFeaturesKernel(8, "matern72")
        with pytest.raises(InputTypeError, match="num_samples"):
            RandomFourierFeaturesKernel(8.5)
        with pytest.raises(InputDataError, match="num_samples"):
            RandomFourierFeaturesKernel(0)
        with pytest.raises(InputDataError, match="ard_num_dims = 3"):
            RandomFourierFeaturesKernel(8, num_dims=2, ard_num_dims=3)
        with pytest.raises(InputTypeError, match="torch.Generator"):
            RandomFourierFeaturesKernel(8, generator=0)
        with pytest.raises(InputTypeError, match="torch.Generator"):
            RandomFourierFeaturesKernel(8).resample(generator=math.pi)

    def test_inputs(self):
        kernel = RandomFourierFeaturesKernel(8, num_dims=2, generator=_gen())
        with pytest.raises(ShapeError, match="2 columns"):
            kernel(torch.randn(4, 3)).to_dense()
        with pytest.raises(ShapeError, match="2 columns"):
            kernel.featurize(torch.randn(4, 3))
        with pytest.raises(ShapeError, match="unsqueeze"):
            kernel.featurize(torch.randn(4))
        with pytest.raises(InputTypeError, match="floating-point"):
            kernel.featurize(torch.ones(4, 2, dtype=torch.long))
        with pytest.raises(InputTypeError, match="floating-point"):
            kernel.featurize([[0.0, 1.0]])

"""NeuralTangentKernel: GPyTorch's kernel suite, wide-network references and quadrature.

References: the empirical tangent kernel of wide ``EnsembleMLP`` networks at VBootMLP's own
initialisation (J J^T by autograd over every parameter), Monte Carlo over many random
initialisations for the NNGP covariance, and scipy quadrature of the one-layer arc-cosine
expectations.
"""

import math
import unittest
import warnings

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase
from scipy import integrate

from gpext.bootstrap import EnsembleMLP, VBootMLP
from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.kernels.neural_tangent_kernel import NeuralTangentKernel

DTYPES = [torch.float32, torch.float64]


# --------------------------------------------------------------------------- GPyTorch suite
class TestNeuralTangentKernelSuite(BaseKernelTestCase, unittest.TestCase):
    seed = 0
    kind = "ntk"

    def create_kernel_no_ard(self, **kwargs):
        return NeuralTangentKernel(
            2, weight_variance=1.3, bias_variance=0.4, kind=self.kind, **kwargs
        )


class TestNNGPKernelSuite(TestNeuralTangentKernelSuite):
    kind = "nngp"


class _Float64:
    def setUp(self):
        self._old_dtype = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        super().setUp()

    def tearDown(self):
        super().tearDown()
        torch.set_default_dtype(self._old_dtype)


class TestNeuralTangentKernelSuiteFloat64(_Float64, TestNeuralTangentKernelSuite):
    pass


class TestNNGPKernelSuiteFloat64(_Float64, TestNNGPKernelSuite):
    pass


# --------------------------------------------------------------------------- helpers
def _points(dtype, n=8, d=3, seed=0):
    """Random points plus the awkward cases: the origin, an antipodal pair, a rescaled copy."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, d, generator=gen, dtype=torch.float64)
    x[0] = 0.0
    x[2] = -x[1]
    x[3] = 2.5 * x[4]
    return x.to(dtype)


def _rel_fro(a, b):
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def _empirical_ntk(net, x, weight_scale, bias_scale):
    """Per-particle prior-weighted tangent kernel J P J^T by autograd, ``(K, N, N)``.

    ``P`` multiplies weight gradients by ``weight_scale`` and bias gradients by ``bias_scale``
    (the prior variances); with both equal to 1 this is the plain J J^T.
    """
    out = net(x)[..., 0]  # shape: (K, N)
    params = net.stacked_parameters()
    scales = [weight_scale] * len(net.weights) + [bias_scale] * len(net.biases)
    grads = [
        torch.autograd.grad(out[:, i].sum(), params, retain_graph=True) for i in range(x.shape[0])
    ]
    gram = x.new_zeros(net.num_particles, x.shape[0], x.shape[0])
    for p, scale in enumerate(scales):
        jp = torch.stack([g[p].flatten(1) for g in grads], 1)  # shape: (K, N, P_p)
        gram += scale * (jp @ jp.transpose(1, 2))
    return gram


@pytest.fixture(scope="module")
def vboot_reference():
    """Empirical NTK of three width-2048 VBootMLP networks at their anchors (prior_std 0.8)."""
    hidden, alpha, k = (2048, 2048), 0.8, 3
    x = _points(torch.float32, n=7)
    model = VBootMLP(k, hidden_sizes=hidden, prior_std=alpha, seed=3)
    net = EnsembleMLP(k, x.shape[1], 1, hidden, dtype=torch.float32)
    for i in range(k):  # exactly VBootMLP's initial weights: the anchors of 001 Eq. (6)
        net.load_particle(i, [t.float() for t in model.draw_anchors(i, x.shape[1], 1)])
    raw = _empirical_ntk(net, x, 1.0, 1.0)  # J J^T
    return model, x, raw


# --------------------------------------------------------------------------- empirical NTK
@pytest.mark.parametrize("dtype", DTYPES)
def test_ntk_matches_empirical_tangent_kernel_of_vboot_network(vboot_reference, dtype):
    model, x, raw = vboot_reference
    kernel = NeuralTangentKernel.from_vboot_mlp(model).to(dtype)
    assert kernel.num_layers == 2 and kernel.kind == "ntk"
    torch.testing.assert_close(kernel.weight_variance, torch.tensor(0.64, dtype=dtype))
    torch.testing.assert_close(kernel.bias_variance, torch.tensor(0.64, dtype=dtype))
    with torch.no_grad():
        theta = kernel(x.to(dtype)).to_dense().double()
    alpha2 = model.prior_std**2
    empirical = (alpha2 * raw).double()
    err = _rel_fro(empirical.mean(0), theta)
    assert err < 0.05, err  # measured 0.023 (mean of three networks of width 2048)
    for one in empirical:  # every single network is already close (measured 0.012-0.034)
        assert _rel_fro(one, theta) < 0.08
    # the raw gradient Gram J J^T is the kernel divided by prior_std**2
    assert _rel_fro(raw.double().mean(0), theta / alpha2) < 0.05


def test_ntk_with_separate_weight_and_bias_variances_matches_prior_weighted_jacobian():
    """One hidden layer of width 8192, sigma_w^2 = 1.6, sigma_b^2 = 0.25: J P J^T."""
    sw, sb, k, width = 1.6, 0.25, 2, 8192
    x = _points(torch.float64, n=7, seed=1)
    gen = torch.Generator().manual_seed(5)
    net = EnsembleMLP(k, x.shape[1], 1, (width,), dtype=torch.float64)
    with torch.no_grad():
        for w in net.weights:
            w.copy_(torch.randn(w.shape, generator=gen, dtype=w.dtype) * math.sqrt(sw))
        for b in net.biases:
            b.copy_(torch.randn(b.shape, generator=gen, dtype=b.dtype) * math.sqrt(sb))
    empirical = _empirical_ntk(net, x, sw, sb).mean(0)
    for dtype in DTYPES:
        kernel = NeuralTangentKernel(1, sw, sb, "ntk").to(dtype)
        with torch.no_grad():
            theta = kernel(x.to(dtype)).to_dense().double()
        err = _rel_fro(empirical, theta)
        assert err < 0.03, err  # measured 0.009


# --------------------------------------------------------------------------- NNGP by Monte Carlo
@pytest.fixture(scope="module")
def monte_carlo_nngp():
    """E[f(x) f(x')] over 4000 random width-256 networks (2 hidden layers, prior_std 0.8)."""
    alpha, hidden, samples, chunk = 0.8, (256, 256), 4000, 500
    x = _points(torch.float32, n=7, seed=2)
    gen = torch.Generator().manual_seed(11)
    second = torch.zeros(x.shape[0], x.shape[0], dtype=torch.float64)
    for _ in range(samples // chunk):
        net = EnsembleMLP(chunk, x.shape[1], 1, hidden, dtype=torch.float32)
        with torch.no_grad():
            for p in net.stacked_parameters():  # VBootMLP's prior N(0, alpha^2) on everything
                p.copy_(torch.randn(p.shape, generator=gen) * alpha)
            f = net(x)[..., 0].double()  # shape: (chunk, N)
        second += f.T @ f
    return alpha, samples, x, second / samples


@pytest.mark.parametrize("dtype", DTYPES)
def test_nngp_matches_monte_carlo_covariance_of_random_networks(monte_carlo_nngp, dtype):
    alpha, samples, x, empirical = monte_carlo_nngp
    kernel = NeuralTangentKernel(2, alpha**2, alpha**2, "nngp").to(dtype)
    with torch.no_grad():
        sigma = kernel(x.to(dtype)).to_dense().double()
    # Monte Carlo standard error of a mean of f_i f_j for Gaussian f
    dg = sigma.diagonal()
    stderr = ((dg[:, None] * dg[None, :] + sigma**2) / samples).sqrt()
    z = (empirical - sigma).abs() / stderr
    assert float(z.max()) < 4.5, float(z.max())  # measured 1.2
    assert _rel_fro(empirical, sigma) < 0.06  # measured 0.023, the size of the MC error


# --------------------------------------------------------------------------- quadrature
def _gauss_expectation(cov, fn):
    """E[fn(u, v)] over the positive quadrant of N(0, cov) by scipy.dblquad (fn = 0 elsewhere)."""
    det = cov[0, 0] * cov[1, 1] - cov[0, 1] ** 2
    inv = np.linalg.inv(cov)

    def integrand(v, u):
        quad = inv[0, 0] * u * u + 2 * inv[0, 1] * u * v + inv[1, 1] * v * v
        return fn(u, v) * math.exp(-0.5 * quad) / (2 * math.pi * math.sqrt(det))

    su, sv = math.sqrt(cov[0, 0]), math.sqrt(cov[1, 1])
    val, _ = integrate.dblquad(integrand, 0, 12 * su, 0, 12 * sv, epsabs=1e-11, epsrel=1e-9)
    return val


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_layer_arc_cosine_closed_form_against_quadrature(dtype):
    r"""Sigma^2 = s_w E[relu(u) relu(v)] + s_b and Theta^2 - Sigma^2 = Sigma^1 s_w P(u>0, v>0)."""
    sw, sb = 1.4, 0.3
    x = _points(torch.float64, n=6, seed=4)
    pairs = [(0, 1), (1, 2), (3, 4), (1, 5), (2, 3)]  # origin, antipodal, parallel, ...
    nngp = NeuralTangentKernel(1, sw, sb, "nngp").to(dtype)
    ntk = NeuralTangentKernel(1, sw, sb, "ntk").to(dtype)
    with torch.no_grad():
        k_nngp = nngp(x.to(dtype)).to_dense().double()
        k_ntk = ntk(x.to(dtype)).to_dense().double()
    tol = 2e-6 if dtype == torch.float32 else 1e-6  # float64: limited by dblquad (~1e-7)
    d = x.shape[1]
    for i, j in pairs:
        gram = (sw * (x[[i, j]] @ x[[i, j]].T) / d + sb).numpy()  # Sigma^1 on the pair
        relu = _gauss_expectation(gram, lambda u, v: u * v)
        orthant = _gauss_expectation(gram, lambda u, v: 1.0)
        torch.testing.assert_close(
            k_nngp[i, j], torch.tensor(sw * relu + sb, dtype=torch.float64), rtol=tol, atol=tol
        )
        torch.testing.assert_close(
            k_ntk[i, j] - k_nngp[i, j],
            torch.tensor(gram[0, 1] * sw * orthant, dtype=torch.float64),
            rtol=10 * tol,
            atol=10 * tol,
        )
    for i in range(x.shape[0]):  # the diagonal: a one-dimensional Gaussian integral
        q = float(sw * x[i].square().sum() / d + sb)
        second, _ = integrate.quad(
            lambda u, q=q: u * u * math.exp(-0.5 * u * u / q) / math.sqrt(2 * math.pi * q),
            0,
            np.inf,
        )
        expected = torch.tensor(sw * second + sb, dtype=torch.float64)
        torch.testing.assert_close(k_nngp[i, i], expected, rtol=tol, atol=tol)
        torch.testing.assert_close(
            k_ntk[i, i] - k_nngp[i, i],
            torch.tensor(q * sw * 0.5, dtype=torch.float64),
            rtol=10 * tol,
            atol=10 * tol,
        )


# --------------------------------------------------------------------------- properties
@pytest.mark.parametrize("kind", ["ntk", "nngp"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_symmetric_psd_and_diag_consistent(kind, dtype):
    x = _points(dtype, n=12, d=4, seed=6)
    x = torch.cat([x, x[:3]])  # exact duplicates, the origin among them
    kernel = NeuralTangentKernel(3, 0.9, 0.2, kind).to(dtype)
    with torch.no_grad():
        mat = kernel(x).to_dense()
        dg = kernel(x, diag=True)
    torch.testing.assert_close(mat, mat.T, rtol=0, atol=0)
    tol = 1e-6 if dtype == torch.float32 else 1e-13
    torch.testing.assert_close(dg, mat.diagonal(), rtol=tol, atol=tol)
    eig = torch.linalg.eigvalsh(mat.double())
    assert float(eig.min()) > -1e-5 * float(eig.max())
    # the duplicated rows give identical rows of the matrix
    torch.testing.assert_close(mat[12:], mat[:3], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ntk_minus_nngp_is_psd_and_equal_without_hidden_layers(dtype):
    x = _points(dtype, n=9, d=2, seed=7)
    with torch.no_grad():
        for layers in (1, 2, 4):
            diff = (
                NeuralTangentKernel(layers, 1.1, 0.5, "ntk").to(dtype)(x).to_dense()
                - NeuralTangentKernel(layers, 1.1, 0.5, "nngp").to(dtype)(x).to_dense()
            )
            eig = torch.linalg.eigvalsh(diff.double())
            assert float(eig.min()) > -1e-5 * float(eig.max()) and float(eig.max()) > 0.1
        linear = 1.1 * (x @ x.T) / 2 + 0.5
        for kind in ("ntk", "nngp"):
            torch.testing.assert_close(
                NeuralTangentKernel(0, 1.1, 0.5, kind).to(dtype)(x).to_dense(), linear
            )


def test_float32_agrees_with_float64_including_near_duplicates():
    x = _points(torch.float64, n=10, d=5, seed=8)
    x = torch.cat([x, x[5:] + 1e-4 * torch.randn(5, 5, generator=torch.Generator().manual_seed(0))])
    for kind in ("ntk", "nngp"):
        kernel = NeuralTangentKernel(3, 1.2, 0.3, kind)
        with torch.no_grad():
            k64 = kernel.double()(x).to_dense()
            k32 = kernel.float()(x.float()).to_dense().double()
        torch.testing.assert_close(k32, k64, rtol=2e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["ntk", "nngp"])
def test_gradients_finite_on_diagonal_duplicates_and_origin(kind):
    x = _points(torch.float64, n=8, d=3, seed=9)
    x = torch.cat([x, x[:3]])  # exact duplicates, the origin among them
    kernel = NeuralTangentKernel(2, 1.0, 0.1, kind).double()
    xr = x.clone().requires_grad_(True)
    kernel(xr).to_dense().sum().backward()
    for t in (xr.grad, kernel.raw_weight_variance.grad, kernel.raw_bias_variance.grad):
        assert t is not None and bool(torch.isfinite(t).all())
    # away from coinciding directions the analytic gradient is right
    y = _points(torch.float64, n=5, d=3, seed=10)[1:] + 0.1
    z = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    args = (
        torch.tensor(0.3, dtype=torch.float64, requires_grad=True),
        torch.tensor(-0.7, dtype=torch.float64, requires_grad=True),
        y.clone().requires_grad_(True),
    )
    assert torch.autograd.gradcheck(lambda w, b, inp: _kernel_fn(kind, w, b, inp, z), args)


def _kernel_fn(kind, raw_w, raw_b, inputs, z):
    """Kernel matrix as a differentiable function of the raw variances and the inputs."""
    kernel = NeuralTangentKernel(2, 1.0, 0.1, kind).double()
    del kernel.raw_weight_variance, kernel.raw_bias_variance
    kernel.raw_weight_variance, kernel.raw_bias_variance = raw_w, raw_b
    return kernel.forward(inputs, z)


def test_exact_gp_marginal_likelihood_trains_the_variances():
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(30, dtype=torch.float64)

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = NeuralTangentKernel(
                2, weight_variance_prior=gpytorch.priors.GammaPrior(2.0, 2.0)
            )

        def forward(self, inp):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(inp), self.covar_module(inp)
            )

    model = GP().double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(30):
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    kernel = model.covar_module
    assert kernel.weight_variance.item() != 1.0 and kernel.bias_variance.item() != 1.0


def test_batch_kernel_equals_separate_kernels_and_getitem():
    kernel = NeuralTangentKernel(2, batch_shape=torch.Size([2]))
    kernel.weight_variance = torch.tensor([0.5, 2.0])
    kernel.bias_variance = torch.tensor([1.5, 0.1])
    x = torch.randn(2, 6, 3)
    with torch.no_grad():
        batch = kernel(x).to_dense()
        batch_diag = kernel(x, diag=True)
        for b, (w, s) in enumerate([(0.5, 1.5), (2.0, 0.1)]):
            single = NeuralTangentKernel(2, w, s)(x[b]).to_dense()
            torch.testing.assert_close(batch[b], single)
            torch.testing.assert_close(batch_diag[b], single.diagonal())
            torch.testing.assert_close(kernel[b](x[b]).to_dense(), single)


@pytest.mark.parametrize("kind", ["ntk", "nngp"])
def test_paired_diag_and_last_dim_is_batch(kind):
    kernel = NeuralTangentKernel(2, 0.8, 0.6, kind)
    x1, x2 = torch.randn(5, 3), torch.randn(5, 3)
    with torch.no_grad():
        full = kernel(x1, x2).to_dense()
        torch.testing.assert_close(kernel(x1, x2, diag=True), full.diagonal())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            per_dim = kernel(x1, x2, last_dim_is_batch=True).to_dense()
            per_dim_diag = kernel(x1, x1, diag=True, last_dim_is_batch=True)
        assert per_dim.shape == (3, 5, 5) and per_dim_diag.shape == (3, 5)
        for j in range(3):
            ref = kernel(x1[:, j : j + 1], x2[:, j : j + 1]).to_dense()
            torch.testing.assert_close(per_dim[j], ref)
            torch.testing.assert_close(
                per_dim_diag[j], kernel(x1[:, j : j + 1], diag=True), rtol=1e-5, atol=1e-6
            )


def test_pickle_with_priors_and_active_dims():
    import pickle

    kernel = NeuralTangentKernel(
        1,
        active_dims=[0, 2],
        weight_variance_prior=gpytorch.priors.GammaPrior(2.0, 2.0),
        bias_variance_prior=gpytorch.priors.GammaPrior(2.0, 4.0),
    )
    clone = pickle.loads(pickle.dumps(kernel))
    x = torch.randn(4, 3)
    torch.testing.assert_close(clone(x).to_dense(), kernel(x).to_dense())
    torch.testing.assert_close(
        kernel(x).to_dense(), NeuralTangentKernel(1)(x[:, [0, 2]]).to_dense()
    )
    names = {name for name, *_ in kernel.named_priors()}
    assert names == {"weight_variance_prior", "bias_variance_prior"}


# --------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(num_layers=-1), InputDataError, "num_layers"),
        (dict(num_layers=2.0), InputTypeError, "num_layers"),
        (dict(num_layers=True), InputTypeError, "num_layers"),
        (dict(kind="gp"), InputDataError, "'ntk' or 'nngp'"),
        (dict(kind=None), InputTypeError, "kind"),
        (dict(weight_variance=0.0), InputDataError, "weight_variance"),
        (dict(weight_variance=float("nan")), InputDataError, "weight_variance"),
        (dict(bias_variance=-1.0), InputDataError, "bias_variance"),
        (dict(bias_variance=0.0), InputDataError, "small positive bias_variance"),
        (dict(weight_variance="big"), InputTypeError, "weight_variance"),
        (dict(weight_variance_prior=object()), InputTypeError, "Prior"),
    ],
)
def test_bad_constructor_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        NeuralTangentKernel(**kwargs)


def test_bad_call_and_setter_arguments():
    kernel = NeuralTangentKernel()
    with pytest.raises(ShapeError, match="same number of rows"):
        kernel(torch.randn(4, 2), torch.randn(3, 2), diag=True)
    with pytest.raises(InputDataError, match="weight_variance"):
        kernel.weight_variance = -2.0
    with pytest.raises(InputDataError, match="bias_variance"):
        kernel.bias_variance = torch.tensor([1.0, 0.0])
    with pytest.raises(InputTypeError, match="VBootMLP"):
        NeuralTangentKernel.from_vboot_mlp(object())
    assert issubclass(InputDataError, ValueError) and issubclass(InputTypeError, TypeError)


def test_from_vboot_mlp_maps_the_configuration():
    model = VBootMLP(3, hidden_sizes=(64, 32, 16), prior_std=0.5)
    kernel = NeuralTangentKernel.from_vboot_mlp(model, kind="nngp")
    assert kernel.num_layers == 3 and kernel.kind == "nngp"
    torch.testing.assert_close(kernel.weight_variance, torch.tensor(0.25))
    torch.testing.assert_close(kernel.bias_variance, torch.tensor(0.25))
    default = NeuralTangentKernel.from_vboot_mlp(VBootMLP())
    assert default.num_layers == NeuralTangentKernel().num_layers == 2
    torch.testing.assert_close(default.weight_variance, NeuralTangentKernel().weight_variance)

"""FeatureMapKernel: GPyTorch's kernel suite, references against hand-written compositions."""

import pickle
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.kernels.feature_map_kernel import FeatureMapKernel
from gpext.nn import MLP


class _AnyWidthFeatures(torch.nn.Module):
    """tanh(x W[:D] + b) for any input width D <= 16: deterministic weights from a seed."""

    out_features = 3

    def __init__(self, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(16, 3, generator=gen))
        self.bias = torch.nn.Parameter(torch.randn(3, generator=gen))

    def forward(self, x):
        return torch.tanh(x @ self.weight[: x.shape[-1]].to(x) + self.bias.to(x))


class TestFeatureMapKernel(BaseKernelTestCase, unittest.TestCase):
    seed = 0

    def create_kernel_no_ard(self, **kwargs):
        return FeatureMapKernel(_AnyWidthFeatures(), ard=False, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return FeatureMapKernel(_AnyWidthFeatures(), ard=True, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_equals_hand_written_composition(dtype):
    torch.manual_seed(0)
    net = MLP(3, [16], 4).to(dtype)
    kernel = FeatureMapKernel(net).to(dtype)
    with torch.no_grad():
        kernel.base_kernel.base_kernel.lengthscale = torch.tensor([[0.5, 1.0, 2.0, 3.0]])
        kernel.base_kernel.outputscale = 1.7
    x1, x2 = torch.randn(7, 3, dtype=dtype), torch.randn(5, 3, dtype=dtype)
    ref = kernel.base_kernel(net(x1), net(x2)).to_dense()
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(kernel(x1, x2).to_dense(), ref, **tol)
    torch.testing.assert_close(kernel(x1, diag=True), kernel.base_kernel(net(x1), diag=True), **tol)
    assert kernel.base_kernel.base_kernel.lengthscale.shape == (1, 4)  # ARD over features


def test_extractor_runs_once_for_the_training_covariance():
    calls = []
    net = MLP(2, [8], 3)
    net.register_forward_hook(lambda *a: calls.append(1))
    kernel = FeatureMapKernel(net)
    x = torch.randn(6, 2)
    kernel(x).to_dense()
    assert len(calls) == 1
    kernel(x, torch.randn(4, 2)).to_dense()
    assert len(calls) == 3


def test_last_dim_is_batch_treats_features_as_batch():
    torch.manual_seed(1)
    net = MLP(2, [8], 3)
    base = gpytorch.kernels.RBFKernel()
    kernel = FeatureMapKernel(net, base)
    x1, x2 = torch.randn(5, 2), torch.randn(4, 2)
    with pytest.warns(DeprecationWarning):
        out = kernel(x1, x2, last_dim_is_batch=True).to_dense()
    assert out.shape == (3, 5, 4)  # (d, N, M), not (D, N, M)
    f1, f2 = net(x1), net(x2)
    for j in range(3):
        torch.testing.assert_close(out[j], base(f1[:, j : j + 1], f2[:, j : j + 1]).to_dense())


def test_exact_gp_trains_network_and_hyperparameters():
    """Marginal likelihood gradients reach the network: a deep-kernel GP fits a step."""
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 60, dtype=torch.float64)[:, None]
    y = torch.sign(x[:, 0]) + 0.05 * torch.randn(60, dtype=torch.float64)

    class GP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = FeatureMapKernel(MLP(1, [32], 2))

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(z), self.covar_module(z)
            )

    model = GP().double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    net_before = [p.detach().clone() for p in model.covar_module.feature_extractor.parameters()]
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    model.train()
    losses = []
    for _ in range(150):
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss))
    after = list(model.covar_module.feature_extractor.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(after, net_before))
    assert losses[-1] < losses[0] - 1.0
    assert float(model.likelihood.noise) < 0.05  # the step is explained, not left to the noise


def test_batch_kernel_and_state_dict_round_trip():
    torch.manual_seed(0)
    kernel = FeatureMapKernel(MLP(2, [8], 3), batch_shape=torch.Size([2]))
    x = torch.randn(2, 4, 2)
    assert kernel(x).shape == (2, 4, 4)
    other = FeatureMapKernel(MLP(2, [8], 3), batch_shape=torch.Size([2]))
    other.load_state_dict(kernel.state_dict())
    torch.testing.assert_close(other(x).to_dense(), kernel(x).to_dense())
    torch.testing.assert_close(kernel[1](x[1]).to_dense(), kernel(x).to_dense()[1])
    pickle.loads(pickle.dumps(kernel))


def test_bad_inputs():
    with pytest.raises(InputTypeError, match="feature_extractor"):
        FeatureMapKernel("mlp")
    with pytest.raises(InputTypeError, match="base_kernel"):
        FeatureMapKernel(MLP(2, [4], 2), base_kernel=torch.nn.Identity())
    with pytest.raises(InputDataError, match="num_features"):
        FeatureMapKernel(torch.nn.Tanh())
    kernel = FeatureMapKernel(torch.nn.Flatten(0), num_features=2)
    with pytest.raises(ShapeError, match="feature_extractor"):
        kernel(torch.randn(3, 2)).to_dense()

"""The cached W2 estimate of WassersteinVariationalStrategy does not block deepcopy or pickle.

The estimate of the last training batch carries that batch's autograd graph; ``copy.deepcopy``
refuses such tensors, and BoTorch's ``fantasize`` (and ``subset_output``) deep-copy models.
"""

from __future__ import annotations

import copy
import io

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.variational import WassersteinVariationalDistribution, WassersteinVariationalStrategy


class _GWI(gpytorch.models.ApproximateGP):
    def __init__(self, z: torch.Tensor) -> None:
        dist = WassersteinVariationalDistribution(z.shape[-2])
        super().__init__(WassersteinVariationalStrategy(self, z, dist))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x: torch.Tensor) -> MultivariateNormal:
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _trained_batch(dtype: torch.dtype) -> tuple[_GWI, torch.Tensor]:
    """A model called on a batch in train mode (so the cache holds the batch's graph)."""
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=dtype)
    model = _GWI(x[:6].clone()).to(dtype)
    model.train()
    model(x)
    return model, x


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_deepcopy_in_train_mode_detaches_the_copy_only(dtype):
    model, x = _trained_batch(dtype)
    strategy = model.variational_strategy
    assert strategy._w2_cache.grad_fn is not None
    clone = copy.deepcopy(model)
    cached = clone.variational_strategy._w2_cache
    assert cached.grad_fn is None and not cached.requires_grad
    assert torch.equal(cached, strategy._w2_cache.detach())
    # the original keeps its graph: the objective of the batch can still be differentiated
    assert strategy._w2_cache.grad_fn is not None
    strategy.kl_divergence().backward()
    assert strategy._variational_distribution.chol_factor.grad is not None
    model.eval()
    clone.eval()
    assert torch.allclose(clone(x).mean, model(x).mean)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_eval_detaches_the_cache_and_pickle_round_trips(dtype):
    model, x = _trained_batch(dtype)
    value = model.variational_strategy._w2_cache.detach().clone()
    model.eval()
    cached = model.variational_strategy._w2_cache
    assert cached.grad_fn is None
    assert torch.equal(cached, value)
    assert torch.equal(model.variational_strategy.kl_divergence(), value)
    model.train()  # back in train mode the next batch records a fresh graph
    model(x)
    assert model.variational_strategy._w2_cache.grad_fn is not None
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert loaded.variational_strategy._w2_cache.grad_fn is None


def test_untrained_strategy_copies():
    model = _GWI(torch.randn(4, 2, dtype=torch.float64)).double()
    assert copy.deepcopy(model).variational_strategy._w2_cache is None

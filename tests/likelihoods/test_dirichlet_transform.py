"""Tests of DirichletTransform: formulas, layouts, class probabilities, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.likelihoods import DirichletTransform


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha_epsilon", [0.01, 0.001, 0.5])
def test_transform_matches_direct_computation(dtype, alpha_epsilon):
    labels = torch.tensor([[0, 2, 1], [1, 1, 0]])  # batch shape (2, 3)
    t = DirichletTransform(3, alpha_epsilon)
    targets, noise = t(labels, dtype=dtype)
    assert targets.shape == (2, 3, 3) and targets.dtype == dtype
    for idx in np.ndindex(2, 3):
        for c in range(3):
            alpha = (1.0 if labels[idx] == c else 0.0) + alpha_epsilon
            s2 = math.log(1.0 / alpha + 1.0)
            assert noise[idx + (c,)].item() == pytest.approx(s2, rel=1e-6)
            assert targets[idx + (c,)].item() == pytest.approx(math.log(alpha) - s2 / 2, rel=1e-6)
    gp_targets, gp_noise = t(labels, dtype=dtype, class_dim=-2)
    assert torch.equal(gp_targets, targets.transpose(-1, -2))
    assert torch.equal(gp_noise, noise.transpose(-1, -2))
    v = t.values()
    assert v["pos_noise"] == pytest.approx(math.log(1 / (1 + alpha_epsilon) + 1))


def test_class_probs_mc_and_approx():
    torch.manual_seed(0)
    t = DirichletTransform(10)
    mean = torch.randn(200, 10, dtype=torch.float64) * 2
    var = torch.rand(200, 10, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    mc = t.class_probs(mean, var, method="mc", num_samples=20000, generator=gen)
    # reference: direct numpy Monte Carlo
    rng = np.random.default_rng(1)
    f = mean.numpy() + np.sqrt(var.numpy()) * rng.standard_normal((20000, 200, 10))
    ref = np.exp(f - f.max(-1, keepdims=True))
    ref = (ref / ref.sum(-1, keepdims=True)).mean(0)
    assert np.abs(mc.numpy() - ref).max() < 0.01
    # the generator makes the draws reproducible
    again = t.class_probs(mean, var, num_samples=20000, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mc, again)
    approx = t.class_probs(mean, var, method="approx")
    assert torch.allclose(approx.sum(-1), torch.ones(200, dtype=torch.float64))
    # documented accuracy on this regime (means ~ N(0, 4), variances < 1): mean abs error < 0.01
    assert (approx - mc).abs().mean() < 0.01
    assert (approx - mc).abs().max() < 0.1
    # zero variance: both reduce to the softmax of the mean
    zero = torch.zeros_like(var)
    assert torch.allclose(
        t.class_probs(mean, zero, method="approx"), torch.softmax(mean, -1), atol=1e-6
    )


def test_bad_inputs():
    t = DirichletTransform(3)
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        t(torch.tensor([0, 3]))
    with pytest.raises(InputDataError, match="labels >= 0"):
        t(torch.tensor([-1, 0]))
    with pytest.raises(InputTypeError, match="integer class labels"):
        t(torch.tensor([0.5, 1.0]))
    with pytest.raises(InputDataError, match="alpha_epsilon"):
        DirichletTransform(3, alpha_epsilon=0.0)
    with pytest.raises(ShapeError, match="class_probs"):
        t.class_probs(torch.zeros(4, 2), torch.zeros(4, 2))
    with pytest.raises(InputDataError, match="method"):
        t.class_probs(torch.zeros(4, 3), torch.zeros(4, 3), method="bogus")

"""Tests of the preconditioned factor L = L_0 T of WassersteinVariationalDistribution."""

from __future__ import annotations

import pytest
import torch

from gpext.errors import InputDataError
from gpext.variational import WassersteinVariationalDistribution


def _spd(m, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, m, generator=gen, dtype=dtype)
    return a @ a.mT + m * torch.eye(m, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
class TestWassersteinVariationalDistribution:
    seed = 11

    def test_initialize_from_data_matches_closed_form(self, dtype):
        m, n, s2 = 6, 20, 0.3
        gen = torch.Generator().manual_seed(self.seed)
        kzz = _spd(m, dtype, self.seed)
        kzx = torch.randn(m, n, generator=gen, dtype=dtype)
        dist = WassersteinVariationalDistribution(m).to(dtype)
        dist.initialize_from_data(kzz, kzx, s2)
        cov = torch.linalg.inv(kzz + kzx @ kzx.mT / s2)
        tol = 1e-4 if dtype == torch.float32 else 1e-9
        assert torch.allclose(dist.lower @ dist.lower.mT, cov, rtol=tol * 10, atol=tol)
        # the learnable part starts at the identity and L stays lower triangular
        assert torch.equal(dist.chol_factor.detach(), torch.eye(m, dtype=dtype))
        assert torch.equal(dist.lower, dist.lower.tril())
        assert torch.allclose(dist().covariance_matrix, cov, rtol=tol * 10, atol=tol)

    def test_step_on_t_is_relative(self, dtype):
        # entries of L of order 1e-3: a step of 1e-2 on T changes L by about 1%, not 10x
        m = 5
        dist = WassersteinVariationalDistribution(m).to(dtype)
        dist.initialize_variational_distribution(
            torch.distributions.MultivariateNormal(
                torch.zeros(m, dtype=dtype), 1e6 * _spd(m, dtype, self.seed)
            )
        )
        before = dist.lower.detach().clone()
        with torch.no_grad():
            dist.chol_factor.add_(1e-2 * torch.ones(m, m, dtype=dtype))
        rel = (dist.lower.detach() - before).norm() / before.norm()
        assert float(before.abs().max()) < 1e-2 and float(rel) < 0.1
        # the same step on L itself (the unpreconditioned parameterisation) swamps it
        direct = (1e-2 * torch.ones(m, m, dtype=dtype)).tril().norm() / before.norm()
        assert float(direct) > 1.0

    def test_state_dict_round_trip_and_batch(self, dtype):
        m = 4
        dist = WassersteinVariationalDistribution(m, batch_shape=torch.Size([3])).to(dtype)
        kzz = _spd(m, dtype, self.seed).expand(3, m, m)
        dist.initialize_from_data(kzz, torch.ones(3, m, 2, dtype=dtype), 0.5)
        with torch.no_grad():
            dist.chol_factor.mul_(0.9)
        other = WassersteinVariationalDistribution(m, batch_shape=torch.Size([3])).to(dtype)
        other.load_state_dict(dist.state_dict())
        assert "base_factor" in dist.state_dict()
        assert torch.equal(other.lower, dist.lower) and other.lower.shape == (3, m, m)

    def test_errors(self, dtype):
        dist = WassersteinVariationalDistribution(3).to(dtype)
        with pytest.raises(InputDataError, match="noise_variance"):
            dist.initialize_from_data(_spd(3, dtype, 0), torch.ones(3, 2, dtype=dtype), 0.0)
        with pytest.raises(InputDataError, match="num_inducing_points"):
            WassersteinVariationalDistribution(0)

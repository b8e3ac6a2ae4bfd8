"""SWAG and MultiSWAG."""

import math

import pytest
import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.subspace import SWAG, MultiSWAG, TrajectoryCollector


def _trajectory(n=6, k=4, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    traj = TrajectoryCollector(nn.Linear(3, 1).to(dtype), max_deviations=k)
    for _ in range(n):
        traj.collect(torch.randn(4, generator=g, dtype=dtype))
    return traj


class TestSWAG:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_covariance_matches_definition(self, dtype):
        traj = _trajectory(n=3, k=5, dtype=dtype)  # fewer deviations than the buffer holds
        swag = SWAG.from_trajectory(traj)
        assert swag.rank == 3
        dev = traj.deviations()
        expected = 0.5 * (torch.diag(traj.sq_mean - traj.mean**2) + dev.T @ dev / (3 - 1))
        torch.testing.assert_close(swag.covariance().to_dense(), expected)
        s = swag.sample(40000, generator=torch.Generator().manual_seed(1)).double()
        emp = torch.cov(s.T)
        assert float((emp - expected.double()).norm() / expected.double().norm()) < 0.05
        torch.testing.assert_close(s.mean(0), traj.mean.double(), atol=0.02, rtol=0)

    def test_low_rank_only_and_scale(self):
        swag = SWAG.from_trajectory(_trajectory(), diagonal=False)
        dev = swag.deviations
        torch.testing.assert_close(
            swag.covariance(scale=1.0).to_dense(), dev.T @ dev / (swag.rank - 1)
        )
        s = swag.sample(3, scale=0.0)
        torch.testing.assert_close(s, swag.mean.expand(3, -1))

    def test_state_dict_round_trip(self):
        swag = SWAG.from_trajectory(_trajectory())
        other = SWAG(
            torch.zeros(4, dtype=torch.float64),
            torch.zeros(4, dtype=torch.float64),
            torch.zeros(4, 4, dtype=torch.float64),
        )
        other.load_state_dict(swag.state_dict())
        torch.testing.assert_close(other.covariance().to_dense(), swag.covariance().to_dense())

    def test_errors(self):
        empty = TrajectoryCollector(nn.Linear(3, 1))
        with pytest.raises(NotFittedError, match="empty"):
            SWAG.from_trajectory(empty)
        empty.collect()
        with pytest.raises(InputDataError, match="at least 2"):
            SWAG.from_trajectory(empty)
        with pytest.raises(ShapeError):
            SWAG(torch.zeros(4), torch.zeros(3), torch.zeros(2, 4))
        with pytest.raises(ShapeError):
            SWAG(torch.zeros(4), torch.zeros(4), torch.zeros(2, 5))
        with pytest.raises(InputDataError, match="finite"):
            SWAG(torch.zeros(4), torch.full((4,), math.inf), torch.zeros(2, 4))
        with pytest.raises(InputDataError, match="scale"):
            SWAG.from_trajectory(_trajectory()).sample(2, scale=-1.0)


class TestMultiSWAG:
    def test_mixture_sampling(self):
        a = SWAG.from_trajectory(_trajectory())
        b = SWAG(a.mean + 10, a.variance + a.mean**2 + 10 * 0, a.deviations)
        multi = MultiSWAG([a, b])
        s = multi.sample(1000, generator=torch.Generator().manual_seed(0))  # 500 per component
        assert s.shape == (1000, 4) and multi.num_components == 2
        torch.testing.assert_close(s[:500].mean(0), a.mean, atol=0.3, rtol=0)
        torch.testing.assert_close(s[500:].mean(0), a.mean + 10, atol=0.3, rtol=0)
        torch.testing.assert_close(multi.mean, a.mean + 5)

    def test_errors(self):
        a = SWAG.from_trajectory(_trajectory())
        with pytest.raises(InputDataError):
            MultiSWAG([])
        with pytest.raises(InputTypeError):
            MultiSWAG([a, "b"])
        c = SWAG(torch.zeros(5), torch.ones(5), torch.randn(3, 5))
        with pytest.raises(InputDataError, match="equal"):
            MultiSWAG([a, c])

"""The weight-posterior protocol: SWAG, online factor analysis and their mixtures."""

import math

import numpy as np
import pytest
import torch
from linear_operator.operators import (
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
)
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.subspace import (
    SWAG,
    LowRankGaussianWeightPosterior,
    MultiSWAG,
    OnlineFactorAnalysis,
    TrajectoryCollector,
    WeightMixture,
    WeightPosterior,
)

D = 4  # weights of nn.Linear(3, 1)


def _swag(seed=0, dtype=torch.float64, diagonal=True, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    traj = TrajectoryCollector(nn.Linear(3, 1).to(dtype), max_deviations=3)
    for _ in range(8):
        traj.collect(torch.randn(D, generator=g, dtype=dtype) + shift)
    return SWAG.from_trajectory(traj, diagonal=diagonal)


def _fa(seed=1, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(D, 2, generator=g, dtype=dtype)
    theta = torch.randn(400, 2, generator=g, dtype=dtype) @ a.T + 0.3 * torch.randn(
        400, D, generator=g, dtype=dtype
    )
    return OnlineFactorAnalysis(D, 2, warmup=10, dtype=dtype, generator=g).update(theta + 1.0)


def _dense_cov(post, scale=None):
    s = post.scale if scale is None else scale
    f = post.factor()
    psi = post.diagonal_variance()
    cov = f @ f.T + (torch.diag(psi) if psi is not None else 0)
    return s * cov


class TestLowRankGaussian:
    @pytest.mark.parametrize("make", [_swag, _fa], ids=["swag", "factor_analysis"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_protocol_against_scipy(self, make, dtype):
        post = make(dtype=dtype)
        assert isinstance(post, WeightPosterior) and isinstance(
            post, LowRankGaussianWeightPosterior
        )
        assert post.num_parameters == D and post.mean.shape == (D,)
        cov = post.covariance()
        assert isinstance(cov, LowRankRootAddedDiagLinearOperator)
        torch.testing.assert_close(cov.to_dense(), _dense_cov(post))
        w = post.mean + torch.randn(5, D, generator=torch.Generator().manual_seed(3), dtype=dtype)
        ref = multivariate_normal(post.mean.double().numpy(), _dense_cov(post).double().numpy())
        got = post.log_prob(w)
        assert got.shape == (5,) and got.dtype == dtype
        tol = 1e-9 if dtype == torch.float64 else 2e-3
        np.testing.assert_allclose(got.double().numpy(), ref.logpdf(w.double().numpy()), rtol=tol)
        # batch shapes (..., D) -> (...)
        assert post.log_prob(w.reshape(5, 1, D)).shape == (5, 1)
        # explicit scale overrides the default
        ref2 = multivariate_normal(
            post.mean.double().numpy(), _dense_cov(post, 2.0).double().numpy()
        )
        np.testing.assert_allclose(
            post.log_prob(w, scale=2.0).double().numpy(), ref2.logpdf(w.double().numpy()), rtol=tol
        )

    def test_samples_follow_the_covariance(self):
        post = _fa()
        s = post.sample(40000, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(s.mean(0), post.mean, atol=0.03, rtol=0)
        torch.testing.assert_close(
            torch.cov(s.T), post.covariance().to_dense(), atol=0.05, rtol=0.05
        )

    def test_low_rank_only_is_singular(self):
        post = _swag(diagonal=False)
        assert isinstance(post.covariance(), LowRankRootLinearOperator)
        with pytest.raises(InputDataError, match="singular"):
            post.log_prob(post.mean)
        with pytest.raises(ShapeError):
            _swag().log_prob(torch.zeros(D + 1, dtype=torch.float64))


class TestWeightMixture:
    def test_mixture_of_swag_and_factor_analysis(self):
        a, b = _swag(), _fa()
        mix = WeightMixture([a, b], mixing_weights=[1.0, 3.0])
        pi = np.array([0.25, 0.75])
        torch.testing.assert_close(mix.mean, 0.25 * a.mean + 0.75 * b.mean)
        w = torch.randn(6, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        comps = [
            multivariate_normal(p.mean.numpy(), _dense_cov(p).numpy()).logpdf(w.numpy())
            for p in (a, b)
        ]
        ref = logsumexp(np.stack(comps, -1) + np.log(pi), axis=-1)
        np.testing.assert_allclose(mix.log_prob(w).numpy(), ref, rtol=1e-10)
        # law of total covariance, as one low-rank-plus-diagonal operator
        mu = mix.mean
        dense = sum(
            p * (_dense_cov(c) + torch.outer(c.mean - mu, c.mean - mu))
            for p, c in zip((0.25, 0.75), (a, b))
        )
        cov = mix.covariance()
        assert isinstance(cov, LowRankRootAddedDiagLinearOperator)
        torch.testing.assert_close(cov.to_dense(), dense)
        s = mix.sample(40000, generator=torch.Generator().manual_seed(0))
        assert s.shape == (40000, D)
        torch.testing.assert_close(s[:10000].mean(0), a.mean, atol=0.05, rtol=0)  # stratified
        torch.testing.assert_close(torch.cov(s.T), dense, atol=0.06, rtol=0.05)

    def test_allocation_and_state_dict(self):
        mix = WeightMixture([_swag(), _fa()], mixing_weights=[0.2, 0.8])
        assert mix.allocation(10) == [2, 8] and mix.allocation(3) == [1, 2]
        assert WeightMixture([_swag(), _swag(seed=2)]).allocation(3) in ([2, 1], [1, 2])
        other = WeightMixture([_swag(seed=5), _fa(seed=6)])
        other.load_state_dict(mix.state_dict())
        torch.testing.assert_close(other.mean, mix.mean)
        torch.testing.assert_close(other.mixing_weights, mix.mixing_weights)

    def test_multiswag_mixes_factor_analysis_and_samples_in_total(self):
        multi = MultiSWAG([_fa(seed=1), _fa(seed=2)])
        s = multi.sample(6, generator=torch.Generator().manual_seed(0))
        assert s.shape == (6, D)
        assert multi.mean.shape == (D,)  # a tensor, as SWAG.mean
        assert torch.isfinite(multi.log_prob(s)).all()
        multi = MultiSWAG([_swag(), _swag(seed=3)])
        # scale passes through to every component
        s1 = multi.sample(4, scale=0.0, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(s1[:2], multi.components[0].mean.expand(2, D))

    def test_errors(self):
        with pytest.raises(InputDataError):
            WeightMixture([])
        with pytest.raises(InputTypeError, match="WeightPosterior"):
            WeightMixture([_swag(), torch.zeros(D)])
        with pytest.raises(InputDataError, match="mixing_weights"):
            WeightMixture([_swag(), _fa()], mixing_weights=[1.0, -1.0])
        with pytest.raises(InputDataError, match="mixing_weights"):
            WeightMixture([_swag(), _fa()], mixing_weights=[1.0])


class TestFromPosterior:
    def test_ensemble_surrogate_from_factor_analysis(self):
        pytest.importorskip("botorch")
        from gpext.integrations.botorch import WeightEnsembleSurrogate

        net = nn.Linear(3, 1).double()
        fa = _fa()
        model = WeightEnsembleSurrogate.from_posterior(
            net, fa, 16, generator=torch.Generator().manual_seed(0)
        )
        assert model.num_members == 16
        post = model.posterior(torch.rand(5, 3, dtype=torch.float64))
        assert post.mean.shape == (5, 1) and bool(torch.isfinite(post.variance).all())
        with pytest.raises(InputTypeError, match="from_posterior"):
            WeightEnsembleSurrogate.from_swag(net, fa, 4)
        with pytest.raises(InputTypeError, match="WeightPosterior"):
            WeightEnsembleSurrogate.from_posterior(net, object(), 4)
        # from_swag keeps "per component" for MultiSWAG
        multi = MultiSWAG([_swag(), _swag(seed=4)])
        assert WeightEnsembleSurrogate.from_swag(net, multi, 3).num_members == 6
        assert math.isfinite(float(model.posterior(torch.rand(2, 3).double()).mean.sum()))

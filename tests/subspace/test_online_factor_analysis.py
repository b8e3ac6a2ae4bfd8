"""Online EM and online SGA factor analysis against scikit-learn's batch FactorAnalysis."""

import numpy as np
import pytest
import torch
from sklearn.decomposition import FactorAnalysis

from gpext.errors import (
    InputDataError,
    NotFittedError,
    NumericalError,
    NumericalWarning,
    ShapeError,
)
from gpext.subspace import OnlineFactorAnalysis


def _fa_data(d=30, k=2, t=3000, seed=0, dtype=torch.float64):
    """004 Algorithm 3: a random FA model with spectrum [1, 10], then T observations."""
    g = torch.Generator().manual_seed(seed)
    c = torch.randn(d, generator=g, dtype=dtype)
    a = torch.randn(d, d, generator=g, dtype=dtype)
    v = torch.linalg.eigh(a @ a.T)[1][:, -k:]
    s2 = 1 + 9 * torch.rand(d, generator=g, dtype=dtype)
    f = v * s2.sqrt()[:, None]
    psi = torch.rand(d, generator=g, dtype=dtype) * s2.max()
    x = (
        c
        + torch.randn(t, k, generator=g, dtype=dtype) @ f.T
        + torch.randn(t, d, generator=g, dtype=dtype) * psi.sqrt()
    )
    return x


def _rel(a, b):
    return float((a - b).norm() / b.norm())


class TestOnlineFactorAnalysis:
    @pytest.mark.parametrize(("method", "lr"), [("em", 1e-3), ("sga", 1e-2)])
    def test_approaches_sklearn(self, method, lr):
        x = _fa_data(d=80)  # D / K = 40: the latent posterior is sharp enough for online EM
        fa = OnlineFactorAnalysis(
            80, 2, method, learning_rate=lr, generator=torch.Generator().manual_seed(1)
        )
        fa.update(x[:300])
        sk_early = torch.tensor(
            FactorAnalysis(2, random_state=0).fit(x[:300].numpy()).get_covariance()
        )
        early = _rel(fa.covariance().to_dense(), sk_early)
        fa.update(x[300:])
        sk = torch.tensor(FactorAnalysis(2, random_state=0).fit(x.numpy()).get_covariance())
        late = _rel(fa.covariance().to_dense(), sk)
        assert late < 0.12 and late < 0.75 * early
        np.testing.assert_allclose(fa.mean.numpy(), x.mean(0).numpy(), rtol=1e-10, atol=1e-10)
        assert bool((fa.psi > 0).all()) and fa.num_observations == 3000

    @pytest.mark.parametrize("method", ["em", "sga"])
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_psi_positive_under_adversarial_data(self, method, dtype):
        g = torch.Generator().manual_seed(0)
        x = torch.randn(400, 8, generator=g, dtype=dtype)
        x[:, 0] = 3.0  # constant coordinate: zero variance
        x[:, 1] = x[:, 2]  # perfectly correlated pair, explained by one factor
        x[200:, 3] += 1e3  # abrupt jump: the running statistics lag behind
        x[::50, 4] *= 1e3  # rare huge outliers
        fa = OnlineFactorAnalysis(8, 2, method, warmup=10, learning_rate=1e-3, dtype=dtype)
        fa.update(x)
        assert bool((fa.psi > 0).all()) and bool(torch.isfinite(fa.loadings).all())
        assert fa.num_psi_clamped > 0
        assert torch.isfinite(fa.sample(3, generator=g)).all()

    def test_warmup_keeps_parameters_fixed(self):
        fa = OnlineFactorAnalysis(5, 2, warmup=20, generator=torch.Generator().manual_seed(0))
        f0 = fa.loadings.clone()
        fa.update(torch.randn(20, 5, dtype=torch.float64))
        torch.testing.assert_close(fa.loadings, f0)
        assert bool((fa.psi == 1).all())
        with pytest.warns(NumericalWarning, match="warm-up"):
            fa.covariance().to_dense()
        fa.update(torch.randn(1, 5, dtype=torch.float64))
        assert not torch.equal(fa.loadings, f0)
        torch.testing.assert_close(f0.T @ f0, torch.eye(2, dtype=torch.float64))  # orthonormal init

    def test_sample_covariance_and_state_dict(self):
        x = _fa_data(d=6, k=2, t=500)
        fa = OnlineFactorAnalysis(6, 2, generator=torch.Generator().manual_seed(0)).update(x)
        s = fa.sample(20000, scale=0.5, generator=torch.Generator().manual_seed(1))
        assert _rel(torch.cov(s.T), 0.5 * fa.covariance().to_dense()) < 0.05
        other = OnlineFactorAnalysis(6, 2)
        other.load_state_dict(fa.state_dict())
        torch.testing.assert_close(other.covariance().to_dense(), fa.covariance().to_dense())
        assert other.num_observations == 500

    def test_errors(self):
        with pytest.raises(InputDataError, match="method"):
            OnlineFactorAnalysis(5, 2, "pca")
        with pytest.raises(InputDataError, match="latent_dim"):
            OnlineFactorAnalysis(2, 3)
        fa = OnlineFactorAnalysis(5, 2)
        with pytest.raises(NotFittedError):
            fa.covariance().to_dense()
        with pytest.raises(ShapeError):
            fa.update(torch.zeros(4, 6))
        with pytest.raises(InputDataError, match="finite"):
            fa.update(torch.tensor([[0.0, 1.0, float("nan"), 0.0, 0.0]]))
        assert fa.num_observations == 0
        sga = OnlineFactorAnalysis(3, 1, "sga", warmup=0, learning_rate=1e30, psi_max=1e300)
        with pytest.raises(NumericalError, match="learning_rate"):
            sga.update(torch.randn(5, 3, dtype=torch.float64) * 1e100)
        assert sga.num_observations == 0


class TestStepWeight:
    def test_step_weight_zero_is_algorithm_2(self):
        """eta = 0 is the 1/t recursion of 004 Algorithm 2, replayed here by hand."""
        x = _fa_data(d=6, k=2, t=40)
        g = torch.Generator().manual_seed(3)
        fa = OnlineFactorAnalysis(
            6, 2, warmup=5, step_weight=0.0, statistics="thesis", generator=g
        ).update(x)
        f, _ = torch.linalg.qr(
            torch.randn(6, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        )
        psi, mean = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        a, b, d2 = (
            torch.zeros(6, 2, dtype=torch.float64),
            torch.zeros(2, 2, dtype=torch.float64),
            torch.zeros(6, dtype=torch.float64),
        )
        for t, th in enumerate(x, start=1):
            mean = mean + (th - mean) / t
            d = th - mean
            c = (f / psi[:, None]).T
            sig = torch.linalg.inv(torch.eye(2, dtype=torch.float64) + c @ f)
            m = sig @ c @ d
            b, a, d2 = (
                b + (torch.outer(m, m) - b) / t,
                a + (torch.outer(d, m) - a) / t,
                d2 + (d * d - d2) / t,
            )
            if t > 5:
                h = sig + b
                f = a @ torch.linalg.inv(h)
                psi = d2 + ((f @ h) * f - 2 * f * a).sum(-1)
        torch.testing.assert_close(fa.loadings, f)
        torch.testing.assert_close(fa.psi, psi)

    def test_default_is_consistent_statistics_with_burnin(self):
        """Default: Cappé-Moulines statistics, 1/t up to the burn-in, then (eta+1)/(t+eta)."""
        x = _fa_data(d=6, k=2, t=60)
        fa = OnlineFactorAnalysis(
            6, 2, warmup=5, burnin=20, generator=torch.Generator().manual_seed(4)
        ).update(x)
        assert fa.step_weight == 1.0 and fa.statistics == "consistent" and fa.burnin == 20
        f, _ = torch.linalg.qr(
            torch.randn(6, 2, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
        )
        psi, mean = torch.ones(6, dtype=torch.float64), torch.zeros(6, dtype=torch.float64)
        a, b = torch.zeros(6, 2, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
        d2 = torch.zeros(6, dtype=torch.float64)
        for t, th in enumerate(x, start=1):
            mean = mean + (th - mean) / t
            d = th - mean
            c = (f / psi[:, None]).T
            sig = torch.linalg.inv(torch.eye(2, dtype=torch.float64) + c @ f)
            m = sig @ c @ d
            g = 1 / t if t <= 20 else 2 / (t + 1)
            b = b + g * (sig + torch.outer(m, m) - b)
            a = a + g * (torch.outer(d, m) - a)
            d2 = d2 + g * (d * d - d2)
            if t > 5:
                f = a @ torch.linalg.inv(b)
                psi = torch.diag(torch.diag(d2) - a @ torch.linalg.inv(b) @ a.T)
        torch.testing.assert_close(fa.loadings, f)
        torch.testing.assert_close(fa.psi, psi)
        assert OnlineFactorAnalysis(500, 2).burnin == 500  # default max(warmup, dim)
        assert OnlineFactorAnalysis(50, 2, warmup=80).burnin == 80

    @pytest.mark.parametrize("seed", [0, 1, 2])
    def test_consistent_statistics_keep_psi_nonnegative(self, seed):
        """Each averaged E[(d, h)(d, h)^T | theta_t] is PSD, so its Schur complement is too."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(600, 6, generator=g, dtype=torch.float64)
        v = torch.randn(6, generator=g, dtype=torch.float64)
        # noise first, then one strong factor: the posterior covariance shrinks over time
        x[300:] = 0.05 * x[300:] + torch.randn(300, 1, generator=g, dtype=torch.float64) * 10 * v
        x[::37, 2] *= 50.0  # and rare outliers
        fa = OnlineFactorAnalysis(
            6, 1, warmup=10, psi_min=1e-300, generator=torch.Generator().manual_seed(seed)
        ).update(x)
        assert fa.num_psi_clamped == 0 and bool((fa.psi > 0).all())
        schur = fa._d2_bar - (fa._a_bar @ torch.linalg.inv(fa._b_bar) * fa._a_bar).sum(-1)
        assert float(schur.min()) >= -1e-10 * float(fa._d2_bar.max())

    def test_polynomial_decay_forgets_the_random_start(self):
        # D / K = 10, as the D = 100 setting of benchmarks/online_fa.py: the 1/t recursion carries
        # the statistics gathered under the random initial F; eta = 1 forgets them
        x = _fa_data(d=40, k=4, t=6000, seed=2)
        sk = torch.tensor(FactorAnalysis(4, random_state=0).fit(x.numpy()).get_covariance())
        err = {}
        for eta in (0.0, 1.0):
            fa = OnlineFactorAnalysis(
                40,
                4,
                step_weight=eta,
                statistics="thesis",
                generator=torch.Generator().manual_seed(0),
            ).update(x)
            err[eta] = _rel(fa.covariance().to_dense(), sk)
        assert err[1.0] < 0.8 * err[0.0]

    def test_bad_statistics_and_burnin(self):
        with pytest.raises(InputDataError, match="statistics"):
            OnlineFactorAnalysis(5, 2, statistics="batch")
        with pytest.raises(InputDataError, match="burnin"):
            OnlineFactorAnalysis(5, 2, burnin=-3)

    def test_bad_step_weight(self):
        with pytest.raises(InputDataError, match="step_weight"):
            OnlineFactorAnalysis(5, 2, step_weight=-1.0)
        with pytest.raises(InputDataError, match="step_weight"):
            OnlineFactorAnalysis(5, 2, step_weight=float("inf"))

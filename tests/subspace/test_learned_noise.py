"""Learned homoscedastic noise: OutputLikelihood('homoscedastic_gaussian') and its training."""

import math

import numpy as np
import pytest
import torch
from scipy import optimize, stats

from gpext.errors import InputDataError, ShapeError
from gpext.nn import MLP, HeteroscedasticMLP
from gpext.subspace import OutputLikelihood, train_sgd_trajectory

DTYPES = (torch.float32, torch.float64)


class TestHomoscedasticLikelihood:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_fit_noise_is_the_scipy_maximum_likelihood(self, dtype):
        gen = torch.Generator().manual_seed(0)
        out = torch.randn(50, 1, generator=gen, dtype=dtype)
        y = out[:, 0] + 0.3 * torch.randn(50, generator=gen, dtype=dtype)
        lik = OutputLikelihood("homoscedastic_gaussian")
        var = lik.fit_noise(out, y)
        resid = (y - out[:, 0]).double().numpy()

        def nll(log_var):
            return -stats.norm.logpdf(resid, 0.0, math.exp(0.5 * log_var)).sum()

        ref = optimize.minimize_scalar(
            nll, bounds=(-10, 5), method="bounded", options={"xatol": 1e-10}
        )
        assert var == lik.noise_variance
        assert math.isclose(var, math.exp(ref.x), rel_tol=1e-5)
        assert math.isclose(var, float(np.mean(resid**2)), rel_tol=1e-6)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_log_prob_equals_the_fixed_gaussian(self, dtype):
        gen = torch.Generator().manual_seed(1)
        out, y = (
            torch.randn(7, 1, generator=gen, dtype=dtype),
            torch.randn(7, generator=gen, dtype=dtype),
        )
        homo = OutputLikelihood("homoscedastic_gaussian", noise_variance=0.3)
        fixed = OutputLikelihood("gaussian", noise_variance=0.3)
        lp = homo.log_prob(out, y)
        assert lp.dtype == dtype and lp.shape == (7,)
        torch.testing.assert_close(lp, fixed.log_prob(out, y))
        ref = stats.norm.logpdf(y.double().numpy(), out[:, 0].double().numpy(), math.sqrt(0.3))
        np.testing.assert_allclose(lp.double().numpy(), ref, rtol=1e-5)
        assert homo.learns_noise and not fixed.learns_noise and homo.is_regression
        assert "homoscedastic_gaussian" in repr(homo)

    def test_errors(self):
        with pytest.raises(InputDataError, match="fit_noise"):
            OutputLikelihood("heteroscedastic_gaussian").fit_noise(
                torch.zeros(3, 2), torch.zeros(3)
            )
        with pytest.raises(ShapeError):
            OutputLikelihood("homoscedastic_gaussian").fit_noise(torch.zeros(3, 1), torch.zeros(4))
        with pytest.raises(InputDataError, match="non-finite"):
            OutputLikelihood("homoscedastic_gaussian").fit_noise(
                torch.full((3, 1), float("nan")), torch.zeros(3)
            )
        lik = OutputLikelihood("homoscedastic_gaussian", min_variance=1e-3)
        assert lik.fit_noise(torch.zeros(3, 1), torch.zeros(3)) == 1e-3  # the floor


class TestLearnedNoiseInTraining:
    @pytest.mark.parametrize("dtype", DTYPES)
    def test_frozen_network_learns_the_closed_form(self, dtype):
        # lr = 0: the network does not move, so the learned noise is exactly the MLE
        # sigma^2 = mean squared residual of that network (in the targets' units:
        # target_noise_variance; noise_variance is in the standardised units, issue 38)
        torch.manual_seed(0)
        x = torch.randn(37, 3, dtype=dtype)
        y = x[:, 0] + 0.1 * torch.randn(37, dtype=dtype)
        net = MLP(3, [8], 1).to(dtype)
        lik = OutputLikelihood("homoscedastic_gaussian")
        with pytest.warns(Warning):  # a frozen random network explains nothing
            train_sgd_trajectory(net, x, y, lik, epochs=3, swa_start=1, lr=0.0, swa_lr=0.0)
        with torch.no_grad():
            mean = lik.mean_variance(net(x))[0]
            expected = float(((y - mean) ** 2).double().mean())
        assert math.isclose(lik.target_noise_variance, expected, rel_tol=1e-6)
        assert math.isclose(lik.noise_variance, expected / lik.target_scale**2, rel_tol=1e-6)

    def test_learned_noise_recovers_the_true_noise(self):
        torch.manual_seed(0)
        x = torch.rand(400, 1, dtype=torch.float64) * 4 - 2
        y = torch.sin(2 * x[:, 0]) + 0.2 * torch.randn(400, dtype=torch.float64)
        net = MLP(1, [50], 1).double()
        lik = OutputLikelihood("homoscedastic_gaussian")
        gen = torch.Generator().manual_seed(0)
        traj = train_sgd_trajectory(
            net, x, y, lik, epochs=150, swa_start=100, lr=1e-2, generator=gen
        )
        assert 0.02 < lik.target_noise_variance < 0.06  # true 0.04, in the targets' units
        # the closed form at the SWA mean
        with torch.no_grad():
            out = lik.mean_variance(traj.flat.functional_call(traj.swa_weights(), x))[0]
            last = float(((y - lik.mean_variance(net(x))[0]) ** 2).mean())
        assert math.isclose(lik.target_noise_variance, float(((y - out) ** 2).mean()))
        assert lik.target_noise_variance != last

    def test_other_likelihoods_are_unchanged(self):
        torch.manual_seed(0)
        x, y = torch.randn(20, 2), torch.randn(20)
        fixed = OutputLikelihood("gaussian", noise_variance=0.5)
        train_sgd_trajectory(MLP(2, [4], 1), x, y, fixed, epochs=2, swa_start=1)
        # fixed in the targets' units (stored standardised since issue 38's target transform)
        assert math.isclose(fixed.target_noise_variance, 0.5, rel_tol=1e-12)
        het = OutputLikelihood("heteroscedastic_gaussian")
        train_sgd_trajectory(HeteroscedasticMLP(2, [4]), x, y, het, epochs=2, swa_start=1)
        assert het.noise_variance == 1.0

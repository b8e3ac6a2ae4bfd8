"""Tests of GWIObjective: scaling of the two terms against a hand evaluation, errors."""

from __future__ import annotations

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.errors import InputDataError, InputTypeError
from gpext.mlls import GWIObjective
from gpext.variational import WassersteinVariationalDistribution, WassersteinVariationalStrategy


class _GWI(gpytorch.models.ApproximateGP):
    def __init__(self, z):
        dist = WassersteinVariationalDistribution(z.shape[-2])
        super().__init__(WassersteinVariationalStrategy(self, z, dist, num_subsample=1000))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())

    def forward(self, x):
        return MultivariateNormal(self.mean_module(x), self.covar_module(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_objective_is_mean_ell_minus_w2_over_n(dtype):
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=dtype)
    y = torch.sin(2 * x[:, 0])
    model = _GWI(x[:6].clone()).to(dtype)
    lik = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
    mll = GWIObjective(lik, model, num_data=300, beta=2.0)
    model.train()
    out = model(x)
    value = mll(out, y)
    w2 = model.variational_strategy.kl_divergence()
    # closed-form Gaussian expected log-likelihood
    s2 = lik.noise
    ell = -0.5 * ((y - out.mean) ** 2 + out.variance) / s2 - 0.5 * torch.log(2 * torch.pi * s2)
    expected = ell.mean() - 2.0 * w2 / 300
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    assert torch.allclose(value, expected, atol=tol, rtol=tol)
    terms = GWIObjective(lik, model, num_data=300, combine_terms=False)(model(x), y)
    assert len(terms) == 3


def test_bad_arguments():
    model = _GWI(torch.randn(4, 2))
    lik = gpytorch.likelihoods.GaussianLikelihood()
    with pytest.raises(InputDataError, match="num_data"):
        GWIObjective(lik, model, num_data=0)
    with pytest.raises(InputDataError, match="beta"):
        GWIObjective(lik, model, num_data=10, beta=-1.0)
    svgp_like = gpytorch.models.ApproximateGP(
        gpytorch.variational.VariationalStrategy(
            model, torch.randn(4, 2), gpytorch.variational.CholeskyVariationalDistribution(4)
        )
    )
    with pytest.raises(InputTypeError, match="WassersteinVariationalStrategy"):
        GWIObjective(lik, svgp_like, num_data=10)


def test_beta_zero_is_the_expected_log_likelihood_alone():
    torch.manual_seed(0)
    x = torch.randn(30, 2, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0])
    model = _GWI(x[:6].clone()).double()
    lik = gpytorch.likelihoods.GaussianLikelihood().double()
    model.train()
    out = model(x)
    value = GWIObjective(lik, model, num_data=300, beta=0.0)(out, y)
    s2 = lik.noise
    ell = -0.5 * ((y - out.mean) ** 2 + out.variance) / s2 - 0.5 * torch.log(2 * torch.pi * s2)
    assert model.variational_strategy.kl_divergence() > 0
    assert torch.allclose(value, ell.mean(), atol=1e-10, rtol=1e-10)
    for bad in (float("nan"), float("inf"), True):
        with pytest.raises(InputDataError, match="beta"):
            GWIObjective(lik, model, num_data=10, beta=bad)

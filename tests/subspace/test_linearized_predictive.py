"""The linearised (GLM) predictive of subspace posteriors (issue 22, item 4)."""

import pytest
import torch

from gpext.errors import InputDataError, ShapeError
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    FlatParameters,
    OutputLikelihood,
    SubspaceModel,
    gaussian_from_samples,
    linearized_predictive,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_exact_for_a_network_linear_in_its_weights(dtype):
    gen = torch.Generator().manual_seed(0)
    net = torch.nn.Linear(3, 1).to(dtype)
    flat = FlatParameters(net)
    proj = torch.randn(2, 4, generator=gen).to(dtype)
    model = SubspaceModel(
        net, flat.flatten(), proj, OutputLikelihood("gaussian", noise_variance=0.2)
    )
    x = torch.randn(7, 3, generator=gen).to(dtype)
    loc = torch.tensor([0.3, -0.5], dtype=dtype)
    a = torch.randn(2, 2, generator=gen).to(dtype)
    cov = a @ a.T + 0.1 * torch.eye(2, dtype=dtype)
    mean, var = linearized_predictive(model, x, loc, cov)
    # closed form: f(x; w_hat + P^T theta) = [x, 1] (w_hat + P^T theta), so J = [x, 1] P^T
    x1 = torch.cat([x, torch.ones(7, 1, dtype=dtype)], -1)  # weight then bias, as flattened
    jac = x1 @ proj.T
    exp_mean = x1 @ model.weights(loc)
    exp_var = ((jac @ cov) * jac).sum(-1) + 0.2
    tol = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}
    torch.testing.assert_close(mean, exp_mean, **tol)
    torch.testing.assert_close(var, exp_var, **tol)
    assert mean.dtype == dtype


def test_matches_monte_carlo_to_first_order_for_a_nonlinear_network():
    torch.manual_seed(0)
    net = HeteroscedasticMLP(2, [16]).double()
    flat = FlatParameters(net)
    gen = torch.Generator().manual_seed(1)
    d = flat.num_parameters
    proj = 0.1 * torch.randn(3, d, generator=gen, dtype=torch.float64)
    model = SubspaceModel(net, flat.flatten(), proj, OutputLikelihood("heteroscedastic_gaussian"))
    x = torch.randn(5, 2, generator=gen, dtype=torch.float64)
    loc = torch.zeros(3, dtype=torch.float64)
    scale = 1e-2
    mean, var = linearized_predictive(
        model, x, loc, torch.full((3,), scale**2, dtype=torch.float64)
    )
    thetas = scale * torch.randn(20000, 3, generator=gen, dtype=torch.float64)
    pred = model.predict(x, thetas)
    mc_var_f = pred["means"].var(0)
    # the epistemic part agrees with Monte Carlo (to first order in the small covariance)
    noise = model.predict(x, loc[None])["variances"][0]
    torch.testing.assert_close(var - noise, mc_var_f, rtol=0.05, atol=0.0)
    torch.testing.assert_close(mean, pred["means"].mean(0), rtol=0, atol=5e-4)


def test_gaussian_from_samples_and_errors():
    thetas = torch.randn(50, 3, dtype=torch.float64)
    loc, cov = gaussian_from_samples(thetas)
    torch.testing.assert_close(cov, torch.cov(thetas.T))
    torch.testing.assert_close(loc, thetas.mean(0))
    with pytest.raises(ShapeError):
        gaussian_from_samples(thetas[:1])
    net = torch.nn.Linear(2, 1).double()
    flat = FlatParameters(net)
    model = SubspaceModel(net, flat.flatten(), torch.eye(3).double(), OutputLikelihood("gaussian"))
    x = torch.randn(4, 2, dtype=torch.float64)
    with pytest.raises(ShapeError):
        linearized_predictive(model, x, torch.zeros(2).double(), torch.ones(2).double())
    with pytest.raises(InputDataError, match="non-negative"):
        linearized_predictive(model, x, torch.zeros(3).double(), -torch.ones(3).double())
    with pytest.raises(InputDataError, match="positive semi-definite"):
        linearized_predictive(model, x, torch.zeros(3).double(), -torch.eye(3).double())
    with pytest.raises(InputDataError, match="symmetric"):
        linearized_predictive(
            model, x, torch.zeros(3).double(), torch.triu(torch.ones(3, 3)).double()
        )
    with pytest.raises(InputDataError, match="at least one row"):
        linearized_predictive(model, x[:0], torch.zeros(3).double(), torch.ones(3).double())
    clf = SubspaceModel(
        torch.nn.Linear(2, 3).double(), FlatParameters(torch.nn.Linear(2, 3)).flatten().double(),
        torch.eye(9).double()[:2], OutputLikelihood("categorical"),
    )  # fmt: skip
    with pytest.raises(InputDataError, match="regression"):
        linearized_predictive(clf, x, torch.zeros(2).double(), torch.ones(2).double())

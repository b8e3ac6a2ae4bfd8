"""minimize_lbfgs: reaches optima, rejects failed trial points, says how it stopped."""

import warnings

import pytest
import torch
from linear_operator.utils.errors import NotPSDError
from scipy.optimize import minimize

from gpext.errors import ConvergenceWarning, FitError, OptimizerStallWarning
from gpext.fit import StopReason, minimize_lbfgs


def _rosenbrock(w):
    return (1 - w[0]) ** 2 + 100 * (w[1] - w[0] ** 2) ** 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rosenbrock_reaches_the_optimum(dtype):
    w = torch.nn.Parameter(torch.tensor([-1.2, 1.0], dtype=dtype))
    res = minimize_lbfgs(lambda: _rosenbrock(w), [w], max_iter=200)
    assert res.stop_reason == StopReason.CONVERGED
    tol = 1e-3 if dtype == torch.float32 else 1e-6
    assert torch.allclose(w.detach(), torch.ones(2, dtype=dtype), atol=tol)
    assert res.num_evaluations >= res.num_iterations and res.losses[-1] <= res.losses[0]
    assert res.grad_norm < 1e-2


def test_matches_scipy_on_a_logistic_regression():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 5, generator=gen, dtype=torch.float64)
    y = (x @ torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64) > 0).double()
    w = torch.nn.Parameter(torch.zeros(5, dtype=torch.float64))

    def loss_t():
        return (
            torch.nn.functional.binary_cross_entropy_with_logits(x @ w, y) + 0.01 * w.pow(2).sum()
        )

    res = minimize_lbfgs(loss_t, [w])

    def loss_np(v):
        t = torch.tensor(v, requires_grad=True)
        val = torch.nn.functional.binary_cross_entropy_with_logits(x @ t, y) + 0.01 * t.pow(2).sum()
        val.backward()
        return float(val), t.grad.numpy()

    ref = minimize(loss_np, torch.zeros(5, dtype=torch.float64).numpy(), jac=True, method="L-BFGS-B",
                   options={"gtol": 1e-10, "ftol": 1e-15})  # fmt: skip
    assert res.final_loss == pytest.approx(ref.fun, abs=1e-9)
    assert torch.allclose(w.detach(), torch.tensor(ref.x), atol=1e-4)


def test_failed_trial_points_are_rejected_not_fatal():
    """A region where the loss cannot be evaluated (a failed Cholesky) next to the optimum.

    scipy's L-BFGS-B, given inf there, returns to the previous iterate and reports
    convergence far from the optimum; torch's LBFGS raises.  Here the trial point is rejected
    and the search goes on.
    """
    w = torch.nn.Parameter(torch.tensor([30.0, 0.0], dtype=torch.float64))
    target = torch.tensor([-0.49, 2.0], dtype=torch.float64)

    def closure():
        if float(w[0].detach()) < -0.5:
            raise NotPSDError("Matrix not positive definite")
        return (w - target).pow(2).sum() + 0.1 * torch.sin(5 * w[0])

    res = minimize_lbfgs(closure, [w], history_size=3)
    assert res.rejected_points > 0
    assert res.stop_reason == StopReason.CONVERGED
    assert float(w[0]) >= -0.5 and abs(float(w[1]) - 2.0) < 1e-4
    # the constrained optimum: at the stationary point in the feasible region or the edge
    assert res.final_loss < 0.05


def test_stall_warns_when_every_trial_point_fails():
    w = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    start = w.detach().clone()

    def closure():
        if not torch.equal(w.detach(), start):
            raise NotPSDError("Matrix not positive definite")
        return (w - 5).pow(2).sum()

    with pytest.warns(OptimizerStallWarning, match="could not step"):
        res = minimize_lbfgs(closure, [w], max_line_search=5)
    assert res.stop_reason == StopReason.STALLED
    assert "OptimizerStallWarning" in res.problems and not res.ok
    assert torch.equal(w.detach(), start)  # left at the last accepted point


def test_failing_initial_point_raises_and_restores():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))

    def closure():
        return w.sum() * float("nan")

    with pytest.raises(FitError, match="initial point") as info:
        minimize_lbfgs(closure, [w])
    assert torch.equal(w.detach(), torch.tensor([1.0, 2.0]))
    assert info.value.result.stop_reason == StopReason.FAILED


def test_budget_exhausted_while_improving_warns():
    w = torch.nn.Parameter(torch.tensor([-1.2, 1.0], dtype=torch.float64))
    with pytest.warns(ConvergenceWarning, match="still falling"):
        res = minimize_lbfgs(lambda: _rosenbrock(w), [w], max_iter=12)
    assert res.stop_reason == StopReason.MAX_ITERATIONS
    assert "ConvergenceWarning" in res.problems


def test_old_torch_lbfgs_loop_stops_early():
    """The loop this replaces: LBFGS(max_iter=1) stops after one step that raises the loss."""
    w = torch.nn.Parameter(torch.tensor([-1.2, 1.0], dtype=torch.float64))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        minimize_lbfgs(lambda: _rosenbrock(w), [w])
    ours = float(_rosenbrock(w))
    v = torch.nn.Parameter(torch.tensor([-1.2, 1.0], dtype=torch.float64))
    opt = torch.optim.LBFGS([v], lr=1.0, max_iter=1, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = _rosenbrock(v)
        loss.backward()
        return loss

    last = None
    for _ in range(100):
        loss = float(opt.step(closure))
        if last is not None and abs(loss - last) < 1e-7 * max(1.0, abs(last)):
            break
        last = loss
    assert ours < 1e-10 < float(_rosenbrock(v))


def test_bad_settings_raise():
    from gpext.errors import InputDataError, InputTypeError

    w = torch.nn.Parameter(torch.zeros(1))
    with pytest.raises(InputDataError):
        minimize_lbfgs(lambda: w.sum(), [torch.nn.Parameter(torch.zeros(1), requires_grad=False)])
    with pytest.raises((InputDataError, InputTypeError)):
        minimize_lbfgs(lambda: w.sum(), [w], max_iter=0)

"""train_loop: stopping rules, best-state restore, failure detection."""

import math

import pytest
import torch

from gpext.errors import FitError, OptimizerStallWarning
from gpext.fit import StopReason, minibatch_indices, train_loop


def _linear_problem(dtype=torch.float64, n=200):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, 3, generator=gen, dtype=dtype)
    y = x @ torch.tensor([1.0, -2.0, 0.5], dtype=dtype) + 0.1 * torch.randn(
        n, generator=gen, dtype=dtype
    )
    return x, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_minibatch_least_squares_reaches_the_solution(dtype):
    x, y = _linear_problem(dtype)
    lin = torch.nn.Linear(3, 1, bias=False).to(dtype)
    opt = torch.optim.Adam(lin.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    res = train_loop(
        lambda idx: (lin(x[idx]).squeeze(-1) - y[idx]).pow(2).mean(), opt, modules=[lin],
        epochs=150, batches=lambda _: minibatch_indices(200, 32, generator=gen),
        lr_schedule="cosine",
    )  # fmt: skip
    ref = torch.linalg.lstsq(x, y.unsqueeze(-1)).solution.squeeze(-1)
    assert torch.allclose(lin.weight.detach().squeeze(0), ref, atol=2e-3)
    assert len(res.losses) == 150 and res.stop_reason == StopReason.MAX_ITERATIONS
    assert res.num_evaluations == 150 * 7 and math.isfinite(res.grad_norm)


def test_minibatch_indices_cover_once_and_merge_a_tiny_tail():
    chunks = minibatch_indices(65, 32, generator=torch.Generator().manual_seed(0), min_size=2)
    assert [c.numel() for c in chunks] == [32, 33]
    assert torch.equal(torch.cat(chunks).sort().values, torch.arange(65))


def test_validation_early_stopping_restores_the_best_state():
    w = torch.nn.Parameter(torch.tensor([0.0]))
    holder = torch.nn.ParameterList([w])
    opt = torch.optim.SGD([w], lr=0.1)
    # training pushes w to 3; validation prefers w = 1
    res = train_loop(lambda: (w - 3).pow(2).sum(), opt, modules=[holder], epochs=200,
                     validation=lambda: float((w.detach() - 1).pow(2)), patience=5)  # fmt: skip
    assert res.stop_reason == StopReason.EARLY_STOPPED
    best = res.validation_steps[res.validation_losses.index(min(res.validation_losses))]
    assert res.best_step == best
    assert float((w.detach() - 1).pow(2)) == pytest.approx(min(res.validation_losses))
    assert res.num_iterations < 200


def test_relative_tolerance_rule_stops_converged_fits():
    w = torch.nn.Parameter(torch.tensor([5.0]))
    opt = torch.optim.Adam([w], lr=0.1)
    res = train_loop(lambda: (w - 1).pow(2).sum(), opt, modules=[torch.nn.ParameterList([w])],
                     epochs=5000, rtol=1e-6, window=20)  # fmt: skip
    assert res.stop_reason == StopReason.CONVERGED and res.num_iterations < 5000
    assert abs(float(w) - 1) < 1e-2


def test_non_finite_loss_raises_and_restores_the_last_finite_state():
    lin = torch.nn.Linear(2, 1)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    opt = torch.optim.SGD(lin.parameters(), lr=1e-3)
    calls = {"n": 0}

    def loss():
        calls["n"] += 1
        out = lin(torch.ones(4, 2)).sum()
        return out * (float("nan") if calls["n"] == 3 else 1.0)

    with pytest.raises(FitError, match="the loss is nan") as info:
        train_loop(loss, opt, modules=[lin], epochs=10, snapshot_every=100)
    assert info.value.result.stop_reason == StopReason.FAILED
    for k, v in lin.state_dict().items():
        assert torch.equal(v, before[k])  # restored to the last snapshot (the initial state)


def test_no_gradient_warns_stall():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.Adam([w], lr=0.1)
    with pytest.warns(OptimizerStallWarning, match="no parameter received"):
        res = train_loop(lambda: (w.detach() * 0 + 1).requires_grad_(), opt,
                         modules=[torch.nn.ParameterList([w])], epochs=5)  # fmt: skip
    assert res.stop_reason == StopReason.STALLED and not res.ok


def test_callback_stops():
    w = torch.nn.Parameter(torch.tensor([1.0]))
    opt = torch.optim.Adam([w], lr=0.1)
    res = train_loop(lambda: w.pow(2).sum(), opt, modules=[torch.nn.ParameterList([w])],
                     epochs=100, callback=lambda epoch, loss, r: epoch == 4)  # fmt: skip
    assert res.stop_reason == StopReason.CALLBACK and res.num_iterations == 5

r"""One first-order training loop for every gpext model trained by minibatches or Monte Carlo.

The loop owns what each model used to write by hand: shuffling into minibatches, the learning
rate schedule, validation early stopping that restores the best state, a stopping rule on the
training loss, callbacks, a progress bar, and failure detection (a non-finite loss or parameter
restores the last finite state and raises :class:`~gpext.errors.FitError`; an epoch in which
no parameter received a gradient warns with :class:`~gpext.errors.OptimizerStallWarning`).
"""

from __future__ import annotations

import copy
import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from gpext.errors import (
    ConvergenceWarning,
    FitError,
    InputDataError,
    OptimizerStallWarning,
    expected_got,
)
from gpext.fit.fit_result import FitResult, StopReason
from gpext.utils import check_positive_int, progress_bar

__all__ = ["minibatch_indices", "still_improving", "train_loop"]


def minibatch_indices(
    n: int,
    batch_size: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
    min_size: int = 1,
) -> list[torch.Tensor]:
    """One epoch of shuffled minibatch indices of ``range(n)``.

    A last minibatch smaller than ``min_size`` is merged into the one before it (so
    batch-norm networks and GP minibatch losses that need two points never see one).

    Args:
        n: Number of data points.
        batch_size: Minibatch size.
        generator: Random generator of the permutation.
        device: Device of the returned indices.
        min_size: Smallest allowed minibatch.

    Returns:
        Index tensors covering ``range(n)`` once.
    """
    perm = torch.randperm(n, generator=generator)
    if device is not None:
        perm = perm.to(device)
    chunks = list(perm.split(batch_size))
    if len(chunks) > 1 and chunks[-1].numel() < min_size:
        last = chunks.pop()
        chunks[-1] = torch.cat([chunks[-1], last])
    return chunks


def _state(modules: Sequence[torch.nn.Module]) -> list[dict[str, torch.Tensor]]:
    return [copy.deepcopy(m.state_dict()) for m in modules]


def _restore(modules: Sequence[torch.nn.Module], states: list[dict[str, Any]]) -> None:
    for m, s in zip(modules, states):
        m.load_state_dict(s)


def _grad_norm(params: Sequence[torch.Tensor]) -> float:
    total = 0.0
    for p in params:
        if p.grad is not None:
            total += float(p.grad.detach().pow(2).sum())
    return math.sqrt(total)


def train_loop(
    loss_fn: Callable[..., torch.Tensor],
    optimizer: torch.optim.Optimizer,
    *,
    modules: Sequence[torch.nn.Module],
    epochs: int,
    batches: Callable[[int], Iterable[Any]] | None = None,
    lr_schedule: str = "constant",
    final_lr_ratio: float = 0.0,
    validation: Callable[[], float] | None = None,
    eval_every: int = 1,
    patience: int | None = None,
    validate_initial: bool = False,
    rtol: float | None = None,
    window: int = 10,
    callback: Callable[[int, float, FitResult], bool | None] | None = None,
    after_step: Callable[[], None] | None = None,
    snapshot_every: int = 1,
    show_progress: bool | None = None,
    desc: str = "fit",
    min_steps: int | None = None,
    warn_unconverged: bool = True,
) -> FitResult:
    r"""Minimise a loss with a first-order optimiser, epoch by epoch.

    Each epoch calls ``loss_fn(batch)`` for every ``batch`` of ``batches(epoch)`` (or
    ``loss_fn()`` once when ``batches`` is ``None``: full-batch or Monte Carlo steps), then
    ``backward`` and one optimiser step.  The recorded training loss of an epoch is the mean
    of its minibatch losses.  A ``loss_fn`` that fills the gradients itself (e.g. adds a prior
    gradient in place) returns a loss that does not require grad, and ``backward`` is skipped.

    The budget is counted in optimiser steps, not passes over the data: with ``min_steps`` the
    loop runs at least :math:`\lceil \text{min\_steps} / B \rceil` epochs of :math:`B`
    minibatches (``epochs`` is raised to that), so a 150-row table gets as many steps as a
    15,000-row one; neither early-stopping rule below stops it before ``min_steps`` steps.
    A run that ends on its budget while the loss is still clearly falling (the mean of the last
    tenth of the epochs, at least 5, lower than the tenth before by more than three standard
    errors and by more than ``1e-3 max(1, |loss|)``; see :func:`still_improving`) warns with
    :class:`~gpext.errors.ConvergenceWarning` (``warn_unconverged``).

    Stopping rules, whichever comes first: ``epochs``; validation early stopping (the
    validation loss, checked every ``eval_every`` epochs, did not improve for ``patience``
    checks); the relative improvement rule: with ``rtol`` set, stop when the mean loss of the
    last ``window`` epochs is within ``rtol`` (relative) of the mean of the ``window`` before,
    i.e. :math:`|\bar\ell_{k-w:k} - \bar\ell_{k-2w:k-w}| \le \mathrm{rtol}\,
    \max(1, |\bar\ell_{k-w:k}|)`; a callback returning ``True``.

    With ``validation`` the state of ``modules`` at the best check is restored at the end
    (``validate_initial`` lets the initial state compete).

    Args:
        loss_fn: The loss of one minibatch (argument: one item of ``batches(epoch)``), or of
            the whole objective (no argument) when ``batches`` is ``None``.
        optimizer: A constructed ``torch.optim`` optimiser over the parameters to train.
        modules: Modules whose ``state_dict`` makes up the model state (snapshots, the
            restored best state); they are put in train mode while training.
        epochs: Maximum number of epochs (steps when ``batches`` is ``None``).
        batches: ``epoch -> iterable of minibatches`` (e.g. index tensors from
            :func:`minibatch_indices`).
        lr_schedule: ``"constant"`` or ``"cosine"`` (every group's learning rate annealed to
            ``final_lr_ratio`` times its initial value over all steps).
        final_lr_ratio: See ``lr_schedule``.
        validation: Returns the validation loss of the current state (lower is better).
        eval_every: Validation period in epochs.
        patience: Checks without improvement before stopping (``None``: never stop early).
        validate_initial: Also validate (and possibly keep) the state before training.
        rtol: Relative-improvement stopping tolerance (``None``: off).
        window: Epochs per window of the ``rtol`` rule.
        callback: ``callback(epoch, loss, result)`` after every epoch; ``True`` stops.
        after_step: Called after every optimiser step (e.g. a constraint projection).
        snapshot_every: Epochs between snapshots of the last finite state.
        show_progress: Progress bar (``None``: only on a terminal).
        desc: Progress-bar label and prefix of messages.
        min_steps: Smallest number of optimiser steps (``None``: ``epochs`` alone decides).
        warn_unconverged: Warn when the budget ends while the loss is still falling.

    Returns:
        A :class:`~gpext.fit.FitResult` (``losses`` per epoch).

    Raises:
        FitError: On a non-finite loss or parameter; the last finite snapshot (at most
            ``snapshot_every`` epochs old) is restored first.
        InputDataError: For invalid settings.

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(2))
        >>> holder = torch.nn.ParameterList([w])
        >>> opt = torch.optim.Adam([w], lr=0.1)
        >>> res = train_loop(lambda: (w - 1).pow(2).sum(), opt, modules=[holder], epochs=100)
        >>> bool(res.losses[-1] < 1e-3)
        True
    """
    epochs = check_positive_int(epochs, f"{desc}: epochs")
    eval_every = check_positive_int(eval_every, f"{desc}: eval_every")
    snapshot_every = check_positive_int(snapshot_every, f"{desc}: snapshot_every")
    if lr_schedule not in ("constant", "cosine"):
        raise InputDataError(
            expected_got(f"{desc}: lr_schedule", "'constant' or 'cosine'", repr(lr_schedule))
        )
    if patience is not None:
        patience = check_positive_int(patience, f"{desc}: patience")
    if rtol is not None and not rtol >= 0:
        raise InputDataError(expected_got(f"{desc}: rtol", "a number >= 0 or None", rtol))
    window = check_positive_int(window, f"{desc}: window")
    if min_steps is not None:
        min_steps = check_positive_int(min_steps, f"{desc}: min_steps")
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for group in optimizer.param_groups:
        group.setdefault("initial_lr", group["lr"])
    start = time.perf_counter()
    result = FitResult()
    was_training = [m.training for m in modules]
    last_good = _state(modules)
    best_value, best_state = math.inf, None
    checks_without_improvement = 0
    if validation is not None and validate_initial:
        best_value = _checked_validation(validation, modules, desc)
        result.validation_losses.append(best_value)
        result.validation_steps.append(0)
        best_state, result.best_step = _state(modules), 0
    first_batches = [None] if batches is None else list(batches(0))
    if min_steps is not None:
        epochs = max(epochs, math.ceil(min_steps / max(len(first_batches), 1)))
    total_steps = max(1, epochs * len(first_batches))
    step = 0
    stop, message = StopReason.MAX_ITERATIONS, f"reached epochs={epochs}"
    bar = progress_bar(range(epochs), desc=desc, show=show_progress)
    epoch = 0
    for epoch in bar:
        for m in modules:
            m.train()
        if epoch == 0:
            epoch_batches = first_batches
        else:
            epoch_batches = [None] if batches is None else list(batches(epoch))
        total, count, any_grad = 0.0, 0, False
        for batch in epoch_batches:
            if lr_schedule == "cosine":
                frac = min(step / total_steps, 1.0)
                factor = final_lr_ratio + (1 - final_lr_ratio) * 0.5 * (
                    1 + math.cos(math.pi * frac)
                )
                for group in optimizer.param_groups:
                    group["lr"] = group["initial_lr"] * factor
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn() if batch is None else loss_fn(batch)
            value = float(loss.detach())
            if not math.isfinite(value):
                _fail(result, modules, last_good, desc, f"the loss is {value} at epoch {epoch}",
                      start)  # fmt: skip
            if loss.requires_grad:
                loss.backward()
            any_grad = any_grad or any(
                p.grad is not None and bool(p.grad.abs().max() > 0) for p in params
            )
            optimizer.step()
            if after_step is not None:
                after_step()
            step += 1
            total += value
            count += 1
        result.losses.append(total / max(count, 1))
        if not any_grad:
            result.add_problem(OptimizerStallWarning.__name__)
            warnings.warn(
                f"{desc}: no parameter received a non-zero gradient in epoch {epoch}; the "
                "optimiser cannot step. Check that the trained parameters require grad and "
                "enter the loss.",
                OptimizerStallWarning,
                stacklevel=2,
            )
            stop, message = StopReason.STALLED, "no parameter received a gradient"
            epoch += 1
            break
        if (epoch + 1) % snapshot_every == 0 or epoch == epochs - 1:
            bad = [n for m in modules for n, p in m.named_parameters() if not p.isfinite().all()]
            if bad:
                _fail(result, modules, last_good, desc,
                      f"non-finite parameters after epoch {epoch}: {bad[:5]}", start)  # fmt: skip
            last_good = _state(modules)
        if validation is not None and ((epoch + 1) % eval_every == 0 or epoch == epochs - 1):
            value = _checked_validation(validation, modules, desc)
            result.validation_losses.append(value)
            result.validation_steps.append(epoch + 1)
            if value < best_value:
                best_value, best_state, result.best_step = value, _state(modules), epoch + 1
                checks_without_improvement = 0
            else:
                checks_without_improvement += 1
                if (
                    patience is not None
                    and checks_without_improvement >= patience
                    and (min_steps is None or step >= min_steps)
                ):
                    stop = StopReason.EARLY_STOPPED
                    message = f"validation loss did not improve for {patience} checks"
                    epoch += 1
                    break
        if (
            rtol is not None
            and len(result.losses) >= 2 * window
            and (min_steps is None or step >= min_steps)
        ):
            recent = sum(result.losses[-window:]) / window
            before = sum(result.losses[-2 * window : -window]) / window
            if abs(before - recent) <= rtol * max(1.0, abs(recent)):
                stop = StopReason.CONVERGED
                message = f"mean loss changed by less than rtol={rtol:g} over {window} epochs"
                epoch += 1
                break
        if callback is not None and callback(epoch, result.losses[-1], result):
            stop, message = StopReason.CALLBACK, "the callback asked to stop"
            epoch += 1
            break
    else:
        epoch = epochs
    bar.close()
    result.grad_norm = _grad_norm(params)
    if best_state is not None:
        _restore(modules, best_state)
        if result.best_step != epoch:
            result.grad_norm = math.nan
            message += f"; restored the validation-best state of epoch {result.best_step}"
    for m, mode in zip(modules, was_training):
        m.train(mode)
    if warn_unconverged and stop == StopReason.MAX_ITERATIONS and best_state is None:
        falling = still_improving(result.losses)
        if falling is not None:
            result.add_problem(ConvergenceWarning.__name__)
            warnings.warn(
                f"{desc}: the budget of {step} optimiser steps ({epoch} epochs) ended while the "
                f"training loss was still falling ({falling}); the fit is probably "
                "undertrained. Raise the step budget (min_steps / epochs) or the learning rate.",
                ConvergenceWarning,
                stacklevel=2,
            )
    result.stop_reason, result.message = stop, message
    result.num_iterations = epoch
    result.num_evaluations = step
    result.seconds = time.perf_counter() - start
    return result


def still_improving(losses: Sequence[float], *, rel_tol: float = 1e-3) -> str | None:
    """Whether a loss trace is still clearly falling at its end; a description if so.

    Compares the mean of the last tenth of the trace (at least 5 entries) with the tenth
    before: falling if the drop exceeds three standard errors of the last tenth and
    ``rel_tol * max(1, |mean|)``.  Traces of 2 to 9 entries: falling if the last entry is
    below the one before by more than ``0.01 max(1, |last|)``.  ``None`` when not falling.
    """
    n = len(losses)
    if 2 <= n < 10:  # too short for windows: a last epoch that still lowered the loss by 1%
        a, b = float(losses[-2]), float(losses[-1])
        if math.isfinite(a) and math.isfinite(b) and a - b > 0.01 * max(1.0, abs(b)):
            return f"last epoch {b:.4g}, the one before {a:.4g}"
        return None
    w = max(5, n // 10)
    if n < 2 * w:
        return None
    last = torch.tensor(losses[-w:], dtype=torch.float64)
    before = torch.tensor(losses[-2 * w : -w], dtype=torch.float64)
    if not (bool(torch.isfinite(last).all()) and bool(torch.isfinite(before).all())):
        return None
    drop = float(before.mean() - last.mean())
    se = float(last.std() / math.sqrt(w))
    if drop > 3 * se and drop > rel_tol * max(1.0, abs(float(last.mean()))):
        return f"mean over the last {w} epochs {float(last.mean()):.4g}, before {float(before.mean()):.4g}"
    return None


def _checked_validation(validation, modules, desc) -> float:
    value = float(validation())
    return value if math.isfinite(value) else math.inf


def _fail(result, modules, last_good, desc, what, start) -> None:
    _restore(modules, last_good)
    result.stop_reason = StopReason.FAILED
    result.message = what
    result.seconds = time.perf_counter() - start
    raise FitError(
        f"{desc}: {what}; the last finite state was restored. Lower the learning rate, "
        "standardise the data, or check the inputs for extreme values.",
        result,
    )

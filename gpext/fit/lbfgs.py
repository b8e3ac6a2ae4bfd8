r"""L-BFGS whose line search rejects trial points where the loss cannot be evaluated.

``torch.optim.LBFGS(max_iter=1, line_search_fn="strong_wolfe")`` gives the line search a budget
of zero extra evaluations, so a trial step that raises the loss becomes no step and the
unchanged loss reads as convergence; with a real budget, a trial point with a tiny lengthscale
makes the Cholesky factorisation raise and the whole fit crashes.  scipy's L-BFGS-B, given
``inf`` at such a point, returns to the previous iterate and reports convergence.  This
implementation treats a failed evaluation as a rejected trial point: the step is shortened
(by ``10x``) and the search goes on, and the fit says how it stopped.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable, Sequence

import torch
from linear_operator.utils.errors import NanError, NotPSDError

from gpext.errors import (
    ConvergenceWarning,
    FitError,
    InputDataError,
    NumericalError,
    NumericalWarning,
    OptimizerStallWarning,
    expected_got,
)
from gpext.fit.fit_result import FitResult, StopReason
from gpext.utils import check_positive_int, progress_bar

__all__ = ["EVALUATION_ERRORS", "minimize_lbfgs"]

#: Exceptions that mark a trial point as rejected instead of ending the fit.
EVALUATION_ERRORS: tuple[type[BaseException], ...] = (
    NotPSDError,
    NanError,
    NumericalError,
    torch.linalg.LinAlgError,
)


def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


class _Objective:
    """Loss and gradient at a flat parameter vector; failures become ``(inf, None)``."""

    def __init__(self, closure: Callable[[], torch.Tensor], params: list[torch.nn.Parameter]):
        self.closure = closure
        self.params = params
        self.num_evaluations = 0
        self.rejected = 0
        self.last_error = ""

    def set(self, x: torch.Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(x[offset : offset + n].view_as(p))
                offset += n

    def __call__(self, x: torch.Tensor) -> tuple[float, torch.Tensor | None]:
        self.set(x)
        self.num_evaluations += 1
        for p in self.params:
            p.grad = None
        try:
            with warnings.catch_warnings():
                # jitter retries inside a trial point are expected while searching
                warnings.simplefilter("ignore", NumericalWarning)
                loss = self.closure()
                if not torch.isfinite(loss).all():
                    raise NanError(f"non-finite loss {float(loss.detach())}")
                loss.backward()
        except EVALUATION_ERRORS as err:
            self.rejected += 1
            self.last_error = f"{type(err).__name__}: {err}"
            return math.inf, None
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.detach() for p in self.params]
        g = _flat(grads).to(x)
        if not bool(torch.isfinite(g).all()):
            self.rejected += 1
            self.last_error = "non-finite gradient"
            return math.inf, None
        return float(loss.detach()), g


def minimize_lbfgs(
    closure: Callable[[], torch.Tensor],
    parameters: Iterable[torch.nn.Parameter],
    *,
    max_iter: int = 200,
    max_eval: int | None = None,
    history_size: int = 20,
    max_line_search: int = 20,
    gtol: float = 1e-5,
    ftol: float = 1e-9,
    ftol_patience: int = 3,
    callback: Callable[[int, float], bool | None] | None = None,
    warn_on_stall: bool = True,
    budget_rtol: float = 1e-3,
    show_progress: bool | None = None,
    desc: str = "L-BFGS",
) -> FitResult:
    r"""Minimise ``closure()`` over ``parameters`` by L-BFGS with a rejecting line search.

    The search direction is the two-loop L-BFGS recursion over the last ``history_size``
    pairs :math:`(s_k, y_k)` (pairs with :math:`s_k^\top y_k \le 0` are skipped).  The step
    length :math:`t` must satisfy the Armijo condition
    :math:`f(x + t d) \le f(x) + 10^{-4}\, t\, \nabla f^\top d`; it is expanded while the
    curvature condition :math:`\nabla f(x + t d)^\top d \ge 0.9\, \nabla f(x)^\top d` fails,
    shortened by safeguarded quadratic interpolation when Armijo fails, and shortened
    ``10x`` when the loss cannot be evaluated at the trial point (one of
    :data:`EVALUATION_ERRORS`, or a non-finite loss or gradient): such a point is *rejected*,
    never accepted and never fatal.  When no step is found the history is dropped and a
    steepest-descent step is tried before the fit is declared stalled.

    Stopping rules: gradient norm :math:`\|\nabla f\|_\infty \le` ``gtol`` (converged);
    relative decrease :math:`|f_{k-1} - f_k| \le` ``ftol`` :math:`\max(1, |f_k|)` on
    ``ftol_patience`` consecutive iterations (converged); ``max_iter`` iterations or
    ``max_eval`` evaluations; no acceptable step (stalled: an
    :class:`~gpext.errors.OptimizerStallWarning` when the gradient is not small).

    Args:
        closure: Computes the scalar loss from the current parameter values (it must not
            call ``backward``; this function does).
        parameters: The parameters to optimise (those with ``requires_grad``).
        max_iter: Maximum iterations.
        max_eval: Maximum loss evaluations (default ``2 * max_iter + 20``).
        history_size: Number of stored L-BFGS pairs.
        max_line_search: Evaluations per line search.
        gtol: Tolerance on the gradient's largest absolute entry.
        ftol: Relative tolerance on the loss decrease.
        ftol_patience: Consecutive small decreases needed to stop.
        callback: Called as ``callback(iteration, loss)`` after each iteration; returning
            ``True`` stops the fit.
        warn_on_stall: Issue :class:`~gpext.errors.OptimizerStallWarning` on a stall.
        budget_rtol: When ``max_iter`` ends the fit and the loss fell by more than this
            (relative) over the last tenth of the iterations, a
            :class:`~gpext.errors.ConvergenceWarning` is issued.
        show_progress: Progress bar (``None``: only on a terminal).
        desc: Progress-bar label.

    Returns:
        A :class:`~gpext.fit.FitResult`; the parameters hold the best point found.

    Raises:
        FitError: If the loss cannot be evaluated at the initial parameters (the parameters
            are restored first).
        InputDataError: For invalid settings.

    Example:
        >>> w = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
        >>> target = torch.tensor([1.0, -2.0, 3.0], dtype=torch.float64)
        >>> res = minimize_lbfgs(lambda: ((w - target) ** 2).sum(), [w])
        >>> res.stop_reason.value, torch.allclose(w.detach(), target)
        ('converged', True)
    """
    params = [p for p in parameters if p.requires_grad]
    if not params:
        raise InputDataError(
            expected_got("minimize_lbfgs.parameters", "at least one parameter with requires_grad",
                         "none")
        )  # fmt: skip
    max_iter = check_positive_int(max_iter, "minimize_lbfgs.max_iter")
    max_eval = 2 * max_iter + 20 if max_eval is None else check_positive_int(max_eval, "max_eval")
    history_size = check_positive_int(history_size, "minimize_lbfgs.history_size")
    max_line_search = check_positive_int(max_line_search, "minimize_lbfgs.max_line_search")
    start = time.perf_counter()
    obj = _Objective(closure, params)
    x = _flat([p.detach() for p in params]).clone()
    x0 = x.clone()
    result = FitResult()
    f, g = obj(x)
    if g is None:
        obj.set(x0)
        result.stop_reason = StopReason.FAILED
        result.num_evaluations = obj.num_evaluations
        result.message = f"the loss cannot be evaluated at the initial point ({obj.last_error})"
        raise FitError(
            f"minimize_lbfgs: {result.message}. Check the data and the initial "
            "hyperparameters (e.g. standardise the inputs and targets).",
            result,
        )
    result.losses.append(f)
    s_hist: list[torch.Tensor] = []
    y_hist: list[torch.Tensor] = []
    small_steps = 0
    stop, message = StopReason.MAX_ITERATIONS, f"reached max_iter={max_iter}"
    bar = progress_bar(range(max_iter), desc=desc, show=show_progress)
    it = 0
    for it in bar:
        if float(g.abs().max()) <= gtol:
            stop, message = StopReason.CONVERGED, f"gradient norm below gtol={gtol:g}"
            break
        step = None
        for attempt in range(2):  # L-BFGS direction, then steepest descent
            if attempt == 1 or not s_hist:
                s_hist.clear()
                y_hist.clear()
                d = -g
                t0 = min(1.0, 1.0 / float(g.abs().sum()))
            else:
                d = -_two_loop(g, s_hist, y_hist)
                t0 = 1.0
            gtd = float(g @ d)
            if gtd >= 0:  # not a descent direction: drop the curvature history
                continue
            step = _line_search(obj, x, f, g, d, gtd, t0, max_line_search, max_eval)
            if step is not None or obj.num_evaluations >= max_eval:
                break
        if step is None:
            if obj.num_evaluations >= max_eval:
                stop, message = StopReason.MAX_EVALUATIONS, f"reached max_eval={max_eval}"
            else:
                stop = StopReason.STALLED
                message = "the line search found no acceptable step"
                if obj.rejected:
                    message += f" (last rejected trial point: {obj.last_error})"
            break
        t, f_new, g_new = step
        s = t * d
        yv = g_new - g
        sy = float(s @ yv)
        if sy > 1e-10 * float(yv @ yv):
            s_hist.append(s)
            y_hist.append(yv)
            if len(s_hist) > history_size:
                s_hist.pop(0)
                y_hist.pop(0)
        x = x + s
        small = abs(f - f_new) <= ftol * max(1.0, abs(f_new))
        f, g = f_new, g_new
        result.losses.append(f)
        small_steps = small_steps + 1 if small else 0
        if callback is not None and callback(it, f):
            stop, message = StopReason.CALLBACK, "the callback asked to stop"
            it += 1
            break
        if small_steps >= ftol_patience:
            stop = StopReason.CONVERGED
            message = f"relative loss decrease below ftol={ftol:g} on {ftol_patience} iterations"
            it += 1
            break
        if obj.num_evaluations >= max_eval:
            stop, message = StopReason.MAX_EVALUATIONS, f"reached max_eval={max_eval}"
            it += 1
            break
    else:
        it = max_iter
    bar.close()
    obj.set(x)  # the accepted point (the last evaluation may have been a rejected trial)
    result.stop_reason = stop
    result.message = message
    result.num_iterations = it
    result.num_evaluations = obj.num_evaluations
    result.rejected_points = obj.rejected
    result.grad_norm = float(g.norm())
    if stop == StopReason.STALLED:
        if float(g.abs().max()) <= max(gtol, 1e-3):
            # no decrease possible at a near-stationary point: that is convergence
            result.stop_reason = StopReason.CONVERGED
            result.message = message + " at a near-stationary point"
        else:
            result.add_problem(OptimizerStallWarning.__name__)
            if warn_on_stall:
                warnings.warn(
                    f"{desc}: the optimiser stopped because it could not step ({message}) while "
                    f"the gradient norm is {result.grad_norm:.3g}; the fit is probably not at "
                    "an optimum. Standardise the data, change the initial values, or use more "
                    "restarts.",
                    OptimizerStallWarning,
                    stacklevel=2,
                )
    if stop == StopReason.MAX_ITERATIONS and len(result.losses) >= 10:
        k = max(2, len(result.losses) // 10)
        drop = result.losses[-k] - result.losses[-1]
        if drop > budget_rtol * max(1.0, abs(result.losses[-1])):
            result.add_problem(ConvergenceWarning.__name__)
            warnings.warn(
                f"{desc}: stopped at max_iter={max_iter} while the loss was still falling "
                f"({result.losses[-k]:.6g} -> {result.losses[-1]:.6g} over the last {k - 1} "
                "iterations); raise max_iter.",
                ConvergenceWarning,
                stacklevel=2,
            )
    result.seconds = time.perf_counter() - start
    return result


def _two_loop(g: torch.Tensor, s_hist: list, y_hist: list) -> torch.Tensor:
    """The L-BFGS product ``H g`` (Nocedal & Wright, Algorithm 7.4)."""
    q = g.clone()
    alphas = []
    rhos = [1.0 / float(y @ s) for s, y in zip(s_hist, y_hist)]
    for s, y, rho in zip(reversed(s_hist), reversed(y_hist), reversed(rhos)):
        a = rho * float(s @ q)
        alphas.append(a)
        q = q - a * y
    gamma = float(s_hist[-1] @ y_hist[-1]) / float(y_hist[-1] @ y_hist[-1])
    r = gamma * q
    for (s, y, rho), a in zip(zip(s_hist, y_hist, rhos), reversed(alphas)):
        b = rho * float(y @ r)
        r = r + (a - b) * s
    return r


def _line_search(obj, x, f, g, d, gtd, t, max_ls, max_eval, c1=1e-4, c2=0.9):
    """Armijo/weak-Wolfe search; rejected points shrink the step.  ``None``: no step found."""
    best = None
    t_hi = None  # smallest step known to be too long (Armijo failure or rejection)
    for _ in range(max_ls):
        if obj.num_evaluations >= max_eval:
            break
        f_new, g_new = obj(x + t * d)
        if g_new is None:  # rejected trial point
            t_hi = t
            if best is not None:
                break
            t = 0.1 * t
            continue
        if f_new > f + c1 * t * gtd or (best is not None and f_new >= best[1]):
            t_hi = t
            if best is not None:
                break
            # minimiser of the quadratic through f, gtd and f_new, kept in [0.1 t, 0.5 t]
            denom = 2.0 * (f_new - f - gtd * t)
            t_q = -gtd * t * t / denom if denom > 0 else 0.5 * t
            t = min(max(t_q, 0.1 * t), 0.5 * t)
            continue
        best = (t, f_new, g_new)
        if float(g_new @ d) >= c2 * gtd or t_hi is not None:
            break
        t = 2.5 * t if t_hi is None else 0.5 * (t + t_hi)
    return best

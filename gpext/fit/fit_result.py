"""The one result type every gpext fit returns: how the fit went and why it stopped."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["FitResult", "RestartRecord", "StopReason"]


class StopReason(str, Enum):
    """Why an optimisation stopped (compare with ``botorch.optim.core.OptimizationStatus``).

    Attributes:
        CONVERGED: A stopping rule was met (small gradient, small relative change of the loss
            or of the parameters).
        MAX_ITERATIONS: The iteration (or epoch) budget was used up.
        MAX_EVALUATIONS: The budget of loss evaluations was used up.
        EARLY_STOPPED: Validation early stopping: the validation loss did not improve for
            ``patience`` checks.
        STALLED: The optimiser could not take a step (every trial point of a line search was
            rejected, or no parameter received a gradient).
        CALLBACK: A callback asked to stop.
        FAILED: A non-finite loss or parameter (the state was restored before raising).
    """

    CONVERGED = "converged"
    MAX_ITERATIONS = "max_iterations"
    MAX_EVALUATIONS = "max_evaluations"
    EARLY_STOPPED = "early_stopped"
    STALLED = "stalled"
    CALLBACK = "callback"
    FAILED = "failed"

    def __str__(self) -> str:
        return self.value


@dataclass
class RestartRecord:
    """One start of a multi-start fit.

    Attributes:
        loss: Final loss of this start (``inf`` if it failed).
        stop_reason: Why this start stopped.
        num_evaluations: Loss evaluations it used.
        message: Details (the error text of a failed start).
    """

    loss: float
    stop_reason: StopReason
    num_evaluations: int = 0
    message: str = ""


@dataclass
class FitResult:
    """What a gpext fit did: the loss trace, why it stopped and which problems it found.

    Every model's ``fit`` (and the engine functions :func:`gpext.fit.train_loop`,
    :func:`gpext.fit.minimize_lbfgs` and :func:`gpext.fit.fit_exact_gp`) returns one.  The
    problems listed are also issued as warnings (subclasses of
    :class:`gpext.errors.FitWarning`), so a fit never ends degenerate in silence.

    Attributes:
        losses: The training loss per iteration (L-BFGS) or per epoch (minibatch loops;
            the mean minibatch loss).
        stop_reason: Why the optimiser stopped.
        message: A sentence on how it stopped.
        num_iterations: Iterations (L-BFGS) or epochs / steps (first-order loops) taken.
        num_evaluations: Loss (and gradient) evaluations.
        grad_norm: Euclidean norm of the gradient of the loss at the end (``nan`` if unknown,
            e.g. after restoring a validation-best state).
        validation_losses: Validation losses, one per check.
        validation_steps: The epoch (or step) of each check.
        best_step: The epoch / step whose state was restored (``None``: the final state).
        restarts: One record per start of a multi-start fit (empty for a single start).
        rejected_points: Trial points rejected because the loss failed to evaluate (a failed
            Cholesky factorisation, a non-finite loss).
        problems: Names of the fit warnings issued, e.g. ``["VarianceCollapseWarning"]``.
        history: Further per-epoch traces (for instance ``"w2"`` of the GWI objective).
        seconds: Wall-clock time of the fit.
    """

    losses: list[float] = field(default_factory=list)
    stop_reason: StopReason = StopReason.MAX_ITERATIONS
    message: str = ""
    num_iterations: int = 0
    num_evaluations: int = 0
    grad_norm: float = math.nan
    validation_losses: list[float] = field(default_factory=list)
    validation_steps: list[int] = field(default_factory=list)
    best_step: int | None = None
    restarts: list[RestartRecord] = field(default_factory=list)
    rejected_points: int = 0
    problems: list[str] = field(default_factory=list)
    history: dict[str, list[float]] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def final_loss(self) -> float:
        """The last training loss (``nan`` when there is none)."""
        return self.losses[-1] if self.losses else math.nan

    @property
    def converged(self) -> bool:
        """Whether a convergence or early-stopping rule ended the fit."""
        return self.stop_reason in (StopReason.CONVERGED, StopReason.EARLY_STOPPED)

    @property
    def ok(self) -> bool:
        """Whether the fit found no problem (no fit warning was issued)."""
        return not self.problems and self.stop_reason not in (
            StopReason.STALLED,
            StopReason.FAILED,
        )

    def add_problem(self, name: str) -> None:
        """Record the name of a fit warning (once)."""
        if name not in self.problems:
            self.problems.append(name)

    def __repr__(self) -> str:
        parts = [
            f"stop_reason={self.stop_reason.value!r}",
            f"final_loss={self.final_loss:.6g}",
            f"num_iterations={self.num_iterations}",
            f"num_evaluations={self.num_evaluations}",
            f"grad_norm={self.grad_norm:.3g}",
        ]
        if self.restarts:
            parts.append(f"restarts={len(self.restarts)}")
        if self.rejected_points:
            parts.append(f"rejected_points={self.rejected_points}")
        if self.problems:
            parts.append(f"problems={self.problems}")
        parts.append(f"seconds={self.seconds:.3g}")
        return "FitResult(" + ", ".join(parts) + ")"

"""Exceptions and warnings raised by gpext.

Every error gpext raises on purpose derives from :class:`GpextError`.  Errors about
user input also derive from :class:`ValueError` (or :class:`TypeError`), so code that
already catches the built-ins keeps working, in the style of BoTorch's
``InputDataError(BotorchError, ValueError)``.

Messages follow one pattern: *what was expected*, *what was received*, *how to fix it*.
Use :func:`expected_got` to build them consistently.
"""

from __future__ import annotations

from linear_operator.utils.warnings import NumericalWarning as _LinearOperatorNumericalWarning

__all__ = [
    "GpextError",
    "InputDataError",
    "ShapeError",
    "InputTypeError",
    "NotFittedError",
    "DatasetNotFoundError",
    "DataFormatError",
    "NumericalError",
    "FitError",
    "MissingExtraError",
    "GpextWarning",
    "NumericalWarning",
    "DataWarning",
    "BatchNormWarning",
    "FitWarning",
    "VarianceCollapseWarning",
    "ConstantPredictionWarning",
    "OptimizerStallWarning",
    "ConvergenceWarning",
    "NoSignalWarning",
    "ReferenceGapWarning",
    "MiscalibrationWarning",
    "OverconfidenceWarning",
    "UnderconfidenceWarning",
    "expected_got",
]


class GpextError(Exception):
    """Base class of every error raised by gpext."""


class InputDataError(GpextError, ValueError):
    """An argument has an invalid value (wrong range, non-finite entries, bad labels)."""


class ShapeError(InputDataError):
    """A tensor argument has an incompatible shape."""


class InputTypeError(GpextError, TypeError):
    """An argument has the wrong type (e.g. a float tensor where integer labels are needed)."""


class NotFittedError(GpextError, RuntimeError):
    """A method needs state that is produced by an earlier call (``fit``, ``update``, ...)."""


class DatasetNotFoundError(InputDataError, FileNotFoundError):
    """A dataset name or data directory could not be resolved."""


class DataFormatError(InputDataError):
    """A data file exists but cannot be parsed, or it contains NaNs / inconsistent indices."""


class NumericalError(GpextError, RuntimeError):
    """A numerical procedure failed (non-PSD matrix, failed factorisation, NaN result)."""


class FitError(NumericalError):
    """A fit produced a non-finite loss or non-finite parameters.

    The fitting engine (:mod:`gpext.fit`) restores the last finite state of the model before
    raising, so the model is usable (and inspectable) afterwards.  ``result`` holds the
    :class:`gpext.fit.FitResult` of the fit up to the failure (``None`` if there is none).
    """

    def __init__(self, message: str, result: object | None = None) -> None:
        super().__init__(message)
        self.result = result


class MissingExtraError(GpextError, ImportError):
    """An optional dependency of gpext (an extra such as ``gpext[botorch]``) is not installed."""


class GpextWarning(UserWarning):
    """Base class of every warning issued by gpext."""


class NumericalWarning(GpextWarning, _LinearOperatorNumericalWarning):
    """A numerical fallback was used (jitter added, eigenvalues clamped, ...).

    Also a ``linear_operator.utils.warnings.NumericalWarning`` (the class GPyTorch's jitter
    warnings use, itself a :class:`RuntimeWarning`), so a filter on that class, e.g.
    ``warnings.filterwarnings("ignore", category=linear_operator.utils.warnings.NumericalWarning)``,
    applies to gpext's numerical warnings as well; a filter on this class leaves
    linear_operator's own warnings alone.
    """


class DataWarning(GpextWarning):
    """Something about the data looks suspicious but was handled."""


class BatchNormWarning(GpextWarning):
    """A batch-norm network is evaluated with running statistics that may not match its weights.

    E.g. sampled weights predicted without inputs to recompute the statistics (pass
    ``bn_inputs``, see :func:`gpext.subspace.refresh_batch_norm`): the statistics are then
    those last accumulated in training, which belong to other weights.
    """


class FitWarning(GpextWarning):
    """A fit finished but its result is doubtful (base class of the fit diagnostics)."""


class VarianceCollapseWarning(FitWarning):
    """The signal variance collapsed into the noise: the model explains (almost) nothing.

    Raised when a fitted signal-to-noise ratio is tiny (an exact GP with outputscale ~1e-8 and
    all variance in the noise) or when a model's predictive mean explains only a small share of
    the training targets' variance while the learned noise holds the rest.
    """


class ConstantPredictionWarning(FitWarning):
    """A fitted model predicts (nearly) the same value at every training input."""


class OptimizerStallWarning(FitWarning):
    """The loss stopped improving because the optimiser could not take a step.

    For instance every trial point of a line search failed (a Cholesky factorisation or a
    non-finite loss) while the gradient was still large, or no parameter received a gradient.
    """


class ConvergenceWarning(FitWarning):
    """The optimiser used its whole budget while the loss was still clearly improving."""


class NoSignalWarning(FitWarning):
    r"""On rows the fit did not train on, the model predicts no better than the training mean.

    Held-out (or cross-validated) :math:`R^2 \le 0`: either the targets carry no signal about
    the inputs, or the fit failed to find it; either way its predictive mean is worthless.
    """


class ReferenceGapWarning(FitWarning):
    r"""On rows the fit did not train on, the model is clearly worse than a plain exact GP.

    Its held-out negative log-likelihood per point exceeds that of a GPyTorch-style exact GP
    (:func:`gpext.fit.build_exact_gp` + :func:`gpext.fit.fit_exact_gp`) fitted to the same
    training rows by more than :data:`gpext.fit.checks.REFERENCE_NLL_MARGIN` nats: on this
    table the model's extra flexibility costs more than it buys (typically a network on a few
    hundred rows or fewer).  Use the exact GP, or a model with fewer parameters.
    """


class MiscalibrationWarning(FitWarning):
    """The predictive intervals are far off on rows the fit did not train on."""


class OverconfidenceWarning(MiscalibrationWarning):
    """Held-out targets fall outside the central 95% interval far more often than 5%."""


class UnderconfidenceWarning(MiscalibrationWarning):
    """The predictive variances are several times the held-out squared errors."""


def expected_got(what: str, expected: str, got: object, fix: str | None = None) -> str:
    """Format an error message that names what was expected, what was received and the fix.

    The message reads ``"<what>: expected <expected>, got <got>. <fix>"``.

    Args:
        what: Name of the argument or object being checked, e.g. ``"DirichletTransform.labels"``.
        expected: Description of the accepted values.
        got: The offending value or a description of it.
        fix: Optional hint on how to fix the problem.

    Returns:
        The formatted message.
    """
    msg = f"{what}: expected {expected}, got {got}."
    if fix:
        msg += f" {fix}"
    return msg

r"""One fitting engine for every gpext model.

* :func:`train_loop`: the first-order loop (minibatches or full batch, learning-rate schedule,
  validation early stopping that restores the best state, a stopping rule, callbacks, progress
  bar, failure detection).
* :func:`minimize_lbfgs`: L-BFGS whose line search treats a failed evaluation (a Cholesky
  factorisation that fails, a non-finite loss) as a rejected trial point.
* :func:`fit_exact_gp` with :func:`build_exact_gp`: MAP hyperparameters of exact GPs with
  dimension-scaled default priors, several starts and an Adam fallback.
* :func:`minimize_scalar_on_grid`: grid plus golden-section search for the one-parameter
  calibrations on held-out rows.
* :class:`TemperatureSelection`: what every model's ``select_temperature`` returns;
  :class:`HyperparameterSelection`: what the held-out tuning of :mod:`gpext.subspace.tuning`
  returns (noise, SWAG scale, prior scale, temperature, likelihood).
* :class:`FitResult`: what every fit returns (loss trace, stop reason, final gradient norm,
  restarts, problems found).
* Degenerate-fit checks that issue named warnings: :func:`check_signal_to_noise`,
  :func:`check_predictions_vary`, :func:`check_explained_variance` on the training rows, and
  :func:`check_heldout` on rows the fit did not train on (held-out :math:`R^2 \le 0`:
  :class:`NoSignalWarning`; interval coverage and mean squared z-score:
  :class:`OverconfidenceWarning` / :class:`UnderconfidenceWarning`), with
  :func:`holdout_refit_check` for fits that keep no rows and :func:`exact_gp_loo` for exact GPs.
* :class:`Standardizer`: the data contract (inputs and regression targets standardised inside
  every model, predictions in the original units, stored in the state dict).
* Budgets in optimiser steps: :func:`train_loop`'s ``min_steps``, and a
  :class:`ConvergenceWarning` when the budget ends while the loss is still falling.
"""

from gpext.errors import (
    ConstantPredictionWarning,
    ConvergenceWarning,
    FitError,
    FitWarning,
    MiscalibrationWarning,
    NoSignalWarning,
    OptimizerStallWarning,
    OverconfidenceWarning,
    ReferenceGapWarning,
    UnderconfidenceWarning,
    VarianceCollapseWarning,
)
from gpext.fit.checks import (
    MIN_CHECK_POINTS,
    HeldoutCheck,
    check_heldout,
    exact_gp_loo,
    holdout_refit_check,
    holdout_split,
    refit_split,
)
from gpext.fit.diagnostics import (
    AUTO_VALIDATION_MIN_POINTS,
    AUTO_VALIDATION_MIN_ROWS,
    check_explained_variance,
    check_predictions_vary,
    check_signal_to_noise,
    validation_rows,
)
from gpext.fit.exact_gp import (
    MultiOutputExactGP,
    StandardizedGaussianLikelihood,
    build_exact_gp,
    diagnose_exact_gp,
    fit_exact_gp,
    lengthscale_prior,
    log_prior,
    reference_heldout_nll,
)
from gpext.fit.fit_result import FitResult, RestartRecord, StopReason
from gpext.fit.lbfgs import EVALUATION_ERRORS, minimize_lbfgs
from gpext.fit.scalar_search import minimize_scalar_on_grid
from gpext.fit.standardize import Standardizer
from gpext.fit.temperature import HyperparameterSelection, TemperatureSelection
from gpext.fit.train_loop import minibatch_indices, still_improving, train_loop

__all__ = [
    "AUTO_VALIDATION_MIN_POINTS",
    "AUTO_VALIDATION_MIN_ROWS",
    "MIN_CHECK_POINTS",
    "HeldoutCheck",
    "MiscalibrationWarning",
    "NoSignalWarning",
    "ReferenceGapWarning",
    "OverconfidenceWarning",
    "StandardizedGaussianLikelihood",
    "Standardizer",
    "UnderconfidenceWarning",
    "check_heldout",
    "exact_gp_loo",
    "holdout_refit_check",
    "holdout_split",
    "reference_heldout_nll",
    "refit_split",
    "still_improving",
    "validation_rows",
    "EVALUATION_ERRORS",
    "ConstantPredictionWarning",
    "ConvergenceWarning",
    "FitError",
    "FitResult",
    "FitWarning",
    "HyperparameterSelection",
    "MultiOutputExactGP",
    "OptimizerStallWarning",
    "RestartRecord",
    "StopReason",
    "TemperatureSelection",
    "VarianceCollapseWarning",
    "build_exact_gp",
    "check_explained_variance",
    "check_predictions_vary",
    "check_signal_to_noise",
    "diagnose_exact_gp",
    "fit_exact_gp",
    "minimize_scalar_on_grid",
    "lengthscale_prior",
    "log_prior",
    "minibatch_indices",
    "minimize_lbfgs",
    "train_loop",
]

"""Evaluation metrics for probabilistic regression and classification.

Regression metrics take a predictive mean and variance per test point (a Gaussian predictive
distribution) or a stack of ``K`` Gaussian components (ensemble members, posterior samples) that
form an equally or explicitly weighted mixture. Classification metrics take class probabilities of
shape ``(N, C)`` and integer labels of shape ``(N,)``.

Conventions shared by every function:

* Inputs may be :class:`torch.Tensor` or numpy arrays (anything :func:`numpy.asarray` accepts);
  they are detached, converted to tensors, moved to the device of the first tensor argument and
  cast to a common floating dtype (the promotion of the floating inputs, or the default dtype when
  none is floating). ``float16``/``bfloat16`` inputs are computed in ``float32``; ``float32`` and
  ``float64`` inputs are computed in their own dtype.
* Scalar metrics are returned as a Python :class:`float`.
* Invalid input raises :class:`~gpext.errors.InputDataError` (bad values: NaN, non-positive
  variances, probabilities off the simplex, labels out of range, empty inputs),
  :class:`~gpext.errors.ShapeError` (incompatible shapes) or
  :class:`~gpext.errors.InputTypeError` (e.g. float labels), with a message that says what was
  expected, what was received and how to fix it.
"""

from gpext.metrics.classification import (
    brier_score,
    categorical_nll,
    categorical_nll_from_logits,
    error_rate,
    expected_calibration_error,
    reliability_diagram_data,
)
from gpext.metrics.regression import (
    gaussian_log_likelihood,
    interval_coverage,
    mixture_central_interval,
    mixture_gaussian_log_likelihood,
    mixture_interval_coverage,
    rmse,
)

__all__ = [
    "rmse",
    "gaussian_log_likelihood",
    "mixture_gaussian_log_likelihood",
    "interval_coverage",
    "mixture_central_interval",
    "mixture_interval_coverage",
    "error_rate",
    "categorical_nll",
    "categorical_nll_from_logits",
    "expected_calibration_error",
    "reliability_diagram_data",
    "brier_score",
]

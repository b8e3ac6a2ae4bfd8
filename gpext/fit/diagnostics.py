"""Checks for degenerate fits, shared by every model: each issues a named gpext warning."""

from __future__ import annotations

import warnings

import torch

from gpext.errors import ConstantPredictionWarning, VarianceCollapseWarning
from gpext.fit.fit_result import FitResult

__all__ = [
    "check_explained_variance",
    "check_predictions_vary",
    "check_signal_to_noise",
    "validation_rows",
]

#: Signal-to-noise variance ratio below which an exact GP's signal counts as collapsed.
MIN_SIGNAL_TO_NOISE = 1e-3
#: Relative spread of the training predictions below which they count as constant.
MIN_PREDICTION_SPREAD = 1e-3
#: Share of the training targets' variance a fit must explain before it counts as a fit.
MIN_EXPLAINED_VARIANCE = 0.1
#: Smallest training set from which default fits hold out rows for early stopping and
#: calibration (IGN's noise, GWI's temperature, the weight-subspace temperature).
AUTO_VALIDATION_MIN_POINTS = 200
#: Fewest rows (but at most a quarter of the data) a fit holds out when it holds out a
#: fraction for calibration: a variance factor or temperature estimated on :math:`m` rows has a
#: relative sd of about :math:`\sqrt{2/m}` (0.2 at 50 rows, 0.45 at 10).
AUTO_VALIDATION_MIN_ROWS = 50


def validation_rows(n: int, fraction: float, min_rows: int = AUTO_VALIDATION_MIN_ROWS) -> int:
    r"""How many of ``n`` rows a fit holds out for calibration and checks.

    :math:`\max(\operatorname{round}(f n), \min(m_{\min}, \lfloor n/4 \rfloor))` for a
    fraction :math:`f > 0` (0 for :math:`f = 0`): a plain 10% of a 60-row table is 6 rows, too
    few to calibrate a variance on or to run :func:`gpext.fit.check_heldout` (at least
    :data:`~gpext.fit.checks.MIN_CHECK_POINTS` rows).

    >>> validation_rows(60, 0.1), validation_rows(300, 0.1), validation_rows(5000, 0.1)
    (15, 50, 500)
    """
    if fraction <= 0:
        return 0
    return max(int(round(fraction * n)), min(int(min_rows), n // 4))


def _record(result: FitResult | None, category: type[Warning], message: str, stacklevel: int):
    if result is not None:
        result.add_problem(category.__name__)
    warnings.warn(message, category, stacklevel=stacklevel + 1)


def check_signal_to_noise(
    outputscale: torch.Tensor | float,
    noise: torch.Tensor | float,
    *,
    name: str,
    result: FitResult | None = None,
    threshold: float = MIN_SIGNAL_TO_NOISE,
    stacklevel: int = 2,
) -> bool:
    r"""Warn when the signal variance collapsed into the noise, :math:`s / \sigma^2 <` ``threshold``.

    Args:
        outputscale: Fitted signal variance(s) :math:`s`.
        noise: Fitted noise variance(s) :math:`\sigma^2` (a mean over points for per-point
            noise).
        name: What was fitted, for the message.
        result: A fit result to record the problem in.
        threshold: Smallest acceptable ratio.
        stacklevel: Passed on to :func:`warnings.warn` (counted from the caller).

    Returns:
        ``True`` when the fit is healthy.

    Warns:
        VarianceCollapseWarning: When the ratio is below ``threshold``.
    """
    s = torch.as_tensor(outputscale).detach().to(torch.float64).reshape(-1)
    n = torch.as_tensor(noise).detach().to(torch.float64).reshape(-1)
    ratio = float(s.min() / n.max().clamp_min(1e-300))
    if ratio >= threshold:
        return True
    _record(
        result,
        VarianceCollapseWarning,
        f"{name}: the signal variance collapsed into the noise (signal variance "
        f"{float(s.min()):.3g}, noise variance {float(n.max()):.3g}, ratio {ratio:.2g} < "
        f"{threshold:g}); the model is flat and its uncertainty is all noise. Use more "
        "restarts, priors on the hyperparameters, or fix the outputscale.",
        stacklevel,
    )
    return False


def check_predictions_vary(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    *,
    name: str,
    result: FitResult | None = None,
    threshold: float = MIN_PREDICTION_SPREAD,
    stacklevel: int = 2,
) -> bool:
    r"""Warn when the predictive means on the training inputs are (nearly) constant.

    The check is :math:`\operatorname{sd}(\hat y) < \text{threshold}\cdot\operatorname{sd}(y)`
    per output (column), skipped when the targets themselves are constant.

    Args:
        predictions: Predictive means at the training inputs.  # shape: (N,) or (N, C)
        targets: Training targets.  # shape: like ``predictions``
        name: What was fitted, for the message.
        result: A fit result to record the problem in.
        threshold: Relative spread below which predictions count as constant.
        stacklevel: Passed on to :func:`warnings.warn`.

    Returns:
        ``True`` when the predictions vary.

    Warns:
        ConstantPredictionWarning: When they do not.
    """
    p = predictions.detach().to(torch.float64).reshape(predictions.shape[0], -1)
    t = targets.detach().to(torch.float64).reshape(targets.shape[0], -1)
    if p.shape[0] < 2:
        return True
    sd_p, sd_t = p.std(0), t.std(0)
    live = sd_t > 0
    if not bool(live.any()):
        return True
    rel = sd_p[live] / sd_t[live]
    worst = float(rel.min())
    if worst >= threshold:
        return True
    _record(
        result,
        ConstantPredictionWarning,
        f"{name}: the predictions on the training inputs are nearly constant (their spread "
        f"is {worst:.2g} times the targets'); the fit is degenerate. Use more restarts or "
        "iterations, or check the data.",
        stacklevel,
    )
    return False


#: The advice of :func:`check_explained_variance` for networks (they have no GP hyperparameters).
NETWORK_FIT_ADVICE = (
    "Train longer (more epochs, or smaller minibatches on a small data set), raise the "
    "learning rate, or check that the inputs carry signal."
)


def check_explained_variance(
    predictions: torch.Tensor,
    targets: torch.Tensor,
    noise: float | None = None,
    *,
    name: str,
    result: FitResult | None = None,
    threshold: float = MIN_EXPLAINED_VARIANCE,
    stacklevel: int = 2,
    advice: str | None = None,
) -> bool:
    r"""Warn when a model explains less than ``threshold`` of its training targets' variance.

    :math:`R^2 = 1 - \overline{(y - \hat y)^2} / \overline{(y - \bar y)^2}` (per output; the smallest
    counts); a model whose learned
    noise holds (nearly) all of the variance while :math:`R^2 <` ``threshold`` has collapsed to
    the mean.

    Args:
        predictions: Predictive means on the training inputs.  # shape: (N,) or (N, C)
        targets: Training targets.  # shape: like ``predictions``
        noise: The learned noise variance, quoted in the message.
        name: What was fitted, for the message.
        result: A fit result to record the problem in.
        threshold: Smallest acceptable :math:`R^2`.
        stacklevel: Passed on to :func:`warnings.warn`.
        advice: What to try, ending the message (default: advice for GP models; networks pass
            their own, since they have no GP hyperparameters).

    Returns:
        ``True`` when the fit explains enough.

    Warns:
        VarianceCollapseWarning: When :math:`R^2 <` ``threshold``.
    """
    p = predictions.detach().to(torch.float64).reshape(predictions.shape[0], -1)
    t = targets.detach().to(torch.float64).reshape(targets.shape[0], -1)
    if t.shape[0] < 2:
        return True
    var_all = t.var(0, unbiased=False)  # the mean's own squared error: a mean predictor has R^2 0
    live = var_all > 0
    if not bool(live.any()):
        return True
    r2_cols = 1.0 - (t - p).pow(2).mean(0)[live] / var_all[live]
    r2 = float(r2_cols.min())
    var = float(var_all[live].mean())
    if r2 >= threshold:
        return True
    extra = (
        "" if noise is None else f", learned noise variance {noise:.3g} against Var(y) {var:.3g}"
    )
    _record(
        result,
        VarianceCollapseWarning,
        f"{name}: the fit explains only R^2 = {r2:.3f} of the training targets' variance"
        f"{extra}; it predicts close to the mean. "
        + (
            advice
            or "Train longer, raise the learning rate of the GP hyperparameters, or check that "
            "the inputs carry signal."
        ),
        stacklevel,
    )
    return False

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

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

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

_LOG_2PI = math.log(2.0 * math.pi)
_REDUCTIONS = ("mean", "sum", "none")
# Tolerance on |sum_c p_c - 1| per row, by the dtype the probabilities were given in.
_ROW_SUM_TOL = {torch.float64: 1e-6, torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 1e-2}
# Upper bound on the number of halvings in the mixture-quantile bisection.
_MAX_BISECTION_ITERS = 200


# --------------------------------------------------------------------------------------------
# Input conversion and validation helpers
# --------------------------------------------------------------------------------------------


def _to_tensor(x: Any, what: str) -> torch.Tensor:
    """Convert a tensor / numpy array / nested sequence to a detached real-valued tensor."""
    if isinstance(x, torch.Tensor):
        t = x.detach()
    else:
        try:
            arr = np.asarray(x)
        except (TypeError, ValueError) as exc:
            raise InputTypeError(
                expected_got(
                    what,
                    "a torch.Tensor or numpy array of real numbers",
                    type(x).__name__,
                    "Pass a tensor or a numeric numpy array.",
                )
            ) from exc
        if arr.dtype.kind not in "biuf":
            raise InputTypeError(
                expected_got(
                    what,
                    "a torch.Tensor or numpy array of real numbers",
                    f"{type(x).__name__} with dtype {arr.dtype}",
                    "Pass a tensor or a numeric numpy array.",
                )
            )
        if arr.dtype.kind == "u":
            arr = arr.astype(np.int64)
        t = torch.as_tensor(np.ascontiguousarray(arr))
    if t.is_complex():
        raise InputTypeError(
            expected_got(
                what, "a real-valued tensor", f"dtype {t.dtype}", "Pass the real part explicitly."
            )
        )
    return t


def _first_device(*values: Any) -> torch.device:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device
    return torch.device("cpu")


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """Promotion of the floating dtypes among ``tensors`` (default dtype if none is floating)."""
    dtype = None
    for t in tensors:
        if t.is_floating_point():
            dtype = t.dtype if dtype is None else torch.promote_types(dtype, t.dtype)
    if dtype is None:
        dtype = torch.get_default_dtype()
    if dtype in (torch.float16, torch.bfloat16):
        dtype = torch.float32
    return dtype


def _float_inputs(func: str, **arrays: Any) -> list[torch.Tensor]:
    """Convert the named inputs to tensors of a common floating dtype on a common device."""
    tensors = [_to_tensor(v, f"{func}.{k}") for k, v in arrays.items()]
    dtype = _compute_dtype(*tensors)
    device = _first_device(*arrays.values())
    return [t.to(device=device, dtype=dtype) for t in tensors]


def _check_nonempty(t: torch.Tensor, what: str) -> None:
    if t.numel() == 0:
        raise InputDataError(
            expected_got(
                what,
                "a non-empty tensor",
                f"an empty tensor of shape {tuple(t.shape)}",
                "Evaluate the metric on at least one test point.",
            )
        )


def _check_finite(t: torch.Tensor, what: str) -> None:
    bad = ~torch.isfinite(t)
    n_bad = int(bad.sum())
    if n_bad:
        n_nan = int(torch.isnan(t).sum())
        raise InputDataError(
            expected_got(
                what,
                "finite values",
                f"{n_bad} non-finite entries ({n_nan} NaN) out of {t.numel()}",
                "Remove or impute the NaN/inf entries (e.g. filter with torch.isfinite) "
                "before computing the metric.",
            )
        )


def _check_ndim(t: torch.Tensor, what: str, allowed: tuple[int, ...], shapes: str) -> None:
    if t.ndim not in allowed:
        raise ShapeError(
            expected_got(
                what,
                f"a tensor of shape {shapes}",
                f"shape {tuple(t.shape)} ({t.ndim}-d)",
                "Reshape the input, e.g. flatten extra dimensions with .reshape(N, -1).",
            )
        )


def _check_same_shape(
    func: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor
) -> None:
    if t.shape != ref.shape:
        raise ShapeError(
            expected_got(
                f"{func}.{name}",
                f"the same shape as {ref_name}.shape={tuple(ref.shape)}",
                f"{name}.shape={tuple(t.shape)}",
                f"Pass `{name}` and `{ref_name}` for the same test points, in the same layout.",
            )
        )


def _check_variance(t: torch.Tensor, what: str) -> None:
    bad = ~(torch.isfinite(t) & (t > 0))
    n_bad = int(bad.sum())
    if n_bad:
        raise InputDataError(
            expected_got(
                what,
                "strictly positive, finite variances",
                f"{n_bad} of {t.numel()} entries that are not (min={t.min().item():.3g})",
                "Pass predictive variances (not standard deviations or log-variances); add the "
                "observation noise or clamp with variance.clamp_min(1e-12).",
            )
        )


def _check_level(level: Any, what: str) -> float:
    if isinstance(level, bool) or not isinstance(level, (int, float, np.floating, np.integer)):
        raise InputTypeError(
            expected_got(what, "a float in (0, 1)", repr(level), "Pass e.g. level=0.95.")
        )
    level = float(level)
    if not 0.0 < level < 1.0:
        raise InputDataError(
            expected_got(
                what, "a float in the open interval (0, 1)", level, "Pass e.g. level=0.95."
            )
        )
    return level


def _check_reduction(reduction: Any, what: str) -> None:
    if reduction not in _REDUCTIONS:
        raise InputDataError(
            expected_got(
                what, "one of 'mean', 'sum', 'none'", repr(reduction), "Pass reduction='mean'."
            )
        )


def _check_num_bins(num_bins: Any, what: str) -> int:
    if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)):
        raise InputTypeError(
            expected_got(what, "an integer >= 1", repr(num_bins), "Pass e.g. num_bins=10.")
        )
    if num_bins < 1:
        raise InputDataError(
            expected_got(what, "an integer >= 1", num_bins, "Pass e.g. num_bins=10.")
        )
    return int(num_bins)


def _y_scale_tensor(
    func: str, y_scale: Any, target: torch.Tensor, dtype: torch.dtype, device: torch.device
) -> torch.Tensor | None:
    """Validate ``y_scale`` and return it broadcastable against ``target`` (or ``None``)."""
    if y_scale is None:
        return None
    what = f"{func}.y_scale"
    s = _to_tensor(y_scale, what).to(device=device, dtype=dtype)
    allowed = "a scalar"
    ok = s.numel() == 1
    if target.ndim == 2:
        allowed += f" or a tensor of shape (T,) = ({target.shape[-1]},)"
        ok = ok or (s.ndim == 1 and s.shape[0] == target.shape[-1])
    if not ok:
        raise ShapeError(
            expected_got(
                what,
                allowed,
                f"shape {tuple(s.shape)} for targets of shape {tuple(target.shape)}",
                "Pass the standard deviation used to standardise the targets (one per output).",
            )
        )
    if not bool((torch.isfinite(s) & (s > 0)).all()):
        raise InputDataError(
            expected_got(
                what,
                "strictly positive, finite target scale(s)",
                s.flatten().tolist(),
                "Pass the standard deviation of the training targets (y = y_scale * z + y_mean).",
            )
        )
    return s.reshape(-1) if s.numel() > 1 else s.reshape(())


def _reduce(values: torch.Tensor, reduction: str) -> float | torch.Tensor:
    if reduction == "none":
        return values
    if reduction == "sum":
        return values.sum().item()
    return values.mean().item()


def _regression_inputs(
    func: str, mean: Any, variance: Any, target: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean, variance, target = _float_inputs(func, mean=mean, variance=variance, target=target)
    _check_ndim(target, f"{func}.target", (1, 2), "(N,) or (N, T)")
    _check_same_shape(func, "target", target, "mean", mean)
    _check_same_shape(func, "target", target, "variance", variance)
    _check_nonempty(target, f"{func}.target")
    _check_finite(mean, f"{func}.mean")
    _check_finite(target, f"{func}.target")
    _check_variance(variance, f"{func}.variance")
    return mean, variance, target


def _mixture_inputs(
    func: str, means: Any, variances: Any, target: Any, weights: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """Validate mixture inputs; returns means, variances, target (or None), weights (K, 1, ...).

    With ``target=None`` the sample shape is taken from ``means`` (``(K, N)`` or ``(K, N, T)``).
    """
    arrays = {"means": means, "variances": variances}
    if target is not None:
        arrays["target"] = target
    if weights is not None:
        arrays["weights"] = weights
    tensors = dict(zip(arrays, _float_inputs(func, **arrays)))
    means, variances = tensors["means"], tensors["variances"]
    target = tensors.get("target")
    if target is None:
        _check_ndim(means, f"{func}.means", (2, 3), "(K, N) or (K, N, T)")
    else:
        _check_ndim(target, f"{func}.target", (1, 2), "(N,) or (N, T)")
        if means.shape[1:] != target.shape:
            raise ShapeError(
                expected_got(
                    f"{func}.means",
                    f"shape (K, *target.shape) with target.shape={tuple(target.shape)}",
                    f"means.shape={tuple(means.shape)}",
                    "Stack the K components along a new leading dimension: "
                    "torch.stack(list_of_means).",
                )
            )
        _check_finite(target, f"{func}.target")
    _check_same_shape(func, "means", means, "variances", variances)
    _check_nonempty(means, f"{func}.means")
    _check_finite(means, f"{func}.means")
    _check_variance(variances, f"{func}.variances")
    k = means.shape[0]
    if weights is None:
        w = torch.full((k,), 1.0 / k, dtype=means.dtype, device=means.device)
    else:
        w = tensors["weights"]
        what = f"{func}.weights"
        if w.shape != (k,):
            raise ShapeError(
                expected_got(
                    what,
                    f"shape (K,) = ({k},) matching means.shape={tuple(means.shape)}",
                    f"weights.shape={tuple(w.shape)}",
                    "Pass one weight per mixture component.",
                )
            )
        _check_finite(w, what)
        tol = _ROW_SUM_TOL.get(w.dtype, 1e-4)
        if bool((w < 0).any()) or abs(w.sum().item() - 1.0) > tol:
            raise InputDataError(
                expected_got(
                    what,
                    f"non-negative weights summing to 1 (within {tol:g})",
                    f"min={w.min().item():.6g}, sum={w.sum().item():.10g}",
                    "Normalise the weights: weights / weights.sum().",
                )
            )
    w = w.reshape((k,) + (1,) * (means.ndim - 1))
    return means, variances, target, w


def _probs_input(func: str, probs: Any, name: str = "probs") -> torch.Tensor:
    what = f"{func}.{name}"
    raw = _to_tensor(probs, what)
    given_dtype = raw.dtype
    p = raw.to(device=_first_device(probs), dtype=_compute_dtype(raw))
    _check_ndim(p, what, (2,), "(N, C)")
    _check_nonempty(p, what)
    n_nan = int(torch.isnan(p).sum())
    if n_nan:
        raise InputDataError(
            expected_got(
                what,
                "probabilities without NaN",
                f"{n_nan} NaN entries out of {p.numel()}",
                "Check the model output; NaN probabilities usually mean a diverged model.",
            )
        )
    n_out = int(((p < 0) | (p > 1)).sum())
    if n_out:
        raise InputDataError(
            expected_got(
                what,
                "probabilities in [0, 1]",
                f"{n_out} entries outside [0, 1] (min={p.min().item():.6g}, "
                f"max={p.max().item():.6g})",
                "Pass probabilities, not logits: apply torch.softmax(logits, dim=-1) or use "
                "categorical_nll_from_logits.",
            )
        )
    tol = _ROW_SUM_TOL.get(given_dtype, 1e-4)
    dev = (p.sum(dim=1) - 1).abs()
    n_rows = int((dev > tol).sum())
    if n_rows:
        raise InputDataError(
            expected_got(
                what,
                f"rows summing to 1 (within {tol:g} for {given_dtype})",
                f"{n_rows} of {p.shape[0]} rows that do not (max |sum - 1| = "
                f"{dev.max().item():.3g})",
                "Normalise the rows: probs / probs.sum(dim=1, keepdim=True).",
            )
        )
    return p


def _labels_input(
    func: str, target: Any, n: int, num_classes: int | None, device: torch.device
) -> torch.Tensor:
    what = f"{func}.target"
    y = _to_tensor(target, what)
    if y.is_floating_point():
        raise InputTypeError(
            expected_got(
                what,
                "integer class labels",
                f"dtype {y.dtype}",
                "Cast the labels with target.long() (or np.asarray(target, dtype=int)).",
            )
        )
    y = y.to(device=device, dtype=torch.int64)
    if y.shape != (n,):
        raise ShapeError(
            expected_got(
                what,
                f"shape (N,) = ({n},) matching the predictions",
                f"target.shape={tuple(y.shape)}",
                "Pass one integer label per test point.",
            )
        )
    if num_classes is not None:
        bad = (y < 0) | (y >= num_classes)
        n_bad = int(bad.sum())
        if n_bad:
            raise InputDataError(
                expected_got(
                    what,
                    f"labels in [0, C) = [0, {num_classes})",
                    f"{n_bad} labels outside (min={y.min().item()}, max={y.max().item()})",
                    "Encode the labels as 0..C-1 in the column order of the probabilities "
                    "(e.g. with sklearn.preprocessing.LabelEncoder).",
                )
            )
    return y


# --------------------------------------------------------------------------------------------
# Regression metrics
# --------------------------------------------------------------------------------------------


def rmse(mean: Any, target: Any) -> float:
    r"""Root-mean-squared error of a point prediction.

    .. math::

        \mathrm{RMSE} = \sqrt{\frac{1}{M} \sum_{i=1}^{M} (\mu_i - y_i)^2},

    where the sum runs over all :math:`M = N` (or :math:`M = NT`) entries.

    Args:
        mean: Predicted values. # shape: (N,) or (N, T)
        target: Observed values. # shape: same as ``mean``

    Returns:
        The RMSE, averaged over all entries (test points and outputs).

    Raises:
        ShapeError: If the shapes differ or are not 1-d / 2-d.
        InputDataError: If an input is empty or contains NaN/inf.

    Example:
        >>> round(rmse(torch.tensor([0.0, 2.0]), torch.tensor([0.0, 0.0])), 6)
        1.414214
    """
    mean, target = _float_inputs("rmse", mean=mean, target=target)
    _check_ndim(target, "rmse.target", (1, 2), "(N,) or (N, T)")
    _check_same_shape("rmse", "target", target, "mean", mean)
    _check_nonempty(target, "rmse.target")
    _check_finite(mean, "rmse.mean")
    _check_finite(target, "rmse.target")
    return torch.sqrt(((mean - target) ** 2).mean()).item()


def gaussian_log_likelihood(
    mean: Any,
    variance: Any,
    target: Any,
    *,
    y_scale: Any = None,
    reduction: str = "mean",
) -> float | torch.Tensor:
    r"""Per-point Gaussian test log-likelihood (log predictive density).

    .. math::

        \log \mathcal{N}(y_i; \mu_i, \sigma_i^2)
        = -\tfrac12 \Big(\log 2\pi + \log \sigma_i^2 + \frac{(y_i - \mu_i)^2}{\sigma_i^2}\Big).

    **Target standardisation.** Models are often trained on standardised targets
    :math:`z = (y - m) / s`. Pass the standard deviation ``y_scale`` = :math:`s` together with
    ``mean``, ``variance`` and ``target`` *in standardised units* to report the log-likelihood in
    the *original* units. By the change of variables :math:`y = s z + m`,

    .. math::

        \log p(y_i) = \log p(z_i) - \log s,

    so :math:`\log s` is subtracted from every point (per output when ``y_scale`` has shape
    ``(T,)``). The shift :math:`m` does not enter. Without ``y_scale`` the inputs are used as-is.

    Args:
        mean: Predictive means. # shape: (N,) or (N, T)
        variance: Predictive variances (including observation noise for the predictive density
            of :math:`y`), strictly positive. # shape: same as ``mean``
        target: Observed values. # shape: same as ``mean``
        y_scale: Optional positive float or tensor, the target standard deviation used for
            standardisation. # shape: () or (T,)
        reduction: ``"mean"`` (average over all entries), ``"sum"`` or ``"none"``.

    Returns:
        A Python float for ``"mean"``/``"sum"``; for ``"none"`` the per-entry log-likelihoods as a
        detached tensor of the same shape as ``target``.

    Raises:
        ShapeError: If shapes differ, or ``y_scale`` has an incompatible shape.
        InputDataError: If variances are not positive and finite, inputs are empty or contain
            NaN, ``y_scale`` is not positive, or ``reduction`` is unknown.

    Example:
        >>> round(gaussian_log_likelihood(torch.zeros(3), torch.ones(3), torch.zeros(3)), 4)
        -0.9189
    """
    func = "gaussian_log_likelihood"
    _check_reduction(reduction, f"{func}.reduction")
    mean, variance, target = _regression_inputs(func, mean, variance, target)
    s = _y_scale_tensor(func, y_scale, target, mean.dtype, mean.device)
    ll = -0.5 * (_LOG_2PI + torch.log(variance) + (target - mean) ** 2 / variance)
    if s is not None:
        ll = ll - torch.log(s)
    return _reduce(ll, reduction)


def mixture_gaussian_log_likelihood(
    means: Any,
    variances: Any,
    target: Any,
    *,
    weights: Any = None,
    y_scale: Any = None,
    reduction: str = "mean",
) -> float | torch.Tensor:
    r"""Per-point test log-likelihood of a Gaussian mixture (ensemble / posterior samples).

    .. math::

        \log p(y_i) = \log \sum_{k=1}^{K} w_k \, \mathcal{N}(y_i; \mu_{ki}, \sigma_{ki}^2),

    evaluated stably with :func:`torch.logsumexp` over :math:`\log w_k + \log \mathcal{N}(\cdot)`.
    This is the predictive density of a deep ensemble (Lakshminarayanan et al., 2017) or of a
    Monte-Carlo posterior with uniform weights :math:`w_k = 1/K`. ``y_scale`` reports the
    result in original units exactly as in :func:`gaussian_log_likelihood`
    (:math:`\log p(y) = \log p(z) - \log s`).

    Args:
        means: Component means. # shape: (K, N) or (K, N, T)
        variances: Component variances, strictly positive. # shape: same as ``means``
        target: Observed values. # shape: (N,) or (N, T)
        weights: Optional non-negative mixture weights summing to 1; uniform if ``None``.
            # shape: (K,)
        y_scale: Optional positive target standard deviation. # shape: () or (T,)
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    Returns:
        A Python float for ``"mean"``/``"sum"``; for ``"none"`` a tensor shaped like ``target``.

    Raises:
        ShapeError: If ``means``/``variances`` are not ``(K, *target.shape)`` or ``weights`` is
            not ``(K,)``.
        InputDataError: For non-positive variances, NaN, empty inputs, invalid weights,
            ``y_scale`` or ``reduction``.

    Example:
        >>> mu, var, y = torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(3)
        >>> round(mixture_gaussian_log_likelihood(mu, var, y), 4)
        -0.9189
    """
    func = "mixture_gaussian_log_likelihood"
    _check_reduction(reduction, f"{func}.reduction")
    means, variances, target, w = _mixture_inputs(func, means, variances, target, weights)
    s = _y_scale_tensor(func, y_scale, target, means.dtype, means.device)
    # shape: (K, N) or (K, N, T)
    comp = -0.5 * (_LOG_2PI + torch.log(variances) + (target - means) ** 2 / variances)
    ll = torch.logsumexp(torch.log(w) + comp, dim=0)
    if s is not None:
        ll = ll - torch.log(s)
    return _reduce(ll, reduction)


def interval_coverage(mean: Any, variance: Any, target: Any, *, level: float = 0.95) -> float:
    r"""Empirical coverage of the central Gaussian predictive interval.

    .. math::

        \widehat{c} = \frac{1}{M} \sum_{i=1}^{M}
        \mathbb{1}\big[\,|y_i - \mu_i| \le z_{(1+\ell)/2}\, \sigma_i\,\big],
        \qquad z_q = \Phi^{-1}(q),

    with :math:`\ell` the nominal ``level`` (interval endpoints count as inside). A calibrated
    model has :math:`\widehat{c} \approx \ell`.

    Args:
        mean: Predictive means. # shape: (N,) or (N, T)
        variance: Predictive variances, strictly positive. # shape: same as ``mean``
        target: Observed values. # shape: same as ``mean``
        level: Nominal coverage in the open interval (0, 1).

    Returns:
        The fraction of entries inside their interval, in [0, 1].

    Raises:
        ShapeError: If shapes differ.
        InputDataError: For non-positive variances, NaN, empty inputs or ``level`` outside (0, 1).
        InputTypeError: If ``level`` is not a number.

    Example:
        >>> interval_coverage(torch.zeros(2), torch.ones(2), torch.tensor([0.5, 3.0]))
        0.5
    """
    func = "interval_coverage"
    level = _check_level(level, f"{func}.level")
    mean, variance, target = _regression_inputs(func, mean, variance, target)
    z = torch.special.ndtri(torch.tensor((1.0 + level) / 2.0, dtype=mean.dtype))
    inside = (target - mean).abs() <= z.to(mean.device) * variance.sqrt()
    return inside.to(mean.dtype).mean().item()


def _mixture_quantile(
    means: torch.Tensor, sds: torch.Tensor, w: torch.Tensor, p: float
) -> torch.Tensor:
    """Quantile ``p`` of each mixture (over dim 0) by vectorised bisection on the mixture CDF."""
    dtype = means.dtype
    eps = torch.finfo(dtype).eps
    p_t = torch.tensor(p, dtype=dtype, device=means.device)
    comp_q = means + torch.special.ndtri(p_t) * sds  # component quantiles, shape: (K, *S)
    # F(min_k q_k) <= p <= F(max_k q_k) because every component CDF is <= p (>= p) there.
    lo, hi = comp_q.amin(dim=0), comp_q.amax(dim=0)  # shape: S
    sd_min = sds.amin(dim=0)
    for _ in range(_MAX_BISECTION_ITERS):
        width = hi - lo
        active = width > 2 * eps * torch.maximum(lo.abs(), hi.abs()) + eps * sd_min
        if not bool(active.any()):
            break
        mid = lo + 0.5 * width
        cdf = (w * torch.special.ndtr((mid - means) / sds)).sum(dim=0)
        below = cdf < p_t
        lo = torch.where(active & below, mid, lo)
        hi = torch.where(active & ~below, mid, hi)
    return lo + 0.5 * (hi - lo)


def mixture_central_interval(
    means: Any, variances: Any, *, weights: Any = None, level: float = 0.95
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Central predictive interval of a Gaussian mixture, per test point.

    The endpoints are the quantiles :math:`q_{(1-\ell)/2}` and :math:`q_{(1+\ell)/2}` of

    .. math::

        F(x) = \sum_{k=1}^{K} w_k \, \Phi\Big(\frac{x - \mu_k}{\sigma_k}\Big),

    found by vectorised bisection on :math:`F(x) = q` for all points at once. The initial bracket
    :math:`[\min_k (\mu_k + z_q \sigma_k), \max_k (\mu_k + z_q \sigma_k)]` provably contains the
    root (every component CDF is :math:`\le q` at its left end and :math:`\ge q` at its right
    end). **Tolerance:** bisection stops once every bracket satisfies
    :math:`\mathrm{hi} - \mathrm{lo} \le 2\varepsilon \max(|\mathrm{lo}|, |\mathrm{hi}|)
    + \varepsilon \min_k \sigma_k` (:math:`\varepsilon` the machine epsilon of the dtype, i.e.
    close to full precision) or after 200 halvings, and returns the bracket midpoint. For
    :math:`K = 1` the bracket has zero width and the Gaussian quantile is returned exactly.

    Args:
        means: Component means. # shape: (K, N) or (K, N, T)
        variances: Component variances, strictly positive. # shape: same as ``means``
        weights: Optional non-negative weights summing to 1; uniform if ``None``. # shape: (K,)
        level: Nominal coverage in the open interval (0, 1).

    Returns:
        ``(lower, upper)`` tensors. # shape: (N,) or (N, T) each

    Raises:
        ShapeError: If ``means`` is not 2-d/3-d, shapes differ or ``weights`` is not ``(K,)``.
        InputDataError: For non-positive variances, NaN, empty inputs, invalid weights or
            ``level``.

    Example:
        >>> lo, hi = mixture_central_interval(torch.zeros(1, 1), torch.ones(1, 1))
        >>> round(hi.item(), 4)
        1.96
    """
    func = "mixture_central_interval"
    level = _check_level(level, f"{func}.level")
    means_t, variances_t, _, w = _mixture_inputs(func, means, variances, None, weights)
    sds = variances_t.sqrt()
    lower = _mixture_quantile(means_t, sds, w, (1.0 - level) / 2.0)
    upper = _mixture_quantile(means_t, sds, w, (1.0 + level) / 2.0)
    return lower, upper


def mixture_interval_coverage(
    means: Any, variances: Any, target: Any, *, weights: Any = None, level: float = 0.95
) -> float:
    r"""Empirical coverage of the central interval of a Gaussian mixture predictive.

    .. math::

        \widehat{c} = \frac{1}{M} \sum_{i=1}^{M}
        \mathbb{1}\big[\, q_{i,(1-\ell)/2} \le y_i \le q_{i,(1+\ell)/2} \,\big],

    where :math:`q_{i,\cdot}` are quantiles of the mixture
    :math:`\sum_k w_k \mathcal{N}(\mu_{ki}, \sigma_{ki}^2)` computed by
    :func:`mixture_central_interval` (vectorised bisection; see there for the tolerance).

    Args:
        means: Component means. # shape: (K, N) or (K, N, T)
        variances: Component variances, strictly positive. # shape: same as ``means``
        target: Observed values. # shape: (N,) or (N, T)
        weights: Optional non-negative weights summing to 1; uniform if ``None``. # shape: (K,)
        level: Nominal coverage in the open interval (0, 1).

    Returns:
        The fraction of entries inside their interval, in [0, 1].

    Raises:
        ShapeError: If ``means``/``variances`` are not ``(K, *target.shape)`` or ``weights`` is
            not ``(K,)``.
        InputDataError: For non-positive variances, NaN, empty inputs, invalid weights or
            ``level``.

    Example:
        >>> mixture_interval_coverage(torch.zeros(2, 2), torch.ones(2, 2), torch.tensor([0.5, 3.0]))
        0.5
    """
    func = "mixture_interval_coverage"
    level = _check_level(level, f"{func}.level")
    means, variances, target, w = _mixture_inputs(func, means, variances, target, weights)
    sds = variances.sqrt()
    lower = _mixture_quantile(means, sds, w, (1.0 - level) / 2.0)
    upper = _mixture_quantile(means, sds, w, (1.0 + level) / 2.0)
    inside = (target >= lower) & (target <= upper)
    return inside.to(means.dtype).mean().item()


# --------------------------------------------------------------------------------------------
# Classification metrics
# --------------------------------------------------------------------------------------------


def error_rate(probs_or_pred: Any, target: Any) -> float:
    r"""Misclassification rate (1 - accuracy).

    .. math::

        \mathrm{err} = \frac{1}{N} \sum_{i=1}^{N} \mathbb{1}[\hat y_i \ne y_i],
        \qquad \hat y_i = \arg\max_c p_{ic}

    when probabilities are given (ties go to the lowest class index, as in :func:`torch.argmax`
    and :func:`numpy.argmax`), or :math:`\hat y_i` given directly as integer predictions.

    Args:
        probs_or_pred: Class probabilities (validated like :func:`categorical_nll`)
            # shape: (N, C); or integer predicted labels # shape: (N,)
        target: Integer true labels, in ``[0, C)`` when probabilities are given. # shape: (N,)

    Returns:
        The fraction of misclassified points, in [0, 1].

    Raises:
        ShapeError: If the shapes do not match.
        InputTypeError: If labels (or 1-d predictions) are not integers.
        InputDataError: For invalid probabilities, out-of-range labels or empty inputs.

    Example:
        >>> error_rate(torch.tensor([[0.9, 0.1], [0.2, 0.8]]), torch.tensor([0, 0]))
        0.5
    """
    func = "error_rate"
    x = _to_tensor(probs_or_pred, f"{func}.probs_or_pred")
    device = _first_device(probs_or_pred, target)
    if x.ndim == 1:
        if x.is_floating_point():
            raise InputTypeError(
                expected_got(
                    f"{func}.probs_or_pred",
                    "integer predicted labels of shape (N,) or probabilities of shape (N, C)",
                    f"a 1-d tensor of dtype {x.dtype}",
                    "Cast predicted labels with .long(), or pass the (N, C) probability matrix.",
                )
            )
        _check_nonempty(x, f"{func}.probs_or_pred")
        pred = x.to(device=device, dtype=torch.int64)
        y = _labels_input(func, target, pred.shape[0], None, device)
    elif x.ndim == 2:
        probs = _probs_input(func, probs_or_pred, "probs_or_pred").to(device)
        pred = probs.argmax(dim=1)
        y = _labels_input(func, target, probs.shape[0], probs.shape[1], device)
    else:
        raise ShapeError(
            expected_got(
                f"{func}.probs_or_pred",
                "probabilities of shape (N, C) or predicted labels of shape (N,)",
                f"shape {tuple(x.shape)}",
                "Flatten batch dimensions into N.",
            )
        )
    return (pred != y).to(torch.float64).mean().item()


def categorical_nll(probs: Any, target: Any, *, eps: float | None = None) -> float:
    r"""Mean negative log-likelihood of the true class (MNLL, log loss).

    .. math::

        \mathrm{MNLL} = -\frac{1}{N} \sum_{i=1}^{N} \log \max(p_{i, y_i}, \epsilon).

    **Clamping rule:** the probability of the true class is clamped below at ``eps`` so that a
    zero probability gives the finite value :math:`-\log \epsilon` instead of :math:`+\infty`.
    The default ``eps`` is the smallest positive normal number of the computation dtype,
    ``torch.finfo(dtype).tiny`` (about ``1.2e-38`` in float32, ``2.2e-308`` in float64), so any
    probability that is representable as a normal number is used unchanged. No clamping from
    above is done. (scikit-learn's ``log_loss`` instead clips to ``[eps, 1 - eps]`` with
    ``eps`` the machine epsilon; the two agree whenever ``eps <= p <= 1 - eps``.)

    Args:
        probs: Class probabilities, rows on the simplex. # shape: (N, C)
        target: Integer true labels in ``[0, C)``. # shape: (N,)
        eps: Optional lower clamp in (0, 1); defaults to ``torch.finfo(dtype).tiny``.

    Returns:
        The MNLL (non-negative).

    Raises:
        ShapeError: If ``probs`` is not 2-d or ``target`` is not ``(N,)``.
        InputTypeError: If labels are not integers.
        InputDataError: For probabilities outside [0, 1] or rows not summing to 1, NaN,
            out-of-range labels, empty inputs, or ``eps`` outside (0, 1).

    Example:
        >>> round(categorical_nll(torch.tensor([[0.5, 0.5]]), torch.tensor([1])), 6)
        0.693147
    """
    func = "categorical_nll"
    probs_t = _probs_input(func, probs)
    y = _labels_input(func, target, probs_t.shape[0], probs_t.shape[1], probs_t.device)
    if eps is None:
        eps = torch.finfo(probs_t.dtype).tiny
    elif isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating)):
        raise InputTypeError(
            expected_got(f"{func}.eps", "a float in (0, 1) or None", repr(eps), "Pass eps=None.")
        )
    elif not 0.0 < float(eps) < 1.0:
        raise InputDataError(
            expected_got(
                f"{func}.eps",
                "a float in the open interval (0, 1)",
                eps,
                "Pass eps=None for the default torch.finfo(dtype).tiny.",
            )
        )
    p_true = probs_t.gather(1, y.unsqueeze(1)).squeeze(1)  # shape: (N,)
    return (-torch.log(p_true.clamp_min(float(eps)))).mean().item()


def categorical_nll_from_logits(logits: Any, target: Any) -> float:
    r"""Mean negative log-likelihood of the true class computed from unnormalised logits.

    .. math::

        \mathrm{MNLL} = -\frac{1}{N} \sum_{i=1}^{N} \Big(f_{i, y_i} - \log \sum_{c} e^{f_{ic}}\Big),

    evaluated with :func:`torch.log_softmax` (no clamping is needed). Logits of ``-inf`` are
    allowed (masked classes) provided each row has at least one finite logit; NaN and ``+inf``
    are rejected.

    Args:
        logits: Unnormalised log-probabilities. # shape: (N, C)
        target: Integer true labels in ``[0, C)``. # shape: (N,)

    Returns:
        The MNLL (``inf`` if a true class has logit ``-inf``).

    Raises:
        ShapeError: If ``logits`` is not 2-d or ``target`` is not ``(N,)``.
        InputTypeError: If labels are not integers.
        InputDataError: For NaN/``+inf`` logits, rows without a finite logit, out-of-range
            labels or empty inputs.

    Example:
        >>> round(categorical_nll_from_logits(torch.tensor([[0.0, 0.0]]), torch.tensor([1])), 6)
        0.693147
    """
    func = "categorical_nll_from_logits"
    (f,) = _float_inputs(func, logits=logits)
    what = f"{func}.logits"
    _check_ndim(f, what, (2,), "(N, C)")
    _check_nonempty(f, what)
    n_bad = int((torch.isnan(f) | (f == math.inf)).sum())
    if n_bad:
        raise InputDataError(
            expected_got(
                what,
                "logits without NaN or +inf",
                f"{n_bad} such entries out of {f.numel()}",
                "Check the model output for overflow/divergence.",
            )
        )
    n_rows = int((~torch.isfinite(f).any(dim=1)).sum())
    if n_rows:
        raise InputDataError(
            expected_got(
                what,
                "at least one finite logit per row",
                f"{n_rows} rows with all logits -inf",
                "Do not mask every class of a test point.",
            )
        )
    y = _labels_input(func, target, f.shape[0], f.shape[1], f.device)
    log_p = torch.log_softmax(f, dim=1).gather(1, y.unsqueeze(1)).squeeze(1)
    return (-log_p).mean().item()


def _calibration_stats(
    func: str, probs: Any, target: Any, num_bins: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Per-bin counts, summed confidences and summed correctness; also the bin edges and N."""
    num_bins = _check_num_bins(num_bins, f"{func}.num_bins")
    p = _probs_input(func, probs)
    y = _labels_input(func, target, p.shape[0], p.shape[1], p.device)
    pred = p.argmax(dim=1)  # shape: (N,); ties -> lowest index
    conf = p.gather(1, pred.unsqueeze(1)).squeeze(1)  # shape: (N,)
    correct = (pred == y).to(p.dtype)
    edges = torch.arange(num_bins + 1, dtype=p.dtype, device=p.device) / num_bins
    # bucketize(right=False) returns i with edges[i] < conf <= edges[i + 1] on interior edges,
    # i.e. bins (i/B, (i+1)/B]; conf == 0 falls into bin 0.
    idx = torch.bucketize(conf, edges[1:-1], right=False)
    count = torch.bincount(idx, minlength=num_bins)
    sum_conf = torch.zeros(num_bins, dtype=p.dtype, device=p.device).index_add_(0, idx, conf)
    sum_acc = torch.zeros(num_bins, dtype=p.dtype, device=p.device).index_add_(0, idx, correct)
    return edges, count, sum_conf, sum_acc, p.shape[0]


def expected_calibration_error(probs: Any, target: Any, *, num_bins: int = 10) -> float:
    r"""Expected calibration error of the top-label confidence (Guo et al., 2017, Sec. 2).

    With confidence :math:`\hat p_i = \max_c p_{ic}`, prediction
    :math:`\hat y_i = \arg\max_c p_{ic}` and equal-width bins
    :math:`B_b = \{ i : b/B < \hat p_i \le (b+1)/B \}` for :math:`b = 0, \dots, B-1` (the first
    bin also contains :math:`\hat p_i = 0`),

    .. math::

        \mathrm{ECE} = \sum_{b=0}^{B-1} \frac{n_b}{N}
        \big| \mathrm{acc}(B_b) - \mathrm{conf}(B_b) \big|,
        \quad \mathrm{acc}(B_b) = \frac{1}{n_b} \sum_{i \in B_b} \mathbb{1}[\hat y_i = y_i],
        \quad \mathrm{conf}(B_b) = \frac{1}{n_b} \sum_{i \in B_b} \hat p_i,

    where empty bins contribute zero. Bin edges are ``b / B`` in the computation dtype.

    Args:
        probs: Class probabilities, rows on the simplex. # shape: (N, C)
        target: Integer true labels in ``[0, C)``. # shape: (N,)
        num_bins: Number of equal-width bins ``B >= 1``.

    Returns:
        The ECE, in [0, 1].

    Raises:
        ShapeError: If ``probs`` is not 2-d or ``target`` is not ``(N,)``.
        InputTypeError: If labels or ``num_bins`` are not integers.
        InputDataError: For invalid probabilities, out-of-range labels, empty inputs or
            ``num_bins < 1``.

    Example:
        >>> expected_calibration_error(torch.tensor([[1.0, 0.0]]), torch.tensor([0]))
        0.0
    """
    _, _, sum_conf, sum_acc, n = _calibration_stats(
        "expected_calibration_error", probs, target, num_bins
    )
    # (n_b / N) |sum_acc / n_b - sum_conf / n_b| = |sum_acc - sum_conf| / N
    return ((sum_acc - sum_conf).abs().sum() / n).item()


def reliability_diagram_data(
    probs: Any, target: Any, num_bins: int = 10
) -> dict[str, torch.Tensor]:
    r"""Per-bin statistics for a reliability diagram (same binning as the ECE).

    .. math::

        \mathrm{conf}(B_b) = \frac{1}{n_b} \sum_{i \in B_b} \hat p_i, \qquad
        \mathrm{acc}(B_b) = \frac{1}{n_b} \sum_{i \in B_b} \mathbb{1}[\hat y_i = y_i],

    with the bins of :func:`expected_calibration_error`. Plot ``bin_accuracy`` against
    ``bin_confidence`` (or bars over ``bin_edges``) together with the diagonal.

    Args:
        probs: Class probabilities, rows on the simplex. # shape: (N, C)
        target: Integer true labels in ``[0, C)``. # shape: (N,)
        num_bins: Number of equal-width bins ``B >= 1``.

    Returns:
        A dict of detached tensors: ``"bin_edges"`` # shape: (B + 1,);
        ``"bin_confidence"`` and ``"bin_accuracy"`` (NaN for empty bins) # shape: (B,);
        ``"bin_count"`` (int64) # shape: (B,).

    Raises:
        ShapeError: If ``probs`` is not 2-d or ``target`` is not ``(N,)``.
        InputTypeError: If labels or ``num_bins`` are not integers.
        InputDataError: For invalid probabilities, out-of-range labels, empty inputs or
            ``num_bins < 1``.

    Example:
        >>> d = reliability_diagram_data(torch.tensor([[0.7, 0.3]]), torch.tensor([0]), 2)
        >>> d["bin_count"].tolist()
        [0, 1]
    """
    edges, count, sum_conf, sum_acc, _ = _calibration_stats(
        "reliability_diagram_data", probs, target, num_bins
    )
    denom = count.to(sum_conf.dtype)
    nan = torch.full_like(sum_conf, float("nan"))
    nonempty = count > 0
    return {
        "bin_edges": edges,
        "bin_confidence": torch.where(nonempty, sum_conf / denom.clamp_min(1), nan),
        "bin_accuracy": torch.where(nonempty, sum_acc / denom.clamp_min(1), nan),
        "bin_count": count,
    }


def brier_score(probs: Any, target: Any) -> float:
    r"""Multi-class Brier score (Brier, 1950).

    .. math::

        \mathrm{BS} = \frac{1}{N} \sum_{i=1}^{N} \sum_{c=1}^{C}
        \big(p_{ic} - \mathbb{1}[y_i = c]\big)^2 \in [0, 2].

    This is the original multi-category form, summing over *all* classes. For binary problems
    scikit-learn's ``brier_score_loss`` uses the positive-class form
    :math:`\frac1N \sum_i (p_{i1} - y_i)^2`; since :math:`p_{i0} = 1 - p_{i1}` both class terms
    are equal, so for :math:`C = 2` this function returns **twice** the scikit-learn value.

    Args:
        probs: Class probabilities, rows on the simplex. # shape: (N, C)
        target: Integer true labels in ``[0, C)``. # shape: (N,)

    Returns:
        The Brier score.

    Raises:
        ShapeError: If ``probs`` is not 2-d or ``target`` is not ``(N,)``.
        InputTypeError: If labels are not integers.
        InputDataError: For invalid probabilities, out-of-range labels or empty inputs.

    Example:
        >>> brier_score(torch.tensor([[0.5, 0.5]]), torch.tensor([0]))
        0.5
    """
    func = "brier_score"
    p = _probs_input(func, probs)
    y = _labels_input(func, target, p.shape[0], p.shape[1], p.device)
    onehot = torch.nn.functional.one_hot(y, p.shape[1]).to(p.dtype)  # shape: (N, C)
    return ((p - onehot) ** 2).sum(dim=1).mean().item()

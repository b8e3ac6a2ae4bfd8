"""Regression metrics: RMSE, Gaussian and Gaussian-mixture log-likelihood, interval coverage.

See :mod:`gpext.metrics` for the conventions shared by every function.
"""

from __future__ import annotations

from typing import Any

import torch

from gpext.metrics._validation import (
    _LOG_2PI,
    _MAX_BISECTION_ITERS,
    _check_finite,
    _check_level,
    _check_ndim,
    _check_nonempty,
    _check_reduction,
    _check_same_shape,
    _float_inputs,
    _mixture_inputs,
    _reduce,
    _regression_inputs,
    _y_scale_tensor,
)

__all__ = [
    "rmse",
    "gaussian_log_likelihood",
    "mixture_gaussian_log_likelihood",
    "interval_coverage",
    "mixture_central_interval",
    "mixture_interval_coverage",
]


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
        >>> rmse([2e200, 0.0], [0.0, 0.0])  # no overflow in the squares
        1.414213562373095e+200
    """
    mean, target = _float_inputs("rmse", mean=mean, target=target)
    _check_ndim(target, "rmse.target", (1, 2), "(N,) or (N, T)")
    _check_same_shape("rmse", "target", target, "mean", mean)
    _check_nonempty(target, "rmse.target")
    _check_finite(mean, "rmse.mean")
    _check_finite(target, "rmse.target")
    resid = mean - target
    # scaled by the largest residual so that squares of large values (1e200) do not overflow
    scale = resid.abs().max()
    if not bool(torch.isfinite(scale)) or float(scale) == 0.0:
        return float(scale)
    return (scale * torch.sqrt(((resid / scale) ** 2).mean())).item()


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

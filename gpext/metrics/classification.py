"""Classification metrics: error rate, categorical NLL, calibration error, Brier score.

See :mod:`gpext.metrics` for the conventions shared by every function.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.metrics._validation import (
    _check_ndim,
    _check_nonempty,
    _check_num_bins,
    _first_device,
    _float_inputs,
    _labels_input,
    _probs_input,
    _to_tensor,
)

__all__ = [
    "error_rate",
    "categorical_nll",
    "categorical_nll_from_logits",
    "expected_calibration_error",
    "reliability_diagram_data",
    "brier_score",
]


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

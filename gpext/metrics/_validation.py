"""Input conversion and validation shared by the metric functions."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__: list[str] = []

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

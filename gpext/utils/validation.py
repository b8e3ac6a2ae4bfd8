"""Input checks shared by gpext's public methods.

Each check raises a :mod:`gpext.errors` exception whose message names the argument, what was
expected, what was received, and how to fix it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__ = [
    "as_fit_input",
    "as_float_tensor",
    "as_kernel_inputs",
    "as_model_input",
    "check_finite",
    "check_float_dtype",
    "check_labels",
    "check_learning_rate",
    "check_not_low_precision",
    "check_layer_widths",
    "check_positive_int",
    "check_rows",
    "check_shape",
]

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_LOW_PRECISION = (torch.float16, torch.bfloat16)


def as_float_tensor(x: object, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Convert ``x`` (tensor, numpy array or nested sequence) to a floating tensor.

    Args:
        x: The value to convert.
        name: Argument name used in error messages.
        dtype: Target dtype; ``None`` keeps a floating tensor's dtype and uses the default dtype
            otherwise.

    Returns:
        A floating-point tensor.

    Raises:
        InputTypeError: If ``x`` cannot be converted to a numeric tensor.
    """
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise InputTypeError(
                expected_got(name, "a tensor or array of numbers", type(x).__name__)
            ) from err
    if t.dtype == torch.bool or t.is_complex():
        raise InputTypeError(expected_got(name, "a real-valued tensor", f"dtype {t.dtype}"))
    if dtype is not None:
        return t.to(dtype)
    if t.dtype not in _FLOAT_DTYPES:
        return t.to(torch.get_default_dtype())
    return t


def check_not_low_precision(x: torch.Tensor, name: str) -> torch.Tensor:
    """Raise :class:`InputTypeError` for a float16 or bfloat16 tensor.

    gpext's linear algebra (Cholesky factors, eigendecompositions, ``cdist``) needs at least
    single precision, and half-precision inputs gave raw torch errors ("not implemented for
    'Half'") deep inside the models.

    Args:
        x: The tensor to check.
        name: Argument name used in the message.

    Returns:
        ``x`` unchanged.

    Raises:
        InputTypeError: If ``x`` is float16 or bfloat16.
    """
    if x.dtype in _LOW_PRECISION:
        raise InputTypeError(
            expected_got(
                name, "float32 or float64 values", f"dtype {x.dtype}",
                "Convert the data with x.float() (or x.double()) before calling.",
            )
        )  # fmt: skip
    return x


def as_fit_input(x: object, name: str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """Inputs of ``fit`` for a model that adopts the data's floating dtype.

    Tensors of float32 or float64 are returned unchanged; integer tensors, numpy arrays and
    (nested) Python sequences are converted (to ``dtype`` when given, else numpy's float64 /
    float32 is kept and integers become the default dtype).  Half precision is an error.

    Args:
        x: The inputs.
        name: Argument name used in messages.
        dtype: Target dtype of converted (non-tensor or integer) inputs.

    Returns:
        A float32 or float64 tensor.

    Raises:
        InputTypeError: If ``x`` is not numeric, boolean, complex or float16 / bfloat16.
    """
    if isinstance(x, torch.Tensor):
        if x.dtype == torch.bool or x.is_complex():
            raise InputTypeError(expected_got(name, "a real-valued tensor", f"dtype {x.dtype}"))
        check_not_low_precision(x, name)
        if not x.is_floating_point():
            return x.to(dtype or torch.get_default_dtype())
        return x
    t = as_float_tensor(x, name, dtype=dtype)
    if t.dtype in _LOW_PRECISION:  # e.g. a numpy float16 array
        t = t.to(dtype or torch.get_default_dtype())
    return t


def check_rows(
    x: torch.Tensor, name: str, *, num_features: int | None = None, finite: bool = True
) -> torch.Tensor:
    """Check that ``x`` is a non-empty ``(N, D)`` matrix of finite values.

    Args:
        x: The tensor to check.
        name: Argument name used in messages.
        num_features: Required ``D`` (``None``: any).
        finite: Also check that every entry is finite.

    Returns:
        ``x`` unchanged.

    Raises:
        ShapeError: If ``x`` is not 2-D or has another number of columns than ``num_features``.
        InputDataError: If ``x`` has no rows or non-finite entries.
    """
    d = "D" if num_features is None else str(num_features)
    if x.dim() != 2:
        raise ShapeError(
            expected_got(
                name, f"shape (N, {d})", f"shape {tuple(x.shape)}",
                "Pass one row per point (x.reshape(-1, 1) for a single feature).",
            )
        )  # fmt: skip
    if num_features is not None and x.shape[1] != num_features:
        raise ShapeError(
            expected_got(
                name,
                f"shape (N, {d}): {d} features like the training inputs",
                f"shape {tuple(x.shape)}",
            )
        )
    if x.shape[0] == 0:
        raise InputDataError(
            expected_got(name, "at least one row", f"an empty tensor of shape {tuple(x.shape)}")
        )
    if finite:
        check_finite(x, name)
    return x


def check_float_dtype(dtype: torch.dtype, name: str = "dtype") -> torch.dtype:
    """Check that ``dtype`` is ``torch.float32`` or ``torch.float64``."""
    if dtype not in (torch.float32, torch.float64):
        raise InputDataError(
            expected_got(name, "torch.float32 or torch.float64", dtype, "Pass one of those.")
        )
    return dtype


def check_finite(x: torch.Tensor, name: str) -> torch.Tensor:
    """Raise :class:`InputDataError` if ``x`` has NaN or infinite entries."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        n_nan = int(torch.isnan(x).sum())
        n_inf = int(bad.sum()) - n_nan
        raise InputDataError(
            expected_got(
                name,
                "finite values",
                f"{n_nan} NaN and {n_inf} infinite entries out of {x.numel()}",
                "Remove or impute them before calling.",
            )
        )
    return x


def check_shape(
    x: torch.Tensor, name: str, shape: Sequence[int | None], *, allow_batch: bool = True
) -> torch.Tensor:
    """Check the trailing dimensions of ``x`` against ``shape`` (``None`` matches any size).

    Args:
        x: The tensor to check.
        name: Argument name used in the message.
        shape: Expected trailing shape, e.g. ``(None, 3)`` for ``(..., N, 3)``.
        allow_batch: Whether extra leading (batch) dimensions are allowed.

    Raises:
        ShapeError: If the shape does not match.
    """
    ndim = len(shape)
    ok = x.dim() >= ndim if allow_batch else x.dim() == ndim
    if ok:
        tail = x.shape[x.dim() - ndim :]
        ok = all(s is None or s == t for s, t in zip(shape, tail))
    if not ok:
        pretty = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        if allow_batch:
            pretty = "(..., " + pretty[1:] if ndim else "(...)"
        raise ShapeError(expected_got(name, f"shape {pretty}", f"shape {tuple(x.shape)}"))
    return x


def check_layer_widths(value: object, name: str) -> tuple[int, ...]:
    """Hidden-layer widths: one positive integer (one hidden layer) or a sequence of them.

    ``MLP(2, 64, 1)`` means one hidden layer of 64 units, as ``MLP(2, [64], 1)``; an empty
    sequence means no hidden layer.

    >>> check_layer_widths(64, "MLP.hidden_features"), check_layer_widths([32, 16], "h")
    ((64,), (32, 16))

    Raises:
        InputTypeError: If ``value`` is neither an integer nor a sequence of integers.
        InputDataError: If a width is below 1.
    """
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (check_positive_int(value, name),)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise InputTypeError(
            expected_got(name, "an integer or a sequence of integers (hidden-layer widths, "
                         "e.g. 64 or [64, 64])", repr(value))
        )  # fmt: skip
    return tuple(check_positive_int(h, f"{name}[{i}]") for i, h in enumerate(value))


def check_positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    """Check that ``value`` is an integer ``>= minimum`` and return it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(expected_got(name, f"an integer >= {minimum}", repr(value)))
    if int(value) < minimum:
        raise InputDataError(expected_got(name, f"an integer >= {minimum}", int(value)))
    return int(value)


def check_learning_rate(
    value: object, name: str, *, allow_none: bool = False, allow_zero: bool = False
) -> float | None:
    """Check that a learning rate (or another step size) is a finite number ``> 0``.

    ``torch.optim`` raises a bare ``ValueError`` for a negative one and accepts some that
    silently ruin a fit; this names the argument instead.  ``None`` passes with
    ``allow_none`` (a default chosen by the model), and 0 with ``allow_zero`` (a parameter
    group that is to stay fixed).
    """
    if value is None and allow_none:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputTypeError(expected_got(name, "a number > 0", repr(value)))
    bound = "a finite number >= 0" if allow_zero else "a finite number > 0"
    ok = float(value) >= 0 if allow_zero else float(value) > 0
    if not (math.isfinite(float(value)) and ok):
        raise InputDataError(expected_got(name, bound, float(value), "Pass a positive step size."))
    return float(value)


def check_labels(labels: object, num_classes: int | None, name: str = "labels") -> torch.Tensor:
    """Validate class labels and return them as a ``torch.long`` tensor.

    Args:
        labels: Integer class labels of any shape. Floating tensors are accepted only if every
            entry is a whole number.
        num_classes: Number of classes ``C``; labels must lie in ``[0, C)``. ``None`` skips the
            upper-bound check.
        name: Argument name used in messages.

    Returns:
        The labels as ``torch.long``.

    Raises:
        InputTypeError: If the labels are not numeric or not whole numbers.
        InputDataError: If a label is outside ``[0, num_classes)``.
    """
    if not isinstance(labels, torch.Tensor):
        try:
            arr = np.asarray(labels)
        except (TypeError, ValueError) as err:
            raise InputTypeError(
                expected_got(name, "integer class labels", type(labels).__name__)
            ) from err
        try:
            labels = torch.as_tensor(arr)
        except (TypeError, ValueError) as err:
            raise InputTypeError(
                expected_got(
                    name, "integer class labels 0..C-1", f"an array of dtype {arr.dtype}",
                    "Map other labels (strings, categories) to indices first, e.g. "
                    "np.unique(y, return_inverse=True)[1].",
                )
            ) from err  # fmt: skip
    if labels.dtype == torch.bool:
        labels = labels.long()
    if labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()) or not bool((labels == labels.round()).all()):
            raise InputTypeError(
                expected_got(
                    name,
                    "integer class labels",
                    "non-integer floating values",
                    "Pass class indices 0..C-1 (e.g. labels.long()).",
                )
            )
        labels = labels.long()
    elif labels.is_complex():
        raise InputTypeError(expected_got(name, "integer class labels", f"dtype {labels.dtype}"))
    labels = labels.long()
    if labels.numel() and int(labels.min()) < 0:
        raise InputDataError(
            expected_got(name, "labels >= 0", f"minimum label {int(labels.min())}")
        )
    if num_classes is not None and labels.numel() and int(labels.max()) >= num_classes:
        raise InputDataError(
            expected_got(
                name,
                f"labels in [0, {num_classes})",
                f"maximum label {int(labels.max())}",
                "Check num_classes or remap the labels to 0..C-1.",
            )
        )
    return labels


def as_model_input(x: object, like: torch.Tensor, name: str) -> torch.Tensor:
    """Inputs for a model whose parameters look like ``like``: one input contract for fit/predict.

    Numpy arrays and (nested) Python sequences are converted to a tensor of ``like``'s floating
    dtype on its device.  A tensor is returned as it is when its dtype and device match the
    model's (integer tensors are converted to the model's dtype); a floating tensor of another
    dtype, or one on another device, is an error that says how to fix it, instead of a torch
    dtype or device error deep inside the model.

    Args:
        x: The inputs.
        like: A tensor with the model's dtype and device (e.g. its inducing points).
        name: Argument name used in error messages.

    Returns:
        The inputs as a tensor of ``like``'s dtype and device.

    Raises:
        InputTypeError: If ``x`` is not numeric, or is a tensor of another floating dtype or
            device than the model.
    """
    if not isinstance(x, torch.Tensor):
        return as_float_tensor(x, name, dtype=like.dtype).to(like.device)
    if x.dtype == torch.bool or x.is_complex():
        raise InputTypeError(expected_got(name, "a real-valued tensor", f"dtype {x.dtype}"))
    if not x.is_floating_point():
        x = x.to(like.dtype)
    check_not_low_precision(x, name)
    if x.dtype != like.dtype:
        raise InputTypeError(
            expected_got(
                name, f"a {like.dtype} tensor like the model's parameters", f"dtype {x.dtype}",
                f"Convert the data (x.to({like.dtype})) or the model (model.to({x.dtype})).",
            )
        )  # fmt: skip
    if x.device != like.device:
        raise InputTypeError(
            expected_got(
                name, f"a tensor on {like.device} like the model's parameters", f"device {x.device}",
                f"Move the data (x.to('{like.device}')) or the model (model.to('{x.device}')).",
            )
        )  # fmt: skip
    return x


def as_kernel_inputs(
    x1: object,
    x2: object | None,
    name: str,
    *,
    dtype: torch.dtype,
    device: torch.device | None = None,
    match_dtype: bool = False,
    num_features: int | None = None,
    same_width: bool = True,
    finite: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The inputs of a kernel evaluation, checked in ``O(size of the inputs)``.

    The kernel-side counterpart of :func:`as_model_input`: numpy arrays, (nested) Python
    sequences and integer tensors are converted to ``dtype`` on ``device``; float32 and float64
    tensors are returned as they are (the same objects, so ``x2 is x1`` survives).  ``x2`` may
    be ``None`` (GPyTorch's ``kernel(x)``).  One-dimensional inputs count as one feature, as
    GPyTorch's ``Kernel.__call__`` reads them.

    Args:
        x1: First inputs.  # shape: (*batch, N, D) or (N,)
        x2: Second inputs or ``None``.  # shape: (*batch, M, D) or (M,)
        name: The kernel's name, used in messages.
        dtype: The kernel's floating dtype (of its parameters), the target of conversions.
        device: The kernel's device (``None``: the inputs' device is not checked).
        match_dtype: Also require floating tensors to have ``dtype`` (for kernels whose
            parameters cannot follow the inputs' dtype, e.g. a network or stored landmarks).
        num_features: Required input width ``D`` (``None``: any).
        same_width: Require ``x1`` and ``x2`` to have the same width (``False`` before a
            kernel's ``active_dims`` are applied, which select the columns compared later).
        finite: Also check that every entry is finite (``O(N D)``).

    Returns:
        ``(x1, x2)`` as tensors of one float32 or float64 dtype (``x2`` stays ``None``).

    Raises:
        InputTypeError: For non-numeric, boolean, complex, float16 / bfloat16 inputs, inputs of
            two different dtypes or devices, or (with ``match_dtype``) another dtype than the
            kernel's, or another device than ``device``.
        ShapeError: For 0-d inputs or inputs whose feature counts differ (from each other or
            from ``num_features``).
        InputDataError: With ``finite``, for NaN or infinite entries.
    """
    same = x2 is x1
    x1 = _as_kernel_input(x1, f"{name} x1", dtype, device)
    x2 = x1 if same else (None if x2 is None else _as_kernel_input(x2, f"{name} x2", dtype, device))
    if x2 is not None and x1.dtype != x2.dtype:
        raise InputTypeError(
            expected_got(
                f"{name} (x1, x2)", "inputs of one dtype", f"{x1.dtype} and {x2.dtype}",
                f"Convert both to the kernel's dtype {dtype} (x.to({dtype})).",
            )
        )  # fmt: skip
    if match_dtype and x1.dtype != dtype:
        raise InputTypeError(
            expected_got(
                f"{name} inputs", f"a {dtype} tensor like the kernel's parameters",
                f"dtype {x1.dtype}",
                f"Convert the inputs (x.to({dtype})) or the kernel (kernel.to({x1.dtype})).",
            )
        )  # fmt: skip
    if x2 is not None and x1.device != x2.device:
        raise InputTypeError(
            expected_got(
                f"{name} (x1, x2)", "inputs on one device", f"{x1.device} and {x2.device}",
                "Move both to the kernel's device.",
            )
        )  # fmt: skip
    if device is not None and x1.device != device:
        raise InputTypeError(
            expected_got(
                f"{name} inputs", f"tensors on {device} like the kernel's parameters",
                f"device {x1.device}",
                f"Move the inputs (x.to('{device}')) or the kernel (kernel.to('{x1.device}')).",
            )
        )  # fmt: skip
    w1 = x1.shape[-1] if x1.dim() > 1 else 1
    if x2 is not None and same_width:
        w2 = x2.shape[-1] if x2.dim() > 1 else 1
        if w1 != w2:
            raise ShapeError(
                expected_got(
                    f"{name} (x1, x2)", "x1 and x2 with the same number of features (columns)",
                    f"shapes {tuple(x1.shape)} and {tuple(x2.shape)}",
                    "Both inputs are (*batch, N, D) with the same D.",
                )
            )  # fmt: skip
    if num_features is not None and w1 != num_features:
        raise ShapeError(
            expected_got(
                f"{name} inputs", f"{num_features} features (columns)",
                f"shape {tuple(x1.shape)}", "Pass inputs of the width the kernel was built for.",
            )
        )  # fmt: skip
    if finite:
        check_finite(x1, f"{name} x1")
        if x2 is not None and x2 is not x1:
            check_finite(x2, f"{name} x2")
    return x1, x2


def _as_kernel_input(
    x: object, name: str, dtype: torch.dtype, device: torch.device | None
) -> torch.Tensor:
    """One kernel input as a float32/float64 tensor (see :func:`as_kernel_inputs`)."""
    if not isinstance(x, torch.Tensor):
        x = as_float_tensor(x, name, dtype=dtype)
        return x if device is None else x.to(device)
    if x.dtype == torch.bool or x.is_complex():
        raise InputTypeError(expected_got(name, "a real-valued tensor", f"dtype {x.dtype}"))
    if not x.is_floating_point():
        x = x.to(dtype)
    check_not_low_precision(x, name)
    if x.dim() == 0:
        raise ShapeError(
            expected_got(
                name, "shape (*batch, N, D) or (N,)", "a 0-d tensor",
                "Pass one row per point (x.reshape(-1, 1) for a single value).",
            )
        )  # fmt: skip
    return x

"""Input checks shared by gpext's public methods.

Each check raises a :mod:`gpext.errors` exception whose message names the argument, what was
expected, what was received, and how to fix it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__ = [
    "as_fit_input",
    "as_float_tensor",
    "as_model_input",
    "check_finite",
    "check_float_dtype",
    "check_labels",
    "check_not_low_precision",
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


def check_positive_int(value: object, name: str, *, minimum: int = 1) -> int:
    """Check that ``value`` is an integer ``>= minimum`` and return it as ``int``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputTypeError(expected_got(name, f"an integer >= {minimum}", repr(value)))
    if int(value) < minimum:
        raise InputDataError(expected_got(name, f"an integer >= {minimum}", int(value)))
    return int(value)


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
            labels = torch.as_tensor(np.asarray(labels))
        except (TypeError, ValueError) as err:
            raise InputTypeError(expected_got(name, "integer class labels", repr(labels))) from err
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

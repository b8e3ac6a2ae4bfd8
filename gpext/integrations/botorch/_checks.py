"""Input checks shared by the BoTorch adapters."""

from __future__ import annotations

import itertools

import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__ = ["check_query", "model_dtype"]


def _first_floating(module: torch.nn.Module | None) -> torch.Tensor | None:
    """The first non-empty floating parameter or buffer of ``module`` (``None`` if none).

    Empty buffers (an unfitted :class:`gpext.fit.Standardizer`'s statistics) say nothing about
    the model's dtype and are skipped.
    """
    if module is None:
        return None
    tensors = itertools.chain(module.parameters(), module.buffers())
    return next((t for t in tensors if t.is_floating_point() and t.numel() > 0), None)


def model_dtype(module: torch.nn.Module | None) -> torch.dtype | None:
    """The floating dtype of the first floating parameter or buffer of ``module`` (or ``None``).

    ``None`` (an adapter whose model is built at its first fit) has no dtype yet.
    """
    t = _first_floating(module)
    return None if t is None else t.dtype


def model_device(module: torch.nn.Module | None) -> torch.device | None:
    """The device of the first floating parameter or buffer of ``module`` (or ``None``)."""
    t = _first_floating(module)
    return None if t is None else t.device


def check_query(
    X: object, input_dim: int | None, dtype: torch.dtype | None, what: str
) -> torch.Tensor:
    """Validate a BoTorch query tensor of shape ``batch_shape x q x d``.

    Args:
        X: The query.
        input_dim: Expected ``d`` (``None``: not checked).
        dtype: Expected floating dtype (``None``: any floating dtype).
        what: Name used in messages, e.g. ``"IGNSurrogate.posterior(X)"``.

    Returns:
        ``X`` unchanged.

    Raises:
        InputTypeError: If ``X`` is not a floating tensor of the model's dtype.
        ShapeError: If ``X`` has fewer than two dimensions or the wrong ``d``.
        InputDataError: If ``X`` has non-finite entries.
    """
    if not isinstance(X, torch.Tensor):
        raise InputTypeError(expected_got(what, "a torch.Tensor", type(X).__name__))
    if not X.is_floating_point():
        raise InputTypeError(expected_got(what, "a floating tensor", f"dtype {X.dtype}"))
    if dtype is not None and X.dtype != dtype:
        raise InputTypeError(
            expected_got(
                what,
                f"dtype {dtype} (the model's dtype)",
                f"dtype {X.dtype}",
                f"Convert X with X.to({dtype}) or the model with .to({X.dtype}).",
            )
        )
    if X.dim() < 2:
        raise ShapeError(
            expected_got(
                what,
                "a tensor of shape batch_shape x q x d (at least 2 dimensions)",
                tuple(X.shape),
                "Add the q dimension with X.unsqueeze(-2).",
            )
        )
    if input_dim is not None and X.shape[-1] != input_dim:
        raise ShapeError(expected_got(what, f"d = {input_dim} columns", X.shape[-1]))
    if not bool(torch.isfinite(X).all()):
        raise InputDataError(expected_got(what, "finite entries", "NaN or inf"))
    return X

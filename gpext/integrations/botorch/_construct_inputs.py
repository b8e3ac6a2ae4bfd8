"""Shared checks of the adapters' ``construct_inputs`` (BoTorch's ``Model.construct_inputs``)."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from botorch.utils.datasets import SupervisedDataset

from gpext.errors import DataWarning, InputDataError, InputTypeError, ShapeError, expected_got

__all__ = ["dataset_tensors", "reject_options"]


def dataset_tensors(
    training_data: object, what: str, *, single_output: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Training inputs and targets of a BoTorch ``SupervisedDataset``, checked.

    Known observation variances (``Yvar``) are not used by the gpext models, which learn their
    own noise; a :class:`~gpext.errors.DataWarning` says so.  As every ``construct_inputs`` of
    the adapters calls this first, it is also where gpext's fit routine is registered with Ax's
    ``fit_botorch_model`` dispatcher when Ax is loaded (see
    :func:`~gpext.integrations.botorch.ax_support.register_ax_fit`): Ax calls
    ``construct_inputs`` before it fits the model.

    Args:
        training_data: The dataset.
        what: Name used in messages, e.g. ``"IGNSurrogate.construct_inputs"``.
        single_output: Whether the model takes one outcome only.

    Returns:
        ``(X, Y)``. # shapes: (n, d), (n, m)

    Raises:
        InputTypeError: If ``training_data`` is not a ``SupervisedDataset``.
        ShapeError: If ``X`` is not ``(n, d)`` or ``Y`` not ``(n, 1)`` (``(n, m)`` when
            ``single_output`` is false).
    """
    if not isinstance(training_data, SupervisedDataset):
        raise InputTypeError(
            expected_got(
                f"{what}(training_data)",
                "a botorch.utils.datasets.SupervisedDataset",
                type(training_data).__name__,
            )
        )
    X, Y = training_data.X, training_data.Y
    if X.dim() != 2 or Y.dim() != 2 or Y.shape[0] != X.shape[0]:
        raise ShapeError(
            expected_got(
                f"{what}(training_data)",
                "X of shape (n, d) and Y of shape (n, m) (batched datasets are not supported)",
                f"{tuple(X.shape)} and {tuple(Y.shape)}",
            )
        )
    if single_output and Y.shape[-1] != 1:
        raise ShapeError(
            expected_got(
                f"{what}(training_data)",
                "one outcome, Y of shape (n, 1)",
                tuple(Y.shape),
                "Model each outcome separately (Ax does so with a ModelList when the model "
                "class does not batch outcomes).",
            )
        )
    if training_data.Yvar is not None:
        warnings.warn(
            f"{what}: the dataset has known observation variances (Yvar); the gpext models "
            "learn their own noise and do not use them.",
            DataWarning,
            stacklevel=3,
        )
    from gpext.integrations.botorch.ax_support import register_ax_fit_if_loaded

    register_ax_fit_if_loaded()
    return X, Y


def reject_options(options: dict[str, Any], what: str, hint: str) -> None:
    """Raise :class:`~gpext.errors.InputDataError` when ``options`` is not empty.

    Args:
        options: Unused keyword arguments.
        what: Name used in messages.
        hint: What to do instead.
    """
    if options:
        raise InputDataError(expected_got(f"{what} options", "none", sorted(options), hint))

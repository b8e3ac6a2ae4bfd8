"""Shared input handling of the variational-bootstrap models (private)."""

from __future__ import annotations

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.likelihoods.dirichlet_transform import DirichletTransform
from gpext.utils import (
    as_float_tensor,
    as_model_input,
    check_finite,
    check_float_dtype,
    check_labels,
    check_positive_int,
)
from gpext.utils.validation import as_fit_input, check_rows

TASKS = ("regression", "classification")


def check_task(task: str, owner: str) -> str:
    if task not in TASKS:
        raise InputDataError(expected_got(f"{owner}.task", f"one of {TASKS}", repr(task)))
    return task


def check_inputs(
    x: object, owner: str, dtype: torch.dtype | None = None, like: torch.Tensor | None = None
) -> torch.Tensor:
    """Inputs ``(N, d)``, non-empty and finite.

    Before the model exists (``like`` is ``None``), numpy arrays, sequences and integer tensors
    are converted (to ``dtype``, or the default dtype) and float32/float64 tensors to ``dtype``
    when one is given (the model's declared dtype) or kept (the model adopts it).  After, inputs
    follow :func:`~gpext.utils.as_model_input`: the fitted model's dtype and device, with an
    :class:`~gpext.errors.InputTypeError` for a tensor of another floating dtype or device.
    Half precision is an error: an :class:`~gpext.errors.InputTypeError` for prediction, an
    :class:`~gpext.errors.InputDataError` from ``check_float_dtype`` for ``fit`` (as before).
    """
    name = f"{owner} x"
    if like is not None:
        x = as_model_input(x, like, name)
    else:
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            check_float_dtype(x.dtype, f"{owner} x.dtype")
        x = as_fit_input(x, name, dtype)
        if dtype is not None:
            x = x.to(dtype)
    check_float_dtype(x.dtype, f"{owner} x.dtype")
    return check_rows(x, name)


def regression_targets(
    y: object, noise: object, n: int, owner: str, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Targets as ``(N, C)`` and noise (``None``, or broadcast to ``(N, C)``)."""
    y = as_float_tensor(y, f"{owner} y", dtype).to(device)
    if y.dim() == 1:
        y = y.unsqueeze(-1)
    if y.dim() != 2 or y.shape[0] != n:
        raise ShapeError(expected_got(f"{owner} y", f"shape ({n},) or ({n}, C)", tuple(y.shape)))
    check_finite(y, f"{owner} y")
    if noise is None:
        return y, None
    noise = as_float_tensor(noise, f"{owner}.noise", dtype).to(device)
    if noise.dim() == 1 and noise.shape[0] == n:
        noise = noise.unsqueeze(-1)  # one variance per point, shared by the outputs
    try:
        noise = torch.broadcast_to(noise, y.shape).clone()
    except RuntimeError as err:
        raise ShapeError(
            expected_got(
                f"{owner}.noise",
                f"a scalar, shape ({n},) or a tensor broadcastable to {tuple(y.shape)}",
                tuple(noise.shape),
            )
        ) from err
    if not bool(torch.isfinite(noise).all()) or not bool((noise > 0).all()):
        raise InputDataError(
            expected_got(
                f"{owner}.noise", "finite positive variances", "zero, negative or non-finite values"
            )
        )
    return y, noise


def dirichlet_targets(
    labels: object,
    num_classes: int,
    alpha_epsilon: float,
    n: int,
    owner: str,
    dtype: torch.dtype,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Dirichlet-transformed targets and noise (001 Eq. 10-11), each ``(N, C)``."""
    labels = check_labels(labels, num_classes, f"{owner} y").to(device)
    if labels.dim() != 1 or labels.shape[0] != n:
        raise ShapeError(
            expected_got(f"{owner} y", f"class labels of shape ({n},)", tuple(labels.shape))
        )
    targets, noise = DirichletTransform(num_classes, alpha_epsilon)(labels, dtype=dtype)
    return targets, noise


def check_classes(task: str, num_classes: object, owner: str) -> int | None:
    """``num_classes`` is required for classification (never inferred from the labels)."""
    if task != "classification":
        return None
    if num_classes is None:
        raise InputDataError(
            expected_got(
                f"{owner}.num_classes",
                "the number of classes for task='classification'",
                None,
                "Pass num_classes=C (it is not inferred from the labels, which may miss classes).",
            )
        )
    return check_positive_int(num_classes, f"{owner}.num_classes", minimum=2)


def particle_mixture(
    owner: str, task: str, f: torch.Tensor, fitted_noise: torch.Tensor, noise: object
) -> tuple[torch.Tensor, torch.Tensor]:
    """Equal-weight Gaussian mixture over particle functions ``f`` (shared by the VBoot models).

    Args:
        owner: Class name used in messages.
        task: The model's task; must be ``"regression"``.
        f: Particle function values.  # shape: (K, M, C)
        fitted_noise: The training noise (NaN when it was given per point).
        noise: Test noise variance, or ``None`` for ``fitted_noise``.

    Returns:
        Component means and variances, ``(K, M)`` for one output or ``(K, M, C)``.
    """
    if task != "regression":
        raise InputDataError(
            f"{owner}.predict_mixture: the model is a classifier; use predict_proba."
        )
    if noise is None:
        if not bool(torch.isfinite(fitted_noise).all()):
            raise InputDataError(
                f"{owner}.predict_mixture: the training noise was given per point; pass the "
                "test points' noise variance as noise=..."
            )
        noise = fitted_noise
    noise = torch.as_tensor(noise, dtype=f.dtype, device=f.device)
    if noise.dim() == 1 and f.shape[-1] != noise.shape[0]:
        noise = noise.unsqueeze(-1)
    var = torch.broadcast_to(noise, f.shape).clone()
    if f.shape[-1] == 1:
        return f.squeeze(-1), var.squeeze(-1)
    return f, var


def particle_average_probs(owner: str, task: str, f: torch.Tensor) -> torch.Tensor:
    """Particle average of the softmax (001 Eq. 12).  ``f``: (K, M, C) -> (M, C)."""
    if task != "classification":
        raise InputDataError(
            f"{owner}.predict_proba: the model is a regressor; use predict_mixture."
        )
    return torch.softmax(f, dim=-1).mean(0)

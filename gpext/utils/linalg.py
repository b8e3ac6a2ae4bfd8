"""Numerically guarded dense linear algebra shared by the models."""

from __future__ import annotations

import warnings

import torch
from linear_operator import settings as lo_settings

from gpext.errors import (
    InputDataError,
    NumericalError,
    NumericalWarning,
    ShapeError,
    expected_got,
)

__all__ = ["safe_cholesky"]

#: Fallback retry jitter relative to the mean absolute diagonal, per dtype (float64, other), for
#: dtypes ``linear_operator.settings.cholesky_jitter`` has no value for; these are that
#: setting's own defaults.
_RELATIVE_FLOOR = {torch.float64: 1e-8}
_RELATIVE_FLOOR_DEFAULT = 1e-6
#: Fallback number of retries if ``linear_operator.settings.cholesky_max_tries`` holds none
#: (that setting's own default).
_MAX_TRIES_DEFAULT = 3


def _relative_floor_setting(dtype: torch.dtype) -> float:
    """``linear_operator.settings.cholesky_jitter`` for ``dtype``, else gpext's default."""
    try:
        value = lo_settings.cholesky_jitter.value(dtype)
    except RuntimeError:  # a dtype the setting does not cover (bfloat16, complex)
        value = None
    if value is None:  # e.g. float16, which has no default there
        return _RELATIVE_FLOOR.get(dtype, _RELATIVE_FLOOR_DEFAULT)
    return float(value)


def _max_tries_setting() -> int:
    """``linear_operator.settings.cholesky_max_tries``, else gpext's default."""
    value = lo_settings.cholesky_max_tries.value()
    return _MAX_TRIES_DEFAULT if value is None else value


def safe_cholesky(
    matrix: torch.Tensor,
    *,
    jitter: float = 0.0,
    name: str = "matrix",
    max_tries: int | None = None,
    growth: float = 10.0,
    relative_floor: float | None = None,
    hint: str = "Check the kernel hyperparameters, use float64, or increase the jitter.",
) -> torch.Tensor:
    r"""Cholesky factor of a symmetric PSD matrix with an escalating diagonal jitter.

    Returns the lower triangular :math:`L` with

    .. math::

        L L^\top = A + \epsilon_k I, \qquad \epsilon_0 = \texttt{jitter}, \quad
        \epsilon_{k+1} = \max\big(g\,\epsilon_k,\; \rho\, \bar a\big),

    for the first :math:`k \le` ``max_tries`` at which the factorisation succeeds, where
    :math:`g` is ``growth``, :math:`\bar a` the mean absolute diagonal of :math:`A` and
    :math:`\rho` the ``relative_floor``, so that a zero starting jitter still escalates on the
    matrix's own scale.  Every retry issues a :class:`~gpext.errors.NumericalWarning` (a
    subclass of linear_operator's ``NumericalWarning``, so filters on that one apply too)
    whose text depends only on ``name``, :math:`g` and :math:`\rho` (so a warning raised in
    every step of a training loop is shown once); the jitter reached is in the error when all
    tries fail.
    ``max_tries=0`` disables the fallback.

    ``max_tries`` and :math:`\rho` resolve as GPyTorch's knobs do: the explicit argument if
    given, else linear_operator's settings (read at call time, so their context managers
    apply), else gpext's default:

    * ``max_tries``: ``linear_operator.settings.cholesky_max_tries`` (default 3), as in
      ``linear_operator.utils.cholesky.psd_safe_cholesky``;
    * :math:`\rho`: ``linear_operator.settings.cholesky_jitter`` for the matrix's dtype (default
      ``1e-6`` float32, ``1e-8`` float64), else ``1e-6`` (float16, bfloat16).  Unlike
      linear_operator, which adds that value as it is, gpext multiplies it by :math:`\bar a`,
      so the escalation does not depend on the matrix's scale (for a kernel matrix with unit
      outputscale the two agree).

    The starting ``jitter`` is not a setting: linear_operator's first attempt adds no jitter
    either, which is the default here.

    Args:
        matrix: Symmetric matrix. # shape: (*batch, M, M)
        jitter: Initial absolute diagonal jitter (``>= 0``).
        name: What the matrix is, used in warnings and errors.
        max_tries: Number of jitter increases before giving up (default
            ``linear_operator.settings.cholesky_max_tries``, see above).
        growth: Factor of each increase (``> 1``).
        relative_floor: :math:`\rho` above (default ``linear_operator.settings.cholesky_jitter``
            for the matrix's dtype, see above).
        hint: How to fix a failure, appended to the error.

    Returns:
        ``L`` with ``L L^T = matrix + eps I``. # shape: (*batch, M, M)

    Raises:
        InputDataError: If ``jitter``, ``growth``, ``max_tries`` or ``relative_floor`` (given or
            read from the settings) is out of range.
        ShapeError: If ``matrix`` is not square.
        NumericalError: If ``matrix`` has non-finite entries, or is not positive definite even
            with the largest jitter tried.

    Example:
        >>> L = safe_cholesky(torch.eye(3, dtype=torch.float64))
        >>> bool(torch.equal(L, torch.eye(3, dtype=torch.float64)))
        True
    """
    tries_from_setting = max_tries is None
    if tries_from_setting:
        max_tries = _max_tries_setting()
    floor = _relative_floor_setting(matrix.dtype) if relative_floor is None else relative_floor
    if not (jitter >= 0 and growth > 1 and max_tries >= 0 and floor >= 0):
        raise InputDataError(
            expected_got(
                "safe_cholesky(jitter, growth, max_tries, relative_floor)",
                "jitter >= 0, growth > 1, max_tries >= 0 and relative_floor >= 0",
                (jitter, growth, max_tries, floor),
                "max_tries and relative_floor default to linear_operator.settings."
                "cholesky_max_tries and cholesky_jitter; check those if you did not pass them.",
            )
        )
    if matrix.dim() < 2 or matrix.shape[-1] != matrix.shape[-2]:
        raise ShapeError(
            expected_got(name, "a square matrix of shape (*batch, M, M)", tuple(matrix.shape))
        )
    if not bool(torch.isfinite(matrix).all()):
        raise NumericalError(
            expected_got(
                name, "a finite matrix", "NaN or infinite entries", "Check the kernel or inputs."
            )
        )
    jit = float(jitter)
    for attempt in range(max_tries + 1):
        # no identity is built on the common path (zero jitter, first try succeeds)
        shifted = (
            matrix.diagonal_scatter(matrix.diagonal(dim1=-2, dim2=-1) + jit, dim1=-2, dim2=-1)
            if jit
            else matrix
        )
        chol, info = torch.linalg.cholesky_ex(shifted)
        if not bool((info > 0).any()):
            return chol
        if attempt == max_tries:
            break
        # the scale is only needed (and synchronised) once a factorisation has failed
        scale = float(matrix.detach().diagonal(dim1=-2, dim2=-1).abs().mean().clamp_min(1e-12))
        new = max(jit * growth, floor * scale)
        # one text per matrix name (no numbers), so that Python shows a warning raised at every
        # step of a training loop once instead of flooding the log
        warnings.warn(
            f"{name} is not positive definite with the requested diagonal jitter; retrying with "
            f"a {growth:g}x larger one (at least {floor:.0e} of the mean diagonal).",
            NumericalWarning,
            stacklevel=2,
        )
        jit = new
    if tries_from_setting:
        hint = (
            f"{hint} (The number of retries and their jitter follow "
            "linear_operator.settings.cholesky_max_tries and cholesky_jitter.)"
        )
    raise NumericalError(
        expected_got(
            name,
            "a positive semi-definite matrix",
            f"a matrix that is not positive definite: its Cholesky factorisation failed with "
            f"diagonal jitter up to {jit:.1e} after {max_tries} jitter increase(s)",
            hint,
        )
    )

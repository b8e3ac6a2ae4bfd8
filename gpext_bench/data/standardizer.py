"""Affine standardisation of inputs and targets with statistics of the training part."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from gpext.errors import DataWarning, InputDataError, InputTypeError, ShapeError, expected_got

__all__ = ["Standardizer"]


@dataclass(eq=False)
class Standardizer:
    r"""Elementwise affine map :math:`z = (x - \mu) / \sigma` fitted on training data.

    .. math::

        z = \frac{x - \mu}{\sigma}, \qquad x = z \sigma + \mu, \qquad
        \operatorname{Var}[x] = \sigma^2 \operatorname{Var}[z].

    For inputs ``mean`` and ``std`` have shape ``(D,)`` and act on the last dimension of
    ``x`` with shape ``(..., D)``; for targets they are scalars (shape ``()``) and act on
    ``y`` of any shape ``(...)``.

    Attributes:
        mean: Location :math:`\mu`.  # shape: (D,) or ()
        std: Scale :math:`\sigma`, strictly positive.  # shape: (D,) or ()

    Example:
        >>> x = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
        >>> s = Standardizer.fit(x)
        >>> s.transform(x)
        tensor([[-1., -1.],
                [ 1.,  1.]])
        >>> torch.equal(s.inverse_transform(s.transform(x)), x)
        True
    """

    mean: torch.Tensor
    std: torch.Tensor

    def __post_init__(self) -> None:
        if not isinstance(self.mean, torch.Tensor) or not isinstance(self.std, torch.Tensor):
            raise InputTypeError(
                expected_got(
                    "Standardizer.mean/std",
                    "torch.Tensor",
                    f"{type(self.mean).__name__}/{type(self.std).__name__}",
                )
            )
        if self.mean.shape != self.std.shape or self.mean.dim() > 1:
            raise ShapeError(
                expected_got(
                    "Standardizer.mean/std",
                    "equal shapes, either () or (D,)",
                    f"{tuple(self.mean.shape)} and {tuple(self.std.shape)}",
                )
            )
        if not bool((self.std > 0).all()):
            raise InputDataError(
                expected_got("Standardizer.std", "strictly positive entries", self.std)
            )

    @classmethod
    def fit(cls, x: torch.Tensor) -> Standardizer:
        """Fit mean and (population, ``ddof=0``) standard deviation.

        A 1-D ``x`` (targets) gets scalar statistics; an ``x`` with shape ``(..., N, D)``
        gets per-column statistics reduced over every dimension but the last.  A column
        whose standard deviation is zero (up to round-off) keeps ``std = 1`` so that it is
        only centred; a :class:`~gpext.errors.DataWarning` is issued only when *all*
        columns are constant.  Statistics are computed in float64 and stored in
        ``x.dtype``.

        Args:
            x: Training data.  # shape: (N,) or (..., N, D)

        Returns:
            The fitted standardizer.

        Raises:
            InputTypeError: If ``x`` is not a floating-point tensor.
            ShapeError: If ``x`` is a scalar or has no rows.
            InputDataError: If ``x`` contains NaN or infinite values.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise InputTypeError(
                expected_got("Standardizer.fit(x)", "a floating-point torch.Tensor", type(x))
            )
        if x.dim() == 0 or x.numel() == 0:
            raise ShapeError(
                expected_got("Standardizer.fit(x)", "a non-empty tensor", tuple(x.shape))
            )
        # Statistics in float64 numpy: exact reference semantics, and no thread start-up
        # cost of torch's parallel reductions for a one-off computation.
        flat = x.detach().cpu().to(torch.float64).numpy()
        flat = flat.reshape(-1) if x.dim() == 1 else flat.reshape(-1, x.shape[-1])
        finite = np.isfinite(flat)
        if not finite.all():
            raise InputDataError(
                expected_got(
                    "Standardizer.fit(x)",
                    "finite values",
                    f"{int((~finite).sum())} NaN/inf entries",
                    "Remove or impute them first.",
                )
            )
        mean = flat.mean(axis=0)
        std = flat.std(axis=0)
        constant = std <= 1e-12 * np.maximum(np.abs(mean), 1.0)
        if constant.all():
            warnings.warn(
                "Standardizer.fit: every column is constant; they are centred but not scaled.",
                DataWarning,
                stacklevel=2,
            )
        std = np.where(constant, 1.0, std)
        return cls(
            torch.as_tensor(mean, dtype=x.dtype, device=x.device),
            torch.as_tensor(std, dtype=x.dtype, device=x.device),
        )

    @classmethod
    def identity(
        cls,
        dim: int | None,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ) -> Standardizer:
        """Standardizer that leaves data unchanged (``mean = 0``, ``std = 1``).

        Args:
            dim: Number of columns ``D``, or ``None`` for scalar statistics (targets).
            dtype: Floating dtype of the statistics.
            device: Device of the statistics.

        Returns:
            The identity standardizer.
        """
        shape = () if dim is None else (int(dim),)
        return cls(
            torch.zeros(shape, dtype=dtype, device=device),
            torch.ones(shape, dtype=dtype, device=device),
        )

    @property
    def is_identity(self) -> bool:
        """Whether the map is the identity."""
        return bool((self.mean == 0).all() and (self.std == 1).all())

    def transform(self, x: torch.Tensor) -> torch.Tensor:
        """Map data to standardised units: ``(x - mean) / std``.

        Args:
            x: Data in original units.  # shape: (..., D) or (...)

        Returns:
            Standardised data, same shape as ``x``.
        """
        return (x - self.mean.to(x)) / self.std.to(x)

    def inverse_transform(self, x: torch.Tensor) -> torch.Tensor:
        """Map standardised data (e.g. a predictive mean) back: ``x * std + mean``.

        Args:
            x: Data in standardised units.  # shape: (..., D) or (...)

        Returns:
            Data in original units, same shape as ``x``.
        """
        return x * self.std.to(x) + self.mean.to(x)

    def inverse_transform_variance(self, var: torch.Tensor) -> torch.Tensor:
        """Map a variance in standardised units back: ``var * std**2``.

        Args:
            var: Variances in standardised units.  # shape: (..., D) or (...)

        Returns:
            Variances in original units, same shape as ``var``.
        """
        return var * self.std.to(var) ** 2

    def to(self, *args, **kwargs) -> Standardizer:
        """Return a copy with ``mean`` and ``std`` moved as by :meth:`torch.Tensor.to`."""
        return Standardizer(self.mean.to(*args, **kwargs), self.std.to(*args, **kwargs))

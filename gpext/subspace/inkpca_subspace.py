"""Incremental kernel-PCA subspace of a weight trajectory (000 Sec. III, Algorithms 2-3)."""

from __future__ import annotations

import math
import warnings

import torch
from gpytorch.kernels import Kernel, LinearKernel
from torch import nn

from gpext.errors import DataWarning, InputDataError, NumericalWarning, ShapeError, expected_got
from gpext.operators import IncrementalKPCA
from gpext.utils import as_float_tensor, check_finite, check_positive_int

__all__ = ["InKPCASubspace"]


class InKPCASubspace(nn.Module):
    r"""Weight subspace from an incrementally updated kernel PCA of the deviations.

    Each collected deviation :math:`d_{m+1}` is added, in strict arrival order, to an
    :class:`~gpext.operators.IncrementalKPCA` (rank-one eigen-updates of the kernel matrix: one
    kernel column :math:`k(\hat D, d_{m+1})` per collection, the Gram matrix is never recomputed).
    The leading kernel principal axes :math:`v_j = \sum_i A_{ij} \phi(d_i)` are mapped back to
    weight space as the same combinations of the stored deviations, normalised, and scaled by the
    trajectory's standard deviation along them (000 Eq. 9):

    .. math::

        u_j = \frac{\hat D^\top a_j}{\|\hat D^\top a_j\|}, \qquad
        s_j = \frac{\|\hat D u_j\|}{\sqrt{m - 1}}, \qquad
        P = \operatorname{diag}(s) U^\top, \qquad w = \hat w + P^\top \theta .

    With the linear kernel :math:`k(d, d') = d^\top d'` (the default), :math:`u_j` are the right
    singular vectors of :math:`\hat D` and :math:`s_j` its singular values over
    :math:`\sqrt{m-1}`: ``P`` equals the :class:`~gpext.subspace.PCASubspace` projection up to
    signs. Other kernels give directions adapted to the non-linear structure of the trajectory.

    Each update costs one kernel row against the stored deviations (``O(m D)`` reads, no copy
    of them: the deviations sit in a preallocated block, sized ``max_points`` when given and
    grown by doubling otherwise) plus two rank-one eigen-updates of size ``m``; see
    ``benchmarks/inkpca_subspace.py`` for its speed against recomputing the decomposition.

    Only the first ``max_points`` deviations are handled incrementally; beyond, the oldest
    deviation is dropped and the decomposition is rebuilt from the ``max_points`` most recent ones
    with a batch eigendecomposition (IncrementalKPCA has no downdate), with a
    :class:`~gpext.errors.DataWarning` the first time.

    Args:
        rank: Subspace dimension ``r``.
        kernel: A GPyTorch kernel on weight vectors; default the linear kernel with variance 1.
        centered: Decompose the centred kernel matrix (kernel PCA with mean adjustment).
        max_points: Capacity ``m`` (``None``: unbounded).
        dtype: Dtype of the decomposition (``torch.float64`` recommended).

    Example:
        >>> sub = InKPCASubspace(rank=2)
        >>> for d in torch.randn(10, 50):
        ...     _ = sub.update(d)
        >>> sub.projection.shape
        torch.Size([2, 50])
    """

    def __init__(
        self,
        rank: int = 20,
        kernel: Kernel | None = None,
        *,
        centered: bool = False,
        max_points: int | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        self.rank = check_positive_int(rank, "InKPCASubspace.rank")
        self.max_points = (
            None
            if max_points is None
            else check_positive_int(max_points, "InKPCASubspace.max_points", minimum=2)
        )
        if kernel is None:
            kernel = LinearKernel()
            kernel.variance = 1.0
        self.kpca = IncrementalKPCA(
            kernel.to(dtype), centered=centered, dtype=dtype, on_degenerate="record"
        )
        self._cache: torch.Tensor | None = None
        self._out_dtype = dtype
        self._warned_overflow = False

    @property
    def num_points(self) -> int:
        """Number of deviations held."""
        return self.kpca.num_points

    def update(self, deviations: torch.Tensor) -> InKPCASubspace:
        """Add one deviation or several (first row first).

        Args:
            deviations: # shape: (D,) or (n, D)

        Returns:
            ``self``.

        Raises:
            ShapeError: If the dimension differs from the stored deviations.
            InputDataError: If a deviation is not finite.
        """
        x = as_float_tensor(deviations, "InKPCASubspace.update(deviations)")
        self._out_dtype = x.dtype
        x = x.unsqueeze(0) if x.dim() == 1 else x
        if x.dim() != 2:
            raise ShapeError(
                expected_got(
                    "InKPCASubspace.update(deviations)", "shape (D,) or (n, D)", tuple(x.shape)
                )
            )
        if not bool(torch.isfinite(x.sum())):  # one cheap pass; the entry-wise check if needed
            check_finite(x, "InKPCASubspace.update(deviations)")
        if self.max_points is not None and self.num_points == 0:
            # Known budget: one block for all deviations, no growth copies.
            self.kpca.reserve(self.max_points, x.shape[-1])
        for row in x:
            if self.max_points is not None and self.num_points >= self.max_points:
                if not self._warned_overflow:
                    warnings.warn(
                        f"InKPCASubspace: more than max_points={self.max_points} deviations; the "
                        "oldest is dropped and the decomposition rebuilt in batch.",
                        DataWarning,
                        stacklevel=2,
                    )
                    self._warned_overflow = True
                kept = self.kpca.points[1:].clone()
                self.kpca.fit(torch.cat([kept, row.to(kept)[None]]))
            else:
                self.kpca.update(row)
        self._cache = None
        return self

    def fit(self, deviations: torch.Tensor) -> InKPCASubspace:
        """Forget everything and add the rows of ``deviations`` one by one, in order.

        Args:
            deviations: # shape: (K, D)
        """
        self.kpca.reset()
        self._warned_overflow = False
        return self.update(deviations)

    @property
    def projection(self) -> torch.Tensor:
        """The projection matrix ``P`` (computed lazily, cached until the next update). # shape: (r, D)

        Raises:
            InputDataError: With fewer than two deviations or ``rank`` above their number.
        """
        if self._cache is None:
            self._cache = self._compute_projection()
        return self._cache

    def _compute_projection(self) -> torch.Tensor:
        m = self.num_points
        if m < 2:
            raise InputDataError(
                expected_got(
                    "InKPCASubspace", "at least 2 deviations", m, "Call update() during training."
                )
            )
        if self.rank > m:
            raise InputDataError(
                expected_got(
                    "InKPCASubspace.rank",
                    f"at most the number of collected deviations ({m})",
                    self.rank,
                    "Lower the rank or collect more deviations.",
                )
            )
        points = self.kpca.points  # shape: (m, D)
        if self.kpca.centered:
            points = points - points.mean(0, keepdim=True)
        coef = self.kpca.expansion_coefficients(self.rank)  # shape: (m, r')
        dirs = points.mT @ coef  # shape: (D, r')
        norms = dirs.norm(dim=0)
        keep = norms > torch.finfo(dirs.dtype).eps * points.norm()
        if int(keep.sum()) < self.rank:
            warnings.warn(
                f"InKPCASubspace: only {int(keep.sum())} of rank={self.rank} kernel principal "
                "axes are numerically non-zero (repeated or degenerate deviations); the "
                "projection has fewer rows.",
                NumericalWarning,
                stacklevel=3,
            )
        dirs = dirs[:, keep] / norms[keep]
        scales = (points @ dirs).norm(dim=0) / math.sqrt(m - 1)
        return (scales.unsqueeze(-1) * dirs.mT).to(self._out_dtype)

"""Incremental kernel-PCA subspace of a weight trajectory (000 Sec. III, Algorithms 2-3)."""

from __future__ import annotations

import math
import warnings

import torch
from gpytorch.kernels import Kernel, LinearKernel
from torch import nn

from gpext.errors import (
    DataWarning,
    InputDataError,
    NotFittedError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.operators import IncrementalKPCA
from gpext.utils import as_float_tensor, check_finite, check_positive_int
from gpext.utils.validation import check_not_low_precision

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
    grown by doubling otherwise) plus one bordered (arrowhead) eigen-update of size ``m``; see
    ``benchmarks/inkpca_subspace.py`` for its speed against recomputing the decomposition.

    Only the first ``max_points`` deviations are handled incrementally; beyond, the oldest
    deviation is dropped and the decomposition is rebuilt from the ``max_points`` most recent ones
    with a batch eigendecomposition (IncrementalKPCA has no downdate), with a
    :class:`~gpext.errors.DataWarning` the first time.

    Lengthscale of stationary kernels: a kernel that compares weight deviations needs a
    lengthscale on their scale (deviation norms are often 10-100), and GPyTorch's initial 0.69
    makes the kernel matrix the identity: every deviation looks unrelated to every other, and
    the kernel principal axes are arbitrary (on real deviations of norm about 23 an RBF
    subspace of rank 5 spanned only 3 dimensions).  With ``lengthscale="median"`` the first
    ``num_init`` non-zero deviations are buffered, the lengthscale is set to their median
    pairwise distance (the median heuristic), and the buffered deviations are then added in
    arrival order.  The default ``"auto"`` does so only when the kernel's lengthscale is still
    GPyTorch's initial value (its raw parameter exactly 0); a number sets it; ``None`` leaves
    the kernel alone.  Whatever the choice, once ``num_init`` deviations are in, their
    correlation matrix :math:`k_{ij} / \sqrt{k_{ii} k_{jj}}` is checked and a
    :class:`~gpext.errors.NumericalWarning` says if it is nearly the identity (all
    off-diagonal entries below 0.01) or nearly constant (all above 0.999).

    The decomposition lives on the device of the first deviations (later ones are moved
    there, and ``.to(device)`` moves it with everything held).

    Args:
        rank: Subspace dimension ``r``.
        kernel: A GPyTorch kernel on weight vectors; default the linear kernel with variance 1.
        centered: Decompose the centred kernel matrix (kernel PCA with mean adjustment).
        max_points: Capacity ``m`` (``None``: unbounded).
        dtype: Dtype of the decomposition (``torch.float64`` recommended).
        lengthscale: ``"auto"`` (default), ``"median"``, a positive number or ``None`` (see
            above); ignored for kernels without a lengthscale (the linear kernel).
        num_init: Non-zero deviations used for the median rule and the kernel-matrix check.

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
        lengthscale: float | str | None = "auto",
        num_init: int = 5,
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
        self.num_init = check_positive_int(num_init, "InKPCASubspace.num_init", minimum=2)
        ls_module = _lengthscale_module(kernel)
        valid = lengthscale in (None, "auto", "median") or (
            isinstance(lengthscale, (int, float))
            and not isinstance(lengthscale, bool)
            and math.isfinite(lengthscale)
            and lengthscale > 0
        )
        if not valid:
            raise InputDataError(
                expected_got("InKPCASubspace.lengthscale",
                             "'auto', 'median', a positive number or None", lengthscale)
            )  # fmt: skip
        if ls_module is not None and isinstance(lengthscale, (int, float)):
            ls_module.lengthscale = float(lengthscale)
        if lengthscale == "auto":
            untouched = ls_module is not None and bool((ls_module.raw_lengthscale == 0).all())
            lengthscale = "median" if untouched else None
        #: ``"median"`` while the median rule is to be applied, else ``None``.
        self.lengthscale_rule = lengthscale if ls_module is not None else None
        self.kpca = IncrementalKPCA(
            kernel.to(dtype), centered=centered, dtype=dtype, on_degenerate="record"
        )
        #: Deviations held back for the median rule until ``num_init`` non-zero ones arrived
        #: (``None``: feeding directly).
        self._pending: list[torch.Tensor] | None = [] if self.lengthscale_rule == "median" else None
        self._checked = False
        self._cache: torch.Tensor | None = None
        self._out_dtype = dtype
        self._warned_overflow = False

    @property
    def num_points(self) -> int:
        """Number of deviations held (buffered ones included)."""
        if self._pending is not None:
            return len(self._pending)
        return self.kpca.num_points

    def update(self, deviations: torch.Tensor) -> InKPCASubspace:
        """Add one deviation or several (first row first).

        Args:
            deviations: # shape: (D,) or (n, D)

        Returns:
            ``self``.

        Raises:
            ShapeError: If the dimension differs from the stored deviations.
            InputDataError: If a deviation is not finite or none is given.
            InputTypeError: For half-precision deviations.
        """
        x = as_float_tensor(deviations, "InKPCASubspace.update(deviations)")
        check_not_low_precision(x, "InKPCASubspace.update(deviations)")
        if x.numel() == 0:
            raise InputDataError(
                expected_got(
                    "InKPCASubspace.update(deviations)", "at least one deviation",
                    f"shape {tuple(x.shape)}",
                )
            )  # fmt: skip
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
        if self.num_points == 0:  # nothing buffered or decomposed yet
            self.kpca.to(x.device)  # the state lives where the first deviations are
        if self._pending is not None:
            self._pending.extend(x.unbind(0))
            if sum(1 for d in self._pending if bool(d.any())) < self.num_init:
                self._cache = None
                return self
            x = self._start()
        self._feed(x)
        self._cache = None
        return self

    def _start(self) -> torch.Tensor:
        """Apply the lengthscale rule and the kernel-matrix check to the buffered deviations."""
        pending, self._pending = self._pending, None
        x = torch.stack(pending)
        nonzero = x[x.abs().sum(-1) > 0][: self.num_init].to(self.kpca.dtype)
        if nonzero.shape[0] >= 2:
            if self.lengthscale_rule == "median":
                dist = torch.cdist(nonzero, nonzero)
                positive = dist[dist > 0]
                if positive.numel():
                    _lengthscale_module(self.kpca.kernel).lengthscale = float(positive.median())
            self._check_kernel_matrix(nonzero)
            self._checked = True
        return x

    def _check_kernel_matrix(self, points: torch.Tensor) -> None:
        with torch.no_grad():
            k = self.kpca.kernel(points, points).to_dense()
        d = k.diagonal().clamp_min(torch.finfo(k.dtype).tiny).sqrt()
        corr = k / d[:, None] / d[None, :]
        off = corr[~torch.eye(corr.shape[0], dtype=torch.bool, device=corr.device)]
        what = None
        if bool((off.abs() < 1e-2).all()):
            what = "nearly the identity: the kernel sees every deviation as unrelated"
        elif bool((off > 0.999).all()):
            what = "nearly constant: the kernel sees every deviation as the same"
        if what is not None:
            dist = torch.cdist(points, points)
            warnings.warn(
                f"InKPCASubspace: the kernel matrix of the first {points.shape[0]} deviations is "
                f"{what} (median pairwise distance {float(dist[dist > 0].median()):.3g}); the "
                "kernel principal axes are then arbitrary. Set the kernel's lengthscale to the "
                "scale of the deviations (lengthscale='median').",
                NumericalWarning,
                stacklevel=4,
            )

    def _feed(self, x: torch.Tensor) -> None:
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
        if not self._checked and self.kpca.num_points >= self.num_init:
            points = self.kpca.points
            nonzero = points[points.abs().sum(-1) > 0][: self.num_init]
            if nonzero.shape[0] >= min(self.num_init, 2):
                self._check_kernel_matrix(nonzero)
                self._checked = True

    def fit(self, deviations: torch.Tensor) -> InKPCASubspace:
        """Forget everything and add the rows of ``deviations`` one by one, in order.

        Args:
            deviations: # shape: (K, D)
        """
        self.kpca.reset()
        self._warned_overflow = False
        self._pending = [] if self.lengthscale_rule == "median" else None
        self._checked = False
        return self.update(deviations)

    @property
    def projection(self) -> torch.Tensor:
        """The projection matrix ``P`` (computed lazily, cached until the next update). # shape: (r, D)

        Raises:
            NotFittedError: Before any deviation.
            InputDataError: With one deviation only or ``rank`` above their number.
        """
        if self._cache is None:
            if self._pending:  # fewer than num_init non-zero deviations so far: start anyway
                self._feed(self._start())
            self._cache = self._compute_projection()
        return self._cache

    def _compute_projection(self) -> torch.Tensor:
        m = self.num_points
        if m == 0:
            raise NotFittedError(
                "InKPCASubspace: no deviations yet; call update(deviation) during training "
                "(or fit(deviations)) before reading the projection."
            )
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


def _lengthscale_module(kernel: Kernel) -> Kernel | None:
    """The (first) sub-kernel with a lengthscale, e.g. the RBF inside a ScaleKernel."""
    for module in kernel.modules():
        if isinstance(module, Kernel) and getattr(module, "has_lengthscale", False):
            return module
    return None

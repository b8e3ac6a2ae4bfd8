"""Low-rank linear operator ``U diag(L) U^T`` built from (Nyström) kernel-PCA eigenpairs."""

from __future__ import annotations

import torch
from linear_operator.operators import LinearOperator, LowRankRootLinearOperator
from linear_operator.operators.diag_linear_operator import DiagLinearOperator

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_finite

__all__ = ["NystromKPCALinearOperator"]


class NystromKPCALinearOperator(LinearOperator):
    r"""The symmetric matrix :math:`U_{\mathrm{nys}} L_{\mathrm{nys}} U_{\mathrm{nys}}^\top`.

    The Nyström approximation of a kernel matrix from the eigenpairs of Eq. 8 of the source
    document (000_..., Sec. III-B),

    .. math::

        \tilde K = U_{\mathrm{nys}} \operatorname{diag}(L_{\mathrm{nys}}) U_{\mathrm{nys}}^\top,

    stored by its factors (memory ``O(n r)``). Matrix products cost ``O(n r)`` per column, the
    diagonal ``O(n r)``, and :meth:`root_decomposition` is the exact low-rank root
    :math:`U_{\mathrm{nys}} L_{\mathrm{nys}}^{1/2}` with no Lanczos iterations. Adding a diagonal
    (e.g. a Gaussian likelihood's noise) gives linear_operator's
    ``LowRankRootAddedDiagLinearOperator``, whose solves and log-determinants use the Woodbury
    identity, so the operator can serve as the covariance of a GPyTorch ``MultivariateNormal``
    or be returned by a kernel's ``forward``.

    Hooks owed by linear_operator's base class: ``_matmul``, ``_size``, ``_transpose_nonbatch``;
    ``_diagonal``, ``_expand_batch``, ``_mul_constant``, ``root_decomposition`` and
    ``add_diagonal`` are specialised for speed.

    The operator is positive semi-definite by construction: the eigenvalues must be finite and
    non-negative (drop or clamp negative ones first, as :meth:`IncrementalKPCA.nystrom
    <gpext.operators.IncrementalKPCA.nystrom>` does). A product with a negative constant is a
    generic linear_operator ``ConstantMulLinearOperator``.

    Args:
        eigenvectors: ``U_nys`` (columns need not be orthonormal). # shape: (*batch, n, r)
        eigenvalues: ``L_nys``, finite and non-negative, of the eigenvectors' dtype and device.
            # shape: (*batch, r)

    Raises:
        ShapeError: If the shapes do not match.
        InputDataError: If the dtypes are not floating point, an entry is not finite or an
            eigenvalue is negative.
        InputTypeError: If the two tensors have different dtypes or devices.

    Example:
        >>> u = torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64)).Q
        >>> op = NystromKPCALinearOperator(u, torch.tensor([2.0, 1.0], dtype=torch.float64))
        >>> op.shape
        torch.Size([6, 6])
    """

    def __init__(
        self, eigenvectors: torch.Tensor, eigenvalues: torch.Tensor, *, _checked: bool = False
    ) -> None:
        # ``_checked``: built from the factors of a checked operator (linear_operator rebuilds
        # an operator from its representation for every product; the checks run once).
        if not torch.is_tensor(eigenvectors) or not torch.is_tensor(eigenvalues):
            raise InputDataError(
                expected_got(
                    "NystromKPCALinearOperator",
                    "tensors (eigenvectors, eigenvalues)",
                    (type(eigenvectors).__name__, type(eigenvalues).__name__),
                )
            )
        if not (eigenvectors.is_floating_point() and eigenvalues.is_floating_point()):
            raise InputDataError(
                expected_got(
                    "NystromKPCALinearOperator",
                    "floating-point tensors",
                    (eigenvectors.dtype, eigenvalues.dtype),
                )
            )
        if eigenvectors.dim() < 2 or eigenvalues.shape[-1:] != eigenvectors.shape[-1:]:
            raise ShapeError(
                expected_got(
                    "NystromKPCALinearOperator",
                    "eigenvectors (*batch, n, r) and eigenvalues (*batch, r)",
                    f"{tuple(eigenvectors.shape)} and {tuple(eigenvalues.shape)}",
                )
            )
        if eigenvectors.dtype != eigenvalues.dtype or eigenvectors.device != eigenvalues.device:
            raise InputTypeError(
                expected_got(
                    "NystromKPCALinearOperator",
                    "eigenvectors and eigenvalues of one dtype on one device",
                    f"{eigenvectors.dtype} on {eigenvectors.device} and {eigenvalues.dtype} "
                    f"on {eigenvalues.device}",
                    "Convert both, e.g. eigenvalues.to(eigenvectors).",
                )
            )
        if not _checked:
            check_finite(eigenvectors, "NystromKPCALinearOperator eigenvectors")
            check_finite(eigenvalues, "NystromKPCALinearOperator eigenvalues")
            if bool((eigenvalues < 0).any()):
                raise InputDataError(
                    expected_got(
                        "NystromKPCALinearOperator eigenvalues",
                        "non-negative values (a positive semi-definite operator)",
                        f"minimum {float(eigenvalues.min()):.3e}",
                        "Drop the negative eigenpairs (IncrementalKPCA.nystrom does) or clamp "
                        "round-off with eigenvalues.clamp_min(0).",
                    )
                )
        super().__init__(eigenvectors, eigenvalues, _checked=True)
        self.eigenvectors = eigenvectors
        self.eigenvalues = eigenvalues

    def _batch(self) -> torch.Size:
        return torch.broadcast_shapes(self.eigenvectors.shape[:-2], self.eigenvalues.shape[:-1])

    def _size(self) -> torch.Size:
        n = self.eigenvectors.shape[-2]
        return torch.Size((*self._batch(), n, n))

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

    def matmul(self, other: torch.Tensor | LinearOperator) -> torch.Tensor | LinearOperator:
        """``self @ other`` with the shapes and dtype of ``other`` checked first.

        Args:
            other: A matrix or vector. # shape: (*batch2, n, p) or (n,)

        Returns:
            The product. # shape: (*batch, n, p) or (*batch, n)

        Raises:
            InputTypeError: If ``other`` is not a tensor or linear operator, or has another
                dtype or device than the operator.
            ShapeError: If ``other`` does not have ``n`` rows or its batch shape does not
                broadcast with the operator's.
        """
        name = "NystromKPCALinearOperator.matmul other"
        if not isinstance(other, (torch.Tensor, LinearOperator)):
            raise InputTypeError(
                expected_got(name, "a torch.Tensor or LinearOperator", type(other).__name__)
            )
        if other.dtype != self.dtype or other.device != self.device:
            raise InputTypeError(
                expected_got(
                    name, f"{self.dtype} on {self.device} like the operator",
                    f"{other.dtype} on {other.device}", f"Convert it with other.to({self.dtype}).",
                )
            )  # fmt: skip
        n = self.shape[-1]
        rows = other.shape[0] if other.dim() == 1 else other.shape[-2] if other.dim() else None
        batch_ok = True
        if other.dim() > 2:
            try:
                torch.broadcast_shapes(self.batch_shape, other.shape[:-2])
            except RuntimeError:
                batch_ok = False
        if rows != n or not batch_ok:
            raise ShapeError(
                expected_got(
                    name, f"shape (..., {n}, p) or ({n},) for an operator of shape "
                    f"{tuple(self.shape)}", f"shape {tuple(other.shape)}",
                )
            )  # fmt: skip
        return super().matmul(other)

    def _matmul(self, rhs: torch.Tensor) -> torch.Tensor:
        u, lam = self.eigenvectors, self.eigenvalues
        if rhs.dim() == 1:
            return u @ (lam * (u.mT @ rhs))
        return u @ (lam.unsqueeze(-1) * (u.mT @ rhs))

    def _t_matmul(self, rhs: torch.Tensor) -> torch.Tensor:
        return self._matmul(rhs)

    def _diagonal(self) -> torch.Tensor:
        return (self.eigenvectors.square() * self.eigenvalues.unsqueeze(-2)).sum(-1)

    def _expand_batch(self, batch_shape: torch.Size) -> LinearOperator:
        n, r = self.eigenvectors.shape[-2:]
        return self.__class__(
            self.eigenvectors.expand(*batch_shape, n, r),
            self.eigenvalues.expand(*batch_shape, r),
            _checked=True,
        )

    def _mul_constant(self, other: float | torch.Tensor) -> LinearOperator:
        other = torch.as_tensor(other, dtype=self.dtype, device=self.device)
        if not bool(torch.isfinite(other).all() and (other >= 0).all()):
            return super()._mul_constant(other)  # indefinite (or NaN): a generic operator
        return self.__class__(
            self.eigenvectors, self.eigenvalues * other.unsqueeze(-1), _checked=True
        )

    def to_dense(self) -> torch.Tensor:
        """The dense ``(*batch, n, n)`` matrix."""
        u = self.eigenvectors
        return (u * self.eigenvalues.unsqueeze(-2)) @ u.mT

    def low_rank_root(self) -> torch.Tensor:
        """``U_nys L_nys^{1/2}``. # shape: (*batch, n, r)"""
        return self.eigenvectors * self.eigenvalues.sqrt().unsqueeze(-2)

    def root_decomposition(self, method: str | None = None) -> LinearOperator:
        """Exact root ``R R^T`` with ``R = U_nys L_nys^{1/2}`` (no Lanczos iterations)."""
        return LowRankRootLinearOperator(self.low_rank_root())

    def add_diagonal(self, diag: torch.Tensor) -> LinearOperator:
        """``self + diag`` as a Woodbury-ready ``LowRankRootAddedDiagLinearOperator``."""
        return LowRankRootLinearOperator(self.low_rank_root()).add_diagonal(diag)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return LowRankRootLinearOperator(self.low_rank_root()) + other
        return super().__add__(other)

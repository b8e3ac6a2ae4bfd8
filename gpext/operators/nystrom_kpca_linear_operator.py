"""Low-rank linear operator ``U diag(L) U^T`` built from (Nyström) kernel-PCA eigenpairs."""

from __future__ import annotations

import torch
from linear_operator.operators import LinearOperator, LowRankRootLinearOperator
from linear_operator.operators.diag_linear_operator import DiagLinearOperator

from gpext.errors import InputDataError, ShapeError, expected_got

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

    Args:
        eigenvectors: ``U_nys`` (columns need not be orthonormal). # shape: (*batch, n, r)
        eigenvalues: ``L_nys``, non-negative for a positive semi-definite operator (negative
            values are allowed, but then the exact root is not available). # shape: (*batch, r)

    Raises:
        ShapeError: If the shapes do not match.
        InputDataError: If the dtypes are not floating point.

    Example:
        >>> u = torch.linalg.qr(torch.randn(6, 2, dtype=torch.float64)).Q
        >>> op = NystromKPCALinearOperator(u, torch.tensor([2.0, 1.0], dtype=torch.float64))
        >>> op.shape
        torch.Size([6, 6])
    """

    def __init__(self, eigenvectors: torch.Tensor, eigenvalues: torch.Tensor) -> None:
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
        super().__init__(eigenvectors, eigenvalues)
        self.eigenvectors = eigenvectors
        self.eigenvalues = eigenvalues

    def _batch(self) -> torch.Size:
        return torch.broadcast_shapes(self.eigenvectors.shape[:-2], self.eigenvalues.shape[:-1])

    def _size(self) -> torch.Size:
        n = self.eigenvectors.shape[-2]
        return torch.Size((*self._batch(), n, n))

    def _transpose_nonbatch(self) -> LinearOperator:
        return self

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
            self.eigenvectors.expand(*batch_shape, n, r), self.eigenvalues.expand(*batch_shape, r)
        )

    def _mul_constant(self, other: float | torch.Tensor) -> LinearOperator:
        other = torch.as_tensor(other, dtype=self.dtype, device=self.device)
        return self.__class__(self.eigenvectors, self.eigenvalues * other.unsqueeze(-1))

    def to_dense(self) -> torch.Tensor:
        """The dense ``(*batch, n, n)`` matrix."""
        u = self.eigenvectors
        return (u * self.eigenvalues.unsqueeze(-2)) @ u.mT

    def low_rank_root(self) -> torch.Tensor:
        """``U_nys L_nys^{1/2}`` (needs non-negative eigenvalues). # shape: (*batch, n, r)"""
        if bool((self.eigenvalues < 0).any()):
            raise InputDataError(
                expected_got(
                    "NystromKPCALinearOperator.low_rank_root",
                    "non-negative eigenvalues",
                    f"minimum {float(self.eigenvalues.min()):.3e}",
                    "Drop negative eigenpairs (IncrementalKPCA.nystrom does).",
                )
            )
        return self.eigenvectors * self.eigenvalues.clamp(min=0).sqrt().unsqueeze(-2)

    def root_decomposition(self, method: str | None = None) -> LinearOperator:
        """Exact root ``R R^T`` with ``R = U_nys L_nys^{1/2}`` (Lanczos if an eigenvalue < 0)."""
        if bool((self.eigenvalues < 0).any()):
            return super().root_decomposition(method=method)
        return LowRankRootLinearOperator(self.low_rank_root())

    def add_diagonal(self, diag: torch.Tensor) -> LinearOperator:
        """``self + diag`` as a Woodbury-ready ``LowRankRootAddedDiagLinearOperator``."""
        if bool((self.eigenvalues < 0).any()):
            return super().add_diagonal(diag)
        return LowRankRootLinearOperator(self.low_rank_root()).add_diagonal(diag)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator) and not bool((self.eigenvalues < 0).any()):
            return LowRankRootLinearOperator(self.low_rank_root()) + other
        return super().__add__(other)

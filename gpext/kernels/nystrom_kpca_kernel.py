"""Low-rank Nyström kernel over landmarks, decomposed by incremental kernel PCA."""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from linear_operator import to_dense
from linear_operator.operators import (
    LinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
)
from torch.autograd.function import once_differentiable

from gpext.errors import (
    InputDataError,
    InputTypeError,
    NotFittedError,
    ShapeError,
    expected_got,
)
from gpext.kernels._checked_inputs import CheckedInputsMixin
from gpext.operators.incremental_kpca import IncrementalKPCA
from gpext.utils import as_float_tensor, check_finite

__all__ = ["NystromKPCAKernel"]

_ON_CHANGE = ("refresh", "raise")


class NystromKPCAKernel(CheckedInputsMixin, Kernel):
    r"""Nyström approximation of a base kernel on landmarks, from their kernel-PCA eigenpairs.

    With the landmarks :math:`Z` (``m`` points), the eigendecomposition
    :math:`K_{ZZ} = U \Lambda U^\top` of their kernel matrix and the ``r`` eigenpairs kept by the
    rule of :class:`~gpext.operators.IncrementalKPCA` (:math:`\lambda > \text{eigenvalue\_rtol}
    \cdot \lambda_{\max}`; smaller and negative eigenvalues are dropped, never inverted),

    .. math::

        \tilde k(x, x') = k(x, Z)\, U_r \Lambda_r^{-1} U_r^\top\, k(Z, x')
            = \phi(x)^\top \phi(x'), \qquad \phi(x) = \Lambda_r^{-1/2} U_r^\top k(Z, x).

    This is :math:`U_{\mathrm{nys}} L_{\mathrm{nys}} U_{\mathrm{nys}}^\top` of Eq. 8 of the
    source document (000_..., Sec. III-B): the ``n / m`` factors cancel. On the landmarks it
    reproduces :math:`U_r \Lambda_r U_r^\top`, i.e. :math:`K_{ZZ}` up to the dropped eigenvalues.

    **Outputs.** ``kernel(x)`` (``x1`` equal to ``x2``) is a
    ``LowRankRootLinearOperator`` :math:`R R^\top` with :math:`R = \phi(X)^\top =
    k(X, Z) U_r \Lambda_r^{-1/2}` (``(*batch, n, r)``); adding a Gaussian likelihood's noise gives
    ``LowRankRootAddedDiagLinearOperator``, whose solves and log-determinants use the Woodbury
    identity (``O(n r^2)``). A cross-covariance (``x1`` not equal to ``x2``) is a
    ``MatmulLinearOperator`` :math:`R_1 R_2^\top`; ``diag=True`` gives
    :math:`\sum_j R_{1,ij} R_{2,ij}` without forming the matrix.

    **Streaming.** The eigenpairs live in an :class:`~gpext.operators.IncrementalKPCA` over the
    landmarks (:attr:`kpca`). :meth:`update` adds landmarks by rank-one eigen-updates (Algorithm 3
    of the source, ``O(m^2)`` per landmark instead of a new ``O(m^3)`` ``eigh``).

    **Hyperparameters.** The decomposition belongs to the base kernel's hyperparameters at the
    time it was computed (their values are recorded). Every evaluation and :meth:`update` first
    compares the current values with that record; if they differ, the decomposition is recomputed
    from the landmarks with the current kernel (``on_hyperparameter_change="refresh"``, one batch
    ``eigh``, ``O(m^3)``: one per optimiser step while training) or
    :class:`~gpext.errors.NotFittedError` is raised (``"raise"``; call :meth:`refresh`).
    Eigenpairs of two different kernels are never mixed.

    **Gradients.** The eigen-updates and the refresh run without autograd. When gradients are
    enabled and a base-kernel parameter requires them, :math:`K_{ZZ}` is evaluated with autograd
    and linked to the factor :math:`W = U_r \Lambda_r^{-1/2}` by an explicit backward: with
    :math:`W = S U_r`, :math:`S = f(K_{ZZ})`, :math:`f(\lambda) = \lambda^{-1/2}` on kept and
    :math:`0` on dropped eigenvalues, and :math:`U_r` held fixed, the Daleckii-Krein formula gives

    .. math::

        \bar K_{ZZ} = U \big(F \circ \operatorname{sym}(U^\top \bar S\, U)\big) U^\top, \quad
        F_{ij} = \begin{cases}
            -\big(\sqrt{\lambda_i \lambda_j}(\sqrt{\lambda_i} + \sqrt{\lambda_j})\big)^{-1}
                & i, j \text{ kept} \\
            \lambda_i^{-1/2} / (\lambda_i - \lambda_j) & i \text{ kept}, j \text{ dropped} \\
            0 & i, j \text{ dropped,}
        \end{cases}

    with :math:`\bar S = \bar W U_r^\top`. What is exact: the value is Eq. 8 with the stored
    eigenpairs (a fresh ``eigh`` after a refresh; after :meth:`update`, rank-one updates that
    agree with ``eigh`` to rounding); the gradient of every quantity that depends on :math:`R`
    through :math:`R R^\top` (the covariance, its cross and diagonal blocks, marginal likelihood,
    predictions) is the exact derivative of
    :math:`\theta \mapsto k(X, Z) f(K_{ZZ})^2 k(Z, X')` for the kept set, which is locally
    constant (the function itself jumps when an eigenvalue crosses the threshold). Repeated kept
    eigenvalues are harmless (no :math:`1/(\lambda_i - \lambda_j)` between kept pairs); only the
    gap between kept and dropped eigenvalues appears. :math:`R` itself is defined up to an
    ``r x r`` rotation; its gradient is the one with the eigenbasis held fixed. The landmarks are
    a buffer (not learned); gradients with respect to ``x1``/``x2`` flow through
    :math:`k(X, Z)` as usual. Double backward is not supported.

    **Limits.** One set of hyperparameters: ``batch_shape`` (of this kernel and of the base
    kernel) must be empty; ``x1`` and ``x2`` may carry any broadcastable batch dimensions
    (the landmarks are shared). ``last_dim_is_batch`` is not supported. With ``active_dims``, the
    landmarks live in the selected dimensions. The landmarks and the decomposition are stored in
    the base kernel's dtype and device (landmarks of another dtype are cast) and follow
    ``module.to(...)``; a change of dtype decomposes the landmarks again in the new precision.

    Args:
        base_kernel: The kernel :math:`k` to approximate (its hyperparameters are this kernel's).
        landmarks: The initial landmarks :math:`Z`. # shape: (m, d)
        on_hyperparameter_change: ``"refresh"`` (default) or ``"raise"``, see above.
        eigenvalue_rtol: Relative floor of the eigenpair rule; default ``sqrt(eps)`` of the
            dtype (1.5e-8 in float64, 3.5e-4 in float32).
        on_degenerate: How :meth:`update` treats a landmark that duplicates a stored one in
            feature space: ``"warn"``, ``"record"`` or ``"raise"`` (see ``IncrementalKPCA``).
        **kwargs: ``active_dims`` (and an empty ``batch_shape``) for ``gpytorch.kernels.Kernel``.

    Raises:
        InputTypeError: If ``base_kernel`` is not a GPyTorch kernel.
        InputDataError: If an option is unknown, or the landmarks are not finite.
        ShapeError: If the landmarks are not ``(m, d)``, or a batch shape is not empty.

    Example:
        >>> import gpytorch, torch
        >>> from gpext.kernels import NystromKPCAKernel
        >>> base = gpytorch.kernels.RBFKernel()
        >>> kernel = gpytorch.kernels.ScaleKernel(NystromKPCAKernel(base, torch.randn(20, 2)))
        >>> covar = kernel(torch.randn(100, 2))  # (100, 100), rank <= 20
        >>> kernel.base_kernel.update(torch.randn(5, 2))  # 25 landmarks, rank-one updates
        NystromKPCAKernel(...)
    """

    def __init__(
        self,
        base_kernel: Kernel,
        landmarks: torch.Tensor,
        *,
        on_hyperparameter_change: str = "refresh",
        eigenvalue_rtol: float | None = None,
        on_degenerate: str = "warn",
        **kwargs,
    ) -> None:
        if not isinstance(base_kernel, Kernel):
            raise InputTypeError(
                expected_got(
                    "NystromKPCAKernel.base_kernel", "a gpytorch.kernels.Kernel", type(base_kernel)
                )
            )
        if on_hyperparameter_change not in _ON_CHANGE:
            raise InputDataError(
                expected_got(
                    "NystromKPCAKernel.on_hyperparameter_change",
                    f"one of {_ON_CHANGE}",
                    repr(on_hyperparameter_change),
                )
            )
        batch_shape = torch.Size(kwargs.get("batch_shape") or ())
        if len(batch_shape) or len(base_kernel.batch_shape):
            raise ShapeError(
                expected_got(
                    "NystromKPCAKernel.batch_shape",
                    "an empty batch shape for this kernel and its base kernel (one set of "
                    "hyperparameters; batched inputs x1/x2 are supported)",
                    f"{tuple(batch_shape)} and base {tuple(base_kernel.batch_shape)}",
                    "Use one NystromKPCAKernel per batch member.",
                )
            )
        super().__init__(**kwargs)
        dtype, device = _dtype_device(base_kernel, landmarks)
        z = as_float_tensor(landmarks, "NystromKPCAKernel.landmarks", dtype=dtype).to(device)
        if z.dim() != 2 or z.shape[0] == 0:
            raise ShapeError(
                expected_got("NystromKPCAKernel.landmarks", "shape (m, d), m >= 1", tuple(z.shape))
            )
        check_finite(z, "NystromKPCAKernel.landmarks")
        self.on_hyperparameter_change = on_hyperparameter_change
        self.base_kernel = base_kernel  # registered first: the kernel's hyperparameters' names
        self.kpca = IncrementalKPCA(
            base_kernel,
            eigenvalue_rtol=eigenvalue_rtol,
            on_degenerate=on_degenerate,
            dtype=dtype,
            device=device,
        )
        self.kpca.fit(z)

    # ------------------------------------------------------------------ properties
    @property
    def landmarks(self) -> torch.Tensor:
        """The landmarks :math:`Z`, in the order they were added. # shape: (m, d)"""
        return self.kpca.points

    @property
    def num_landmarks(self) -> int:
        """Number of landmarks ``m``."""
        return self.kpca.num_points

    @property
    def is_stale(self) -> bool:
        """Whether the base kernel's hyperparameters changed since the decomposition."""
        return self.kpca.kernel_changed()

    # ------------------------------------------------------------------ public API
    def refresh(self) -> NystromKPCAKernel:
        """Decompose the landmarks' kernel matrix again with the current hyperparameters.

        Returns:
            ``self``.
        """
        self.kpca.refit()
        return self

    def update(self, landmarks: torch.Tensor) -> NystromKPCAKernel:
        """Add landmarks one at a time by rank-one eigen-updates (Algorithm 3 of the source).

        If the hyperparameters changed since the decomposition, it is first refreshed (or
        :class:`~gpext.errors.NotFittedError` is raised, per ``on_hyperparameter_change``).

        .. warning::
            A GPyTorch ``ExactGP`` in eval mode caches its training solve and does not see
            that the landmarks changed: call ``model.train(); model.eval()`` after
            :meth:`update` and before predicting (the tutorial ``tutorials/kernels.ipynb``
            measured predictions off by up to 12 without it).

        Args:
            landmarks: New landmarks, first row first. # shape: (d,) or (k, d)

        Returns:
            ``self``.

        Raises:
            ShapeError: If the dimension differs from the stored landmarks.
            InputDataError: On non-finite landmarks, or a duplicate with
                ``on_degenerate="raise"``.
            NotFittedError: If the hyperparameters changed and ``on_hyperparameter_change`` is
                ``"raise"``.
        """
        self._ensure_current("update")
        self.kpca.update(landmarks)
        return self

    def features(self, x: torch.Tensor) -> torch.Tensor:
        r"""The feature map :math:`\phi(x)^\top = k(x, Z) U_r \Lambda_r^{-1/2}` (the root ``R``).

        Args:
            x: Inputs (after ``active_dims``, if any, are applied). # shape: (*batch, n, d)

        Returns:
            ``R`` with :math:`R R^\top = \tilde K`. # shape: (*batch, n, r)

        Raises:
            InputTypeError: If ``x`` is float16 / bfloat16 or of another floating dtype (or
                device) than the landmarks; integer tensors and numpy arrays are converted.
            InputDataError: If ``x`` has NaN or infinite entries.
            ShapeError: If the dimension differs from the landmarks'.
        """
        x, _ = self._check_inputs(x, None, finite=True)
        return self._cross(x) @ self._factor()

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        diag: bool = False,
        last_dim_is_batch: bool = False,
        **params,
    ) -> torch.Tensor | LinearOperator:
        """The Nyström kernel matrix (or its diagonal) between ``x1`` and ``x2``.

        Args:
            x1: # shape: (*batch1, n1, d)
            x2: # shape: (*batch2, n2, d)
            diag: Return the diagonal only (``n1 == n2``). # shape: (*batch, n1)
            last_dim_is_batch: Not supported.

        Returns:
            ``LowRankRootLinearOperator`` if ``x1`` equals ``x2``, else
            ``MatmulLinearOperator``. # shape: (*batch, n1, n2)

        Raises:
            InputDataError: If ``last_dim_is_batch`` is set, or an input has NaN or infinite
                entries.
            InputTypeError: For float16 / bfloat16 inputs, or inputs of another floating dtype
                (or device) than the landmarks.
            ShapeError: If the inputs' dimension differs from the landmarks' or between ``x1``
                and ``x2``.
            NotFittedError: If the hyperparameters changed with ``on_hyperparameter_change=
                "raise"``.
        """
        if last_dim_is_batch:
            raise InputDataError(
                expected_got(
                    "NystromKPCAKernel(last_dim_is_batch)",
                    "False",
                    True,
                    "Build one NystromKPCAKernel per input dimension (with active_dims) and add "
                    "them with gpytorch.kernels.AdditiveKernel instead.",
                )
            )
        x1, x2 = self._check_inputs(x1, x2, finite=True)
        w = self._factor()  # shape: (m, r)
        r1 = self._cross(x1) @ w  # shape: (*batch1, n1, r)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        r2 = r1 if same else self._cross(x2) @ w  # shape: (*batch2, n2, r)
        if diag:
            return (r1 * r2).sum(-1)
        if same:
            return LowRankRootLinearOperator(r1)
        batch = torch.broadcast_shapes(r1.shape[:-2], r2.shape[:-2])
        r1 = r1.expand(*batch, *r1.shape[-2:])
        r2 = r2.expand(*batch, *r2.shape[-2:])
        return MatmulLinearOperator(r1, r2.mT)

    _match_dtype = True

    def _input_reference(self) -> torch.Tensor:
        return self.landmarks

    # ------------------------------------------------------------------ internals

    def _apply(self, fn, *args, **kwargs):
        dtype = self.kpca.dtype
        super()._apply(fn, *args, **kwargs)
        if self.kpca.dtype != dtype and not self.kpca.kernel_changed():
            # Eigenpairs converted from another dtype carry that dtype's rounding (float32's
            # would fail float64's eigenvalue rule): decompose again in the new precision.
            self.kpca.refit()
        return self

    def _ensure_current(self, method: str) -> None:
        if not self.kpca.kernel_changed():
            return
        if self.on_hyperparameter_change == "raise":
            raise NotFittedError(
                f"NystromKPCAKernel.{method}: the base kernel's hyperparameters changed since "
                f"the {self.num_landmarks} landmarks were decomposed. Call refresh() to "
                "decompose them with the current values, or build the kernel with "
                "on_hyperparameter_change='refresh' to do so automatically."
            )
        self.kpca.refit()

    def _factor(self) -> torch.Tensor:
        r"""``W = U_r Lambda_r^{-1/2}``, differentiable in the hyperparameters. # shape: (m, r)"""
        self._ensure_current("forward")
        lam_r, u_r = self.kpca._kept(None)  # descending, the eigenvalue rule applied
        needs_grad = torch.is_grad_enabled() and any(
            p.requires_grad for p in self.base_kernel.parameters()
        )
        if not needs_grad:
            return u_r / lam_r.sqrt()
        z = self.landmarks
        kzz = to_dense(self.base_kernel(z, z))  # shape: (m, m), carries the gradient
        lam, u = self.kpca.eigenvalues, self.kpca.eigenvectors  # all m pairs, descending
        return _KeptInverseSqrt.apply(kzz, lam.to(kzz), u.to(kzz), lam_r.shape[0])

    def _cross(self, x: torch.Tensor) -> torch.Tensor:
        """``k(x, Z)``. # shape: (*batch, n, m)"""
        z = self.landmarks
        if x.shape[-1] != z.shape[-1]:
            raise ShapeError(
                expected_got(
                    "NystromKPCAKernel input",
                    f"{z.shape[-1]} features like the landmarks (after active_dims)",
                    x.shape[-1],
                )
            )
        z = z.expand(*x.shape[:-2], *z.shape)
        return to_dense(self.base_kernel(x, z))


class _KeptInverseSqrt(torch.autograd.Function):
    """``W = U_r Lambda_r^{-1/2}`` from given eigenpairs, with the Daleckii-Krein backward."""

    @staticmethod
    def forward(
        ctx, kzz: torch.Tensor, evals: torch.Tensor, evecs: torch.Tensor, rank: int
    ) -> torch.Tensor:
        # kzz: (m, m), only the autograd link; evals (m,) descending with evecs (m, m) its
        # eigendecomposition; the first ``rank`` pairs are the kept ones.
        ctx.save_for_backward(evals, evecs)
        ctx.rank = rank
        return evecs[:, :rank] / evals[:rank].sqrt()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_w: torch.Tensor):
        lam, u = ctx.saved_tensors
        r, m = ctx.rank, lam.shape[0]
        # W = S U_r with U_r fixed: grad_S = grad_W U_r^T, and U^T grad_S U = [U^T grad_W, 0].
        g = grad_w.new_zeros(m, m)
        g[:, :r] = u.mT @ grad_w
        g = (g + g.mT) / 2
        s = lam[:r].sqrt()
        f = torch.zeros_like(g)
        f[:r, :r] = -1.0 / (s[:, None] * s[None, :] * (s[:, None] + s[None, :]))
        cross = 1.0 / (s[:, None] * (lam[:r, None] - lam[None, r:]))  # shape: (r, m - r)
        f[:r, r:] = cross
        f[r:, :r] = cross.mT
        return u @ (f * g) @ u.mT, None, None, None


def _dtype_device(kernel: Kernel, landmarks: object) -> tuple[torch.dtype, torch.device]:
    """The base kernel's dtype and device (the landmarks' when it has no parameters)."""
    tensors = [t for t in kernel.parameters() if t.is_floating_point()]
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) > 1:
        raise InputDataError(
            expected_got(
                "NystromKPCAKernel.base_kernel", "parameters of one dtype", sorted(map(str, dtypes))
            )
        )
    if dtypes:
        dtype, device = dtypes.pop(), tensors[0].device
    elif isinstance(landmarks, torch.Tensor) and landmarks.is_floating_point():
        dtype, device = landmarks.dtype, landmarks.device
    else:
        dtype, device = torch.get_default_dtype(), torch.device("cpu")
    if dtype not in (torch.float32, torch.float64):
        raise InputDataError(
            expected_got(
                "NystromKPCAKernel dtype",
                "torch.float32 or torch.float64",
                dtype,
                "Cast the base kernel with .float() or .double().",
            )
        )
    return dtype, device

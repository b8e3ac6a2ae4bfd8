"""Incremental kernel PCA by rank-one eigen-updates (Algorithm 3), with Nyström rescaling."""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch
from gpytorch import settings as gpytorch_settings
from gpytorch.kernels import Kernel, LinearKernel

from gpext.errors import (
    DataWarning,
    InputDataError,
    InputTypeError,
    NotFittedError,
    NumericalError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.operators._arrowhead import arrowhead_eigvals_factor
from gpext.operators._secular import (
    _GEMM,
    _PROJECT,
    _UPDATE,
    Factor,
    _eigh_cost,
    rank_one_basis_update,
    rank_one_eigvals_factor,
)
from gpext.operators.nystrom_kpca_linear_operator import NystromKPCALinearOperator
from gpext.utils import (
    as_float_tensor,
    check_finite,
    check_float_dtype,
    check_positive_int,
    progress_bar,
)
from gpext.utils.validation import check_not_low_precision

__all__ = ["IncrementalKPCA"]

_EMPTY = np.zeros(0, dtype=np.int64)


def _arange(n: int) -> np.ndarray:
    return np.arange(n, dtype=np.int64)


_ON_DEGENERATE = ("warn", "raise", "record")
# State-dict prefix of the kernel values recorded with the decomposition.
_KERNEL_VALUES = "_kernel_values."
# Period of ``refresh_every="auto"`` in float32 (see the class docstring).
_AUTO_REFRESH = 100
_METHODS = ("auto", "rank_one", "eigh")

_MAX_PENDING = 8  # pending factor entries at most this many times m^2 (memory)
# State written on every update: assigned without ``nn.Module.__setattr__``'s bookkeeping
# (about 10 us per assignment, which at m ~ 50 is comparable to the update itself).
_STATE_BUFFERS = frozenset({"_store", "_evals", "_evecs", "_diag", "_row_sums", "_total"})
_PLAIN_STATE = frozenset({
    "_m", "_pending", "_pending_numel", "_pending_spent", "_gram", "_null", "_null_sign",
    "_since_refresh",
})  # fmt: skip


def _norm(x: torch.Tensor) -> torch.Tensor:
    """Euclidean norm without overflow or underflow of the squares (entries of 1e160 or 1e-160)."""
    if x.numel() == 0:
        return x.new_zeros(())
    top = x.abs().max()
    if not float(top) > 0:  # zero, or NaN (propagated)
        return top
    return top * torch.linalg.vector_norm(x / top)


class IncrementalKPCA(torch.nn.Module):
    r"""Eigendecomposition of a growing kernel matrix, one point at a time, in arrival order.

    Each new point :math:`x_{m+1}` borders the kernel matrix with :math:`a = k(X, x_{m+1})` and
    :math:`k = k(x_{m+1}, x_{m+1})`. Algorithm 3 of the source document (000_..., Sec. III-B,
    Eq. 7) writes the bordered matrix as two rank-one changes of a block-diagonal one,

    .. math::

        K_{m+1} = \begin{bmatrix} K_m & 0 \\ 0 & k/4 \end{bmatrix}
            + \sigma v_1 v_1^\top - \sigma v_2 v_2^\top, \qquad
        \sigma = 4 / k,\; v_1 = [a; k/2],\; v_2 = [a; k/4],

    so appending the eigenpair :math:`(k/4, e_{m+1})` and calling
    :func:`~gpext.operators.rank_one_eigh_update` twice updates the eigendecomposition exactly.

    **One solve per point.** Without ``max_components`` the same bordered matrix is decomposed
    in one step: in the bordered basis :math:`\operatorname{blockdiag}(U, 1)` it is the
    arrowhead :math:`\begin{bmatrix} \Lambda & U^\top a \\ a^\top U & k \end{bmatrix}`,
    whose eigenvalues are the roots of :math:`\lambda - k + \sum_i z_i^2 / (\lambda_i -
    \lambda)` (:math:`z = U^\top a`), solved once by the safeguarded secular iteration of
    the rank-one update, with Gu-Eisenstat eigenvectors (``gpext/operators/_arrowhead.py``).
    That is half the work of the two rank-one updates (each a secular solve), with no
    division by :math:`k`, so degenerate points take the same path. With ``max_components``
    the truncated basis keeps Eq. 7's updates below.

    With ``centered=True`` the decomposition is that of the feature-space centred matrix
    :math:`H K H` (:math:`H = I - 11^\top/m`). Adding a point changes every entry of the old
    centred block by :math:`u_i + u_j` (the shift of the row means and of the grand mean), i.e. by
    :math:`u 1^\top + 1 u^\top`, which is two more rank-one updates (weights :math:`\pm 1/2`);
    then the centred column is appended as above: four updates per point (with
    ``max_components``; otherwise two, see below).

    Degenerate points are always added and recorded in :attr:`degenerate_points` (and, by default,
    warned about): ``"zero_self_similarity"`` (:math:`k \le` ``degenerate_rtol`` times the
    largest self-similarity), ``"centered_self_similarity_zero"`` (the centred :math:`k_c` is that
    small) and ``"duplicate"`` (cosine similarity 1 in feature space with a stored point). The
    arrowhead solve never divides by :math:`k`; with ``max_components``, where
    :math:`\sigma = 4/k` would blow up, the column is appended as
    :math:`\operatorname{diag}(K, k) + e a'^\top + a' e^\top` with two rank-one updates of
    weight :math:`\pm 1/2` instead (exact for any :math:`k`, no division by it).

    Adding a point costs one kernel row against the stored points plus the eigen-update: the
    points sit in a block that grows by doubling (or is sized once with :meth:`reserve`), so no
    stored point is copied per update, and for an exact ``gpytorch.kernels.LinearKernel`` (no
    ``active_dims``) the row is ``variance * X x`` computed on the block itself (GPyTorch's
    ``LinearKernel`` would first copy the scaled ``X``).

    **Deferred basis.** A rank-one update costs :math:`O(m^2)` for its eigenvalues (deflation,
    secular equation, Gu-Eisenstat factor :math:`F`, with :math:`U' = U F`) but
    :math:`O(m^3)` for the product :math:`U F`. Without ``max_components`` the products are
    deferred: the factors are kept, the next update's :math:`z = U'^\top v` is formed through
    them (:math:`O(m^2)` each), and the basis is made explicit only when it is read
    (:attr:`eigenvectors`, :meth:`transform`, :meth:`nystrom`, :meth:`expansion_coefficients`,
    ``state_dict``, a dtype or device change), by applying the factors or by one batch
    ``eigh`` of the cached kernel matrix, whichever the cost model below says is cheaper. While
    points stream in without reads, the basis is made explicit once projecting through the
    pending factors has cost as much as doing so (a ski-rental rule: never more than twice the
    cheaper policy), or when they hold more than ``8 m^2`` numbers. The uncentred kernel matrix
    of the stored points is cached for this (``O(m^2)`` memory besides the basis; not with
    ``max_components``).

    **Centred points in one solve.** Without ``max_components`` the centred variant keeps
    the null vector :math:`\pm 1/\sqrt{m}` as an exact basis column (eigenvalue exactly 0;
    a batch decomposition finds it by a Householder reflection). The new centred matrix is
    :math:`H_{m+1} B H_{m+1}` with ``B`` the old centred matrix bordered by the column centred
    with the old statistics, and in the basis of the old eigenvectors, the unit vector
    :math:`h \propto [1_m; -m]` and the new null vector it is the old eigenvalues bordered by
    :math:`\sqrt{m/(m+1)}\, U^\top a_0` and :math:`m k_0/(m+1)`: one Givens rotation of the
    basis and one arrowhead solve, instead of the four updates above.

    **Dispatch.** :meth:`update` of ``n`` points compares the incremental path (Python and host
    work of the secular iterations, 1-3 ms per solve below ``m ~ 400``, one per point, plus
    :math:`O(m^2)`) with one batch ``eigh`` of the grown matrix after storing the points, by a
    cost model calibrated on measured single-thread timings (see ``_secular.py``; the
    crossover for one point is at about ``m = 160``, and many points at once go to ``eigh``),
    and takes the cheaper; ``method="rank_one"`` or ``"eigh"`` forces one. The batch path
    stores all ``n`` points with one kernel call and makes the degenerate-point checks below
    for all of them at once. Measured (``benchmarks/inkpca.py``, one thread, RBF kernel):
    adding one point costs 0.18x an ``eigh`` of the same matrix at ``m = 500`` (0.16x
    centred), 0.07x at ``m = 1000`` and 0.03x at ``m = 2000``; 0.62x recomputing at
    ``m = 250`` (0.52x centred). Below the crossover it is the batch ``eigh`` plus a fixed cost
    (input and kernel checks, the kernel row, the checks for degenerate points, and for the
    centred variant the exact null vector): 1.2x recomputing with plain GPyTorch and torch
    (``kernel(X)`` and ``eigh``) at ``m = 50`` and 1.4x at ``m = 100`` (centred 2.0x and
    1.6x). With the basis read after every point, its product (one ``m x m`` GEMM) or an
    ``eigh`` comes on top.

    Eigenpairs used by :meth:`transform`, :meth:`nystrom` and :meth:`expansion_coefficients`
    follow one documented rule: an eigenpair is kept only if
    :math:`\lambda > \text{eigenvalue\_rtol} \cdot \lambda_{\max}`; tiny and negative eigenvalues
    (rounding, or a kernel that is not positive semi-definite) are dropped, never inverted.

    The decomposition belongs to the kernel's hyperparameters at the time it was computed: their
    values (every parameter and buffer of ``kernel``) are recorded then, and :meth:`update`,
    :meth:`transform` and :meth:`nystrom` raise :class:`~gpext.errors.NotFittedError` if they
    changed since (bordering a matrix of the old kernel with a column of the new one gives a
    matrix of neither; a new lengthscale then shows up as wrong and even negative eigenvalues).
    :meth:`kernel_changed` tells whether that is the case and :meth:`refit` decomposes the stored
    points again with the current kernel.

    Rounding errors of the updates accumulate: after 1000 points of an RBF kernel (5 dimensions,
    lengthscale 2; 20 points decomposed first, then one at a time with ``method="rank_one"``)
    the eigenvalues are off by 4e-6 of :math:`\lambda_{\max}` in float32, 14 times the error
    of one batch float32 ``eigh`` (3e-7), and by 6e-16 in float64 (Eq. 7's two rank-one
    updates per point, on the same points: 1.3e-5 and 3.5e-15).
    ``refresh_every = k`` recomputes the decomposition of the stored points with a batch
    ``eigh`` (the kernel matrix is formed once more, :math:`O(m^2 D + m^3)`) after every ``k``
    points added by :meth:`update`, so the error right after a refresh is that of ``eigh`` and
    no drift builds up over more than ``k`` updates. It does not make the updates in between
    more accurate (in float32 the error grows back within a few dozen updates after a
    refresh); use float64 where the eigenvalues matter. The default ``"auto"`` refreshes every 100 points in float32
    without ``max_components`` (whose ``O(m r)`` memory a refresh would not keep), and never
    in float64.

    Args:
        kernel: Any GPyTorch kernel evaluating to an ``(N, M)`` matrix. Cast it to ``dtype``
            (e.g. ``kernel.double()``) for full float64 accuracy.
        centered: Decompose the centred kernel matrix (kernel PCA with mean adjustment).
        max_components: Keep only the top ``r`` eigenpairs after every point (memory ``O(m r)``
            instead of ``O(m^2)``; an approximation, as in incremental SVD). ``None`` keeps all.
        eigenvalue_rtol: Relative floor of the eigenpair rule above; default ``sqrt(eps)`` of
            ``dtype`` (1.5e-8 in float64, 3.5e-4 in float32).
        degenerate_rtol: Relative threshold for degenerate points; default ``1000 * eps``.
        on_degenerate: ``"warn"`` (record and warn with :class:`~gpext.errors.DataWarning`),
            ``"record"`` (record only) or ``"raise"`` (raise :class:`~gpext.errors.InputDataError`
            before changing the state).
        dtype: ``torch.float64`` (recommended) or ``torch.float32``. ``module.to(dtype)`` later
            converts the state and makes that the working dtype (defaulted tolerances follow).
        device: Device of the state; defaults to the CPU.
        refresh_every: Recompute the decomposition by a batch ``eigh`` after every this many
            points added by :meth:`update` (see above); ``None`` or 0: never; ``"auto"``
            (default): every 100 points in float32 without ``max_components``, else never
            (follows the working dtype after ``module.to(dtype)``).
        method: How :meth:`update` adds points: ``"auto"`` (default; rank-one updates or one
            batch ``eigh``, whichever the cost model says is cheaper), ``"rank_one"`` (always
            Algorithm 3's updates) or ``"eigh"`` (store the points, then one batch ``eigh``).
            ``max_components`` always uses the rank-one updates.

    Example:
        >>> import gpytorch, torch
        >>> from gpext.operators import IncrementalKPCA
        >>> kernel = gpytorch.kernels.RBFKernel().double()
        >>> kpca = IncrementalKPCA(kernel, centered=True)
        >>> kpca.update(torch.randn(50, 3, dtype=torch.float64))
        IncrementalKPCA(...)
        >>> scores = kpca.transform(torch.randn(4, 3, dtype=torch.float64), num_components=2)
    """

    def __init__(
        self,
        kernel: Kernel,
        centered: bool = False,
        max_components: int | None = None,
        eigenvalue_rtol: float | None = None,
        degenerate_rtol: float | None = None,
        on_degenerate: str = "warn",
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        refresh_every: int | str | None = "auto",
        method: str = "auto",
    ) -> None:
        super().__init__()
        if not isinstance(kernel, Kernel):
            raise InputTypeError(
                expected_got("IncrementalKPCA.kernel", "a gpytorch.kernels.Kernel", type(kernel))
            )
        if on_degenerate not in _ON_DEGENERATE:
            raise InputDataError(
                expected_got(
                    "IncrementalKPCA.on_degenerate", f"one of {_ON_DEGENERATE}", repr(on_degenerate)
                )
            )
        self.dtype = check_float_dtype(dtype, "IncrementalKPCA.dtype")
        eps = torch.finfo(dtype).eps
        self.kernel = kernel
        self.centered = bool(centered)
        self.max_components = (
            None
            if max_components is None
            else check_positive_int(max_components, "IncrementalKPCA.max_components")
        )
        self._default_rtols = (eigenvalue_rtol is None, degenerate_rtol is None)
        self.eigenvalue_rtol = math.sqrt(eps) if eigenvalue_rtol is None else float(eigenvalue_rtol)
        self.degenerate_rtol = 1e3 * eps if degenerate_rtol is None else float(degenerate_rtol)
        for name in ("eigenvalue_rtol", "degenerate_rtol"):
            if not getattr(self, name) >= 0:
                raise InputDataError(
                    expected_got(f"IncrementalKPCA.{name}", "a number >= 0", getattr(self, name))
                )
        self.on_degenerate = on_degenerate
        if not (
            refresh_every in (None, "auto")
            or (isinstance(refresh_every, int) and not isinstance(refresh_every, bool)
                and refresh_every >= 0)
        ):  # fmt: skip
            raise InputDataError(
                expected_got(
                    "IncrementalKPCA.refresh_every",
                    "'auto', None or an integer >= 0",
                    repr(refresh_every),
                )
            )
        self.refresh_every = refresh_every
        if method not in _METHODS:
            raise InputDataError(
                expected_got("IncrementalKPCA.method", f"one of {_METHODS}", repr(method))
            )
        self.method = method
        # Basis factors not yet multiplied into ``_evecs``: an int ``p`` borders the basis (new
        # column p = the new unit vector), a Factor rotates it (see _secular.Factor).
        self._pending: list[int | Factor] = []
        self._pending_numel = 0
        self._pending_spent = 0.0  # estimated seconds spent projecting through pending factors
        # Uncentred kernel matrix of the stored points (capacity x capacity block, first _m
        # rows valid) when max_components is None: a batch eigh then needs no kernel call.
        self._gram: torch.Tensor | None = None
        # Centred, no max_components: index of the basis column that is exactly the null
        # vector +-1/sqrt(m) (eigenvalue exactly 0), and its sign; None when unknown.
        self._null: int | None = None
        self._null_sign = 1.0
        self._since_refresh = 0  # points added by update() since the last batch decomposition
        self.degenerate_points: list[dict[str, Any]] = []
        dev = torch.device("cpu") if device is None else torch.device(device)
        kw = {"dtype": dtype, "device": dev}
        # Points live in a growable block (capacity doubles when full, so adding a point costs
        # O(D) amortised instead of a copy of every stored point); only the first ``_m`` rows
        # are data, and only those go into the state dict (as ``_points``).
        self.register_buffer("_store", torch.empty(0, 0, **kw), persistent=False)
        self._m = 0
        self.register_buffer("_evals", torch.empty(0, **kw))
        self.register_buffer("_evecs", torch.empty(0, 0, **kw))
        self.register_buffer("_diag", torch.empty(0, **kw))
        self.register_buffer("_row_sums", torch.empty(0, **kw))
        self.register_buffer("_total", torch.zeros((), **kw))
        # Values of the kernel's parameters and buffers when the decomposition was computed
        # (None: no points yet, or loaded from a state dict that predates the record).
        self._kernel_values: dict[str, torch.Tensor] | None = None

    def __setattr__(self, name: str, value: Any) -> None:
        # Fast path for the update's own state (plain attributes and already registered
        # buffers); everything else goes through nn.Module.
        if name in _PLAIN_STATE:
            object.__setattr__(self, name, value)
            return
        buffers = self.__dict__.get("_buffers")
        if (
            name in _STATE_BUFFERS
            and buffers is not None
            and name in buffers
            and isinstance(value, torch.Tensor)
            and not isinstance(value, torch.nn.Parameter)
        ):
            buffers[name] = value
            return
        super().__setattr__(name, value)

    # ------------------------------------------------------------------ properties
    @property
    def num_points(self) -> int:
        """Number of points ``m`` added so far."""
        return self._m

    @property
    def points(self) -> torch.Tensor:
        """The stored points in arrival order (a view of the internal storage). # shape: (m, D)"""
        return self._store[: self._m]

    @property
    def eigenvalues(self) -> torch.Tensor:
        """Eigenvalues of the (centred) kernel matrix, descending. # shape: (k,)"""
        self._check_fitted()
        return self._evals.flip(-1)

    @property
    def eigenvectors(self) -> torch.Tensor:
        """Orthonormal eigenvectors, column ``j`` for ``eigenvalues[j]``. # shape: (m, k)"""
        self._check_fitted()
        return self._basis().flip(-1)

    @property
    def refresh_period(self) -> int:
        """Points between two batch re-decompositions in :meth:`update` (0: never).

        ``refresh_every`` resolved: ``"auto"`` is 100 in float32 without ``max_components``,
        else 0.
        """
        if self.refresh_every == "auto":
            auto = self.dtype == torch.float32 and self.max_components is None
            return _AUTO_REFRESH if auto else 0
        return int(self.refresh_every or 0)

    # ------------------------------------------------------------------ public API
    def reset(self) -> IncrementalKPCA:
        """Forget every point (the kernel and the options are kept)."""
        kw = {"dtype": self.dtype, "device": self._evals.device}
        self._store = torch.empty(0, 0, **kw)
        self._m = 0
        self._evals = torch.empty(0, **kw)
        self._evecs = torch.empty(0, 0, **kw)
        self._diag = torch.empty(0, **kw)
        self._row_sums = torch.empty(0, **kw)
        self._total = torch.zeros((), **kw)
        self.degenerate_points = []
        self._kernel_values = None
        self._since_refresh = 0
        self._clear_pending()
        self._gram = None
        self._null = None
        return self

    def kernel_changed(self) -> bool:
        """Whether the kernel's parameters or buffers differ from when the state was computed.

        Returns:
            ``True`` if any value, shape or name differs from the record taken by :meth:`fit` /
            :meth:`update` (``False`` with no points, or with no record).
        """
        return bool(self._changed_kernel_values())

    def refit(self) -> IncrementalKPCA:
        """Decompose the stored points again with the current kernel (a batch ``eigh``).

        Use it after changing the kernel's hyperparameters; :meth:`update` then continues
        incrementally.

        Returns:
            ``self``.

        Raises:
            NotFittedError: If there are no points.
        """
        self._check_fitted()
        return self.fit(self.points.clone())

    def reserve(self, capacity: int, num_features: int) -> IncrementalKPCA:
        """Preallocate storage for ``capacity`` points of dimension ``num_features``.

        Optional: storage otherwise grows by doubling. With a known number of points (e.g. a
        fixed budget of collected weight deviations) this avoids the growth copies entirely.

        Args:
            capacity: Number of points to make room for (at least the current number).
            num_features: Dimension ``D`` of the points.

        Returns:
            ``self``.

        Raises:
            ShapeError: If ``num_features`` differs from the stored points.
        """
        capacity = check_positive_int(capacity, "IncrementalKPCA.reserve.capacity")
        num_features = check_positive_int(num_features, "IncrementalKPCA.reserve.num_features")
        if self._m and num_features != self._store.shape[-1]:
            raise ShapeError(
                expected_got(
                    "IncrementalKPCA.reserve.num_features",
                    f"{self._store.shape[-1]} like the stored points",
                    num_features,
                )
            )
        if capacity > self._store.shape[0] or self._store.shape[-1] != num_features:
            self._grow(max(capacity, self._m), num_features)
        return self

    def fit(self, x: torch.Tensor) -> IncrementalKPCA:
        """Start from scratch with a batch eigendecomposition (``torch.linalg.eigh``) of ``x``.

        Use it to initialise from a first block; :meth:`update` then continues incrementally.

        Args:
            x: Initial points. # shape: (n, D)

        Returns:
            ``self``.
        """
        x = self._check_x(x, "fit")
        self.reset()
        self._store, self._m = x.clone(), x.shape[0]
        self._decompose()
        self._kernel_values = self._current_kernel_values()
        return self

    def update(self, x: torch.Tensor, *, show_progress: bool | None = None) -> IncrementalKPCA:
        """Add points one at a time, in the given order (Algorithm 3), or by one batch ``eigh``
        where that is cheaper (``method``, see the class docstring).

        With a refresh period (``refresh_every``), every ``refresh_period``-th point added is
        followed by a batch ``eigh`` of the stored points.

        Args:
            x: One point or several, added first row first. # shape: (D,) or (n, D)
            show_progress: Progress bar over the points (``None``: only on a terminal).

        Returns:
            ``self``.

        Raises:
            ShapeError: If the feature dimension differs from the stored points.
            InputDataError: On non-finite input, or a degenerate point with
                ``on_degenerate="raise"``.
            NotFittedError: If the kernel's hyperparameters changed since the stored points were
                decomposed (call :meth:`refit` first); nothing is added.
        """
        x = self._check_x(x, "update")
        self._check_kernel_unchanged("update")
        n = x.shape[0]
        # One point: no bar (creating one costs more than a small update).
        rows = progress_bar(range(n), desc="IncrementalKPCA", show=show_progress) if n > 1 else (0,)
        with torch.no_grad():
            if self._prefer_eigh(n):
                m0 = self._m
                try:
                    self._store_points(x)  # all n points at once, then one batch eigh
                finally:
                    if self._m > m0:
                        self._decompose()
            else:
                period = self.refresh_period
                for i in rows:
                    self._add_point(x[i : i + 1])
                    self._since_refresh += 1
                    if period and self._since_refresh >= period:
                        self._decompose(fresh=True)  # bounds the float32 drift
                    elif self._pending:
                        self._maybe_flush()
        if self._kernel_values is None:
            self._kernel_values = self._current_kernel_values()
        return self

    def transform(self, x: torch.Tensor, num_components: int | None = None) -> torch.Tensor:
        r"""Kernel-PCA scores of new points, :math:`\tilde k(x, X) U_r \Lambda_r^{-1/2}`.

        Args:
            x: Points to project. # shape: (n, D)
            num_components: Number of leading components (after the eigenvalue rule).

        Returns:
            Scores. # shape: (n, r)
        """
        x = self._check_x(x, "transform")
        evals, evecs = self._kept(num_components)
        return self._cross_kernel(x, "transform") @ (evecs / evals.sqrt())

    def nystrom(
        self, x: torch.Tensor, num_components: int | None = None, method: str = "eq8"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Nyström eigenpairs of the kernel matrix of a larger set, Eq. 8 of the source.

        .. math::

            L_{\mathrm{nys}} = \frac{n}{m} L, \qquad
            U_{\mathrm{nys}} = \sqrt{\frac{m}{n}}\, K_{n,m} U L^{-1},

        over the eigenpairs kept by the eigenvalue rule (so ``L^{-1}`` never divides by a tiny or
        negative eigenvalue). With ``centered=True``, ``K_{n,m}`` is centred with the landmark
        statistics, :math:`\tilde k(x, y) = \langle \phi(x) - \bar\phi_m, \phi(y) - \bar\phi_m
        \rangle` (the kernel centred at the mean of the ``m`` stored points, as scikit-learn's
        ``KernelPCA.transform`` does), which is the consistent Nyström extension of the centred
        decomposition.

        ``method="orthogonalized"`` returns instead the exact eigenpairs of the Nyström
        approximation :math:`\tilde K = K_{n,m} K_{m,m}^{+} K_{m,n} = C C^\top` with
        :math:`C = K_{n,m} U L^{-1/2}`: with :math:`C^\top C = V S V^\top` (an ``r x r``
        eigenproblem, ``O(n r^2)``), the eigenvalues are ``S`` and the orthonormal eigenvectors
        :math:`C V S^{-1/2}`. Eq. 8 rescales the landmark eigenvalues by ``n / m`` and its vectors
        are not orthonormal; the re-orthogonalised pairs are usually much closer to the
        eigenvalues of the full kernel matrix (see ``benchmarks/inkpca.py``). Eq. 8 stays the
        default because the source specifies it.

        Args:
            x: The ``n`` points. # shape: (n, D)
            num_components: Number of leading eigenpairs (after the eigenvalue rule).
            method: ``"eq8"`` (default) or ``"orthogonalized"``.

        Returns:
            ``(L_nys, U_nys)``, eigenvalues descending. # shapes: (r,), (n, r)

        Raises:
            InputDataError: If ``method`` is unknown.
        """
        if method not in ("eq8", "orthogonalized"):
            raise InputDataError(
                expected_got(
                    "IncrementalKPCA.nystrom.method", "'eq8' or 'orthogonalized'", repr(method)
                )
            )
        x = self._check_x(x, "nystrom")
        evals, evecs = self._kept(None if method == "orthogonalized" else num_components)
        n, m = x.shape[0], self.num_points
        k_nm = self._cross_kernel(x, "nystrom")
        if method == "eq8":
            return evals * (n / m), math.sqrt(m / n) * (k_nm @ (evecs / evals))
        c = k_nm @ (evecs / evals.sqrt())  # shape: (n, r), C C^T = K_nm K_mm^+ K_mn
        s, v = torch.linalg.eigh(c.mT @ c)
        s, v = s.flip(-1), v.flip(-1)
        keep = int((s > self.eigenvalue_rtol * s[0].clamp(min=0)).sum())
        if num_components is not None:
            keep = min(keep, check_positive_int(num_components, "num_components"))
        s, v = s[:keep], v[:, :keep]
        return s, (c @ v) / s.sqrt()

    def nystrom_operator(
        self, x: torch.Tensor, num_components: int | None = None, method: str = "eq8"
    ) -> NystromKPCALinearOperator:
        """The Nyström approximation ``U_nys L_nys U_nys^T`` of the kernel matrix of ``x``.

        Args:
            x: The ``n`` points. # shape: (n, D)
            num_components: Number of leading eigenpairs (after the eigenvalue rule).
            method: ``"eq8"`` or ``"orthogonalized"`` (see :meth:`nystrom`).

        Returns:
            A :class:`NystromKPCALinearOperator` of shape ``(n, n)``.
        """
        evals, evecs = self.nystrom(x, num_components, method=method)
        return NystromKPCALinearOperator(evecs, evals)

    def expansion_coefficients(self, num_components: int | None = None) -> torch.Tensor:
        r"""Coefficients of the unit principal axes over the stored points.

        The principal axis ``j`` in feature space is
        :math:`v_j = \sum_i A_{ij} \phi(x_i)` with :math:`A = U_r \Lambda_r^{-1/2}` (centred:
        :math:`A = H U_r \Lambda_r^{-1/2}`, so that the axes live in the span of the centred
        features); :math:`\|v_j\| = 1`. With the linear kernel, :math:`X^\top A` are the (centred)
        PCA directions of the stored points.

        Args:
            num_components: Number of leading axes (after the eigenvalue rule).

        Returns:
            ``A``. # shape: (m, r)
        """
        evals, evecs = self._kept(num_components)
        coef = evecs / evals.sqrt()
        if self.centered:
            coef = coef - coef.mean(0, keepdim=True)
        return coef

    # ------------------------------------------------------------------ internals
    def _check_fitted(self) -> None:
        if self.num_points == 0:
            raise NotFittedError("IncrementalKPCA: no points yet. Call update(x) or fit(x) first.")

    def _check_x(self, x: torch.Tensor, method: str) -> torch.Tensor:
        if isinstance(x, torch.Tensor):  # float32 / float64 / integers go to the model's dtype
            check_not_low_precision(x, f"IncrementalKPCA.{method}.x")
        x = as_float_tensor(x, f"IncrementalKPCA.{method}.x", dtype=self.dtype)
        x = x.to(self._evals.device)
        if x.dim() == 1 and method == "update":
            x = x.unsqueeze(0)
        if x.dim() != 2 or x.shape[0] == 0:
            raise ShapeError(
                expected_got(f"IncrementalKPCA.{method}.x", "shape (n, D), n >= 1", tuple(x.shape))
            )
        if self.num_points and x.shape[-1] != self._store.shape[-1]:
            raise ShapeError(
                expected_got(
                    f"IncrementalKPCA.{method}.x",
                    f"{self._store.shape[-1]} features like the stored points",
                    x.shape[-1],
                )
            )
        if method in ("transform", "nystrom"):
            self._check_fitted()
        if not bool(torch.isfinite(x.sum())):  # one cheap pass; the entry-wise check if needed
            check_finite(x, f"IncrementalKPCA.{method}.x")
        return x

    def _kernel(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        kernel = self.kernel
        if type(kernel) is LinearKernel and kernel.active_dims is None and x1.dim() == 2:
            # k(x, y) = variance x^T y, without the scaled copies of both inputs that
            # gpytorch's LinearKernel makes (O(m D) per new point for the stored block).
            var = kernel.variance.reshape(()).to(self.dtype)
            return (x1 @ x2.mT).mul_(var).to(self.dtype)
        # Evaluated at once (the lazy kernel tensor's bookkeeping costs about as much as a
        # small kernel row; __call__ still applies active_dims and GPyTorch's checks).
        with gpytorch_settings.lazily_evaluate_kernels(False):
            out = kernel(x1, x2)
        out = out.to_dense() if hasattr(out, "to_dense") else out
        if out.shape != (x1.shape[0], x2.shape[0]):
            raise ShapeError(
                expected_got(
                    "IncrementalKPCA.kernel",
                    f"a kernel matrix of shape ({x1.shape[0]}, {x2.shape[0]}) (no batch kernels)",
                    tuple(out.shape),
                )
            )
        return out.to(self.dtype)

    def _current_kernel_values(self) -> dict[str, torch.Tensor]:
        named = [*self.kernel.named_parameters(), *self.kernel.named_buffers()]
        return {name: t.detach().clone() for name, t in named}

    def _changed_kernel_values(self) -> list[str]:
        """Names of the kernel's parameters / buffers that differ from the record."""
        record = self._kernel_values
        if record is None or self.num_points == 0:
            return []
        named = dict([*self.kernel.named_parameters(), *self.kernel.named_buffers()])
        changed = sorted(set(named) ^ set(record))
        for name, value in named.items():
            old = record.get(name)
            if old is not None and (
                old.shape != value.shape or not torch.equal(old.to(value), value.detach())
            ):
                changed.append(name)
        return changed

    def _check_kernel_unchanged(self, method: str) -> None:
        changed = self._changed_kernel_values()
        if changed:
            raise NotFittedError(
                f"IncrementalKPCA.{method}: the kernel's hyperparameters changed since the "
                f"{self.num_points} stored points were decomposed ({', '.join(changed)}); the "
                "decomposition belongs to the old values, and using it with the new kernel "
                "would mix two kernels. Call refit() to decompose the stored points with the "
                "current kernel, or restore the old values."
            )

    def _cross_kernel(self, x: torch.Tensor, method: str) -> torch.Tensor:
        self._check_kernel_unchanged(method)
        with torch.no_grad():
            k = self._kernel(x, self.points)  # shape: (n, m)
        if self.centered:
            m = self.num_points
            k = k - k.mean(-1, keepdim=True) - (self._row_sums / m) + self._total / m**2
        return k

    def _kept(self, num_components: int | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Eigenpairs passing the rule ``lam > eigenvalue_rtol * lam_max``, descending."""
        self._check_fitted()
        evals, evecs = self._evals.flip(-1), self._basis().flip(-1)
        lam_max = evals[0].clamp(min=0)
        floor = self.eigenvalue_rtol * lam_max
        if bool((evals < -floor).any()) and lam_max > 0:
            warnings.warn(
                f"IncrementalKPCA: eigenvalue {float(evals.min()):.3e} is negative beyond the "
                f"floor {float(floor):.3e}; the kernel matrix is not positive semi-definite. "
                "Such eigenpairs are dropped.",
                NumericalWarning,
                stacklevel=3,
            )
        keep = int((evals > floor).sum())
        if keep == 0:  # a kernel matrix that is numerically zero (or NaN): a numerical failure,
            # so that an optimiser's line search rejects such a trial point instead of stopping
            raise NumericalError(
                "IncrementalKPCA: no eigenvalue above the floor eigenvalue_rtol * lambda_max "
                f"(largest {float(evals.max()) if evals.numel() else float('nan'):.3e}); the "
                "kernel matrix of the stored points is numerically zero or not finite. Check the "
                "kernel's hyperparameters, or add more (non-degenerate) points."
            )
        if num_components is not None:
            keep = min(keep, check_positive_int(num_components, "num_components"))
        return evals[:keep], evecs[:, :keep]

    def _decompose(self, fresh: bool = False) -> None:
        """Batch ``eigh`` of the (centred) kernel matrix of the stored points; resets the
        running sums and the refresh count (the kernel record and degenerate points are kept).
        ``fresh``: evaluate the kernel matrix anew instead of using the cached one."""
        if fresh:
            self._gram = None
        with torch.no_grad():
            k = self._gram_matrix()
            diag = torch.diagonal(k).clone()
            row_sums = k.sum(-1)
            self._null = None
            if self.centered:
                k = k - k.mean(0, keepdim=True) - k.mean(1, keepdim=True) + k.mean()
                if self.max_components is None:
                    evals, evecs = self._centered_eigh(k)
                else:
                    evals, evecs = torch.linalg.eigh(k)
            else:
                evals, evecs = torch.linalg.eigh(k)  # reads the lower triangle only
        self._diag, self._row_sums, self._total = diag, row_sums, row_sums.sum()
        self._evals, self._evecs = evals, evecs
        self._clear_pending()
        self._truncate()
        self._since_refresh = 0

    def _centered_eigh(self, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``eigh`` of a centred kernel matrix with the null vector exact.

        ``K_c 1 = 0``: with the Householder reflector ``P`` that maps ``x = 1/sqrt(m)`` to
        ``-e_1``, ``P K_c P`` has a zero first row and column, so the eigenpairs are
        ``(0, -x)`` and ``(lam, P[:, 1:] V)`` from ``eigh`` of the trailing block
        (``O(m^2)`` besides that ``eigh``). Sets ``_null`` / ``_null_sign``.
        """
        m = k.shape[0]
        if m == 1:
            self._null, self._null_sign = 0, 1.0
            return k.new_zeros(1), k.new_ones(1, 1)
        x = k.new_full((m,), 1.0 / math.sqrt(m))
        w = x.clone()
        w[0] += 1.0
        ww = float(w @ w)
        kw = k @ w
        t = kw - (float(w @ kw) / ww) * w
        pkp = k - (2.0 / ww) * (torch.outer(w, t) + torch.outer(t, w))
        lam, v = torch.linalg.eigh(pkp[1:, 1:])
        u_perp = torch.cat([k.new_zeros(1, m - 1), v]) - (2.0 / ww) * torch.outer(w, w[1:] @ v)
        q = int(torch.searchsorted(lam, lam.new_zeros(1)))
        evals = torch.cat([lam[:q], lam.new_zeros(1), lam[q:]])
        evecs = torch.cat([u_perp[:, :q], -x[:, None], u_perp[:, q:]], dim=1)
        self._null, self._null_sign = q, -1.0
        return evals, evecs

    def _add_centered(self, a: torch.Tensor, k: torch.Tensor, a_sum: torch.Tensor) -> None:
        r"""Add a point to the centred decomposition with one arrowhead solve (not four
        rank-one updates).

        With :math:`c_i = \phi_i - \bar\phi` (old mean), the new centred features are
        :math:`H_{m+1} [C; c_{new}^\top]`, so :math:`K_c' = H B H` with ``B`` the old
        :math:`K_c` bordered by :math:`a_0 = C c_{new}` and :math:`k_0 = |c_{new}|^2`.
        :math:`1^\top a_0 = 0`, so in the orthonormal basis ``{[u_i; 0]}`` (old eigenvectors
        orthogonal to 1), :math:`h = [1_m; -m] / \sqrt{m(m+1)}` and the new null vector,
        :math:`K_c'` is the old eigenvalues bordered by :math:`\sqrt{m/(m+1)}\, U^\top a_0`
        and :math:`m k_0 / (m+1)`: Eq. 7 once, solved as one arrowhead (:meth:`_border`). The
        basis change is one Givens rotation of the old null column and the new unit vector.
        """
        m = self.num_points
        mean_a = a_sum / m
        s_old = self._total / m**2
        a0 = a - mean_a - self._row_sums / m + s_old  # centred with the old statistics
        kp = float(m / (m + 1) * (k - 2 * mean_a + s_old))
        c = self._project(a0)
        self._pending_spent += _PROJECT * self._pending_numel
        null, sign = self._null, self._null_sign
        c[null] = 0.0
        c = c * math.sqrt(m / (m + 1))  # coupling with the column -h
        # The new unit vector goes last (p = m): in the bordered basis the matrix is the
        # arrowhead of the old eigenvalues, c and kp (one secular solve, no division by kp).
        p = self._evals.shape[0]  # = m: the full decomposition
        self._pending.append(p)
        cs, sn = math.sqrt(m / (m + 1)), sign / math.sqrt(m + 1)
        # columns (p, null) <- (cs e - sn u_null, sn e + cs u_null) = (-h, sign 1/sqrt(m+1))
        n = m + 1
        self._push_factor(Factor(n, _arange(n), [(p, null, cs, sn)], _EMPTY, _arange(n),
                                 _arange(n), None))  # fmt: skip
        self._null = null
        self._border(c, kp)

    def _push_factor(self, factor: Factor) -> None:
        self._pending.append(factor)
        self._pending_numel += factor.numel
        if self._null is not None:  # the null column is deflated (z = 0): it moves only
            s = int(np.flatnonzero(factor.perm == self._null)[0])
            self._null = int(factor.rank[s])

    def _border(self, z: torch.Tensor, corner: float) -> None:
        """Eigenpairs of the arrowhead ``[[diag(lam), z], [z^T, corner]]`` in the bordered
        basis (its new unit vector last, already pushed); the factor is kept pending."""
        if self._null is not None:
            z[self._null] = 0.0
        self._evals, factor = arrowhead_eigvals_factor(self._evals, z, corner)
        self._push_factor(factor)

    # ------------------------------------------------------------------ deferred basis
    def _clear_pending(self) -> None:
        self._pending = []
        self._pending_numel = 0
        self._pending_spent = 0.0

    def _project(self, v: torch.Tensor) -> torch.Tensor:
        """``z = U^T v`` for the current basis ``U = blockdiag(U_0, I) F_1 F_2 ...`` without
        forming it: one product with the explicit ``U_0`` and the pending factors' transposes
        in order (a border inserts the next entry of ``v`` at its column). ``O(m^2)`` per
        factor."""
        u0 = self._evecs
        m0 = u0.shape[0]
        w = u0.mT @ v[:m0] if m0 else v.new_zeros(0)
        pos = m0
        for op in self._pending:
            if isinstance(op, int):
                w = torch.cat([w[:op], v[pos : pos + 1], w[op:]])
                pos += 1
            else:
                w = op.apply_transpose(w)
        return w

    def _flush_costs(self) -> tuple[float, float]:
        """Estimated seconds to apply the pending factors, and to re-decompose instead."""
        m = self._evals.shape[0]
        apply = sum(
            _GEMM * m * op.numel if isinstance(op, Factor) else _GEMM * m * m / 64
            for op in self._pending
        )
        eigh = _eigh_cost(m)
        if not self._gram_valid():
            eigh += _GEMM * m * m * 64  # kernel matrix from the stored points (a guess)
        return apply, eigh

    def _gram_valid(self) -> bool:
        return self._gram is not None and self._gram.shape[0] >= self._m

    def _flush(self, how: str = "auto") -> None:
        """Make the deferred basis explicit: apply the pending factors (``how="apply"``), or
        re-decompose by a batch eigh (``"eigh"``), or whichever the cost model says is cheaper
        (``"auto"``; eigh only when the kernel matrix is cached or the kernel is unchanged)."""
        if not self._pending:
            return
        if how == "auto":
            apply, eigh = self._flush_costs()
            can_eigh = self._evals.shape[0] == self._m and (
                self._gram_valid() or not self._changed_kernel_values()
            )
            how = "eigh" if can_eigh and eigh < apply else "apply"
        if how == "eigh":
            with torch.no_grad():
                self._decompose()
            return
        u = self._evecs
        for op in self._pending:
            if isinstance(op, int):
                n = u.shape[0]
                b = u.new_zeros(n + 1, n + 1)
                b[:n, :op] = u[:, :op]
                b[:n, op + 1 :] = u[:, op:]
                b[n, op] = 1.0
                u = b
            else:
                u = op.apply(u)
        self._evecs = u
        self._clear_pending()

    def _basis(self) -> torch.Tensor:
        """The explicit eigenvector basis (ascending eigenvalues), the pending factors applied."""
        if self._pending:
            self._flush()
        return self._evecs

    def _maybe_flush(self) -> None:
        """Ski-rental bound on the deferred basis: once projecting through the pending factors
        has cost as much as making the basis explicit would (or they hold more than
        ``_MAX_PENDING m^2`` numbers), make it explicit, so the deferral never costs more than
        twice the cheaper choice."""
        m = self._evals.shape[0]
        if self._pending_numel > _MAX_PENDING * m * m:
            self._flush()
            return
        apply, eigh = self._flush_costs()
        if self._pending_spent >= min(apply, eigh):
            self._flush()

    def _prefer_eigh(self, n: int) -> bool:
        """Whether adding ``n`` points costs less by one batch eigh at the end than by rank-one
        updates (the dispatch of :meth:`update`; ``method`` overrides it)."""
        if self.method != "auto":
            return self.method == "eigh" and self.max_components is None
        if self.max_components is not None:
            return False
        m = self.num_points
        # one arrowhead solve per point (about one rank-one update); three for the centred
        # variant without a known null column (two rank-one updates re-centre the old block)
        per_point = 3 if self.centered and self._null is None and m else 1
        c, b = _UPDATE
        inc = sum(per_point * (c + b * (m + i) ** 2) for i in range(n))
        eigh = _eigh_cost(m + n) + (0.0 if self._gram_valid() or m == 0 else _GEMM * m * m * 64)
        return eigh < inc

    def _gram_matrix(self) -> torch.Tensor:
        """Uncentred kernel matrix of the stored points (cached when max_components is None)."""
        m = self._m
        if self._gram_valid():
            return self._gram[:m, :m]
        x = self.points
        k = self._kernel(x, x)
        if self.max_components is None:
            cap = m + max(16, m // 8)
            self._gram = k.new_empty(cap, cap)
            self._gram[:m, :m] = k
        return k

    def _truncate(self) -> None:
        r = self.max_components
        if r is not None and self._evals.shape[0] > r:
            self._evals = self._evals[-r:].contiguous()
            self._evecs = self._evecs[:, -r:].contiguous()

    def _rank_one(self, v: torch.Tensor, sigma: float) -> None:
        """Update the state by ``sigma v v^T`` (v in the current ``m``-dim space)."""
        if self.max_components is None:
            # Eigenvalues now, O(m^2); the basis factor is kept pending (see _basis).
            z = self._project(v)
            self._pending_spent += _PROJECT * self._pending_numel
            self._evals, factor = rank_one_eigvals_factor(self._evals, z, float(sigma))
            self._push_factor(factor)
            return
        u, d = self._evecs, self._evals
        z = u.mT @ v
        if u.shape[1] < u.shape[0]:
            # Truncated basis: extend it by the normalised residual of v (twice is enough).
            w = v - u @ z
            w = w - u @ (u.mT @ w)
            rho = _norm(w)
            if rho > 64 * torch.finfo(self.dtype).eps * _norm(v):
                q = w / rho
                u = torch.cat([u, q[:, None]], -1)
                d = torch.cat([d, d.new_zeros(1)])
                z = torch.cat([z, (q @ v)[None]])
        self._evals, self._evecs = rank_one_basis_update(d, u, z, float(sigma))

    def _report(self, kind: str, value: float, index: int) -> None:
        msg = (
            f"IncrementalKPCA: point {index} is degenerate ({kind}, value {value:.3e}); it is "
            "added exactly, without dividing by its self-similarity."
            if kind != "duplicate"
            else f"IncrementalKPCA: point {index} duplicates stored point {int(value)} in "
            "feature space; the kernel matrix becomes singular (handled by deflation)."
        )
        if self.on_degenerate == "raise":
            raise InputDataError(msg + " Pass on_degenerate='warn' to accept such points.")
        self.degenerate_points.append({"index": index, "kind": kind, "value": value})
        if self.on_degenerate == "warn":
            warnings.warn(msg, DataWarning, stacklevel=4)

    def _append(self, a: torch.Tensor, k: torch.Tensor, degenerate: bool) -> None:
        """Border the decomposed matrix with column ``a`` and diagonal ``k`` (Eq. 7).

        With the deferred basis (no ``max_components``) the bordered matrix is one arrowhead
        in the bordered basis, ``[[diag(lam), U^T a], [a^T U, k]]``, whose eigenpairs one
        secular solve gives (:func:`~gpext.operators._arrowhead.arrowhead_eigvals_factor`):
        the same matrix as Eq. 7's two rank-one updates at half their cost, and no division
        by ``k`` (so degenerate points take the same path). A truncated basis keeps Eq. 7.
        """
        m = a.shape[0]
        r = self._evals.shape[0]
        kk = float(k)
        if m and self.max_components is None:
            z = self._project(a)  # U^T a, before the border is added
            self._pending_spent += _PROJECT * self._pending_numel
            self._pending.append(r)  # bordered basis, the new unit vector last
            self._border(z, kk)
            return
        beta = kk if (degenerate or m == 0) else kk / 4
        # The new eigenpair (beta, e_{m+1}) goes in at its sorted position, so the updates
        # below see ascending eigenvalues (no permutation of the basis is needed).
        p = int(torch.searchsorted(self._evals, k.new_tensor([beta]))) if r else 0
        if self.max_components is None:
            self._pending.append(p)  # bordered basis, deferred like the rank-one factors
        else:
            u = torch.empty(m + 1, r + 1, dtype=self.dtype, device=k.device)
            u[:m, :p] = self._evecs[:, :p]
            u[:m, p + 1 :] = self._evecs[:, p:]
            u[:m, p] = 0.0
            u[m] = 0.0
            u[m, p] = 1.0
            self._evecs = u
        beta_t = k.new_tensor([beta])
        self._evals = torch.cat([self._evals[:p], beta_t, self._evals[p:]])
        if m == 0:
            return
        if not degenerate:  # the truncated basis (max_components): Eq. 7's two updates
            sigma = 4.0 / kk
            self._rank_one(torch.cat([a, k.new_tensor([kk / 2])]), sigma)
            self._rank_one(torch.cat([a, k.new_tensor([kk / 4])]), -sigma)
            return
        norm = _norm(a)
        if float(norm) == 0.0:
            return
        s = norm.sqrt()
        e = torch.zeros(m + 1, dtype=self.dtype, device=k.device)
        e[m] = s
        ap = torch.cat([a / s, a.new_zeros(1)])
        self._rank_one(e + ap, 0.5)
        self._rank_one(e - ap, -0.5)

    def _store_points(self, x: torch.Tensor) -> None:
        """Store ``n`` points and border the cached kernel matrix (the dispatch's batch path:
        a batch ``eigh`` follows, which also recomputes the running statistics).

        One kernel call gives every new column; the degenerate-point checks of the rank-one
        path (zero self-similarity, duplicate, zero centred self-similarity) are made for all
        points at once, each against the points stored before it, and reported in order. With
        ``on_degenerate="raise"`` the points before the first degenerate one are stored, then
        the error is raised.
        """
        m, n = self._m, x.shape[0]
        end = m + n
        if end > self._store.shape[0] or self._store.shape[-1] != x.shape[-1]:
            self._grow(max(2 * m, end, 4), x.shape[-1])
        self._store[m:end] = x  # not counted until the checks have passed
        cols = self._kernel(self._store[:end], x)  # shape: (m + n, n), column i = k(X, x_i)
        if not bool(torch.isfinite(cols).all()):
            check_finite(cols, "IncrementalKPCA.kernel(X, x)")
        reports = self._degenerate_in_batch(cols, m)
        if reports and self.on_degenerate == "raise":
            first = reports[0][0]
            if first > m:
                self._store_points(x[: first - m])
            self._report(*reports[0][1:], first)
        for index, kind, value in reports:
            self._report(kind, value, index)
        self._grow_gram(end)
        if self._gram is not None:
            self._gram[:end, m:end] = cols
            self._gram[m:end, :end] = cols.mT
        self._m = end

    def _degenerate_in_batch(self, cols: torch.Tensor, m: int) -> list[tuple[int, str, float]]:
        """The degenerate-point checks of both paths (one point in :meth:`_add_point`, a batch
        in :meth:`_store_points`): ``(index, kind, value)`` in order, point ``i`` of the
        ``(m + n, n)`` kernel columns checked against the ``m + i`` points stored before it.

        One host synchronisation when nothing is degenerate (the usual case); the reports
        are assembled only when some point is.
        """
        n = cols.shape[1]
        kd = cols[m:].diagonal()  # k(x_i, x_i)
        diag = torch.cat([self._diag, kd])  # every stored point's k(x, x), then the new ones
        tol = self.degenerate_rtol * torch.cummax(diag.abs(), 0).values[m:]
        zero = kd <= tol
        # Duplicate: cosine similarity >= 1 - rtol with an earlier point, i.e.
        # k(x_j, x_i) >= 0 and k(x_j, x_i)^2 >= (1 - rtol)^2 k(x_j, x_j) k(x_i, x_i); later
        # points (rows m + i onwards of column i) are excluded.
        cos2 = cols * cols.abs() / (diag[:, None] * kd).clamp(min=torch.finfo(self.dtype).tiny)
        later = torch.ones(n, n, dtype=torch.bool, device=cols.device).tril_()
        cos2[m:].masked_fill_(later, -math.inf)
        best, arg = cos2.max(0)  # -inf for the very first point
        dup = ~zero & (best >= (1 - self.degenerate_rtol) ** 2)
        flags = zero | dup
        k_c = kd
        if self.centered:
            # running sums before each point: a_sum_i = sum_{j < m+i} k(x_j, x_i), and the
            # total of the kernel matrix of the first m + i points
            a_sum = cols[:m].sum(0) + cols[m:].triu(1).sum(0)
            add = 2 * a_sum + kd
            totals = (self._total if m else 0.0) + (add.cumsum(0) - add)
            mp1 = torch.arange(m + 1, m + n + 1, device=cols.device, dtype=self.dtype)
            k_c = kd - 2 * (a_sum + kd) / mp1 + (totals + add) / mp1**2
            cen = ~zero & (mp1 > 1) & (k_c <= tol)
            flags = flags | cen
        if not bool(flags.any()):
            return []
        out = []
        for i in torch.nonzero(flags).flatten().tolist():
            if bool(zero[i]):
                out.append((m + i, "zero_self_similarity", float(kd[i])))
                continue
            if bool(dup[i]):
                out.append((m + i, "duplicate", float(arg[i])))
            if self.centered and bool(cen[i]):
                out.append((m + i, "centered_self_similarity_zero", float(k_c[i])))
        return out

    def _add_point(self, x: torch.Tensor) -> None:
        """Add one point by Algorithm 3's rank-one updates (the degenerate-point checks are
        :meth:`_degenerate_in_batch`'s, shared with the batch path)."""
        m = self.num_points
        # The point goes into the storage row after the data first (not yet counted: the
        # state is unchanged until the end), so one kernel call gives k(X, x) and k(x, x).
        if m == self._store.shape[0] or self._store.shape[-1] != x.shape[-1]:
            self._grow(max(2 * m, 4), x.shape[-1])
        self._store[m] = x[0]
        col = self._kernel(self._store[: m + 1], x)  # shape: (m + 1, 1)
        if not bool(torch.isfinite(col).all()):
            check_finite(col, "IncrementalKPCA.kernel(X, x)")
        reports = self._degenerate_in_batch(col, m)
        for index, kind, value in reports:  # raises before any change with "raise"
            self._report(kind, value, index)
        # zero (centred) self-similarity: appended without dividing by it
        degenerate = any(kind != "duplicate" for _, kind, _ in reports)
        col = col.reshape(m + 1)
        a, k = col[:m], col[m]
        a_sum = a.sum()
        if self.centered and m and self._null is not None:
            self._add_centered(a, k, a_sum)  # no division by k: degenerate points alike
        elif self.centered:
            # A single centred point is the zero vector: append (0, e_1) as is.
            a_c, k_c = self._recenter(a, k, a_sum) if m else (a, k.new_zeros(()))
            self._append(a_c, k_c, degenerate)
            if m == 0 and self.max_components is None:
                self._null, self._null_sign = 0, 1.0  # the basis is [1]
        else:
            self._append(a, k, degenerate)
        self._grow_gram(m + 1)
        if self._gram is not None:
            self._gram[m, :m] = a
            self._gram[:m, m] = a
            self._gram[m, m] = k
        self._m = m + 1
        self._diag = torch.cat([self._diag, k[None]])
        self._row_sums = torch.cat([self._row_sums + a, (a_sum + k)[None]])
        self._total = self._total + 2 * a_sum + k
        self._truncate()

    def _recenter(
        self, a: torch.Tensor, k: torch.Tensor, a_sum: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Re-centre the old block (two rank-one updates) and return the new centred column."""
        m = self.num_points
        r, total = self._row_sums, self._total
        new_total = total + 2 * a_sum + k
        mu_new = (r + a) / (m + 1)  # shape: (m,)
        mu_last = (a_sum + k) / (m + 1)
        s_new = new_total / (m + 1) ** 2
        # Entry (i, j) of the old centred block changes by u_i + u_j.
        u = (r / m - mu_new) + 0.5 * (s_new - total / m**2)
        unorm = _norm(u)
        if float(unorm) > 0.0:
            t = (unorm / math.sqrt(m)).sqrt()
            ones = torch.full_like(u, float(t))
            self._rank_one(ones + u / t, 0.5)
            self._rank_one(ones - u / t, -0.5)
        a_c = a - mu_new - mu_last + s_new
        k_c = k - 2 * mu_last + s_new
        return a_c, k_c

    def _grow(self, capacity: int, num_features: int) -> None:
        """Move the stored points into a block with room for ``capacity`` points."""
        store = torch.empty(capacity, num_features, dtype=self.dtype, device=self._evals.device)
        if self._m:
            store[: self._m] = self._store[: self._m]
        self._store = store

    def _grow_gram(self, size: int) -> None:
        """Room for ``size`` points in the cached kernel matrix (started with the first point,
        grown by an eighth so the block stays near ``m x m``; dropped with max_components)."""
        gram = self._gram
        if self.max_components is not None or (gram is None and self._m):
            return  # not cached (rebuilt from the points when a batch eigh needs it)
        if gram is not None and gram.shape[0] >= size:
            return
        new = self._store.new_empty(size + max(16, size // 8), size + max(16, size // 8))
        if gram is not None and self._m:
            new[: self._m, : self._m] = gram[: self._m, : self._m]
        self._gram = new

    def _apply(self, fn, *args, **kwargs):
        # ``module.to(dtype)`` converts the buffers; the working dtype (and defaulted
        # tolerances) follow, so later points are not cast back to the old dtype. The pending
        # basis factors are applied first (they hold tensors of the old dtype), and the cached
        # kernel matrix is converted with the points.
        self._flush("apply")
        super()._apply(fn, *args, **kwargs)
        if self._gram is not None:
            self._gram = fn(self._gram)
        if self._evals.dtype != self.dtype and self._evals.dtype in (torch.float32, torch.float64):
            self.dtype = self._evals.dtype
            eps = torch.finfo(self.dtype).eps
            if self._default_rtols[0]:
                self.eigenvalue_rtol = math.sqrt(eps)
            if self._default_rtols[1]:
                self.degenerate_rtol = 1e3 * eps
        return self

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        self._basis()  # the state dict holds the explicit basis
        super()._save_to_state_dict(destination, prefix, keep_vars)
        points = self.points
        destination[prefix + "_points"] = points if keep_vars else points.detach()
        if self._null is not None:
            destination[prefix + "_null"] = torch.tensor([float(self._null), self._null_sign])
        if self._gram_valid():  # the cached kernel matrix, so a loaded module continues alike
            destination[prefix + "_gram"] = self._gram[: self._m, : self._m].clone()
        for name, value in (self._kernel_values or {}).items():
            destination[prefix + _KERNEL_VALUES + name] = value

    def _load_from_state_dict(
        self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ):  # noqa: D401
        # The buffers change shape as points arrive: resize them before the copy.
        self._clear_pending()
        self._gram = None  # rebuilt from the loaded points when a batch eigh needs it
        for name in ("_evals", "_evecs", "_diag", "_row_sums", "_total"):
            key = prefix + name
            if key in state_dict:
                setattr(self, name, torch.empty_like(state_dict[key], dtype=self.dtype))
        key = prefix + "_points"
        if key in state_dict:
            points = state_dict[key]
            m = int(points.shape[0])
            # with room for the next points, as the kernel matrix below (a loaded module is
            # usually continued: no copy of every stored point at the first update)
            self._store = points.new_empty(
                (m + max(16, m // 8), *points.shape[1:]), dtype=self.dtype,
                device=self._evals.device,
            )  # fmt: skip
            self._store[:m] = points.detach()
            self._m = m
        elif strict:
            missing_keys.append(key)
        null = state_dict.get(prefix + "_null")
        self._null = None
        if null is not None and self.centered and self.max_components is None:
            self._null, self._null_sign = int(null[0]), float(null[1])
        gram = state_dict.get(prefix + "_gram")
        if gram is not None and gram.shape == (self._m, self._m) and self.max_components is None:
            m = self._m
            self._gram = self._store.new_empty(m + max(16, m // 8), m + max(16, m // 8))
            self._gram[:m, :m] = gram.detach()  # with room for the next points
        record = {
            k[len(prefix + _KERNEL_VALUES) :]: v.detach().clone()
            for k, v in state_dict.items()
            if k.startswith(prefix + _KERNEL_VALUES)
        }
        # No record (a state dict from before it was kept): the check starts at the next fit.
        self._kernel_values = record or None
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
        for k in [
            key,
            prefix + "_gram",
            prefix + "_null",
            *(prefix + _KERNEL_VALUES + name for name in record),
        ]:
            if k in unexpected_keys:  # handled above (not registered buffers)
                unexpected_keys.remove(k)

"""Private core of the rank-one eigen-update: deflation, secular solve, stable eigenvectors.

:func:`rank_one_basis_update` takes a basis ``U`` (``m x n``, orthonormal columns), eigenvalues
``d`` and the projected update ``z = U^T v`` and returns the eigenpairs of
``U (diag(d) + sigma z z^T) U^T``: the eigenvalues (ascending) and the new basis.

The algorithm follows the classical divide-and-conquer merge step (Bunch, Nielsen & Sorensen
1978; Li 1993; Gu & Eisenstat 1994; the structure of LAPACK ``dlaed2``/``dlaed4``), rebuilt from
the formulas:

1. ``sigma < 0`` is mapped to ``sigma > 0`` by negating ``d``; ``sqrt(|sigma|)`` is absorbed into
   ``z`` so that the secular equation reads ``f(lam) = 1 + sum_i z_i^2 / (d_i - lam) = 0``.
   ``d`` and ``z`` are then scaled by powers of two (``2^(-2e)`` and ``2^(-e)``, exact) so that
   ``max(|d|, max_i z_i^2)`` lies in ``[1/4, 1)``; the roots are scaled back by ``2^(2e)``. The
   solver's squares and products then stay in range whatever the magnitude of the input.
2. Deflation: entries with ``|z_i| ||z|| <= tol`` are dropped (their eigenpair is ``(d_i, u_i)``);
   pairs of (nearly) equal poles are merged by a Givens rotation that zeroes one ``z`` entry
   (applied to the two basis columns). Only the rotations themselves run in a Python loop, over
   the detected pairs, on ``O(1)`` numbers each.
3. All ``k`` remaining roots are solved at once. Every root is an offset ``tau`` from the pole
   it is nearer to (``lam = d_o + tau``) and every difference is formed as
   ``d_i - lam = (d_i - d_o) - tau``, so small offsets keep full relative accuracy. One
   evaluation at the middle of each interval picks that pole and gives the initial guess (the
   two neighbouring poles exact, the rest of the sum frozen at the midpoint). The iteration is
   the fixed-weight rational step (a two-pole model that keeps the weight of the origin pole and
   matches ``f`` and ``f'``; it switches to the other pole's weight when ``|f|`` stalls, and
   bisects after three stalls in a row), safeguarded by a bracket that every evaluation shrinks.
   A root stops on its own rounding-error bound, or without a further evaluation once its steps
   contract quadratically (``|eta_n| <= 1e-3 |eta_{n-1}|``) and the predicted remaining error
   ``|eta_n|^3 / |eta_{n-1}|^2`` is below ``0.1 eps |tau|``. Only the ``O(k^2)`` sums run in torch (on the device of
   the data, a few passes over a ``(roots still iterating) x k`` buffer per evaluation); the
   ``O(k)`` per-root logic runs on the host in float64, and converged roots leave the set.
4. ``z`` is recomputed from the roots (Gu & Eisenstat): ``zhat_i^2 = prod_j (lam_j - d_i) /
   prod_{j != i} (d_j - d_i)``, as a product over the ratios ``(lam_j - d_i) / (d_j - d_i)``
   whose runs telescope, in blocks of ``_BLOCK`` consecutive factors whose logarithms are then
   summed, so no product over ``k`` factors can overflow. The eigenvectors
   ``zhat_i / (d_i - lam_j)`` are then orthogonal to working precision, and the basis is updated
   with one GEMM over the ``k`` non-deflated columns (a permutation of the input order is applied
   to the small ``k x k`` factor, not to the basis).
"""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import torch

from gpext.errors import NumericalError, NumericalWarning

__all__: list[str] = []

_MAX_ITER = 64
_CONTRACT = 1e-3  # step ratio that marks the quadratic regime
_BLOCK = 32  # factors per partial product in the Gu-Eisenstat formula
_WORKSPACE = threading.local()

# Cost model of the dispatch between the rank-one path and a batch ``torch.linalg.eigh``
# (rank_one_eigh_update, IncrementalKPCA.update) and of making a deferred basis explicit:
# seconds of one CPU thread, fitted to single-thread medians of benchmarks/inkpca.py on the
# development machine (float64, torch 2.x, one thread, shared 2-core VM). Measured there:
# eigh 0.30 ms at m = 50, 0.85 ms at 100, 5.5 ms at 250, 30 ms at 500, 0.19 s at 1000, 1.5 s at
# 2000; one m x m GEMM 0.19-0.23 of eigh; one rank-one update without the basis product
# (deflation, secular solve, Gu-Eisenstat factor) 2 ms at m = 50, 3 ms at 250, 5 ms at 500,
# 11 ms at 1000 (a fixed ~1.8 ms of Python and host work per update, then O(m^2)). Crossover of
# one update against eigh: m ~ 150; of adding a point (2 updates, 4 centred) against eigh:
# m ~ 250 (uncentred), ~ 350 (centred). Only ratios matter for the decisions; on other
# machines the crossover moves but both choices stay correct. Remeasured after the overhead
# cuts of Nov 26: an update on RBF kernel rows costs 1.2-3 ms below m ~ 400 (it varies with
# the number of secular iterations the spectrum needs), 3.7 ms at 500, 11 ms at 1000; adding a
# point by rank-one updates and by the batch eigh path still cross near m = 250 (6.1 against
# 6.7 ms there, 4.5 against 3.8 ms at 200), so the constants were kept. Since Nov 26
# IncrementalKPCA adds a point by one arrowhead solve (gpext.operators._arrowhead, 10-35% more
# secular evaluations than one rank-one update, measured 1.1-1.3x its time), costed as one
# update: the crossover against eigh moved to m ~ 160.
_EIGH = (1.8e-10, 5e-8, 2e-4)  # eigh of m x m: a m^3 + b m^2 + c
_GEMM = 4.2e-11  # basis product m x k x k: per m k^2
_UPDATE = (1.8e-3, 1.3e-8)  # one rank-one update without the basis product: c + b m^2
_PROJECT = 1.5e-9  # z through a pending basis factor: per entry of its k x k matrix


def _eigh_cost(m: int) -> float:
    a, b, c = _EIGH
    return a * m**3 + b * m**2 + c


def prefer_eigh(n: int, num: int = 1) -> bool:
    """Whether ``num`` rank-one updates of size ``n`` (basis included) cost more than forming
    the ``num`` updated matrices and one batched ``eigh``."""
    c, b = _UPDATE
    secular = num * (c + b * n * n + _GEMM * n**3)
    dense = num * (_eigh_cost(n) - _EIGH[2] + 2 * _GEMM * n**3) + _EIGH[2]
    return dense < secular


def _workspace(slot: int, shape: tuple[int, ...], dtype: torch.dtype, device) -> torch.Tensor:
    """A reusable per-thread scratch tensor (never returned to callers).

    Fresh ``k x k`` allocations cost page faults comparable to a full pass over the data, so
    the work buffers of the update are kept between calls (one per slot, dtype and device,
    grown to the largest size seen).
    """
    cache = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    key = (slot, dtype, str(device))
    numel = math.prod(shape)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=dtype, device=device)
        cache[key] = buf
    return buf[:numel].view(shape)


def _deflate_pairs(
    d: np.ndarray, z: np.ndarray, active: np.ndarray, tol: float
) -> list[tuple[int, int, float, float]]:
    """Merge (nearly) equal consecutive active poles with Givens rotations, in place.

    A pair ``(p, j)`` of consecutive active poles is deflated when the off-diagonal entry that
    the rotation creates, ``|d_j - d_p| c s``, is at most ``tol`` (or the gap itself is below
    ``2 tol``); ``z_p`` becomes 0 and ``z_j`` becomes ``hypot(z_p, z_j)``. Detection is
    vectorised; the loop runs over candidate pairs only.

    Returns:
        The rotations ``(p, j, c, s)`` in the order they were applied (sorted coordinates).
    """
    idx = np.flatnonzero(active)
    if idx.size < 2:
        return []
    prev, cur = idx[:-1], idx[1:]
    gap = d[cur] - d[prev]
    r2 = z[cur] ** 2 + z[prev] ** 2
    cs = np.abs(z[cur] * z[prev]) / np.where(r2 > 0, r2, 1.0)
    cand = (gap * cs <= tol) | (gap <= 2 * tol)
    if not cand.any():
        return []
    rotations = []
    for p, j in zip(prev[cand].tolist(), cur[cand].tolist(), strict=True):
        # ``p`` may have been deflated as the first of an earlier pair; walk back to the
        # currently active predecessor.
        while p >= 0 and not active[p]:
            p -= 1
        if p < 0:
            continue
        zp, zj = float(z[p]), float(z[j])
        r = math.hypot(zp, zj)
        if r == 0.0:
            continue
        c, s = zj / r, zp / r
        dp, dj = float(d[p]), float(d[j])
        if abs((dj - dp) * c * s) > tol:
            continue
        d[p] = c * c * dp + s * s * dj
        d[j] = s * s * dp + c * c * dj
        z[p] = 0.0
        z[j] = r
        active[p] = False
        rotations.append((p, j, c, s))
    return rotations


def _model_root(
    a: np.ndarray, b: np.ndarray, c: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> np.ndarray:
    """Root of ``c x^2 - a x + b = 0`` strictly inside ``(lo, hi)`` (NaN where there is none).

    The quadratic comes from a two-pole rational model of the secular function; between its
    poles (or above both, for the last root) it has exactly one root, and the bracket selects it.
    Both roots are formed without cancellation (``q / c`` and ``b / q``). Call it under
    ``np.errstate(all="ignore")``.
    """
    q = 0.5 * (a + np.copysign(np.sqrt(np.maximum(a * a - 4.0 * b * c, 0.0)), a))
    r1, r2 = q / c, b / q
    return np.where((r2 > lo) & (r2 < hi), r2, np.where((r1 > lo) & (r1 < hi), r1, np.nan))


def _bisect(lo: np.ndarray, hi: np.ndarray, eps: float) -> np.ndarray:
    """Safeguard point inside ``(lo, hi)``: the geometric mean when the bracket spans orders of
    magnitude on one side of the pole (roots next to a pole with a tiny weight), else the middle.
    """
    alo, ahi = np.abs(lo), np.abs(hi)
    large = np.maximum(alo, ahi)
    small = np.maximum(np.minimum(alo, ahi), eps * large)
    same_side = (lo >= 0) | (hi <= 0)
    geo = np.where(hi > 0, 1.0, -1.0) * np.sqrt(small * large)
    return np.where(same_side & (large > 64.0 * small), geo, 0.5 * (lo + hi))


class _Sums:
    """The ``O(k^2)`` part of one evaluation of the secular function, in torch.

    For rows ``r`` (roots) at ``lam_r = d_{o(r)} + tau_r``, :meth:`__call__` returns, per row,
    ``s1 = sum_i z_i^2 / (d_i - lam_r)`` and ``s2 = sum_i z_i^2 / (d_i - lam_r)^2`` (four passes
    over a ``rows x k`` buffer: difference, quotient, matrix-vector product, norm), and
    :meth:`abs_sum` then ``sum_i |z_i^2 / (d_i - lam_r)|`` (``z >= 0``; two more passes over
    the rows that may pass the stopping test, the only ones that need it). ``d0`` holds ``d_i - d_{o(r)}`` for all rows; only the rows
    still iterating are gathered.
    """

    def __init__(self, d0: torch.Tensor, z: torch.Tensor, buf: torch.Tensor, res: torch.Tensor):
        self.d0, self.z, self.buf, self.res = d0, z, buf, res
        self.rows = 0

    def __call__(self, rows: np.ndarray | None, tau: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        d0, z = self.d0, self.z
        r = self.rows = d0.shape[0] if rows is None else rows.size
        buf, res = self.buf[:r], self.res[:, :r]
        t = torch.from_numpy(tau).to(dtype=d0.dtype, device=d0.device)[:, None]
        if rows is None:
            torch.sub(d0, t, out=buf)
        else:
            torch.index_select(d0, 0, torch.from_numpy(rows).to(d0.device), out=buf)
            buf.sub_(t)  # d_i - lam_r = (d_i - d_o) - tau, without cancellation
        torch.div(z, buf, out=buf)  # z_i / (d_i - lam_r)
        torch.mv(buf, z, out=res[0])
        torch.linalg.vector_norm(buf, dim=-1, out=res[1])
        host = res[:2].cpu().double().numpy()
        return host[0].copy(), host[1] ** 2

    def abs_sum(self, cand: np.ndarray) -> np.ndarray:
        """``sum_i |z_i^2 / (d_i - lam_r)|`` for the rows where ``cand`` is True (others 0)."""
        buf = self.buf[: self.rows]
        idx = np.flatnonzero(cand)
        out = np.zeros(self.rows)
        if 2 * idx.size >= self.rows:  # most rows: one pass over all of them
            out[:] = (
                torch.mv(buf.abs_(), self.z, out=self.res[2, : self.rows]).cpu().double().numpy()
            )
            return out
        rows = buf.index_select(0, torch.from_numpy(idx).to(buf.device)).abs_()
        out[idx] = torch.mv(rows, self.z).cpu().double().numpy()
        return out


def _initial_guess(d, z, d_h, z2, buf, res):
    """Origins, offsets and brackets from one evaluation at the middle of every interval.

    The sign of ``f`` at the midpoint tells which half holds the root (whose pole becomes the
    origin); the guess solves the model with both neighbouring poles exact and the rest of the
    sum frozen at its midpoint value. The midpoint needs no extra accuracy, so its differences
    are formed directly.
    """
    k = d_h.size
    j = np.arange(k)
    last = j == k - 1
    gap = np.empty(k)
    gap[:-1] = d_h[1:] - d_h[:-1]
    gap[-1] = z2.sum()  # the last root lies in (d_k, d_k + ||z||^2]
    half = 0.5 * gap
    mid = torch.from_numpy(d_h + half).to(dtype=d.dtype, device=d.device)
    a = torch.sub(d[None, :], mid[:, None], out=buf)
    torch.div(z, a, out=a)
    f_mid = 1.0 + torch.mv(a, z, out=res[0]).cpu().double().numpy()
    lower = last | (f_mid >= 0)  # root in the lower half: measure it from d_j
    origin = np.where(lower, j, j + 1)
    other = np.where(last, j - 1, np.where(lower, j + 1, j))  # the second pole of the model
    p2 = d_h[other] - d_h[origin]  # its offset from the origin
    w_o, w_2 = z2[origin], z2[other]
    zero = np.zeros(k)
    lo = np.where(last, np.where(f_mid > 0, zero, half), np.where(lower, zero, -half))
    hi = np.where(last, np.where(f_mid > 0, half, gap), np.where(lower, half, zero))
    t_mid = np.where(lower, half, -half)  # the midpoint in coordinates of the origin
    with np.errstate(all="ignore"):
        c = f_mid + w_o / t_mid - w_2 / (p2 - t_mid)
        tau = _model_root(c * p2 + w_o + w_2, w_o * p2, c, lo, hi)
    tau = np.where(np.isfinite(tau), tau, 0.5 * (lo + hi))
    return origin, p2, w_o, w_2, lo, hi, tau


def _solve_secular(
    d: torch.Tensor, z: torch.Tensor, d_h: np.ndarray, z_h: np.ndarray
) -> tuple[np.ndarray, np.ndarray, torch.Tensor, int]:
    """Solve ``1 + sum_i z_i^2 / (d_i - lam) = 0`` for all ``k`` roots at once.

    Args:
        d: Poles, strictly ascending (device, dtype of the data). # shape: (k,)
        z: Weights' square roots, ``z > 0``. # shape: (k,)
        d_h: ``d`` on the host in float64. # shape: (k,)
        z_h: ``z`` on the host in float64. # shape: (k,)

    Returns:
        ``origin`` (index of the pole each root is measured from), ``tau`` (offset,
        ``lam = d[origin] + tau``; host float64), ``d0`` (``d0[r, i] = d_i - d[origin[r]]``, a
        workspace) and the number of roots that did not converge.
        # shapes: (k,), (k,), (k, k), ()
    """
    k = d_h.size
    dtype, device = d.dtype, d.device
    eps = float(torch.finfo(dtype).eps)
    npdt = np.float64 if dtype == torch.float64 else np.float32
    z2 = z_h * z_h
    buf = _workspace(1, (k, k), dtype, device)
    d0 = _workspace(2, (k, k), dtype, device)
    res = _workspace(3, (3, k), dtype, device)
    if k == 1:
        d0.zero_()
        return np.zeros(1, np.int64), z2.copy(), d0, 0
    origin, p2, w_o, w_2, lo, hi, tau = _initial_guess(d, z, d_h, z2, buf, res)
    tau = tau.astype(npdt).astype(np.float64)
    torch.sub(d[None, :], d[torch.from_numpy(origin).to(device)][:, None], out=d0)
    sums = _Sums(d0, z, buf, res)
    znorm = math.sqrt(float(z2.sum()))

    def evaluate(todo, t, s1, s2):
        f = 1.0 + s1
        # |f| <= eps (8 sum_i |z_i^2 / (d_i - lam)| + 2 + 3 |f| + |tau| f'), f' = s2
        return f, s2, 2.0 + 3.0 * np.abs(f) + np.abs(t) * s2

    converged = _iterate(sums, tau, lo, hi, p2, w_o, w_2, eps, npdt, znorm, evaluate)
    return origin, tau, d0, int((~converged).sum())


def _iterate(sums, tau, lo, hi, p2, w_o, w_2, eps, npdt, znorm, evaluate) -> np.ndarray:
    """The safeguarded fixed-weight rational iteration of all roots at once (in place on
    ``tau``, ``lo`` and ``hi``), shared by the rank-one and the arrowhead secular functions.

    ``evaluate(todo, t, s1, s2)`` turns the sums of :class:`_Sums` at the offsets ``t`` of the
    roots ``todo`` into the function value, its derivative and the rounding-error bound of
    the evaluation without its ``8 sum_i |z_i^2 / (d_i - lam)|`` term. A root stops on that
    bound (the absolute sum, at most ``||z|| sqrt(s2)`` by Cauchy-Schwarz, is computed only
    when the test can pass), on a bracket at rounding level, or without a further evaluation
    once its steps contract quadratically. The model is ``c + w_o / (d_o - lam) + s / (d_2 -
    lam)`` fitted to the value and the derivative (``w_o`` exact; the other pole's weight
    exact after a stall), Newton where it has no root in the bracket, and bisection after
    three stalls in a row.

    Returns:
        Which roots converged. # shape: (n,)
    """
    n = tau.size
    converged = np.zeros(n, dtype=bool)
    swap = np.zeros(n, dtype=bool)  # use the other pole's weight in the model
    slow = np.zeros(n, dtype=np.int64)  # consecutive evaluations without a tenfold |f| decrease
    f_prev = np.full(n, np.inf)
    step_prev = np.full(n, np.inf)  # size of the previous model step (inf after a bisection)
    todo = np.arange(n)
    err_state = np.seterr(all="ignore")
    try:
        for _ in range(_MAX_ITER):
            t = tau[todo]
            s1, s2 = sums(None if todo.size == n else todo, t)
            f, fp, base = evaluate(todo, t, s1, s2)
            af = np.abs(f)
            lo_t = np.where(f < 0, t, lo[todo])
            hi_t = np.where(f > 0, t, hi[todo])
            done = (hi_t - lo_t) <= 2.0 * eps * np.maximum(np.abs(lo_t), np.abs(hi_t))
            cand = af <= eps * (8.0 * znorm * np.sqrt(s2) + base)
            if cand.any():
                done |= cand & (af <= eps * (8.0 * sums.abs_sum(cand) + base))
            if done.any():
                converged[todo[done]] = True
                keep = ~done
                if not keep.any():
                    break
                todo, t, f, af, fp = todo[keep], t[keep], f[keep], af[keep], fp[keep]
                lo_t, hi_t = lo_t[keep], hi_t[keep]
            lo[todo], hi[todo] = lo_t, hi_t
            do_, d2 = -t, p2[todo] - t  # d_o - lam, d_2 - lam
            sw = swap[todo]
            c = np.where(
                sw,
                f - do_ * fp - (w_2[todo] / (d2 * d2)) * (d2 - do_),
                f - d2 * fp - (w_o[todo] / (do_ * do_)) * (do_ - d2),
            )
            a = (do_ + d2) * f - do_ * d2 * fp
            eta = _model_root(a, do_ * d2 * f, c, lo_t - t, hi_t - t)
            eta = np.where(eta == eta, eta, -f / fp)  # no model root: Newton
            t_new = t + eta
            ok = (t_new > lo_t) & (t_new < hi_t)  # False for NaN
            sl = np.where(af > 0.1 * f_prev[todo], slow[todo] + 1, 0)
            swap[todo] = sw ^ (sl > 0)  # stalled: try the other pole's weight
            ok &= sl < 3  # stalled three times in a row: bisect, then start afresh
            slow[todo] = np.where(ok, sl, 0)
            f_prev[todo] = np.where(ok, af, np.inf)
            if not ok.all():
                t_new = np.where(ok, t_new, _bisect(lo_t, hi_t, eps))
            t_new = t_new.astype(npdt)
            tau[todo] = t_new
            # Quadratic convergence: the error left after this step is about
            # |eta|^3 / |eta_prev|^2; accept the root without another evaluation when that is
            # below the rounding level and the steps clearly contract.
            step = np.where(ok, np.abs(eta), np.inf)
            sp = step_prev[todo]
            step_prev[todo] = step
            settled = (sp < np.inf) & (step <= _CONTRACT * sp)
            settled &= step**3 <= 0.1 * eps * sp * sp * np.abs(t_new)
            if settled.any():
                converged[todo[settled]] = True
                todo = todo[~settled]
                if not todo.size:
                    break
    finally:
        np.seterr(**err_state)
    return converged


def _log_abs_column_products(ratio: torch.Tensor) -> torch.Tensor:
    """``log |prod_r ratio[r, i]|`` per column, in float64: products over blocks of
    ``_BLOCK`` consecutive rows (telescoping runs stay far inside the range), their logarithms
    summed. # shape: (k,)"""
    ratio = ratio.double()
    rows, k = ratio.shape
    full = (rows // _BLOCK) * _BLOCK
    out = torch.zeros(k, dtype=torch.float64, device=ratio.device)
    if full:
        out += ratio[:full].view(-1, _BLOCK, k).prod(1).abs_().log_().sum(0)
    if full < rows:
        out += ratio[full:].prod(0).abs_().log_()
    return out


def _eigenvectors(
    d: torch.Tensor,
    z_sign: torch.Tensor,
    tau: np.ndarray,
    d0: torch.Tensor,
    scale: float,
    fresh: bool = False,
) -> torch.Tensor:
    """Gu-Eisenstat eigenvectors of ``diag(d) + z z^T``; row ``r`` is the eigenvector of root r.

    ``zhat_i^2 = (lam_i - d_i) prod_{j != i} (lam_j - d_i) / (d_j - d_i)``. Interlacing makes
    every run of consecutive ratios telescope, so a product over a block of ``_BLOCK``
    consecutive ``j`` stays far inside the floating-point range (the diagonal factor is taken
    relative to the problem's scale); the block products are then summed in log space, so no
    product over ``k`` factors can overflow or underflow. Returns the unit eigenvectors (a
    view of a workspace, or with ``fresh`` a new tensor).
    """
    k = d0.shape[0]
    dtype, device = d0.dtype, d0.device
    t = torch.from_numpy(tau).to(dtype=dtype, device=device)[:, None]
    diff = torch.sub(d0, t, out=_workspace(1, (k, k), dtype, device))  # d_i - lam_r
    dd = torch.sub(d[None, :], d[:, None], out=_workspace(0, (k, k), dtype, device))
    dd.diagonal().fill_(-scale)
    ratio = torch.div(diff, dd, out=dd)  # (lam_j - d_i) / (d_j - d_i), row j
    log_z2 = _log_abs_column_products(ratio) + math.log(scale)
    zhat = torch.exp(0.5 * log_z2).to(dtype).mul_(z_sign)
    # q[r, i] = zhat_i / (d_i - lam_r), in the workspace or (``fresh``) in a tensor of its own
    q = torch.div(zhat, diff) if fresh else torch.div(zhat, diff, out=diff)
    q.mul_(torch.linalg.vector_norm(q, dim=-1, keepdim=True).reciprocal_())
    return q


def _rotate(
    u: torch.Tensor, perm_h: np.ndarray, rotations: list[tuple[int, int, float, float]]
) -> torch.Tensor:
    """The basis in sorted order with the deflating Givens rotations applied (a new tensor)."""
    u = u.index_select(1, torch.from_numpy(perm_h).to(u.device))
    touched = sorted({p for p, _, _, _ in rotations} | {j for _, j, _, _ in rotations})
    pos = {col: i for i, col in enumerate(touched)}
    idx = torch.tensor(touched, device=u.device)
    cols = u.index_select(1, idx).mT.cpu().double().numpy().copy()  # rows = columns of U
    for p, j, c, s in rotations:
        a, b = pos[p], pos[j]
        col_p = cols[a].copy()
        cols[a] = c * col_p - s * cols[b]
        cols[b] = s * col_p + c * cols[b]
    u[:, idx] = torch.from_numpy(cols).to(dtype=u.dtype, device=u.device).mT
    return u


def _scale_exponent(d_h: np.ndarray, z_h: np.ndarray) -> int:
    r"""The exponent ``e`` with ``max(|d|, ||z||_inf^2) / 2^(2e)`` in ``[1/4, 1)`` (0 for zeros).

    Scaling ``d`` by :math:`2^{-2e}` and ``z`` by :math:`2^{-e}` scales
    :math:`\operatorname{diag}(d) + z z^\top` by :math:`2^{-2e}` exactly (barring subnormals);
    the eigenvalues are scaled back at the end and the eigenvectors do not change.

    Raises:
        NumericalError: If ``sqrt(|sigma|) z`` overflowed float64.
    """
    zmax = float(np.abs(z_h).max())
    if not math.isfinite(zmax):
        raise NumericalError(
            "rank_one_eigh_update: sqrt(|sigma|) * U^T v overflows float64 (largest entry of "
            "U^T v times sqrt(|sigma|) is not finite). Rescale sigma or v before updating."
        )
    dmax = float(np.abs(d_h).max())
    exponents = []
    if dmax > 0:
        exponents.append((math.frexp(dmax)[1] + 1) // 2)
    if zmax > 0:
        exponents.append(math.frexp(zmax)[1])
    return max(exponents) if exponents else 0


class Factor:
    """The orthogonal factor ``F`` of one rank-one update, ``U' = U F`` (kept for later use).

    ``F`` permutes the columns of ``U`` into sorted order (``perm``), applies the deflating
    Givens rotations (``rotations``, in sorted coordinates), keeps the deflated columns
    (``inact``) and mixes the active ones (``act``) with the ``k x k`` Gu-Eisenstat factor ``q``
    (``U'_a = U_a q^T``); sorted column ``s`` goes to output column ``rank[s]``. Storing it costs
    ``O(k^2)`` memory and applying ``F^T`` to a vector ``O(n + k^2)``, so the basis product
    (``O(m n k)``) can be deferred and the next update's ``z = U'^T v = F^T (U^T v)`` formed
    without it.
    """

    __slots__ = ("n", "perm", "rotations", "act", "inact", "rank", "q", "_idx")

    def __init__(self, n, perm, rotations, act, inact, rank, q):
        self.n, self.perm, self.rotations = n, perm, rotations
        self.act, self.inact, self.rank, self.q = act, inact, rank, q
        self._idx = None

    @property
    def numel(self) -> int:
        """Entries held by ``q`` (the memory the factor costs)."""
        return 0 if self.q is None else self.q.numel()

    def _indices(self, device):
        if self._idx is None:
            t = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(device)  # noqa: E731
            self._idx = (t(self.perm), t(self.act), t(self.inact), t(self.rank[self.act]),
                         t(self.rank[self.inact]))  # fmt: skip
        return self._idx

    def apply_transpose(self, y: torch.Tensor) -> torch.Tensor:
        """``F^T y`` for a vector in the coordinates of the old basis. # shape: (n,)"""
        perm, act, inact, r_act, r_inact = self._indices(y.device)
        ys = y.index_select(0, perm)
        if self.rotations:
            h = ys.cpu().double().numpy().copy()
            for p, j, c, s in self.rotations:
                hp = h[p]
                h[p] = c * hp - s * h[j]
                h[j] = s * hp + c * h[j]
            ys = torch.from_numpy(h).to(dtype=y.dtype, device=y.device)
        out = torch.empty_like(ys)
        if inact.numel():
            out.index_copy_(0, r_inact, ys.index_select(0, inact))
        if act.numel():
            out.index_copy_(0, r_act, self.q @ ys.index_select(0, act))
        return out

    def apply(self, u: torch.Tensor) -> torch.Tensor:
        """``U F`` (a new tensor). # shape: (m, n)"""
        perm, act, inact, r_act, r_inact = self._indices(u.device)
        if self.rotations:
            u = _rotate(u, self.perm, self.rotations)
        else:
            u = u.index_select(1, perm)
        if not inact.numel():
            return torch.empty_like(u).index_copy_(1, r_act, u @ self.q.mT)
        out = torch.empty_like(u)
        out.index_copy_(1, r_inact, u.index_select(1, inact))
        if act.numel():
            out.index_copy_(1, r_act, u.index_select(1, act) @ self.q.mT)
        return out


def rank_one_eigvals_factor(
    d: torch.Tensor,  # shape: (n,)
    z: torch.Tensor,  # shape: (n,)
    sigma: float,
) -> tuple[torch.Tensor, Factor]:
    """Eigenvalues of ``diag(d) + sigma z z^T`` (ascending) and its eigenvector factor.

    The eigenvectors of ``diag(d) + sigma z z^T`` are the columns of the returned
    :class:`Factor` ``F`` (so the new basis is ``U F``); nothing of size ``m x n`` is touched:
    ``O(n^2)`` work.
    """
    lam, plan = _plan(d, z, sigma, fresh=True)
    perm_h, rotations, act_idx, order, q = plan
    n = d.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    active = np.zeros(n, dtype=bool)
    active[act_idx] = True
    factor = Factor(n, perm_h, rotations, act_idx, np.flatnonzero(~active), rank, q)
    return lam, factor


def _plan(d, z, sigma, fresh=False):
    """Deflation, secular solve and eigenvector factor (shared by both entry points).

    Returns ``lam`` (ascending) and ``(perm_h, rotations, act_idx, order, q)``: the sorted
    order of the input columns, the deflating rotations (sorted coordinates), the active sorted
    indices, the output order of the sorted indices and the ``k x k`` factor (a workspace view,
    a tensor of its own with ``fresh``, or None).
    """
    dtype, device = d.dtype, d.device
    eps = float(torch.finfo(dtype).eps)
    sgn = -1.0 if sigma < 0 else 1.0
    # Deflation on the host: O(n) numbers, rotations in a short loop.
    d_h = d.detach().cpu().double().numpy() * sgn
    z_h = z.detach().cpu().double().numpy() * math.sqrt(abs(sigma))
    perm_h = np.argsort(d_h, kind="stable")
    d_h, z_h = d_h[perm_h], z_h[perm_h]  # copies
    # Scale by a power of two (exact) so that max(|d|, ||z||^2) is about 1: the solver's
    # squares and products stay in range for inputs of any magnitude (1e160 or 1e-160).
    e2 = _scale_exponent(d_h, z_h)
    d_h, z_h = np.ldexp(d_h, -2 * e2), np.ldexp(z_h, -e2)
    znorm2 = float(np.dot(z_h, z_h))
    tol = 8.0 * eps * max(float(np.abs(d_h).max()), znorm2)
    active = np.abs(z_h) * math.sqrt(znorm2) > tol
    z_h[~active] = 0.0
    rotations = _deflate_pairs(d_h, z_h, active, tol)
    act_idx = np.flatnonzero(active)
    k = act_idx.size
    lam_s = d_h.copy()  # deflated values stay
    q = None
    if k:
        da_h, za_h = d_h[act_idx], np.abs(z_h[act_idx])
        d_a = torch.from_numpy(da_h).to(dtype=dtype, device=device)
        z_a = torch.from_numpy(za_h).to(dtype=dtype, device=device)
        origin, tau, d0, failed = _solve_secular(d_a, z_a, da_h, za_h)
        if failed:
            warnings.warn(
                f"rank_one_eigh_update: {failed} secular roots did not reach the stopping test "
                f"in {_MAX_ITER} safeguarded iterations; results may be inaccurate.",
                NumericalWarning,
                stacklevel=4,
            )
        lam_s[act_idx] = da_h[origin] + tau
        z_sign = torch.from_numpy(np.where(z_h[act_idx] < 0, -1.0, 1.0)).to(dtype=dtype)
        scale = max(float(np.abs(da_h).max()), float(np.abs(tau).max()))
        # Row r of q: the eigenvector of root r (the r-th active sorted index).
        q = _eigenvectors(d_a, z_sign.to(device), tau, d0, scale, fresh)
    with np.errstate(over="ignore"):
        lam_h = np.ldexp(lam_s, 2 * e2) * sgn
    if not (np.isfinite(lam_h).all() and np.abs(lam_h).max() <= torch.finfo(dtype).max):
        raise NumericalError(
            "rank_one_eigh_update: the updated eigenvalues (up to "
            f"{float(np.abs(lam_s).max()):.3g} * 2^{2 * e2}) overflow {dtype}. Rescale the "
            "matrix and the update vector before updating."
        )
    order = np.argsort(lam_h, kind="stable")
    lam = torch.from_numpy(lam_h[order]).to(dtype=dtype, device=device)
    return lam, (perm_h, rotations, act_idx, order, q)


def rank_one_basis_update(
    d: torch.Tensor,  # shape: (n,)
    u: torch.Tensor,  # shape: (m, n)
    z: torch.Tensor,  # shape: (n,)
    sigma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of ``U (diag(d) + sigma z z^T) U^T`` for a basis ``U`` of orthonormal columns.

    Args:
        d: Eigenvalues, any order (ascending is fastest). # shape: (n,)
        u: Basis, column ``i`` for ``d_i``. # shape: (m, n)
        z: ``U^T v``. # shape: (n,)
        sigma: Update weight of either sign.

    Returns:
        ``(lam, U')``, ``lam`` ascending. # shapes: (n,), (m, n)
    """
    n = d.shape[0]
    dtype, device = d.dtype, d.device
    if sigma == 0.0 or n == 0:
        order = torch.argsort(d, stable=True)
        return d[order], u[:, order]
    lam, (perm_h, rotations, act_idx, order, q) = _plan(d, z, sigma)
    if rotations:
        u = _rotate(u, perm_h, rotations)
        perm_h = np.arange(n)
    k = act_idx.size
    m = u.shape[0]
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)  # output position of sorted index s
    cols_a = perm_h[act_idx]  # basis column of each active (sorted) index
    out_a = rank[act_idx]
    if k == n:
        # No deflation: permute the k x k factor instead of the basis, U' = U Q^T with the
        # rows of Q in output order and its columns in basis order.
        if not bool((out_a[1:] > out_a[:-1]).all()):
            q = q.index_select(0, torch.from_numpy(np.argsort(out_a)).to(device))
        if bool((cols_a[1:] > cols_a[:-1]).all()):
            pass
        elif bool((cols_a[1:] < cols_a[:-1]).all()):
            q = q.flip(1)
        else:
            q = q.index_select(1, torch.from_numpy(np.argsort(cols_a)).to(device))
        return lam, u @ q.mT  # the one GEMM
    # Interleave the deflated columns (unchanged) with the updated ones, in ascending order.
    out = torch.empty(m, n, dtype=dtype, device=device)
    inact_idx = np.setdiff1d(np.arange(n), act_idx, assume_unique=True)
    out.index_copy_(
        1,
        torch.from_numpy(rank[inact_idx]).to(device),
        u.index_select(1, torch.from_numpy(perm_h[inact_idx]).to(device)),
    )
    if k:
        u_a = torch.index_select(
            u, 1, torch.from_numpy(cols_a).to(device), out=_workspace(4, (m, k), dtype, device)
        )
        # The one GEMM, over the non-deflated columns only.
        new_a = torch.matmul(u_a, q.mT, out=_workspace(5, (m, k), dtype, device))
        out.index_copy_(1, torch.from_numpy(out_a).to(device), new_a)
    return lam, out

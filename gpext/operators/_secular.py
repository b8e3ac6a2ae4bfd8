"""Private core of the rank-one eigen-update: deflation, secular solve, stable eigenvectors.

:func:`rank_one_basis_update` takes a basis ``U`` (``m x n``, orthonormal columns), eigenvalues
``d`` and the projected update ``z = U^T v`` and returns the eigenpairs of
``U (diag(d) + sigma z z^T) U^T``: the eigenvalues (ascending) and the new basis.

The algorithm follows the classical divide-and-conquer merge step (Bunch, Nielsen & Sorensen
1978; Gu & Eisenstat 1994; LAPACK ``dlaed2``/``dlaed4``), rebuilt from the formulas:

1. ``sigma < 0`` is mapped to ``sigma > 0`` by negating ``d``; ``sqrt(|sigma|)`` is absorbed into
   ``z`` so that the secular equation reads ``f(lam) = 1 + sum_i z_i^2 / (d_i - lam) = 0``.
2. Deflation: entries with ``|z_i| ||z|| <= tol`` are dropped (their eigenpair is ``(d_i, u_i)``);
   pairs of (nearly) equal poles are merged by a Givens rotation that zeroes one ``z`` entry
   (applied to the two basis columns). Only the rotations themselves run in a Python loop, over
   the detected pairs, on ``O(1)`` numbers each.
3. All ``k`` remaining roots are solved at once: each root is written as an offset ``tau`` from
   its nearer pole, ``lam = d_o + tau``, and all differences as ``d_i - lam = (d_i - d_o) - tau``
   (no cancellation). One evaluation at the middle of each interval picks the nearer pole and
   starts the iteration; the iteration is the fixed-weight / "middle way" rational step, safeguarded by
   bisection inside a bracket that every evaluation shrinks, and stops on the root's own
   rounding-error bound. Converged roots leave the working set; one evaluation costs a few
   vectorised passes over a ``(roots still iterating) x k`` buffer, reused in place.
4. ``z`` is recomputed from the roots (Gu & Eisenstat): ``zhat_i^2 = prod_j (lam_j - d_i) /
   prod_{j != i} (d_j - d_i)``, summed in log space over the ratios ``(lam_j - d_i) / (d_j -
   d_i)`` so the products over ``k`` factors cannot overflow; the eigenvectors
   ``zhat_i / (d_i - lam_j)`` are then orthogonal to working precision. The basis is updated with
   one GEMM restricted to the ``k`` non-deflated columns.
"""

from __future__ import annotations

import math
import threading
import warnings

import numpy as np
import torch

from gpext.errors import NumericalWarning

__all__: list[str] = []

_MAX_ITER = 64
_BLOCK = 32  # rows per partial product in the Gu-Eisenstat formula
_WORKSPACE = threading.local()


def _workspace(slot: int, shape: tuple[int, int], dtype: torch.dtype, device) -> torch.Tensor:
    """A reusable per-thread scratch matrix (never returned to callers).

    Fresh ``n x n`` allocations cost page faults comparable to a full pass over the data, so
    the work buffers of the update are kept between calls (three per dtype and device, grown to
    the largest size seen).
    """
    cache = getattr(_WORKSPACE, "buffers", None)
    if cache is None:
        cache = _WORKSPACE.buffers = {}
    key = (slot, dtype, str(device))
    numel = shape[0] * shape[1]
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


def _evaluate(
    d: torch.Tensor,
    z: torch.Tensor,
    d_o: torch.Tensor,
    tau: torch.Tensor,
    buf: torch.Tensor,
    buf2: torch.Tensor,
) -> tuple[torch.Tensor, ...]:
    """Secular function of the rows ``lam_r = d_o[r] + tau[r]``.

    ``psi`` sums the poles below the root (negative terms), ``phi`` those above.
    ``buf``/``buf2`` are ``(R, k)`` work buffers, overwritten.

    Returns:
        ``f, psi, phi, dpsi, dphi``. # shapes: (R,) each
    """
    a = torch.sub(d, d_o[:, None], out=buf)
    a.sub_(tau[:, None])  # d_i - lam_r, without cancellation
    torch.div(z, a, out=a)  # a_ri = z_i / (d_i - lam_r); z_i >= 0
    s1 = a @ z  # sum_i z_i^2 / (d_i - lam)
    dtot = torch.linalg.vector_norm(a, dim=-1).square()
    an = torch.clamp(a, max=0.0, out=buf2)  # the poles below the root
    psi = an @ z
    dpsi = torch.linalg.vector_norm(an, dim=-1).square()
    return 1.0 + s1, psi, s1 - psi, dpsi, dtot - dpsi


def _quadratic_step(a, b, c, pole_lo, pole_hi, upward):
    """Root of ``c x^2 - a x + b = 0`` in ``(pole_lo, pole_hi)``, or the larger one (``upward``).

    The quadratic comes from a two-pole rational model with poles ``pole_lo < pole_hi``; an
    interior model has exactly one root between its poles, the model of the last root (both
    poles below it, ``c > 0``) exactly one above them. NaN where no root qualifies.
    """
    disc = (a * a - 4.0 * b * c).clamp(min=0).sqrt()
    q = 0.5 * (a + torch.where(a >= 0, disc, -disc))
    r1, r2 = q / c, b / q
    big = torch.maximum(r1, r2)
    in1 = (r1 > pole_lo) & (r1 < pole_hi)
    in2 = (r2 > pole_lo) & (r2 < pole_hi)
    inner = torch.where(in1, r1, torch.where(in2, r2, torch.nan))
    outer = torch.where(c > 0, big, torch.nan)
    return torch.where(upward, outer, inner)


def _bisect(lo: torch.Tensor, hi: torch.Tensor, eps: float) -> torch.Tensor:
    """Safeguard point inside ``(lo, hi)``: the geometric mean when the bracket spans orders of
    magnitude on one side of the pole (roots next to a pole with a tiny weight), else the middle.
    """
    small = torch.minimum(lo.abs(), hi.abs())
    large = torch.maximum(lo.abs(), hi.abs())
    small = torch.maximum(small, eps * large)
    same_side = (lo >= 0) | (hi <= 0)
    geo = torch.where(hi > 0, 1.0, -1.0).to(lo.dtype) * (small * large).sqrt()
    return torch.where(same_side & (large > 64.0 * small), geo, 0.5 * (lo + hi))


def _solve_secular(
    d: torch.Tensor, z2: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Solve ``1 + sum_i z2_i / (d_i - lam) = 0`` for all ``k`` roots at once.

    Args:
        d: Poles, strictly ascending. # shape: (k,)
        z2: Positive weights. # shape: (k,)

    Returns:
        ``origin`` (index of the pole each root is measured from), ``tau`` (offset,
        ``lam = d[origin] + tau``), the work buffer, and ``converged`` (bool per root).
        # shapes: (k,), (k,), (k, k), (k,)
    """
    k = d.shape[0]
    dtype, device = d.dtype, d.device
    eps = torch.finfo(dtype).eps
    z = z2.sqrt()
    rho = z2.sum()
    j = torch.arange(k, device=device)
    last = j == k - 1
    up = (j + 1).clamp(max=k - 1)
    dn = (j - 1).clamp(min=0)
    gap = torch.where(last, rho, d[up] - d)
    half = 0.5 * gap
    buf = _workspace(0, (k, k), dtype, device)
    buf2 = _workspace(1, (k, k), dtype, device)
    if k == 1:
        return j, rho.reshape(1), buf, torch.ones(1, dtype=torch.bool, device=device)

    # Evaluate at the middle of each interval: the sign picks the nearer pole as the origin.
    f, psi, phi, dpsi, dphi = _evaluate(d, z, d, half, buf, buf2)
    lower = last | (f >= 0)
    origin = torch.where(lower, j, up)
    zero = torch.zeros_like(half)
    lo = torch.where(last, torch.where(f > 0, zero, half), torch.where(lower, zero, -half))
    hi = torch.where(last, torch.where(f > 0, half, gap), torch.where(lower, half, zero))
    tau = torch.where(lower, half, -half)  # the midpoint in coordinates of the origin
    d_o = d[origin]
    # Offsets of the two model poles from the origin: p1 = j (below the root), p2 = j + 1
    # (interior) or j - 1 (last root, all poles below it).
    off1 = d - d_o
    off2 = torch.where(last, d[dn], d[up]) - d_o
    zo = z2[origin]
    use_fw = ~last
    f_prev = torch.full_like(half, torch.inf)
    converged = torch.zeros(k, dtype=torch.bool, device=device)
    todo = j
    t = tau
    for _ in range(_MAX_ITER):
        lo_t = torch.where(f < 0, t, lo[todo])
        hi_t = torch.where(f > 0, t, hi[todo])
        err = eps * (8.0 * (phi - psi) + 2.0 + 3.0 * f.abs() + t.abs() * (dpsi + dphi))
        done = (f.abs() <= err) | (hi_t - lo_t <= 2.0 * eps * torch.maximum(lo_t.abs(), hi_t.abs()))
        converged[todo[done]] = True
        keep = ~done
        if not bool(keep.any()):
            break
        todo, t, f, psi, dpsi, dphi = (
            todo[keep],
            t[keep],
            f[keep],
            psi[keep],
            dpsi[keep],
            dphi[keep],
        )
        lo_t, hi_t = lo_t[keep], hi_t[keep]
        lo[todo], hi[todo] = lo_t, hi_t
        is_last, fw, low_o, z2o = last[todo], use_fw[todo], lower[todo], zo[todo]
        d1 = off1[todo] - t  # d_j - lam (< 0)
        d2 = off2[todo] - t
        fp = dpsi + dphi
        # Fixed weight keeps the exact weight of the origin pole; the middle way fits each
        # side to its own derivative; the last root keeps its own pole exactly and lumps all
        # lower poles into the previous one.
        s_fw = torch.where(low_o, z2o, (d1 * d1 * (fp - z2o / (d2 * d2))).clamp(min=0))
        big_fw = torch.where(low_o, (d2 * d2 * (fp - z2o / (d1 * d1))).clamp(min=0), z2o)
        big_last = (d2 * d2 * (dpsi - z2o / (d1 * d1))).clamp(min=0)
        s = torch.where(is_last, z2o, torch.where(fw, s_fw, d1 * d1 * dpsi))
        big = torch.where(is_last, big_last, torch.where(fw, big_fw, d2 * d2 * dphi))
        c = f - s / d1 - big / d2
        a = c * (d1 + d2) + s + big
        b = d1 * d2 * f
        eta = _quadratic_step(a, b, c, d1, d2, is_last)
        eta = torch.where(f * eta > 0, -f / fp, eta)  # wrong direction: Newton
        slow = f.abs() > 0.1 * f_prev[todo].abs()
        use_fw[todo] = fw ^ (slow & ~is_last)
        f_prev[todo] = f
        t_new = t + eta
        ok = torch.isfinite(t_new) & (t_new > lo_t) & ((t_new < hi_t) | (is_last & (t_new <= hi_t)))
        # The last root's lumped model can crawl (e.g. next to a pole with a tiny weight):
        # bisect (geometrically) whenever it failed to reduce |f| tenfold.
        ok = ok & ~(slow & is_last)
        t = torch.where(ok, t_new, _bisect(lo_t, hi_t, eps))
        tau[todo] = t
        r = todo.numel()
        f, psi, phi, dpsi, dphi = _evaluate(d, z, d_o[todo], t, buf[:r], buf2[:r])
    return origin, tau, buf, converged


def _eigenvectors(
    d: torch.Tensor,
    z: torch.Tensor,
    origin: torch.Tensor,
    tau: torch.Tensor,
    buf: torch.Tensor,
    buf2: torch.Tensor,
    reverse: bool = False,
) -> torch.Tensor:
    """Gu-Eisenstat eigenvectors of ``diag(d) + z z^T``; row ``r`` is the eigenvector of root r
    (of root ``k - 1 - r`` with ``reverse``).

    ``zhat_i^2 = (lam_i - d_i) prod_{j != i} (lam_j - d_i) / (d_j - d_i)``. Interlacing makes
    every run of consecutive ratios telescope, so a product over a block of ``_BLOCK``
    consecutive ``j`` stays far inside the floating-point range (the diagonal factor is taken
    relative to the problem's scale); the block products are then summed in log space, so no
    product over ``k`` factors can overflow or underflow. Returns a view of ``buf``.
    """
    k = d.shape[0]
    d_o = d[origin]
    diff = torch.sub(d, d_o[:, None], out=buf)
    diff.sub_(tau[:, None])  # diff[r, i] = d_i - lam_r
    scale = torch.maximum(d.abs().max(), tau.abs().max())
    dd = torch.sub(d, d[:, None], out=buf2)  # d_i - d_j
    dd.diagonal().fill_(1.0)
    dd.diagonal().mul_(scale)
    ratio = torch.div(diff, dd, out=dd).abs_()  # (lam_j - d_i) / (d_j - d_i); rows j
    if ratio.dtype != torch.float64:
        ratio = ratio.double()
    full = (k // _BLOCK) * _BLOCK
    parts = [ratio[:full].view(-1, _BLOCK, k).prod(1)] if full else []
    if full < k:
        parts.append(ratio[full:].prod(0, keepdim=True))
    blocks = torch.cat(parts) if len(parts) > 1 else parts[0]  # shape: (ceil(k / B), k)
    log_z2 = blocks.log().sum(0) + torch.log(scale.double())
    zhat = torch.exp(0.5 * log_z2).to(d.dtype) * torch.where(z < 0, -1.0, 1.0).to(d.dtype)
    if reverse:
        diff = torch.sub(d, d_o.flip(0)[:, None], out=buf)
        diff.sub_(tau.flip(0)[:, None])
    q = torch.div(zhat, diff, out=diff)  # q[r, i] = zhat_i / (d_i - lam_r)
    q.div_(torch.linalg.vector_norm(q, dim=-1, keepdim=True))
    return q


def rank_one_basis_update(
    d: torch.Tensor,  # shape: (n,)
    u: torch.Tensor,  # shape: (m, n)
    z: torch.Tensor,  # shape: (n,)
    sigma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigenpairs of ``U (diag(d) + sigma z z^T) U^T`` for a basis ``U`` of orthonormal columns.

    Args:
        d: Eigenvalues, any order. # shape: (n,)
        u: Basis, column ``i`` for ``d_i``. # shape: (m, n)
        z: ``U^T v``. # shape: (n,)
        sigma: Update weight of either sign.

    Returns:
        ``(lam, U')``, ``lam`` ascending. # shapes: (n,), (m, n)
    """
    n = d.shape[0]
    dtype, device = d.dtype, d.device
    eps = torch.finfo(dtype).eps
    if sigma == 0.0 or n == 0:
        order = torch.argsort(d, stable=True)
        return d[order], u[:, order]
    sgn = -1.0 if sigma < 0 else 1.0
    ds = d * sgn
    perm = torch.argsort(ds, stable=True)
    ds = ds[perm]
    zs = z[perm] * math.sqrt(abs(sigma))
    # Deflation on the host: O(n) numbers, rotations in a short loop.
    d_h = ds.detach().cpu().double().numpy().copy()
    z_h = zs.detach().cpu().double().numpy().copy()
    znorm2 = float(np.dot(z_h, z_h))
    tol = 8.0 * eps * max(float(np.abs(d_h).max()), znorm2)
    active = np.abs(z_h) * math.sqrt(znorm2) > tol
    z_h[~active] = 0.0
    rotations = _deflate_pairs(d_h, z_h, active, tol)
    perm_h = perm.cpu().numpy()
    if rotations:
        # Apply the rotations to the touched columns of (a copy of) the basis.
        touched = sorted(
            {perm_h[p] for p, _, _, _ in rotations} | {perm_h[j] for _, j, _, _ in rotations}
        )
        pos = {col: i for i, col in enumerate(touched)}
        idx = torch.tensor(touched, device=device)
        cols = u.index_select(1, idx).mT.cpu().double().numpy().copy()  # rows = columns of U
        for p, j, c, s in rotations:
            a, b = pos[perm_h[p]], pos[perm_h[j]]
            col_p = cols[a].copy()
            cols[a] = c * col_p - s * cols[b]
            cols[b] = s * col_p + c * cols[b]
        u = u.clone()
        u[:, idx] = torch.from_numpy(cols).to(dtype=dtype, device=device).mT
    lam_s = torch.from_numpy(d_h).to(dtype=dtype, device=device)  # deflated values stay
    act_idx = np.flatnonzero(active)
    k = act_idx.size
    m = u.shape[0]
    if k:
        act = torch.from_numpy(act_idx).to(device)
        d_a = lam_s[act]
        z_a = torch.from_numpy(z_h[act_idx]).to(dtype=dtype, device=device)
        origin, tau, buf, converged = _solve_secular(d_a, z_a * z_a)
        if not bool(converged.all()):
            warnings.warn(
                f"rank_one_eigh_update: {int((~converged).sum())} secular roots did not reach "
                f"the stopping test in {_MAX_ITER} safeguarded iterations; results may be "
                "inaccurate.",
                NumericalWarning,
                stacklevel=3,
            )
        lam_s[act] = d_a[origin] + tau
        # With sigma < 0 the roots descend in lam = -lam_s: build the eigenvectors in reverse.
        q = _eigenvectors(
            d_a, z_a, origin, tau, buf, _workspace(1, (k, k), dtype, device), reverse=sgn < 0
        )
        cols_a = torch.from_numpy(perm_h[act_idx]).to(device)
        if k == n and bool((cols_a[1:] > cols_a[:-1]).all()):
            u_a = u
        else:
            u_a = torch.index_select(u, 1, cols_a, out=_workspace(2, (m, k), dtype, device))
    lam = lam_s * sgn
    order = torch.argsort(lam, stable=True)
    lam = lam[order]
    if k == n:
        return lam, u_a @ q.mT  # the one GEMM
    # Interleave the deflated columns (unchanged) with the updated ones, in ascending order.
    rank = torch.empty_like(order)
    rank[order] = torch.arange(n, device=device)  # output position of sorted index s
    out = torch.empty(m, n, dtype=dtype, device=device)
    inact_idx = np.flatnonzero(~active)
    inact = torch.from_numpy(inact_idx).to(device)
    out.index_copy_(
        1, rank[inact], u.index_select(1, torch.from_numpy(perm_h[inact_idx]).to(device))
    )
    if k:
        # The one GEMM, over the non-deflated columns only.
        new_a = torch.matmul(u_a, q.mT, out=_workspace(1, (m, k), dtype, device))
        act_pos = rank[act]
        if sgn < 0:
            act_pos = act_pos.flip(0)
        out.index_copy_(1, act_pos, new_a)
    return lam, out

"""Private core of the rank-one eigen-update: deflation, secular solve, stable eigenvectors.

Everything here works on the *diagonal* problem ``diag(d) + sigma z z^T`` (batched, float32 or
float64) and returns the eigenvalues together with the ``n x n`` orthogonal matrix ``Q`` of its
eigenvectors; callers multiply their basis by ``Q`` with a single GEMM.

The algorithm follows the classical divide-and-conquer merge step (Bunch, Nielsen & Sorensen
1978; Gu & Eisenstat 1994; LAPACK ``dlaed2``/``dlaed4``), rebuilt from the formulas:

1. ``sigma < 0`` is mapped to ``sigma > 0`` by negating ``d``; ``sqrt(|sigma|)`` is absorbed into
   ``z`` so that the secular equation reads ``f(lam) = 1 + sum_i z_i^2 / (d_i - lam) = 0``.
2. Deflation: entries with ``|z_i| ||z|| <= tol`` are dropped (their eigenpair is ``(d_i, e_i)``);
   pairs of (nearly) equal poles are merged by a Givens rotation that zeroes one ``z`` entry. Only
   the rotations themselves run in a Python loop, over the detected pairs.
3. All roots are solved at once: each root is written as an offset ``tau`` from its nearer pole,
   ``lam = d_o + tau``, and all differences as ``d_i - lam = (d_i - d_o) - tau`` (no
   cancellation). The iteration is Li's "middle way" rational step, safeguarded by bisection
   inside a bracket that every evaluation of ``f`` shrinks.
4. ``z`` is recomputed from the roots (Gu-Eisenstat), in log space so the products over ``n``
   factors cannot overflow, and the eigenvectors ``z_i / (d_i - lam_j)`` are normalised in log
   space as well; this keeps them orthogonal to working precision.
"""

from __future__ import annotations

import math
import warnings

import torch

from gpext.errors import NumericalWarning

__all__: list[str] = []

_MAX_ITER = 100


def _next_in_set(mask: torch.Tensor) -> torch.Tensor:
    """For every position ``j`` the smallest index ``i > j`` with ``mask[..., i]`` (``n`` if none)."""
    n = mask.shape[-1]
    idx = torch.arange(n, device=mask.device).expand_as(mask)
    marked = torch.where(mask, idx, torch.full_like(idx, n))
    incl = torch.flip(torch.cummin(torch.flip(marked, [-1]), dim=-1).values, [-1])
    pad = torch.full_like(incl[..., :1], n)
    return torch.cat([incl[..., 1:], pad], dim=-1)


def _prev_in_set(mask: torch.Tensor) -> torch.Tensor:
    """For every position ``j`` the largest index ``i < j`` with ``mask[..., i]`` (``-1`` if none)."""
    n = mask.shape[-1]
    idx = torch.arange(n, device=mask.device).expand_as(mask)
    marked = torch.where(mask, idx, torch.full_like(idx, -1))
    incl = torch.cummax(marked, dim=-1).values
    pad = torch.full_like(incl[..., :1], -1)
    return torch.cat([pad, incl[..., :-1]], dim=-1)


def _deflate_pairs(
    d: torch.Tensor, z: torch.Tensor, active: torch.Tensor, tol: torch.Tensor
) -> list[tuple[int, int, int, float, float]]:
    """Merge (nearly) equal poles with Givens rotations, in place on ``d``, ``z`` and ``active``.

    Detection is vectorised; the loop runs only over candidate pairs. A pair ``(p, j)`` of
    consecutive active poles is deflated when the off-diagonal entry that the rotation creates,
    ``|d_j - d_p| c s``, is below ``tol``; ``z_p`` becomes 0 and ``z_j`` becomes ``hypot(z_p, z_j)``.

    Returns:
        The rotations as ``(batch, p, j, c, s)``, in the order they were applied.
    """
    prev = _prev_in_set(active)
    has_prev = active & (prev >= 0)
    prev_c = prev.clamp(min=0)
    d_prev = torch.gather(d, -1, prev_c)
    z_prev = torch.gather(z, -1, prev_c)
    gap = d - d_prev
    r2 = z * z + z_prev * z_prev
    cs = (z * z_prev).abs() / torch.where(r2 > 0, r2, torch.ones_like(r2))
    cand = has_prev & ((gap * cs <= tol[:, None]) | (gap <= 2 * tol[:, None]))
    if not bool(cand.any()):
        return []
    rotations = []
    pairs = torch.nonzero(cand).tolist()
    # Scalar work on the host with plain floats: the loop touches O(1) entries per pair.
    d_h = d.detach().cpu().double().numpy().copy()
    z_h = z.detach().cpu().double().numpy().copy()
    act_h = active.cpu().numpy().copy()
    prev_h = prev.cpu().numpy()
    tol_h = tol.detach().cpu().double().tolist()
    for b, j in pairs:
        p = int(prev_h[b, j])
        # ``p`` can only have been deflated as the first of an earlier pair; walk back to the
        # currently active predecessor.
        while p >= 0 and not act_h[b, p]:
            p -= 1
        if p < 0:
            continue
        zp, zj = float(z_h[b, p]), float(z_h[b, j])
        r = math.hypot(zp, zj)
        if r == 0.0:
            continue
        c, s = zj / r, zp / r
        dp, dj = float(d_h[b, p]), float(d_h[b, j])
        if abs((dj - dp) * c * s) > tol_h[b]:
            continue
        d_h[b, p] = c * c * dp + s * s * dj
        d_h[b, j] = s * s * dp + c * c * dj
        z_h[b, p] = 0.0
        z_h[b, j] = r
        act_h[b, p] = False
        rotations.append((b, p, j, c, s))
    if rotations:
        d.copy_(torch.from_numpy(d_h).to(d))
        z.copy_(torch.from_numpy(z_h).to(z))
        active.copy_(torch.from_numpy(act_h).to(active.device))
    return rotations


def _evaluate(
    diff: torch.Tensor, z2: torch.Tensor, lower: torch.Tensor
) -> tuple[torch.Tensor, ...]:
    """Secular function pieces for each row; ``lower[r]`` is the last pole counted in ``psi``."""
    w = z2 / diff
    w1 = w / diff
    cw = w.cumsum(-1)
    cw1 = w1.cumsum(-1)
    idx = lower[:, None]
    psi = cw.gather(-1, idx).squeeze(-1)
    dpsi = cw1.gather(-1, idx).squeeze(-1)
    phi = cw[:, -1] - psi
    dphi = cw1[:, -1] - dpsi
    return 1.0 + psi + phi, psi, phi, dpsi, dphi


def _solve_secular(
    d: torch.Tensor, z2: torch.Tensor, active: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Solve ``1 + sum_i z2_i / (d_i - lam) = 0`` for every active index at once.

    Args:
        d: Poles sorted ascending. # shape: (B, n)
        z2: Squared weights, zero where not active. # shape: (B, n)
        active: Non-deflated indices; root ``j`` lies in ``(d_j, d_next(j))``. # shape: (B, n)

    Returns:
        ``lam`` (the root of every active index, ``d`` elsewhere), ``diff`` with
        ``diff[b, j, i] = d_i - lam_j`` computed without cancellation (1 where ``i`` or ``j`` is
        not active), and ``converged`` (bool per active root).
    """
    B, n = d.shape
    dtype, device = d.dtype, d.device
    eps = torch.finfo(dtype).eps
    inf = torch.tensor(torch.inf, dtype=dtype, device=device)
    nxt = _next_in_set(active)
    has_next = nxt < n
    nxt_c = nxt.clamp(max=n - 1)
    rho = z2.sum(-1, keepdim=True)  # shape: (B, 1)
    gap = torch.where(has_next, torch.gather(d, -1, nxt_c) - d, rho.expand_as(d))

    bj, jj = torch.nonzero(active, as_tuple=True)
    num = bj.numel()
    z2_rows = z2[bj]  # shape: (R, n)
    col_on = active[bj]
    d_rows = d[bj]
    up_idx = nxt_c[bj, jj]
    last = ~has_next[bj, jj]
    half = 0.5 * gap[bj, jj]
    # First evaluation at the middle of every interval, in coordinates of the lower pole.
    diff = torch.where(col_on, d_rows - d[bj, jj][:, None], inf) - half[:, None]
    f, psi, phi, dpsi, dphi = _evaluate(diff, z2_rows, jj)
    use_lower = last | (f >= 0)
    origin_idx = torch.where(use_lower, jj, up_idx)
    origin = d[bj, origin_idx]
    # d_i - d_origin: exact zero at the origin, +inf on deflated columns (they contribute 0).
    delta = torch.where(col_on, d_rows - origin[:, None], inf)  # shape: (R, n)
    zero = torch.zeros_like(half)
    tau = torch.where(use_lower, half, -half)
    lo = torch.where(use_lower, torch.where(f > 0, zero, half), -half)
    hi = torch.where(use_lower, torch.where(f > 0, half, 2.0 * half), zero)
    converged = torch.zeros(num, dtype=torch.bool, device=device)
    d_lo = -half
    d_hi = half
    z2_origin = z2[bj, origin_idx]
    prv = _prev_in_set(active)[bj, jj]
    has_prev = prv >= 0
    prv_c = prv.clamp(min=0)
    # For a last root without a lower neighbour the lumped pole gets weight 0 (exact model).
    d_pr = torch.where(has_prev, delta[torch.arange(num, device=device), prv_c] - tau, -inf)
    use_fw = ~last
    f_prev = torch.full_like(half, torch.inf)

    todo = torch.arange(num, device=device)
    work = todo  # rows of the compacted working copies below
    w_delta, w_z2, w_jj, w_up, w_pr = delta, z2_rows, jj, up_idx, prv_c
    for _ in range(_MAX_ITER):
        t_ = tau[todo]
        lo_t, hi_t = lo[todo], hi[todo]
        err = eps * (8.0 * (1.0 + phi - psi) + t_.abs() * (dpsi + dphi))
        width = hi_t - lo_t
        done = (f.abs() <= err) | (width <= 2.0 * eps * torch.maximum(lo_t.abs(), hi_t.abs()))
        # Rational step from two poles: c + s/(D_lo - eta) + S/(D_2 - eta), with D_2 the upper
        # pole, or for the last root (all poles below it) the previous pole.
        # "Fixed weight" keeps the exact weight of the origin pole and fits the other one to f';
        # Li's "middle way" fits each side to its own derivative. Interior roots start with the
        # fixed weight and switch when progress is slow; the last root keeps the exact weight of
        # its pole and lumps all lower poles into the previous one.
        is_last = last[todo]
        fw = use_fw[todo]
        low_o = use_lower[todo]
        fp = dpsi + dphi
        z2o = z2_origin[todo]
        s_mw, big_mw = d_lo * d_lo * dpsi, d_hi * d_hi * dphi
        s_fw = torch.where(low_o, z2o, (d_lo * d_lo * (fp - z2o / (d_hi * d_hi))).clamp(min=0))
        big_fw = torch.where(low_o, (d_hi * d_hi * (fp - z2o / (d_lo * d_lo))).clamp(min=0), z2o)
        lone = is_last & ~has_prev[todo]
        big_last = (d_pr * d_pr * (dpsi - z2o / (d_lo * d_lo))).clamp(min=0)
        big_last = torch.where(lone, 0.0, big_last)
        d_pr = torch.where(lone, -1.0, d_pr)
        s = torch.where(is_last, z2o, torch.where(fw, s_fw, s_mw))
        big_s = torch.where(is_last, big_last, torch.where(fw, big_fw, big_mw))
        d_2 = torch.where(is_last, d_pr, d_hi)
        c = f - s / d_lo - big_s / d_2
        a = c * (d_lo + d_2) + s + big_s
        b = d_lo * d_2 * f
        sq = (a * a - 4.0 * b * c).clamp(min=0).sqrt()
        q = 0.5 * (a + torch.where(a >= 0, sq, -sq))
        eta1 = q / c
        eta2 = b / q
        inside = (eta1 > d_lo) & (eta1 < d_hi)
        beyond = torch.where(eta1 > d_lo, eta1, eta2)
        eta = torch.where(is_last, beyond, torch.where(inside, eta1, eta2))
        eta = torch.where(lone, d_lo + s / (f - s / d_lo), eta)
        slow = (f.abs() > 0.1 * f_prev[todo].abs()) & ~is_last
        use_fw[todo] = torch.where(slow, ~fw, fw)
        f_prev[todo] = f
        t_new = t_ + eta
        ok = torch.isfinite(t_new) & (t_new > lo_t) & (t_new < hi_t)
        t_new = torch.where(ok, t_new, 0.5 * (lo_t + hi_t))
        tau[todo] = torch.where(done, t_, t_new)
        converged[todo[done]] = True
        keep = ~done
        todo = todo[keep]
        work = work[keep]
        if todo.numel() == 0:
            break
        if todo.numel() < 0.6 * w_delta.shape[0]:
            w_delta, w_z2 = w_delta[work], w_z2[work]
            w_jj, w_up, w_pr = w_jj[work], w_up[work], w_pr[work]
            work = torch.arange(todo.numel(), device=device)
        t_ = tau[todo]
        diff = (
            w_delta[work] - t_[:, None]
            if work.numel() < w_delta.shape[0]
            else w_delta - t_[:, None]
        )
        f, psi, phi, dpsi, dphi = _evaluate(diff, w_z2[work], w_jj[work])
        lo_t, hi_t = lo[todo], hi[todo]
        lo[todo] = torch.where(f < 0, t_, lo_t)
        hi[todo] = torch.where(f > 0, t_, hi_t)
        rows = torch.arange(todo.numel(), device=device)
        d_lo = diff[rows, w_jj[work]]
        d_hi = diff[rows, w_up[work]]
        d_pr = torch.where(has_prev[todo], diff[rows, w_pr[work]], -inf)

    lam = d.clone()
    lam[bj, jj] = origin + tau
    diff_full = torch.ones(B, n, n, dtype=dtype, device=device)
    diff_full[bj, jj] = torch.where(col_on, delta - tau[:, None], 1.0)
    return lam, diff_full, converged


def diag_rank_one_eigh(
    d: torch.Tensor, z: torch.Tensor, sigma: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eigendecomposition of ``diag(d) + sigma z z^T`` (batched).

    Args:
        d: Diagonal, any order. # shape: (B, n)
        z: Update direction. # shape: (B, n)
        sigma: Update weight of either sign. # shape: (B,)

    Returns:
        ``(lam, Q)`` with ``lam`` ascending and ``Q`` orthogonal, columns the eigenvectors.
        # shapes: (B, n), (B, n, n)
    """
    B, n = d.shape
    dtype, device = d.dtype, d.device
    eps = torch.finfo(dtype).eps
    sgn = torch.where(sigma < 0, -1.0, 1.0).to(dtype)
    ds = d * sgn[:, None]
    zs = z * sigma.abs().sqrt()[:, None]
    perm = torch.argsort(ds, dim=-1, stable=True)
    ds = torch.gather(ds, -1, perm)
    zs = torch.gather(zs, -1, perm)

    znorm2 = (zs * zs).sum(-1)
    tol = 8.0 * eps * torch.maximum(ds.abs().amax(-1), znorm2)
    tiny = zs.abs() * znorm2.sqrt()[:, None] <= tol[:, None]
    zs = torch.where(tiny, torch.zeros_like(zs), zs)
    active = ~tiny
    rotations = _deflate_pairs(ds, zs, active, tol)

    z2 = torch.where(active, zs * zs, torch.zeros_like(zs))
    eye = torch.eye(n, dtype=dtype, device=device).expand(B, n, n)
    if bool(active.any()):
        lam, diff, converged = _solve_secular(ds, z2, active)
        if not bool(converged.all()):
            warnings.warn(
                f"rank_one_eigh_update: {int((~converged).sum())} secular roots did not reach "
                f"the stopping test in {_MAX_ITER} safeguarded iterations; results may be "
                "inaccurate.",
                NumericalWarning,
                stacklevel=3,
            )
        # Gu-Eisenstat: recompute z from the roots, in log space.
        # diff[b, j, i] = d_i - lam_j (rows of inactive j and columns of inactive i are 1).
        act_rows = active[:, :, None] & active[:, None, :]
        log_diff = diff.abs().log()
        dd = ds[:, None, :] - ds[:, :, None]
        not_diag = ~torch.eye(n, dtype=torch.bool, device=device)[None]
        dd = torch.where(act_rows & not_diag, dd, torch.ones_like(dd))
        log_z2 = log_diff.sum(-2) - dd.abs().log().sum(-2)  # shape: (B, n)
        log_zhat = 0.5 * log_z2
        log_q = log_zhat[:, None, :] - log_diff  # shape: (B, n_roots, n)
        log_q = torch.where(act_rows, log_q, torch.full_like(log_q, -torch.inf))
        log_q = log_q - log_q.amax(-1, keepdim=True).clamp(min=torch.finfo(dtype).min)
        sign = torch.sign(zs)[:, None, :] * torch.sign(diff)
        rows = torch.where(act_rows, sign * log_q.exp(), torch.zeros_like(log_q))
        rows = rows / rows.norm(dim=-1, keepdim=True).clamp(min=torch.finfo(dtype).tiny)
        q = torch.where(active[:, None, :], rows.mT, eye)  # columns = eigenvectors
    else:
        lam = ds.clone()
        q = eye.clone()
    if rotations:
        q_h = q.cpu().numpy() if q.device.type == "cpu" else q.cpu().numpy().copy()
        for b, p, j, c, s in reversed(rotations):
            row_p = q_h[b, p].copy()
            row_j = q_h[b, j]
            q_h[b, p] = c * row_p + s * row_j
            q_h[b, j] = c * row_j - s * row_p
        if q.device.type != "cpu":
            q = torch.from_numpy(q_h).to(q.device)
    lam = lam * sgn[:, None]
    q_orig = torch.empty_like(q)
    q_orig.scatter_(-2, perm[:, :, None].expand(B, n, n), q)
    order = torch.argsort(lam, dim=-1, stable=True)
    lam = torch.gather(lam, -1, order)
    q_orig = torch.gather(q_orig, -1, order[:, None, :].expand(B, n, n))
    return lam, q_orig

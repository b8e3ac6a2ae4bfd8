r"""Private core of bordering an eigendecomposition: the symmetric arrowhead eigenproblem.

Adding a point to a decomposed kernel matrix borders it: in the bordered basis
``blockdiag(U, 1)`` the new matrix is the arrowhead

.. math::

    A = \begin{pmatrix} \operatorname{diag}(d) & z \\ z^\top & \alpha \end{pmatrix},
    \qquad z = U^\top a,\ \alpha = k(x, x),

whose ``n + 1`` eigenvalues are the roots of the secular function

.. math::

    g(\lambda) = \lambda - \alpha + \sum_i \frac{z_i^2}{d_i - \lambda}

(from :math:`\det(A - \lambda I) = (\alpha - \lambda - \sum_i z_i^2 / (d_i - \lambda))
\prod_i (d_i - \lambda)`), one below :math:`d_1`, one between each pair of consecutive poles and
one above :math:`d_n`, all within :math:`[\min(d, \alpha) - \lVert z\rVert, \max(d, \alpha) +
\lVert z\rVert]` (Weyl). The paper's Eq. 7 writes the border as two rank-one updates (two
secular solves, the second on the first one's roots); the arrowhead gives the same matrix's
eigenpairs from one solve (the classical bordered / arrowhead form of the divide-and-conquer
merge: Gu and Eisenstat, SIAM J. Matrix Anal. Appl. 16(1), 1995).

The steps mirror :mod:`gpext.operators._secular`:

1. ``d``, ``z`` and ``alpha`` are scaled by one power of two (exact) so that the largest of
   them lies in ``[1/2, 1)``; the roots are scaled back.
2. Deflation: ``|z_i|`` at rounding level leaves ``(d_i, e_i)``; (nearly) equal poles are merged
   by a Givens rotation (``_deflate_pairs``). The corner never deflates.
3. The ``k + 1`` roots of the ``k`` remaining poles are solved at once by the same safeguarded
   fixed-weight rational iteration (``_secular._iterate``), with
   ``g`` and ``g' = 1 + \sum_i z_i^2 / (d_i - \lambda)^2`` in place of the rank-one
   function; every root is an offset from its nearer pole (the end roots from the end poles).
4. Gu-Eisenstat: with the roots :math:`\lambda_0 < d_0 < \lambda_1 < \dots < d_{k-1} <
   \lambda_k`, the border that has them exactly is
   :math:`\hat z_i^2 = -(\lambda_i - d_i)(\lambda_k - d_i) \prod_{r \ne i, r < k}
   (\lambda_r - d_i) / (d_r - d_i)` (telescoping ratios, summed in logarithms in blocks); the
   eigenvectors :math:`(\hat z_i / (d_i - \lambda_r), -1)` are then orthogonal to working
   precision. Nothing of size ``m x n`` is touched: the result is a
   :class:`~gpext.operators._secular.Factor` over the ``n + 1`` bordered coordinates.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch

from gpext.errors import NumericalError, NumericalWarning
from gpext.operators._secular import (
    _MAX_ITER,
    Factor,
    _deflate_pairs,
    _iterate,
    _log_abs_column_products,
    _model_root,
    _Sums,
    _workspace,
)

__all__: list[str] = []


def _scale_exponent(d_h: np.ndarray, z_h: np.ndarray, alpha: float) -> int:
    """``e`` with ``max(|d|, |z|, |alpha|) / 2^e`` in ``[1/2, 1)`` (0 for all zeros).

    Raises:
        NumericalError: If an entry is not finite.
    """
    big = max(float(np.abs(d_h).max(initial=0.0)), float(np.abs(z_h).max(initial=0.0)),
              abs(alpha))  # fmt: skip
    if not math.isfinite(big):
        raise NumericalError(
            "IncrementalKPCA: the bordered matrix has non-finite entries (eigenvalues, "
            "projected kernel column or self-similarity). Rescale the kernel."
        )
    return math.frexp(big)[1] if big > 0 else 0


def _solve(
    d: torch.Tensor, z: torch.Tensor, d_h: np.ndarray, z_h: np.ndarray, alpha: float
) -> tuple[np.ndarray, np.ndarray, torch.Tensor, int]:
    """All ``k + 1`` roots of ``g(lam) = lam - alpha + sum_i z_i^2 / (d_i - lam)``, ``k >= 2``.

    Args:
        d: Poles, strictly ascending (device, dtype of the data). # shape: (k,)
        z: Border, ``z > 0``. # shape: (k,)
        d_h: ``d`` on the host in float64. # shape: (k,)
        z_h: ``z`` on the host in float64. # shape: (k,)
        alpha: The corner.

    Returns:
        ``origin`` (the pole each root is measured from), ``tau`` (``lam = d[origin] + tau``,
        host float64), ``d0`` (``d0[r, i] = d_i - d[origin[r]]``, a workspace) and the number
        of roots that did not converge. # shapes: (k + 1,), (k + 1,), (k + 1, k), ()
    """
    k = d_h.size
    n = k + 1
    dtype, device = d.dtype, d.device
    eps = float(torch.finfo(dtype).eps)
    npdt = np.float64 if dtype == torch.float64 else np.float32
    z2 = z_h * z_h
    znorm = math.sqrt(float(z2.sum()))
    low = min(float(d_h[0]), alpha) - znorm  # Weyl bounds of every root
    high = max(float(d_h[-1]), alpha) + znorm
    buf = _workspace(1, (n, k), dtype, device)
    d0 = _workspace(2, (n, k), dtype, device)
    res = _workspace(3, (3, n), dtype, device)
    # Intervals: root 0 in (low, d_0), root r in (d_{r-1}, d_r), root k in (d_{k-1}, high).
    left = np.concatenate([[low], d_h])
    right = np.concatenate([d_h, [high]])
    mid = 0.5 * (left + right)
    mid_t = torch.from_numpy(mid).to(dtype=dtype, device=device)
    a = torch.sub(d[None, :], mid_t[:, None], out=buf)
    torch.div(z, a, out=a)
    g_mid = mid - alpha + torch.mv(a, z, out=res[0]).cpu().double().numpy()
    r = np.arange(n)
    lower = g_mid >= 0  # g increases: the root lies in the lower half
    # The origin is the pole at the end of the root's half; the end roots use the end poles.
    origin = np.where(lower, r - 1, r)
    origin[0], origin[-1] = 0, k - 1
    other = np.where(origin == r - 1, r, r - 1)  # the interval's other pole
    other[0], other[-1] = 1, k - 2
    d_o = d_h[origin]
    p2 = d_h[other] - d_o
    w_o, w_2 = z2[origin], z2[other]
    lo = np.where(lower, left, mid) - d_o
    hi = np.where(lower, mid, right) - d_o
    lo[0], hi[0] = (low - d_o[0], mid[0] - d_o[0]) if lower[0] else (mid[0] - d_o[0], 0.0)
    lo[-1], hi[-1] = (0.0, mid[-1] - d_o[-1]) if lower[-1] else (mid[-1] - d_o[-1], high - d_o[-1])
    # Initial guess: both model poles exact, the rest of g (linear term included) frozen at
    # the midpoint.
    t_mid = mid - d_o
    with np.errstate(all="ignore"):
        c = g_mid + w_o / t_mid - w_2 / (p2 - t_mid)
        tau = _model_root(c * p2 + w_o + w_2, w_o * p2, c, lo, hi)
    tau = np.where(np.isfinite(tau), tau, 0.5 * (lo + hi)).astype(npdt).astype(np.float64)
    shift = d_o - alpha  # g = shift + tau + sum_i z_i^2 / (d0_i - tau)
    torch.sub(d[None, :], torch.from_numpy(d_o).to(dtype=dtype, device=device)[:, None], out=d0)
    sums = _Sums(d0, z, buf, res)

    def evaluate(todo, t, s1, s2):
        sh = shift[todo]
        f = sh + t + s1
        fp = 1.0 + s2
        # rounding-error bound of the evaluation, as for the rank-one function with the
        # linear term's own rounding: |g| <= eps (8 sum |z_i^2 / (d_i - lam)| + 2 |shift|
        # + 2 |tau| + 3 |g| + |tau| g')
        return f, fp, 2.0 * np.abs(sh) + 2.0 * np.abs(t) + 3.0 * np.abs(f) + np.abs(t) * fp

    converged = _iterate(sums, tau, lo, hi, p2, w_o, w_2, eps, npdt, znorm, evaluate)
    return origin, tau, d0, int((~converged).sum())


def _two_by_two(d: float, z: float, alpha: float) -> np.ndarray:
    """Offsets from ``d`` of the two eigenvalues of ``[[d, z], [z, alpha]]``, without
    cancellation. # shape: (2,)"""
    h = 0.5 * (alpha - d)
    r = math.hypot(h, z)
    up = h + r if h >= 0 else z * z / (r - h)
    down = h - r if h <= 0 else -z * z / (h + r)
    return np.array([down, up])


def _eigenvectors(
    d: torch.Tensor, z_sign: torch.Tensor, tau: np.ndarray, d0: torch.Tensor, scale: float
) -> torch.Tensor:
    """Rows: the unit eigenvectors ``(zhat / (d - lam_r), -1)`` of the Gu-Eisenstat arrowhead.

    ``zhat_i^2 = -(lam_i - d_i)(lam_k - d_i) prod_{r != i, r < k} (lam_r - d_i) / (d_r - d_i)``:
    the ratio of root ``r`` and pole ``r`` telescopes (interlacing), the diagonal factor is
    taken relative to the problem's ``scale``, and blocks of ``_BLOCK`` factors are summed in
    logarithms. # shape: (k + 1, k + 1)
    """
    n, k = d0.shape
    dtype, device = d0.dtype, d0.device
    t = torch.from_numpy(tau).to(dtype=dtype, device=device)[:, None]
    diff = torch.sub(d0, t, out=_workspace(1, (n, k), dtype, device))  # d_i - lam_r
    dd = torch.sub(d[None, :], d[:, None], out=_workspace(0, (k, k), dtype, device))
    dd.diagonal().fill_(-scale)
    ratio = torch.div(diff[:k], dd, out=dd)  # (lam_r - d_i) / (d_r - d_i), row r < k
    log_z2 = _log_abs_column_products(ratio) + diff[k].double().abs().log() + math.log(scale)
    zhat = torch.exp(0.5 * log_z2).to(dtype).mul_(z_sign)
    q = torch.empty(n, n, dtype=dtype, device=device)
    torch.div(zhat, diff, out=q[:, :k])
    q[:, k] = -1.0
    return q.mul_(torch.linalg.vector_norm(q, dim=-1, keepdim=True).reciprocal_())


def arrowhead_eigvals_factor(
    d: torch.Tensor,  # shape: (n,)
    z: torch.Tensor,  # shape: (n,)
    alpha: float,
) -> tuple[torch.Tensor, Factor]:
    """Eigenvalues (ascending) and eigenvector factor of ``[[diag(d), z], [z^T, alpha]]``.

    ``d`` must be ascending (the eigenvalues a decomposition keeps). The factor acts on the
    ``n + 1`` coordinates of the bordered basis ``blockdiag(U, 1)`` (the corner last), so the
    new basis is ``blockdiag(U, 1) F``; ``O(n^2)`` work.

    Raises:
        NumericalError: For non-finite entries, or eigenvalues that overflow the dtype.
    """
    n = d.shape[0]
    dtype, device = d.dtype, d.device
    eps = float(torch.finfo(dtype).eps)
    d_h = d.detach().cpu().double().numpy().copy()
    z_h = z.detach().cpu().double().numpy().copy()
    e = _scale_exponent(d_h, z_h, alpha)
    d_h, z_h, a_s = np.ldexp(d_h, -e), np.ldexp(z_h, -e), math.ldexp(alpha, -e)
    znorm = math.sqrt(float(np.dot(z_h, z_h)))
    tol = 8.0 * eps * max(float(np.abs(d_h).max(initial=0.0)), abs(a_s), znorm)
    active = np.abs(z_h) > tol
    z_h[~active] = 0.0
    rotations = _deflate_pairs(d_h, z_h, active, tol)
    act_idx = np.flatnonzero(active)
    k = act_idx.size
    lam_s = np.concatenate([d_h, [a_s]])  # deflated values stay; the corner's slot last
    if k == 0:
        q = torch.ones(1, 1, dtype=dtype, device=device)
    else:
        da_h, za_h = d_h[act_idx], np.abs(z_h[act_idx])
        d_a = torch.from_numpy(da_h).to(dtype=dtype, device=device)
        if k == 1:
            origin = np.zeros(2, dtype=np.int64)
            tau = _two_by_two(float(da_h[0]), float(za_h[0]), a_s)
            d0 = torch.zeros(2, 1, dtype=dtype, device=device)
        else:
            z_a = torch.from_numpy(za_h).to(dtype=dtype, device=device)
            origin, tau, d0, failed = _solve(d_a, z_a, da_h, za_h, a_s)
            if failed:
                warnings.warn(
                    f"IncrementalKPCA: {failed} roots of the bordered (arrowhead) eigenproblem "
                    f"did not reach the stopping test in {_MAX_ITER} safeguarded iterations; "
                    "results may be inaccurate.",
                    NumericalWarning,
                    stacklevel=4,
                )
        roots = da_h[origin] + tau
        lam_s[act_idx] = roots[:k]
        lam_s[n] = roots[k]
        z_sign = torch.from_numpy(np.where(z_h[act_idx] < 0, -1.0, 1.0)).to(dtype=dtype)
        scale = max(float(np.abs(da_h).max()), float(np.abs(tau).max()), 1e-300)
        q = _eigenvectors(d_a, z_sign.to(device), tau, d0, scale)
    with np.errstate(over="ignore"):
        lam_h = np.ldexp(lam_s, e)
    if not (np.isfinite(lam_h).all() and np.abs(lam_h).max() <= torch.finfo(dtype).max):
        raise NumericalError(
            f"IncrementalKPCA: the bordered eigenvalues overflow {dtype}. Rescale the kernel."
        )
    order = np.argsort(lam_h, kind="stable")
    lam = torch.from_numpy(lam_h[order]).to(dtype=dtype, device=device)
    rank = np.empty(n + 1, dtype=np.int64)
    rank[order] = np.arange(n + 1)
    act = np.concatenate([act_idx, [n]]).astype(np.int64)
    inact = np.flatnonzero(~np.concatenate([active, [True]]))
    perm = np.arange(n + 1, dtype=np.int64)  # d is ascending: sorted order = input order
    return lam, Factor(n + 1, perm, rotations, act, inact, rank, q)

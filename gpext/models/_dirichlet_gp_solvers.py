"""Linear algebra of Dirichlet GP classification with one-vs-rest structured noise.

With the Dirichlet transform every class ``c`` has only two target values and two noise values:
``(y_pos, s_pos)`` on the points labelled ``c`` and ``(y_neg, s_neg)`` elsewhere.  With one
kernel shared by the ``C`` outputs this structure lets all classes share one factorisation:

* exact: :math:`K + S_c = A + \\delta P_c^\\top P_c` with :math:`A = K + s_{neg} I`,
  :math:`\\delta = s_{pos} - s_{neg} < 0` and :math:`P_c` selecting the ``N_c`` points of class
  ``c``; Woodbury and the determinant lemma need one ``N x N`` Cholesky plus ``N_c x N_c``
  ones (sum ``N``);
* sparse (Titsias' collapsed bound with heteroscedastic noise):
  :math:`V S_c^{-1} V^\\top = V V^\\top / s_{neg} + (1/s_{pos} - 1/s_{neg}) V_c V_c^\\top`,
  costing ``O(M^2 N)`` for all classes together instead of ``O(C M^2 N)``.

Points are assumed sorted by class (``offsets[c]:offsets[c + 1]`` are the points of class c).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from gpext.utils import safe_cholesky

__all__: list[str] = []


@dataclass
class NoiseValues:
    """Targets minus class means and noise variances, per class (tensors of shape (C,))."""

    r_pos: torch.Tensor  # y_pos - mean_c
    r_neg: torch.Tensor  # y_neg - mean_c
    s_pos: torch.Tensor  # scalar tensor
    s_neg: torch.Tensor  # scalar tensor


def _chol(mat: torch.Tensor, what: str, max_tries: int = 0) -> torch.Tensor:
    """Cholesky factor, by default without a jitter fallback (:func:`gpext.utils.safe_cholesky`)."""
    return safe_cholesky(
        mat,
        name=f"DirichletGPClassifier: {what}",
        max_tries=max_tries,
        hint="Increase jitter or use float64.",
    )


def _inverse_from_chol(chol: torch.Tensor) -> torch.Tensor:
    """``(L L^T)^{-1}`` via a triangular solve (``torch.cholesky_inverse`` is slow on CPU)."""
    eye = torch.eye(chol.shape[-1], dtype=chol.dtype, device=chol.device)
    l_inv = torch.linalg.solve_triangular(chol, eye, upper=False)
    return l_inv.transpose(-1, -2) @ l_inv


def exact_nll(k: torch.Tensor, offsets: list[int], nv: NoiseValues) -> torch.Tensor:
    """Negative log marginal likelihood summed over classes (exact GP, shared kernel).

    Args:
        k: Kernel matrix of the class-sorted training inputs.  # shape: (N, N)
        offsets: Class boundaries, length ``C + 1``.
        nv: Residual and noise values.

    Returns:
        Scalar ``sum_c -log N(r_c; 0, K + S_c)``.
    """
    n = k.shape[-1]
    eye = torch.eye(n, dtype=k.dtype, device=k.device)
    chol_a = _chol(k + nv.s_neg * eye, "K + s_neg I")
    a_inv = _inverse_from_chol(chol_a)
    logdet_a = 2.0 * chol_a.diagonal().log().sum()
    abs_delta = nv.s_neg - nv.s_pos
    ones = torch.ones(n, dtype=k.dtype, device=k.device)
    a_inv_1 = a_inv @ ones
    total = k.new_zeros(())
    for c in range(len(offsets) - 1):
        lo, hi = offsets[c], offsets[c + 1]
        # A^{-1} r_c with r_c = r_neg + (r_pos - r_neg) 1_{I_c}
        a_inv_r = nv.r_neg[c] * a_inv_1 + (nv.r_pos[c] - nv.r_neg[c]) * a_inv[:, lo:hi].sum(-1)
        r_vec_dot = nv.r_neg[c] * a_inv_r.sum() + (nv.r_pos[c] - nv.r_neg[c]) * a_inv_r[lo:hi].sum()
        quad, logdet = r_vec_dot, logdet_a
        if hi > lo:
            h = torch.eye(hi - lo, dtype=k.dtype, device=k.device) / abs_delta - a_inv[lo:hi, lo:hi]
            chol_h = _chol(h, f"the Woodbury block of class {c}")
            u = a_inv_r[lo:hi]
            t = torch.linalg.solve_triangular(chol_h, u[:, None], upper=False)
            quad = quad + t.square().sum()
            logdet = logdet + (hi - lo) * abs_delta.log() + 2.0 * chol_h.diagonal().log().sum()
        total = total + 0.5 * (quad + logdet + n * math.log(2.0 * math.pi))
    return total


def exact_inverse(k: torch.Tensor, nv: NoiseValues) -> torch.Tensor:
    r""":math:`A^{-1} = (K + s_{neg} I)^{-1}`, the factor shared by all classes.

    Args:
        k: Training kernel matrix.  # shape: (N, N)
        nv: Residual and noise values.

    Returns:
        :math:`A^{-1}`.  # shape: (N, N)
    """
    eye = torch.eye(k.shape[-1], dtype=k.dtype, device=k.device)
    return _inverse_from_chol(_chol(k + nv.s_neg * eye, "K + s_neg I"))


def extend_inverse(
    a_inv: torch.Tensor, k_cross: torch.Tensor, k_new: torch.Tensor, nv: NoiseValues
) -> torch.Tensor:
    r""":math:`A^{-1}` of the training set grown by ``M`` points, in ``O(N^2 M)``.

    With :math:`A' = [[A, B], [B^\top, D]]`, :math:`B = K_{XX'}`, :math:`D = K_{X'X'} + s_{neg} I`
    and the Schur complement :math:`S = D - B^\top A^{-1} B`:

    .. math::
        A'^{-1} = \begin{bmatrix} A^{-1} + C S^{-1} C^\top & -C S^{-1} \\
            -S^{-1} C^\top & S^{-1} \end{bmatrix}, \qquad C = A^{-1} B.

    Args:
        a_inv: :math:`A^{-1}` of the current points.  # shape: (N, N)
        k_cross: Kernel between current and new points.  # shape: (N, M)
        k_new: Kernel of the new points.  # shape: (M, M)
        nv: Residual and noise values.

    Returns:
        :math:`A'^{-1}` with the new points last.  # shape: (N + M, N + M)
    """
    m = k_new.shape[-1]
    eye = torch.eye(m, dtype=k_new.dtype, device=k_new.device)
    c = a_inv @ k_cross  # shape: (N, M)
    schur = k_new + nv.s_neg * eye - k_cross.transpose(0, 1) @ c
    s_inv = _inverse_from_chol(_chol(0.5 * (schur + schur.transpose(0, 1)), "the Schur complement"))
    cs = c @ s_inv  # shape: (N, M)
    top = torch.cat([a_inv + cs @ c.transpose(0, 1), -cs], -1)
    bottom = torch.cat([-cs.transpose(0, 1), s_inv], -1)
    return torch.cat([top, bottom], 0)


def exact_predict(
    a_inv: torch.Tensor,
    k_star: torch.Tensor,
    k_star_diag: torch.Tensor,
    offsets: list[int],
    nv: NoiseValues,
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Posterior latent means and variances (without class means) at test points.

    Args:
        a_inv: :math:`(K + s_{neg} I)^{-1}` of the class-sorted training points (see
            :func:`exact_inverse`).  # shape: (N, N)
        k_star: Cross kernel.  # shape: (N, T)
        k_star_diag: Prior variances at the test points.  # shape: (T,)

    Returns:
        ``(mean, var)`` of the residual latent functions.  # shape: (T, C) each
    """
    abs_delta = nv.s_neg - nv.s_pos
    w = a_inv @ k_star  # shape: (N, T)
    base_var = k_star_diag - (k_star * w).sum(0)
    a_inv_1 = a_inv.sum(-1)
    means, variances = [], []
    for c in range(len(offsets) - 1):
        lo, hi = offsets[c], offsets[c + 1]
        alpha = nv.r_neg[c] * a_inv_1 + (nv.r_pos[c] - nv.r_neg[c]) * a_inv[:, lo:hi].sum(-1)
        var = base_var
        if hi > lo:
            eye = torch.eye(hi - lo, dtype=a_inv.dtype, device=a_inv.device)
            chol_h = _chol(
                eye / abs_delta - a_inv[lo:hi, lo:hi], f"the Woodbury block of class {c}"
            )
            v = torch.cholesky_solve(alpha[lo:hi, None], chol_h).squeeze(-1)
            alpha = alpha + a_inv[:, lo:hi] @ v
            t = torch.linalg.solve_triangular(chol_h, w[lo:hi], upper=False)
            var = var - t.square().sum(0)
        means.append(k_star.transpose(0, 1) @ alpha)
        variances.append(var)
    return torch.stack(means, -1), torch.stack(variances, -1).clamp_min(0.0)


def _sparse_factors(
    k_mm: torch.Tensor, k_mn: torch.Tensor, offsets: list[int], nv: NoiseValues, jitter: float
):
    m = k_mm.shape[-1]
    eye = torch.eye(m, dtype=k_mm.dtype, device=k_mm.device)
    # K_ZZ escalates its jitter: inducing points that (nearly) coincide, e.g. learned points
    # next to the training points added for the final posterior, make it singular in float32
    chol_m = _chol(k_mm + jitter * eye, "K_ZZ", max_tries=4)
    v = torch.linalg.solve_triangular(chol_m, k_mn, upper=False)  # shape: (M, N)
    vvt = v @ v.transpose(0, 1)
    gap = 1.0 / nv.s_pos - 1.0 / nv.s_neg
    v_sum = v.sum(-1)
    grams, class_sums = [], []
    for c in range(len(offsets) - 1):
        v_c = v[:, offsets[c] : offsets[c + 1]]
        grams.append(v_c @ v_c.transpose(0, 1))
        class_sums.append(v_c.sum(-1))
    class_sums = torch.stack(class_sums)  # shape: (C, M)
    blocks = (eye + vvt / nv.s_neg) + gap * torch.stack(grams)  # shape: (C, M, M)
    b = (nv.r_neg / nv.s_neg)[:, None] * v_sum + (nv.r_pos / nv.s_pos - nv.r_neg / nv.s_neg)[
        :, None
    ] * class_sums
    chol_b = _chol(blocks, "I + V S^-1 V^T")  # shape: (C, M, M)
    return chol_m, v, chol_b, b


def sparse_neg_bound(
    k_mm: torch.Tensor,
    k_mn: torch.Tensor,
    k_diag: torch.Tensor,
    offsets: list[int],
    nv: NoiseValues,
    jitter: float,
) -> torch.Tensor:
    """Negative collapsed (Titsias) bound summed over classes, heteroscedastic noise.

    .. math::
        \\mathcal L_c = \\log \\mathcal N(r_c; 0, Q_{nn} + S_c)
            - \\tfrac12 \\operatorname{tr}\\big(S_c^{-1}(K_{nn} - Q_{nn})\\big).

    Args:
        k_mm: Inducing kernel.  # shape: (M, M)
        k_mn: Cross kernel to the class-sorted training inputs.  # shape: (M, N)
        k_diag: Prior variances of the training points.  # shape: (N,)
    """
    n = k_mn.shape[-1]
    _, v, chol_b, b = _sparse_factors(k_mm, k_mn, offsets, nv, jitter)
    d = (k_diag - v.square().sum(0)).clamp_min(0.0)
    d_sum = d.sum()
    counts = torch.tensor(
        [offsets[c + 1] - offsets[c] for c in range(len(offsets) - 1)],
        dtype=k_mn.dtype,
        device=k_mn.device,
    )
    d_class = torch.stack([d[offsets[c] : offsets[c + 1]].sum() for c in range(len(offsets) - 1)])
    t = torch.linalg.solve_triangular(chol_b, b[..., None], upper=False).squeeze(-1)
    quad = (
        counts * nv.r_pos.square() / nv.s_pos
        + (n - counts) * nv.r_neg.square() / nv.s_neg
        - t.square().sum(-1)
    )
    logdet = (
        2.0 * chol_b.diagonal(dim1=-2, dim2=-1).log().sum(-1)
        + counts * nv.s_pos.log()
        + (n - counts) * nv.s_neg.log()
    )
    trace = d_sum / nv.s_neg + (1.0 / nv.s_pos - 1.0 / nv.s_neg) * d_class
    return 0.5 * (quad + logdet + n * math.log(2.0 * math.pi) + trace).sum()


def sparse_predict(
    k_mm: torch.Tensor,
    k_mn: torch.Tensor,
    k_ms: torch.Tensor,
    k_star_diag: torch.Tensor,
    offsets: list[int],
    nv: NoiseValues,
    jitter: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Collapsed-bound posterior latent means and variances (without class means).

    Returns:
        ``(mean, var)``.  # shape: (T, C) each
    """
    chol_m, _, chol_b, b = _sparse_factors(k_mm, k_mn, offsets, nv, jitter)
    v_star = torch.linalg.solve_triangular(chol_m, k_ms, upper=False)  # shape: (M, T)
    coef = torch.cholesky_solve(b[..., None], chol_b)  # shape: (C, M, 1)
    mean = v_star.transpose(0, 1) @ coef.squeeze(-1).transpose(0, 1)  # shape: (T, C)
    base = k_star_diag - v_star.square().sum(0)
    variances = []
    for c in range(chol_b.shape[0]):
        t = torch.linalg.solve_triangular(chol_b[c], v_star, upper=False)
        variances.append(base + t.square().sum(0))
    return mean, torch.stack(variances, -1).clamp_min(0.0)

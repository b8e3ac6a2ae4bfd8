"""Randomized truncated SVD (Halko, Martinsson & Tropp 2011)."""

from __future__ import annotations

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_finite, check_positive_int

__all__ = ["randomized_svd"]


def randomized_svd(
    a: torch.Tensor,
    rank: int,
    *,
    oversample: int = 10,
    power_iterations: int = 5,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    r"""Leading ``rank`` singular triplets of ``a`` by a randomized range finder.

    With a Gaussian test matrix :math:`\Omega \in \mathbb{R}^{n \times (r + p)}` and ``q``
    power iterations (re-orthonormalised each time),

    .. math::

        Q = \operatorname{orth}\big((A A^\top)^q A \Omega\big), \qquad
        Q^\top A = \tilde U S V^\top, \qquad A \approx (Q \tilde U) S V^\top .

    When :math:`r + p \ge \min(m, n)` the range finder spans the whole row space and the result
    is the exact truncated SVD.

    Args:
        a: The matrix. # shape: (m, n)
        rank: Number of triplets ``r`` (at most ``min(m, n)``).
        oversample: Extra test vectors ``p``.
        power_iterations: Number of power iterations ``q``.
        generator: Random generator of the test matrix.

    Returns:
        ``(U, S, Vh)`` with singular values descending. # shapes: (m, r), (r,), (r, n)

    Raises:
        ShapeError: If ``a`` is not a matrix.
        InputDataError: If ``rank > min(m, n)`` or ``a`` is not finite.
    """
    if a.dim() != 2:
        raise ShapeError(expected_got("randomized_svd(a)", "a matrix", tuple(a.shape)))
    rank = check_positive_int(rank, "randomized_svd.rank")
    check_positive_int(oversample, "randomized_svd.oversample", minimum=0)
    check_positive_int(power_iterations, "randomized_svd.power_iterations", minimum=0)
    m, n = a.shape
    if rank > min(m, n):
        raise InputDataError(
            expected_got("randomized_svd.rank", f"at most min(m, n) = {min(m, n)}", rank)
        )
    check_finite(a, "randomized_svd(a)")
    k = min(rank + oversample, min(m, n))
    omega = torch.randn(n, k, generator=generator, dtype=a.dtype, device="cpu").to(a.device)
    q, _ = torch.linalg.qr(a @ omega)
    for _ in range(power_iterations):
        z, _ = torch.linalg.qr(a.mT @ q)
        q, _ = torch.linalg.qr(a @ z)
    u_small, s, vh = torch.linalg.svd(q.mT @ a, full_matrices=False)
    return (q @ u_small)[:, :rank], s[:rank], vh[:rank]

"""Greedy (pivoted-Cholesky) choice of inducing inputs among the training inputs."""

from __future__ import annotations

import math

import gpytorch
import torch

from gpext.errors import InputDataError, expected_got
from gpext.utils import check_positive_int

__all__ = ["greedy_inducing_subset"]


def greedy_inducing_subset(
    x: torch.Tensor,
    kernel: gpytorch.kernels.Kernel,
    num_inducing: int,
    *,
    max_points: int = 2000,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    r"""Indices of ``M`` data points chosen greedily to shrink the Nyström residual.

    With :math:`R_m = K_{XX} - K_{XZ_m} K_{Z_m Z_m}^{-1} K_{Z_m X}` the residual after ``m``
    points, the next point maximises the reduction of its trace,

    .. math::

        i_{m+1} = \arg\max_i \frac{\| R_m[:, i] \|^2}{R_m[i, i]},
        \qquad R_{m+1} = R_m - \frac{R_m[:, i] R_m[i, :]}{R_m[i, i]}.

    This keeps GWI's inducing points a subset of the data (003 section 2) while making the
    residual :math:`k - k_{xZ}K_{ZZ}^{-1}k_{Zx}` of the variational kernel, which :math:`L`
    cannot reduce, small where the data lie.  Cost :math:`O(N^2 M)`; larger sets are first
    reduced to a seeded random subset of ``max_points`` candidates.

    Args:
        x: Candidate inputs. # shape: (N, D)
        kernel: The (frozen) prior kernel; for a batched kernel the first member decides.
        num_inducing: ``M`` (at most ``N``).
        max_points: Candidate cap.
        generator: Random generator of the candidate subset.

    Returns:
        Distinct indices into ``x``. # shape: (M,)

    Example:
        >>> import gpytorch, torch
        >>> from gpext.models import greedy_inducing_subset
        >>> train_x = torch.randn(200, 2)
        >>> kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        >>> idx = greedy_inducing_subset(train_x, kernel, 16)
        >>> idx.shape
        torch.Size([16])
    """
    n = x.shape[0]
    cand = torch.arange(n, device=x.device)
    if n > max_points:
        cand = torch.randperm(n, generator=generator)[:max_points].to(x.device)
    nc = cand.numel()
    m = min(check_positive_int(num_inducing, "num_inducing"), nc)
    with torch.no_grad():
        resid = kernel(x[cand]).to_dense().detach()
        resid = resid.reshape(-1, nc, nc)[0].clone()  # shape: (N_c, N_c)
        tiny = 1e-12 * float(resid.diagonal().max().clamp_min(1e-30))
        free = torch.ones(nc, dtype=torch.bool, device=x.device)
        chosen = []
        sq = (resid**2).sum(0)  # squared column norms of the residual
        for _ in range(m):
            d = resid.diagonal()
            score = sq / d.clamp_min(tiny)
            score = torch.where(free & (d > tiny), score, torch.full_like(score, -1.0))
            i = int(score.argmax())
            if float(score[i]) < 0:  # residual exhausted: fill up with the remaining points
                chosen.extend(torch.nonzero(free).flatten()[: m - len(chosen)].tolist())
                break
            chosen.append(i)
            free[i] = False
            col = resid[:, i] / d[i].sqrt()
            rc = resid @ col
            # ||(R - c c^T)[:, k]||^2 = ||R[:, k]||^2 - 2 c_k (R c)_k + c_k^2 ||c||^2
            sq = (sq - 2 * col * rc + col**2 * (col @ col)).clamp_min(0)
            resid.addr_(col, col, alpha=-1.0)
    return cand[torch.tensor(chosen, dtype=torch.long, device=x.device)]


_INDUCING_CHOICES = ("greedy", "random")


def _check_inducing_choice(inducing: str) -> None:
    """Raise before any fitting if ``inducing`` is not a known way of picking ``Z``."""
    if inducing not in _INDUCING_CHOICES:
        raise InputDataError(expected_got("inducing", "'greedy' or 'random'", repr(inducing)))


def _inducing_indices(
    x: torch.Tensor,
    kernel: gpytorch.kernels.Kernel,
    num_inducing: int | None,
    inducing: str,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Indices of the data points used as ``Z`` (default ``M = ceil(sqrt(N))``)."""
    _check_inducing_choice(inducing)
    n = x.shape[0]
    m = num_inducing or math.ceil(math.sqrt(n))
    if inducing == "greedy":
        return greedy_inducing_subset(x, kernel, m, generator=generator)
    return torch.randperm(n, generator=generator)[: min(m, n)].to(x.device)

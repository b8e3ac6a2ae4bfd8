"""Closed-form perturbed MAP solutions of Bayesian linear regression (001 Eq. 8).

The particles of variational bootstrap for a linear model ``f(x) = phi(x)^T w`` are the exact
minimisers of the perturbed, anchored least-squares problems of 001 Eq. (7).  With ``C`` outputs
and per-point, per-output noise (the Dirichlet noise of 001 Eq. 11) each output has its own
system matrix ``A_c``; all ``K`` particles of an output share its one Cholesky factor.

Three ways to form and factorise the systems, chosen by ``method``:

* ``"primal"``: ``A_c = Phi^T S_c^{-1} Phi + I / alpha^2`` (``D x D``).  The Gram matrices are
  built without a pass over the data per output where possible: rows with identical noise
  vectors form groups whose Gram matrices are combined per output when they fit in
  ``gram_memory`` bytes (one pass, ``N D^2`` flops: homoscedastic regression, binary Dirichlet);
  otherwise ``A_c = b_c Phi^T Phi + Phi_R^T diag(r) Phi_R`` with ``b_c`` the most common
  precision of output ``c`` and ``R`` the rows that differ from it (Dirichlet: the rows of
  class ``c``), which costs ``2 N D^2`` flops for all outputs together instead of ``C N D^2``.
* ``"dual"``: the ``N x N`` form ``w = w~ + alpha^2 Phi^T (alpha^2 Phi Phi^T + S_c)^{-1}
  (y~ - Phi w~)``, cheaper when ``N < D``.
* ``"auto"``: ``"dual"`` when ``N < D``, else ``"primal"``.
"""

from __future__ import annotations

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import (
    as_float_tensor,
    check_finite,
    check_float_dtype,
    check_positive_int,
    progress_bar,
    safe_cholesky,
)
from gpext.utils.validation import as_fit_input

__all__ = ["solve_perturbed_map"]

METHODS = ("auto", "primal", "dual")


def _cholesky(a: torch.Tensor, what: str, jitter: float | None) -> torch.Tensor:
    """Cholesky factor; on failure the relative jitter ``jitter`` (default from the settings).

    :func:`gpext.utils.safe_cholesky` with a zero first jitter, then ``jitter`` times the mean
    diagonal (one retry), or, by default, linear_operator's ``cholesky_jitter`` (1e-8 float64,
    1e-6 float32) times it, then 100 and 10^4 times that (each retry warns).  The three x100
    steps are this solver's own ladder, so ``cholesky_max_tries`` (calibrated for x10 steps,
    and set to 6 by ``import botorch``) does not lengthen it.
    """
    return safe_cholesky(
        a,
        name=f"solve_perturbed_map: the {what} matrix",
        max_tries=1 if jitter is not None else 3,
        growth=100.0,
        relative_floor=None if jitter is None else float(jitter),
        hint="Use float64, fewer features or a larger noise.",
    )


def _primal_systems(phi, prec, prior_prec, gram_memory):
    """Yield ``(c, A_c)`` for every output ``c``."""
    n, d = phi.shape
    c_out = prec.shape[1]
    eye = torch.eye(d, dtype=phi.dtype, device=phi.device)
    groups, inverse = torch.unique(prec, dim=0, return_inverse=True)
    if groups.shape[0] * d * d * phi.element_size() <= gram_memory:
        grams = phi.new_zeros(groups.shape[0], d, d)
        for g in range(groups.shape[0]):
            rows = phi[inverse == g]
            grams[g] = rows.T @ rows
        for c in range(c_out):
            yield c, torch.einsum("g,gij->ij", groups[:, c], grams) + prior_prec * eye
        return
    gram = phi.T @ phi
    for c in range(c_out):
        p = prec[:, c]
        values, counts = torch.unique(p, return_counts=True)
        base = values[counts.argmax()]
        dev = p - base
        rows = dev.nonzero().squeeze(-1)
        a = base * gram + prior_prec * eye
        if rows.numel():
            sub = phi[rows]
            a = a + sub.T @ (dev[rows, None] * sub)
        yield c, a


def solve_perturbed_map(
    features: torch.Tensor,
    targets: torch.Tensor,
    noise: torch.Tensor,
    prior_variance: float,
    num_particles: int,
    *,
    anchors: torch.Tensor | None = None,
    perturbations: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = "auto",
    gram_memory: int = 2**30,
    jitter: float | None = None,
    show_progress: bool | None = None,
) -> torch.Tensor:
    r"""Draw ``K`` variational-bootstrap particles per output of a linear-Gaussian model.

    Particle ``k`` of output ``c`` minimises 001 Eq. (7) for ``f(x) = phi(x)^T w``; its closed
    form is 001 Eq. (8) with per-point noise (Eq. 13):

    .. math::
        \hat{\mathbf{w}}_c^{(k)} = \mathbf{A}_c^{-1}\Big(\boldsymbol{\Phi}^\top \mathbf{S}_c^{-1}
        (\mathbf{y}_c + \boldsymbol{\varepsilon}^{(k)}_c) + \frac{1}{\alpha^2}
        \tilde{\mathbf{w}}^{(k)}_c\Big), \quad
        \mathbf{A}_c = \boldsymbol{\Phi}^\top \mathbf{S}_c^{-1} \boldsymbol{\Phi}
        + \frac{1}{\alpha^2}\mathbf{I},

    with :math:`\boldsymbol{\varepsilon}_c^{(k)} \sim \mathcal{N}(0, \mathbf{S}_c)` and
    :math:`\tilde{\mathbf{w}}_c^{(k)} \sim \mathcal{N}(0, \alpha^2 \mathbf{I})`, so that the
    particles are exact draws from the posterior (001 Eq. 9).

    Args:
        features: Design matrix ``Phi`` (rows are ``phi(x_i)``).  # shape: (N, D)
        targets: Regression targets, one column per output.  # shape: (N, C)
        noise: Noise variances ``S_c`` per point and output, positive.  # shape: (N, C)
        prior_variance: Prior variance ``alpha^2`` of the weights.
        num_particles: Number of particles ``K`` per output.
        anchors: Prior draws ``w~``; drawn from ``N(0, alpha^2 I)`` when ``None``.
            # shape: (K, C, D)
        perturbations: Label perturbations ``epsilon``; drawn from ``N(0, S)`` when ``None``.
            # shape: (K, N, C)
        generator: Random generator for the draws.
        method: ``"auto"``, ``"primal"`` or ``"dual"`` (see the module docstring).
        gram_memory: Bytes allowed for cached group Gram matrices in the primal method.
        jitter: Relative diagonal jitter tried when a Cholesky factorisation fails (default:
            ``linear_operator.settings.cholesky_jitter``, ``1e-8`` in float64 and ``1e-6`` in
            float32, then 100x and 10^4x that, each with a :class:`NumericalWarning`).
        show_progress: Progress bar over the outputs.

    Returns:
        The particles' weights.  # shape: (K, C, D)

    Raises:
        ShapeError: If the shapes disagree.
        InputDataError: If the noise or prior variance is not positive, or ``method`` unknown.
        NumericalError: If a factorisation fails even with jitter.

    Example:
        >>> phi = torch.randn(50, 8, dtype=torch.float64)
        >>> y = torch.randn(50, 1, dtype=torch.float64)
        >>> w = solve_perturbed_map(phi, y, torch.full_like(y, 0.1), 1.0, 20)
        >>> w.shape
        torch.Size([20, 1, 8])
    """
    k = check_positive_int(num_particles, "solve_perturbed_map.num_particles")
    if method not in METHODS:
        raise InputDataError(
            expected_got("solve_perturbed_map.method", f"one of {METHODS}", repr(method))
        )
    # one input contract: numpy / sequences / integers converted, the features' float dtype kept
    if isinstance(features, torch.Tensor) and features.is_floating_point():
        check_float_dtype(features.dtype, "solve_perturbed_map.features.dtype")
    features = as_fit_input(features, "solve_perturbed_map.features")
    targets = as_float_tensor(targets, "solve_perturbed_map.targets", dtype=features.dtype)
    noise = as_float_tensor(noise, "solve_perturbed_map.noise", dtype=features.dtype)
    targets, noise = targets.to(features.device), noise.to(features.device)
    if features.dim() == 2 and features.shape[0] == 0:
        raise InputDataError(
            expected_got("solve_perturbed_map.features", "at least one row", tuple(features.shape))
        )
    if features.dim() != 2 or targets.dim() != 2 or targets.shape[0] != features.shape[0]:
        raise ShapeError(
            expected_got(
                "solve_perturbed_map features/targets",
                "shapes (N, D) and (N, C)",
                f"{tuple(features.shape)} and {tuple(targets.shape)}",
            )
        )
    n, d = features.shape
    c_out = targets.shape[1]
    if noise.shape != targets.shape:
        raise ShapeError(
            expected_got(
                "solve_perturbed_map.noise", f"shape {tuple(targets.shape)}", tuple(noise.shape)
            )
        )
    check_finite(features, "solve_perturbed_map.features")
    check_finite(targets, "solve_perturbed_map.targets")
    if not bool((noise > 0).all()) or not bool(torch.isfinite(noise).all()):
        raise InputDataError(
            expected_got(
                "solve_perturbed_map.noise",
                "finite positive variances",
                "zero, negative or non-finite entries",
            )
        )
    if not prior_variance > 0:
        raise InputDataError(
            expected_got("solve_perturbed_map.prior_variance", "a positive number", prior_variance)
        )
    alpha2 = float(prior_variance)
    if anchors is None:
        anchors = torch.randn(k, c_out, d, generator=generator, dtype=features.dtype).to(
            features.device
        )
        anchors = anchors * alpha2**0.5
    elif anchors.shape != (k, c_out, d):
        raise ShapeError(
            expected_got(
                "solve_perturbed_map.anchors", f"shape {(k, c_out, d)}", tuple(anchors.shape)
            )
        )
    if perturbations is None:
        perturbations = torch.randn(k, n, c_out, generator=generator, dtype=features.dtype)
        perturbations = perturbations.to(features.device) * noise.sqrt()
    elif perturbations.shape != (k, n, c_out):
        raise ShapeError(
            expected_got(
                "solve_perturbed_map.perturbations",
                f"shape {(k, n, c_out)}",
                tuple(perturbations.shape),
            )
        )
    if method == "auto":
        method = "dual" if n < d else "primal"
    out = features.new_empty(k, c_out, d)
    if method == "primal":
        prec = noise.reciprocal()
        systems = _primal_systems(features, prec, 1.0 / alpha2, gram_memory)
        for c, a in progress_bar(systems, total=c_out, desc="vboot rff", show=show_progress):
            chol = _cholesky(a, "primal system", jitter)
            y_pert = targets[:, c] + perturbations[:, :, c]  # shape: (K, N)
            rhs = (y_pert * prec[:, c]) @ features + anchors[:, c] / alpha2  # shape: (K, D)
            out[:, c] = torch.cholesky_solve(rhs.T, chol).T
        return out
    kernel = alpha2 * (features @ features.T)  # shape: (N, N)
    for c in progress_bar(range(c_out), desc="vboot rff (dual)", show=show_progress):
        chol = _cholesky(kernel + torch.diag(noise[:, c]), "dual kernel", jitter)
        resid = targets[:, c] + perturbations[:, :, c] - anchors[:, c] @ features.T  # shape: (K, N)
        out[:, c] = anchors[:, c] + alpha2 * (torch.cholesky_solve(resid.T, chol).T @ features)
    return out

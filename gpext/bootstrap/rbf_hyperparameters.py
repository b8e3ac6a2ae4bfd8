"""RBF-kernel hyperparameters fitted once, by an exact GP on a data subset, before bootstrapping."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import gpytorch
import torch
from linear_operator.utils.errors import NanError, NotPSDError

from gpext.errors import InputDataError, NumericalError, NumericalWarning, ShapeError, expected_got
from gpext.utils import check_finite, check_positive_int

__all__ = ["RBFHyperparameters", "fit_rbf_hyperparameters"]


@dataclass
class RBFHyperparameters:
    """Hyperparameters of ``m_c + f_c``, ``f_c ~ GP(0, s * RBF_ell)`` shared by ``C`` outputs.

    Attributes:
        lengthscale: ARD lengthscales ``ell``.  # shape: (d,)
        outputscale: Prior variance ``s`` of the latent functions (``alpha^2`` of 001 Eq. 4).
        mean: Constant prior mean per output.  # shape: (C,)
        noise: Gaussian noise variance (``None`` when the noise was given per point).
    """

    lengthscale: torch.Tensor
    outputscale: float
    mean: torch.Tensor
    noise: float | None = None


class _SharedKernelGP(gpytorch.models.ExactGP):
    """``C`` exact GPs with one shared ARD RBF kernel and one constant mean per output."""

    def __init__(self, x, y, likelihood):  # x: (C, m, d), y: (C, m)
        super().__init__(x, y, likelihood)
        c = y.shape[0]
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size([c]))
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1])
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def fit_rbf_hyperparameters(
    x: torch.Tensor,
    targets: torch.Tensor,
    noise: torch.Tensor | None = None,
    *,
    num_points: int = 1000,
    num_iters: int = 30,
    lr: float = 0.1,
    optimizer: str = "lbfgs",
    fallback_iters: int = 300,
    generator: torch.Generator | None = None,
) -> RBFHyperparameters:
    r"""Fit a shared ARD RBF kernel, per-output constant means and (optionally) a noise level.

    Maximises the exact log marginal likelihood of ``C`` independent GPs that share one kernel,

    .. math::
        \sum_{c=1}^C \log \mathcal{N}(\mathbf{y}_c;\ m_c \mathbf{1},\
        s K_\ell + \mathbf{S}_c),

    with L-BFGS (or Adam) on a random subset of ``num_points`` training points.  ``S_c`` is the given
    per-point noise of output ``c`` (the Dirichlet noise of 001 Eq. 11) or ``sigma^2 I`` with
    a learned ``sigma^2``.

    Args:
        x: Training inputs.  # shape: (N, d)
        targets: Targets, one column per output.  # shape: (N,) or (N, C)
        noise: Fixed per-point noise variances with the shape of ``targets``; ``None`` learns
            a single homoscedastic noise variance.
        num_points: Size of the random subset used for the fit.
        num_iters: Iterations (L-BFGS: maximum function evaluations).
        lr: Adam learning rate (ignored by L-BFGS).
        optimizer: ``"lbfgs"`` (strong-Wolfe line search) or ``"adam"``.
        fallback_iters: Adam steps (at ``lr``) of the fallback fit when L-BFGS fails.
        generator: Random generator for the subset.

    Returns:
        The fitted :class:`RBFHyperparameters`.

    Raises:
        ShapeError: If shapes disagree.
        NumericalError: If the fit produced non-finite hyperparameters even after the fallback.

    Warns:
        NumericalWarning: If the L-BFGS fit failed (a NaN loss or hyperparameter, or a failed
            Cholesky factorisation, seen on data sets of 10-20 points) and the fit was redone
            with ``fallback_iters`` Adam steps at ``lr`` from the initial values.

    Example:
        >>> x = torch.randn(100, 2, dtype=torch.float64)
        >>> hp = fit_rbf_hyperparameters(x, x[:, 0].sin(), num_iters=10)
        >>> hp.lengthscale.shape
        torch.Size([2])
    """
    num_points = check_positive_int(num_points, "fit_rbf_hyperparameters.num_points")
    num_iters = check_positive_int(num_iters, "fit_rbf_hyperparameters.num_iters")
    fallback_iters = check_positive_int(fallback_iters, "fit_rbf_hyperparameters.fallback_iters")
    if optimizer not in ("lbfgs", "adam"):
        raise InputDataError(
            expected_got("fit_rbf_hyperparameters.optimizer", "'lbfgs' or 'adam'", repr(optimizer))
        )
    y = targets.unsqueeze(-1) if targets.dim() == 1 else targets
    if x.dim() != 2 or y.dim() != 2 or y.shape[0] != x.shape[0]:
        raise ShapeError(
            expected_got(
                "fit_rbf_hyperparameters x/targets",
                "shapes (N, d) and (N,) or (N, C)",
                f"{tuple(x.shape)} and {tuple(targets.shape)}",
            )
        )
    if noise is not None:
        noise = noise.unsqueeze(-1) if noise.dim() == 1 else noise
        if noise.shape != y.shape:
            raise ShapeError(
                expected_got(
                    "fit_rbf_hyperparameters.noise", f"shape {tuple(y.shape)}", tuple(noise.shape)
                )
            )
    check_finite(x, "fit_rbf_hyperparameters.x")
    check_finite(y, "fit_rbf_hyperparameters.targets")
    n, c = y.shape
    idx = torch.randperm(n, generator=generator)[: min(n, num_points)].to(x.device)
    xs = x[idx].expand(c, -1, -1)  # shape: (C, m, d)
    ys = y[idx].T.contiguous()  # shape: (C, m)
    hp = _fit_once(xs, ys, noise, idx, x.shape[-1], optimizer, num_iters, lr)
    if hp is None and optimizer == "lbfgs":
        # L-BFGS's line search can step into a region where the Cholesky fails or the loss is
        # NaN (seen on 10-20 point data sets); restart from the initial values with Adam.
        warnings.warn(
            "fit_rbf_hyperparameters: the L-BFGS marginal-likelihood fit produced non-finite "
            "values or a failed Cholesky factorisation; falling back to Adam from the initial "
            "hyperparameters.",
            NumericalWarning,
            stacklevel=2,
        )
        hp = _fit_once(xs, ys, noise, idx, x.shape[-1], "adam", fallback_iters, lr)
    if hp is None:
        raise NumericalError(
            f"fit_rbf_hyperparameters: the marginal-likelihood fit ({optimizer}) produced "
            "non-finite hyperparameters. Standardise the inputs, lower lr, or pass fixed "
            "hyperparameters."
        )
    return hp


def _fit_once(xs, ys, noise, idx, dim, optimizer, num_iters, lr) -> RBFHyperparameters | None:
    """One marginal-likelihood fit from the default initial values; ``None`` if it failed."""
    if noise is None:
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(xs)
    else:
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
            noise=noise[idx].T.contiguous(), learn_additional_noise=False
        ).to(xs)
    model = _SharedKernelGP(xs, ys, likelihood).to(xs)
    with torch.no_grad():
        model.mean_module.constant.copy_(ys.mean(-1))
        model.covar_module.outputscale = ys.var(-1).mean().clamp_min(1e-3)
        model.covar_module.base_kernel.lengthscale = torch.full_like(
            model.covar_module.base_kernel.lengthscale, float(dim) ** 0.5
        )
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    likelihood.train()
    params = [p for p in model.parameters() if p.requires_grad]
    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(params, lr=1.0, max_iter=num_iters, line_search_fn="strong_wolfe")
    else:
        opt = torch.optim.Adam(params, lr=lr)

    def closure():
        opt.zero_grad()
        loss = -mll(model(xs), ys).sum()
        loss.backward()
        return loss

    try:
        with gpytorch.settings.max_cholesky_size(10**5):
            if optimizer == "lbfgs":
                opt.step(closure)
            else:
                for _ in range(num_iters):
                    opt.step(closure)
    except (NotPSDError, NanError):
        return None
    kern = model.covar_module
    hp = RBFHyperparameters(
        lengthscale=kern.base_kernel.lengthscale.detach().reshape(-1).clone(),
        outputscale=float(kern.outputscale.detach()),
        mean=model.mean_module.constant.detach().reshape(-1).clone(),
        noise=None if noise is not None else float(likelihood.noise.detach()),
    )
    values = [hp.lengthscale, hp.mean, torch.tensor([hp.outputscale])]
    if hp.noise is not None:
        values.append(torch.tensor([hp.noise]))
    if not all(bool(torch.isfinite(v).all()) for v in values):
        return None
    return hp

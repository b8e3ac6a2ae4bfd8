r"""Shared machinery of the GWI models: frozen prior, training loop, temperature calibration.

GWI (003_4a6349f7433d9fd1.txt, section 2; Wild et al. 2022) fits the prior
:math:`\mathbb P = \mathcal{GP}(m_P, k)` first (by an exact GP on a subset of the data, as the
public scripts do), freezes it, and then minimises

.. math::

    \mathcal L = -\mathbb E_{\mathbb Q}[\log p(y \mid F)] + \sum_j W_2^2(\mathbb P_j, \mathbb Q_j)

over :math:`\mathbb Q` with minibatches (:class:`gpext.mlls.GWIObjective`).  A temperature
:math:`T` is picked afterwards on validation NLL, as in the public scripts: the predictive
likelihood is tempered, :math:`p_T(y_* \mid x_*) \propto p(y_* \mid x_*)^{1/T}` (for a Gaussian
predictive this multiplies its variance by :math:`T`; for class probabilities it is the usual
temperature scaling).  This calibrates the spread of :math:`\mathbb Q`, which the fixed
Nyström residual of :math:`r` keeps close to the prior's away from the inducing points.
"""

from __future__ import annotations

import copy
import math

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS as _AUTO_VALIDATION_MIN_POINTS
from gpext.fit import (
    FitResult,
    TemperatureSelection,
    build_exact_gp,
    fit_exact_gp,
    minibatch_indices,
    minimize_scalar_on_grid,
    train_loop,
)
from gpext.mlls import GWIObjective
from gpext.mlls.gwi_objective import _check_beta
from gpext.utils import check_finite, check_positive_int
from gpext.variational import WassersteinVariationalDistribution, WassersteinVariationalStrategy
from gpext.variational.wasserstein_distance import safe_cholesky

__all__ = ["GWIModel", "fit_exact_prior", "greedy_inducing_subset"]


def fit_exact_prior(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    max_points: int = 1000,
    steps: int = 100,
    lr: float = 0.1,
    ard: bool | None = None,
    num_restarts: int | None = None,
    generator: torch.Generator | None = None,
    show_progress: bool | None = None,
    return_result: bool = False,
) -> (
    tuple[gpytorch.means.Mean, gpytorch.kernels.Kernel, float]
    | tuple[gpytorch.means.Mean, gpytorch.kernels.Kernel, float, FitResult]
):
    r"""Fit GWI's prior :math:`\mathcal{GP}(m_P, k)` by an exact GP on a subset, then freeze it.

    The model is a constant mean per output plus a shared scaled RBF kernel,
    :math:`y_j = m_j + f(x) + \varepsilon_j`, :math:`f \sim \mathcal{GP}(0, s\,k_\ell)`, on a
    seeded random subset of at most ``max_points`` points.  Its hyperparameters are the MAP
    estimate of :func:`gpext.fit.fit_exact_gp` under the default priors of
    :func:`gpext.fit.build_exact_gp` (dimension-scaled lengthscales, signal and noise variances
    relative to the targets' variance), from several starts (the initial values below, then
    draws from the priors), each by L-BFGS whose line search rejects trial points where the
    Cholesky factorisation fails, with an Adam fallback when every start fails; a collapsed
    signal variance or constant predictions are reported by a
    :class:`~gpext.errors.VarianceCollapseWarning` / :class:`~gpext.errors.ConstantPredictionWarning`.
    This is the same fit as VBoot's :func:`gpext.bootstrap.fit_rbf_hyperparameters`.

    ``y`` of shape ``(N, J)`` fits ``J`` outputs with one shared kernel (the sum of their log
    marginal likelihoods, one noise variance per output), e.g. centred one-hot labels for
    classification.  Initial values of the first start: the outputs' means, the prior median
    of the outputscale (the targets' variance), noise variance ``Var(y) / 100``, and every
    lengthscale at the median pairwise distance of (up to) 200 subset points (scale-aware, and
    far closer to the optima of GWI's data sets than the lengthscale prior's median, from which
    L-BFGS tended to run up a ridge of long lengthscales and huge outputscales).

    The returned modules are fresh copies without the priors (so that an objective over a
    model that holds them, such as :class:`gpext.mlls.GWIObjective`, adds no prior terms),
    with ``requires_grad`` off.

    Args:
        x: Inputs. # shape: (N, D)
        y: Targets. # shape: (N,) or (N, J)
        max_points: Size of the random subset used for the fit.
        steps: L-BFGS iterations per start (it used to be the number of Adam steps).
        lr: Learning rate of the Adam fallback (used only if every L-BFGS start fails).
        ard: One lengthscale per input (default: when ``D <= 50``).
        num_restarts: Number of starts (``None``: 4 for subsets of at most 500 points, else 2).
        generator: Random generator for the subset and the prior draws of the restarts.
        show_progress: Progress bar.
        return_result: Also return the :class:`~gpext.fit.FitResult` of the fit.

    Returns:
        ``(mean_module, covar_module, noise_variance)``, or with ``return_result=True``
        ``(mean_module, covar_module, noise_variance, fit_result)``; the modules have
        ``requires_grad`` off, ``noise_variance`` is the mean over outputs.

    Raises:
        ShapeError: If ``x`` and ``y`` do not match.
        InputDataError: If ``x`` or ``y`` has non-finite entries.
        FitError: If every start and the fallback failed.

    Warns:
        VarianceCollapseWarning: If the signal variance collapsed into the noise.
        ConstantPredictionWarning: If the fitted GP predicts a constant on the subset.

    Example:
        >>> mean, kernel, noise = fit_exact_prior(train_x, train_y)
        >>> mean, kernel, noise, result = fit_exact_prior(train_x, train_y, return_result=True)
    """
    if x.dim() != 2 or y.shape[0] != x.shape[0] or y.dim() not in (1, 2):
        raise ShapeError(
            expected_got(
                "fit_exact_prior(x, y)",
                "x (N, D) and y (N,) or (N, J)",
                f"{tuple(x.shape)}, {tuple(y.shape)}",
            )
        )
    check_finite(x, "fit_exact_prior.x")
    check_finite(y, "fit_exact_prior.y")
    max_points = check_positive_int(max_points, "fit_exact_prior.max_points")
    steps = check_positive_int(steps, "fit_exact_prior.steps")
    if not (isinstance(lr, (int, float)) and lr > 0):
        raise InputDataError(expected_got("fit_exact_prior.lr", "a number > 0", repr(lr)))
    n, d = x.shape
    if n > max_points:
        idx = torch.randperm(n, generator=generator)[:max_points].to(x.device)
        x, y = x[idx], y[idx]
    m = x.shape[0]
    if num_restarts is None:
        num_restarts = 4 if m <= 500 else 2
    ard = d <= 50 if ard is None else ard
    model = build_exact_gp(x, y, kernel="rbf", ard=ard, priors=True, shared_noise=False)
    for _, _, prior, _, _ in model.named_priors():
        # a line-search trial point whose variance rounds to 0 lies outside the support of the
        # log-normal priors: without argument validation its log density is not finite and
        # the point is rejected, instead of a ValueError ending the whole fit
        prior._validate_args = False
        if getattr(prior, "base_dist", None) is not None:
            prior.base_dist._validate_args = False
    if m > 1:
        # first start: every lengthscale at the median pairwise distance (the old non-ARD
        # initialisation).  From the priors' medians (BoTorch-style, several times the inputs'
        # width) L-BFGS ran up a ridge of long lengthscales and outputscales of 50 to 500 times
        # Var(y) on the UCI sets (a poorer MAP optimum on boston and concrete; on energy a
        # prior so ill-conditioned that the W2 estimate failed), and a GWI prior that large
        # dominates the objective; from the median distance the fit reached lower MAP losses
        # and GWI better test NLLs on all four quick-benchmark sets
        with torch.no_grad():
            dist = torch.pdist(x[:200]).median().clamp_min(1e-3)
            model.covar_module.base_kernel.lengthscale = dist.expand_as(
                model.covar_module.base_kernel.lengthscale
            )
    result = fit_exact_gp(
        model, num_restarts=num_restarts, max_iter=steps, fallback_lr=lr, generator=generator,
        name="fit_exact_prior (GWI prior)", show_progress=show_progress,
    )  # fmt: skip
    fitted = model.covar_module
    kernel = gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(ard_num_dims=d if ard else None)
    ).to(x)
    mean = gpytorch.means.ConstantMean(batch_shape=model.mean_module.batch_shape).to(x)
    with torch.no_grad():
        kernel.base_kernel.lengthscale = fitted.base_kernel.lengthscale.detach().clone()
        kernel.outputscale = fitted.outputscale.detach().clone()
        mean.constant.copy_(model.mean_module.constant.detach())
    noise = float(model.likelihood.noise.detach().mean())
    mean.requires_grad_(False)
    kernel.requires_grad_(False)
    if return_result:
        return mean, kernel, noise, result
    return mean, kernel, noise


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
        >>> idx = greedy_inducing_subset(train_x, kernel, 64)
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


class _KernelExpansionMean(gpytorch.means.Mean):
    r"""``m_Q(x) = m_P(x) + k_m(x, C) L_C^{-T} u (+ g(x))``: a whitened kernel expansion on centres ``C``.

    .. math::

        m_Q(x) = m_P(x) + k_m(x, C)\, L_C^{-\top} u + g(x), \qquad
        L_C L_C^\top = K_{m,CC} + \delta I,

    the whitened form of :math:`k_m(x, C) K_{m,CC}^{-1} v` with :math:`v = L_C u`.  GWI lets
    :math:`m_Q` be any function (003 section 2); with the frozen prior kernel and fixed centres
    this spans the sparse-GP posterior means.  The optional network ``g`` (a
    :class:`~gpext.variational.WassersteinNetworkMean`, tanh hidden layers) adds flexibility;
    its output layer starts at zero so that the mean starts at the kernel expansion.

    Why whitened.  The expansion part ``h`` lies in the RKHS of :math:`k_m` with norm
    :math:`\|h\|_{\mathcal H} \le \|u\|`, so by the reproducing property and the Nyström
    bound :math:`k_{xC}(K_{CC} + \delta I)^{-1}k_{Cx} \le k_m(x, x)`,

    .. math::

        |m_Q(x) - m_P(x) - g(x)| \le \|u\| \sqrt{k_m(x, x)}

    everywhere, whatever the conditioning of :math:`K_{m,CC}`.  Parameterised by the values
    ``v`` at the centres instead (the implied weights :math:`K_{CC}^{-1} v`), near-duplicate
    centres make :math:`K_{CC}` numerically singular, every optimiser step on ``v`` along its
    small-eigenvalue directions is amplified by :math:`1/\lambda`, and the weights grow to
    :math:`10^7` with cancellations that hold on the data but not beyond them: the mean runs
    away outside the data (the 1-D tutorial's defect).  The whitened coordinates are the
    SVGP whitening of Hensman et al. (2015) applied to the mean.

    ``learn_centers`` / ``learn_kernel`` make the expansion adaptive: the centres become a
    parameter and ``k_m`` a trainable copy of the prior kernel (both start at the prior's, so
    the initial mean is unchanged).  This changes neither :math:`\mathbb P` (its kernel stays
    frozen) nor the covariance :math:`r` (it keeps ``k`` and the fixed ``Z``).  It matters when
    ``M`` is small for the data: the lengthscales of the exact-GP prior fit suit ``N`` points,
    and an expansion on ``M`` fixed centres with those lengthscales underfits (on concrete with
    ``M = 64`` the sparse posterior mean has a test RMSE near 7.3 against 4.9 for the exact
    GP).  The bound above holds for any centres; the centres move only through the data term,
    so they stay near the data, and the expansion decays with the kernel beyond them.

    Args:
        prior_mean: :math:`m_P`.
        kernel: The prior kernel ``k``.
        centers: Initial centres ``C``. # shape: (C, D)
        net: Optional network ``g``.
        jitter: Relative jitter :math:`\delta / \operatorname{mean}\operatorname{diag} K_{m,CC}`
            (default 1e-6 float64, as GPyTorch's
            ``variational_cholesky_jitter``, and 1e-5 float32).
        learn_centers: Whether ``C`` is trained.
        learn_kernel: Whether the expansion uses its own trainable copy of ``kernel``.
    """

    def __init__(
        self,
        prior_mean,
        kernel,
        centers: torch.Tensor,
        net: torch.nn.Module | None = None,
        jitter: float | None = None,
        learn_centers: bool = False,
        learn_kernel: bool = False,
    ):
        super().__init__()
        self.prior_mean = prior_mean
        if learn_kernel:  # a trainable copy: the prior's kernel stays frozen
            kernel = copy.deepcopy(kernel).requires_grad_(True)
        self.kernel = kernel
        self.jitter = jitter
        if learn_centers:
            self.centers = torch.nn.Parameter(centers.detach().clone())
        else:
            self.register_buffer("centers", centers.detach().clone())
        batch = prior_mean(centers[:1]).shape[:-1]
        self.whitened_values = torch.nn.Parameter(
            torch.zeros(*batch, centers.shape[-2], dtype=centers.dtype)
        )
        self.net = net
        if net is not None:
            last = [mod for mod in net.modules() if isinstance(mod, torch.nn.Linear)]
            if last:
                with torch.no_grad():
                    last[-1].weight.zero_()
                    if last[-1].bias is not None:
                        last[-1].bias.zero_()

    def _chol(self) -> torch.Tensor:
        # With a frozen kernel (GWI's prior) the factor is a constant: cache it, keyed on the
        # version counters of the kernel's parameters and the centres (in-place updates such
        # as load_state_dict bump them).
        params = list(self.kernel.parameters())
        frozen = not any(p.requires_grad for p in params) and not self.centers.requires_grad
        key = (*(p._version for p in params), self.centers._version, self.centers.dtype)
        if frozen and getattr(self, "_chol_cache", None) is not None:
            if self._chol_cache[0] == key:
                return self._chol_cache[1]
        kcc = self.kernel(self.centers).to_dense()  # shape: (*batch, C, C)
        scale = float(kcc.diagonal(dim1=-2, dim2=-1).mean().detach())
        jitter = self.jitter
        if jitter is None:  # relative; raised with a NumericalWarning if K_CC needs more
            jitter = 1e-6 if kcc.dtype == torch.float64 else 1e-5
        chol = safe_cholesky(kcc, jitter=jitter * scale, name="K_CC")
        self._chol_cache = (key, chol.detach()) if frozen else None
        return chol

    def expansion_weights(self) -> torch.Tensor:
        r"""The implied weights :math:`(K_{m,CC} + \delta I)^{-1} v = L_C^{-\top} u`. # shape: (*batch, C)"""
        w = torch.linalg.solve_triangular(
            self._chol().mT, self.whitened_values.unsqueeze(-1), upper=True
        )
        return w.squeeze(-1)

    def initialize_posterior(self, x: torch.Tensor, y: torch.Tensor, noise_variance: float) -> None:
        r"""Set ``u`` so that :math:`m_Q` is the sparse-GP (Titsias) posterior mean.

        .. math::

            u = (\sigma^2 I + A A^\top)^{-1} A (y - m_P(X)), \qquad A = L_C^{-1} K_{CX},

        with the centres ``C`` as inducing inputs: the mean that goes with the initial
        :math:`L = \operatorname{chol}((K_{CC} + K_{CX}K_{XC}/\sigma^2)^{-1})` (the values at the
        centres are :math:`v = L_C u = K_{CC}(\sigma^2 K_{CC} + K_{CX}K_{XC})^{-1}K_{CX}(y - m_P(X))`).

        Args:
            x: Training inputs. # shape: (N, D)
            y: Training targets. # shape: (N,)
            noise_variance: Observation-noise variance of the fitted prior.
        """
        with torch.no_grad():
            lcc = self._chol()  # shape: (*batch, C, C)
            kcx = self.kernel(self.centers, x).to_dense()  # shape: (*batch, C, N)
            a = torch.linalg.solve_triangular(lcc, kcx, upper=False)
            rhs = a @ (y - self.prior_mean(x)).unsqueeze(-1)  # shape: (*batch, C, 1)
            eye = torch.eye(a.shape[-2], dtype=a.dtype, device=a.device)
            chol = safe_cholesky(noise_variance * eye + a @ a.mT, jitter=0.0, name="I + A A^T")
            u = torch.cholesky_solve(rhs, chol)
            self.whitened_values.copy_(u.squeeze(-1).expand_as(self.whitened_values))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kcx = self.kernel(self.centers, x).to_dense()  # shape: (*batch, C, N)
        a = torch.linalg.solve_triangular(self._chol(), kcx, upper=False)  # L_C^{-1} K_CX
        out = self.prior_mean(x) + (self.whitened_values.unsqueeze(-2) @ a).squeeze(-2)
        if self.net is not None:
            out = out + self.net(x)
        return out


class GWIModel(gpytorch.models.ApproximateGP):
    r"""Base class of the GWI models: frozen prior, Wasserstein strategy, fit and calibration.

    The prior is :math:`\mathcal{GP}(m_P, k)` given by ``prior_mean`` and ``covar_module``;
    :math:`\mathbb Q` is built by :class:`~gpext.variational.WassersteinVariationalStrategy`.

    .. math::

        \mathcal L = -\mathbb E_{\mathbb Q}[\log p(y \mid F)] + \sum_j W_2^2(\mathbb P_j, \mathbb Q_j)

    Subclasses owe two hooks: ``_predictive_cache(likelihood, x)`` (the untempered predictive
    on ``x``) and ``_tempered_nll(cache, y, temperature) -> float`` (mean negative log
    predictive density under temperature ``T``).

    Args:
        inducing_points: Inducing inputs ``Z`` (a subset of the data). # shape: (M, D)
        covar_module: Prior kernel ``k`` (fitted and frozen beforehand).
        prior_mean: Prior mean ``m_P`` (default zero).
        mean_module: Variational mean ``m_Q`` (default an MLP).
        num_latents: Number ``J`` of independent latent functions (``None``: one).
        num_subsample: Subsample size ``N_S`` of the W2 estimator.
        learn_inducing_locations: Whether ``Z`` is trained.
        generator: Random generator of the W2 subsamples.
    """

    def __init__(
        self,
        inducing_points: torch.Tensor,
        covar_module: gpytorch.kernels.Kernel,
        *,
        prior_mean: gpytorch.means.Mean | None = None,
        mean_module: torch.nn.Module | None = None,
        num_latents: int | None = None,
        num_subsample: int = 100,
        learn_inducing_locations: bool = True,
        generator: torch.Generator | None = None,
    ):
        if not isinstance(inducing_points, torch.Tensor) or inducing_points.dim() != 2:
            raise ShapeError(
                expected_got(
                    "inducing_points",
                    "a tensor of shape (M, D)",
                    getattr(inducing_points, "shape", type(inducing_points).__name__),
                )
            )
        batch = (
            torch.Size([check_positive_int(num_latents, "num_latents")])
            if num_latents
            else torch.Size([])
        )
        dist = WassersteinVariationalDistribution(inducing_points.shape[-2], batch_shape=batch)
        strategy = WassersteinVariationalStrategy(
            self, inducing_points, dist, learn_inducing_locations,
            mean_module=mean_module, num_subsample=num_subsample,
            latent_dim=-1 if num_latents else None, generator=generator,
        )  # fmt: skip
        super().__init__(strategy)
        self.prior_mean = prior_mean if prior_mean is not None else gpytorch.means.ZeroMean()
        self.covar_module = covar_module
        self.num_latents = num_latents
        self.register_buffer("temperature", torch.tensor(1.0))

    #: Smallest training set for which :meth:`fit` holds out 10% of the rows by default.
    AUTO_VALIDATION_MIN_POINTS: int = _AUTO_VALIDATION_MIN_POINTS
    #: The default hold-out has at least this many rows (at most a quarter of the data): the
    #: temperature is a mean of squared standardised residuals, relative sd ``sqrt(2 / n)``.
    AUTO_VALIDATION_MIN_ROWS: int = 50

    #: ``(low, high)`` of the default temperature grid of :meth:`calibrate_temperature`.
    default_temperature_range: tuple[float, float] = (0.5, 100.0)

    def forward(self, x: torch.Tensor) -> MultivariateNormal:
        """The prior :math:`\\mathcal N(m_P(x), k(x, x))`. # x shape: (*batch, N, D)"""
        mean = self.prior_mean(x)
        covar = self.covar_module(x)
        if self.num_latents and mean.dim() < 2:
            mean = mean.unsqueeze(-2).expand(*mean.shape[:-1], self.num_latents, mean.shape[-1])
        return MultivariateNormal(mean, covar)

    def fit(
        self,
        likelihood: gpytorch.likelihoods.Likelihood,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        epochs: int,
        batch_size: int = 256,
        lr: float = 1e-2,
        mean_lr: float | None = None,
        beta: float = 1.0,
        x_val: torch.Tensor | None = None,
        y_val: torch.Tensor | None = None,
        validation_fraction: float | None = None,
        calibrate: bool | None = None,
        eval_every: int = 1,
        patience: int | None = None,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> FitResult:
        r"""Minimise the GWI objective with Adam on minibatches (:func:`gpext.fit.train_loop`).

        The loss of a minibatch :math:`B` is the negative :class:`~gpext.mlls.GWIObjective`,

        .. math::

            -\frac{1}{|B|}\sum_{b \in B} \mathbb E_{\mathbb Q}[\log p(y_b \mid F(x_b))]
            + \frac{\beta}{N} \sum_j \hat W^2(\mathbb P_j, \mathbb Q_j),

        over shuffled minibatches (a last one of a single point is merged into the one before).
        With a validation set, the validation NLL is checked every ``eval_every`` epochs (and
        before training: ``Q`` starts at a sparse posterior, and that state competes too) and the
        best state is restored at the end.  Afterwards subclasses check the fit for degenerate
        solutions (the regression model: constant predictions, little explained variance), and
        the problems found are recorded in the result and issued as warnings.

        Args:
            likelihood: Gaussian or robust-max likelihood (its parameters are trained too).
            x: Training inputs. # shape: (N, D)
            y: Training targets. # shape: (N,)
            epochs: Passes over the data.
            batch_size: Minibatch size.
            lr: Adam learning rate.
            mean_lr: Adam learning rate of the parameters of the mean module :math:`m_Q`
                (default ``lr``); the other parameters (``L``, the likelihood) use ``lr``.
            beta: Weight :math:`\beta \ge 0` of the W2 term (1: 003's objective; ``N`` is the
                public scripts' weighting; 0: the expected log-likelihood alone).
            x_val: Optional validation inputs. # shape: (N_val, D)
            y_val: Optional validation targets. # shape: (N_val,)
            validation_fraction: Without ``x_val``, hold out this seeded random fraction of
                ``(x, y)`` as the validation set (in ``[0, 0.5]``).  ``None`` (default): 0.1,
                but at least :attr:`AUTO_VALIDATION_MIN_ROWS` rows, when there are at least
                :attr:`AUTO_VALIDATION_MIN_POINTS` training rows and no ``x_val``; else 0.
                Such a hold-out only calibrates the temperature (no early stopping on it).  The model's frozen prior and inducing inputs, built
                from all rows by ``from_data``, are kept; only ``Q`` is trained on the rest.
            calibrate: After training, pick the predictive temperature on the validation set
                (:meth:`calibrate_temperature`).  ``None`` (default): whenever there is a
                validation set.  Without one the temperature stays at its current value; with
                the default ``T = 1`` the regression model counts the Nystrom residual twice
                (see ``default_temperature_range``) and is under-confident: on boston splits 0-1 and concrete
                split 0 with ``epochs=100`` every test point fell inside the central 95%
                interval.
            eval_every: Validation period in epochs.
            patience: Stop after this many validation checks without improvement (``None``:
                train all ``epochs``).
            generator: Random generator for the shuffling.
            show_progress: Progress bar.

        Returns:
            A :class:`~gpext.fit.FitResult`: ``losses`` (per epoch, the mean minibatch negative
            objective), ``history["w2"]`` (per epoch, the mean minibatch W2 estimate, without
            ``beta``), and with validation data ``validation_losses`` (the validation NLL),
            ``validation_steps`` (the epoch of each check; 0 is the initial state) and
            ``best_step`` (the epoch whose state was restored).

        Raises:
            ShapeError: If ``x`` and ``y`` do not match.
            InputDataError: If ``x``, ``y`` (or the validation data) have NaN or infinite
                entries, if only one of ``x_val``, ``y_val`` is given, ``mean_lr < 0`` or
                ``beta`` is not a finite number ``>= 0``.
            FitError: If the loss or a parameter became non-finite (the last finite state is
                restored first).

        Warns:
            ConstantPredictionWarning: The regression model predicts a constant on the
                training inputs.
            VarianceCollapseWarning: The regression model explains little of the training
                targets' variance.
        """
        epochs = check_positive_int(epochs, "epochs")
        batch_size = check_positive_int(batch_size, "batch_size")
        eval_every = check_positive_int(eval_every, "eval_every")
        if mean_lr is not None and not (isinstance(mean_lr, (int, float)) and mean_lr >= 0):
            raise InputDataError(expected_got("mean_lr", "a learning rate >= 0 or None", mean_lr))
        beta = _check_beta(beta, f"{type(self).__name__}.fit: beta")
        if x.dim() != 2 or y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ShapeError(
                expected_got(
                    "fit(x, y)", "x (N, D) and y (N,)", f"{tuple(x.shape)}, {tuple(y.shape)}"
                )
            )
        if (x_val is None) != (y_val is None):
            raise InputDataError(
                "GWIModel.fit: expected both x_val and y_val or neither, got one of them."
            )
        auto_split = validation_fraction is None
        if validation_fraction is None:
            auto = x_val is None and x.shape[0] >= self.AUTO_VALIDATION_MIN_POINTS
            validation_fraction = 0.1 if auto else 0.0
        if not (isinstance(validation_fraction, (int, float)) and 0 <= validation_fraction <= 0.5):
            raise InputDataError(
                expected_got(f"{type(self).__name__}.fit: validation_fraction",
                             "a number in [0, 0.5] or None", validation_fraction)
            )  # fmt: skip
        if validation_fraction > 0 and x_val is not None:
            raise InputDataError(
                expected_got(f"{type(self).__name__}.fit: validation_fraction",
                             "0 or None when x_val and y_val are given", validation_fraction)
            )  # fmt: skip
        # checked before any parameter moves: a NaN target used to fill the model with NaN
        check_finite(x, f"{type(self).__name__}.fit: x")
        y = self._check_targets(y, f"{type(self).__name__}.fit: y")
        if x_val is not None:
            if x_val.dim() != 2 or y_val.dim() != 1 or y_val.shape[0] != x_val.shape[0]:
                raise ShapeError(
                    expected_got(
                        "fit(x_val, y_val)",
                        "x_val (N_val, D) and y_val (N_val,)",
                        f"{tuple(x_val.shape)}, {tuple(y_val.shape)}",
                    )
                )
            check_finite(x_val, f"{type(self).__name__}.fit: x_val")
            y_val = self._check_targets(y_val, f"{type(self).__name__}.fit: y_val")
        n_val = int(round(float(validation_fraction) * x.shape[0]))
        if auto_split and n_val > 0:  # the temperature's relative sd is sqrt(2 / n_val)
            n_val = max(n_val, min(self.AUTO_VALIDATION_MIN_ROWS, x.shape[0] // 4))
        if n_val > 0:
            perm = torch.randperm(x.shape[0], generator=generator).to(x.device)
            x_val, y_val = x[perm[:n_val]], y[perm[:n_val]]
            x, y = x[perm[n_val:]], y[perm[n_val:]]
        n = x.shape[0]
        mll = GWIObjective(likelihood, self, num_data=n, beta=beta)
        mean_ids = {id(p) for p in self.variational_strategy.mean_module.parameters()}
        params = [p for p in (*self.parameters(), *likelihood.parameters()) if p.requires_grad]
        groups = [{"params": [p for p in params if id(p) not in mean_ids], "lr": lr}]
        mean_params = [p for p in params if id(p) in mean_ids]
        if mean_params:
            groups.append({"params": mean_params, "lr": lr if mean_lr is None else mean_lr})
        opt = torch.optim.Adam(groups)
        # the W2 estimate of every minibatch, summed per epoch (a new epoch starts in batches)
        w2_sums: list[torch.Tensor] = []
        w2_counts: list[int] = []

        def batches(epoch: int) -> list[torch.Tensor]:
            w2_sums.append(torch.zeros((), dtype=torch.float64, device=x.device))
            w2_counts.append(0)
            return minibatch_indices(n, batch_size, generator=generator, device=x.device,
                                     min_size=2)  # fmt: skip

        def loss_fn(idx: torch.Tensor) -> torch.Tensor:
            loss = -mll(self(x[idx]), y[idx])
            w2 = self.variational_strategy.kl_divergence().detach()
            w2_sums[-1] = w2_sums[-1] + w2.to(torch.float64).sum()
            w2_counts[-1] += 1
            return loss

        validation = None
        # an automatic hold-out only calibrates the temperature: choosing the epoch on the same
        # rows would bias it low (the restored state is the one those rows liked best)
        if x_val is not None and n_val == 0:
            validation = lambda: self._validation_nll(likelihood, x_val, y_val, 1.0)  # noqa: E731
        result = train_loop(
            loss_fn, opt, modules=[self, likelihood], epochs=epochs, batches=batches,
            validation=validation, eval_every=eval_every, patience=patience,
            validate_initial=True, show_progress=show_progress, desc=f"{type(self).__name__}.fit",
        )  # fmt: skip
        result.history["w2"] = [
            float(total) / count for total, count in zip(w2_sums, w2_counts) if count
        ][: len(result.losses)]
        self.eval()
        likelihood.eval()
        self._fitted = True
        if calibrate is None:
            calibrate = x_val is not None
        if calibrate:
            if x_val is None:
                raise InputDataError(
                    expected_got(f"{type(self).__name__}.fit: calibrate",
                                 "False or None without validation data", calibrate)
                )  # fmt: skip
            self.calibrate_temperature(likelihood, x_val, y_val)
        self._check_fit(likelihood, x, y, result)
        return result

    def _check_targets(self, y: torch.Tensor, name: str) -> torch.Tensor:
        """Validate training / validation targets (finite values; subclasses add more)."""
        return check_finite(y, name)

    def _check_fit(self, likelihood, x: torch.Tensor, y: torch.Tensor, result: FitResult) -> None:
        """Degenerate-fit checks after :meth:`fit` (none by default); record into ``result``."""

    def _validation_nll(self, likelihood, x, y, temperature: float) -> float:
        self.eval()
        likelihood.eval()
        with torch.no_grad():
            return self._tempered_nll(self._predictive_cache(likelihood, x), y, temperature)

    def _predictive_cache(self, likelihood, x: torch.Tensor):
        raise NotImplementedError

    def _tempered_nll(self, cache, y: torch.Tensor, temperature: float) -> float:
        raise NotImplementedError

    def select_temperature(
        self,
        likelihood: gpytorch.likelihoods.Likelihood,
        x_val: torch.Tensor,
        y_val: torch.Tensor,
        temperatures: torch.Tensor | None = None,
    ) -> TemperatureSelection:
        r"""Pick the likelihood temperature :math:`T` on a validation split and store it.

        The tempered predictive is :math:`p_T(y_* \mid x_*) \propto p(y_* \mid x_*)^{1/T}`; ``T`` is
        the grid value (default 31 log-spaced values in ``default_temperature_range``) with the
        lowest validation NLL, refined by a golden-section search between its grid neighbours
        (so it never leaves the grid's range).  The classification default does not sharpen by
        more than ``T = 0.5``: on a small validation split that the model already separates, the
        validation NLL keeps falling as ``T -> 0``, and a tiny ``T`` makes test predictions
        arbitrarily overconfident (probabilities far below the robust-max floor
        ``eps / (J - 1)``).  Pass explicit ``temperatures`` to search elsewhere.  The same API
        as :meth:`gpext.subspace.SubspaceModel.select_temperature`; nothing is refitted (the
        temperature only acts on the predictive).

        Args:
            likelihood: The trained likelihood.
            x_val: Validation inputs. # shape: (N_val, D)
            y_val: Validation targets. # shape: (N_val,)
            temperatures: Candidate temperatures (positive).

        Returns:
            A :class:`~gpext.fit.TemperatureSelection`: the chosen ``temperature`` (also in
            ``self.temperature``), ``samples=None`` and the held-out mean log predictive
            density of every grid value in ``scores``.

        Raises:
            InputDataError: If a temperature is not positive.
        """
        if not isinstance(x_val, torch.Tensor):
            raise InputTypeError(expected_got("x_val", "a torch.Tensor", type(x_val).__name__))
        if temperatures is None:
            lo, hi = self.default_temperature_range
            temperatures = torch.logspace(math.log10(lo), math.log10(hi), 31)
        grid = torch.as_tensor(temperatures, dtype=torch.float64).flatten()
        if grid.numel() == 0 or not bool((grid > 0).all()) or not bool(grid.isfinite().all()):
            raise InputDataError(
                expected_got(f"{type(self).__name__}.select_temperature.temperatures",
                             "one or more positive finite temperatures", grid.tolist())
            )  # fmt: skip
        self.eval()
        likelihood.eval()
        with torch.no_grad():
            cache = self._predictive_cache(likelihood, x_val)
            f = lambda lt: self._tempered_nll(cache, y_val, math.exp(lt))  # noqa: E731
            t = math.exp(
                minimize_scalar_on_grid(f, [math.log(float(t)) for t in grid], iterations=30)[0]
            )
            scores = {float(g): -f(math.log(float(g))) for g in grid}
        self.temperature.fill_(t)
        return TemperatureSelection(t, None, scores)

    def calibrate_temperature(
        self,
        likelihood: gpytorch.likelihoods.Likelihood,
        x_val: torch.Tensor,
        y_val: torch.Tensor,
        grid: torch.Tensor | None = None,
    ) -> float:
        """:meth:`select_temperature`, returning only the chosen temperature.

        Args:
            likelihood: The trained likelihood.
            x_val: Validation inputs. # shape: (N_val, D)
            y_val: Validation targets. # shape: (N_val,)
            grid: Candidate temperatures (positive).

        Returns:
            The chosen temperature (also stored in ``self.temperature``).
        """
        return self.select_temperature(likelihood, x_val, y_val, grid).temperature

    def _check_fitted(self) -> None:
        if not self.variational_strategy.variational_params_initialized.item():
            raise NotFittedError(
                f"{type(self).__name__}: call fit() (or initialise) before predicting."
            )

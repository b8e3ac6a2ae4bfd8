r"""One exact-GP hyperparameter fit for every gpext model that needs one.

MAP estimation of the hyperparameters of an exact GP under default priors that scale with the
input dimension (in the spirit of BoTorch's ``SingleTaskGP`` defaults, after Hvarfner et al.
2024), from several starts (the default initial values, then draws from the priors), each by
:func:`gpext.fit.minimize_lbfgs` (failed factorisations are rejected trial points), with an
Adam fallback when every start fails.  The fitted model is checked for a collapsed signal
variance and for constant predictions.
"""

from __future__ import annotations

import copy
import math
import time
import warnings

import gpytorch
import torch
from gpytorch.priors import LogNormalPrior
from linear_operator.utils.warnings import NumericalWarning as LinearOperatorNumericalWarning

from gpext.errors import (
    ConvergenceWarning,
    FitError,
    GpextError,
    InputDataError,
    InputTypeError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.fit.checks import MIN_CHECK_POINTS, check_heldout, exact_gp_loo
from gpext.fit.diagnostics import check_predictions_vary, check_signal_to_noise
from gpext.fit.fit_result import FitResult, RestartRecord, StopReason
from gpext.fit.lbfgs import minimize_lbfgs
from gpext.fit.standardize import Standardizer
from gpext.fit.train_loop import train_loop
from gpext.utils import check_finite, check_learning_rate, check_positive_int
from gpext.utils.validation import as_fit_input

__all__ = [
    "MultiOutputExactGP",
    "OriginalUnitsMultivariateNormal",
    "StandardizedGaussianLikelihood",
    "build_exact_gp",
    "diagnose_exact_gp",
    "fit_exact_gp",
    "lengthscale_prior",
    "log_prior",
    "reference_heldout_nll",
]

KERNELS = ("rbf", "matern12", "matern32", "matern52")
#: Largest single-output training set on which :func:`fit_exact_gp` checks its closed-form
#: leave-one-out predictions (:func:`gpext.fit.checks.exact_gp_loo`, one more O(N^3) solve).
LOO_CHECK_MAX_POINTS = 5000
#: Largest training set on which :func:`reference_heldout_nll` fits its reference exact GP.
REFERENCE_MAX_POINTS = 1000


def lengthscale_prior(x: torch.Tensor, ard: bool = True) -> LogNormalPrior:
    r"""Dimension-scaled log-normal lengthscale prior, relative to the spread of each input.

    .. math::
        \log \ell_j \sim \mathcal N\big(\sqrt 2 + \tfrac12 \log D + \log w_j,\ 3\big),

    where :math:`w_j = \sqrt{12}\,\operatorname{sd}(x_{\cdot j})` is the width of a uniform
    variable with the spread of input :math:`j` (1 on the unit cube, where this is BoTorch's
    default prior) and :math:`D` the input dimension.

    Args:
        x: Training inputs.  # shape: (N, D)
        ard: One lengthscale per input (``False``: one shared, with the mean width).

    Returns:
        A :class:`gpytorch.priors.LogNormalPrior` with batch shape ``(1, D)`` (or ``()``).
    """
    d = x.shape[-1]
    width = (x.std(0) * math.sqrt(12.0)) if x.shape[0] > 1 else torch.ones(d, dtype=x.dtype)
    width = torch.where(width > 0, width, torch.ones_like(width)).to(x)
    loc = math.sqrt(2.0) + 0.5 * math.log(d) + width.log()
    if not ard:
        loc = loc.mean()
    else:
        loc = loc.reshape(1, d)
    return LogNormalPrior(loc, torch.full_like(torch.as_tensor(loc), math.sqrt(3.0)))


class StandardizedGaussianLikelihood(gpytorch.likelihoods.GaussianLikelihood):
    r"""A Gaussian likelihood whose noise is learned on standardised targets.

    It is GPyTorch's :class:`~gpytorch.likelihoods.GaussianLikelihood` on the standardised
    targets :math:`t = (y - \mu_y) / s_y` (``noise`` is in those units), except for the
    predictions :class:`MultiOutputExactGP` returns in the original units (evaluation mode):
    their marginal adds :math:`s_y^2 \sigma^2`, so ``likelihood(model(x))`` is the
    predictive distribution of :math:`y`.

    Args:
        target_scale: :math:`s_y` per output (shape ``()`` or ``(C,)``).
        **kwargs: Passed on to :class:`~gpytorch.likelihoods.GaussianLikelihood`.
    """

    def __init__(self, target_scale: torch.Tensor, **kwargs) -> None:
        super().__init__(**kwargs)
        self.register_buffer("target_scale", torch.as_tensor(target_scale).clone())

    def marginal(self, function_dist, *args, **kwargs):
        """The marginal of the targets; in the original units for an original-units input."""
        base = getattr(function_dist, "_gpext_base", None)
        if base is None:
            return super().marginal(function_dist, *args, **kwargs)
        # the noise is added in the standardised units, then the whole marginal is rescaled
        out = super().marginal(base, *args, **kwargs)
        return OriginalUnitsMultivariateNormal.wrap(out, function_dist._loc, function_dist._scale)


class OriginalUnitsMultivariateNormal(gpytorch.distributions.MultivariateNormal):
    r"""A Gaussian :math:`\mathcal N(\mu + s m,\ s^2 K)` kept with its standardised version.

    What :class:`MultiOutputExactGP` returns in evaluation mode: the moments in the original
    units, computed from the standardised ones, so that GPyTorch's absolute variance floor
    (``gpytorch.settings.min_variance``) applies to the standardised variances (targets in
    units of :math:`10^{-6}` have variances far below it) and the likelihood can add its noise
    in the units it was learned in.
    """

    _gpext_base = None

    @classmethod
    def wrap(cls, base, loc: torch.Tensor, scale: torch.Tensor):
        r"""The distribution of :math:`\mu + s f` for ``f ~ base``."""
        out = cls(
            base.mean * _scale_like(scale, matrix=False) + _scale_like(loc, matrix=False),
            base.lazy_covariance_matrix * _scale_like(scale.pow(2)),
        )
        out._gpext_base, out._loc, out._scale = base, loc, scale
        return out

    @property
    def variance(self) -> torch.Tensor:
        if self._gpext_base is None:
            return super().variance
        return self._gpext_base.variance * _scale_like(self._scale.pow(2), matrix=False)


def _scale_like(values: torch.Tensor, matrix: bool = True) -> torch.Tensor:
    """Per-output factors ``(C,)`` shaped to broadcast over ``(C, N, N)`` (or ``(C, N)``)."""
    if values.numel() == 1:
        return values.reshape(())
    trailing = 2 if matrix else 1
    return values.reshape(*values.shape, *([1] * trailing))


class MultiOutputExactGP(gpytorch.models.ExactGP):
    r"""``C`` exact GPs with one shared kernel and one constant mean per output.

    With a fitted :class:`~gpext.fit.Standardizer` (what :func:`build_exact_gp` attaches by
    default) the GP works on standardised data: ``forward`` maps inputs to
    :math:`z = (x - \mu_x)/s_x`, ``train_targets`` hold :math:`t = (y - \mu_y)/s_y`, and in
    evaluation mode ``model(x)`` returns the posterior of :math:`y` in the original units,
    :math:`\mathcal N(\mu_y + s_y m,\ s_y^2 K)`.  The kernel hyperparameters and the
    likelihood's noise are then in standardised units.  In training mode ``model(x)`` is the
    prior of the standardised targets (what the marginal likelihood needs).

    Args:
        x: Training inputs (original units).  # shape: (N, D)
        y: Training targets as the GP sees them (standardised when ``standardizer`` is
            given).  # shape: (C, N) (a batch of outputs) or (N,)
        likelihood: A Gaussian likelihood (batch shape ``()`` or ``(C,)``).
        covar_module: The shared kernel.
        standardizer: The fitted data transform (``None``: the data are used as given).
    """

    def __init__(self, x, y, likelihood, covar_module, standardizer=None):
        batch = y.shape[:-1]
        xs = x.expand(*batch, *x.shape) if len(batch) else x
        super().__init__(xs, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = covar_module
        self.standardizer = standardizer

    def forward(self, x):
        """The prior at ``x`` (inputs standardised first when the model has a standardiser)."""
        if self.standardizer is not None:
            x = self.standardizer.transform_inputs(x)
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if self.training or self.standardizer is None or not self.standardizer.targets:
            return out
        return self._untransform(out)

    def _untransform(self, mvn):
        s = self.standardizer
        return OriginalUnitsMultivariateNormal.wrap(
            mvn, s.y_loc.to(mvn.mean), s.y_scale.to(mvn.mean)
        )

    @property
    def original_train_targets(self) -> torch.Tensor:
        """The training targets in the original units (``train_targets`` untransformed)."""
        t = self.train_targets
        if self.standardizer is None or not self.standardizer.targets:
            return t
        s = self.standardizer
        scale = _scale_like(s.y_scale.to(t), matrix=False)
        return t * scale + _scale_like(s.y_loc.to(t), matrix=False)


def build_exact_gp(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    noise: torch.Tensor | None = None,
    kernel: str | gpytorch.kernels.Kernel = "rbf",
    ard: bool = True,
    priors: bool = True,
    shared_noise: bool = True,
    standardize: bool = True,
) -> MultiOutputExactGP:
    r"""An exact GP for ``C`` outputs with a shared scaled kernel, default priors and inits.

    The model is :math:`y_c = m_c + f(x) + \varepsilon`, :math:`f \sim \mathcal{GP}(0, s\,k_\ell)`.
    With ``priors=True`` it carries (all relative to the targets' variance :math:`v`, the mean
    over outputs): the lengthscale prior of :func:`lengthscale_prior`;
    :math:`\log s \sim \mathcal N(\log v, 1)`; for a learned noise
    :math:`\log\sigma^2 \sim \mathcal N(\log v - 4, 1)` with :math:`\sigma^2 \ge 10^{-6} v`
    (BoTorch's noise prior on standardised targets).  Initial values: the prior medians of the
    lengthscale and outputscale, noise :math:`v/100`, the output means.

    Args:
        x: Training inputs.  # shape: (N, D)
        y: Targets.  # shape: (N,) or (N, C)
        noise: Fixed per-point noise variances with the shape of ``y`` (``None``: learned,
            homoscedastic).
        kernel: ``"rbf"``, ``"matern12"``, ``"matern32"``, ``"matern52"`` or a kernel instance
            (used as given; it is not wrapped or given priors).
        ard: One lengthscale per input.
        priors: Attach the default priors.
        shared_noise: One learned noise for all outputs (``False``: one per output).
        standardize: The data contract of :mod:`gpext.fit.standardize`: the model works on
            standardised inputs and targets (a :class:`~gpext.fit.Standardizer` fitted here,
            kept as ``model.standardizer`` in its state dict) and predicts in the original
            units; its hyperparameters and noise are in standardised units.  ``False``: the
            data are used as given (the fit then depends on their units).

    Returns:
        The model (its likelihood is ``model.likelihood``), on ``x``'s device and dtype.

    Raises:
        ShapeError: If shapes disagree.
        InputDataError: For an unknown kernel name or non-finite data.
        InputTypeError: For non-numeric or half-precision data (numpy arrays, lists and
            integer tensors are converted; ``y`` and ``noise`` take ``x``'s dtype).
    """
    # numpy arrays, lists and integer tensors are converted; half precision is an error
    x = as_fit_input(x, "build_exact_gp.x")
    y = as_fit_input(y, "build_exact_gp.y", dtype=x.dtype).to(x.dtype)
    if noise is not None:
        noise = as_fit_input(noise, "build_exact_gp.noise", dtype=x.dtype).to(x)
    if x.dim() != 2 or y.dim() not in (1, 2) or y.shape[0] != x.shape[0]:
        raise ShapeError(
            expected_got("build_exact_gp(x, y)", "x (N, D) and y (N,) or (N, C)",
                         f"{tuple(x.shape)}, {tuple(y.shape)}")
        )  # fmt: skip
    check_finite(x, "build_exact_gp.x")
    check_finite(y, "build_exact_gp.y")
    n, d = x.shape
    y2 = y.unsqueeze(-1) if y.dim() == 1 else y
    c = y2.shape[1]
    standardizer = None
    x_prior = x
    if standardize:
        standardizer = Standardizer(name="build_exact_gp").fit(x, y2)
        x_prior = standardizer.transform_inputs(x)
        y2 = standardizer.transform_targets(y2)
    targets = y2.T.contiguous() if y.dim() == 2 else y2.reshape(-1)
    batch = torch.Size([c]) if y.dim() == 2 else torch.Size([])
    v = float(y2.var(0).mean()) if n > 1 else 1.0
    v = v if v > 0 and math.isfinite(v) else 1.0
    if isinstance(kernel, gpytorch.kernels.Kernel):
        covar = kernel
    else:
        if kernel not in KERNELS:
            raise InputDataError(expected_got("build_exact_gp.kernel", f"one of {KERNELS}",
                                              repr(kernel)))  # fmt: skip
        lp = lengthscale_prior(x_prior, ard) if priors else None
        dims = d if ard else None
        if kernel == "rbf":
            base = gpytorch.kernels.RBFKernel(ard_num_dims=dims, lengthscale_prior=lp)
        else:
            nu = {"matern12": 0.5, "matern32": 1.5, "matern52": 2.5}[kernel]
            base = gpytorch.kernels.MaternKernel(nu=nu, ard_num_dims=dims, lengthscale_prior=lp)
        sp = LogNormalPrior(torch.tensor(math.log(v)), torch.tensor(1.0)) if priors else None
        covar = gpytorch.kernels.ScaleKernel(base, outputscale_prior=sp)
        with torch.no_grad():
            if lp is not None:
                base.lengthscale = lp.loc.exp().expand_as(base.lengthscale).to(x)
            else:
                base.lengthscale = torch.full_like(base.lengthscale, math.sqrt(d))
            covar.outputscale = v
    if noise is None:
        np_prior = (
            LogNormalPrior(torch.tensor(math.log(v) - 4.0), torch.tensor(1.0)) if priors else None
        )
        kwargs = dict(
            batch_shape=torch.Size([]) if shared_noise else batch,
            noise_prior=np_prior,
            noise_constraint=gpytorch.constraints.GreaterThan(1e-6 * v),
        )
        if standardizer is not None:
            likelihood = StandardizedGaussianLikelihood(standardizer.y_scale.to(x), **kwargs)
        else:
            likelihood = gpytorch.likelihoods.GaussianLikelihood(**kwargs)
        with torch.no_grad():
            likelihood.noise = 0.01 * v
    else:
        noise2 = noise.unsqueeze(-1) if noise.dim() == 1 else noise
        if noise2.shape != (n, c):
            raise ShapeError(expected_got("build_exact_gp.noise", f"shape {tuple(y.shape)}",
                                          tuple(noise.shape)))  # fmt: skip
        check_finite(noise2, "build_exact_gp.noise")
        if bool((noise2 < 0).any()):
            raise InputDataError(expected_got("build_exact_gp.noise", "variances >= 0",
                                              f"minimum {float(noise2.min()):.3g}"))  # fmt: skip
        if standardizer is not None:
            noise2 = noise2 / standardizer.y_scale.to(noise2).pow(2)
        fixed = noise2.T.contiguous() if y.dim() == 2 else noise2.reshape(-1)
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
            noise=fixed, learn_additional_noise=False
        )
    model = MultiOutputExactGP(x, targets, likelihood, covar, standardizer).to(x)
    with torch.no_grad():
        model.mean_module.constant.copy_(targets.mean(-1))
    return model


def log_prior(module: torch.nn.Module) -> torch.Tensor:
    r"""Sum of the log densities of every prior registered on ``module`` (each counted once).

    A value on the boundary of a prior's support (an outputscale that underflowed to 0 at a
    trial point of a line search) is moved just inside it, so the density is very small
    instead of the evaluation raising.

    Args:
        module: A GPyTorch module with priors (``named_priors``).

    Returns:
        A scalar tensor (0 without priors).
    """
    total = None
    for _, mod, prior, closure, _ in _unique_priors(module):
        value = closure(mod)
        support = getattr(prior, "support", None)
        lower = getattr(support, "lower_bound", None)
        if lower is not None:
            value = value.clamp_min(float(lower) + torch.finfo(value.dtype).tiny)
        term = prior.log_prob(value).sum()
        total = term if total is None else total + term
    if total is None:
        return torch.zeros(())
    return total


def _unique_priors(module: torch.nn.Module):
    """``named_priors`` with each (module, prior) pair once: a submodule reachable by two
    paths (``NystromKPCAKernel`` holds its base kernel as ``base_kernel`` and ``kpca.kernel``)
    is listed by GPyTorch under both names, which would count its priors twice."""
    seen = set()
    for entry in module.named_priors():
        key = (id(entry[1]), id(entry[2]))
        if key not in seen:
            seen.add(key)
            yield entry


def _map_loss(model: gpytorch.models.ExactGP) -> torch.Tensor:
    """Negative log posterior of the hyperparameters per target value."""
    x = model.train_inputs[0]
    y = model.train_targets
    out = model.likelihood(model(x))
    total = out.log_prob(y).sum() + log_prior(model).to(y)
    return -total / y.numel()


def _sample_priors(model: gpytorch.Module, generator: torch.Generator) -> bool:
    """Set every parameter with a prior to a draw from it; ``False`` if a draw was invalid."""
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _, module, prior, closure, setting in _unique_priors(model):
            current = closure(module)
            if tuple(prior.batch_shape) == tuple(current.shape):
                value = prior.sample()
            else:
                value = prior.sample(current.shape)
            value = value.reshape(current.shape).to(current)
            try:
                setting(module, value)
            except (RuntimeError, ValueError):
                return False
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def fit_exact_gp(
    model: gpytorch.models.ExactGP,
    *,
    num_restarts: int | None = None,
    max_iter: int = 200,
    fallback_iters: int = 300,
    fallback_lr: float = 0.05,
    generator: torch.Generator | None = None,
    check: bool = True,
    name: str | None = None,
    show_progress: bool | None = None,
) -> FitResult:
    r"""MAP fit of an exact GP's hyperparameters from several starts.

    Minimises the negative log posterior per target value,

    .. math::
        -\frac{1}{N C}\Big(\sum_c \log\mathcal N(\mathbf y_c;\ m_c\mathbf 1,\ K_c + \Sigma_c)
        + \sum_i \log p(\theta_i)\Big),

    (the priors :math:`p(\theta_i)` registered on the model, once each) by
    :func:`~gpext.fit.minimize_lbfgs` from the model's current values and from
    ``num_restarts - 1`` draws from the priors, keeping the best start (a model without
    priors has nothing to draw restarts from and is fitted from its current values once).
    When no start can
    be evaluated, ``fallback_iters`` Adam steps from the initial values are taken instead
    (with a :class:`~gpext.errors.NumericalWarning`).  Afterwards (``check=True``) the fit is
    checked for a collapsed signal variance (:func:`~gpext.fit.check_signal_to_noise`) and
    constant training predictions (:func:`~gpext.fit.check_predictions_vary`).

    Args:
        model: An exact GP with a Gaussian likelihood in ``model.likelihood`` (e.g. from
            :func:`build_exact_gp`); fitted in place and left in eval mode.
        num_restarts: Number of starts (the first from the current values).  ``None``
            (default): 4 for at most 500 training points, else 2 (the rule of
            :func:`gpext.bootstrap.fit_kernel_hyperparameters` and GWI's prior fit); each
            start costs :math:`O(N^3)` per evaluation, and on concrete (927 points) four
            starts took about 10 times as long as GPyTorch's 100 Adam steps.
        max_iter: L-BFGS iterations per start.
        fallback_iters: Adam steps of the fallback.
        fallback_lr: Adam learning rate of the fallback.
        generator: Random generator of the prior draws.
        check: Run the degenerate-fit checks.
        name: Name used in messages (default the model's class name).
        show_progress: Progress bar.

    Returns:
        The :class:`~gpext.fit.FitResult` of the best start, with one
        :class:`~gpext.fit.RestartRecord` per start in ``restarts``.

    Raises:
        FitError: If the fallback fails too (the initial values are restored).
        InputTypeError: If ``model`` is not a gpytorch ``ExactGP`` with training data.

    Example:
        >>> x = torch.rand(30, 2, dtype=torch.float64)
        >>> model = build_exact_gp(x, torch.sin(6 * x[:, 0]))
        >>> res = fit_exact_gp(model, num_restarts=2)
        >>> res.stop_reason.value
        'converged'
    """
    if not isinstance(model, gpytorch.models.ExactGP) or model.train_inputs is None:
        raise InputTypeError(
            expected_got(
                "fit_exact_gp(model)",
                "a gpytorch ExactGP with training data (e.g. from build_exact_gp(x, y))",
                type(model).__name__,
            )
        )
    if num_restarts is None:
        num_restarts = 4 if model.train_inputs[0].shape[-2] <= 500 else 2
    num_restarts = check_positive_int(num_restarts, "fit_exact_gp.num_restarts")
    fallback_lr = check_learning_rate(fallback_lr, "fit_exact_gp.fallback_lr")
    if next(iter(_unique_priors(model)), None) is None:
        num_restarts = 1  # every restart would repeat the first start
    name = name or type(model).__name__
    generator = generator if generator is not None else torch.Generator().manual_seed(0)
    start = time.perf_counter()
    initial = copy.deepcopy(model.state_dict())
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    records: list[RestartRecord] = []
    best: tuple[float, dict, FitResult] | None = None
    evaluations = 0
    with gpytorch.settings.max_cholesky_size(10**5), warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        # linear_operator's own jitter warnings at rejected line-search trial points: noise
        warnings.simplefilter("ignore", LinearOperatorNumericalWarning)
        warnings.simplefilter("ignore", ConvergenceWarning)  # re-issued for the best start only
        for r in range(num_restarts):
            model.load_state_dict(initial)
            if r > 0 and not _sample_priors(model, generator):
                records.append(RestartRecord(math.inf, StopReason.FAILED, 0, "invalid prior draw"))
                continue
            try:
                res = minimize_lbfgs(
                    lambda: _map_loss(model), params, max_iter=max_iter, warn_on_stall=False,
                    show_progress=show_progress, desc=f"{name} start {r}",
                )  # fmt: skip
            except FitError as err:
                records.append(RestartRecord(math.inf, StopReason.FAILED, 0, str(err)))
                continue
            evaluations += res.num_evaluations
            records.append(
                RestartRecord(res.final_loss, res.stop_reason, res.num_evaluations, res.message)
            )
            if best is None or res.final_loss < best[0]:
                best = (res.final_loss, copy.deepcopy(model.state_dict()), res)
    if best is None:
        warnings.warn(
            f"{name}: every L-BFGS start failed (last: {records[-1].message}); falling back "
            f"to {fallback_iters} Adam steps from the initial values.",
            NumericalWarning,
            stacklevel=2,
        )
        model.load_state_dict(initial)
        opt = torch.optim.Adam(params, lr=fallback_lr)
        try:
            with gpytorch.settings.max_cholesky_size(10**5):
                res = train_loop(lambda: _map_loss(model), opt, modules=[model],
                                 epochs=fallback_iters, desc=f"{name} (Adam fallback)")  # fmt: skip
        except FitError:
            model.load_state_dict(initial)
            model.eval()
            raise
        res.add_problem(NumericalWarning.__name__)
        best = (res.final_loss, copy.deepcopy(model.state_dict()), res)
        records.append(RestartRecord(res.final_loss, res.stop_reason, res.num_evaluations,
                                     "Adam fallback"))  # fmt: skip
        evaluations += res.num_evaluations
    model.load_state_dict(best[1])
    result = best[2]
    if ConvergenceWarning.__name__ in result.problems:
        warnings.warn(
            f"{name}: the best start stopped at max_iter={max_iter} while its loss was still "
            "falling; raise max_iter.",
            ConvergenceWarning,
            stacklevel=2,
        )
    result.restarts = records
    result.num_evaluations = evaluations
    model.eval()
    if check:
        diagnose_exact_gp(model, result, name=name, stacklevel=3)
        y = model.train_targets
        if y.dim() == 1 and MIN_CHECK_POINTS <= y.shape[0] <= LOO_CHECK_MAX_POINTS:
            try:
                loo_mean, loo_var = exact_gp_loo(model)
            except (RuntimeError, torch.linalg.LinAlgError):  # reported by the checks above
                loo_mean = None
            if loo_mean is not None:
                y_orig = model.original_train_targets if hasattr(
                    model, "original_train_targets") else y  # fmt: skip
                n = y_orig.shape[0]
                # each row's baseline: the mean of the other targets
                base_loo = (y_orig.double().sum() - y_orig.double()) / (n - 1)
                check_heldout(loo_mean, loo_var, y_orig, train_mean=base_loo, name=name,
                              result=result, what="leave-one-out predictions",
                              stacklevel=2)  # fmt: skip
    result.seconds = time.perf_counter() - start
    return result


def diagnose_exact_gp(model, result: FitResult, *, name: str, stacklevel: int = 2) -> None:
    """Run the signal-to-noise and constant-prediction checks on a fitted exact GP."""
    covar = getattr(model, "covar_module", None)
    noise = getattr(model.likelihood, "noise", None)
    if isinstance(covar, gpytorch.kernels.ScaleKernel) and noise is not None:
        check_signal_to_noise(covar.outputscale.detach(), noise.detach().mean(), name=name,
                              result=result, stacklevel=stacklevel + 1)  # fmt: skip
    x = model.train_inputs[0]
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**5), warnings.catch_warnings():
        warnings.simplefilter("ignore", NumericalWarning)
        warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
        try:
            mean = model(x).mean
        except Exception:  # noqa: BLE001 - a failing posterior is reported, not raised, here
            return
    y = getattr(model, "original_train_targets", model.train_targets)
    check_predictions_vary(mean.reshape(-1, y.shape[-1]).T, y.reshape(-1, y.shape[-1]).T,
                           name=name, result=result, stacklevel=stacklevel + 1)  # fmt: skip


def reference_heldout_nll(
    x_fit: torch.Tensor,
    y_fit: torch.Tensor,
    x_held: torch.Tensor,
    y_held: torch.Tensor,
    *,
    max_points: int = REFERENCE_MAX_POINTS,
    generator: torch.Generator | None = None,
) -> float | None:
    r"""Held-out NLL per point of a plain exact GP fitted to the same training rows.

    The reference of the model comparison in :func:`gpext.fit.check_heldout`
    (``reference_nll``): :func:`build_exact_gp` (RBF with ARD, default priors, data
    standardised) on ``(x_fit, y_fit)``, :func:`fit_exact_gp` with its default starts (its own
    warnings are discarded), then
    :math:`\frac1M\sum_i -\log\mathcal N(y_i;\ \mu_i,\ \sigma^2_i + \sigma^2_\varepsilon)`
    on the held-out rows, in the original units.  Inputs of more than two dimensions are
    flattened per row.

    Args:
        x_fit: Training inputs.  # shape: (N, ...)
        y_fit: Training targets.  # shape: (N,)
        x_held: Held-out inputs.  # shape: (M, ...)
        y_held: Held-out targets.  # shape: (M,)
        max_points: Above this many training rows (an :math:`O(N^3)` fit) no reference is
            fitted.
        generator: Random state of the restarts.

    Returns:
        The NLL per point, or ``None`` above ``max_points`` rows, with fewer than 3 training
        rows, or when the reference fit fails.
    """
    n = int(y_fit.reshape(-1).shape[0])
    if n > max_points or n < 3:
        return None
    xf = torch.as_tensor(x_fit).detach().reshape(n, -1).to(torch.float64)
    yf = torch.as_tensor(y_fit).detach().reshape(-1).to(torch.float64).to(xf.device)
    xh = torch.as_tensor(x_held).detach().to(torch.float64).to(xf.device)
    xh = xh.reshape(xh.shape[0], -1)
    yh = torch.as_tensor(y_held).detach().reshape(-1).to(torch.float64).to(xf.device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = build_exact_gp(xf, yf)
            fit_exact_gp(model, generator=generator, check=False, show_progress=False)
            model.eval()
            with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
                pred = model.likelihood(model(xh))
                mean, var = pred.mean.reshape(-1), pred.variance.reshape(-1).clamp_min(1e-300)
    except (GpextError, RuntimeError, ValueError):
        return None
    nll = 0.5 * (2 * math.pi * var).log() + (yh - mean).pow(2) / (2 * var)
    value = float(nll.mean())
    return value if math.isfinite(value) else None

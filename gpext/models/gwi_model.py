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

Data contract (:mod:`gpext.fit.standardize`): ``from_data`` fits a
:class:`~gpext.fit.Standardizer` on the training data (inputs, and regression targets), and
the prior, ``Z``, :math:`m_Q`, ``L`` and the likelihood's noise all live on the standardised
data; ``fit``, ``predict``, ``predict_proba``, the temperature selection and ``model(x)``
take and return the original units.  Budgets are counted in Adam steps (``MIN_STEPS``), and
``fit`` ends with the shared held-out checks (:func:`gpext.fit.check_heldout`).
"""

from __future__ import annotations

import copy
import math
import warnings

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS as _AUTO_VALIDATION_MIN_POINTS
from gpext.fit import AUTO_VALIDATION_MIN_ROWS as _AUTO_VALIDATION_MIN_ROWS
from gpext.fit import (
    FitResult,
    Standardizer,
    TemperatureSelection,
    check_heldout,
    holdout_split,
    minibatch_indices,
    minimize_scalar_on_grid,
    reference_heldout_nll,
    refit_split,
    train_loop,
    validation_rows,
)
from gpext.fit.exact_gp import OriginalUnitsMultivariateNormal
from gpext.mlls import GWIObjective
from gpext.mlls.gwi_objective import _check_beta
from gpext.models.greedy_inducing_subset import greedy_inducing_subset
from gpext.models.gwi_exact_prior import fit_exact_prior
from gpext.utils import as_model_input, check_finite, check_learning_rate, check_positive_int
from gpext.utils.validation import check_rows
from gpext.variational import WassersteinVariationalDistribution, WassersteinVariationalStrategy

# fit_exact_prior, greedy_inducing_subset and the kernel-expansion mean live in their own modules
# (one concept per module) and are re-exported here for existing imports.
__all__ = ["GWIModel", "fit_exact_prior", "greedy_inducing_subset"]


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
        #: The data transform (fitted by ``from_data``; unfitted, the identity: the model then
        #: works on the data as given).  Everything inside (``Z``, the prior, ``m_Q``, ``L``,
        #: the likelihood's noise) is in its standardised units.  In the state dict.
        self.standardizer = Standardizer(
            targets=self._standardize_targets, name=type(self).__name__
        )

    #: Whether the targets are standardised (regression) or only the inputs (classification).
    _standardize_targets: bool = True
    #: Whether the predictive is Gaussian (``predict``): the end-of-fit held-out checks apply.
    _gaussian_predictive: bool = False
    #: Fewest Adam steps of :meth:`fit`, whatever the number of rows and the minibatch size
    #: (``epochs`` is raised to reach it; ``fit(min_steps=...)`` overrides it).  Q starts at
    #: the sparse posterior of the prior, so it needs fewer steps than a network from scratch.
    MIN_STEPS: int = 500
    #: Share of the rows a fit without validation rows refits without, to calibrate its
    #: temperature and check itself on them (:meth:`fit`).
    REFIT_CHECK_FRACTION: float = 0.2
    #: Fewest rows on each side of that refit: from 23 rows up the copy chooses the step count
    #: and the temperature (the interval checks need :data:`~gpext.fit.MIN_CHECK_POINTS`
    #: held-out rows, 50 rows in all; below that only the R^2 check runs).
    REFIT_MIN_ROWS: int = 5

    # ------------------------------------------------------------------ data contract
    def __call__(self, x: torch.Tensor, prior: bool = False, **kwargs) -> MultivariateNormal:
        r"""The variational posterior :math:`\mathbb Q` (or with ``prior=True`` the prior) at
        inputs ``x`` in the original units.

        The inputs are standardised first, and for regression the result is returned in the
        targets' units: :math:`\mathcal N(\mu_y + s_y m,\ s_y^2 r)` (what ``predict`` uses,
        the noise and temperature excluded); ``likelihood(model(x))`` with the likelihood of
        ``from_data`` adds the noise in those units.
        """
        s = self.standardizer
        if s.fitted and torch.is_tensor(x):
            x = s.transform_inputs(x)
        return self._untransform(self._q_std(x, prior=prior, **kwargs))

    def _q_std(self, x: torch.Tensor, **kwargs) -> MultivariateNormal:
        r""":math:`\mathbb Q` at standardised inputs, in standardised units (training)."""
        return gpytorch.models.ApproximateGP.__call__(self, x, **kwargs)

    def _targets_fitted(self) -> bool:
        s = self.standardizer
        return s.targets and s.fitted and s.y_loc.numel() > 0

    def _untransform(self, mvn: MultivariateNormal) -> MultivariateNormal:
        if not self._targets_fitted():
            return mvn
        # the variances of the standardised Q are kept (GPyTorch's absolute variance floor
        # applies to them), and StandardizedGaussianLikelihood adds its noise to them
        s = self.standardizer
        return OriginalUnitsMultivariateNormal.wrap(
            mvn, s.y_loc.to(mvn.mean).reshape(()), s.y_scale.to(mvn.mean).reshape(())
        )

    @property
    def target_loc_scale(self) -> tuple[float, float]:
        r""":math:`(\mu_y, s_y)` of the target standardisation (``(0, 1)`` without one)."""
        if not self._targets_fitted():
            return 0.0, 1.0
        s = self.standardizer
        return float(s.y_loc.reshape(-1)[0]), float(s.y_scale.reshape(-1)[0])

    def _target_scale2(self) -> float:
        """:math:`s_y^2` (1 without target standardisation)."""
        return self.standardizer.target_scale**2 if self._targets_fitted() else 1.0

    def _standardize_data(self, x: torch.Tensor, y: torch.Tensor):
        s = self.standardizer
        if not s.fitted:
            return x, y
        return s.transform_inputs(x), s.transform_targets(y)

    #: Smallest training set for which :meth:`fit` holds out 10% of the rows by default.
    AUTO_VALIDATION_MIN_POINTS: int = _AUTO_VALIDATION_MIN_POINTS
    #: The default hold-out has at least this many rows (at most a quarter of the data): the
    #: temperature is a mean of squared standardised residuals, relative sd ``sqrt(2 / n)``.
    AUTO_VALIDATION_MIN_ROWS: int = _AUTO_VALIDATION_MIN_ROWS

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
        epochs: int = 1,
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
        min_steps: int | None = None,
        check_fit: bool = True,
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
            x: Training inputs, original units. # shape: (N, D)
            y: Training targets, original units. # shape: (N,)
            epochs: Passes over the data, at least; the default 1 leaves the budget to
                ``min_steps`` (:attr:`MIN_STEPS` Adam steps, whatever ``N`` and the batch size).
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
                (:meth:`calibrate_temperature`), or on the rows a refit left out (below).
                ``None`` (default): whenever either is possible.  Without both the
                temperature stays at its current value; with
                the default ``T = 1`` the regression model counts the Nystrom residual twice
                (see ``default_temperature_range``) and is under-confident: on boston splits 0-1 and concrete
                split 0 with ``epochs=100`` every test point fell inside the central 95%
                interval.
            eval_every: Validation period in epochs.
            patience: Stop after this many validation checks without improvement (``None``:
                train all ``epochs``).
            generator: Random generator for the shuffling.
            show_progress: Progress bar.

            min_steps: At least this many Adam steps (``epochs`` is raised to
                :math:`\lceil S / B\rceil` for ``B`` minibatches per epoch); ``None``:
                :attr:`MIN_STEPS`, 0: ``epochs`` alone decides.  Early stopping does not stop
                before it.
            check_fit: Run the degenerate-fit checks on the training rows and, for
                regression, the shared end-of-fit checks :func:`gpext.fit.check_heldout` on
                the validation rows after the temperature calibration (or on the rows a refit
                left out, see below): :math:`R^2 \le 0`, coverage of the central 95% interval
                and the mean squared z-score.

        Without validation rows (fewer than :attr:`AUTO_VALIDATION_MIN_POINTS` rows and no
        ``x_val``; at least 23, :attr:`REFIT_MIN_ROWS` held out), a copy of the model and
        likelihood as they were before this call is first fitted with the same arguments on a
        random 80% of the rows (:attr:`REFIT_CHECK_FRACTION`), with the other 20% as validation
        rows (early stopping: its best state is restored; recorded in ``refit_selection_``).
        This fit then takes the copy's best number of optimiser steps instead of ``epochs`` and
        ``min_steps`` (no :class:`~gpext.errors.ConvergenceWarning`: the budget was chosen on
        held-out rows): on a few dozen rows, training ``Q`` away from the sparse posterior it
        starts at raises the held-out NLL (on a 60-row table the best of 1,500 steps was step 0
        or 30). The copy's temperature, selected on the same 20%, becomes this model's
        (``calibrate``; recorded in ``temperature_calibration_``), and its predictions there
        stand in for this model's in the checks (optimistic: the same rows chose its steps and
        its temperature). The copy keeps the prior, ``Z`` and the standardisation that
        ``from_data`` built from all rows, so these rows are not wholly unseen. Below 200 rows
        the temperature used to stay at 1: on a 151-row table the test NLL was 11.38 against the
        exact GP's 1.48 (predictive sd 0.12 against errors of 0.6), with no warning. It doubles
        the cost of a small fit; ``calibrate=False, check_fit=False`` skip it.

        Returns:
            A :class:`~gpext.fit.FitResult`: ``losses`` (per epoch, the mean minibatch negative
            objective), ``history["w2"]`` (per epoch, the mean minibatch W2 estimate, without
            ``beta``), and with validation data ``validation_losses`` (the validation NLL),
            ``validation_steps`` (the epoch of each check; 0 is the initial state) and
            ``best_step`` (the epoch whose state was restored).

        Raises:
            ShapeError: If ``x`` and ``y`` do not match.
            InputDataError: If ``x``, ``y`` (or the validation data) have NaN or infinite
                entries, if only one of ``x_val``, ``y_val`` is given, ``lr`` or ``mean_lr`` is not a finite number >= 0, or
                ``beta`` is not a finite number ``>= 0``.
            FitError: If the loss or a parameter became non-finite (the last finite state is
                restored first).

        Warns:
            ConstantPredictionWarning: The regression model predicts a constant on the
                training inputs.
            VarianceCollapseWarning: The regression model explains little of the training
                targets' variance.
            NoSignalWarning / OverconfidenceWarning / UnderconfidenceWarning: From the
                held-out checks (regression, ``check_fit``).
            ConvergenceWarning: The training loss is still clearly falling at the end of the
                budget (:func:`gpext.fit.train_loop`).
        """
        epochs = check_positive_int(epochs, "epochs")
        if min_steps is None:
            min_steps = self.MIN_STEPS
        min_steps = check_positive_int(min_steps, "min_steps", minimum=0)
        like = self.variational_strategy.inducing_points
        x = as_model_input(x, like, f"{type(self).__name__}.fit(x)")
        y = _as_targets(y, like)
        if x_val is not None:
            x_val = as_model_input(x_val, like, f"{type(self).__name__}.fit(x_val)")
        y_val = None if y_val is None else _as_targets(y_val, like)
        batch_size = check_positive_int(batch_size, "batch_size")
        eval_every = check_positive_int(eval_every, "eval_every")
        # 0 keeps a group fixed (e.g. lr=0 with mean_lr > 0 trains only the mean)
        lr = check_learning_rate(lr, f"{type(self).__name__}.fit.lr", allow_zero=True)
        mean_lr = check_learning_rate(mean_lr, f"{type(self).__name__}.fit.mean_lr",
                                      allow_none=True, allow_zero=True)  # fmt: skip
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
        check_rows(x, f"{type(self).__name__}.fit: x", num_features=like.shape[-1])
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
            check_rows(x_val, f"{type(self).__name__}.fit: x_val", num_features=like.shape[-1])
            y_val = self._check_targets(y_val, f"{type(self).__name__}.fit: y_val")
        n_all = x.shape[0]
        n_val = int(round(float(validation_fraction) * n_all))
        if auto_split:  # the temperature's relative sd is sqrt(2 / n_val)
            n_val = validation_rows(n_all, validation_fraction, self.AUTO_VALIDATION_MIN_ROWS)
        # without validation rows a copy of the initial state is refitted on 80% of the rows
        # at the end: its temperature on the other 20% is this model's, and its scores there
        # check the fit (the prior, Z and the standardisation stay those built from all rows)
        refit_rows = (
            x_val is None
            and n_val == 0
            and n_all < self.AUTO_VALIDATION_MIN_POINTS
            and holdout_split(n_all, self.REFIT_CHECK_FRACTION, None, minimum=self.REFIT_MIN_ROWS)
            is not None
        )
        if calibrate is None:
            calibrate = x_val is not None or n_val > 0 or refit_rows
        if calibrate and x_val is None and n_val == 0 and not refit_rows:
            refit_min_total = round(self.REFIT_MIN_ROWS / self.REFIT_CHECK_FRACTION)
            raise InputDataError(
                expected_got(f"{type(self).__name__}.fit: calibrate",
                             "False or None without validation data (validation_fraction=0 "
                             f"and fewer than {refit_min_total} or "
                             f"at least {self.AUTO_VALIDATION_MIN_POINTS} rows)", calibrate)
            )  # fmt: skip
        refit_copy = None
        if refit_rows and (calibrate or (check_fit and self._gaussian_predictive)):
            refit_copy = (copy.deepcopy(self), copy.deepcopy(likelihood))
        refit_args = {
            "epochs": epochs, "batch_size": batch_size, "lr": lr, "mean_lr": mean_lr,
            "beta": beta, "min_steps": min_steps,
        }  # fmt: skip
        # small tables: the copy is fitted first, on 80% of the rows with the other 20% as
        # validation rows, and its best number of steps is this fit's budget (training Q on a
        # few dozen rows for the full budget moves it away from the sparse posterior it starts
        # at, and the held-out NLL rises: on a 60-row table it was best after 0-30 of 1,500
        # steps); its temperature and predictions there are this fit's calibration and checks
        refit_held, warn_unconverged = None, True
        if refit_copy is not None:
            refit_held, best_steps = self._refit_on_part(
                *refit_copy, x, y, refit_args, calibrate, generator, show_progress
            )
            if best_steps is not None:
                per_epoch = max(1, math.ceil(n_all / batch_size))
                epochs, min_steps = max(1, math.ceil(best_steps / per_epoch)), 0
                warn_unconverged = False
        if n_val > 0:
            perm = torch.randperm(n_all, generator=generator).to(x.device)
            x_val, y_val = x[perm[:n_val]], y[perm[:n_val]]
            x, y = x[perm[n_val:]], y[perm[n_val:]]
        # the model works on standardised data (the transform of from_data); x, y, x_val and
        # y_val stay in the original units for the calibration and the checks
        xs, ys = self._standardize_data(x, y)
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
            loss = -mll(self._q_std(xs[idx]), ys[idx])
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
            min_steps=min_steps or None, warn_unconverged=warn_unconverged,
        )  # fmt: skip
        result.history["w2"] = [
            float(total) / count for total, count in zip(w2_sums, w2_counts) if count
        ][: len(result.losses)]
        self.eval()
        likelihood.eval()
        self._fitted = True
        if calibrate and x_val is not None:
            self.calibrate_temperature(likelihood, x_val, y_val)
        # (mean, variance, targets, training mean, what, (x_fit, y_fit, x_held)) of rows not
        # trained on; the last entry is for the exact-GP reference of the checks
        held = None
        if x_val is not None and self._gaussian_predictive:
            held = (*self.predict(likelihood, x_val), y_val, float(y.double().mean()),
                    "validation rows", (x, y, x_val))  # fmt: skip
        elif refit_copy is not None:
            held = refit_held
        if check_fit:
            self._check_fit(likelihood, x, y, result)
            if held is not None:
                mean, var, target, base, what, (x_fit, y_fit, x_held) = held
                reference = reference_heldout_nll(x_fit, y_fit, x_held, target,
                                                  generator=torch.Generator().manual_seed(0))  # fmt: skip
                # stacklevel 2: check_heldout's own frame -> fit -> the caller of fit
                self.heldout_check_ = check_heldout(
                    mean, var, target, train_mean=base, name=f"{type(self).__name__}.fit",
                    result=result, what=what, reference_nll=reference,
                )  # fmt: skip
        return result

    def _refit_on_part(self, fresh, fresh_lik, x, y, fit_args, calibrate, generator, show):
        """Fit the copy ``fresh`` of the initial state on 80% of the rows, with the rest as
        validation rows (the best state restored), and pick its temperature there (this
        model's when ``calibrate``).

        Returns:
            ``(held, best_steps)``: the copy's predictions on the other rows for the checks
            (``None`` without a Gaussian predictive) and the number of optimiser steps of its
            restored state; ``(None, None)`` with too few rows.
        """
        split = refit_split(x.shape[0], self.REFIT_CHECK_FRACTION, generator, x.device,
                            minimum=self.REFIT_MIN_ROWS)  # fmt: skip
        if split is None:
            return None, None
        tr, te, copy_generator = split
        # the copy's Q starts from its own rows: from_data started this model's mean at the
        # sparse posterior given all rows, the held-out ones included (the copy then "predicted"
        # them with R^2 = 0.9999 at its first state, which chose 0 steps and a temperature of
        # 0.05: test mean squared z-score 466 on an 85-row table)
        fresh._restart_on_rows(fresh_lik, x[tr], y[tr])
        args = dict(fit_args)
        per_epoch = max(1, math.ceil(tr.numel() / args["batch_size"]))
        total = max(args["epochs"], math.ceil(args["min_steps"] / per_epoch))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the copy's own checks: the caller reports
            res = fresh.fit(fresh_lik, x[tr], y[tr], x_val=x[te], y_val=y[te], calibrate=False,
                            check_fit=False, show_progress=False, eval_every=max(1, total // 50),
                            generator=copy_generator, **args)  # fmt: skip
        best_steps = None if res.best_step is None else int(res.best_step) * per_epoch
        self.refit_selection_ = {"best_steps": best_steps, "of_steps": total * per_epoch,
                                 "validation_losses": list(res.validation_losses)}  # fmt: skip
        if calibrate:
            t = fresh.calibrate_temperature(fresh_lik, x[te], y[te])
            self.temperature.fill_(t)
            self.temperature_calibration_ = {"temperature": t, "num_points": int(te.numel()),
                                             "method": "refit"}  # fmt: skip
        if not self._gaussian_predictive:
            return None, best_steps
        mean, var = fresh.predict(fresh_lik, x[te])
        held = (mean, var, y[te], float(y[tr].double().mean()),
                "rows held out from a refit on the rest (its step count chosen there)",
                (x[tr], y[tr], x[te]))  # fmt: skip
        return held, best_steps

    def _restart_on_rows(self, likelihood, x: torch.Tensor, y: torch.Tensor) -> None:
        """Reset the state of ``Q`` that ``from_data`` derived from the training targets to
        what these rows (original units) give (the refit copy of :meth:`fit`); none here."""

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
            InputDataError: If a temperature is not positive, or the validation data are empty
                or not finite.
            ShapeError: If ``x_val`` is not ``(N_val, D)`` or ``y_val`` not ``(N_val,)``.
            NotFittedError: Before :meth:`fit`.
        """
        x_val, y_val = self._check_validation(x_val, y_val, "select_temperature")
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

    def _check_validation(self, x_val, y_val, method: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Validation data under the input contract of :meth:`fit` (numpy / sequences too)."""
        like = self.variational_strategy.inducing_points
        name = f"{type(self).__name__}.{method}"
        x_val = as_model_input(x_val, like, f"{name}(x_val)")
        self._check_fitted()
        check_rows(x_val, f"{name}(x_val)", num_features=like.shape[-1])
        y_val = _as_targets(y_val, like)
        if y_val.dim() != 1 or y_val.shape[0] != x_val.shape[0]:
            raise ShapeError(
                expected_got(f"{name}(y_val)", f"shape ({x_val.shape[0]},)", tuple(y_val.shape))
            )
        return x_val, self._check_targets(y_val, f"{name}(y_val)")

    def _check_fitted(self) -> None:
        if not self.variational_strategy.variational_params_initialized.item():
            raise NotFittedError(
                f"{type(self).__name__}: call fit() (or initialise) before predicting."
            )


def _as_targets(y, like: torch.Tensor) -> torch.Tensor:
    """Numpy / sequence targets as a tensor on the model's device (floats in its dtype, labels
    as integers); tensors are left to the subclasses' target checks."""
    if isinstance(y, torch.Tensor):
        return y
    y = torch.as_tensor(y, device=like.device)
    return y.to(like.dtype) if y.is_floating_point() else y

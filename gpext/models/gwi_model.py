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

import math

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS as _AUTO_VALIDATION_MIN_POINTS
from gpext.fit import (
    FitResult,
    TemperatureSelection,
    minibatch_indices,
    minimize_scalar_on_grid,
    train_loop,
)
from gpext.mlls import GWIObjective
from gpext.mlls.gwi_objective import _check_beta
from gpext.models.greedy_inducing_subset import greedy_inducing_subset
from gpext.models.gwi_exact_prior import fit_exact_prior
from gpext.utils import as_model_input, check_finite, check_positive_int
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
        like = self.variational_strategy.inducing_points
        x = as_model_input(x, like, f"{type(self).__name__}.fit(x)")
        y = _as_targets(y, like)
        if x_val is not None:
            x_val = as_model_input(x_val, like, f"{type(self).__name__}.fit(x_val)")
        y_val = None if y_val is None else _as_targets(y_val, like)
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

r"""GWI regression: Gaussian likelihood, neural-network mean, Wasserstein-2 regulariser.

Objective (003_4a6349f7433d9fd1.txt section 2.1, with a Gaussian likelihood):

.. math::

    \mathcal L = \sum_n \Big[\frac{(y_n - m_Q(x_n))^2 + r(x_n, x_n)}{2\sigma^2}
        + \tfrac12 \log(2\pi\sigma^2)\Big] + W_2^2(\mathbb P, \mathbb Q).

Prediction: :math:`y_* \sim \mathcal N(m_Q(x_*), T\,(r(x_*, x_*) + \sigma^2))`, the Gaussian
predictive density tempered as :math:`p(y_* \mid x_*)^{1/T}` (renormalised) with the temperature
:math:`T` picked on validation NLL.
"""

from __future__ import annotations

import math

import gpytorch
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.fit import (
    StandardizedGaussianLikelihood,
    Standardizer,
    check_explained_variance,
    check_predictions_vary,
)
from gpext.models._kernel_expansion_mean import _KernelExpansionMean
from gpext.models.greedy_inducing_subset import _check_inducing_choice, _inducing_indices
from gpext.models.gwi_exact_prior import fit_exact_prior
from gpext.models.gwi_model import GWIModel
from gpext.utils import as_float_tensor, as_model_input, check_finite
from gpext.utils.validation import as_fit_input, check_rows
from gpext.variational import WassersteinNetworkMean

__all__ = ["GWIRegressionModel"]


class GWIRegressionModel(GWIModel):
    r"""GWI for regression (Wild et al. 2022; 003 section 2).

    .. math::

        \mathbb Q = \mathcal{GP}(m_Q, r), \quad
        r(x, x') = k(x, x') - k_{xZ}K_{ZZ}^{-1}k_{Zx'} + k_{xZ} L L^\top k_{Zx'}

    Args: see :class:`~gpext.models.gwi_model.GWIModel`.

    Example:
        >>> import torch
        >>> from gpext.models import GWIRegressionModel
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.randn(40, 2, generator=g)
        >>> train_y = train_x[:, 0].sin() + 0.1 * torch.randn(40, generator=g)
        >>> model, likelihood = GWIRegressionModel.from_data(train_x, train_y, generator=g)
        >>> result = model.fit(likelihood, train_x, train_y, epochs=5)
        >>> mean, var = model.predict(likelihood, torch.randn(5, 2, generator=g))
        >>> mean.shape, var.shape
        (torch.Size([5]), torch.Size([5]))
    """

    #: For a Gaussian predictive, tempering only rescales the variance and the validation NLL
    #: has its single minimum at ``T = mean((y - m)^2 / v)``; sharpening below 0.5 is allowed
    #: because the learned noise absorbs the Nyström residual of ``r`` at the training points
    #: and ``r(x_*, x_*) + sigma^2`` then counts that residual twice.
    default_temperature_range: tuple[float, float] = (0.05, 100.0)
    _gaussian_predictive = True

    @classmethod
    def from_data(
        cls,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        num_inducing: int | None = None,
        prior_points: int = 1000,
        prior_steps: int = 100,
        mean_module: torch.nn.Module | None = None,
        mean: str = "kernel+network",
        num_subsample: int = 100,
        learn_inducing_locations: bool = False,
        inducing: str = "greedy",
        adaptive_mean: bool = True,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
        standardize: bool = True,
    ) -> tuple[GWIRegressionModel, gpytorch.likelihoods.GaussianLikelihood]:
        r"""Build a model as the GWI scripts do: exact-GP prior, ``Z`` = ``sqrt(N)`` data points.

        The prior (constant mean, scaled RBF) is fitted on at most ``prior_points`` points and
        frozen; ``L`` is initialised to :math:`\operatorname{chol}((K_{ZZ} + K_{ZX}K_{XZ}/\sigma^2)^{-1})`
        and the likelihood's noise to the fitted :math:`\sigma^2`.

        Args:
            x: Training inputs. # shape: (N, D)
            y: Training targets. # shape: (N,)
            num_inducing: ``M`` (default ``ceil(sqrt(N))``).
            prior_points: Subset size of the exact-GP prior fit.
            prior_steps: L-BFGS iterations per start of the prior fit
                (:func:`~gpext.models.gwi_exact_prior.fit_exact_prior`; its
                :class:`~gpext.fit.FitResult` is stored as ``model.prior_fit_result``).
            mean_module: Variational mean; overrides ``mean``.
            mean: ``"kernel+network"`` (default: :math:`m_P(x) + k_m(x, C) L_C^{-\top} u + g(x)`
                with centres ``C`` starting at ``Z``, :math:`L_C L_C^\top = K_{m,CC} + \delta I`
                and ``u`` set so that
                :math:`m_Q` starts at the sparse-GP posterior mean that
                goes with the initial ``L``, and the MLP ``g`` starting at zero),
                ``"kernel"`` (without ``g``) or ``"network"`` (the MLP alone, two hidden layers
                of 50, the public scripts' choice; it starts at a random function, far from
                the posterior that ``L`` starts at).
            num_subsample: ``N_S`` of the W2 estimator.
            learn_inducing_locations: Whether ``Z`` is trained (default off: ``Z`` stays a
                subset of the data as in 003, and with a fixed ``L`` even small moves of ``Z``
                break the cancellation between :math:`-k_{xZ}K_{ZZ}^{-1}k_{Zx'}` and
                :math:`k_{xZ}LL^\top k_{Zx'}` when :math:`K_{ZZ}` is ill-conditioned).
            inducing: How ``Z`` is picked from the data: ``"greedy"`` (default,
                :func:`~gpext.models.greedy_inducing_subset.greedy_inducing_subset` under the fitted prior
                kernel) or ``"random"``.
            adaptive_mean: With the ``"kernel"`` means, train the expansion's centres (they
                start at ``Z``) and its own copy of the prior kernel (it starts at the
                prior's, so the initial mean is the sparse posterior mean; :math:`\mathbb P`,
                ``Z`` and :math:`r` keep the frozen kernel and the fixed subset).  Default on:
                with ``M`` well below ``N`` the frozen exact-GP lengthscales make an expansion
                on ``M`` fixed centres underfit.  The expansion is whitened
                (:math:`m_Q = m_P + k_m(x, C) L_C^{-\top} u + g`), so that far from the data and
                the centres :math:`m_Q` returns to :math:`m_P + g` (see
                :class:`~gpext.models._kernel_expansion_mean._KernelExpansionMean`).
            generator: Random generator (subsets, shuffling of the W2 subsamples).
            show_progress: Progress bar of the prior fit.
            standardize: The data contract of :mod:`gpext.fit.standardize` (default on): a
                :class:`~gpext.fit.Standardizer` fitted on ``(x, y)`` is kept as
                ``model.standardizer`` (in the state dict); the prior (fitted by
                :func:`~gpext.models.gwi_exact_prior.fit_exact_prior` on the standardised
                data), ``Z``, :math:`m_Q`, ``L`` and the noise live on standardised inputs
                and targets, and ``fit``, ``predict``, the temperature selection and
                ``model(x)`` take and return the original units.  ``False``: the data are
                used as given (the opt-out for data already on a unit scale).

        Returns:
            ``(model, likelihood)``; the likelihood is a
            :class:`~gpext.fit.StandardizedGaussianLikelihood` (its noise on the standardised
            targets; ``likelihood(model(x))`` is the predictive of ``y`` without the
            temperature; :meth:`noise_variance` gives the noise in the targets' units).

        Raises:
            ShapeError: If ``x`` is not ``(N, D)`` or ``y`` not ``(N,)``.
            InputDataError: If ``mean`` or ``inducing`` is not one of the listed options, or
                ``x`` or ``y`` has NaN or infinite entries.
        """
        # numpy / sequences too; the model adopts the data's dtype (float32 or float64)
        x = as_fit_input(x, f"{cls.__name__}.from_data(x)")
        if x.dim() == 2 and x.shape[0] == 0:
            raise InputDataError(
                expected_got(f"{cls.__name__}.from_data(x)", "at least one row", tuple(x.shape))
            )
        y = as_float_tensor(y, f"{cls.__name__}.from_data(y)", dtype=x.dtype).to(x.device)
        if x.dim() != 2 or y.dim() != 1 or y.shape[0] != x.shape[0]:
            raise ShapeError(
                expected_got(
                    "GWIRegressionModel.from_data(x, y)",
                    "x (N, D), y (N,)",
                    f"{tuple(x.shape)}, {tuple(y.shape)}",
                )
            )
        check_finite(x, "GWIRegressionModel.from_data: x")
        _check_inducing_choice(inducing)
        check_finite(y, "GWIRegressionModel.from_data: y")
        n = x.shape[0]
        # the data contract: everything below lives on standardised inputs and targets
        standardizer = Standardizer(name=f"{cls.__name__}.from_data")
        if standardize:
            standardizer.fit(x, y)
            x, y = standardizer.transform_inputs(x), standardizer.transform_targets(y)
        prior_mean, kernel, noise, prior_fit = fit_exact_prior(
            x, y, max_points=prior_points, steps=prior_steps, generator=generator,
            show_progress=show_progress, return_result=True,
        )  # fmt: skip
        idx = _inducing_indices(x, kernel, num_inducing, inducing, generator)
        if mean_module is None and mean != "network":
            if mean not in ("kernel", "kernel+network"):
                raise InputDataError(
                    expected_got("mean", "'network', 'kernel' or 'kernel+network'", repr(mean))
                )
            net = WassersteinNetworkMean(x.shape[-1]) if mean == "kernel+network" else None
            mean_module = _KernelExpansionMean(
                prior_mean, kernel, x[idx], net,
                learn_centers=adaptive_mean, learn_kernel=adaptive_mean,
            )  # fmt: skip
        model = cls(
            x[idx].clone(), kernel, prior_mean=prior_mean, mean_module=mean_module,
            num_subsample=num_subsample, learn_inducing_locations=learn_inducing_locations,
            generator=generator,
        ).to(x)  # fmt: skip
        sub = x[torch.randperm(n, generator=generator)[:prior_points].to(x.device)]
        model.variational_strategy.initialize_from_data(sub, noise * sub.shape[0] / n)
        if isinstance(model.variational_strategy.mean_module, _KernelExpansionMean):
            model.variational_strategy.mean_module.initialize_posterior(x, y, noise)
        model.prior_fit_result = prior_fit
        model.standardizer = standardizer.to(x.device)
        # the noise is learned on the standardised targets; likelihood(model(x)) adds it in
        # the targets' units (model(x) is in those units)
        likelihood = StandardizedGaussianLikelihood(
            torch.tensor(standardizer.target_scale, dtype=torch.float64)
        ).to(x)
        # strictly above the constraint's bound: at the bound itself the raw (softplus)
        # parameter is -inf and the first optimiser step makes it NaN (yacht split 3: the prior
        # fit's noise hit 1e-4)
        lower = float(likelihood.noise_covar.raw_noise_constraint.lower_bound.max())
        likelihood.noise = max(noise, lower * 1.01)
        return model, likelihood

    def predict(
        self,
        likelihood: gpytorch.likelihoods.GaussianLikelihood,
        x: torch.Tensor,
        *,
        batch_size: int = 2048,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        r"""Predictive mean and variance :math:`(m_Q(x), T\,(r(x, x) + \sigma^2))`.

        Args:
            likelihood: The trained Gaussian likelihood.
            x: Test inputs. # shape: (N, D)
            batch_size: Points per forward pass.

        Returns:
            ``(mean, variance)``, each of shape ``(N,)``.

        Raises:
            InputTypeError: If ``likelihood`` is not a Gaussian likelihood.
            NotFittedError: Before :meth:`fit`.
        """
        self._check_likelihood(likelihood, "predict")
        x = as_model_input(
            x, self.variational_strategy.inducing_points, f"{type(self).__name__}.predict(x)"
        )
        self._check_fitted()
        check_rows(
            x, f"{type(self).__name__}.predict(x)",
            num_features=self.variational_strategy.inducing_points.shape[-1],
        )  # fmt: skip
        self.eval()
        means, variances = [], []
        noise = likelihood.noise * self._target_scale2()
        with torch.no_grad():
            for xb in x.split(batch_size):
                q = self(xb)  # in the original units
                means.append(q.mean)
                variances.append(self.temperature * (q.variance.clamp_min(0) + noise))
        return torch.cat(means), torch.cat(variances)

    def noise_variance(self, likelihood: gpytorch.likelihoods.GaussianLikelihood) -> torch.Tensor:
        r"""The noise variance in the targets' units, :math:`s_y^2\sigma^2` (``likelihood.noise``
        holds :math:`\sigma^2` on the standardised targets); the temperature not included."""
        self._check_likelihood(likelihood, "noise_variance")
        return likelihood.noise * self._target_scale2()

    def _check_likelihood(self, likelihood, what: str) -> None:
        if not isinstance(likelihood, gpytorch.likelihoods.GaussianLikelihood):
            raise InputTypeError(
                expected_got(
                    f"{type(self).__name__}.{what}(likelihood)",
                    "the GaussianLikelihood returned by from_data (or given to fit)",
                    type(likelihood).__name__,
                    "GWIClassificationModel is the classification model.",
                )
            )

    #: Training points on which :meth:`fit` checks the predictions (an evenly spaced subset).
    check_points: int = 1000

    def _restart_on_rows(self, likelihood, x: torch.Tensor, y: torch.Tensor) -> None:
        """Start the kernel-expansion mean at the sparse posterior mean of these rows (as
        ``from_data`` did with all rows); the prior, ``Z`` and ``L`` depend on the inputs and
        the prior fit only, and stay."""
        mean = self.variational_strategy.mean_module
        if isinstance(mean, _KernelExpansionMean):
            xs, ys = self._standardize_data(x, y)
            mean.initialize_posterior(xs, ys, float(likelihood.noise.detach().reshape(-1)[0]))

    def _check_fit(self, likelihood, x, y, result) -> None:
        r"""Warn about a degenerate fit: constant predictive means, little explained variance.

        On (an evenly spaced subset of at most :attr:`check_points` of) the training inputs,
        :func:`gpext.fit.check_predictions_vary` (the spread of :math:`m_Q` against that of
        ``y``) and :func:`gpext.fit.check_explained_variance` (:math:`R^2` of :math:`m_Q`
        against ``y``, with the learned noise in the message); the problems are recorded in
        ``result.problems``.
        """
        n = x.shape[0]
        idx = torch.linspace(0, n - 1, min(n, self.check_points), device=x.device).long()
        self.eval()
        with torch.no_grad():
            mean = torch.cat([self(xb).mean for xb in x[idx].split(2048)])
        name = f"{type(self).__name__}.fit"
        # stacklevel 4: _record -> check -> _check_fit -> fit -> the caller of fit
        check_predictions_vary(mean, y[idx], name=name, result=result, stacklevel=4)
        check_explained_variance(
            mean, y[idx], float(likelihood.noise.detach().mean()) * self._target_scale2(),
            name=name, result=result, stacklevel=4,
        )  # fmt: skip

    def _predictive_cache(self, likelihood, x):
        q = self(x)  # in the original units
        return q.mean, q.variance.clamp_min(0) + likelihood.noise * self._target_scale2()

    def _tempered_nll(self, cache, y, temperature: float) -> float:
        mean, var = cache
        var = temperature * var
        return float((0.5 * (torch.log(2 * math.pi * var) + (y - mean) ** 2 / var)).mean())

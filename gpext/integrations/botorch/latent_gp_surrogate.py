r"""Base class of the BoTorch adapters of gpext's Gaussian-process models."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.base import MCSampler
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator import to_linear_operator
from linear_operator.operators import DiagLinearOperator, LinearOperator

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query, model_dtype
from gpext.integrations.botorch._fantasize import run_fantasize
from gpext.integrations.botorch._training_data import TrainingDataMixin
from gpext.integrations.botorch.sample_ensemble_surrogate import (
    _check_output_indices,
    _subset_output_copy,
)

if TYPE_CHECKING:
    from gpext.integrations.botorch.function_draw_path import FunctionDrawPath

__all__ = ["LatentGPSurrogate"]


class LatentGPSurrogate(TrainingDataMixin, Model, ABC):
    r"""A BoTorch ``Model`` whose posterior is the Gaussian latent posterior of a gpext GP.

    For a query ``X`` of shape ``batch_shape x q x d`` the posterior is the joint Gaussian
    over the ``q`` points of the ``m`` latent functions (independent across outputs),

    .. math::

        p(\mathbf f_{1:m}(X) \mid \mathcal D) = \prod_{j=1}^m
            \mathcal N\big(\boldsymbol\mu_j(X),\ \Sigma_j(X) + [\text{noise}]\big),

    wrapped as a :class:`~botorch.posteriors.GPyTorchPosterior`: a ``MultivariateNormal``
    for one output, a ``MultitaskMultivariateNormal`` (outputs last) for several.  Input
    transforms are applied with :meth:`transform_inputs` (eval mode) and outcome transforms
    with ``untransform_posterior``, exactly as in BoTorch's ``GPyTorchModel.posterior``; a
    ``posterior_transform`` (e.g. ``ScalarizedPosteriorTransform``) acts on that Gaussian.
    :meth:`subset_output` returns a copy exposing some of the ``m`` outputs;
    :meth:`condition_on_observations` and :meth:`fantasize` return a
    :class:`~gpext.integrations.botorch.ConditionedLatentGPSurrogate` (the exact Gaussian update
    of this posterior, refit-free).

    Subclasses owe:

    * ``_latent(X) -> MultivariateNormal`` with batch shape ``(*batch, m)`` and event shape
      ``(q,)`` on transformed inputs;
    * ``_noise_variance(X) -> Tensor | None`` of shape ``(*batch, m, q)`` (``None``: the model
      has no observation-noise model);
    * optionally ``_fit_wrapped(X, Y, **kwargs)``, used by
      :func:`~gpext.integrations.botorch.fit_gpext_surrogate`;
    * the attributes ``model`` (the wrapped module), ``_num_outputs`` and ``_input_dim``.

    Args:
        train_X: Optional training inputs, needed by ``fit_gpext_surrogate``. # shape: (n, d)
        train_Y: Optional training targets (class labels for classifiers). # shape: (n, m)
        input_transform: A BoTorch ``InputTransform``.
        outcome_transform: A BoTorch ``OutcomeTransform`` (regression only); applied to
            ``train_Y`` at construction.
    """

    # outputs of the wrapped model this adapter exposes (set by ``subset_output``; None: all)
    _output_subset: list[int] | None = None
    #: Factor on the latent covariance set by
    #: :func:`~gpext.integrations.botorch.fit_gpext_surrogate`'s calibration (1: none).
    epistemic_scale: float = 1.0
    # whether fit_gpext_surrogate calibrates the variance by default (small designs)
    _calibrate_by_default: bool = False
    # Ax: several outcomes are modelled by a ModelList of adapters, never one batched adapter
    _supports_batched_models = False

    @property
    def num_outputs(self) -> int:
        """Number of latent outputs ``m``."""
        return self._num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        """The adapters hold one (non-batched) model."""
        return torch.Size([])

    @abstractmethod
    def _latent(self, X: torch.Tensor) -> MultivariateNormal:
        """Latent posterior, batch shape ``(*batch, m)``, event ``(q,)``."""

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        return None

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        raise NotFittedError(
            f"{type(self).__name__}: fit the wrapped model with its own fit method, then wrap it; "
            "fit_gpext_surrogate does not support this adapter."
        )

    def _fold_copy(self, num_rows: int) -> LatentGPSurrogate:
        """An unfitted copy of this adapter to fit on ``num_rows`` rows (calibration folds)."""
        return copy.deepcopy(self)

    def _set_variance_scale(self, scale: float) -> None:
        r"""Multiply the epistemic (latent) covariance by ``scale`` relative to the fit.

        Adapters that support :func:`~gpext.integrations.botorch.fit_gpext_surrogate`'s
        calibration override this so that every path (posterior, conditioning, function
        draws) sees the scaled covariance; ``scale`` is relative to the fitted model, and 1
        undoes an earlier scale.
        """
        raise NotFittedError(
            f"{type(self).__name__}: this adapter has no variance calibration; call "
            "fit_gpext_surrogate(model, calibrate=False)."
        )

    def posterior(
        self,
        X: torch.Tensor,
        output_indices: list[int] | None = None,
        observation_noise: bool | torch.Tensor = False,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> GPyTorchPosterior:
        r"""Joint posterior over the ``q`` points of each batch.

        Args:
            X: Query points. # shape: (*batch, q, d)
            output_indices: Outputs to keep (default all).
            observation_noise: ``True`` adds the model's noise variance; a tensor of shape
                ``(*batch, q, m)`` is added as the noise variance (in the outcome-transformed
                space).
            posterior_transform: Optional BoTorch ``PosteriorTransform``.

        Returns:
            A ``GPyTorchPosterior`` with ``mean`` of shape ``(*batch, q, m)`` (or the output of
            ``posterior_transform``).

        Raises:
            InputTypeError: If ``X`` is not a floating tensor of the model's dtype.
            ShapeError: If ``X`` is not ``batch x q x d`` or the noise tensor has the wrong shape.
            InputDataError: For non-finite ``X``, invalid ``output_indices``, or
                ``observation_noise=True`` on a model without a noise model.
        """
        what = f"{type(self).__name__}.posterior(X)"
        check_query(X, self._input_dim, model_dtype(self.model), what)
        self.eval()
        Xt = self.transform_inputs(X)
        mean, cov = self._latent_moments(Xt)  # shape: (*b, m, q), (*b, m, q, q)
        if observation_noise is not False:
            if isinstance(observation_noise, torch.Tensor):
                expected = (*mean.shape[:-2], mean.shape[-1], mean.shape[-2])
                if observation_noise.shape[-2:] != expected[-2:]:
                    raise ShapeError(
                        expected_got(
                            f"{type(self).__name__}.posterior(observation_noise)",
                            f"shape (*batch, {expected[-2]}, {expected[-1]})",
                            tuple(observation_noise.shape),
                        )
                    )
                noise = observation_noise.to(mean).transpose(-1, -2)
            else:
                noise = self._exposed_noise_variance(Xt)
                if noise is None:
                    raise InputDataError(
                        f"{type(self).__name__}.posterior: expected observation_noise=False, got "
                        "True; this model has no observation-noise model (its outputs are "
                        "latent functions)."
                    )
            noise = noise.expand(mean.shape)
            cov = cov + DiagLinearOperator(noise)
        if output_indices is not None:
            idx = _check_output_indices(
                output_indices, self.num_outputs, f"{type(self).__name__}.posterior(output_indices)"
            )
            mean, cov = mean[..., idx, :], cov[..., idx, :, :]
        if mean.shape[-2] == 1:
            dist = MultivariateNormal(mean[..., 0, :], cov[..., 0, :, :])
        else:
            dist = MultitaskMultivariateNormal.from_batch_mvn(
                MultivariateNormal(mean, cov), task_dim=-1
            )
        posterior = GPyTorchPosterior(distribution=dist)
        if hasattr(self, "outcome_transform"):
            posterior = self.outcome_transform.untransform_posterior(posterior, X=Xt)
        if posterior_transform is not None:
            return posterior_transform(posterior=posterior, X=Xt)
        return posterior

    def _latent_moments(self, Xt: torch.Tensor) -> tuple[torch.Tensor, LinearOperator]:
        """Mean ``(*b, m, q)`` and covariance ``(*b, m, q, q)`` of the exposed outputs at ``Xt``.

        ``Xt`` holds transformed inputs; the values are in the outcome-transformed space.
        """
        mvn = self._latent(Xt)
        mean, cov = mvn.mean, to_linear_operator(mvn.lazy_covariance_matrix)
        sub = self._output_subset
        if sub is not None:
            mean, cov = mean[..., sub, :], cov[..., sub, :, :]
        return mean, cov

    def _exposed_noise_variance(self, Xt: torch.Tensor) -> torch.Tensor | None:
        """The noise model's variance of the exposed outputs, ``(*b, m or 1, q)`` (or ``None``)."""
        noise = self._noise_variance(Xt)
        sub = self._output_subset
        if noise is not None and sub is not None and noise.shape[-2] != 1:
            noise = noise[..., sub, :]
        return noise

    def condition_on_observations(
        self, X: torch.Tensor, Y: torch.Tensor, noise: torch.Tensor | None = None, **kwargs: Any
    ) -> LatentGPSurrogate:
        r"""This posterior conditioned on ``Y = f(X) + eps``: a refit-free Gaussian update.

        The adapter's posterior :math:`\mathcal N(m, k)` (in the outcome-transformed space) is
        conditioned on the new observations with noise covariance
        :math:`\Sigma = \operatorname{diag}(\sigma^2)`, output by output,

        .. math::

            m'(x) = m(x) + k(x, X)\,(k(X, X) + \Sigma)^{-1}(\mathbf y - m(X)), \qquad
            k'(x, x') = k(x, x') - k(x, X)\,(k(X, X) + \Sigma)^{-1} k(X, x'),

        which is exact for the Gaussian posterior the adapter reports; the wrapped model (its
        network, inducing points and hyperparameters) is not refitted.  See
        :class:`~gpext.integrations.botorch.ConditionedLatentGPSurrogate`.

        Args:
            X: New inputs. # shape: (*batch_x, n', d)
            Y: Observations in the original outcome space (they are passed through the
                outcome transform, as BoTorch's models do). # shape: (*batch_y, n', m)
            noise: Noise variances :math:`\sigma^2` in the outcome-transformed space
                (BoTorch convention), broadcastable to ``Y``. Default: the model's noise
                variance (:math:`T\sigma^2` for GWI regression, the likelihood noise for IGN
                regression); for latent-only models (classifiers) the latent values are
                observed without noise (a small jitter keeps the update stable).
            **kwargs: Ignored (BoTorch passes model-specific options here).

        Returns:
            A :class:`~gpext.integrations.botorch.ConditionedLatentGPSurrogate` (holding this
            adapter by reference, not a copy) of batch shape
            ``broadcast(batch_x, batch_y)`` (for a conditioned model also broadcast with its
            own batch shape).

        Raises:
            InputTypeError: If ``X``, ``Y`` or ``noise`` are not floating tensors of the
                model's dtype.
            ShapeError: If the shapes do not match (``n'``, ``m``, ``d``, batch dimensions).
            InputDataError: For non-finite values or negative noise.
        """
        from gpext.integrations.botorch.conditioned_latent_gp_surrogate import (
            ConditionedLatentGPSurrogate,
        )

        return ConditionedLatentGPSurrogate(self, X, Y, noise)

    def fantasize(
        self,
        X: torch.Tensor,
        sampler: MCSampler,
        observation_noise: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> LatentGPSurrogate:
        r"""A fantasy model: this model conditioned on ``Y`` drawn from its own predictive.

        As BoTorch's ``Model.fantasize``: draw :math:`\mathbf y \sim p(\mathbf y(X) \mid
        \mathcal D)` with ``sampler`` from :meth:`posterior` with observation noise, then
        :meth:`condition_on_observations` on it, so the fantasy model has batch shape
        ``sampler.sample_shape x batch``.  For a model without a noise model (a classifier's
        latents), the draws are of the latent values and the conditioning is noise-free (up to
        a jitter).

        Args:
            X: Points to fantasize at. # shape: (*batch, n', d)
            sampler: A BoTorch ``MCSampler`` (e.g. ``SobolQMCNormalSampler``).
            observation_noise: ``None`` (the model's noise) or noise variances in the
                outcome-transformed space, of shape ``(*batch, 1, m)`` or ``(*batch, n', m)``.
            **kwargs: ``propagate_grads`` (BoTorch's setting while computing the posterior at
                ``X``); the rest goes to :meth:`condition_on_observations`.

        Returns:
            The conditioned model. Its posterior at ``(*batch, q, d)`` has mean of shape
            ``sampler.sample_shape x batch x q x m``.

        Raises:
            InputTypeError: If ``observation_noise`` is neither ``None`` nor a tensor (BoTorch
                no longer takes booleans here), or ``X`` is not a floating tensor.
            ShapeError: If ``X`` or ``observation_noise`` have the wrong shape.
        """

        def draw(Xq: torch.Tensor, obs: torch.Tensor | None) -> torch.Tensor:
            if obs is None:
                Xt = self.transform_inputs(Xq)
                has_noise = self._noise_variance(Xt) is not None
                return sampler(self.posterior(Xq, observation_noise=has_noise))
            return sampler(self.posterior(Xq, observation_noise=obs))

        return run_fantasize(self, X, sampler, observation_noise, draw, kwargs)

    def draw_functions(
        self,
        sample_shape: torch.Size | int = 1,
        *,
        num_features: int = 1024,
        generator: torch.Generator | None = None,
    ) -> FunctionDrawPath:
        r"""Thompson sampling by function draws: pathwise samples of the posterior.

        Each draw is a function, the pathwise update of a random-feature prior draw
        (Wilson et al. 2020, "Efficiently sampling functions from Gaussian process
        posteriors", Eq. 13, for the inducing-point posterior the subclasses report),

        .. math::

            f_i(x) = \mu(x) + s\big(f_{0,i}(x) - k_{xZ}K_{ZZ}^{-1} f_{0,i}(Z)
                + k_{xZ} L\boldsymbol\varepsilon_i\big), \qquad
            f_{0,i}(x) = \phi(x)^\top \mathbf w_i,\ \mathbf w_i, \boldsymbol\varepsilon_i
                \sim \mathcal N(0, I),

        with ``num_features`` random Fourier features :math:`\phi` of the kernel (BoTorch's
        ``gen_kernel_features``).  The update is exact: the draws' mean is the posterior mean
        and their covariance the posterior covariance up to the random-feature error of the
        prior, :math:`O(F^{-1/2})`, and a term of the order of the jitter on :math:`K_{ZZ}`.
        BoTorch's ``draw_matheron_paths`` and hence ``PathwiseThompsonSampling`` call this
        method.  Available for the single-output
        regression adapters (``IGNSurrogate``: :math:`\mu = k_{xZ}K_{ZZ}^{-1}\mathbf r`,
        :math:`s = 1`, :math:`L = 0` on the network features; ``GWISurrogate``:
        :math:`\mu = m_Q`, :math:`s = \sqrt T`); for the other adapters Thompson sampling
        over a finite candidate set with BoTorch's ``MaxPosteriorSampling`` (exact joint
        draws of ``posterior(X_cand)``) is the fallback.  The draws are tied to the model as
        fitted when they are made (their update term is precomputed): draw again after
        refitting.

        Args:
            sample_shape: Number (or shape) of draws.
            num_features: Random Fourier features of the prior draw (even).
            generator: Random generator of the draws.

        Returns:
            A :class:`~gpext.integrations.botorch.FunctionDrawPath` (values in the original
            outcome space).

        Raises:
            InputTypeError: For a bad ``sample_shape``.
            InputDataError: If the adapter has no pathwise sampler (classifiers, conditioned
                models, ``DirichletClassifierSurrogate``) or its kernel has no random-feature
                form.
        """
        from gpext.integrations.botorch.function_draw_path import (
            FunctionDrawPath,
            _as_sample_shape,
            _LatentDraws,
        )

        name = f"{type(self).__name__}.draw_functions"
        shape = _as_sample_shape(sample_shape, f"{name}(sample_shape)")
        self.eval()
        with torch.no_grad():
            latent = self._latent_paths(shape, num_features, generator)
        return FunctionDrawPath(self, _LatentDraws(self, latent), shape)

    def _latent_paths(
        self, sample_shape: torch.Size, num_features: int, generator: torch.Generator | None
    ) -> torch.nn.Module:
        """Module mapping transformed inputs ``(*b, n, d)`` to latent draws ``(*B, n)``."""
        raise InputDataError(
            expected_got(
                f"{type(self).__name__}.draw_functions",
                "a single-output regression adapter with a pathwise sampler (IGNSurrogate, "
                "GWISurrogate)",
                type(self).__name__,
                "Use botorch's MaxPosteriorSampling on a finite candidate set (exact joint "
                "draws of posterior(X_cand)).",
            )
        )

    def subset_output(self, idcs: list[int]) -> LatentGPSurrogate:
        """A copy of the adapter whose posterior has only the outputs ``idcs``.

        The outputs are independent given the data (see the class), so the subset posterior is
        the marginal of the selected latent functions.

        Args:
            idcs: Output indices in ``[0, num_outputs)``.

        Returns:
            A deep copy with ``num_outputs == len(idcs)``; its posterior equals this model's
            posterior with ``output_indices=idcs``.  A classifier's :meth:`class_probabilities`
            are unaffected (they use every latent function).

        Raises:
            InputTypeError: If ``idcs`` is not a list of integers.
            InputDataError: If ``idcs`` is empty or out of range.
            NotImplementedError: (BoTorch's) if the outcome transform cannot be subset.
        """
        return _subset_output_copy(self, idcs)

    def class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        """Predictive class probabilities (classifiers only); differentiable in ``X``.

        Args:
            X: Query points. # shape: (*batch, q, d)

        Returns:
            Probabilities. # shape: (*batch, q, C)

        Raises:
            InputDataError: For a regression model.
        """
        what = f"{type(self).__name__}.class_probabilities(X)"
        check_query(X, self._input_dim, model_dtype(self.model), what)
        self.eval()
        return self._class_probabilities(self.transform_inputs(X))

    def _class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        raise InputDataError(
            f"{type(self).__name__}.class_probabilities: expected a classifier, got a regression "
            "model."
        )

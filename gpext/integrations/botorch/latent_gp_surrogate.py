r"""Base class of the BoTorch adapters of gpext's Gaussian-process models."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.model import Model
from botorch.posteriors.gpytorch import GPyTorchPosterior
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator import to_linear_operator
from linear_operator.operators import DiagLinearOperator

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query, model_dtype
from gpext.integrations.botorch._training_data import TrainingDataMixin
from gpext.integrations.botorch.sample_ensemble_surrogate import (
    _check_output_indices,
    _subset_output_copy,
)

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
    :meth:`subset_output` returns a copy exposing some of the ``m`` outputs.

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
        mvn = self._latent(Xt)
        mean, cov = (
            mvn.mean,
            to_linear_operator(mvn.lazy_covariance_matrix),
        )  # shape: (*b, m, q), (*b, m, q, q)
        sub = self._output_subset
        if sub is not None:
            mean, cov = mean[..., sub, :], cov[..., sub, :, :]
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
                noise = self._noise_variance(Xt)
                if noise is None:
                    raise InputDataError(
                        f"{type(self).__name__}.posterior: expected observation_noise=False, got "
                        "True; this model has no observation-noise model (its outputs are "
                        "latent functions)."
                    )
                if sub is not None and noise.shape[-2] != 1:
                    noise = noise[..., sub, :]
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

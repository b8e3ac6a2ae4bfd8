r"""Base class of the BoTorch adapters of gpext's sample-based models (ensembles of functions)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch
from botorch.acquisition.objective import PosteriorTransform
from botorch.models.ensemble import EnsembleModel
from botorch.posteriors.ensemble import EnsemblePosterior

from gpext.errors import InputDataError, NotFittedError, expected_got
from gpext.integrations.botorch._checks import check_query, model_dtype
from gpext.integrations.botorch._training_data import TrainingDataMixin

__all__ = ["SampleEnsembleSurrogate"]


class SampleEnsembleSurrogate(TrainingDataMixin, EnsembleModel, ABC):
    r"""A BoTorch ``EnsembleModel`` over ``S`` sampled functions :math:`f^{(1)}, \dots, f^{(S)}`.

    The posterior at ``X`` (``batch_shape x q x d``) is the
    :class:`~botorch.posteriors.ensemble.EnsemblePosterior` of the member values
    ``batch_shape x S x q x m``: its mean is the member average, its variance the (unbiased)
    spread of the members,

    .. math::

        \bar f(x) = \frac1S \sum_{s=1}^S f^{(s)}(x), \qquad
        \operatorname{Var}[f(x)] = \frac{1}{S - 1}\sum_{s=1}^S \big(f^{(s)}(x) - \bar f(x)\big)^2,

    and its samples are whole members (BoTorch's ``IndexSampler`` draws member indices), so a
    posterior sample is a function: Monte Carlo acquisition functions see joint samples over the
    ``q`` points and Thompson sampling maximises one member.  The members are fixed once the
    model is built, so acquisition values are deterministic.

    Subclasses owe ``_members(X) -> Tensor`` mapping ``(N, d)`` inputs to ``(S, N, m)``
    member outputs (differentiable in ``X``), the attributes ``model``, ``_num_outputs`` and
    ``_input_dim``, and optionally ``_fit_wrapped(X, Y, **kwargs)`` and
    ``_member_class_probabilities(X)``.

    Args:
        train_X: Optional training inputs. # shape: (n, d)
        train_Y: Optional training targets. # shape: (n, m)
        input_transform: BoTorch ``InputTransform``.
        outcome_transform: BoTorch ``OutcomeTransform``; member values are untransformed (as in
            ``EnsembleModel.posterior``).
    """

    @property
    def batch_shape(self) -> torch.Size:
        """The adapters hold one (non-batched) ensemble."""
        return torch.Size([])

    @abstractmethod
    def _members(self, X: torch.Tensor) -> torch.Tensor:
        """Member outputs ``(S, N, m)`` at inputs ``(N, d)``."""

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        raise NotFittedError(
            f"{type(self).__name__}: fit_gpext_surrogate does not support this adapter; build "
            "it from a fitted model (see its class methods)."
        )

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Member values at ``X`` (``batch x q x d``), shape ``batch x S x q x m``."""
        flat = X.reshape(-1, X.shape[-1])
        out = self._members(flat)  # shape: (S, N, m)
        out = out.reshape(out.shape[0], *X.shape[:-1], out.shape[-1])
        return out.movedim(0, -3)

    def posterior(
        self,
        X: torch.Tensor,
        output_indices: list[int] | None = None,
        posterior_transform: PosteriorTransform | None = None,
        **kwargs: Any,
    ) -> EnsemblePosterior:
        r"""The ensemble posterior at ``X`` (see ``EnsembleModel.posterior``).

        Args:
            X: Query points. # shape: (*batch, q, d)
            output_indices: Outputs to keep (default all).
            posterior_transform: Optional BoTorch ``PosteriorTransform``.
            **kwargs: ``observation_noise`` (``True`` is ignored, the members are latent
                functions; a tensor raises BoTorch's ``UnsupportedError``).

        Returns:
            An ``EnsemblePosterior`` with values of shape ``(*batch, S, q, m)``.

        Raises:
            InputTypeError: If ``X`` is not a floating tensor of the model's dtype.
            ShapeError: If ``X`` is not ``batch x q x d``.
            InputDataError: For non-finite ``X`` or invalid ``output_indices``.
        """
        check_query(
            X, self._input_dim, model_dtype(self.model), f"{type(self).__name__}.posterior(X)"
        )
        if output_indices is not None and (
            not list(output_indices) or any(not 0 <= i < self.num_outputs for i in output_indices)
        ):
            raise InputDataError(
                expected_got(
                    f"{type(self).__name__}.posterior(output_indices)",
                    f"a non-empty list of indices in [0, {self.num_outputs})",
                    output_indices,
                )
            )
        return super().posterior(
            X, output_indices=output_indices, posterior_transform=posterior_transform, **kwargs
        )

    def class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        """Member-averaged class probabilities (classifiers only); differentiable in ``X``.

        Args:
            X: Query points. # shape: (*batch, q, d)

        Returns:
            Probabilities. # shape: (*batch, q, C)

        Raises:
            InputDataError: For a regression model.
        """
        check_query(
            X,
            self._input_dim,
            model_dtype(self.model),
            f"{type(self).__name__}.class_probabilities(X)",
        )
        self.eval()
        Xt = self.transform_inputs(X)
        flat = Xt.reshape(-1, Xt.shape[-1])
        probs = self._member_class_probabilities(flat).mean(0)  # shape: (N, C)
        return probs.reshape(*X.shape[:-1], probs.shape[-1])

    def _member_class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        raise InputDataError(
            f"{type(self).__name__}.class_probabilities: expected a classifier, got a regression "
            "model."
        )

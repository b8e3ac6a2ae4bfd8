r"""BoTorch adapter of sampled network weights: SWAG, MultiSWAG and subspace (ESS / VI) posteriors."""

from __future__ import annotations

import math

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate
from gpext.subspace import (
    SWAG,
    FlatParameters,
    MultiSWAG,
    OutputLikelihood,
    SubspaceModel,
    WeightPosterior,
)
from gpext.utils import check_finite, check_positive_int

__all__ = ["WeightEnsembleSurrogate"]


class WeightEnsembleSurrogate(SampleEnsembleSurrogate):
    r"""A network evaluated at ``S`` sampled weight vectors, as a BoTorch ``EnsembleModel``.

    Member ``s`` is :math:`f_{w_s}` (evaluated functionally, the network's own parameters are not
    touched), read through an :class:`~gpext.subspace.OutputLikelihood`: the predicted mean for
    ``"gaussian"`` and ``"heteroscedastic_gaussian"`` outputs (one BoTorch output), the logits
    for ``"categorical"`` (``C`` outputs; :meth:`class_probabilities` average the softmax).
    The weights come from any weight posterior,

    .. math::

        w_s \sim \mathcal N\big(\bar w, \tfrac{\text{scale}}{2}(\Sigma_{\text{diag}}
            + \Sigma_{\text{low-rank}})\big) \text{ (SWAG)}, \qquad
        w_s = \hat w + P^\top \theta_s,\ \theta_s \sim p(\theta \mid \mathcal D)
            \text{ (subspace ESS / VI, 000 Eq. 2)},

    built by :meth:`from_swag` (a :class:`~gpext.subspace.SWAG` or
    :class:`~gpext.subspace.MultiSWAG`), :meth:`from_posterior` (any
    :class:`~gpext.subspace.WeightPosterior`, e.g. online factor analysis) or :meth:`from_subspace` (a
    :class:`~gpext.subspace.SubspaceModel` and its samples).
    :func:`~gpext.integrations.botorch.fit_weight_ensemble` trains one from data.
    Observation noise (regression): member :math:`s` predicts the noise variance
    :math:`\kappa\,\sigma^2_{w_s}(x)` (the heteroscedastic head's variance, or the fixed
    ``noise_variance`` of ``"gaussian"``, times :attr:`variance_scale` :math:`\kappa`);
    ``posterior(X, observation_noise=True)`` is the mixture of the members with their own
    noise, and ``condition_on_observations`` and ``fantasize`` use the members' mean noise
    variance.

    Args:
        module: The network (in eval mode; batch-norm statistics are the module's own).
        weights: Sampled flat weights. # shape: (S, D)
        likelihood: How to read the output (default ``OutputLikelihood("gaussian")``).
        input_dim: ``d`` of the queries (default ``module.in_features`` when it exists).
        input_transform: BoTorch ``InputTransform`` used when the network was trained.
        outcome_transform: BoTorch ``OutcomeTransform`` (regression), already fitted to the
            training targets; members are untransformed.

    Raises:
        InputTypeError: If ``module`` is not a ``torch.nn.Module``.
        ShapeError: If ``weights`` is not ``(S, D)`` with ``D`` the module's parameter count.
        InputDataError: If ``weights`` has non-finite entries or fewer than two rows.

    Example:
        >>> import torch
        >>> from gpext.integrations.botorch import WeightEnsembleSurrogate
        >>> from gpext.nn import HeteroscedasticMLP
        >>> from gpext.subspace import SWAG, OutputLikelihood, train_sgd_trajectory
        >>> d = 2
        >>> X = torch.rand(20, d, generator=torch.Generator().manual_seed(0))
        >>> y = (6 * X).sin().sum(-1)
        >>> net = HeteroscedasticMLP(d, [16])
        >>> trajectory = train_sgd_trajectory(
        ...     net, X, y, OutputLikelihood("heteroscedastic_gaussian"), epochs=40, swa_start=20)
        >>> swag = SWAG.from_trajectory(trajectory)
        >>> model = WeightEnsembleSurrogate.from_swag(net, swag, 32,
        ...     likelihood=OutputLikelihood("heteroscedastic_gaussian"))
        >>> model.posterior(torch.rand(4, 1, d)).mean.shape
        torch.Size([4, 1, 1])
    """

    # factor on the members' predicted noise variances (see ``variance_scale``)
    _variance_scale: float = 1.0

    def __init__(
        self,
        module: nn.Module,
        weights: torch.Tensor,
        likelihood: OutputLikelihood | None = None,
        *,
        input_dim: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = None,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise InputTypeError(
                expected_got("WeightEnsembleSurrogate.module", "a torch.nn.Module", type(module))
            )
        flat = FlatParameters(module)
        if not isinstance(weights, torch.Tensor) or weights.dim() != 2:
            raise ShapeError(
                expected_got(
                    "WeightEnsembleSurrogate.weights",
                    f"a tensor of shape (S, {flat.num_parameters})",
                    getattr(weights, "shape", type(weights).__name__),
                )
            )
        if weights.shape[-1] != flat.num_parameters or weights.shape[0] < 2:
            raise ShapeError(
                expected_got(
                    "WeightEnsembleSurrogate.weights",
                    f"shape (S, {flat.num_parameters}) with S >= 2",
                    tuple(weights.shape),
                )
            )
        check_finite(weights, "WeightEnsembleSurrogate.weights")
        likelihood = likelihood or OutputLikelihood("gaussian")
        if not isinstance(likelihood, OutputLikelihood):
            raise InputTypeError(
                expected_got(
                    "WeightEnsembleSurrogate.likelihood",
                    "an OutputLikelihood",
                    type(likelihood).__name__,
                )
            )
        self._input_dim = (
            input_dim if input_dim is not None else getattr(module, "in_features", None)
        )
        super().__init__(input_transform=input_transform)
        if outcome_transform is not None:
            self.outcome_transform = outcome_transform.eval()
        self.model = module.eval()
        self.flat = flat
        self.likelihood = likelihood
        self.register_buffer("sample_weights", weights.detach().clone())
        self._num_outputs = 1
        if not likelihood.is_regression:
            with torch.no_grad():
                probe = torch.zeros(1, self._input_dim or 1, dtype=weights.dtype)
                try:
                    self._num_outputs = int(flat.functional_call(weights[0], probe).shape[-1])
                except (RuntimeError, TypeError) as err:
                    raise InputDataError(
                        "WeightEnsembleSurrogate: could not infer the number of classes of a "
                        "categorical network; give the module an `in_features` attribute."
                    ) from err

    @classmethod
    def from_posterior(
        cls,
        module: nn.Module,
        posterior: WeightPosterior,
        num_samples: int,
        *,
        likelihood: OutputLikelihood | None = None,
        generator: torch.Generator | None = None,
        input_dim: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = None,
        **sample_kwargs,
    ) -> WeightEnsembleSurrogate:
        """Members drawn from any weight posterior: SWAG, factor analysis, a mixture.

        Args:
            module: The network the weights belong to.
            posterior: A :class:`~gpext.subspace.WeightPosterior` over ``module``'s flat
                weights (:class:`~gpext.subspace.SWAG`,
                :class:`~gpext.subspace.OnlineFactorAnalysis`,
                :class:`~gpext.subspace.MultiSWAG` / :class:`~gpext.subspace.WeightMixture`).
            num_samples: Number of members ``S`` (in all, also for mixtures).
            likelihood: How to read the output.
            generator: Random generator of the draws.
            input_dim: See the class.
            input_transform: See the class.
            outcome_transform: See the class.
            **sample_kwargs: Passed to ``posterior.sample`` (e.g. ``scale``).

        Returns:
            The adapter.

        Raises:
            InputTypeError: If ``posterior`` is not a weight posterior.
        """
        if not isinstance(posterior, WeightPosterior):
            raise InputTypeError(
                expected_got(
                    "WeightEnsembleSurrogate.from_posterior(posterior)",
                    "a gpext.subspace.WeightPosterior (SWAG, OnlineFactorAnalysis, MultiSWAG, "
                    "WeightMixture)",
                    type(posterior).__name__,
                )
            )
        n = check_positive_int(num_samples, "WeightEnsembleSurrogate.from_posterior(num_samples)")
        weights = posterior.sample(n, generator=generator, **sample_kwargs)
        return cls(
            module,
            weights,
            likelihood,
            input_dim=input_dim,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )

    @classmethod
    def from_swag(
        cls,
        module: nn.Module,
        posterior: SWAG | MultiSWAG,
        num_samples: int,
        *,
        scale: float = 0.5,
        likelihood: OutputLikelihood | None = None,
        generator: torch.Generator | None = None,
        input_dim: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = None,
    ) -> WeightEnsembleSurrogate:
        """Members drawn from a SWAG or MultiSWAG posterior (see :meth:`from_posterior`).

        Args:
            module: The network the weights belong to.
            posterior: The weight posterior.
            num_samples: ``S`` (MultiSWAG: per component, ``S * M`` members in all).
            scale: SWAG covariance scale.
            likelihood: How to read the output.
            generator: Random generator of the draws.
            input_dim: See the class.
            input_transform: See the class.
            outcome_transform: See the class.

        Returns:
            The adapter.

        Raises:
            InputTypeError: If ``posterior`` is not a SWAG or MultiSWAG.
        """
        if not isinstance(posterior, (SWAG, MultiSWAG)):
            raise InputTypeError(
                expected_got(
                    "WeightEnsembleSurrogate.from_swag(posterior)",
                    "a SWAG or MultiSWAG (from_posterior takes any weight posterior)",
                    type(posterior).__name__,
                )
            )
        n = check_positive_int(num_samples, "WeightEnsembleSurrogate.from_swag(num_samples)")
        if isinstance(posterior, MultiSWAG):
            n = n * posterior.num_components
        return cls.from_posterior(
            module,
            posterior,
            n,
            scale=scale,
            likelihood=likelihood,
            generator=generator,
            input_dim=input_dim,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )

    @classmethod
    def from_subspace(
        cls,
        model: SubspaceModel,
        thetas: torch.Tensor,
        *,
        input_dim: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = None,
    ) -> WeightEnsembleSurrogate:
        r"""Members :math:`\hat w + P^\top\theta_s` of a subspace model's samples (ESS or VI).

        The adapter's :attr:`variance_scale` is the model's ``variance_scale`` (its calibrated
        factor on the predicted noise variances).

        Args:
            model: The :class:`~gpext.subspace.SubspaceModel`.
            thetas: Subspace samples (``model.sample_ess`` / ``model.sample_vi``). # shape: (S, r)
            input_dim: See the class.
            input_transform: See the class.
            outcome_transform: See the class.

        Returns:
            The adapter.

        Raises:
            InputTypeError: If ``model`` is not a ``SubspaceModel``.
        """
        if not isinstance(model, SubspaceModel):
            raise InputTypeError(
                expected_got(
                    "WeightEnsembleSurrogate.from_subspace(model)",
                    "a SubspaceModel",
                    type(model).__name__,
                )
            )
        if not isinstance(thetas, torch.Tensor) or thetas.dim() != 2:
            raise ShapeError(
                expected_got(
                    "WeightEnsembleSurrogate.from_subspace(thetas)",
                    f"shape (S, {model.rank})",
                    getattr(thetas, "shape", type(thetas).__name__),
                )
            )
        out = cls(
            model.module,
            model.weights(thetas),
            model.likelihood,
            input_dim=input_dim,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )
        out.variance_scale = model.variance_scale
        return out

    @property
    def variance_scale(self) -> float:
        r"""Factor :math:`\kappa` on the members' predicted noise variances (default 1).

        :meth:`from_subspace` copies the subspace model's calibrated ``variance_scale``
        (:meth:`gpext.subspace.SubspaceModel.calibrate_variance`).

        Raises:
            InputDataError: (setter) For a value that is not a positive finite number.
        """
        return self._variance_scale

    @variance_scale.setter
    def variance_scale(self, value: float) -> None:
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            value = float(value)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise InputDataError(
                expected_got(
                    "WeightEnsembleSurrogate.variance_scale", "a positive finite number", value
                )
            )
        self._variance_scale = float(value)

    @property
    def num_members(self) -> int:
        """Number of members ``S``."""
        return int(self.sample_weights.shape[0])

    def _outputs(self, X: torch.Tensor) -> torch.Tensor:
        self.model.eval()
        return torch.func.vmap(lambda w: self.flat.functional_call(w, X))(self.sample_weights)

    def _members(self, X: torch.Tensor) -> torch.Tensor:
        out = self._outputs(X)  # shape: (S, N, o)
        if self.likelihood.is_regression:
            return self.likelihood.mean_variance(out)[0].reshape(out.shape[0], X.shape[0], 1)
        return out

    def _member_noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        # each member's predicted noise variance (the fixed variance of "gaussian"), scaled
        if not self.likelihood.is_regression:
            return None
        var = self.likelihood.mean_variance(self._outputs(X))[1]  # shape: (S, N)
        return (self.variance_scale * var).reshape(var.shape[0], X.shape[0], 1)

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        # the members' mean predicted noise variance
        var = self._member_noise_variance(X)
        return None if var is None else var.mean(0)

    def _member_class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        if self.likelihood.is_regression:
            return super()._member_class_probabilities(X)
        return self.likelihood.predictive_probs(self._outputs(X))

r"""BoTorch adapter of sampled network weights: SWAG, MultiSWAG and subspace (ESS / VI) posteriors."""

from __future__ import annotations

import math
from typing import Any

import torch
from botorch.utils.datasets import SupervisedDataset
from torch import nn

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.integrations.botorch._construct_inputs import dataset_tensors, reject_options
from gpext.integrations.botorch._training_data import take_over_state
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
        module: The network (in eval mode; batch-norm statistics are the module's own), or
            ``None`` together with ``weights`` for an ensemble trained from ``train_X``.
        weights: Sampled flat weights (or ``None``, see ``module``). # shape: (S, D)
        likelihood: How to read the output (default ``OutputLikelihood("gaussian")``).
        input_dim: ``d`` of the queries (default ``module.in_features`` when it exists).
        input_transform: BoTorch ``InputTransform`` used when the network was trained.
        outcome_transform: BoTorch ``OutcomeTransform`` (regression), already fitted to the
            training targets; members are untransformed.
        train_X: With ``module=None`` and ``weights=None`` only: training inputs; the
            ensemble is then trained by :func:`~gpext.integrations.botorch.fit_weight_ensemble`
            at :func:`~gpext.integrations.botorch.fit_gpext_surrogate` (on the transformed
            data; :meth:`construct_inputs`, Ax's route, builds it this way). # shape: (n, d)
        train_Y: Its targets (the outcome transform is fitted to them). # shape: (n, 1)

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

    # one outcome per model: Ax fits a ModelList of adapters for several outcomes
    _supports_batched_models = False
    # built by construct_inputs / from training data: the fit trains the ensemble
    _built_from_data = False

    def __init__(
        self,
        module: nn.Module | None = None,
        weights: torch.Tensor | None = None,
        likelihood: OutputLikelihood | None = None,
        input_dim: int | None = None,
        input_transform: nn.Module | None = None,
        outcome_transform: nn.Module | None = None,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
    ) -> None:
        if module is None and weights is None:
            self._init_from_data(
                train_X, train_Y, likelihood, input_dim, input_transform, outcome_transform
            )
            return
        if train_X is not None or train_Y is not None:
            raise InputDataError(
                expected_got(
                    "WeightEnsembleSurrogate(train_X, train_Y)",
                    "None with a module and weights (train_X and train_Y are for an ensemble "
                    "trained at fit time: module=None, weights=None)",
                    "training data",
                )
            )
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
                probe = torch.zeros(
                    1, self._input_dim or 1, dtype=weights.dtype, device=weights.device
                )
                try:
                    self._num_outputs = int(flat.functional_call(weights[0], probe).shape[-1])
                except (RuntimeError, TypeError) as err:
                    raise InputDataError(
                        "WeightEnsembleSurrogate: could not infer the number of classes of a "
                        "categorical network; give the module an `in_features` attribute."
                    ) from err

    def _init_from_data(
        self,
        train_X: torch.Tensor | None,
        train_Y: torch.Tensor | None,
        likelihood: OutputLikelihood | None,
        input_dim: int | None,
        input_transform: nn.Module | None,
        outcome_transform: nn.Module | None,
    ) -> None:
        # no members yet: fit_gpext_surrogate trains them with fit_weight_ensemble
        if train_X is None or train_Y is None or likelihood is not None:
            raise InputDataError(
                expected_got(
                    "WeightEnsembleSurrogate(module=None, weights=None)",
                    "train_X and train_Y and no likelihood (the ensemble is trained by "
                    "fit_weight_ensemble at the first fit)",
                    "missing training data or a likelihood",
                    "Or pass a module and sampled weights.",
                )
            )
        if not isinstance(train_Y, torch.Tensor) or train_Y.dim() != 2 or train_Y.shape[-1] != 1:
            raise ShapeError(
                expected_got(
                    "WeightEnsembleSurrogate train_Y",
                    "a tensor of shape (n, 1)",
                    tuple(getattr(train_Y, "shape", ())) or type(train_Y).__name__,
                )
            )
        if input_dim is None and isinstance(train_X, torch.Tensor) and train_X.dim() == 2:
            input_dim = int(train_X.shape[-1])  # else attach_training_data raises
        self._input_dim = input_dim
        super().__init__(
            train_X=train_X,
            train_Y=train_Y,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )
        self.model, self.flat, self.likelihood = None, None, None
        self.register_buffer("sample_weights", None)
        self._num_outputs = 1
        self._built_from_data = True

    @classmethod
    def construct_inputs(cls, training_data: SupervisedDataset, **options: Any) -> dict[str, Any]:
        """Constructor arguments for an ensemble trained from a dataset at fit time (used by Ax).

        ``WeightEnsembleSurrogate(train_X=X, train_Y=Y)`` has no members until
        :func:`~gpext.integrations.botorch.fit_gpext_surrogate` runs
        :func:`~gpext.integrations.botorch.fit_weight_ensemble` on the transformed training
        data (its keyword arguments, e.g. ``method="pca_ess"``, are the fit's; through Ax,
        ``ModelConfig.mll_options``).

        Args:
            training_data: A ``SupervisedDataset`` with one outcome.
            **options: None accepted (see above).

        Returns:
            ``{"train_X", "train_Y"}``.

        Raises:
            InputTypeError: If ``training_data`` is not a ``SupervisedDataset``.
            ShapeError: If the dataset has more than one outcome.
            InputDataError: If options are given.
        """
        X, Y = dataset_tensors(training_data, "WeightEnsembleSurrogate.construct_inputs")
        reject_options(
            options,
            "WeightEnsembleSurrogate.construct_inputs",
            "The ensemble is trained at fit time: pass fit_weight_ensemble's arguments to the "
            "fit (Ax: ModelConfig.mll_options).",
        )
        return {"train_X": X, "train_Y": Y}

    # fit_weight_ensemble calibrates the spread itself (small designs)
    _calibrates_in_fit = True

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        if not self._built_from_data:  # members given by the user: not refitted
            super()._fit_wrapped(X, Y, **kwargs)
        from gpext.integrations.botorch.fit_weight_ensemble import fit_weight_ensemble

        bad = sorted({"input_transform", "outcome_transform"} & set(kwargs))
        reject_options(
            dict.fromkeys(bad),
            "WeightEnsembleSurrogate fit",
            "The adapter's own transforms are applied; give them to the constructor.",
        )
        if "standardize" not in kwargs:  # the data contract, not twice: what the adapter's
            # own transforms did to X and Y is not done again inside
            parts = (getattr(self, "input_transform", None) is None,
                     getattr(self, "outcome_transform", None) is None)  # fmt: skip
            kwargs["standardize"] = {(True, True): True, (True, False): "inputs",
                                     (False, True): "targets", (False, False): False}[parts]  # fmt: skip
        fitted = fit_weight_ensemble(X, Y, **kwargs)  # on the transformed data
        own = ("input_transform", "outcome_transform", "train_X", "train_Y", "_built_from_data")
        take_over_state(self, fitted, own)

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
        if self.sample_weights is None:
            raise NotFittedError(
                "WeightEnsembleSurrogate: built from training data, no members yet; fit it "
                "with fit_gpext_surrogate first."
            )
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

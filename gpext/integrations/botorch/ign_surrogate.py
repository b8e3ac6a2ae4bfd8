r"""BoTorch adapter of :class:`gpext.models.InducingGPNetwork`."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from botorch.utils.datasets import SupervisedDataset
from gpytorch.distributions import MultivariateNormal
from gpytorch.kernels import ScaleKernel
from linear_operator import to_linear_operator

from gpext.errors import InputTypeError, NotFittedError, expected_got
from gpext.integrations.botorch._construct_inputs import dataset_tensors
from gpext.integrations.botorch._training_data import labels_from_targets
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.models import InducingGPNetwork
from gpext.nn import MLP, InputAugmentedEmbedding
from gpext.utils import check_positive_int

__all__ = ["IGNSurrogate"]


class IGNSurrogate(LatentGPSurrogate):
    r"""An :class:`~gpext.models.InducingGPNetwork` as a BoTorch model.

    The posterior is 002 Eq. 7 on the embedded query points,

    .. math::

        f(X) \mid \mathcal D \sim \mathcal N\big(K_{XZ}K_{ZZ}^{-1}\mathbf r,\
            K_{XX} - K_{XZ}K_{ZZ}^{-1}K_{ZX}\big),

    with kernels on the features :math:`g(X)`; ``observation_noise=True`` adds the Gaussian
    noise of the regression task.  Outputs: one for ``"regression"`` and ``"binary"`` (the
    probit latent), ``C`` for ``"one_vs_all"`` and ``"dirichlet"`` (one latent per class).

    Uncertainty away from the data, measured: on Branin with 12 scrambled-Sobol points
    (seeds 0-2, :meth:`construct_inputs`' defaults, cross-validated calibration, 512 uniform
    test points), the correlation between the posterior sd and the distance to the nearest
    training point was 0.09-0.20 (``SingleTaskGP``: 0.80-0.84), and the correlation with the
    distance to the box centre 0.87-0.94: the sd grows towards the corners of the box more
    than into the gaps between the points.  The learned feature-space lengthscales (about 1)
    exceed the spread of the training features (pairwise distances at most 1.15), so the
    GP is close to its linear regime.  Capping them at 0.5 or 1 times the median pairwise
    input distance made the mean worse (normalised RMSE 0.89-1.0 in 3 of 6 fits, against
    0.30-0.49) without making the sd distance aware (correlations -0.09 to 0.18).  The
    calibration factor (``epistemic_scale``, 13-144 in these fits) widens the intervals
    uniformly.  ``benchmarks/bo.py`` records this correlation per fit
    (``sd_distance_corr``).

    Args:
        model: The network (fitted, or fitted later by
            :func:`~gpext.integrations.botorch.fit_gpext_surrogate`).
        train_X: Training inputs for ``fit_gpext_surrogate``. # shape: (n, d)
        train_Y: Targets ``(n, 1)`` (class labels for the classification tasks).
        input_transform: BoTorch ``InputTransform`` (e.g. ``Normalize(d)``).
        outcome_transform: BoTorch ``OutcomeTransform`` (regression only, e.g.
            ``Standardize(1)``).

    Raises:
        InputTypeError: If ``model`` is not an ``InducingGPNetwork``.

    Example:
        >>> import torch
        >>> from botorch.models.transforms import Standardize
        >>> from gpext.integrations.botorch import IGNSurrogate, fit_gpext_surrogate
        >>> from gpext.models import InducingGPNetwork
        >>> from gpext.nn import MLP
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> ign = InducingGPNetwork(MLP(2, [16], 4), num_inducing=8).double()
        >>> model = IGNSurrogate(ign, train_X=X, train_Y=Y, outcome_transform=Standardize(1))
        >>> model = fit_gpext_surrogate(model, epochs=50, batch_size=32)
        >>> model.posterior(torch.rand(5, 3, 2, dtype=torch.float64)).mean.shape
        torch.Size([5, 3, 1])
    """

    def __init__(
        self,
        model: InducingGPNetwork,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
        input_transform: torch.nn.Module | None = None,
        outcome_transform: torch.nn.Module | None = None,
    ) -> None:
        if not isinstance(model, InducingGPNetwork):
            raise InputTypeError(
                expected_got("IGNSurrogate.model", "an InducingGPNetwork", type(model).__name__)
            )
        self._input_dim = getattr(model.embedding, "in_features", None)
        super().__init__(
            train_X=train_X,
            train_Y=train_Y,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )
        self.model = model
        self._multi = model.task in ("one_vs_all", "dirichlet")
        self._num_outputs = model.num_classes if self._multi else 1

    @classmethod
    def construct_inputs(
        cls,
        training_data: SupervisedDataset,
        *,
        hidden_features: Sequence[int] = (32, 32),
        feature_dim: int = 8,
        num_inducing: int = 16,
        input_augmented: bool = True,
        embedding: torch.nn.Module | None = None,
        **ign_kwargs: Any,
    ) -> dict[str, Any]:
        r"""Constructor arguments for a regression network on a BoTorch dataset (used by Ax).

        Builds an unfitted regression :class:`~gpext.models.InducingGPNetwork` in the data's
        dtype and device: the embedding is
        :class:`~gpext.nn.InputAugmentedEmbedding` ``(MLP(d, hidden_features, feature_dim))``
        (features :math:`[g(x), x]`: feature distances are at least input distances; the
        class docstring says what that gave on small designs) or
        the bare MLP (``input_augmented=False``), with ``min(num_inducing, n)`` inducing
        points (the sizes of ``benchmarks/bo.py``).  Ax passes ``ModelConfig.model_options``
        here and fits with :func:`~gpext.integrations.botorch.ax_support.fit_ax_surrogate`.

        Args:
            training_data: A ``SupervisedDataset`` with one outcome.
            hidden_features: Hidden widths of the MLP.
            feature_dim: Output width of the MLP.
            num_inducing: Inducing points (at most ``n``).
            input_augmented: Whether the inputs are appended to the features.
            embedding: A feature network to use instead (``(n, d)`` to ``(n, k)``).
            **ign_kwargs: Further arguments of ``InducingGPNetwork`` (``covar_module``,
                ``jitter``, ...).

        Returns:
            ``{"model", "train_X", "train_Y"}``.

        Raises:
            InputTypeError: If ``training_data`` is not a ``SupervisedDataset``.
            ShapeError: If the dataset has more than one outcome.

        Example:
            >>> import torch
            >>> from botorch.utils.datasets import SupervisedDataset
            >>> from gpext.integrations.botorch import IGNSurrogate, fit_gpext_surrogate
            >>> X = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
            >>> data = SupervisedDataset(X, (6 * X).sin().sum(-1, keepdim=True),
            ...                          feature_names=["x1", "x2"], outcome_names=["y"])
            >>> model = IGNSurrogate(**IGNSurrogate.construct_inputs(data, num_inducing=8))
            >>> model = fit_gpext_surrogate(model, epochs=20, batch_size=16, lr=1e-2)
            >>> model.posterior(X[:3].unsqueeze(-2)).mean.shape
            torch.Size([3, 1, 1])
        """
        X, Y = dataset_tensors(training_data, "IGNSurrogate.construct_inputs")
        n, d = X.shape
        if embedding is None:
            net = MLP(d, tuple(hidden_features), feature_dim)
            embedding = InputAugmentedEmbedding(net, in_features=d) if input_augmented else net
        m = min(check_positive_int(num_inducing, "IGNSurrogate.construct_inputs(num_inducing)"), n)
        if not input_augmented:  # the network's own default appends the inputs
            ign_kwargs = {"input_augmented": False, **ign_kwargs}
        model = InducingGPNetwork(embedding, num_inducing=m, **ign_kwargs).to(X)
        return {"model": model, "train_X": X, "train_Y": Y}

    @property
    def _calibrate_by_default(self) -> bool:
        # a network fitted to a handful of points interpolates them: calibrate small
        # regression designs (the calibration is a Gaussian likelihood of the targets)
        return self.model.task == "regression"

    def _set_variance_scale(self, scale: float) -> None:
        if self.model.task != "regression":
            raise NotFittedError(
                f"IGNSurrogate: variance calibration needs a regression task, got task "
                f"{self.model.task!r}; call fit_gpext_surrogate(model, calibrate=False)."
            )
        # Eq. 7's mean K_XZ K_ZZ^-1 r does not change when the kernel is multiplied by a
        # constant and its covariance is multiplied by it, so scaling the outputscale scales
        # the posterior covariance exactly, in every path (posterior, paths, conditioning)
        kernel = self.model.gp.covar_module
        if not isinstance(kernel, ScaleKernel):
            raise InputTypeError(
                expected_got(
                    "IGNSurrogate variance calibration", "an InducingGPNetwork whose kernel is a "
                    "gpytorch ScaleKernel", type(kernel).__name__,
                    "Wrap the kernel in ScaleKernel, or pass calibrate=False.",
                )
            )  # fmt: skip
        with torch.no_grad():
            kernel.outputscale = kernel.outputscale * (scale / self.epistemic_scale)
        self.epistemic_scale = float(scale)

    def _fold_copy(self, num_rows: int) -> IGNSurrogate:
        # a calibration fold has fewer rows than the design: at most one inducing point per
        # row (fit initialises them from the rows' features, so only their number matters)
        fold = copy.deepcopy(self)
        gp = fold.model.gp
        if gp.num_inducing > num_rows:
            gp.inducing_points = torch.nn.Parameter(
                gp.inducing_points.detach()[..., :num_rows, :].clone(),
                requires_grad=gp.inducing_points.requires_grad,
            )
            gp.pseudo_label_offset = torch.nn.Parameter(
                gp.pseudo_label_offset.detach()[..., :num_rows].clone(), requires_grad=False
            )
        return fold

    def _check_fitted(self, what: str) -> None:
        # the network's forward runs on its initial (random) state: a posterior from it would
        # be a silent wrong answer (mean 0, variance of the prior)
        if not self.model._fitted:
            raise NotFittedError(
                f"IGNSurrogate.{what}: the wrapped InducingGPNetwork is not fitted; call "
                "fit_gpext_surrogate(surrogate) or model.fit(x, y) (or load a fitted "
                "state_dict) first."
            )

    def _latent(self, X: torch.Tensor) -> MultivariateNormal:
        self._check_fitted("posterior")
        self.model.eval()
        mvn = self.model(X)  # batch (*b, [C]), event q
        if self._multi:
            return mvn
        return MultivariateNormal(
            mvn.mean.unsqueeze(-2), to_linear_operator(mvn.lazy_covariance_matrix).unsqueeze(-3)
        )

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        if self.model.task != "regression":
            return None
        # in the targets' units (the likelihood holds it on the standardised targets)
        return torch.as_tensor(self.model.noise_variance).to(X).reshape(1, 1)

    def _latent_paths(
        self, sample_shape: torch.Size, num_features: int, generator: torch.Generator | None
    ) -> torch.nn.Module:
        # regression: f = f0(g(x)) - k(g(x), Z) (K_ZZ + jitter)^{-1} (f0(Z) - r), 002 Eq. 7
        self._check_fitted("function draws")
        if self.model.task != "regression":
            return super()._latent_paths(sample_shape, num_features, generator)
        from gpext.integrations.botorch._pathwise import InducingPointPath

        self.model.eval()
        gp = self.model.gp
        # the network's GP is on standardised targets: draws are mu_y + s_y f (features()
        # standardises the inputs itself)
        loc, scale = self.model.target_loc_scale
        return InducingPointPath(
            gp.covar_module,
            gp.inducing_points,
            sample_shape=sample_shape,
            num_features=num_features,
            jitter=gp._jitter(gp.inducing_points.dtype),
            features=self.model.features,
            mean=None if loc == 0.0 else (lambda x: x.new_full(x.shape[:-1], loc)),
            targets=scale * gp.pseudo_labels(),
            scale=scale,
            generator=generator,
        )

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        if self.model.task == "regression":
            y = Y.squeeze(-1)
        else:
            y = labels_from_targets(Y, self.model.num_classes, "IGNSurrogate")
        self.model.fit(X, y, **kwargs)

    def _class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        if self.model.task == "regression":
            return super()._class_probabilities(X)
        self.model.eval()
        mvn = self.model(X)
        mean, var = mvn.mean, mvn.variance.clamp_min(0.0)  # shape: (*b, [C], q)
        if self.model.task == "binary":
            p1 = torch.special.ndtr(mean / torch.sqrt(1.0 + var))
            return torch.stack([1.0 - p1, p1], dim=-1)
        if self.model.task == "one_vs_all":
            p = torch.special.ndtr(mean / torch.sqrt(1.0 + var)).transpose(-1, -2).clamp_min(1e-12)
            return p / p.sum(-1, keepdim=True)
        return self.model.dirichlet_transform.class_probs(
            mean.transpose(-1, -2), var.transpose(-1, -2), method="approx"
        )

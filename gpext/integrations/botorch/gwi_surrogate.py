r"""BoTorch adapter of the GWI models (:class:`gpext.models.GWIRegressionModel` and
:class:`gpext.models.GWIClassificationModel` with its robust-max likelihood)."""

from __future__ import annotations

from typing import Any

import gpytorch
import torch
from botorch.utils.datasets import SupervisedDataset
from gpytorch.distributions import MultivariateNormal
from linear_operator import to_linear_operator
from linear_operator.operators import DenseLinearOperator

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.integrations.botorch._construct_inputs import dataset_tensors, reject_options
from gpext.integrations.botorch._training_data import labels_from_targets
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.models import GWIClassificationModel, GWIModel, GWIRegressionModel

__all__ = ["GWISurrogate"]


class GWISurrogate(LatentGPSurrogate):
    r"""A fitted GWI model as a BoTorch model: :math:`\mathbb Q = \mathcal{GP}(m_Q, r)` at ``X``.

    Regression (one output): the posterior is :math:`\mathcal N(m_Q(X),\ T\, r(X, X))` and
    ``observation_noise=True`` adds :math:`T\sigma^2`, so its marginals equal the model's own
    tempered predictive :math:`(m_Q(x), T(r(x, x) + \sigma^2))` (003 section 2.2).
    Classification (``J`` outputs, one latent per class): the posterior is
    :math:`\mathbb Q_j` untempered (the temperature of a classifier scales its log
    probabilities, not the latents), and :meth:`class_probabilities` are the tempered
    robust-max probabilities of :meth:`GWIClassificationModel.predict_proba`.

    .. math::

        r(x, x') = k(x, x') - k_{xZ}K_{ZZ}^{-1}k_{Zx'} + k_{xZ} L L^\top k_{Zx'}

    Args:
        model: A fitted :class:`~gpext.models.GWIRegressionModel` or
            :class:`~gpext.models.GWIClassificationModel`; or ``None``: a regression model
            is built by ``GWIRegressionModel.from_data`` on the (transformed) training data at
            the first ``fit_gpext_surrogate`` (its ``from_data={...}`` keyword holds the
            build options), as :meth:`construct_inputs` (Ax) does.
        likelihood: Its likelihood (Gaussian, or :class:`~gpext.likelihoods.RobustMaxLikelihood`);
            ``None`` with ``model=None``.
        train_X: Training inputs for ``fit_gpext_surrogate`` (which calls ``model.fit``).
        train_Y: Targets ``(n, 1)`` (class labels for classification).
        input_transform: BoTorch ``InputTransform``.
        outcome_transform: BoTorch ``OutcomeTransform`` (regression only).

    Raises:
        InputTypeError: If ``model`` is not a GWI model.
        InputDataError: If ``model`` is ``None`` but the training data are missing or a
            likelihood is given.
        ShapeError: If ``model`` is ``None`` and ``train_Y`` is not ``(n, 1)``.

    Example:
        >>> import torch
        >>> from botorch.models.transforms import Standardize
        >>> from gpext.integrations.botorch import GWISurrogate, fit_gpext_surrogate
        >>> from gpext.models import GWIRegressionModel
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> gwi, lik = GWIRegressionModel.from_data(X, Y.squeeze(-1))
        >>> model = fit_gpext_surrogate(GWISurrogate(gwi, lik, train_X=X, train_Y=Y), epochs=50)
        >>> # or built at the fit, from the standardised targets:
        >>> model = GWISurrogate(train_X=X, train_Y=Y, outcome_transform=Standardize(1))
        >>> model = fit_gpext_surrogate(model, epochs=20, from_data={"prior_steps": 10})
        >>> type(model.model).__name__
        'GWIRegressionModel'
    """

    def __init__(
        self,
        model: GWIModel | None = None,
        likelihood: gpytorch.likelihoods.Likelihood | None = None,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
        input_transform: torch.nn.Module | None = None,
        outcome_transform: torch.nn.Module | None = None,
    ) -> None:
        if model is None:
            # built at the first fit, on the transformed training data
            if likelihood is not None or train_X is None or train_Y is None:
                raise InputDataError(
                    expected_got(
                        "GWISurrogate(model=None)",
                        "train_X and train_Y and no likelihood (the regression model and its "
                        "likelihood are built from the data at the first fit)",
                        f"likelihood={type(likelihood).__name__}, train_X "
                        f"{'given' if train_X is not None else 'None'}, train_Y "
                        f"{'given' if train_Y is not None else 'None'}",
                    )
                )
            if (
                not isinstance(train_Y, torch.Tensor)
                or train_Y.dim() != 2
                or train_Y.shape[-1] != 1
            ):
                raise ShapeError(
                    expected_got(
                        "GWISurrogate(model=None) train_Y",
                        "one target, a tensor of shape (n, 1)",
                        tuple(getattr(train_Y, "shape", ())) or type(train_Y).__name__,
                    )
                )
            ok = isinstance(train_X, torch.Tensor) and train_X.dim() == 2
            self._input_dim = (
                int(train_X.shape[-1]) if ok else None
            )  # else attach_training_data raises
        elif not isinstance(model, (GWIRegressionModel, GWIClassificationModel)):
            raise InputTypeError(
                expected_got(
                    "GWISurrogate.model",
                    "a GWIRegressionModel or GWIClassificationModel",
                    type(model).__name__,
                )
            )
        else:
            self._input_dim = int(model.variational_strategy.inducing_points.shape[-1])
        super().__init__(
            train_X=train_X,
            train_Y=train_Y,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )
        self.model = model
        self.likelihood = likelihood
        self._classifier = isinstance(model, GWIClassificationModel)
        self._num_outputs = int(model.num_latents) if self._classifier else 1

    @classmethod
    def construct_inputs(cls, training_data: SupervisedDataset, **options: Any) -> dict[str, Any]:
        r"""Constructor arguments for a GWI regression model built from data (used by Ax).

        The model is data dependent (its prior is an exact-GP fit, its inducing points a
        subset of the inputs), so it is built at the first fit, after the input and outcome
        transforms: ``GWISurrogate(train_X=X, train_Y=Y)`` holds no model until
        :func:`~gpext.integrations.botorch.fit_gpext_surrogate` builds it with
        :meth:`GWIRegressionModel.from_data` (arguments under its ``from_data`` keyword) and
        fits it.  Through Ax, pass those options in ``ModelConfig.mll_options``, e.g.
        ``{"epochs": 200, "from_data": {"num_inducing": 8}}``.

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
        X, Y = dataset_tensors(training_data, "GWISurrogate.construct_inputs")
        reject_options(
            options,
            "GWISurrogate.construct_inputs",
            "The model is built and fitted at fit time: pass GWIRegressionModel.from_data "
            "arguments as from_data={...} and GWIModel.fit arguments to the fit (Ax: "
            "ModelConfig.mll_options).",
        )
        return {"train_X": X, "train_Y": Y}

    def _check_built(self) -> None:
        if self.model is None:
            raise NotFittedError(
                "GWISurrogate: no model yet (built without one); fit it with "
                "fit_gpext_surrogate, which builds it from the training data."
            )

    def _q(self, X: torch.Tensor) -> MultivariateNormal:
        self._check_built()
        self.model._check_fitted()
        self.model.eval()
        if not self._classifier:
            return self.model(X)
        # The classifier's strategy takes (N, D) inputs; evaluate chunks of batches jointly and
        # keep the diagonal blocks of the joint covariance.
        q, d, j = X.shape[-2], X.shape[-1], self._num_outputs
        flat = X.reshape(-1, q, d)
        means, covs = [], []
        for xb in flat.split(max(1, 512 // q)):
            nb = xb.shape[0]
            out = self.model(xb.reshape(nb * q, d))  # batch (J,), event (nb * q,)
            means.append(out.mean.reshape(j, nb, q).transpose(0, 1))  # shape: (nb, J, q)
            cov = out.lazy_covariance_matrix.to_dense().reshape(j, nb, q, nb, q)
            idx = torch.arange(nb, device=X.device)
            covs.append(cov[:, idx, :, idx, :])  # shape: (nb, J, q, q)
        mean = torch.cat(means).reshape(*X.shape[:-2], j, q)
        cov = torch.cat(covs).reshape(*X.shape[:-2], j, q, q)
        return MultivariateNormal(mean, DenseLinearOperator(cov))

    def _latent(self, X: torch.Tensor) -> MultivariateNormal:
        q = self._q(X)
        if self._classifier:  # batch (*b, J), event q
            return q
        t = self.model.temperature.to(X)
        # kept lazy: posterior(X) on many points (q = N) must not build the N x N matrix
        # (100,000 points asked for 80 GB); its marginal variances come from the diagonal
        cov = to_linear_operator(q.lazy_covariance_matrix) * t
        return MultivariateNormal(q.mean.unsqueeze(-2), cov.unsqueeze(-3))

    def _latent_paths(
        self, sample_shape: torch.Size, num_features: int, generator: torch.Generator | None
    ) -> torch.nn.Module:
        # regression: f = m_Q + sqrt(T) (f0 - k_xZ K_ZZ^{-1} f0(Z) + k_xZ L eps), tempered Q
        if self.model is None:
            raise NotFittedError("GWISurrogate.draw_functions: fit the GWI model first.")
        if self._classifier:
            return super()._latent_paths(sample_shape, num_features, generator)
        from gpext.integrations.botorch._pathwise import InducingPointPath

        self.model._check_fitted()
        self.model.eval()
        strategy = self.model.variational_strategy
        # the model lives on standardised inputs and targets: draws are mu_y + s_y f(z(x))
        s = self.model.standardizer
        to_z = s.transform_inputs if s.fitted else (lambda x: x)
        loc, scale = self.model.target_loc_scale
        return InducingPointPath(
            self.model.covar_module,
            strategy.inducing_points,
            sample_shape=sample_shape,
            num_features=num_features,
            jitter=float(strategy.jitter_val),
            features=to_z,
            mean=lambda x: loc + scale * strategy.mean_module(to_z(x)),
            lower=strategy._variational_distribution.lower,
            scale=scale * float(self.model.temperature) ** 0.5,
            generator=generator,
        )

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        self._check_built()
        if self._classifier:
            return None
        # in the targets' units (the likelihood holds it on the standardised targets)
        noise = self.model.noise_variance(self.likelihood)
        return (self.model.temperature * noise).to(X).reshape(1, 1)

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        from_data = kwargs.pop("from_data", None)
        if self.model is None:
            if from_data is not None and not isinstance(from_data, dict):
                raise InputTypeError(
                    expected_got("GWISurrogate fit(from_data)", "a dict", type(from_data))
                )
            opts = {"generator": kwargs.get("generator"), **(from_data or {})}
            model, likelihood = GWIRegressionModel.from_data(X, Y.squeeze(-1), **opts)
            self.model, self.likelihood = model.to(X), likelihood.to(X)
        elif from_data is not None:
            raise InputDataError(
                expected_got(
                    "GWISurrogate fit(from_data)",
                    "None for an adapter built with a model",
                    "options",
                    "from_data builds the model of an adapter built without one.",
                )
            )
        if self._classifier:
            y = labels_from_targets(Y, self._num_outputs, "GWISurrogate")
        else:
            y = Y.squeeze(-1)
        self.model.fit(self.likelihood, X, y, **kwargs)

    def _class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        if not self._classifier:
            return super()._class_probabilities(X)
        logp = self.likelihood.marginal(self._q(X)).logits
        return torch.softmax(logp / self.model.temperature.to(X), dim=-1)

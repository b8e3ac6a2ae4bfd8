"""Inducing Gaussian process networks (Tibo & Nielsen 2022, document 002)."""

from __future__ import annotations

import copy
import math
import warnings

import gpytorch
import torch
from torch import nn

from gpext.errors import (
    InputDataError,
    InputTypeError,
    NotFittedError,
    ShapeError,
    VarianceCollapseWarning,
    expected_got,
)
from gpext.fit import AUTO_VALIDATION_MIN_POINTS as _AUTO_VALIDATION_MIN_POINTS
from gpext.fit import (
    FitResult,
    StandardizedGaussianLikelihood,
    Standardizer,
    check_heldout,
    check_predictions_vary,
    holdout_split,
    minibatch_indices,
    minimize_scalar_on_grid,
    reference_heldout_nll,
    refit_split,
    train_loop,
)
from gpext.fit.exact_gp import OriginalUnitsMultivariateNormal
from gpext.kernels import FeatureMapKernel
from gpext.models._ign_tasks import TASKS, resolve_task  # noqa: F401 (TASKS: the task names)
from gpext.models.ign_probit_laplace import ProbitLaplace
from gpext.nn import InputAugmentedEmbedding, SetEncoder
from gpext.utils import as_model_input, check_finite, check_learning_rate, check_positive_int
from gpext.variational.feature_space_inducing_gp import FeatureSpaceInducingGP

__all__ = ["GP_PARAMETER_TRAVEL", "InducingGPNetwork", "default_gp_lr"]

#: Smallest training :math:`R^2` (and largest share of :math:`\operatorname{Var}(y)` in the
#: learned noise, as ``1 - MIN_EXPLAINED_VARIANCE``) that :meth:`InducingGPNetwork.fit` accepts
#: without a :class:`VarianceCollapseWarning`.
MIN_EXPLAINED_VARIANCE = 0.1


#: How many raw (softplus / log) units the GP parameters of :meth:`InducingGPNetwork.fit`
#: (noise, kernel, inducing points, pseudo-labels) can move over one run with the default
#: ``gp_lr``: from the initial noise 0.69 to 1e-4 of Var(y) is about 9 units.
GP_PARAMETER_TRAVEL = 10.0


def default_gp_lr(lr: float, steps: int) -> float:
    r"""The default learning rate of IGN's GP parameters.

    .. math:: \eta_{GP} = \max\bigl(\eta, \min(5\cdot 10^{-2}, \max(10^{-2}, c / S))\bigr)

    Adam moves each parameter by at most about its learning rate per step, so over ``S`` steps
    the GP parameters can travel :data:`GP_PARAMETER_TRAVEL` (``c``) units in their raw
    parametrisation; ``1e-2`` is the floor for long runs and ``5e-2`` the ceiling for very
    short ones (at 0.2, 45 steps of a binary probit fit diverged).

    Args:
        lr: The embedding's learning rate :math:`\eta`.
        steps: Adam steps of the whole run (epochs times minibatches per epoch).

    Returns:
        The learning rate.
    """
    return max(float(lr), min(5e-2, max(1e-2, GP_PARAMETER_TRAVEL / max(int(steps), 1))))


class InducingGPNetwork(gpytorch.Module):
    r"""A GP whose inducing points are learned in the feature space of a neural network.

    Inputs are embedded by any :class:`torch.nn.Module` :math:`g` (for instance
    :class:`gpext.nn.MLP`, :class:`gpext.nn.SmallCNN`, :class:`gpext.nn.SetEncoder`); a
    :class:`gpext.variational.FeatureSpaceInducingGP` holds the inducing points
    :math:`Z \in \mathbb{R}^{m \times d}`, the linear pseudo-labels :math:`\mathbf{r} = r(Z)` and
    the kernel.  For a minibatch :math:`B` of size :math:`b` the training loss is the negative
    log marginal likelihood of 002 Eq. 5 divided by :math:`b`,

    .. math::

        \mathcal{L}_B = -\frac{1}{b}\log \mathcal{N}\big(\mathbf{y}_B;\ K_{BZ}K_{ZZ}^{-1}\mathbf{r},\
        K_{BB} + \sigma^2 I - K_{BZ}K_{ZZ}^{-1}K_{ZB}\big),

    the minibatch loss of stochastic-gradient GP training (Chen et al. 2020, cited by 002):
    :math:`\tfrac{n}{b}\ell_B` estimates the full objective :math:`\ell` of Eq. 5, and dividing
    by :math:`n` gives :math:`\mathcal{L}_B`, the per-datum scale GPyTorch's MLLs use.
    Predictions follow 002 Eq. 7 (:meth:`forward`, :meth:`predict`).  With a prior mean
    :math:`m` (``mean_module``, beyond 002) every mean above becomes
    :math:`m(g(x)) + K_{xZ}K_{ZZ}^{-1}(\mathbf r - m(Z))`, in the loss, the predictions,
    :meth:`refit_pseudo_labels` and :meth:`calibrate_noise` alike.

    Tasks:

    * ``"regression"``: Gaussian noise :math:`\sigma^2` from a
      :class:`gpytorch.likelihoods.GaussianLikelihood`.
    * ``"binary"``: probit likelihood, labels 0/1; the marginal likelihood of each minibatch by a
      Laplace approximation (:class:`gpext.models.ign_probit_laplace.ProbitLaplace`): Newton
      steps for the mode alternate with gradient steps (002, section 2.4).  Predictions
      :math:`p(y_* = 1) = \Phi(\mu_* / \sqrt{1 + \sigma_*^2})` with :math:`\mu_*, \sigma_*^2` from
      Eq. 7.
    * ``"one_vs_all"``: ``C`` probit heads (a batch of inducing sets, one per class) on a shared
      embedding, head ``c`` trained on ``y == c``; class probabilities are the heads'
      probabilities normalised to sum to one (002, section 2.4 / 4.3).
    * ``"dirichlet"`` (beyond 002): ``C`` regression heads on the targets and per-point,
      per-class noise variances of a Dirichlet transform (Milios et al. 2018; see
      :class:`gpext.likelihoods.DirichletTransform`); probabilities by Monte Carlo over the
      softmax of the latent heads.

    The task follows from the likelihood object's type (``likelihood``); each task's steps of
    the loss, initialisation, refit and predictions live in one private dispatch object.

    Args:
        embedding: Network :math:`g` mapping a minibatch of inputs to ``(N, d)`` features.
        num_inducing: Number of inducing points ``m`` (per head).
        feature_dim: ``d``; default ``embedding.out_features``.
        task: One of ``"regression"``, ``"binary"``, ``"one_vs_all"``, ``"dirichlet"``: a
            convenience that picks the default likelihood.  ``None`` (default): taken from
            ``likelihood``'s type (``"regression"`` without one).
        num_classes: ``C`` for the multiclass tasks (2 for ``"binary"``).
        covar_module: Kernel on features (batch shape ``(C,)`` for the multiclass tasks).
        mean_module: Prior mean :math:`m` of the GP on features (a GPyTorch mean of
            ``(*, N, d)`` features, batch shape ``()`` or ``(C,)`` for the multiclass tasks;
            default :class:`gpytorch.means.ZeroMean`, 002's model).  The pseudo-label function
            becomes :math:`r(z) = m(z) + w^\top z + b`, so predictions are
            :math:`m(g(x)) + K_{xZ}K_{ZZ}^{-1}(\mathbf r - m(Z))` (see
            :class:`~gpext.variational.FeatureSpaceInducingGP`); its parameters are trained
            with the GP's (``gp_lr``) and saved in the state dict.  Its input size is the
            GP's feature width (``d + D`` with ``input_augmented``), and its values are in the
            standardised target units (``standardize``).
        likelihood: The observation model, which decides the task, so that
            ``model.likelihood(model(x))`` is the predictive distribution as for any GPyTorch
            model: a :class:`gpytorch.likelihoods.GaussianLikelihood` (regression; the
            default is a :class:`gpext.fit.StandardizedGaussianLikelihood`, which adds its
            noise, learned on standardised targets, in the units of ``model(x)``; a plain
            ``GaussianLikelihood`` given here adds it unscaled, so use :meth:`predict`
            there), a :class:`gpytorch.likelihoods.BernoulliLikelihood` (probit link
            :math:`\Phi`; ``"binary"``, or ``"one_vs_all"`` with ``num_classes > 2`` or
            ``task="one_vs_all"``: per-class, unnormalised probabilities) or a
            :class:`gpext.likelihoods.DirichletTransformLikelihood` (``"dirichlet"``; there
            ``likelihood(model(x), labels=y)`` is the marginal of the transformed targets and
            :meth:`predict_proba` the class probabilities).
        dirichlet_transform: Label transform for ``"dirichlet"`` when no likelihood is given
            (default ``gpext.likelihoods.DirichletTransform(num_classes)``; the likelihood
            made from it keeps this object as its ``transform``).
        laplace: Laplace settings for the probit tasks (default :class:`ProbitLaplace`).
        input_transform: Optional module applied to inputs before the embedding (e.g. a BoTorch
            ``InputTransform`` such as ``Normalize``).
        jitter: Jitter of :math:`K_{ZZ}` (see :class:`FeatureSpaceInducingGP`).
        minibatch_covariance: ``"independent"`` (default): Eq. 5 on ``b`` minibatches of size
            one, i.e. the sum of :math:`-\log\mathcal N(y_i;\ \mu_i,\ k_{ii} - q_{ii} + \sigma^2)`
            (per-point 1-D Laplace for the probit tasks), which is the log-likelihood of
            exactly the predictive marginals of Eq. 7 that :meth:`predict` returns and costs
            :math:`O(bm^2)`.  ``"full"``: Eq. 5 on each minibatch with its full ``b x b``
            covariance :math:`K_{B|Z}`, :math:`O(b^3)`.  The full form has a degenerate
            optimum: the embedding can map points with similar targets to the same feature
            vector far from :math:`Z`, where :math:`K_{B|Z}` is a shared random offset that
            explains the minibatch while the mean :math:`K_{BZ}K_{ZZ}^{-1}\mathbf r` (the only
            part Eq. 7 predictions use) stays near zero.  How far training drifts there
            depends on the data and the budget: on validation parts of pol's training rows
            the full form was better than the independent one at 12 epochs (RMSE 2.60 vs
            2.99) and 33% worse at 48 (3.36 vs 2.52), while on protein and elevators it
            stayed better at the longer budget.  The independent form rules the degenerate
            optimum out (see the tutorial); ``benchmarks/ign.py`` chooses the form per data
            set on validation rows.
        input_augmented: Append the (standardised) inputs :math:`z` to the embedding's
            features, :math:`[\,g(z),\ s\,z\,]`, and fix the kernel's lengthscales on them
            and its outputscale at an exact GP's (see "Uncertainty away from the data").
            ``None`` (default): whenever the embedding has an integer ``in_features`` (vector
            inputs; not a :class:`~gpext.nn.SetEncoder`).  An
            :class:`~gpext.nn.InputAugmentedEmbedding` given as the embedding already
            appends them (its ``input_scale`` is used); ``False`` is the opt-out (the bare
            network's features, everything learned, as before).
        input_scale: :math:`s > 0` on the appended inputs.
        standardize: The data contract of :mod:`gpext.fit.standardize` (default on):
            :meth:`initialize` (run by :meth:`fit`) fits :attr:`standardizer` on the
            training rows (inputs; and for regression the targets), the network and the GP
            work on :math:`z = (x - \mu_x)/s_x` and :math:`t = (y - \mu_y)/s_y`, and every
            method takes and returns the original units: :meth:`predict` gives
            :math:`\mu_y + s_y m` and :math:`s_y^2 v`, ``model(x)`` is the latent GP of
            :math:`y` (``likelihood(model(x))`` with the default
            :class:`~gpext.fit.StandardizedGaussianLikelihood` adds the noise in those
            units).  The kernel hyperparameters and ``likelihood.noise`` are in standardised
            units (:attr:`noise_variance` is the noise in the targets' units).  ``False``:
            the data are used as given (the opt-out for data already on a unit scale); the
            learning rates and initial values below assume unit-scale data.  Inputs with
            NaN padding (sets) and integer inputs are not standardised.

    Data contract: the defaults (learning rates, initial noise, the step budget) are stated
    for standardised data and hold whatever the units: on the 1-D sine toy of the tests the
    targets times ``1e-6`` or ``1e6`` (plus an offset) and the inputs times ``1e4`` give the
    same predictions up to the scale.

    Training defaults: :meth:`fit` uses a small embedding learning rate (``lr=1e-3``) and a
    larger one for the GP (:func:`default_gp_lr`: enough for the GP parameters to travel
    :data:`GP_PARAMETER_TRAVEL` raw units over the run, within ``[1e-2, 5e-2]``); with the
    former ``5e-3`` for both, 3 of 10 seeds of a 1-D toy collapsed to the mean (see
    :meth:`fit`).  The budget is counted in Adam steps: at least :attr:`MIN_STEPS` (1000)
    whatever the number of rows and the minibatch size (``epochs`` is raised to reach it), so
    a 150-row table is trained as long as a 15,000-row one; with the former 50 epochs of
    batch 256 it got 50 steps and stayed near its initial state.  A regression fit that
    explains less than 10% of the targets' variance, or puts more than 90% of it in the
    noise, raises a :class:`VarianceCollapseWarning` (:meth:`check_fit`); the shared
    end-of-fit checks on rows the fit did not train on (:func:`gpext.fit.check_heldout`)
    warn when the model predicts no better than the mean or its intervals are far off
    (see :meth:`fit`).

    Uncertainty away from the data: the predictive variance of Eq. 7 grows only where the
    features are far from :math:`Z` in kernel lengthscales, so it is as honest as the
    features are distance aware.  By default (``input_augmented``) the standardised inputs
    are appended to the network's features (as :class:`gpext.nn.InputAugmentedEmbedding`
    does), so feature distances are bounded below by input distances, and the kernel's
    lengthscales on the appended inputs and its outputscale are fixed at the MAP values of an
    exact GP on (up to 500) training rows (:meth:`initialize`): Eq. 5 charges latent variance
    at the training rows and pays for none elsewhere, so learned values drift to where the
    latent variance vanishes everywhere (outputscale 0.06-0.13 of the targets' variance on
    the gap toy below, with the predictive sd in the gap equal to the one on the data).
    The network's lengthscales stay learned.  On the 1-D gap toy (300 points, ``x`` in
    ``[-6, -2] U [2, 6]``, ``y = sin(x)`` plus noise sd 0.15; ``MLP(1, [64, 64], 8)``, 32
    inducing points, default ``fit``), seeds 0-4: median predictive sd on ``[-1, 1]``
    0.24-0.39 against 0.15-0.19 on the training inputs, no gap point beyond 2 sd; without
    the augmentation (``input_augmented=False``) the sd in the gap equals the one on the
    data (0.17-0.18) and 0-30% of the gap points lie beyond 2 sd (100% on the worst of 5
    seeds with the former 200 epochs and raw units).  On a 6-D Friedman function (600 and
    150 rows, seed 0) the default had a lower test NLL than the opt-out (1.65 vs 1.74, 1.93
    vs 2.09).  :class:`gpext.nn.SpectralNormalizedMLP` (a bi-Lipschitz network) alone did
    not help: 0-44% (mean 21%) of the 1-D gap points beyond 2 sd against 0-15% (mean 3%) for
    the plain MLP on the toy of the trustworthy-fits issue, because the learned lengthscales
    span the gap.  The classification tasks get the appended inputs but keep every kernel
    hyperparameter learned.  Judge intervals far from the data on held-out points before
    relying on them.

    Raises:
        InputDataError: If the task is unknown, a size is invalid, or ``task``,
            ``num_classes`` and ``likelihood`` disagree.
        InputTypeError: If the likelihood is not one of the types above, or does not fit
            ``task``.

    Example:
        >>> import torch
        >>> from gpext.models import InducingGPNetwork
        >>> from gpext.nn import MLP
        >>> g = torch.Generator().manual_seed(0)
        >>> x = torch.randn(200, 3, generator=g)
        >>> y = x[:, 0].sin() + 0.1 * torch.randn(200, generator=g)
        >>> model = InducingGPNetwork(MLP(3, [32], 4), num_inducing=16)
        >>> _ = model.fit(x, y, epochs=5, batch_size=50)
        >>> mean, var = model.predict(x[:5])
    """

    #: Smallest training set for which :meth:`fit` holds out 10% of the rows by default.
    AUTO_VALIDATION_MIN_POINTS: int = _AUTO_VALIDATION_MIN_POINTS
    #: Fewest Adam steps of a default :meth:`fit`, whatever the number of rows and the
    #: minibatch size (``epochs`` is raised to reach it; ``fit(min_steps=...)`` overrides it).
    MIN_STEPS: int = 1000
    #: Share of the rows a small regression fit (no hold-out) refits without, to check and
    #: calibrate itself on them (:meth:`fit`).
    REFIT_CHECK_FRACTION: float = 0.2

    def __init__(
        self,
        embedding: nn.Module,
        *,
        num_inducing: int = 64,
        feature_dim: int | None = None,
        task: str | None = None,
        num_classes: int | None = None,
        covar_module: gpytorch.kernels.Kernel | None = None,
        mean_module: gpytorch.means.Mean | None = None,
        likelihood: gpytorch.likelihoods.Likelihood | None = None,
        dirichlet_transform: object | None = None,
        laplace: ProbitLaplace | None = None,
        input_transform: nn.Module | None = None,
        jitter: float | None = None,
        minibatch_covariance: str = "independent",
        input_augmented: bool | None = None,
        input_scale: float = 1.0,
        standardize: bool = True,
    ) -> None:
        super().__init__()
        task_obj, likelihood = resolve_task(task, likelihood, num_classes, dirichlet_transform)
        if not isinstance(embedding, nn.Module):
            raise InputTypeError(
                expected_got(
                    "InducingGPNetwork.embedding", "a torch.nn.Module", type(embedding).__name__
                )
            )
        in_features = getattr(embedding, "in_features", None)
        vector_input = isinstance(in_features, int) and not isinstance(in_features, bool)
        wrapped = isinstance(embedding, InputAugmentedEmbedding)  # appends the inputs itself
        if input_augmented is None:
            # distance aware by default wherever the inputs are vectors the features can carry
            input_augmented = vector_input and not isinstance(embedding, SetEncoder)
        elif input_augmented and not vector_input:
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork(input_augmented=True)",
                    "an embedding with an integer `in_features` (the input width D)",
                    type(embedding).__name__,
                    "Set embedding.in_features, or pass input_augmented=False.",
                )
            )
        if not (isinstance(input_scale, (int, float)) and math.isfinite(input_scale)
                and input_scale > 0):  # fmt: skip
            raise InputDataError(
                expected_got("InducingGPNetwork.input_scale", "a finite number > 0", input_scale)
            )
        #: Whether the GP's features end with the (standardised, scaled) inputs: appended by
        #: this model, or by an :class:`~gpext.nn.InputAugmentedEmbedding` given as embedding.
        self.input_augmented = bool(input_augmented)
        self._appends_inputs = self.input_augmented and not wrapped
        #: Factor :math:`s` on the appended inputs (the wrapper's own for a wrapped embedding).
        self.input_scale = float(embedding.input_scale if wrapped else input_scale)
        #: Whether :meth:`fit` standardises inputs and regression targets (the data contract).
        self.standardize = bool(standardize)
        if feature_dim is None:
            feature_dim = getattr(embedding, "out_features", None)
            if feature_dim is None:
                raise InputDataError(
                    "InducingGPNetwork: expected feature_dim or an embedding with an "
                    f"`out_features` attribute, got neither ({type(embedding).__name__}). "
                    "Pass feature_dim=<output size of the embedding>."
                )
        if minibatch_covariance not in ("full", "independent"):
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.minibatch_covariance",
                    "'full' or 'independent'",
                    repr(minibatch_covariance),
                )
            )
        self.minibatch_covariance = minibatch_covariance
        #: The observation model's steps (private; chosen from the likelihood's type).
        self._task = task_obj
        self.num_classes = task_obj.num_classes
        self.embedding = embedding
        self.input_transform = input_transform
        #: The data transform (inputs; targets for regression), fitted by :meth:`initialize`
        #: when ``standardize``; unfitted it is the identity.  In the state dict.
        self.standardizer = Standardizer(
            targets=not task_obj.classification, name="InducingGPNetwork"
        )
        self._default_kernel = covar_module is None
        gp_dim = int(feature_dim) + (in_features if self._appends_inputs else 0)
        #: Number of network features before the appended inputs (all of them without).
        self.embedding_dim = gp_dim - (in_features if self.input_augmented else 0)
        self.gp = FeatureSpaceInducingGP(
            num_inducing,
            gp_dim,
            batch_shape=task_obj.batch_shape,
            covar_module=covar_module,
            jitter=jitter,
            mean_module=mean_module,
        )
        self.likelihood = likelihood
        self.laplace = laplace or ProbitLaplace()
        #: Set by :meth:`initialize` / :meth:`fit` and by loading a state dict; :meth:`predict`
        #: raises :class:`~gpext.errors.NotFittedError` before.
        self._fitted = False
        #: Raw input lengthscales and outputscale kept by :meth:`fit` (:meth:`initialize`).
        self._input_kernel_pin = None
        self.register_load_state_dict_post_hook(_mark_fitted)

    # ------------------------------------------------------------------ features and latent GP
    def features(self, x: torch.Tensor) -> torch.Tensor:
        r"""The GP's features of inputs in the original units, ``(N, d)`` (``(N, d + D)``).

        The inputs are standardised (:attr:`standardizer`, once fitted), passed through
        ``input_transform`` (if any) and embedded by ``g``; with ``input_augmented`` the
        embedding's input :math:`z` is appended, :math:`[\,g(z),\ s\,z\,]`
        (:class:`gpext.nn.InputAugmentedEmbedding`'s features).
        """
        return _features(self.standardizer, self.input_transform, self.embedding,
                         self.input_scale if self._appends_inputs else None, x)  # fmt: skip

    @property
    def kernel(self) -> FeatureMapKernel:
        r"""The prior covariance on inputs, :math:`k(x, x') = k_{\text{GP}}(g(x), g(x'))`.

        A :class:`~gpext.kernels.FeatureMapKernel` over :meth:`features` (the input transform,
        if any, then the embedding) and the GP's kernel on features, sharing their parameters
        (it is built on access and not registered, so the state dict is unchanged).  Use it to
        evaluate the learned deep kernel, or in an exact GP on the learned features.  The
        model's own computations stay in feature space, because its inducing points :math:`Z`
        are features, not inputs (002): :math:`k(g(x), Z)` is not a kernel between two inputs.

        Returns:
            The kernel (batch shape ``(C,)`` for the multiclass tasks).
        """
        extractor = _FeatureExtractor(
            self.standardizer, self.input_transform, self.embedding,
            self.input_scale if self._appends_inputs else None,
        )  # fmt: skip
        return FeatureMapKernel(extractor, self.gp.covar_module)

    @property
    def task(self) -> str:
        """``"regression"``, ``"binary"``, ``"one_vs_all"`` or ``"dirichlet"`` (from the likelihood)."""
        return self._task.name

    @property
    def dirichlet_transform(self):
        """The label transform of the Dirichlet task (``self.likelihood.transform``), else ``None``."""
        return getattr(self.likelihood, "transform", None)

    @property
    def mean_module(self) -> gpytorch.means.Mean:
        """The prior mean on features (``self.gp.mean_module``; set it through the constructor)."""
        return self.gp.mean_module

    @property
    def covar_module(self) -> gpytorch.kernels.Kernel:
        """The kernel on features (``self.gp.covar_module``)."""
        return self.gp.covar_module

    def _head_features(self, feats: torch.Tensor) -> torch.Tensor:
        return feats.unsqueeze(-3) if len(self.gp.batch_shape) else feats  # shape: (*, [1,] N, d)

    def forward(self, x: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        r"""Latent GP at ``x`` by 002 Eq. 7, batch shape ``(C,)`` for the multiclass tasks.

        ``model(x)`` is a :class:`~gpytorch.distributions.MultivariateNormal` with mean
        :math:`m(g(x)) + K_{xZ}K_{ZZ}^{-1}(\mathbf r - m(Z))` and a lazy low-rank-plus-kernel
        covariance (nothing ``N x N`` is formed until asked for); inputs with batch dimensions
        the embedding maps to ``(*batch, N, d)`` features give a batch of GPs.

        Raises:
            InputTypeError / InputDataError / ShapeError: As :meth:`predict`, for inputs of
                another dtype, non-finite or empty inputs.
        """
        x = self._check_x(x, "InducingGPNetwork.forward(x)")
        feats = self._finite_features(x, self.features(x), "InducingGPNetwork.forward(x)")
        return self._untransform_mvn(self.gp(self._head_features(feats)))

    # ------------------------------------------------------------------ data contract
    def _targets_fitted(self) -> bool:
        s = self.standardizer
        return s.targets and s.fitted and s.y_loc.numel() > 0

    def _untransform_mvn(self, mvn):
        """The latent GP of standardised targets in the original units (regression)."""
        if not self._targets_fitted():
            return mvn
        # the variances of the standardised latent are kept (GPyTorch's absolute variance floor
        # applies to them), and StandardizedGaussianLikelihood adds its noise to them
        s = self.standardizer
        return OriginalUnitsMultivariateNormal.wrap(
            mvn, s.y_loc.to(mvn.mean).reshape(()), s.y_scale.to(mvn.mean).reshape(())
        )

    def _untransform_moments(
        self, mean: torch.Tensor, var: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._targets_fitted():
            return mean, var
        s = self.standardizer
        return s.untransform_targets(mean), s.untransform_variance(var)

    @property
    def target_loc_scale(self) -> tuple[float, float]:
        r""":math:`(\mu_y, s_y)` of the target standardisation (``(0, 1)`` without one)."""
        if not self._targets_fitted():
            return 0.0, 1.0
        s = self.standardizer
        return float(s.y_loc.reshape(-1)[0]), float(s.y_scale.reshape(-1)[0])

    @property
    def noise_variance(self) -> float:
        r"""The regression noise variance in the targets' units, :math:`s_y^2\sigma^2`.

        ``likelihood.noise`` holds :math:`\sigma^2` on the standardised targets.
        """
        if not self._task.learned_noise:
            raise InputDataError(
                expected_got("InducingGPNetwork.noise_variance", "task 'regression'",
                             repr(self.task))
            )  # fmt: skip
        noise = float(self.likelihood.noise.detach().mean())
        return noise * (self.standardizer.target_scale**2 if self._targets_fitted() else 1.0)

    def _set_noise_variance(self, value: float) -> None:
        """Set the noise to ``value`` in the targets' units (clamped to the constraint)."""
        scale2 = self.standardizer.target_scale**2 if self._targets_fitted() else 1.0
        lower = float(self.likelihood.noise_covar.raw_noise_constraint.lower_bound.max())
        with torch.no_grad():
            self.likelihood.noise = torch.full_like(
                self.likelihood.noise, max(value / scale2, lower * 1.0001)
            )

    def _fit_standardizer(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """Fit :attr:`standardizer` on training rows (inputs with NaN padding, such as sets,
        or integer inputs are left as they are)."""
        s = self.standardizer
        plain = x.dtype.is_floating_point and not bool(torch.isnan(x).any())
        if not plain:
            s.x_loc = torch.empty(0, dtype=torch.float64, device=x.device)
            s.x_scale = torch.empty(0, dtype=torch.float64, device=x.device)
        s.inputs = plain
        try:
            s.fit(x, y if s.targets else None)
        finally:
            s.inputs = True
        lik = self.likelihood
        if isinstance(lik, StandardizedGaussianLikelihood):
            lik.target_scale = torch.as_tensor(s.target_scale, dtype=torch.float64).to(
                lik.target_scale
            )

    # ------------------------------------------------------------------ objective (Eq. 5)
    def _check_x(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Inputs ``(N, ...)``, ``N >= 1``, without infinite entries, in the model's dtype and
        device.  NaN entries are left to the embedding (:class:`~gpext.nn.SetEncoder` marks
        padding with NaN); :meth:`_finite_features` rejects the NaN inputs it passes on."""
        like = self.gp.inducing_points
        if like.dtype not in (torch.float32, torch.float64):
            raise InputTypeError(
                expected_got(
                    "InducingGPNetwork parameters", "torch.float32 or torch.float64", like.dtype,
                    "Cholesky factorisations need single or double precision: call "
                    "model.float() or model.double() and pass data of that dtype.",
                )
            )  # fmt: skip
        x = as_model_input(x, like, name)  # the model's dtype and device
        if x.dim() < 1 or x.shape[0] == 0:
            raise ShapeError(
                expected_got(name, "a non-empty tensor (N, ...) with N >= 1", tuple(x.shape))
            )
        if bool(torch.isinf(x).any()):
            check_finite(x, name)  # raises, counting the NaN and infinite entries
        return x

    @staticmethod
    def _finite_features(x: torch.Tensor, feats: torch.Tensor, name: str) -> torch.Tensor:
        """Non-finite features from NaN inputs are an error about the inputs."""
        if not bool(torch.isfinite(feats).all()):
            check_finite(x, name)
            check_finite(feats, f"{name}: the embedding's features")
        return feats

    def _embed(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """Features ``(N, d)`` of inputs ``(N, ...)`` (no batch dimensions)."""
        feats = self._finite_features(x, self.features(x), name)
        if feats.dim() != 2 or feats.shape[0] != x.shape[0]:
            raise ShapeError(
                expected_got(
                    f"{name}: the embedding's features",
                    f"shape ({x.shape[0]}, {self.gp.feature_dim}) for inputs of shape "
                    f"{tuple(x.shape)}", tuple(feats.shape),
                    "Pass inputs of the shape the embedding expects, one point per row of the "
                    "first dimension (no batch dimensions; model(x) takes batches).",
                )
            )  # fmt: skip
        return feats

    def _check_xy(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self._check_x(x, "InducingGPNetwork x")
        y = self._task.check_targets(y, "InducingGPNetwork y")
        if y.dim() != 1 or x.dim() < 1 or x.shape[0] != y.shape[0]:
            raise ShapeError(
                expected_got(
                    "InducingGPNetwork (x, y)",
                    "x of shape (N, ...) and y of shape (N,)",
                    f"x {tuple(x.shape)}, y {tuple(y.shape)}",
                )
            )
        return x, y.to(x.device)

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        r"""Minibatch loss :math:`-\ell(\theta; B) / b` (002 Eq. 5; section 2.4 for probit tasks).

        Args:
            x: Minibatch inputs, shape ``(b, ...)``.
            y: Targets ``(b,)`` (float for regression, class labels otherwise).

        Returns:
            A scalar tensor to minimise.

        Raises:
            ShapeError: If ``x`` is empty, ``x`` and ``y`` disagree in size, ``y`` is not 1-D,
                or the embedding does not map ``x`` to ``(b, d)`` features.
            InputDataError: For non-finite inputs or targets, or labels outside ``[0, C)``.
            InputTypeError: For inputs of another dtype or device than the model (float16
                data included), a model that is not float32/float64, or non-integer labels.
        """
        x, y = self._check_xy(x, y)
        y = self.standardizer.transform_targets(y)  # the identity before fit / for labels
        b = y.shape[0]
        feats = self._head_features(self._embed(x, "InducingGPNetwork.loss(x)"))
        if self.minibatch_covariance == "independent":  # b minibatches of size one
            mean, var = self.gp.marginal(feats)  # shape: (*h, b) each; no b x b matrix
            return self._task.independent_nll(self, mean, var, y) / b
        prior = self.gp(feats)
        mean, cov = prior.mean, prior.covariance_matrix  # shape: (*h, b), (*h, b, b)
        return self._task.nll(self, mean, cov, y) / b

    # ------------------------------------------------------------------ training
    @torch.no_grad()
    def initialize(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        generator: torch.Generator | None = None,
        max_points: int = 2048,
    ) -> None:
        """Data-dependent initialisation before training.

        With ``standardize`` the data transform (:attr:`standardizer`) is fitted on
        ``(x, y)`` first.  ``Z`` is placed at the features of random training inputs, ``r`` is
        fitted by ridge regression of the (transformed) targets on the features, and, for the
        default kernel, the lengthscales are set to the larger of the median pairwise feature
        distance and the features' root-mean-square norm; with appended inputs (regression)
        their lengthscales and the outputscale are then set to an exact GP's
        (:meth:`_pin_input_kernel`), which :meth:`fit` keeps fixed.

        Args:
            x: Training inputs ``(N, ...)``.
            y: Training targets ``(N,)``.
            generator: Random generator for the subsets.
            max_points: At most this many inputs are embedded.

        Raises:
            InputDataError / ShapeError / InputTypeError: For invalid inputs, as :meth:`loss`,
                or fewer points than inducing points.
        """
        x, y = self._check_xy(x, y)
        if self.standardize:
            self._fit_standardizer(x, y)
        y = self.standardizer.transform_targets(y)
        n = y.shape[0]
        idx = torch.randperm(n, generator=generator)[: max(max_points, self.gp.num_inducing)].to(
            y.device
        )
        was_training = self.training
        self.eval()
        feats = self._embed(x[idx], "InducingGPNetwork.initialize(x)")
        self.train(was_training)
        targets = self._task.init_targets(self, y[idx], feats)
        # the small-table refit copy may hold fewer rows than inducing points (see fit)
        self.gp.initialize_from_features(feats, targets.to(feats), generator=generator,
                                         fill=getattr(self, "_fill_inducing", False))  # fmt: skip
        self._fitted = True
        if self._default_kernel:
            sub = feats[: min(512, feats.shape[0])]
            dist = torch.cdist(sub, sub)
            med = dist[dist > 0].median() if bool((dist > 0).any()) else dist.new_tensor(1.0)
            # at least the features' RMS norm: early embedding updates move features by about
            # their own scale, which must not push them out of reach of Z
            med = torch.maximum(med, sub.pow(2).sum(-1).mean().sqrt())
            self.gp.covar_module.base_kernel.lengthscale = med.clamp_min(1e-3).expand_as(
                self.gp.covar_module.base_kernel.lengthscale
            )
        self._input_kernel_pin = None
        if self._default_kernel and self.input_augmented and self._task.learned_noise:
            self._pin_input_kernel(x[idx[:500]], y[idx[:500]], generator)

    def _pin_input_kernel(self, x: torch.Tensor, t: torch.Tensor, generator) -> None:
        r"""Fix the kernel's lengthscales on the appended inputs and its outputscale at the MAP
        values of an exact GP on (up to 500) standardised training rows.

        Eq. 5 charges every unit of latent variance at the training rows and pays for none
        elsewhere, so learned hyperparameters drift to where the latent variance vanishes
        (outputscales of 0.05-0.13 and lengthscales beyond the spread of the inputs on the
        1-D gap toy): the predictive variance then stays at the noise level however far a
        point is from the data.  With the input lengthscales and the outputscale of an exact
        GP (:func:`gpext.fit.fit_exact_gp`), the correlation of two points is at most that of
        the exact GP in input space, so the latent variance off the data grows towards the
        exact GP's signal variance; the network's lengthscales stay learned.  :meth:`fit`
        keeps these values through training (``self._input_kernel_pin``).
        """
        from gpext.fit import build_exact_gp, fit_exact_gp

        d = self.embedding_dim
        with torch.no_grad():
            z = self.features(x)[..., d:].detach() / self.input_scale
        if z.shape[0] < 3:
            return
        with warnings.catch_warnings(), torch.enable_grad():
            warnings.simplefilter("ignore")  # the network's own checks report on the fit
            gp = build_exact_gp(z.double(), t.detach().double(), kernel="rbf", ard=True,
                                priors=True, standardize=False)  # fmt: skip
            fit_exact_gp(gp, num_restarts=2, max_iter=50, check=False, generator=generator,
                         name="InducingGPNetwork input kernel", show_progress=False)  # fmt: skip
        kern = self.gp.covar_module
        with torch.no_grad():
            ls = kern.base_kernel.lengthscale.detach().clone()
            fitted = gp.covar_module.base_kernel.lengthscale.detach().reshape(-1)
            ls[..., d:] = self.input_scale * fitted.to(ls)
            kern.base_kernel.lengthscale = ls
            kern.outputscale = gp.covar_module.outputscale.detach().to(ls).reshape(())
        self._input_kernel_pin = (
            kern.base_kernel.raw_lengthscale.detach()[..., d:].clone(),
            kern.raw_outputscale.detach().clone(),
        )

    def _restore_input_kernel(self) -> None:
        """Put back the pinned input lengthscales and outputscale (after an optimiser step)."""
        raw_ls, raw_os = self._input_kernel_pin
        kern = self.gp.covar_module
        with torch.no_grad():
            kern.base_kernel.raw_lengthscale[..., self.embedding_dim :] = raw_ls
            kern.raw_outputscale.copy_(raw_os)

    def fit(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        epochs: int = 50,
        batch_size: int = 256,
        lr: float = 1e-3,
        gp_lr: float | None = None,
        weight_decay: float = 0.0,
        lr_schedule: str = "constant",
        validation_fraction: float | None = None,
        calibrate_noise: bool | None = None,
        initialize: bool = True,
        refit_pseudo_labels: bool | None = None,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
        check_fit: bool = True,
        min_steps: int | None = None,
    ) -> FitResult:
        r"""Adam on the minibatch loss :meth:`loss`, data reshuffled every epoch.

        With ``validation_fraction > 0`` a seeded random part of ``(x, y)`` is held out, the
        model is trained on the rest, and the parameters of the epoch with the lowest
        validation loss (predictive NLL; for the classification tasks the NLL of
        :meth:`predict_proba`) are restored at the end: early stopping without looking at
        test data.  For regression the noise variance is then re-estimated on the held-out
        rows (:meth:`calibrate_noise`): the network can interpolate its training targets, and
        the noise learned on them then says so (on the boston housing splits 0-2,
        ``MLP(13, [64, 64], 8)``, 200 epochs, no hold-out: learned noise 0.017-0.019 of the
        targets' variance and 72-84% test coverage of the central 95% interval; with the
        hold-out and calibration 96-98%).

        Small regression fits (below :attr:`AUTO_VALIDATION_MIN_POINTS` rows, where by
        default nothing is held out; at least about 50) keep every row for training; a copy of
        the model as it was before this call is then fitted with the same arguments on a
        random 80% of the rows (:attr:`REFIT_CHECK_FRACTION`), its noise is calibrated on the
        other
        20%, this model's noise is raised to that value (``calibrate_noise``; it is recorded
        in ``noise_calibration_`` with ``"method": "refit"``), and the copy's predictions on
        those rows stand in for this model's in the checks below.  It doubles the cost of a
        small fit; ``check_fit=False, calibrate_noise=False`` skip it.  A larger fit with
        ``validation_fraction=0`` is checked on its training rows only.

        The data are standardised inside (``standardize`` of the constructor): ``x`` and
        ``y`` are in the original units, as are every prediction and ``noise_calibration_``.

        Args:
            x: Training inputs ``(N, ...)`` on the model's device.
            y: Training targets ``(N,)``.
            epochs: Passes over the data, at least: raised to
                :math:`\lceil S_{\min} / B\rceil` for ``B`` minibatches per epoch and the
                step budget :math:`S_{\min}` (``min_steps``).
            batch_size: Minibatch size ``b``.
            lr: Adam learning rate of the embedding (the initial one for
                ``lr_schedule="cosine"``).  The default ``1e-3`` is deliberately small: the
                first Adam steps move every weight by about ``lr`` in the sign of its
                gradient, and at ``5e-3`` (the former default) an ``MLP(1, [64, 64], 8)``
                moved the training features from 0.02 to 1.5 lengthscales away from the
                nearest inducing point within 4 steps on a 1-D toy.  There
                :math:`K_{xZ} \approx 0`, the mean is zero, the gradient that could bring the
                features back vanishes like :math:`e^{-d^2/2}`, and Eq. 5 (unlike an ELBO) does
                not penalise the extra variance :math:`k_{xx} - q_{xx}`: the fit predicts the
                mean and the noise absorbs the targets (3 of 10 seeds at ``5e-3``, 0 of 10 at
                ``1e-3`` and at ``2e-3``, also with the inputs scaled by 5 or by 1/3).
            weight_decay: Adam weight decay (applied to the embedding only).
            gp_lr: Learning rate of everything except the embedding (inducing points, the
                pseudo-label function, kernel and noise hyperparameters); default
                :func:`default_gp_lr`: ``GP_PARAMETER_TRAVEL / S`` for ``S`` Adam steps in all
                (``epochs`` times the minibatches per epoch), within ``[1e-2, 5e-2]``, and at
                least ``lr``.  The noise and kernel
                hyperparameters must travel several units in their raw (softplus)
                parametrisation, and an Adam step moves each by at most about its learning
                rate: with ``gp_lr = 1e-3`` the noise of the toy above stayed near 0.5 instead
                of reaching 0.03 (true value 0.0225), and with ``1e-2`` on the 277-row yacht
                splits (one minibatch per epoch, 200 epochs) it stopped at 0.10 of Var(y), where
                the network's squared error is below 0.01, so every test point of 10 splits fell
                inside the central 95% interval.  The ``1 / S`` term lets the raw parameters
                travel :data:`GP_PARAMETER_TRAVEL` units over runs from 200 steps (yacht:
                0.971 coverage, 10 splits).
            lr_schedule: ``"constant"`` or ``"cosine"`` (both learning rates annealed to zero
                over all minibatch steps).
            validation_fraction: Fraction of the data held out for early stopping, in
                ``[0, 0.5]``.  ``None`` (default): 0.1 when there are at least
                :attr:`AUTO_VALIDATION_MIN_POINTS` training points, else 0 (too few rows to
                spare; the noise is then calibrated by the refit described above).
            calibrate_noise: Re-estimate the regression noise on the held-out rows after
                training (:meth:`calibrate_noise`), or without a hold-out on the rows a
                refit on the rest left out (see above; at least 50 rows).  ``None``
                (default): whenever one of these is possible and ``task="regression"``.
            initialize: Call :meth:`initialize` first.
            refit_pseudo_labels: After the last epoch (and after restoring the best epoch),
                replace :math:`\mathbf r` by the closed-form minimiser of the full training
                objective (:meth:`refit_pseudo_labels`, default ridge).  ``None`` (default):
                only for ``task="regression"`` with the (default) independent minibatch
                covariance, whose objective it minimises exactly (up to the prior of
                :meth:`refit_pseudo_labels`).  On 20% validation parts carved from 8 training
                sets of ``benchmarks/ign.py`` (folds 0/1 of its five regression sets and fold 4
                of keggdirected) it lowered the validation RMSE on 7 (by 0.04% to 6%; mean
                -0.9%) and raised it by 0.3% on the eighth; for ``"dirichlet"`` it raised
                the validation NLL on digits, and the probit tasks have no closed form.
            generator: Random generator for initialisation, the hold-out and shuffling.
            show_progress: Progress bar (``None``: only on a terminal).
            check_fit: Check the fit: for ``task="regression"`` for a collapse to the mean
                (:meth:`check_fit`) and, after the noise calibration, the shared end-of-fit
                checks :func:`gpext.fit.check_heldout` on the held-out rows (or the rows a
                refit left out: see above): :math:`R^2 \le 0` against the training mean,
                coverage of the central 95% interval and the mean squared z-score; for the
                classification tasks for class probabilities that are constant over the
                training inputs (:func:`gpext.fit.check_predictions_vary`); warn if so, and
                record the problems in the result.
            min_steps: The step budget :math:`S_{\min}`: at least this many Adam steps
                (``None``: :attr:`MIN_STEPS`; 0: ``epochs`` alone decides).  The default
                ``gp_lr`` follows the real number of steps.

        Returns:
            The :class:`~gpext.fit.FitResult` of :func:`gpext.fit.train_loop` (``losses``:
            the mean minibatch loss of each epoch; ``validation_losses``, also kept in
            ``validation_history_``, with a validation split).

        Raises:
            InputDataError / ShapeError / InputTypeError: For invalid inputs, as :meth:`loss`.
            FitError: On a non-finite loss or parameter (the last finite state is restored).
            InputDataError: For an unknown schedule, a fraction outside ``[0, 0.5]``, or
                ``refit_pseudo_labels=True`` with a probit task.

        Warns:
            VarianceCollapseWarning: If ``check_fit`` and the regression fit is degenerate
                (see :meth:`check_fit`).
            NoSignalWarning: If ``check_fit`` and the regression predictions on rows not
                trained on explain nothing (:math:`R^2 \le 0`).
            OverconfidenceWarning / UnderconfidenceWarning: If ``check_fit`` and the
                intervals on those rows are far too narrow / wide.
            ConvergenceWarning: If the training loss is still clearly falling at the end of
                the budget (:func:`gpext.fit.train_loop`; not with a hold-out, whose best
                epoch is restored).
        """
        x, y = self._check_xy(x, y)
        epochs = check_positive_int(epochs, "InducingGPNetwork.fit.epochs")
        batch_size = check_positive_int(batch_size, "InducingGPNetwork.fit.batch_size", minimum=2)
        if min_steps is None:
            min_steps = self.MIN_STEPS
        min_steps = check_positive_int(min_steps, "InducingGPNetwork.fit.min_steps", minimum=0)
        if lr_schedule not in ("constant", "cosine"):
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.fit.lr_schedule", "'constant' or 'cosine'", repr(lr_schedule)
                )
            )
        lr = check_learning_rate(lr, "InducingGPNetwork.fit.lr")
        gp_lr = check_learning_rate(gp_lr, "InducingGPNetwork.fit.gp_lr", allow_none=True)
        if validation_fraction is None:
            auto = y.shape[0] >= self.AUTO_VALIDATION_MIN_POINTS
            validation_fraction = 0.1 if auto else 0.0
        if not 0.0 <= float(validation_fraction) <= 0.5:
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.fit.validation_fraction", "a number in [0, 0.5]",
                    validation_fraction,
                )
            )  # fmt: skip
        if refit_pseudo_labels is None:
            refit_pseudo_labels = (
                self._task.learned_noise and self.minibatch_covariance == "independent"
            )
        if refit_pseudo_labels and not self._task.gaussian:
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.fit.refit_pseudo_labels",
                    "False or None for the probit tasks (no closed form)",
                    f"True with task={self.task!r}",
                )
            )
        n_all = y.shape[0]
        n_val = int(round(float(validation_fraction) * n_all))
        regression = self._task.learned_noise
        # (below AUTO_VALIDATION_MIN_POINTS rows, where the default holds none out)
        refit_rows = (
            regression
            and n_val == 0
            and n_all < self.AUTO_VALIDATION_MIN_POINTS
            and (holdout_split(n_all, self.REFIT_CHECK_FRACTION, None) is not None)
        )
        if calibrate_noise and (not regression or (n_val == 0 and not refit_rows)):
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.fit.calibrate_noise",
                    "False or None without held-out rows (validation_fraction=0 and fewer "
                    f"than about {round(10 / self.REFIT_CHECK_FRACTION)} or at least "
                    f"{self.AUTO_VALIDATION_MIN_POINTS} rows) or for a classification task",
                    f"True with {n_all} rows, validation_fraction={validation_fraction}, "
                    f"task={self.task!r}",
                )
            )
        if calibrate_noise is None:
            calibrate_noise = regression and (n_val > 0 or refit_rows)
        # small regression fits keep no rows: a copy of the initial state is refitted on 80%
        # of them at the end, to check (and calibrate) the fit on the other 20%
        refit_copy = copy.deepcopy(self) if refit_rows and (check_fit or calibrate_noise) else None
        refit_args = {
            "epochs": epochs, "batch_size": batch_size, "lr": lr, "gp_lr": gp_lr,
            "weight_decay": weight_decay, "lr_schedule": lr_schedule, "initialize": initialize,
            "refit_pseudo_labels": refit_pseudo_labels, "min_steps": min_steps,
        }  # fmt: skip
        x_val = y_val = None
        if n_val > 0:
            perm = torch.randperm(n_all, generator=generator).to(y.device)
            x_val, y_val = x[perm[:n_val]], y[perm[:n_val]]
            x, y = x[perm[n_val:]], y[perm[n_val:]]
        if initialize:
            self.initialize(x, y, generator=generator)
        per_epoch = math.ceil(y.shape[0] / batch_size)
        if per_epoch > 1 and y.shape[0] - (per_epoch - 1) * batch_size < 2:
            per_epoch -= 1  # minibatch_indices merges a last batch of one point
        # the budget in steps: at least min_steps Adam steps whatever n and batch_size
        total_epochs = max(epochs, math.ceil(min_steps / per_epoch))
        emb = set(id(p) for p in self.embedding.parameters())
        rest = [p for p in self.parameters() if id(p) not in emb and p.requires_grad]
        opt = torch.optim.Adam(
            [
                {"params": list(self.embedding.parameters()), "weight_decay": weight_decay},
                {
                    "params": rest,
                    "lr": default_gp_lr(lr, total_epochs * per_epoch) if gp_lr is None else gp_lr,
                },
            ],
            lr=lr,
        )
        n = y.shape[0]
        result = train_loop(
            lambda idx: self.loss(x[idx], y[idx]),
            opt,
            modules=[self],
            epochs=total_epochs,
            min_steps=min_steps or None,
            batches=lambda _: minibatch_indices(
                n, batch_size, generator=generator, device=y.device, min_size=2
            ),
            lr_schedule=lr_schedule,
            validation=None if x_val is None else (lambda: self._validation_nll(x_val, y_val)),
            # about 200 validation checks and 100 snapshots of the state per run at most
            eval_every=max(1, total_epochs // 200),
            snapshot_every=max(1, total_epochs // 100),
            after_step=(
                self._restore_input_kernel
                if getattr(self, "_input_kernel_pin", None) is not None
                else None
            ),
            show_progress=show_progress,
            desc="IGN",
        )
        self.validation_history_ = list(result.validation_losses)
        if refit_pseudo_labels:
            self.refit_pseudo_labels(x, y)
        self.eval()
        if calibrate_noise and x_val is not None:
            self.calibrate_noise(x_val, y_val)
        # (mean, variance, targets, training mean, what, (x_fit, y_fit, x_held)) of rows not
        # trained on; the last entry is for the exact-GP reference of the checks
        held = None
        if x_val is not None:
            held = (*self.predict(x_val), y_val, float(y.double().mean()), "held-out rows",
                    (x, y, x_val))  # fmt: skip
        elif refit_copy is not None:
            held = self._refit_on_part(refit_copy, x, y, refit_args, calibrate_noise, generator)
        if check_fit and regression:
            if not self.check_fit(x, y, generator=generator):
                result.add_problem(VarianceCollapseWarning.__name__)
            if held is not None:
                mean, var, target, base, what, (x_fit, y_fit, x_held) = held
                reference = reference_heldout_nll(x_fit, y_fit, x_held, target,
                                                  generator=torch.Generator().manual_seed(0))  # fmt: skip
                self.heldout_check_ = check_heldout(
                    mean, var, target, train_mean=base, name="InducingGPNetwork.fit",
                    result=result, what=what, reference_nll=reference,
                )  # fmt: skip
        elif check_fit:
            sub = slice(0, min(y.shape[0], 2048))
            probs = self.predict_proba(x[sub], num_samples=64, generator=generator)
            onehot = torch.nn.functional.one_hot(y[sub], probs.shape[-1]).to(probs)
            check_predictions_vary(probs, onehot, name="InducingGPNetwork", result=result,
                                   stacklevel=3)  # fmt: skip
        self.fit_result_ = result
        return result

    def _refit_on_part(self, fresh, x, y, fit_args, calibrate, generator):
        """Fit ``fresh`` (a copy of the initial state) on 80% of the rows; its predictions on
        the rest, after calibrating its noise there (and raising this model's noise to the
        calibrated value when ``calibrate``).  ``None`` when there are too few rows."""
        split = refit_split(y.shape[0], self.REFIT_CHECK_FRACTION, generator, y.device)
        if split is None:
            return None
        tr, te, copy_generator = split
        # with fewer rows than inducing points the copy fills the rest between its rows
        fresh._fill_inducing = True
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the copy's own checks: the caller reports
            fresh.fit(x[tr], y[tr], validation_fraction=0.0, calibrate_noise=False,
                      check_fit=False, show_progress=False,
                      generator=copy_generator, **fit_args)  # fmt: skip
        fresh.eval()
        if calibrate:
            before = fresh.noise_variance
            hat = fresh.calibrate_noise(x[te], y[te], allow_decrease=True)
            fresh._set_noise_variance(max(before, hat))
            own = self.noise_variance
            self._set_noise_variance(max(own, hat))
            self.noise_calibration_ = {
                "before": own, "after": self.noise_variance, "num_points": int(te.numel()),
                "method": "refit",
            }  # fmt: skip
        mean, var = fresh.predict(x[te])
        return (mean, var, y[te], float(y[tr].double().mean()),
                "rows held out from a refit on the rest", (x[tr], y[tr], x[te]))  # fmt: skip

    @torch.no_grad()
    def check_fit(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        max_points: int = 4096,
        threshold: float = MIN_EXPLAINED_VARIANCE,
        generator: torch.Generator | None = None,
    ) -> bool:
        r"""Check a regression fit for a collapse to the mean (run at the end of :meth:`fit`).

        With the predictive mean :math:`\hat y` of Eq. 7 on (up to ``max_points`` random)
        training inputs, the learned noise :math:`\sigma^2` and the targets' variance
        :math:`s_y^2`,

        .. math::

            R^2 = 1 - \frac{\overline{(y - \hat y)^2}}{s_y^2}, \qquad
            \text{degenerate if } R^2 < \tau \ \text{ or } \ \sigma^2 > (1 - \tau)\, s_y^2

        with :math:`\tau` = ``threshold``: the model explains (almost) none of the targets, or
        claims that (almost) all of their variance is noise.  A degenerate fit is either an
        optimisation failure (too few epochs, a learning rate too large for the embedding
        or too small for the hyperparameters, features that left the inducing points' reach)
        or targets without signal in the inputs.

        Args:
            x: Training inputs ``(N, ...)``.
            y: Training targets ``(N,)``.
            max_points: At most this many random training points are predicted.
            threshold: :math:`\tau`.
            generator: Random generator for the subset.

        Returns:
            ``True`` if the fit is not degenerate.

        Raises:
            InputDataError: If the task is not ``"regression"``.

        Warns:
            VarianceCollapseWarning: If the fit is degenerate; the message quotes
                :math:`R^2`, :math:`\sigma^2` and :math:`s_y^2` and what to try.
        """
        if not self._task.learned_noise:
            raise InputDataError(
                expected_got("InducingGPNetwork.check_fit", "task 'regression'", repr(self.task))
            )
        x, y = self._check_xy(x, y)
        if y.shape[0] > max_points:
            idx = torch.randperm(y.shape[0], generator=generator)[:max_points].to(y.device)
            x, y = x[idx], y[idx]
        y_var = float(y.double().var()) if y.numel() > 1 else 0.0
        if not y_var > 0.0:
            return True
        mean, _ = self.predict(x)
        r2 = 1.0 - float((y.double() - mean.double()).pow(2).mean()) / y_var
        noise = self.noise_variance
        if r2 >= threshold and noise <= (1.0 - threshold) * y_var:
            return True
        warnings.warn(
            f"InducingGPNetwork.fit: degenerate fit: the predictive mean explains R^2 = "
            f"{r2:.3f} of the training targets' variance and the learned noise variance is "
            f"{noise:.3g} against Var(y) = {y_var:.3g} ({noise / y_var:.0%}); the model "
            "predicts close to the mean and calls the rest noise. Try more epochs, a smaller "
            "embedding learning rate `lr` (default 1e-3) or a larger `gp_lr`, standardised "
            "inputs, or check that the inputs carry signal about y.",
            VarianceCollapseWarning,
            stacklevel=3,
        )
        return False

    @torch.no_grad()
    def refit_pseudo_labels(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        batch_size: int = 2048,
        ridge: float = 1.0,
    ) -> torch.Tensor:
        r"""Solve for the pseudo-labels that minimise the full-data objective, in closed form.

        For the Gaussian tasks (``"regression"``, ``"dirichlet"``) and the independent form of
        002 Eq. 5, the objective on all of ``(x, y)`` is, for a fixed embedding, kernel,
        :math:`Z` and noise, a weighted least-squares problem in :math:`\mathbf r` (see
        :meth:`gpext.variational.FeatureSpaceInducingGP.solve_pseudo_labels`, which states the
        equation and the ridge).  One pass over the data, in batches of ``batch_size`` and in
        evaluation mode, accumulates the ``m x m`` normal equations (:math:`O(Nm^2)`), so this
        is cheap next to an epoch of training.  During training :math:`\mathbf r = r(Z)` is
        confined to the ``d + 1`` parameters of the linear function :math:`r` (002); the
        closed form frees all ``m`` pseudo-labels (re-solving only for the linear function's
        ``d + 1`` parameters did not change validation RMSE).  The solution is stored as the
        pseudo-label offset (beyond 002, whose pseudo-labels are exactly linear in :math:`Z`);
        predictions then follow Eq. 7 with the new :math:`\mathbf r`.  The offset is kept
        by later training with ``initialize=False`` and reset by :meth:`initialize`.

        Args:
            x: Training inputs ``(N, ...)``.
            y: Training targets ``(N,)``.
            batch_size: Inputs embedded at a time.
            ridge: Prior precision multiplier :math:`\lambda` of the offsets
                :math:`\mathbf r - r(Z)` (prior standard deviation :math:`s_y/\sqrt\lambda`
                for targets of standard deviation :math:`s_y`).  With the near-flat prior
                of a fixed ridge ``1e-3`` (an earlier version) the validation RMSE fell a
                little more (mean -2.0% on 7 validation parts) but pseudo-labels of
                inducing points that few training points reach grew to 20 times the
                range of the targets on keggdirected, and one test point of its fold 4 got
                an error of 6 standard deviations; the default :math:`\lambda = 1` keeps
                the pseudo-labels in the range of the linear ones.

        Returns:
            The new pseudo-labels, shape ``(m,)`` or ``(C, m)``.

        Raises:
            InputDataError: For the probit tasks (their objective is not quadratic in
                :math:`\mathbf r`) or a negative ridge; and, with :class:`ShapeError` and
                :class:`InputTypeError`, for invalid inputs, as :meth:`loss`.

        Example:
            >>> import torch
            >>> from gpext.models import InducingGPNetwork
            >>> from gpext.nn import MLP
            >>> g = torch.Generator().manual_seed(0)
            >>> x = torch.randn(200, 3, generator=g)
            >>> y = x[:, 0].sin() + 0.1 * torch.randn(200, generator=g)
            >>> model = InducingGPNetwork(MLP(3, [32], 4), num_inducing=16)
            >>> _ = model.fit(x, y, epochs=5, batch_size=50, refit_pseudo_labels=False)
            >>> model.refit_pseudo_labels(x, y).shape
            torch.Size([16])
        """
        if not self._task.gaussian:
            raise InputDataError(
                expected_got(
                    "InducingGPNetwork.refit_pseudo_labels",
                    "task 'regression' or 'dirichlet' (a Gaussian objective)",
                    repr(self.task),
                    "The probit tasks have no closed-form pseudo-labels.",
                )
            )
        x, y = self._check_xy(x, y)
        y = self.standardizer.transform_targets(y)
        batch_size = check_positive_int(batch_size, "refit_pseudo_labels.batch_size")
        self.eval()

        def batches():
            for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
                feats = self._embed(xb, "InducingGPNetwork.refit_pseudo_labels(x)")
                yield (feats, *self._task.gaussian_terms(self, yb, feats))

        self._fitted = True
        return self.gp.solve_pseudo_labels(batches(), ridge=ridge)

    @torch.no_grad()
    @torch.no_grad()
    def calibrate_noise(
        self, x_val: torch.Tensor, y_val: torch.Tensor, *, allow_decrease: bool = False
    ) -> float:
        r"""Set the regression noise to the one that maximises the held-out likelihood.

        With the latent predictive mean :math:`\mu_i` and variance :math:`s_i` (002 Eq. 7,
        noise excluded) on held-out rows :math:`(x_i, y_i)`, the new noise is

        .. math::

            \hat\sigma^2 = \arg\min_{\sigma^2} \sum_i \frac{(y_i - \mu_i)^2}{s_i + \sigma^2}
                + \log(s_i + \sigma^2),

        found by golden-section search on :math:`\log\sigma^2` (bracketed by a grid over
        :math:`[10^{-8}, 10]` times the mean squared residual).  Post-hoc recalibration of
        one scalar, like temperature scaling: the ranking of the predictions is unchanged,
        only their spread.  The value is clamped to the likelihood's noise constraint.

        By default the noise is only ever raised, :math:`\sigma^2 \leftarrow
        \max(\sigma^2, \hat\sigma^2)`: the hold-out is there to catch a network that
        interpolated its training targets (a training noise that is too small), and IGN's
        epistemic variance away from the data is small, so a larger training noise often
        carries the uncertainty there.  On the 1-D gap toy of ``benchmarks/robustness.py``
        (6 seeds), lowering it too moved the share of gap points beyond 2 sd from 0.19 to
        0.40.

        Args:
            x_val: Held-out inputs ``(M, ...)`` (not used for training).
            y_val: Held-out targets ``(M,)``.
            allow_decrease: Set :math:`\sigma^2 = \hat\sigma^2` even below the current noise.

        Returns:
            The new noise variance (also stored in ``self.likelihood.noise``; the previous and
            new value are kept in ``self.noise_calibration_``).

        Raises:
            InputDataError: If the task is not ``"regression"`` or there are fewer than two
                held-out rows.
        """
        if not self._task.learned_noise:
            raise InputDataError(
                expected_got("InducingGPNetwork.calibrate_noise", "task='regression'",
                             repr(self.task))
            )  # fmt: skip
        x_val, y_val = self._check_xy(x_val, y_val)
        if y_val.shape[0] < 2:
            raise InputDataError(
                expected_got("InducingGPNetwork.calibrate_noise", "at least 2 held-out rows",
                             y_val.shape[0])
            )  # fmt: skip
        mean, var = self.predict(x_val, include_noise=False)
        r2 = (y_val.to(mean) - mean).square().double()
        s = var.double().clamp_min(0.0)
        scale = max(float(r2.mean()), 1e-300)

        def nll(log_noise: float) -> float:
            v = s + math.exp(log_noise)
            return float((r2 / v + v.log()).mean())

        grid = [math.log(scale) + t for t in torch.linspace(-18.4, 2.3, 61).tolist()]
        new = math.exp(minimize_scalar_on_grid(nll, grid)[0])
        before = self.noise_variance
        if not allow_decrease:
            new = max(new, before)
        self._set_noise_variance(new)
        after = self.noise_variance
        self.noise_calibration_ = {"before": before, "after": after, "num_points": len(y_val)}
        return after

    def _validation_nll(self, x: torch.Tensor, y: torch.Tensor) -> float:
        """Mean predictive NLL on held-out data (early stopping in :meth:`fit`)."""
        if not self._task.classification:
            mean, var = self.predict(x)
            nll = 0.5 * ((y - mean) ** 2 / var + var.log() + math.log(2 * math.pi))
        else:
            probs = self.predict_proba(x, num_samples=64)
            nll = -probs.gather(-1, y.view(-1, 1)).clamp_min(1e-12).log()
        value = float(nll.mean())
        return value if math.isfinite(value) else math.inf

    # ------------------------------------------------------------------ prediction (Eq. 7)
    @torch.no_grad()
    def predict(
        self, x: torch.Tensor, *, include_noise: bool = True, batch_size: int = 1024
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Predictive mean and variance by 002 Eq. 7, in chunks of ``batch_size`` inputs.

        Args:
            x: Test inputs ``(M, ...)``.
            include_noise: Add the Gaussian noise variance (regression only).
            batch_size: Chunk size.

        Returns:
            ``(mean, variance)`` of shape ``(M,)`` (regression, binary) or ``(C, M)``.

        Raises:
            NotFittedError: Before :meth:`fit`, :meth:`initialize`, :meth:`refit_pseudo_labels`
                or ``load_state_dict``.
            ShapeError: If ``x`` is empty or the embedding does not map it to ``(M, d)``.
            InputDataError: For non-finite inputs.
            InputTypeError: For inputs of another dtype or device than the model (float16
                data included) or a model that is not float32/float64.
        """
        if not self._fitted:
            raise NotFittedError(
                "InducingGPNetwork.predict: the model is not fitted; call fit(x, y) (or "
                "initialize(x, y), or load a fitted state_dict) first."
            )
        x = self._check_x(x, "InducingGPNetwork.predict(x)")
        batch_size = check_positive_int(batch_size, "InducingGPNetwork.predict.batch_size")
        self.eval()
        means, variances = [], []
        for chunk in x.split(batch_size):
            feats = self._embed(chunk, "InducingGPNetwork.predict(x)")
            m, v = self.gp.marginal(self._head_features(feats))
            means.append(m)
            variances.append(v)
        mean, var = torch.cat(means, -1), torch.cat(variances, -1)
        if include_noise:
            var = self._task.add_noise(self, var)
        return self._untransform_moments(mean, var)

    @torch.no_grad()
    def predict_proba(
        self,
        x: torch.Tensor,
        *,
        num_samples: int = 256,
        generator: torch.Generator | None = None,
        batch_size: int = 1024,
    ) -> torch.Tensor:
        r"""Class probabilities ``(M, C)`` (002 section 2.4; Dirichlet: Monte Carlo softmax).

        Args:
            x: Test inputs ``(M, ...)``.
            num_samples: Monte Carlo samples for ``task="dirichlet"``.
            generator: Random generator for those samples.
            batch_size: Chunk size.

        Raises:
            InputDataError: For ``task="regression"``.
        """
        if not self._task.classification:
            raise InputDataError(
                expected_got("InducingGPNetwork.predict_proba", "a classification task",
                             repr(self.task), "Use predict().")
            )  # fmt: skip
        mean, var = self.predict(x, batch_size=batch_size)
        return self._task.proba(self, mean, var, num_samples, generator)


def _features(standardizer, input_transform, embedding, input_scale, x):
    """Standardise, transform, embed and (``input_scale`` not ``None``) append the inputs."""
    z = standardizer.transform_inputs(x) if standardizer.fitted else x
    if input_transform is not None:
        z = input_transform(z)
    feats = embedding(z)
    if input_scale is None:
        return feats
    if z.shape[:-1] != feats.shape[:-1]:
        raise ShapeError(
            expected_got(
                "InducingGPNetwork features (input_augmented)",
                "inputs (*, N, D) and features (*, N, d) with the same leading shape",
                f"inputs {tuple(z.shape)}, features {tuple(feats.shape)}",
                "Pass input_augmented=False for inputs that are not vectors.",
            )
        )
    return torch.cat([feats, input_scale * z.to(feats)], dim=-1)


class _FeatureExtractor(nn.Module):
    """:meth:`InducingGPNetwork.features` as a module (for :attr:`InducingGPNetwork.kernel`)."""

    def __init__(self, standardizer, input_transform, embedding, input_scale) -> None:
        super().__init__()
        self.standardizer = standardizer
        self.input_transform = input_transform
        self.embedding = embedding
        self.input_scale = input_scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _features(self.standardizer, self.input_transform, self.embedding,
                         self.input_scale, x)  # fmt: skip


def _mark_fitted(module: InducingGPNetwork, incompatible_keys) -> None:
    """A loaded state dict is a fitted model (``load_state_dict`` post-hook)."""
    module._fitted = True

"""Bayesian deep learning over weight subspaces.

* :class:`TrajectoryCollector`, :func:`train_sgd_trajectory`: SWA moments and deviations of an
  SGD trajectory; :class:`FlatParameters`: functional evaluation at flat weights (``torch.func``) of all
  parameters or a selection (``parameters="last_layer"``, ``"requires_grad"``, names), which
  every weight posterior built on it inherits;
  :func:`refresh_batch_norm`.
* Subspaces: :class:`PCASubspace` (:func:`randomized_svd`), :class:`InKPCASubspace`
  (incremental kernel PCA, 000), :class:`CurveSubspace` (the plane of a trained Bezier curve
  between two solutions, :func:`bezier_point`) and :class:`RandomSubspace` (the control).
* Weight posteriors, one protocol (:class:`WeightPosterior`: ``mean``, ``sample``, ``log_prob``,
  ``covariance`` as a LinearOperator): :class:`SWAG`, :class:`OnlineFactorAnalysis` (004), both
  :class:`LowRankGaussianWeightPosterior`; mixtures :class:`WeightMixture`, :class:`MultiSWAG`.
* Regression likelihoods: :class:`OutputLikelihood` (fixed, learned homoscedastic or
  heteroscedastic Gaussian noise; categorical).
* Recipes and held-out tuning: :class:`TrainingRecipe` and :func:`select_recipe`
  (:data:`DRBAYES_RECIPES`, :data:`GPEXT_RECIPE`); :mod:`gpext.subspace.tuning`
  (:func:`select_noise_variance`, :func:`select_swag_scale`, :func:`select_prior_std`,
  :func:`select_likelihood`, :func:`select_temperature`, :func:`temperature_grid`); a post-hoc start from a pretrained
  network, :func:`collect_from_pretrained`.
* Data: every entry point that reads data takes tensors or a loader of batches (e.g. a
  ``torch.utils.data.DataLoader``), streamed batch by batch (:mod:`gpext.subspace.data`).
* Inference in a subspace: :class:`SubspaceModel` with :class:`EllipticalSliceSampler` and
  :class:`MeanFieldGaussian` VI; Bayesian model averaging helpers and their held-out calibration and check
  (:func:`select_mixture_variance_scale`, :func:`check_mixture_heldout`); the linearised (GLM)
  predictive of a Gaussian over the coordinates or over (a selection of) the weights,
  :func:`linearized_predictive`; the exact posterior of the last linear layer with
  evidence-tuned prior and noise precisions, :class:`BayesianLastLayer`.
"""

from gpext.fit.temperature import HyperparameterSelection
from gpext.subspace.batch_norm import has_batch_norm, refresh_batch_norm
from gpext.subspace.bayesian_last_layer import BayesianLastLayer
from gpext.subspace.bayesian_model_averaging import (
    check_mixture_heldout,
    classification_average,
    predict_weight_samples,
    regression_mixture_log_likelihood,
    regression_mixture_moments,
    select_mixture_variance_scale,
)
from gpext.subspace.curve_subspace import CurveSubspace, bezier_point
from gpext.subspace.elliptical_slice_sampler import EllipticalSliceSampler
from gpext.subspace.flat_parameters import PARAMETER_SELECTIONS, FlatParameters, ParameterSelection
from gpext.subspace.inkpca_subspace import InKPCASubspace
from gpext.subspace.linearized_predictive import gaussian_from_samples, linearized_predictive
from gpext.subspace.mean_field_gaussian import MeanFieldGaussian
from gpext.subspace.multi_swag import MultiSWAG
from gpext.subspace.online_factor_analysis import OnlineFactorAnalysis
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.pca_subspace import PCASubspace
from gpext.subspace.post_hoc import collect_from_pretrained, mean_negative_log_likelihood
from gpext.subspace.random_subspace import RandomSubspace
from gpext.subspace.randomized_svd import randomized_svd
from gpext.subspace.sgd_trajectory import train_sgd_trajectory
from gpext.subspace.subspace_model import SubspaceModel
from gpext.subspace.swag import SWAG
from gpext.subspace.training_recipe import (
    DRBAYES_RECIPES,
    GPEXT_RECIPE,
    RecipeSelection,
    TrainingRecipe,
    recipe_candidates,
    select_recipe,
    training_recipe,
)
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.subspace.tuning import (
    regression_network,
    select_by_validation,
    select_likelihood,
    select_mixture_temperature,
    select_noise_variance,
    select_prior_std,
    select_swag_scale,
    select_temperature,
    temperature_grid,
    validation_log_likelihood,
)
from gpext.subspace.weight_posterior import (
    LowRankGaussianWeightPosterior,
    WeightMixture,
    WeightPosterior,
)

__all__ = [
    "BayesianLastLayer",
    "CurveSubspace",
    "RandomSubspace",
    "bezier_point",
    "gaussian_from_samples",
    "linearized_predictive",
    "DRBAYES_RECIPES",
    "GPEXT_RECIPE",
    "HyperparameterSelection",
    "RecipeSelection",
    "TrainingRecipe",
    "collect_from_pretrained",
    "mean_negative_log_likelihood",
    "recipe_candidates",
    "regression_network",
    "select_by_validation",
    "select_likelihood",
    "select_mixture_temperature",
    "select_noise_variance",
    "select_prior_std",
    "select_recipe",
    "select_swag_scale",
    "select_temperature",
    "temperature_grid",
    "training_recipe",
    "validation_log_likelihood",
    "EllipticalSliceSampler",
    "FlatParameters",
    "PARAMETER_SELECTIONS",
    "ParameterSelection",
    "InKPCASubspace",
    "LowRankGaussianWeightPosterior",
    "MeanFieldGaussian",
    "MultiSWAG",
    "OnlineFactorAnalysis",
    "OutputLikelihood",
    "PCASubspace",
    "SWAG",
    "SubspaceModel",
    "TrajectoryCollector",
    "WeightMixture",
    "WeightPosterior",
    "check_mixture_heldout",
    "classification_average",
    "has_batch_norm",
    "predict_weight_samples",
    "randomized_svd",
    "refresh_batch_norm",
    "regression_mixture_log_likelihood",
    "regression_mixture_moments",
    "select_mixture_variance_scale",
    "train_sgd_trajectory",
]

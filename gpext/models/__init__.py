"""gpext.models: complete GP models built from gpext's likelihoods and variational strategies.

* :class:`DirichletGPClassifier`: exact / sparse Dirichlet-transform GP classification.
* :class:`InducingGPNetwork`: inducing points in a neural feature space (IGN).
* :class:`GWIRegressionModel`, :class:`GWIClassificationModel` (base :class:`GWIModel`):
  generalized variational inference with the Wasserstein-2 divergence.
"""

from gpext.models.dirichlet_gp_classifier import DirichletGPClassifier
from gpext.models.greedy_inducing_subset import greedy_inducing_subset
from gpext.models.gwi_classification_model import GWIClassificationModel
from gpext.models.gwi_exact_prior import fit_exact_prior
from gpext.models.gwi_model import GWIModel
from gpext.models.gwi_regression_model import GWIRegressionModel
from gpext.models.inducing_gp_network import InducingGPNetwork

__all__ = [
    "DirichletGPClassifier",
    "GWIClassificationModel",
    "GWIModel",
    "GWIRegressionModel",
    "InducingGPNetwork",
    "fit_exact_prior",
    "greedy_inducing_subset",
]

"""gpext.likelihoods: classification likelihoods for GPyTorch models.

* :class:`RobustMaxLikelihood`: robust max over ``J`` latent functions, Gauss-Hermite quadrature.
* :class:`DirichletTransformLikelihood`: Dirichlet-transformed labels as heteroscedastic
  Gaussian regression (exact and variational GPs, minibatches).
* :class:`DirichletTransform`: the label transform and class probabilities, usable by any model.
"""

from gpext.likelihoods.dirichlet_transform import DirichletTargets, DirichletTransform
from gpext.likelihoods.dirichlet_transform_likelihood import DirichletTransformLikelihood
from gpext.likelihoods.robust_max_likelihood import RobustMaxLikelihood

__all__ = [
    "DirichletTargets",
    "DirichletTransform",
    "DirichletTransformLikelihood",
    "RobustMaxLikelihood",
]

"""gpext.variational: variational components for GPyTorch models.

* :class:`FeatureSpaceInducingGP`: inducing points with linear pseudo-labels in a learned
  feature space (Inducing GP Networks, 002 Eq. 5-7).
* :class:`WassersteinVariationalStrategy`, :class:`WassersteinVariationalDistribution`,
  :class:`WassersteinNetworkMean`: generalized variational inference with a Wasserstein-2
  divergence between Gaussian measures (003 section 2), with the estimator
  :func:`wasserstein2_estimate`, the closed form :func:`gaussian_wasserstein2`, and
  :func:`safe_cholesky` (re-exported from :mod:`gpext.utils`).
"""

from gpext.variational.feature_space_inducing_gp import FeatureSpaceInducingGP
from gpext.variational.wasserstein_distance import (
    gaussian_wasserstein2,
    safe_cholesky,
    wasserstein2_estimate,
)
from gpext.variational.wasserstein_network_mean import WassersteinNetworkMean
from gpext.variational.wasserstein_variational_distribution import (
    WassersteinVariationalDistribution,
)
from gpext.variational.wasserstein_variational_strategy import WassersteinVariationalStrategy

__all__ = [
    "FeatureSpaceInducingGP",
    "WassersteinNetworkMean",
    "WassersteinVariationalDistribution",
    "WassersteinVariationalStrategy",
    "gaussian_wasserstein2",
    "safe_cholesky",
    "wasserstein2_estimate",
]

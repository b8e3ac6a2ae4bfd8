"""gpext.variational."""

from gpext.variational.feature_space_inducing_gp import FeatureSpaceInducingGP

__all__: list[str] = []
__all__ += ["FeatureSpaceInducingGP"]
from gpext.variational.wasserstein_distance import (  # noqa: E402
    gaussian_wasserstein2,
    safe_cholesky,
    wasserstein2_estimate,
)
from gpext.variational.wasserstein_network_mean import WassersteinNetworkMean  # noqa: E402
from gpext.variational.wasserstein_variational_distribution import (  # noqa: E402
    WassersteinVariationalDistribution,
)
from gpext.variational.wasserstein_variational_strategy import (  # noqa: E402
    WassersteinVariationalStrategy,
)

__all__ += [
    "WassersteinNetworkMean",
    "WassersteinVariationalDistribution",
    "WassersteinVariationalStrategy",
    "gaussian_wasserstein2",
    "safe_cholesky",
    "wasserstein2_estimate",
]

"""BoTorch integration: gpext models as BoTorch surrogates (needs ``pip install gpext[botorch]``).

* GP adapters (``GPyTorchPosterior``): :class:`IGNSurrogate`,
  :class:`DirichletClassifierSurrogate`, :class:`GWISurrogate` (regression and robust-max
  classification); base class :class:`LatentGPSurrogate`.
* Ensemble adapters (``EnsemblePosterior``): :class:`WeightEnsembleSurrogate` (SWAG,
  MultiSWAG, subspace ESS / VI) and :class:`VBootSurrogate` (VBoot-RFF, VBoot-MLP); base class
  :class:`SampleEnsembleSurrogate`.
* Fitting: :func:`fit_gpext_surrogate` (``fit_gpytorch_mll`` conventions) and
  :func:`fit_weight_ensemble`.
* Constraints: :class:`FeasibilityWeightedAcquisition` (a classifier as the feasibility model).
"""

from gpext.integrations.botorch._requirements import MissingExtraError, require_botorch

require_botorch()

from gpext.integrations.botorch.ax_support import (  # noqa: E402
    ax_fit_defaults,
    fit_ax_surrogate,
    register_ax_fit,
)
from gpext.integrations.botorch.conditioned_ensemble_surrogate import (  # noqa: E402
    ConditionedEnsembleSurrogate,
)
from gpext.integrations.botorch.conditioned_latent_gp_surrogate import (  # noqa: E402
    ConditionedLatentGPSurrogate,
)
from gpext.integrations.botorch.dirichlet_classifier_surrogate import (  # noqa: E402
    DirichletClassifierSurrogate,
)
from gpext.integrations.botorch.feasibility_weighted_acquisition import (  # noqa: E402
    FeasibilityWeightedAcquisition,
)
from gpext.integrations.botorch.fit_gpext_surrogate import fit_gpext_surrogate  # noqa: E402
from gpext.integrations.botorch.fit_weight_ensemble import fit_weight_ensemble  # noqa: E402
from gpext.integrations.botorch.function_draw_path import FunctionDrawPath  # noqa: E402
from gpext.integrations.botorch.gwi_surrogate import GWISurrogate  # noqa: E402
from gpext.integrations.botorch.ign_surrogate import IGNSurrogate  # noqa: E402
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate  # noqa: E402
from gpext.integrations.botorch.noisy_ensemble_posterior import (  # noqa: E402
    NoisyEnsemblePosterior,
)
from gpext.integrations.botorch.noisy_ensemble_sampler import NoisyEnsembleSampler  # noqa: E402
from gpext.integrations.botorch.prior_reversion import PriorReversion  # noqa: E402
from gpext.integrations.botorch.sample_ensemble_surrogate import (  # noqa: E402
    SampleEnsembleSurrogate,
)
from gpext.integrations.botorch.variance_calibration import (  # noqa: E402
    VarianceCalibration,
    cross_validated_variance_scale,
)
from gpext.integrations.botorch.vboot_surrogate import VBootSurrogate  # noqa: E402
from gpext.integrations.botorch.weight_ensemble_surrogate import (  # noqa: E402
    WeightEnsembleSurrogate,
)

__all__ = [
    "ConditionedEnsembleSurrogate",
    "ConditionedLatentGPSurrogate",
    "DirichletClassifierSurrogate",
    "FeasibilityWeightedAcquisition",
    "FunctionDrawPath",
    "GWISurrogate",
    "IGNSurrogate",
    "LatentGPSurrogate",
    "MissingExtraError",
    "NoisyEnsemblePosterior",
    "NoisyEnsembleSampler",
    "PriorReversion",
    "SampleEnsembleSurrogate",
    "VBootSurrogate",
    "VarianceCalibration",
    "WeightEnsembleSurrogate",
    "ax_fit_defaults",
    "cross_validated_variance_scale",
    "fit_ax_surrogate",
    "fit_gpext_surrogate",
    "fit_weight_ensemble",
    "register_ax_fit",
]

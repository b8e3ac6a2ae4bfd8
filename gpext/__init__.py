"""gpext: Gaussian-process and Bayesian-deep-learning extensions for GPyTorch and BoTorch.

Subpackages mirror GPyTorch's layout: :mod:`gpext.likelihoods`, :mod:`gpext.kernels`,
:mod:`gpext.variational`, :mod:`gpext.mlls`, :mod:`gpext.operators`, :mod:`gpext.nn`,
:mod:`gpext.models`, :mod:`gpext.subspace`, :mod:`gpext.bootstrap`, plus :mod:`gpext.data`,
:mod:`gpext.metrics` and :mod:`gpext.errors`.  The BoTorch integration lives in
``gpext.integrations.botorch`` and is only imported on request (it needs the ``botorch`` extra).
"""

from gpext import (
    bootstrap,
    data,
    errors,
    fit,
    kernels,
    likelihoods,
    metrics,
    mlls,
    models,
    nn,
    operators,
    subspace,
    variational,
)

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "bootstrap",
    "data",
    "errors",
    "fit",
    "kernels",
    "likelihoods",
    "metrics",
    "mlls",
    "models",
    "nn",
    "operators",
    "subspace",
    "variational",
]

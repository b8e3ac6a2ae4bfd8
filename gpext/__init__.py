"""gpext: Gaussian-process and Bayesian-deep-learning extensions for GPyTorch and BoTorch.

Subpackages mirror GPyTorch's layout: :mod:`gpext.likelihoods`, :mod:`gpext.kernels`,
:mod:`gpext.variational`, :mod:`gpext.mlls`, :mod:`gpext.operators`, :mod:`gpext.nn`,
:mod:`gpext.models`, :mod:`gpext.subspace`, :mod:`gpext.bootstrap`, :mod:`gpext.fit`, plus
:mod:`gpext.metrics` and :mod:`gpext.errors`.  The BoTorch integration lives in
``gpext.integrations.botorch`` and is only imported on request (it needs the ``botorch`` extra).

The benchmark harness, the dataset loaders and the ``gpext`` command line live in the sibling
package :mod:`gpext_bench` (its extra dependencies come with ``gpext[bench]``); it depends on
gpext, and gpext never imports it.
"""

from gpext import (
    bootstrap,
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

#: The installed version of gpext.
__version__ = "0.1.0"

__all__ = [
    "__version__",
    "bootstrap",
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

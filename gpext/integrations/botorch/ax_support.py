r"""Ax support: gpext's fit routine for Ax's modular BoTorch interface (``pip install ax-platform``).

Ax builds a model of a ``ModelConfig(botorch_model_class=...)`` in three steps:
``botorch_model_class.construct_inputs(training_data, **model_options)``, the constructor
(with the ``input_transform`` / ``outcome_transform`` Ax makes), then
``fit_botorch_model(model, mll_class, mll_options)``, a dispatcher on the model's type.  Every
gpext adapter has a ``construct_inputs`` and a constructor Ax can call; this module supplies the
third step: :func:`fit_ax_surrogate` registered with Ax's dispatcher for all gpext adapters.

Registration happens by itself: the adapters' ``construct_inputs`` call
:func:`register_ax_fit_if_loaded`, so the routine is in place before Ax fits, without any user
code and without gpext importing Ax.  :func:`register_ax_fit` does it explicitly.

Example (needs ``ax-platform``)::

    from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec
    from ax.generators.torch.botorch_modular.utils import ModelConfig
    from gpext.integrations.botorch import IGNSurrogate

    spec = SurrogateSpec(model_configs=[ModelConfig(
        botorch_model_class=IGNSurrogate,
        model_options={"num_inducing": 8},  # -> IGNSurrogate.construct_inputs
        mll_options={"epochs": 50},  # -> fit_ax_surrogate -> InducingGPNetwork.fit
    )])
    # Generators.BOTORCH_MODULAR with generator_kwargs={"surrogate_spec": spec}
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from gpext.errors import InputTypeError, MissingExtraError, expected_got
from gpext.integrations.botorch.fit_gpext_surrogate import fit_gpext_surrogate
from gpext.integrations.botorch.gwi_surrogate import GWISurrogate
from gpext.integrations.botorch.ign_surrogate import IGNSurrogate
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate

__all__ = ["ax_fit_defaults", "fit_ax_surrogate", "register_ax_fit", "register_ax_fit_if_loaded"]

# the Ax module holding the ``fit_botorch_model`` dispatcher
_AX_FIT_MODULE = "ax.generators.torch.botorch_modular.utils"
_ADAPTER_BASES = (LatentGPSurrogate, SampleEnsembleSurrogate)


def ax_fit_defaults(model: LatentGPSurrogate | SampleEnsembleSurrogate) -> dict[str, Any]:
    """Fit options :func:`fit_ax_surrogate` uses unless ``mll_options`` override them.

    The wrapped models' own fit defaults are made for data sets of hundreds of points; a
    Bayesian-optimisation design has tens.  ``benchmarks/bo.py`` settings:

    * :class:`IGNSurrogate`: ``epochs=100, batch_size=16, lr=1e-2``;
    * :class:`GWISurrogate`: ``epochs=200`` (``GWIModel.fit`` has no default);
    * the other adapters: their models' defaults (``VBootRFF.fit``,
      ``DirichletGPClassifier.fit``; :func:`fit_weight_ensemble` for a
      :class:`WeightEnsembleSurrogate` built from data).

    Args:
        model: A gpext adapter.

    Returns:
        A new dict of keyword arguments for :func:`fit_gpext_surrogate`.
    """
    if isinstance(model, IGNSurrogate):
        return {"epochs": 100, "batch_size": 16, "lr": 1e-2}
    if isinstance(model, GWISurrogate):
        return {"epochs": 200}
    return {}


def fit_ax_surrogate(
    model: LatentGPSurrogate | SampleEnsembleSurrogate,
    mll_class: type | None = None,
    mll_options: dict[str, Any] | None = None,
) -> None:
    r"""Fit a gpext adapter the way Ax's ``fit_botorch_model`` fits a model, in place.

    Ax calls ``fit_botorch_model(model, mll_class=..., mll_options=...)``.  The gpext models
    are not fitted by maximising a GPyTorch marginal likelihood, so ``mll_class`` (which Ax
    fills with ``ExactMarginalLogLikelihood`` by default) is ignored, and ``mll_options`` are
    the keyword arguments of the wrapped model's fit (as Ax passes ``mll_options`` to the NUTS
    fit of its fully Bayesian models): :func:`ax_fit_defaults` updated by ``mll_options``, passed
    to :func:`~gpext.integrations.botorch.fit_gpext_surrogate`.

    Args:
        model: A gpext adapter with training data (built by its ``construct_inputs``).
        mll_class: Ignored (see above).
        mll_options: Fit options, e.g. ``{"epochs": 50, "lr": 1e-2}`` for IGN,
            ``{"method": "pca_ess"}`` for a :class:`WeightEnsembleSurrogate`.

    Raises:
        InputTypeError: If ``model`` is not a gpext adapter or ``mll_options`` not a dict.
        NotFittedError: If the adapter has no training data.
    """
    if not isinstance(model, _ADAPTER_BASES):
        raise InputTypeError(
            expected_got("fit_ax_surrogate(model)", "a gpext BoTorch adapter", type(model).__name__)
        )
    if mll_options is not None and not isinstance(mll_options, dict):
        raise InputTypeError(
            expected_got("fit_ax_surrogate(mll_options)", "a dict or None", type(mll_options))
        )
    fit_gpext_surrogate(model, **{**ax_fit_defaults(model), **(mll_options or {})})


def _register(dispatcher: Any) -> bool:
    added = False
    for cls in _ADAPTER_BASES:
        if dispatcher.funcs.get((cls,)) is not fit_ax_surrogate:
            dispatcher.register(cls)(fit_ax_surrogate)
            added = True
    return added


def register_ax_fit() -> bool:
    """Register :func:`fit_ax_surrogate` with Ax's ``fit_botorch_model`` for every gpext adapter.

    Idempotent.  Not needed in ordinary use: the adapters' ``construct_inputs`` register it
    when Ax is loaded (:func:`register_ax_fit_if_loaded`).

    Returns:
        Whether anything was registered (``False`` when it already was).

    Raises:
        MissingExtraError: If Ax (``ax-platform``) is not installed.
    """
    try:
        module = importlib.import_module(_AX_FIT_MODULE)
    except ImportError as err:
        raise MissingExtraError(
            "gpext.integrations.botorch.register_ax_fit: expected the optional dependency "
            f"'ax-platform', got an ImportError ({err}). Install it with "
            "`pip install gpext[ax]`."
        ) from err
    return _register(module.fit_botorch_model)


def register_ax_fit_if_loaded() -> bool:
    """:func:`register_ax_fit` if Ax's modular BoTorch code is already imported, else nothing.

    Never imports Ax.

    Returns:
        Whether anything was registered.
    """
    module = sys.modules.get(_AX_FIT_MODULE)
    if module is None:
        return False
    return _register(module.fit_botorch_model)

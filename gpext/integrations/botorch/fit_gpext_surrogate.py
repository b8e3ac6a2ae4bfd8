"""Fit helper of the adapters, following the conventions of ``botorch.fit.fit_gpytorch_mll``."""

from __future__ import annotations

import copy
from typing import Any, TypeVar

import torch

from gpext.errors import InputTypeError, NotFittedError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.prior_reversion import attach_prior_reversion
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate
from gpext.integrations.botorch.variance_calibration import cross_validated_variance_scale

__all__ = ["fit_gpext_surrogate"]

SurrogateT = TypeVar("SurrogateT", LatentGPSurrogate, SampleEnsembleSurrogate)


_PRISTINE = "_gpext_unfitted_adapter"


def _unfitted_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of an adapter that has not been fitted by :func:`fit_gpext_surrogate` yet."""
    saved = model.__dict__.pop(_PRISTINE, None)
    try:
        return copy.deepcopy(model)
    finally:
        if saved is not None:
            model.__dict__[_PRISTINE] = saved


def fit_gpext_surrogate(
    model: SurrogateT,
    *,
    calibrate: bool | None = None,
    calibration_folds: int = 5,
    **fit_kwargs: Any,
) -> SurrogateT:
    r"""Fit the gpext model inside an adapter on the adapter's training data.

    Like :func:`botorch.fit.fit_gpytorch_mll`, it takes the object to fit, puts it in train
    mode, fits it in place, puts it back in eval mode and returns it.  The training inputs pass
    through the adapter's input transform in train mode (so ``Normalize`` learns its bounds) and
    the targets are the outcome-transformed ``train_Y`` stored at construction; the wrapped
    model's own ``fit`` does the work, with ``fit_kwargs`` passed on:

    * :class:`IGNSurrogate` -> ``InducingGPNetwork.fit(X, y, **fit_kwargs)`` (``epochs``, ...);
    * :class:`DirichletClassifierSurrogate` -> ``DirichletGPClassifier.fit`` (``max_iter``, ...);
    * :class:`GWISurrogate` -> ``GWIModel.fit(likelihood, X, y, **fit_kwargs)`` (``epochs`` ...);
      built without a model, it is first built by ``GWIRegressionModel.from_data(X, y,
      **from_data)`` from the keyword ``from_data`` (a dict);
    * :class:`VBootSurrogate` -> ``VBootRFF.fit`` / ``VBootMLP.fit``;
    * :class:`WeightEnsembleSurrogate` built from training data (``module=None``, as its
      ``construct_inputs`` does) -> :func:`~gpext.integrations.botorch.fit_weight_ensemble`
      (``method``, ``epochs``, ...), whose ensemble the adapter takes over.

    Weight ensembles built from their members are trained beforehand by
    :func:`~gpext.integrations.botorch.fit_weight_ensemble`.

    Calibration (``calibrate``): a network fitted to a few points interpolates them, and its
    epistemic variance was far too small in Bayesian optimisation (on Hartmann-6 with 20
    points, 2% of held-out values inside IGN's 90% intervals, 2-6% for the weight-subspace
    ensembles).  With calibration the adapter is also refitted on ``calibration_folds - 1``
    folds per fold, and the epistemic variance of the final fit is multiplied by the held-out
    maximum-likelihood factor :math:`\kappa \ge 1`
    (:func:`~gpext.integrations.botorch.cross_validated_variance_scale`; for ensembles the
    members are spread about their mean, for :class:`IGNSurrogate` the kernel's outputscale
    is scaled, which scales its posterior covariance exactly).  It costs ``calibration_folds``
    extra fits.  The default (``None``) calibrates :class:`IGNSurrogate` and a
    :class:`VBootSurrogate` of a ``VBootMLP`` regression ensemble on designs of fewer than
    :data:`~gpext.fit.AUTO_VALIDATION_MIN_POINTS` points and nothing else; a
    :class:`WeightEnsembleSurrogate` built from data is calibrated by
    :func:`~gpext.integrations.botorch.fit_weight_ensemble` itself (``calibrate`` and
    ``calibration_folds`` are passed on when given).  The result is in
    ``model.variance_calibration`` (``None`` without calibration) and the factor in
    ``model.epistemic_scale``.  A calibrated ``VBootMLP`` regression ensemble is also
    combined with its outcome's prior (``model.prior_reversion``, a
    :class:`~gpext.integrations.botorch.PriorReversion`, with :math:`\kappa` chosen for the
    combination: where the particles disagree more than the targets vary, the mean reverts
    to the targets' mean and the spread saturates at theirs).  The folds start from a copy of
    the adapter as it was before its first fit by this function (kept with the adapter,
    outside its modules and state dict), so refitting a fitted adapter never lets a fold
    start from weights that have seen its held-out rows.

    Args:
        model: An adapter built with ``train_X`` and ``train_Y``.
        calibrate: Calibrate the epistemic variance by cross-validation (``None``: the
            default above).
        calibration_folds: Folds of the calibration (at most ``n``).
        **fit_kwargs: Keyword arguments of the wrapped model's ``fit``.

    Returns:
        ``model``, fitted and in eval mode.

    Raises:
        InputTypeError: If ``model`` is not a gpext adapter.
        NotFittedError: If the adapter has no training data, its model cannot be refitted, or
            ``calibrate=True`` for an adapter without variance calibration.

    Example:
        >>> import torch
        >>> from botorch.models.transforms import Normalize
        >>> from gpext.integrations.botorch import IGNSurrogate, fit_gpext_surrogate
        >>> from gpext.models import InducingGPNetwork
        >>> from gpext.nn import MLP
        >>> d = 2
        >>> g = torch.Generator().manual_seed(0)
        >>> X = 10 * torch.rand(20, d, dtype=torch.float64, generator=g)  # not in the unit cube
        >>> Y = X.sin().sum(-1, keepdim=True)
        >>> ign = InducingGPNetwork(MLP(d, [16], 4), num_inducing=8).double()
        >>> model = IGNSurrogate(ign, train_X=X, train_Y=Y, input_transform=Normalize(d))
        >>> model = fit_gpext_surrogate(model, epochs=40, batch_size=32)
        >>> model.variance_calibration.num_folds, model.epistemic_scale >= 1.0  # small design
        (5, True)
    """
    if not isinstance(model, (LatentGPSurrogate, SampleEnsembleSurrogate)):
        raise InputTypeError(
            expected_got(
                "fit_gpext_surrogate(model)",
                "a gpext BoTorch adapter (LatentGPSurrogate or SampleEnsembleSurrogate)",
                type(model).__name__,
            )
        )
    if getattr(model, "train_X", None) is None:
        raise NotFittedError(
            f"fit_gpext_surrogate: {type(model).__name__} has no training data; build it with "
            "train_X and train_Y."
        )
    model.train()
    with torch.no_grad():
        X = model.transform_inputs(model.train_X)
    Y = model.train_Y.detach()
    if getattr(model, "_calibrates_in_fit", False):  # e.g. fit_weight_ensemble calibrates
        if calibrate is not None:
            fit_kwargs = {**fit_kwargs, "calibrate": calibrate,
                          "calibration_folds": calibration_folds}  # fmt: skip
        model._fit_wrapped(X, Y, **fit_kwargs)
        model.eval()
        return model
    if calibrate is None:
        calibrate = model._calibrate_by_default and X.shape[0] < AUTO_VALIDATION_MIN_POINTS
    if calibrate and isinstance(model, LatentGPSurrogate):
        model._set_variance_scale(1.0)  # fails early for adapters without calibration
    model.epistemic_scale = 1.0
    if model._modules.get("prior_reversion") is not None:
        model.prior_reversion = None
    pristine = model.__dict__.get(_PRISTINE)
    calibratable = isinstance(model, SampleEnsembleSurrogate) or (
        type(model)._set_variance_scale is not LatentGPSurrogate._set_variance_scale
    )
    if pristine is None and calibratable:
        # the adapter before its first fit, outside the module tree (no parameters, buffers or
        # state-dict entries of its own); the calibration folds of every later fit start here
        # (adapters that cannot be calibrated, e.g. classifiers and GWI, need no copy)
        pristine = model.__dict__[_PRISTINE] = (_unfitted_copy(model),)
    model._fit_wrapped(X, Y, **fit_kwargs)
    model.variance_calibration = None
    if calibrate:
        template = pristine[0].to(device=X.device, dtype=X.dtype)

        def fit_fold(x: torch.Tensor, y: torch.Tensor) -> SurrogateT:
            fold = template._fold_copy(x.shape[0])
            fold._fit_wrapped(x, y, **fit_kwargs)
            return fold

        reverts = bool(getattr(model, "_reverts_to_prior", False))
        result = cross_validated_variance_scale(
            fit_fold, X, Y, num_folds=calibration_folds, prior_reversion=reverts
        )
        if isinstance(model, LatentGPSurrogate):
            model._set_variance_scale(result.scale)
        else:
            model.epistemic_scale = result.scale
            if reverts:
                attach_prior_reversion(model, Y if result.prior_reversion else None)
        model.variance_calibration = result
    model.eval()
    return model

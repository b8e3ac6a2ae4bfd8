"""Fit helper of the adapters, following the conventions of ``botorch.fit.fit_gpytorch_mll``."""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from gpext.errors import InputTypeError, NotFittedError, expected_got
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate

__all__ = ["fit_gpext_surrogate"]

SurrogateT = TypeVar("SurrogateT", LatentGPSurrogate, SampleEnsembleSurrogate)


def fit_gpext_surrogate(model: SurrogateT, **fit_kwargs: Any) -> SurrogateT:
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

    Args:
        model: An adapter built with ``train_X`` and ``train_Y``.
        **fit_kwargs: Keyword arguments of the wrapped model's ``fit``.

    Returns:
        ``model``, fitted and in eval mode.

    Raises:
        InputTypeError: If ``model`` is not a gpext adapter.
        NotFittedError: If the adapter has no training data, or its model cannot be refitted.

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
        >>> model = fit_gpext_surrogate(model, epochs=100, batch_size=32)
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
    model._fit_wrapped(X, model.train_Y.detach(), **fit_kwargs)
    model.eval()
    return model

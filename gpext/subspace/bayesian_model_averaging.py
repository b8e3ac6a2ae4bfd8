"""Bayesian model averaging over sampled weights: mixture moments, mixture likelihood, probabilities."""

from __future__ import annotations

import copy
import math
import sys
import warnings
from collections.abc import Iterable, Mapping

import torch
from torch import nn

from gpext.errors import BatchNormWarning, ShapeError, expected_got
from gpext.fit import MIN_CHECK_POINTS, HeldoutCheck, check_heldout, minimize_scalar_on_grid
from gpext.subspace.batch_norm import has_batch_norm, refresh_batch_norm
from gpext.subspace.data import _check_reiterable, _inputs_of, _is_loader
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood

__all__ = [
    "check_mixture_heldout",
    "classification_average",
    "predict_weight_samples",
    "regression_mixture_log_likelihood",
    "regression_mixture_moments",
    "select_mixture_variance_scale",
]


def regression_mixture_moments(
    means: torch.Tensor, variances: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Moments of the equally weighted Gaussian mixture :math:`\frac1S\sum_s \mathcal{N}(\mu_s, \sigma^2_s)`.

    .. math::

        \mu = \frac1S \sum_s \mu_s, \qquad
        \sigma^2 = \frac1S \sum_s (\sigma^2_s + \mu_s^2) - \mu^2 .

    Args:
        means: Per-sample predictive means. # shape: (S, N)
        variances: Per-sample predictive variances. # shape: (S, N)

    Returns:
        ``(mean, variance)``. # shapes: (N,), (N,)
    """
    _check_pair(means, variances)
    mean = means.mean(0)
    var = (variances + (means - mean) ** 2).mean(0)
    return mean, var


def regression_mixture_log_likelihood(
    means: torch.Tensor, variances: torch.Tensor, target: torch.Tensor
) -> torch.Tensor:
    r"""Per-point log density of the targets under the mixture.

    .. math::

        \log p(y_n) = \operatorname{logsumexp}_s \log\mathcal{N}(y_n; \mu_{s,n}, \sigma^2_{s,n}) - \log S

    Args:
        means: # shape: (S, N)
        variances: # shape: (S, N)
        target: # shape: (N,)

    Returns:
        Log densities. # shape: (N,)
    """
    _check_pair(means, variances)
    if target.shape != means.shape[-1:]:
        raise ShapeError(
            expected_got(
                "regression_mixture_log_likelihood(target)",
                f"shape ({means.shape[-1]},)",
                tuple(target.shape),
            )
        )
    lp = -0.5 * (math.log(2 * math.pi) + variances.log() + (target - means) ** 2 / variances)
    return torch.logsumexp(lp, 0) - math.log(means.shape[0])


def select_mixture_variance_scale(
    means: torch.Tensor, variances: torch.Tensor, y: torch.Tensor
) -> tuple[float, float]:
    r"""The factor on every sample's predicted variance that maximises the held-out density.

    .. math::

        \hat\kappa = \arg\max_{\kappa > 0} \frac1M \sum_{i=1}^M \log \frac1S
        \sum_{s=1}^S \mathcal N\big(y_i \mid \mu_{s,i}, \kappa\, \sigma^2_{s,i}\big),

    on a grid of :math:`\log\kappa \in [-7, 7]` refined by golden section
    (:func:`gpext.fit.minimize_scalar_on_grid`).  The rows must not have been used to train
    the network (nor to draw the samples).

    Args:
        means: Per-sample predictive means on the held-out rows. # shape: (S, M)
        variances: Per-sample predictive variances (noise included). # shape: (S, M)
        y: The held-out targets. # shape: (M,)

    Returns:
        ``(kappa, mean held-out log density at kappa)``.

    Raises:
        ShapeError: If the shapes disagree.
    """
    _check_pair(means, variances)
    y = y.reshape(-1).to(means)
    if y.shape != means.shape[-1:]:
        raise ShapeError(
            expected_got("select_mixture_variance_scale(y)", f"shape ({means.shape[-1]},)",
                         tuple(y.shape))
        )  # fmt: skip
    means, variances, y = means.double(), variances.double().clamp_min(1e-300), y.double()

    def neg_ll(log_kappa: float) -> float:
        return -float(regression_mixture_log_likelihood(means, variances * math.exp(log_kappa),
                                                        y).mean())  # fmt: skip

    log_kappa, value = minimize_scalar_on_grid(neg_ll, torch.linspace(-7.0, 7.0, 57).tolist())
    return math.exp(log_kappa), -value


def check_mixture_heldout(
    means: torch.Tensor,
    variances: torch.Tensor,
    y: torch.Tensor,
    *,
    variance_scale: float = 1.0,
    cross_fit_variance: bool = False,
    train_mean: float | torch.Tensor | None = None,
    name: str = "Weight-sample model average",
    stacklevel: int = 2,
    reference_nll: float | None = None,
) -> HeldoutCheck:
    r"""The shared held-out check (:func:`gpext.fit.check_heldout`) of an equal mixture.

    The mixture of the samples' Gaussians is moment-matched, mean
    :math:`\bar\mu = \frac1S\sum_s\mu_s` and variance
    :math:`\frac1S\sum_s \kappa\sigma^2_s + \frac1S\sum_s(\mu_s - \bar\mu)^2`, and scored
    on held-out rows: :math:`R^2 \le 0` warns with :class:`~gpext.errors.NoSignalWarning`, a
    coverage of the central 95% interval far below 0.95 with
    :class:`~gpext.errors.OverconfidenceWarning`, variances several times too large with
    :class:`~gpext.errors.UnderconfidenceWarning`.  With ``cross_fit_variance`` the factor
    :math:`\kappa` was (or is to be) chosen on these same rows by
    :func:`select_mixture_variance_scale`, so it is cross-fitted for the check: chosen on the
    even rows for the odd ones and on the odd rows for the even ones (with fewer than
    ``2 * MIN_CHECK_POINTS`` rows, on all of them: the check is then optimistic).

    Args:
        means: Per-sample predictive means on the held-out rows. # shape: (S, M)
        variances: Per-sample predictive variances, before ``variance_scale``. # shape: (S, M)
        y: The held-out targets. # shape: (M,)
        variance_scale: :math:`\kappa` (ignored with ``cross_fit_variance``).
        cross_fit_variance: Cross-fit :math:`\kappa` as above.
        train_mean: The training targets' mean, the :math:`R^2` baseline (default the
            held-out targets' mean).
        name: What was fitted, for the messages.
        stacklevel: Passed on to :func:`warnings.warn` (counted from the caller).
        reference_nll: Held-out NLL per point of a plain exact GP fitted to the same training
            rows (:func:`gpext.fit.reference_heldout_nll`), compared with the mixture's own
            NLL (:func:`regression_mixture_log_likelihood`, at the factor above).

    Returns:
        The :class:`~gpext.fit.HeldoutCheck`.
    """
    _check_pair(means, variances)
    means, variances = means.detach().double(), variances.detach().double()
    y = y.detach().reshape(-1).double().to(means.device)
    m = y.numel()
    kappa = torch.full_like(y, float(variance_scale))
    what = "held-out rows"
    if cross_fit_variance:
        if m >= 2 * MIN_CHECK_POINTS:
            idx = torch.arange(m, device=means.device)
            for part in (idx % 2 == 0, idx % 2 == 1):
                kappa[part] = select_mixture_variance_scale(
                    means[:, ~part], variances[:, ~part], y[~part]
                )[0]
            what += " (variance factor cross-fitted)"
        else:
            kappa.fill_(select_mixture_variance_scale(means, variances, y)[0])
            what += " (variance factor fitted on the same rows)"
    mean = means.mean(0)
    var = (variances * kappa).mean(0) + means.var(0, unbiased=False)
    nll = -float(regression_mixture_log_likelihood(means, variances * kappa, y).mean())
    return check_heldout(
        mean, var, y, train_mean=y.mean() if train_mean is None else train_mean, name=name,
        what=what, stacklevel=stacklevel + 1, reference_nll=reference_nll, nll=nll,
    )  # fmt: skip


def classification_average(probs: torch.Tensor) -> torch.Tensor:
    """Average class probabilities over samples. ``(S, N, C) -> (N, C)``."""
    if probs.dim() != 3:
        raise ShapeError(
            expected_got("classification_average(probs)", "shape (S, N, C)", tuple(probs.shape))
        )
    return probs.mean(0)


def predict_weight_samples(
    module: nn.Module,
    weights: torch.Tensor,
    x: torch.Tensor | Iterable,
    likelihood: OutputLikelihood,
    *,
    bn_inputs: torch.Tensor | Iterable | None = None,
    batch_size: int = 4096,
    buffers: Mapping[str, torch.Tensor] | None = None,
    parameters: ParameterSelection = "all",
) -> dict[str, torch.Tensor]:
    """Predict with every sampled weight vector.

    For a network with batch norm, pass the training inputs as ``bn_inputs``: the statistics
    are recomputed for each sample (on a copy of the module) before predicting. Without them
    (and without ``buffers``) every sample is evaluated with the module's own running
    statistics, those of the last training iterate, which do not belong to the sampled
    weights; a :class:`~gpext.errors.BatchNormWarning` says so.

    ``x`` may be a loader of input batches (tensors, or tuples ``(x_b, ...)`` whose first
    element is taken; :mod:`gpext.subspace.data`): it is read once, every sample is evaluated
    on each batch, and the predictions are concatenated over the batches in the loader's
    order.  ``bn_inputs`` may be a loader too (read once per sample).

    Args:
        module: The network (evaluated in eval mode).
        weights: Sampled flat weights. # shape: (S, D)
        x: Test inputs, or a loader of input batches. # shape: (N, ...)
        likelihood: How to read the outputs.
        bn_inputs: Inputs (or a loader of them) for refreshing batch-norm statistics.
        batch_size: Test points per forward pass (tensor inputs).
        buffers: Buffers (e.g. batch-norm statistics refreshed at the subspace centre) used
            for every sample instead of the module's own; ignored with ``bn_inputs``.
        parameters: Which parameters the weights hold (:class:`FlatParameters`; the others
            keep the module's values), e.g. ``"last_layer"`` for last-layer SWAG samples.

    Returns:
        Regression: ``{"means": (S, N), "variances": (S, N)}``; classification:
        ``{"probs": (S, N, C)}``.

    Raises:
        ShapeError: For weights of the wrong shape, or an empty batch of a loader.
        InputDataError: For an empty loader or non-finite inputs in one.
        InputTypeError: For a loader whose batches hold no tensor.

    Warns:
        BatchNormWarning: For a batch-norm network with neither ``bn_inputs`` nor ``buffers``.
    """
    flat = FlatParameters(module, parameters)
    if weights.dim() != 2 or weights.shape[-1] != flat.num_parameters:
        raise ShapeError(
            expected_got(
                "predict_weight_samples(weights)",
                f"shape (S, {flat.num_parameters})",
                tuple(weights.shape),
            )
        )
    batch_norm = has_batch_norm(module)
    refresh = bn_inputs is not None and batch_norm
    if batch_norm and bn_inputs is None and buffers is None:
        warnings.warn(
            "predict_weight_samples: the network has batch norm but no bn_inputs were given, so "
            "every sample is evaluated with the running statistics of the last training "
            "iterate, not of its own weights. Pass the training inputs as bn_inputs to "
            "recompute them per sample.",
            BatchNormWarning,
            stacklevel=_stacklevel(),
        )
    if refresh:
        buffers = None
    if _is_loader(x):
        out = _predict_loader(module, flat, weights, x, bn_inputs if refresh else None, buffers)
    else:
        out = _predict_tensor(module, flat, weights, x, bn_inputs if refresh else None, buffers,
                              batch_size)  # fmt: skip
    if likelihood.is_regression:
        means, variances = likelihood.mean_variance(out)
        return {"means": means, "variances": variances}
    return {"probs": likelihood.predictive_probs(out)}


def _predict_tensor(module, flat, weights, x, bn_inputs, buffers, batch_size) -> torch.Tensor:
    """Raw outputs of every sample on tensor inputs. # shape: (S, N, ...)"""
    refresh = bn_inputs is not None
    work = copy.deepcopy(module) if refresh else module
    was_training = work.training
    outs = []
    with torch.no_grad():
        for w in weights:
            if refresh:
                flat.assign(w, work)
                refresh_batch_norm(work, bn_inputs)
            work.eval()
            w_flat = FlatParameters(work, flat.names)
            chunks = [
                w_flat.functional_call(w, x[i : i + batch_size], buffers=buffers)
                for i in range(0, x.shape[0], batch_size)
            ]
            outs.append(torch.cat(chunks))
    work.train(was_training)
    return torch.stack(outs)


def _predict_loader(module, flat, weights, loader, bn_inputs, buffers) -> torch.Tensor:
    """Raw outputs of every sample on a loader of inputs, read once. # shape: (S, N, ...)"""
    if bn_inputs is not None:
        if weights.shape[0] > 1:
            _check_reiterable(bn_inputs, "predict_weight_samples(bn_inputs)")
        # statistics per sample first (on a copy), then one pass over the test batches
        work = copy.deepcopy(module)
        per_sample = []
        with torch.no_grad():
            for w in weights:
                flat.assign(w, work)
                refresh_batch_norm(work, bn_inputs)
                per_sample.append({n: b.detach().clone() for n, b in work.named_buffers()})
    else:
        per_sample = [buffers] * weights.shape[0]
    was_training = module.training
    module.eval()
    device = weights.device
    chunks = []
    try:
        with torch.no_grad():
            for xb in _inputs_of(loader, "predict_weight_samples(x)"):
                xb = xb.to(device)
                chunks.append(
                    torch.stack(
                        [
                            flat.functional_call(w, xb, buffers=b)
                            for w, b in zip(weights, per_sample)
                        ]
                    )
                )
    finally:
        module.train(was_training)
    return torch.cat(chunks, dim=1)


def _stacklevel() -> int:
    """Stack level of the first frame outside gpext.subspace (the user's call)."""
    frame, level = sys._getframe(2), 2
    while frame is not None and frame.f_globals.get("__name__", "").startswith("gpext.subspace"):
        frame, level = frame.f_back, level + 1
    return level


def _check_pair(means: torch.Tensor, variances: torch.Tensor) -> None:
    if means.dim() != 2 or variances.shape != means.shape:
        raise ShapeError(
            expected_got(
                "mixture (means, variances)",
                "two (S, N) tensors",
                (tuple(means.shape), tuple(variances.shape)),
            )
        )

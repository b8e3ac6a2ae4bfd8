r"""Held-out tuning of weight-space inference: noise, prior scale, SWAG scale, likelihood.

Every selection maximises the same score, the mean held-out log predictive density of the
Bayesian model average of weight samples :math:`w_1, \dots, w_S`,

.. math::

    \ell(\lambda) = \frac1M \sum_{i=1}^M \log \frac1S \sum_{s=1}^S
        p_\lambda\big(y^{\text{val}}_i \mid f_{w_s(\lambda)}(x^{\text{val}}_i)\big)

(:func:`validation_log_likelihood`), over a hyperparameter :math:`\lambda`, and returns one
:class:`~gpext.fit.temperature.HyperparameterSelection` (laid out like the
:class:`~gpext.fit.TemperatureSelection` of
:meth:`SubspaceModel.select_temperature <gpext.subspace.SubspaceModel.select_temperature>`,
whose grid is :func:`temperature_grid`). The functions take a network and weights, a weight
posterior or a subspace model, not a particular training pipeline, so they apply to any
:class:`~gpext.subspace.WeightPosterior`. The held-out rows must not have been used to train
the network.

* :func:`select_noise_variance`: the noise :math:`\sigma^2` of a constant-noise likelihood
  (one network: the closed form, the mean squared held-out residual).
* :func:`select_swag_scale`: the covariance scale of SWAG / factor analysis / a mixture, with
  common random numbers (one draw, rescaled), optionally after the noise at the mean.
* :func:`select_temperature`: the likelihood temperature of a
  :class:`~gpext.subspace.SubspaceModel` on :func:`temperature_grid`.
* :func:`select_mixture_temperature`: one temperature exponent for an equal-weight mixture of
  subspace posteriors over independent runs, scored on the pooled draws.
* :func:`select_prior_std`: the prior scale :math:`\sigma_p` of a
  :class:`~gpext.subspace.SubspaceModel` (ESS per candidate).
* :func:`select_likelihood`: homoscedastic (learned noise) or heteroscedastic Gaussian
  networks (:func:`regression_network`), one scorer run per candidate.
* :func:`select_by_validation`: the grid argmax the others share, for any scorer.

The selections that need no sampling per candidate (noise, SWAG scale) cost forward passes on
the held-out rows only, and refine the grid by golden-section search
(:func:`gpext.fit.minimize_scalar_on_grid`).

Data loaders: every selection here that evaluates a network on the held-out rows
(:func:`select_noise_variance`, :func:`select_swag_scale`, :func:`select_prior_std`,
:func:`select_temperature`, :func:`select_mixture_temperature`) also takes a loader of ``(x_b, y_b, ...)`` batches (e.g. a
:class:`torch.utils.data.DataLoader`; :mod:`gpext.subspace.data`) as ``x_val`` with
``y_val=None``, and the two that sample a subspace model a loader of training batches as ``x``
with ``y=None``.  The loader is streamed: each pass evaluates every weight sample on one batch
at a time and keeps only the per-sample predictions ``(S, M)`` and the targets, so the
held-out inputs are never held in memory at once, and the scores equal those of the same rows
as tensors up to rounding.  :func:`validation_log_likelihood`, :func:`select_by_validation` and
:func:`select_likelihood` evaluate no network (they score given predictions or call a
user's scorer) and take no loader.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.fit import minimize_scalar_on_grid
from gpext.fit.temperature import HyperparameterSelection
from gpext.nn import MLP, HeteroscedasticMLP
from gpext.subspace.bayesian_model_averaging import (
    predict_weight_samples,
    select_mixture_variance_scale,
)
from gpext.subspace.data import (
    _check_reiterable,
    _is_loader,
    _MappedLoader,
    _reject_loader,
    _Stream,
)
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.multi_swag import MultiSWAG
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.subspace.subspace_model import SubspaceModel
from gpext.subspace.weight_posterior import (
    LowRankGaussianWeightPosterior,
    WeightMixture,
    WeightPosterior,
)
from gpext.utils import check_finite, check_positive_int

__all__ = [
    "LIKELIHOOD_KINDS",
    "TEMPERATURE_EXPONENTS",
    "regression_network",
    "select_by_validation",
    "select_likelihood",
    "select_mixture_temperature",
    "select_noise_variance",
    "select_prior_std",
    "select_swag_scale",
    "select_temperature",
    "temperature_grid",
    "validation_log_likelihood",
]

#: Exponents :math:`e` of the temperature grid :math:`T = (N / r)^e`.
TEMPERATURE_EXPONENTS = (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
#: Regression likelihoods :func:`select_likelihood` chooses between by default.
LIKELIHOOD_KINDS = ("homoscedastic_gaussian", "heteroscedastic_gaussian")


def temperature_grid(
    num_train: int, rank: int, exponents: Sequence[float] = TEMPERATURE_EXPONENTS
) -> list[float]:
    r"""Geometric grid of likelihood temperatures around the drbayes default ``N / rank``.

    .. math::

        T_k = (N / r)^{e_k}

    With the default exponents ``(-1, -0.5, ..., 2.5)`` the grid runs from ``r / N`` through 1
    (the untempered posterior) and the drbayes default ``N / r`` to ``(N / r)^{2.5}`` (which
    reaches drbayes's hand-set concrete value ``T = 1e4``).

    Args:
        num_train: Number of training points ``N``.
        rank: Subspace rank ``r``.
        exponents: The exponents :math:`e_k` (at least one).

    Returns:
        The distinct temperatures, increasing.

    Raises:
        InputDataError: If ``exponents`` is empty or not finite.

    Example:
        >>> temperature_grid(400, 20, (0.0, 0.5, 1.0))
        [1.0, 4.47213595499958, 20.0]
    """
    num_train = check_positive_int(num_train, "temperature_grid.num_train")
    rank = check_positive_int(rank, "temperature_grid.rank")
    exps = [float(e) for e in exponents]
    if not exps or not all(math.isfinite(e) for e in exps):
        raise InputDataError(
            expected_got("temperature_grid.exponents", "one or more finite numbers", exponents)
        )
    return sorted({(num_train / rank) ** e for e in exps})


def validation_log_likelihood(prediction: dict[str, torch.Tensor], y_val: torch.Tensor) -> float:
    r"""Mean held-out log predictive density of per-sample predictions.

    Regression (``{"means", "variances"}`` of shape ``(S, M)``): the equally weighted Gaussian
    mixture, :math:`\frac1M\sum_i \log \frac1S \sum_s \mathcal N(y_i; \mu_{s,i},
    \sigma^2_{s,i})`; classification (``{"probs"}`` of shape ``(S, M, C)``):
    :math:`\frac1M\sum_i \log \frac1S \sum_s p_{s,i,y_i}`.

    No data loader here: the function evaluates no network, it scores predictions already
    made (:func:`~gpext.subspace.predict_weight_samples` and
    :meth:`SubspaceModel.predict <gpext.subspace.SubspaceModel.predict>` take loaders of
    inputs); pass the held-out targets as one tensor, in the order of the predictions.

    Args:
        prediction: What :func:`~gpext.subspace.predict_weight_samples` or
            :meth:`SubspaceModel.predict <gpext.subspace.SubspaceModel.predict>` returns.
        y_val: Held-out targets (class indices for classification). # shape: (M,)

    Returns:
        The score (``-inf`` where it is not finite).

    Raises:
        InputDataError: For a dictionary with neither ``"means"`` nor ``"probs"``.
        ShapeError: If the targets do not match.

    Example:
        >>> pred = {"means": torch.zeros(1, 3), "variances": torch.ones(1, 3)}
        >>> round(validation_log_likelihood(pred, torch.zeros(3)), 4)
        -0.9189
    """
    if "means" in prediction:
        means, variances = prediction["means"], prediction["variances"]
        if means.dim() != 2 or y_val.shape != means.shape[-1:]:
            raise ShapeError(
                expected_got("validation_log_likelihood(y_val)",
                             f"shape ({means.shape[-1]},) for means {tuple(means.shape)}",
                             tuple(y_val.shape))
            )  # fmt: skip
        value = float(_mixture_ll(means, variances, y_val.to(means)))
    elif "probs" in prediction:
        probs = prediction["probs"]
        if probs.dim() != 3 or y_val.shape != probs.shape[1:2]:
            raise ShapeError(
                expected_got("validation_log_likelihood(y_val)", f"shape ({probs.shape[1]},)",
                             tuple(y_val.shape))
            )  # fmt: skip
        p = probs.mean(0).gather(-1, y_val.long().view(-1, 1))
        value = float(p.clamp_min(1e-300).log().double().mean())
    else:
        raise InputDataError(
            expected_got("validation_log_likelihood(prediction)",
                         "a dict with 'means' and 'variances', or 'probs'", sorted(prediction))
        )  # fmt: skip
    return value if math.isfinite(value) else -math.inf


def _mixture_ll(means: torch.Tensor, variances: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean log density of ``y`` under the equal mixture (float64). # returns a scalar"""
    m, v, y = means.double(), variances.double(), y.double()
    lp = -0.5 * (math.log(2 * math.pi) + v.log() + (y - m) ** 2 / v)
    return (torch.logsumexp(lp, 0) - math.log(m.shape[0])).mean()


def select_by_validation(
    score: Callable[[Any], float | tuple[float, Any]],
    candidates: Sequence[Any],
    *,
    parameter: str = "",
) -> HyperparameterSelection:
    r"""Evaluate ``score`` at every candidate and keep the best: :math:`\arg\max_k \ell(\lambda_k)`.

    ``score(value)`` returns the held-out score, or ``(score, samples)`` to keep the samples
    drawn at the value. Non-finite scores count as :math:`-\infty`; ties go to the earlier
    candidate.  The function reads no data itself, so it takes no loader: the scorer reads the
    held-out rows in whatever form it likes (e.g. a loader passed to
    :func:`select_noise_variance` or :meth:`SubspaceModel.predict
    <gpext.subspace.SubspaceModel.predict>`).

    Args:
        score: The scorer (e.g. ESS at a prior scale, then :func:`validation_log_likelihood`).
        candidates: The values to try (at least one).
        parameter: Name stored in the result.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection`.

    Raises:
        InputDataError: Without candidates, or if every score is :math:`-\infty`.

    Example:
        >>> select_by_validation(lambda v: -(v - 2) ** 2, [1, 2, 3]).value
        2
    """
    candidates = list(candidates)
    if not candidates:
        raise InputDataError(
            expected_got("select_by_validation.candidates", "one or more values", candidates)
        )
    scores: dict[Any, float] = {}
    best = None
    for value in candidates:
        out = score(value)
        s, samples = out if isinstance(out, tuple) else (out, None)
        s = float(s)
        s = s if math.isfinite(s) else -math.inf
        scores[value] = s
        if best is None or s > best[1]:
            best = (value, s, samples)
    if best[1] == -math.inf:
        raise InputDataError(
            f"select_by_validation ({parameter or 'hyperparameter'}): every candidate gave a "
            f"non-finite held-out log-likelihood ({scores}); check the held-out data and the "
            "likelihood."
        )
    return HyperparameterSelection(best[0], best[2], scores, parameter)


def _is_validation_loader(
    x_val: object, y_val: object, where: str, *, reiterable: bool = True
) -> bool:
    """Whether ``x_val`` is a loader of ``(x_b, y_b)`` batches (``y_val`` must then be ``None``).

    Raises:
        InputDataError: For ``y_val`` given with a loader.
        InputTypeError: For a loader as ``y_val``, or a one-shot iterator where the loader is
            read more than once (``reiterable``).
    """
    if _is_loader(x_val):
        if y_val is not None:
            raise InputDataError(
                expected_got(f"{where}(y_val)", "None when x_val is a loader of (x, y) batches",
                             type(y_val).__name__, "Drop it: the loader yields the targets.")
            )  # fmt: skip
        if reiterable:
            _check_reiterable(x_val, f"{where}(x_val)")
        return True
    _reject_loader(y_val, f"{where}(y_val)", "Pass the targets as a tensor, or a loader of "
                   "(x, y) batches as x_val and y_val=None.")  # fmt: skip
    return False


def _predict_validation(
    predict: Callable[[Iterable], dict[str, torch.Tensor]],
    loader: Iterable,
    where: str,
    device: torch.device,
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``predict`` over a loader of ``(x_b, y_b)`` batches, with the targets of its (last) pass.

    ``predict`` gets a loader of checked ``(x_b, y_b)`` batches (e.g.
    :func:`predict_weight_samples`, which takes the first element of each batch).

    Returns:
        The predictions (concatenated over the batches, in the loader's order) and the
        targets in the same order. # shapes: (S, M, ...), (M,)
    """
    view = _KeptTargets(loader, lambda xb, yb: view.keep(xb, yb, device), f"{where}(x_val)")
    pred = predict(view)
    return pred, torch.cat(view.kept)


class _KeptTargets(_MappedLoader):
    """A loader of checked ``(x_b, y_b)`` batches that keeps the targets of its latest pass."""

    def __init__(self, loader: Iterable, fn: Callable, name: str) -> None:
        super().__init__(loader, fn, name, targets=True)
        self.kept: list[torch.Tensor] = []

    def keep(
        self, xb: torch.Tensor, yb: torch.Tensor, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.kept.append(yb.to(device))
        return xb, yb

    def __iter__(self):
        self.kept = []
        return super().__iter__()


def _model_data(
    model: SubspaceModel, x: object, y: object, where: str, x_name: str = "x", y_name: str = "y"
) -> tuple[torch.Tensor | _Stream, torch.Tensor | None]:
    """Tensors checked by :func:`_check_rows`, or a checked stream of a loader (``y`` ``None``)."""
    if isinstance(x, _Stream) or _is_loader(x):
        return model._data(x, y, x_name, y_name, what=where), None
    _reject_loader(y, f"{where}({y_name})", f"Pass the targets as a tensor, or a loader of "
                   f"(x, y) batches as {x_name} and {y_name}=None.")  # fmt: skip
    _check_rows(x, y, where)
    return x, y


def _check_rows(x_val: torch.Tensor, y_val: torch.Tensor, where: str) -> None:
    if x_val.shape[0] != y_val.shape[0] or x_val.shape[0] == 0:
        raise ShapeError(
            expected_got(f"{where}(x_val, y_val)", "equal, non-zero numbers of rows",
                         (tuple(x_val.shape), tuple(y_val.shape)))
        )  # fmt: skip
    check_finite(x_val, f"{where}(x_val)")
    check_finite(y_val, f"{where}(y_val)")


def _check_constant_noise(likelihood: OutputLikelihood, where: str) -> None:
    if not isinstance(likelihood, OutputLikelihood):
        raise InputTypeError(
            expected_got(f"{where}.likelihood", "an OutputLikelihood", type(likelihood).__name__)
        )
    if likelihood.kind not in ("gaussian", "homoscedastic_gaussian"):
        raise InputDataError(
            expected_got(f"{where}.likelihood",
                         "a 'gaussian' or 'homoscedastic_gaussian' OutputLikelihood",
                         likelihood.kind,
                         "A heteroscedastic network predicts its own noise; scale it with "
                         "SubspaceModel.calibrate_variance instead.")
        )  # fmt: skip


def _best_noise(means: torch.Tensor, y: torch.Tensor, floor: float) -> tuple[float, float]:
    """``(sigma^2, mean log density)`` maximising the mixture likelihood of shared noise."""
    m, y = means.double(), y.double()
    msr = ((y - m) ** 2).mean(-1)  # per-sample mean squared residual, shape: (S,)
    if m.shape[0] == 1:  # one network: the closed form
        var = max(float(msr[0]), floor, 1e-300)
        return var, float(_mixture_ll(m, torch.full_like(m, var), y))
    centre = math.log(max(float(msr.mean()), floor, 1e-300))

    def neg_ll(log_var: float) -> float:
        var = max(math.exp(log_var), floor)
        return -float(_mixture_ll(m, torch.full_like(m, var), y))

    grid = [centre + 0.5 * k for k in range(-16, 3)]
    log_var, value = minimize_scalar_on_grid(neg_ll, grid, iterations=30)
    return max(math.exp(log_var), floor), -value


@torch.no_grad()
def select_noise_variance(
    module: nn.Module,
    weights: torch.Tensor,
    x_val: torch.Tensor | Iterable,
    y_val: torch.Tensor | None,
    likelihood: OutputLikelihood,
    *,
    buffers: dict[str, torch.Tensor] | None = None,
    parameters: ParameterSelection = "all",
) -> HyperparameterSelection:
    r"""Choose the noise variance of a constant-noise Gaussian likelihood on held-out rows.

    With the sampled networks' held-out means :math:`\mu_{s,i}` (the noise does not change
    them),

    .. math::

        \hat\sigma^2 = \arg\max_{\sigma^2 \ge \sigma^2_{\min}} \frac1M \sum_{i=1}^M
            \log \frac1S \sum_{s=1}^S \mathcal N(y_i; \mu_{s,i}, \sigma^2),

    which for one network (``S = 1``) is the closed form :math:`\frac1M\sum_i (y_i -
    \mu_{1,i})^2`; for ``S > 1`` a grid over :math:`\log\sigma^2` (steps of 0.5 from 8 below to
    1 above the log of the mean squared residual) refined by golden-section search. The result
    is stored in ``likelihood.noise_variance``.  With a target transform (the likelihood of a
    network trained with ``standardize=True``) means, targets and :math:`\hat\sigma^2` are in
    standardised units, as ``noise_variance`` and ``min_variance`` are, and the score in the
    targets' units.

    ``x_val`` may be a loader of ``(x_b, y_b)`` batches with ``y_val=None``: it is read once
    (a one-shot iterator will do), every sample evaluated on each batch, and only the held-out
    means ``(S, M)`` and targets are kept; the result equals that of the same rows as tensors
    up to rounding.

    Args:
        module: The network.
        weights: Flat weight samples (the SWA mean as ``w[None]``, SWAG draws,
            ``SubspaceModel.weights(thetas)``). # shape: (S, D)
        x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (M, ...)
        y_val: Held-out targets (``None`` with a loader). # shape: (M,)
        likelihood: A ``"gaussian"`` or ``"homoscedastic_gaussian"`` likelihood (updated).
        buffers: Buffers for every sample (batch-norm statistics), as in
            :func:`~gpext.subspace.predict_weight_samples`.
        parameters: Which parameters the weights hold (e.g. ``"last_layer"``), as in
            :func:`~gpext.subspace.predict_weight_samples`.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection`: ``value`` is
        :math:`\hat\sigma^2`, ``scores`` its held-out score, ``samples`` ``None``.

    Raises:
        InputDataError: For another likelihood kind or non-finite data; with a loader:
            ``y_val`` given or an empty loader.
        InputTypeError: If ``likelihood`` is not an :class:`~gpext.subspace.OutputLikelihood`,
            for a loader as ``y_val``, or batches that are not ``(x, y)`` pairs of tensors.
        ShapeError: If the held-out inputs and targets disagree, or ``weights`` is not 2-D.
    """
    where = "select_noise_variance"
    _check_constant_noise(likelihood, where)
    loader = _is_validation_loader(x_val, y_val, where, reiterable=False)
    if not loader:
        _check_rows(x_val, y_val, where)
    if weights.dim() != 2:
        raise ShapeError(
            expected_got("select_noise_variance(weights)", "shape (S, D)", tuple(weights.shape))
        )

    def predict(x: torch.Tensor | Iterable) -> dict[str, torch.Tensor]:
        return predict_weight_samples(module, weights, x, likelihood, buffers=buffers,
                                      parameters=parameters)  # fmt: skip

    if loader:
        pred, y_val = _predict_validation(predict, x_val, where, weights.device)
    else:
        pred = predict(x_val)
    return _noise_selection(pred["means"], y_val, likelihood, where)


def _noise_selection(
    means: torch.Tensor, y_val: torch.Tensor, likelihood: OutputLikelihood, where: str
) -> HyperparameterSelection:
    """The noise of :func:`_best_noise` for held-out means ``(S, M)``, stored in the likelihood."""
    if y_val.shape != means.shape[-1:]:
        raise ShapeError(
            expected_got(f"{where}(y_val)", f"shape ({means.shape[-1]},), one target per row",
                         tuple(y_val.shape))
        )  # fmt: skip
    # in standardised units, as the likelihood's noise and floor; the score in the targets'
    y_val = y_val.to(means)
    var, score = _best_noise(likelihood.transform_targets(means),
                             likelihood.transform_targets(y_val), likelihood.min_variance)  # fmt: skip
    if likelihood.has_target_transform:
        score -= math.log(likelihood.target_scale)
    likelihood.noise_variance = var
    return HyperparameterSelection(var, None, {var: score}, "noise_variance")


def _unit_draws(
    posterior: WeightPosterior, num_samples: int, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(anchors, draws)``: each draw's component mean and the draw at scale 1."""
    try:
        draws = posterior.sample(num_samples, scale=1.0, generator=generator)
        zero_gen = torch.Generator(device="cpu").manual_seed(0)
        anchors = posterior.sample(num_samples, scale=0.0, generator=zero_gen)
    except TypeError as err:
        raise InputTypeError(
            expected_got("select_swag_scale.posterior",
                         "a weight posterior whose sample() takes scale= (SWAG, "
                         "OnlineFactorAnalysis, MultiSWAG, WeightMixture)",
                         type(posterior).__name__)
        ) from err  # fmt: skip
    return anchors.to(draws), draws


def _own_networks(posterior: WeightPosterior, parameters: ParameterSelection) -> bool:
    """Whether ``posterior`` is a MultiSWAG that evaluates its draws on its own networks.

    Raises:
        InputDataError: If ``parameters`` names other parameters than the MultiSWAG's.
    """
    names = posterior.parameter_names if isinstance(posterior, MultiSWAG) else None
    if names is None:
        return False
    if not (isinstance(parameters, str) and parameters == "all"):
        chosen = FlatParameters(posterior.modules_per_component[0], parameters).names
        if chosen != names:
            raise InputDataError(
                expected_got("select_swag_scale.parameters", f"the MultiSWAG's selection {names}",
                             chosen, "Leave parameters at its default for a MultiSWAG built "
                             "with modules=.")
            )  # fmt: skip
    return True


def _set_scale(posterior: WeightPosterior, scale: float) -> None:
    if isinstance(posterior, LowRankGaussianWeightPosterior):
        posterior.scale = scale
    elif isinstance(posterior, WeightMixture):
        for c in posterior.components:
            _set_scale(c, scale)


@torch.no_grad()
def select_swag_scale(
    module: nn.Module,
    posterior: WeightPosterior,
    x_val: torch.Tensor | Iterable,
    y_val: torch.Tensor | None,
    likelihood: OutputLikelihood,
    *,
    num_samples: int = 30,
    max_scale: float = 4.0,
    tune_noise: bool | None = None,
    generator: torch.Generator | None = None,
    parameters: ParameterSelection = "all",
    bn_inputs: torch.Tensor | Iterable | None = None,
    buffers: Mapping[str, torch.Tensor] | None = None,
) -> HyperparameterSelection:
    r"""Choose the covariance scale :math:`s` of a Gaussian weight posterior on held-out rows.

    One draw per sample at scale 1, :math:`w^{(1)}_j = m_j + L z_j` (:math:`m_j` the mean of the
    component it came from), is rescaled for every candidate (common random numbers, so the
    score is a smooth function of :math:`s`):

    .. math::

        w_j(s) = m_j + \sqrt{s}\,\big(w^{(1)}_j - m_j\big), \qquad
        \hat s = \arg\max_{0 \le s \le s_{\max}} \ell(s)

    with :math:`\ell` the mean held-out log predictive density of the model average of
    :math:`w_1(s), \dots, w_S(s)`; the search runs over :math:`\sqrt s` on a grid of 9 points
    from 0 (the posterior mean alone: SWA) to :math:`\sqrt{s_{\max}}`, refined by
    golden-section search. With ``tune_noise`` the noise variance of a constant-noise
    likelihood is chosen first, at the posterior mean(s) (:func:`select_noise_variance` of the
    draws at :math:`s = 0`: for SWAG the closed form, the mean squared held-out residual of the
    SWA mean), stored in ``likelihood.noise_variance``, and the scale is then chosen at that
    noise. A joint maximisation over :math:`(s, \sigma^2)` has a degenerate valley on a small
    hold-out (a wide spread with almost no noise): on energy, split 0 (69 held-out rows,
    ``fit_weight_ensemble`` defaults), it chose :math:`\sigma^2 = 5 \cdot 10^{-5}` for one of
    three seeds (0.9-1.9 :math:`\cdot 10^{-3}` for the others) and the test coverage of the
    95% interval fell to 0.86. The chosen scale is stored as the posterior's
    default ``scale`` (every component of a mixture). SWAG's customary 0.5 was never validated;
    on energy and yacht it is too wide.

    ``x_val`` may be a re-iterable loader of ``(x_b, y_b)`` batches with ``y_val=None``: every
    candidate scale (and the noise, with ``tune_noise``) is one streamed pass over it (each
    draw evaluated batch by batch, only the predictions ``(S, M)`` kept); the scores equal
    those of the same rows as tensors up to rounding.

    Args:
        module: The network the weights belong to.
        posterior: :class:`~gpext.subspace.SWAG`, :class:`~gpext.subspace.OnlineFactorAnalysis`,
            :class:`~gpext.subspace.MultiSWAG` or another :class:`~gpext.subspace.WeightMixture`
            whose ``sample`` takes ``scale``.  A :class:`~gpext.subspace.MultiSWAG` built with
            ``modules`` (:meth:`~gpext.subspace.MultiSWAG.from_trajectories`) evaluates every
            component's draws on its own network (:meth:`MultiSWAG.predict
            <gpext.subspace.MultiSWAG.predict>`), over its own parameter selection; ``module``
            is then not used.
        x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (M, ...)
        y_val: Held-out targets (``None`` with a loader). # shape: (M,)
        likelihood: How to read the output.
        num_samples: Draws ``S``.
        max_scale: Largest scale :math:`s_{\max}`.
        tune_noise: Tune the noise first (default: for a ``"homoscedastic_gaussian"``
            likelihood).
        generator: Random generator of the draws.
        parameters: Which parameters the posterior covers (e.g. ``"last_layer"`` for a SWAG
            built from a last-layer :class:`~gpext.subspace.TrajectoryCollector`); for a
            MultiSWAG with ``modules`` its own selection (leave the default, or name the same
            parameters).
        bn_inputs: For a network with batch norm, training inputs (or a loader of them) on
            which every draw's statistics are recomputed before it is scored
            (:func:`~gpext.subspace.predict_weight_samples`; one pass per draw and candidate
            scale, so a subset of the training rows keeps it affordable).
        buffers: Buffers used for every draw instead of the module's own (e.g. the network's
            statistics for a posterior over the last layer only); ignored with ``bn_inputs``.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection`: ``value`` :math:`\hat s`,
        ``samples`` the weights at :math:`\hat s` ``(S, D)``, ``scores`` per scale tried.

    Raises:
        InputDataError: For ``max_scale <= 0``, non-finite data, or ``tune_noise`` with a
            likelihood without one constant noise; with a loader: ``y_val`` given or an empty
            loader.
        InputTypeError: For a posterior whose ``sample`` takes no ``scale``; a loader as
            ``y_val``, a one-shot iterator as ``x_val``, or batches that are not ``(x, y)``
            pairs of tensors.
        ShapeError: If the held-out inputs and targets disagree.

    Example:
        >>> sel = select_swag_scale(net, swag, x_val, y_val, lik)  # doctest: +SKIP
        >>> swag.scale == sel.value                                  # doctest: +SKIP
        True
    """
    if not isinstance(posterior, WeightPosterior):
        raise InputTypeError(
            expected_got("select_swag_scale.posterior", "a gpext.subspace.WeightPosterior",
                         type(posterior).__name__)
        )  # fmt: skip
    loader = _is_validation_loader(x_val, y_val, "select_swag_scale")
    if not loader:
        _check_rows(x_val, y_val, "select_swag_scale")
    if not (isinstance(max_scale, (int, float)) and math.isfinite(max_scale) and max_scale > 0):
        raise InputDataError(expected_got("select_swag_scale.max_scale", "a number > 0", max_scale))
    num_samples = check_positive_int(num_samples, "select_swag_scale.num_samples")
    if tune_noise is None:
        tune_noise = likelihood.learns_noise
    if tune_noise:
        _check_constant_noise(likelihood, "select_swag_scale")
    own_networks = _own_networks(posterior, parameters)
    anchors, draws = _unit_draws(posterior, num_samples, generator)
    scores: dict[float, float] = {}
    details = None

    def predict(w: torch.Tensor, refresh: bool = True) -> tuple[dict[str, torch.Tensor], Any]:
        kwargs = {"bn_inputs": bn_inputs if refresh else None, "buffers": buffers}

        def run(x: torch.Tensor | Iterable) -> dict[str, torch.Tensor]:
            if own_networks:
                return posterior.predict(w, x, likelihood, **kwargs)
            return predict_weight_samples(module, w, x, likelihood, parameters=parameters,
                                          **kwargs)  # fmt: skip

        if loader:
            return _predict_validation(run, x_val, "select_swag_scale", w.device)
        return run(x_val), y_val

    if tune_noise:
        if own_networks:
            # as select_noise_variance (buffers, no refresh), each draw on its own network
            _check_constant_noise(likelihood, "select_noise_variance")
            pred, y = predict(anchors, refresh=False)
            noise = _noise_selection(pred["means"], y, likelihood, "select_noise_variance")
        else:
            noise = select_noise_variance(module, anchors, x_val, y_val, likelihood,
                                          parameters=parameters, buffers=buffers)  # fmt: skip
        details = {"noise_variance": noise.value}

    def neg_score(root: float) -> float:
        s = min(root * root, float(max_scale))
        w = anchors + math.sqrt(s) * (draws - anchors)
        pred, y = predict(w)
        value = validation_log_likelihood(pred, y)
        value = value if math.isfinite(value) else -math.inf
        scores[s] = value
        return -value

    top = math.sqrt(max_scale)
    grid = [top * k / 8 for k in range(9)]
    root, value = minimize_scalar_on_grid(neg_score, grid, iterations=12)
    if not math.isfinite(value):
        raise InputDataError(
            f"select_swag_scale: every scale gave a non-finite held-out log-likelihood "
            f"({scores}); check the held-out data and the likelihood."
        )
    scale = min(root * root, float(max_scale))
    _set_scale(posterior, scale)
    samples = anchors + math.sqrt(scale) * (draws - anchors)
    return HyperparameterSelection(scale, samples, dict(sorted(scores.items())), "swag_scale",
                                   details)  # fmt: skip


def select_prior_std(
    model: SubspaceModel,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    x_val: torch.Tensor | Iterable,
    y_val: torch.Tensor | None,
    prior_stds: Sequence[float] = (0.25, 0.5, 1.0, 2.0, 4.0),
    *,
    num_samples: int = 30,
    burn_in: int = 30,
    generator: torch.Generator | None = None,
) -> HyperparameterSelection:
    r"""Choose the prior scale :math:`\sigma_p` of a subspace model on held-out rows.

    For every candidate, ``num_samples`` elliptical slice samples of the tempered posterior
    :math:`p(\theta \mid \mathcal D) \propto p(\mathcal D \mid \theta)^{1/T}
    \mathcal N(\theta; 0, \sigma_p^2 I)` (at the model's temperature) are drawn on ``(x, y)``
    and scored by :func:`validation_log_likelihood` of their model average; the best
    :math:`\sigma_p` is stored in ``model.prior_std``. Choose the temperature first
    (:meth:`SubspaceModel.select_temperature <gpext.subspace.SubspaceModel.select_temperature>`)
    or after: the two act alike on a well-determined subspace (a larger :math:`\sigma_p` and a
    larger :math:`T` both widen it), so one of them is usually enough.

    Either pair may be a re-iterable loader of ``(x_b, y_b)`` batches in place of the tensors
    (``y`` or ``y_val`` then ``None``), checked once as :class:`~gpext.subspace.SubspaceModel`
    checks loaders: ESS streams the training log-likelihood
    (:meth:`SubspaceModel.sample_ess <gpext.subspace.SubspaceModel.sample_ess>`), and every
    candidate's held-out predictions are gathered batch by batch (one pass per candidate); a
    held-out loader gives the scores of the same rows as tensors up to rounding.

    Args:
        model: The :class:`~gpext.subspace.SubspaceModel`.
        x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Training targets (``None`` with a loader). # shape: (N,)
        x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (M, ...)
        y_val: Held-out targets (``None`` with a loader). # shape: (M,)
        prior_stds: Candidates (positive).
        num_samples: ESS samples per candidate.
        burn_in: ESS burn-in per candidate.
        generator: Random generator.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection`: ``value`` :math:`\sigma_p`,
        ``samples`` its ESS samples ``(S, r)``.

    Raises:
        InputTypeError: If ``model`` is not a :class:`~gpext.subspace.SubspaceModel`; a loader
            as ``y`` or ``y_val``, a one-shot iterator, or batches that are not ``(x, y)``
            pairs of tensors.
        InputDataError: For non-positive candidates or non-finite data; ``y`` or ``y_val``
            given with a loader, or an empty loader.
        ShapeError: If inputs and targets disagree.
    """
    if not isinstance(model, SubspaceModel):
        raise InputTypeError(
            expected_got("select_prior_std.model", "a SubspaceModel", type(model).__name__)
        )
    x, y = _model_data(model, x, y, "select_prior_std")
    x_val, y_val = _model_data(model, x_val, y_val, "select_prior_std", "x_val", "y_val")
    stds = [float(s) for s in prior_stds]
    if not stds or not all(math.isfinite(s) and s > 0 for s in stds):
        raise InputDataError(
            expected_got("select_prior_std.prior_stds", "one or more positive numbers", prior_stds)
        )
    original = model.prior_std

    def score(std: float) -> tuple[float, torch.Tensor]:
        model.prior_std = std
        thetas = model.sample_ess(x, y, num_samples, burn_in=burn_in, generator=generator)
        with torch.no_grad():
            if isinstance(x_val, _Stream):
                pred, targets = model._predict_data(x_val, None, thetas)
            else:
                pred, targets = model.predict(x_val, thetas), y_val
            return validation_log_likelihood(pred, targets), thetas

    try:
        sel = select_by_validation(score, stds, parameter="prior_std")
    except InputDataError:
        model.prior_std = original
        raise
    model.prior_std = sel.value
    return sel


def select_temperature(
    model: SubspaceModel,
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    x_val: torch.Tensor | Iterable,
    y_val: torch.Tensor | None,
    exponents: Sequence[float] = TEMPERATURE_EXPONENTS,
    **kwargs: Any,
) -> HyperparameterSelection:
    r"""Choose a subspace model's temperature on the grid :math:`T_k = (N / r)^{e_k}` on held-out rows.

    :meth:`SubspaceModel.select_temperature <gpext.subspace.SubspaceModel.select_temperature>`
    over :func:`temperature_grid` (by default the benchmark's exponents, -1 to 2.5), returned
    as a :class:`~gpext.fit.temperature.HyperparameterSelection` like the other selections
    here (``details``: the calibrated ``variance_scale``).

    Either pair may be a re-iterable loader of ``(x_b, y_b)`` batches in place of the tensors
    (``y`` or ``y_val`` then ``None``), as the method takes them: a training loader is checked
    in one pass that also counts :math:`N` for the grid, then streamed; held-out predictions
    are gathered batch by batch, with the scores of the same rows as tensors up to rounding.

    Args:
        model: The :class:`~gpext.subspace.SubspaceModel`.
        x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Training targets (``None`` with a loader). # shape: (N,)
        x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (M, ...)
        y_val: Held-out targets (``None`` with a loader). # shape: (M,)
        exponents: The exponents :math:`e_k`.
        **kwargs: Passed on (``num_samples``, ``burn_in``, ``calibrate_variance``,
            ``method``, ``generator``).

    Returns:
        The selection: ``value`` :math:`T` (also ``model.temperature``), ``samples`` its
        samples ``(S, r)``, ``scores`` per :math:`T`.

    Raises:
        InputTypeError: If ``model`` is not a :class:`~gpext.subspace.SubspaceModel`, or for
            bad loaders (see the method).
        InputDataError: For bad exponents or data (see the method).
    """
    if not isinstance(model, SubspaceModel):
        raise InputTypeError(
            expected_got("select_temperature.model", "a SubspaceModel", type(model).__name__)
        )
    x, y = _model_data(model, x, y, "select_temperature")
    num_rows = x.num_rows if isinstance(x, _Stream) else x.shape[0]
    temps = temperature_grid(num_rows, model.rank, exponents)
    sel = model.select_temperature(x, y, x_val, y_val, temps, **kwargs)
    details = {"variance_scale": model.variance_scale}
    return HyperparameterSelection(sel.temperature, sel.samples, sel.scores, "temperature", details)


def select_mixture_temperature(
    models: Sequence[SubspaceModel],
    x: torch.Tensor | Iterable,
    y: torch.Tensor | None,
    x_val: torch.Tensor | Iterable,
    y_val: torch.Tensor | None,
    exponents: Sequence[float] = TEMPERATURE_EXPONENTS,
    *,
    num_samples: int = 32,
    burn_in: int = 32,
    thin: int = 1,
    calibrate_variance: bool | None = None,
    method: str = "ess",
    vi_steps: int = 1000,
    generator: torch.Generator | None = None,
) -> HyperparameterSelection:
    r"""Choose one temperature exponent for an equal-weight mixture of subspace posteriors.

    Model averaging over :math:`K` independent SGD runs (MultiSWAG's construction with a
    subspace posterior per run) mixes posteriors whose spread was each tempered for one run;
    the mixture adds the spread between the runs' modes, so a temperature chosen per run
    (:func:`select_temperature`) makes the mixture too wide where the runs disagree. Here the
    exponent :math:`e` of :math:`T_k = (N / r_k)^{e}` is chosen for the mixture itself: for
    each :math:`e`, every model draws ``num_samples`` samples of its tempered posterior on
    ``(x, y)`` (ESS, or the mean-field ``q`` of :meth:`SubspaceModel.fit_vi
    <gpext.subspace.SubspaceModel.fit_vi>`), and the score is the held-out log density of the
    pooled draws,

    .. math::

        \ell(e) = \frac1M \sum_{i=1}^M \log \frac1{K S} \sum_{k=1}^K \sum_{s=1}^S
            p\big(y^{\text{val}}_i \mid x^{\text{val}}_i, \theta_{ks}; T_k(e)\big)

    (:func:`validation_log_likelihood`). For regression, as
    :meth:`SubspaceModel.select_temperature <gpext.subspace.SubspaceModel.select_temperature>`
    does by default, every candidate is scored at its own variance scale :math:`\kappa_e`, the
    factor on all the pooled draws' predicted variances that maximises :math:`\ell(e)` (a
    grid of :math:`\log\kappa \in [-7, 7]` refined by golden section), since tempering the
    weights does not correct a noise that the networks learned too small or too large.  Every
    model's ``temperature`` is set to its :math:`T_k` at the best :math:`e` and its
    ``variance_scale`` to that :math:`\kappa` (for ``method="vi"`` its ``variational`` is the
    ``q`` fitted there), and each is checked with :meth:`SubspaceModel.check_fit
    <gpext.subspace.SubspaceModel.check_fit>`.  The runs must have been trained on ``(x, y)`` only, not
    on the held-out rows; train the runs you will use on all rows afterwards with the same
    recipe and seeds and reuse the exponent with the full :math:`N`.

    Either pair may be a re-iterable loader of ``(x_b, y_b)`` batches in place of the tensors
    (``y`` or ``y_val`` then ``None``), as for :func:`select_temperature`.

    Measured (``benchmarks/subspace_uci.py``, the ``multi_*_mix_t`` arms: three SGD runs of a
    1 x 50 network, 20 splits, 10% of the training rows held out): against each run's own
    temperature, the mixture's temperature and variance scale brought yacht's 95% coverage
    from 0.98-1.00 to 0.93-0.95 (test log-likelihood of the best arm -0.227 against -0.205),
    kept boston and concrete within 0.03 nats, and cost energy 0.03-0.36 nats (69 held-out
    rows choose two hyperparameters there; ``calibrate_variance=False`` keeps the first).

    Args:
        models: The mixture's :class:`~gpext.subspace.SubspaceModel` objects (at least one),
            all trained on ``(x, y)``.
        x: Training inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (N, ...)
        y: Training targets (``None`` with a loader). # shape: (N,)
        x_val: Held-out inputs, or a loader of ``(x_b, y_b)`` batches. # shape: (M, ...)
        y_val: Held-out targets (``None`` with a loader). # shape: (M,)
        exponents: The exponents :math:`e` (default :data:`TEMPERATURE_EXPONENTS`).
        num_samples: Samples per model and candidate.
        burn_in: ESS transitions discarded per model and candidate.
        thin: ESS thinning.
        calibrate_variance: Score every candidate at its own variance scale (above) and keep
            the winner's. ``None`` (default): for regression likelihoods. ``False`` keeps
            every model's ``variance_scale`` as it is.
        method: ``"ess"`` or ``"vi"``.
        vi_steps: ``num_steps`` of ``fit_vi`` per model and candidate (``method="vi"``).
        generator: Random generator.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection` with ``parameter``
        ``"temperature_exponent"``: ``value`` the exponent :math:`e`, ``samples`` the list of
        every model's samples ``(S, r_k)`` at it, ``scores`` per exponent, ``details``
        ``{"temperatures": [T_1, ..., T_K], "variance_scale": kappa}`` (``kappa`` the models'
        ``variance_scale`` after the selection).

    Raises:
        InputTypeError: If ``models`` is empty or holds anything but
            :class:`~gpext.subspace.SubspaceModel` objects; for bad loaders.
        InputDataError: For non-finite exponents, an unknown ``method``, non-finite data, or
            if every candidate scores :math:`-\infty` (the temperatures are then restored).
        ShapeError: If inputs and targets disagree.

    Example:
        >>> from gpext.subspace import OutputLikelihood
        >>> torch.manual_seed(0)
        <torch._C.Generator object at ...>
        >>> x = torch.randn(40, 2)
        >>> y = x[:, 0] + 0.1 * torch.randn(40)
        >>> nets = [MLP(2, [8], 1) for _ in range(2)]
        >>> models = [SubspaceModel(net, torch.nn.utils.parameters_to_vector(net.parameters()),
        ...                         torch.randn(3, 33), OutputLikelihood("gaussian"))
        ...           for net in nets]
        >>> sel = select_mixture_temperature(models, x[:30], y[:30], x[30:], y[30:],
        ...                                  (0.0, 1.0), num_samples=4, burn_in=2)
        >>> sel.value in (0.0, 1.0), len(sel.samples), sel.samples[0].shape
        (True, 2, torch.Size([4, 3]))
    """
    models = list(models) if isinstance(models, (list, tuple)) else models
    if (
        not isinstance(models, list)
        or not models
        or not all(isinstance(m, SubspaceModel) for m in models)
    ):
        got = type(models).__name__ if not isinstance(models, list) else [
            type(m).__name__ for m in models]  # fmt: skip
        raise InputTypeError(
            expected_got("select_mixture_temperature.models",
                         "a non-empty list or tuple of SubspaceModel objects", got)
        )  # fmt: skip
    if method not in ("ess", "vi"):
        raise InputDataError(
            expected_got("select_mixture_temperature.method", "'ess' or 'vi'", method)
        )
    exps = [float(e) for e in exponents]
    if not exps or not all(math.isfinite(e) for e in exps):
        raise InputDataError(
            expected_got("select_mixture_temperature.exponents", "one or more finite numbers",
                         exponents)
        )  # fmt: skip
    where = "select_mixture_temperature"
    x, y = _model_data(models[0], x, y, where)
    x_val, y_val = _model_data(models[0], x_val, y_val, where, "x_val", "y_val")
    num_rows = x.num_rows if isinstance(x, _Stream) else x.shape[0]
    if calibrate_variance is None:
        calibrate_variance = all(m.likelihood.is_regression for m in models)
    original = [(m.temperature, m.variational, m.variance_scale) for m in models]
    if calibrate_variance:
        for m in models:  # predictions below at kappa = 1; the winner's kappa is set at the end
            m.variance_scale = 1.0
    fitted: dict[float, list] = {}
    kappas: dict[float, float] = {}

    def temperatures(e: float) -> list[float]:
        return [temperature_grid(num_rows, m.rank, (e,))[0] for m in models]

    def score(e: float) -> tuple[float, list[torch.Tensor]]:
        draws, preds, targets, qs = [], [], None, []
        for model, t in zip(models, temperatures(e)):
            model.temperature = t
            if method == "ess":
                thetas = model.sample_ess(
                    x, y, num_samples, burn_in=burn_in, thin=thin, generator=generator
                )
            else:
                model.fit_vi(x, y, num_steps=vi_steps, generator=generator, show_progress=False)
                thetas = model.sample_vi(num_samples, generator=generator)
            qs.append(model.variational)
            with torch.no_grad():
                pred, targets = model._predict_data(x_val, y_val, thetas)
            draws.append(thetas)
            preds.append(pred)
        fitted[e] = qs
        pooled = {k: torch.cat([p[k] for p in preds], dim=0) for k in preds[0]}
        if calibrate_variance and "means" in pooled:
            kappas[e], value = select_mixture_variance_scale(
                pooled["means"], pooled["variances"], targets
            )
            return value, draws
        return validation_log_likelihood(pooled, targets), draws

    try:
        sel = select_by_validation(score, exps, parameter="temperature_exponent")
    except InputDataError:
        for m, (t, q, kappa) in zip(models, original):
            m.temperature, m.variational, m.variance_scale = t, q, kappa
        raise
    temps = temperatures(sel.value)
    for model, t, q, thetas in zip(models, temps, fitted[sel.value], sel.samples):
        model.temperature = t
        if calibrate_variance:
            model.variance_scale = kappas.get(sel.value, 1.0)
        if method == "vi":
            model.variational = q
        model.check_fit(x, y, thetas)
    details = {"temperatures": temps, "variance_scale": models[0].variance_scale}
    return HyperparameterSelection(
        sel.value, sel.samples, sel.scores, "temperature_exponent", details
    )


def regression_network(
    likelihood: OutputLikelihood | str,
    in_features: int,
    hidden_features: Sequence[int] = (50,),
    *,
    activation: str = "relu",
    normalize_last_hidden: bool = False,
) -> nn.Module:
    """The MLP a regression likelihood reads: two outputs for a heteroscedastic one, else one.

    Args:
        likelihood: An :class:`~gpext.subspace.OutputLikelihood` or its kind.
        in_features: Input dimension.
        hidden_features: Hidden widths.
        activation: Activation (see :class:`~gpext.nn.MLP`).
        normalize_last_hidden: Unit-norm last hidden layer (see :class:`~gpext.nn.MLP`).

    Returns:
        :class:`~gpext.nn.HeteroscedasticMLP` for ``"heteroscedastic_gaussian"``, else
        :class:`~gpext.nn.MLP` with one output.

    Raises:
        InputDataError: For a classification likelihood.

    Example:
        >>> regression_network("homoscedastic_gaussian", 3)(torch.zeros(4, 3)).shape
        torch.Size([4, 1])
    """
    kind = likelihood.kind if isinstance(likelihood, OutputLikelihood) else likelihood
    if kind == "heteroscedastic_gaussian":
        return HeteroscedasticMLP(in_features, hidden_features, activation=activation,
                                  normalize_last_hidden=normalize_last_hidden)  # fmt: skip
    if kind in ("gaussian", "homoscedastic_gaussian"):
        return MLP(in_features, hidden_features, 1, activation=activation,
                   normalize_last_hidden=normalize_last_hidden)  # fmt: skip
    raise InputDataError(
        expected_got("regression_network.likelihood", "a regression likelihood kind", kind)
    )


def select_likelihood(
    score: Callable[[OutputLikelihood], float | tuple[float, Any]],
    kinds: Sequence[str] = LIKELIHOOD_KINDS,
    *,
    min_variance: float = 1e-6,
) -> HyperparameterSelection:
    r"""Choose the output likelihood of a regression network on held-out rows.

    For every kind a fresh :class:`~gpext.subspace.OutputLikelihood` (learned noise starting
    at 1 for ``"homoscedastic_gaussian"``, floor ``min_variance``) is passed to ``score``,
    which trains a network for it (:func:`regression_network`) on the fit rows and returns the
    held-out score, or ``(score, result)``. The best kind is ``value``; ``details`` maps every
    kind to ``(likelihood, result)``, so the winner need not be trained again.

    A homoscedastic network with learned noise wins where the noise is nearly constant
    (energy: the heteroscedastic head's variance collapses on the training rows), the
    heteroscedastic one where it varies.

    No data loader here: the function reads no data, ``score`` trains and scores on whatever
    data it holds (tensors or loaders, e.g. :func:`~gpext.subspace.train_sgd_trajectory` and
    :func:`select_swag_scale` with loaders).

    Args:
        score: Trains and scores one likelihood.
        kinds: Candidate kinds (default :data:`LIKELIHOOD_KINDS`).
        min_variance: Variance floor of every candidate.

    Returns:
        A :class:`~gpext.fit.temperature.HyperparameterSelection` with ``parameter``
        ``"likelihood"``.

    Raises:
        InputDataError: For an unknown kind, or if every candidate scores :math:`-\infty`.
    """
    kinds = list(kinds)
    liks = {k: OutputLikelihood(k, min_variance=min_variance) for k in kinds}
    results: dict[str, Any] = {}

    def run(kind: str) -> float:
        out = score(liks[kind])
        value, results[kind] = out if isinstance(out, tuple) else (out, None)
        return value

    sel = select_by_validation(run, kinds, parameter="likelihood")
    details = {k: (liks[k], results.get(k)) for k in kinds}
    return HyperparameterSelection(sel.value, None, sel.scores, "likelihood", details)

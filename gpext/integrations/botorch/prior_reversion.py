r"""Reversion of a sample ensemble to the prior of its outcome where the ensemble is unsure."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__ = ["PriorReversion", "attach_prior_reversion"]


class PriorReversion(nn.Module):
    r"""Combine an ensemble with the prior :math:`\mathcal N(m_0, \sigma_0^2)` of its outcome.

    A network fitted to a few points extrapolates its fit, and its members can disagree far
    more than the outcome itself varies: on Hartmann-6 with 10 points, the calibrated Bayesian
    last layer's standard deviation at the corners of the cube reached 12 times the targets'
    (6.2 against 0.52), so expected improvement chose corners (where the function is about 0).  A GP
    never does this: its posterior variance is at most its prior variance, and where the data
    say little its mean is the prior mean.  With :math:`\bar f(x)` and :math:`\sigma^2(x)` the
    members' mean and (unbiased) variance at :math:`x` (with member weights, their weighted
    mean and the reliability-weighted variance of BoTorch's ``EnsemblePosterior``), this
    module treats the ensemble as a Gaussian opinion :math:`\mathcal N(\bar f, \sigma^2)` and
    multiplies it by the prior,
    :math:`m_0, \sigma_0^2` being the mean and variance of the training targets (0 and 1 for a
    ``Standardize``-d outcome).  The product has

    .. math::

        \bar f'(x) = \frac{\sigma_0^2\,\bar f(x) + \sigma^2(x)\,m_0}{\sigma_0^2 + \sigma^2(x)},
        \qquad
        \sigma'^2(x) = \frac{\sigma_0^2\,\sigma^2(x)}{\sigma_0^2 + \sigma^2(x)}
            < \min\big(\sigma^2(x), \sigma_0^2\big),

    and member :math:`s` becomes :math:`f'_s(x) = \bar f'(x) + \rho(x)\,(f_s(x) - \bar f(x))`
    with :math:`\rho = \sigma_0 / \sqrt{\sigma_0^2 + \sigma^2}`, so the members keep their
    ranks and correlations, each is still one smooth function of :math:`x`, and the new
    members' mean and variance are exactly :math:`\bar f'` and :math:`\sigma'^2`.  Where the
    ensemble is sure (:math:`\sigma \ll \sigma_0`, near the data) nothing changes; where it is
    not, its mean reverts to :math:`m_0` and its spread saturates at :math:`\sigma_0`.  The
    prior counts once more than in a Bayesian posterior (the ensemble was already fitted to
    the data the prior summarises); what it buys is the GP's guarantee that the uncertainty
    never exceeds the outcome's own spread.  ``fit_weight_ensemble`` and
    ``fit_gpext_surrogate`` attach it to the regression ensembles they calibrate on small
    designs, with the variance factor :math:`\kappa` chosen by cross-validation for the
    combination (:func:`~gpext.integrations.botorch.cross_validated_variance_scale`).

    Measured on Hartmann-6 (10 initial points of ``benchmarks/bo.py``'s seed 5): the Bayesian
    last layer's (``method="last_layer"``) first LogEI candidate had five of its six coordinates
    on the bounds (true value 0.09) without the combination and was an interior point (0.50)
    with it.  The 10-seed, 20-iteration runs with the combination are in
    ``benchmarks/results/bo.md``.

    Args:
        prior_mean: :math:`m_0` per output (outcome-transformed space). # shape: (m,)
        prior_sd: :math:`\sigma_0` per output (positive). # shape: (m,)

    Raises:
        InputTypeError: If the tensors are not floating point.
        ShapeError: If their shapes differ or are not ``(m,)``.
        InputDataError: For a non-positive or non-finite prior sd or a non-finite mean.
    """

    def __init__(self, prior_mean: torch.Tensor, prior_sd: torch.Tensor) -> None:
        super().__init__()
        name = "PriorReversion"
        for label, t in (("prior_mean", prior_mean), ("prior_sd", prior_sd)):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                raise InputTypeError(expected_got(f"{name}.{label}", "a floating tensor", type(t)))
        if prior_mean.dim() != 1 or prior_sd.shape != prior_mean.shape:
            raise ShapeError(
                expected_got(
                    f"{name}.prior_mean / prior_sd",
                    "two tensors of shape (m,)",
                    f"{tuple(prior_mean.shape)} and {tuple(prior_sd.shape)}",
                )
            )
        if not bool(torch.isfinite(prior_mean).all()):
            raise InputDataError(expected_got(f"{name}.prior_mean", "finite values", prior_mean))
        if not bool(torch.isfinite(prior_sd).all() and (prior_sd > 0).all()):
            raise InputDataError(
                expected_got(f"{name}.prior_sd", "positive finite values", prior_sd)
            )
        self.register_buffer("prior_mean", prior_mean.detach().clone())
        self.register_buffer("prior_sd", prior_sd.detach().clone().to(prior_mean))

    def forward(self, values: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """Member values ``(S, N, m)`` combined with the prior (``weights``: ``(S,)`` or None).

        Raises:
            ShapeError: If ``values`` is not ``(S, N, m)`` with ``m`` outputs, or the weights
                are not one per member.
        """
        m = self.prior_mean.shape[0]
        if values.dim() != 3 or values.shape[-1] != m:
            raise ShapeError(
                expected_got("PriorReversion(values)", f"shape (S, N, {m})", tuple(values.shape))
            )
        S = values.shape[0]
        if S < 2:
            return values
        if weights is None:
            mean = values.mean(0, keepdim=True)
            var = values.var(0, keepdim=True)
        else:
            if weights.shape != (S,):
                raise ShapeError(
                    expected_got("PriorReversion(weights)", f"shape ({S},)", tuple(weights.shape))
                )
            w = (weights / weights.sum()).to(values).reshape(-1, 1, 1)
            mean = (w * values).sum(0, keepdim=True)
            # reliability weights, as BoTorch's EnsemblePosterior.variance (S / (S - 1) when
            # the weights are uniform), so the posterior reports exactly the product's variance
            # (weights on one member only: no spread, and 0 / 0 is taken as 0, not NaN)
            effective = (1 - w.square().sum()).clamp_min(torch.finfo(values.dtype).eps)
            var = (w * (values - mean).square()).sum(0, keepdim=True) / effective
        v0 = self.prior_sd.to(values).square()
        m0 = self.prior_mean.to(values)
        total = v0 + var
        new_mean = (v0 * mean + var * m0) / total
        return new_mean + torch.sqrt(v0 / total) * (values - mean)

    def extra_repr(self) -> str:
        return f"prior_mean={self.prior_mean.tolist()}, prior_sd={self.prior_sd.tolist()}"


def attach_prior_reversion(model: nn.Module, Y: torch.Tensor | None) -> None:
    r"""Give a fitted sample-ensemble adapter a :class:`PriorReversion` (``Y=None``: remove it).

    The prior is the training targets' mean and (population) standard deviation in the
    outcome-transformed space, as in the cross-validation that chose it.

    Args:
        model: A fitted :class:`~gpext.integrations.botorch.SampleEnsembleSurrogate`.
        Y: Outcome-transformed training targets, or ``None``. # shape: (n, m)
    """
    model.prior_reversion = None
    if Y is None:
        return
    Yd = Y.detach()
    sd = Yd.std(0, unbiased=False) if Yd.shape[0] > 1 else torch.ones_like(Yd[0])
    model.prior_reversion = PriorReversion(Yd.mean(0), sd.clamp_min(1e-6))

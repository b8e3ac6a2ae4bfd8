r"""End-of-fit checks on rows the fit did not train on, shared by every regression model.

Training-set checks (:mod:`gpext.fit.diagnostics`) catch collapsed fits; they cannot see a model
that fits its training rows and predicts nothing, or whose intervals are too narrow off the
training rows.  :func:`check_heldout` scores a model's Gaussian predictions
:math:`\mathcal N(m_i, v_i)` on held-out (or cross-validated) targets :math:`y_i` with

.. math::
    R^2 = 1 - \frac{\sum_i (y_i - m_i)^2}{\sum_i (y_i - \bar y_{\text{train}})^2}, \quad
    \text{cov}_{95} = \frac1n \sum_i \mathbb 1\big[|y_i - m_i| \le 1.96 \sqrt{v_i}\big], \quad
    \overline{z^2} = \frac1n \sum_i \frac{(y_i - m_i)^2}{v_i},

and warns with :class:`~gpext.errors.NoSignalWarning` when :math:`R^2 \le 0` (the model does no
better than the training mean), :class:`~gpext.errors.OverconfidenceWarning` when the coverage is
below :math:`0.95 - \max(0.07, 3\sqrt{0.95 \cdot 0.05 / n})` (three binomial standard errors,
and at least 7 points: 0.88 at most), and :class:`~gpext.errors.UnderconfidenceWarning` when
:math:`\overline{z^2} < 0.25` with coverage at least 0.99 (variances four times too large).
Given the held-out NLL of a plain exact GP fitted to the same training rows
(:func:`gpext.fit.exact_gp.reference_heldout_nll`), it also warns with
:class:`~gpext.errors.ReferenceGapWarning` when the model's Gaussian NLL per point,
:math:`\frac1n\sum_i \tfrac12\log(2\pi v_i) + \tfrac{(y_i - m_i)^2}{2 v_i}`, is more than
:data:`REFERENCE_NLL_MARGIN` nats above it.

Where a fit keeps no held-out rows (small tables), :func:`holdout_refit_check` fits a copy of
the model on 80% of the rows and checks it on the rest; exact GPs use the closed-form
leave-one-out predictions (:func:`exact_gp_loo`) instead.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from gpext.errors import (
    NoSignalWarning,
    OverconfidenceWarning,
    ReferenceGapWarning,
    UnderconfidenceWarning,
)
from gpext.fit.fit_result import FitResult

__all__ = [
    "HeldoutCheck",
    "MIN_CHECK_POINTS",
    "REFERENCE_NLL_MARGIN",
    "check_heldout",
    "exact_gp_loo",
    "holdout_refit_check",
    "refit_split",
    "holdout_split",
]

#: Fewest held-out rows on which the interval checks are run (the R^2 check needs 5).
MIN_CHECK_POINTS = 10
#: Nats per held-out point by which a model may trail a plain exact GP on the same rows
#: before :func:`check_heldout` warns (:class:`~gpext.errors.ReferenceGapWarning`).
REFERENCE_NLL_MARGIN = 0.5
#: Level of the central interval whose coverage is checked.
LEVEL = 0.95


@dataclass
class HeldoutCheck:
    """The scores :func:`check_heldout` computed (``nan`` where too few rows)."""

    r2: float
    coverage95: float
    mean_z2: float
    num_points: int
    problems: tuple[str, ...] = ()
    #: Gaussian NLL per point of the predictions, and the exact-GP reference's (if given).
    nll: float = math.nan
    reference_nll: float = math.nan

    @property
    def ok(self) -> bool:
        """No problem found."""
        return not self.problems


def _overconfidence_threshold(n: int) -> float:
    return LEVEL - max(0.07, 3.0 * math.sqrt(LEVEL * (1 - LEVEL) / n))


def check_heldout(
    mean: torch.Tensor,
    variance: torch.Tensor,
    y: torch.Tensor,
    *,
    train_mean: float | torch.Tensor,
    name: str,
    result: FitResult | None = None,
    what: str = "held-out rows",
    stacklevel: int = 2,
    reference_nll: float | None = None,
    nll: float | None = None,
) -> HeldoutCheck:
    r"""Score Gaussian predictions on rows the fit did not train on; warn when they are bad.

    Args:
        mean: Predictive means :math:`m_i` (original units).  # shape: (n,)
        variance: Predictive variances :math:`v_i` of the targets (noise included).
            # shape: (n,)
        y: The held-out targets.  # shape: (n,)
        train_mean: The training targets' mean :math:`\bar y_{\text{train}}` (the baseline;
            one value per row for leave-one-out predictions, each row's own baseline).
        name: What was fitted, for the messages.
        result: A fit result to record the problems in.
        what: How the rows were obtained, for the messages.
        stacklevel: Passed on to :func:`warnings.warn` (counted from the caller).
        reference_nll: The held-out NLL per point of a plain exact GP fitted to the same
            training rows (:func:`gpext.fit.exact_gp.reference_heldout_nll`); ``None``: no
            comparison.
        nll: The model's own held-out NLL per point where its predictive is not Gaussian
            (e.g. a mixture); ``None``: the Gaussian NLL of ``mean`` and ``variance``.

    Returns:
        A :class:`HeldoutCheck`.

    Warns:
        NoSignalWarning: :math:`R^2 \le 0` on at least 5 rows.
        OverconfidenceWarning: Coverage of the central 95% interval below the threshold of the
            module docstring, on at least :data:`MIN_CHECK_POINTS` rows.
        UnderconfidenceWarning: Variances about four or more times too large.
        ReferenceGapWarning: NLL more than :data:`REFERENCE_NLL_MARGIN` nats per point above
            ``reference_nll``, on at least :data:`MIN_CHECK_POINTS` rows.
    """
    m = mean.detach().reshape(-1).to(torch.float64)
    v = variance.detach().reshape(-1).to(torch.float64).clamp_min(1e-300)
    t = y.detach().reshape(-1).to(torch.float64).to(m.device)
    v = v.to(m.device)
    n = t.numel()
    base = torch.as_tensor(train_mean, dtype=torch.float64).to(m.device).reshape(-1)
    base = base[0] if base.numel() == 1 else base
    problems: list[str] = []
    r2 = cov = z2 = math.nan
    if n >= 5:
        ss0 = float((t - base).pow(2).sum())
        r2 = 1.0 - float((t - m).pow(2).sum()) / ss0 if ss0 > 0 else math.nan
        z = (t - m).pow(2) / v
        z2 = float(z.mean())
        cov = float((z <= 1.959963984540054**2).to(torch.float64).mean())
    if nll is None:
        nll = (
            float((0.5 * (2 * math.pi * v).log() + (t - m).pow(2) / (2 * v)).mean())
            if n
            else math.nan
        )
    ref = math.nan if reference_nll is None else float(reference_nll)
    if n >= 5 and r2 <= 0:
        problems.append(NoSignalWarning.__name__)
        _warn(
            result,
            NoSignalWarning,
            f"{name}: on {n} {what} the predictive mean explains R^2 = {r2:.3f} of the "
            "targets' variance around the training mean: it predicts no better than that mean. "
            "The inputs may carry no signal about the targets, or the fit failed to find it "
            "(try a longer fit, other features, or a simpler model).",
            stacklevel,
        )
    if n >= MIN_CHECK_POINTS and cov < _overconfidence_threshold(n):
        problems.append(OverconfidenceWarning.__name__)
        _warn(
            result,
            OverconfidenceWarning,
            f"{name}: overconfident: on {n} {what} only {cov:.0%} of the targets lie in the "
            f"central 95% predictive interval (mean squared z-score {z2:.3g}, 1 when "
            "calibrated); its intervals are too narrow. Use a hold-out calibration (more "
            "training rows) or a model with a learned noise.",
            stacklevel,
        )
    elif n >= MIN_CHECK_POINTS and z2 < 0.25 and cov >= 0.99:
        problems.append(UnderconfidenceWarning.__name__)
        _warn(
            result,
            UnderconfidenceWarning,
            f"{name}: underconfident: on {n} {what} the mean squared z-score is {z2:.3g} (1 "
            f"when calibrated; coverage of the central 95% interval {cov:.0%}); its "
            "predictive variances are several times too large, e.g. an undertrained noise.",
            stacklevel,
        )
    if n >= MIN_CHECK_POINTS and math.isfinite(ref) and not nll <= ref + REFERENCE_NLL_MARGIN:
        problems.append(ReferenceGapWarning.__name__)
        _warn(
            result,
            ReferenceGapWarning,
            f"{name}: on {n} {what} its negative log-likelihood is {nll:.3g} nats per point "
            f"against {ref:.3g} for a plain exact GP fitted to the same training rows (more "
            f"than {REFERENCE_NLL_MARGIN} worse): on these data the model loses to the exact "
            "GP. Use the exact GP (gpext.fit.build_exact_gp + fit_exact_gp) or a model with "
            "fewer parameters, or give it more rows.",
            stacklevel,
        )
    return HeldoutCheck(r2, cov, z2, n, tuple(problems), nll, ref)


def _warn(result, category, message, stacklevel):
    if result is not None:
        result.add_problem(category.__name__)
    warnings.warn(message, category, stacklevel=stacklevel + 2)


def holdout_split(
    n: int, fraction: float, generator: torch.Generator | None, *, minimum: int = MIN_CHECK_POINTS
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A seeded (train, held-out) index split of ``range(n)``; ``None`` when too few rows."""
    n_out = int(round(fraction * n))
    if n_out < minimum or n - n_out < minimum:
        return None
    perm = torch.randperm(n, generator=generator)
    return perm[n_out:], perm[:n_out]


def refit_split(
    n: int,
    fraction: float,
    generator: torch.Generator | None,
    device: torch.device | str,
    *,
    minimum: int = MIN_CHECK_POINTS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Generator] | None:
    """Indices for a small-table refit check, and a generator for the copy's own fit.

    One draw from ``generator`` seeds both the (train, held-out) split of
    :func:`holdout_split` and the copy's fit, so a seeded fit and its check are reproducible.

    Returns:
        ``(train, held_out, copy_generator)`` on ``device``, or ``None`` when either part would
        have fewer than ``minimum`` rows.
    """
    seed = int(torch.randint(0, 2**62, (1,), generator=generator))
    split = holdout_split(n, fraction, torch.Generator().manual_seed(seed), minimum=minimum)
    if split is None:
        return None
    tr, te = (i.to(device) for i in split)
    return tr, te, torch.Generator().manual_seed(seed + 1)


def holdout_refit_check(
    fit_copy: Callable[[torch.Tensor, torch.Tensor], Callable[[torch.Tensor], tuple]],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    name: str,
    result: FitResult | None = None,
    fraction: float = 0.2,
    generator: torch.Generator | None = None,
    stacklevel: int = 2,
) -> HeldoutCheck | None:
    """Fit a copy of a model on part of the rows and check it on the rest.

    For fits that keep no held-out rows (small tables): ``fit_copy(x_train, y_train)`` fits
    a fresh copy with the same settings (its own warnings are discarded: the model fitted on
    all rows reports its own) and returns a function ``x -> (mean, variance)`` of the targets
    in original units.  The copy's scores on the other ``fraction`` of the rows stand for the
    model's (it has fewer rows, so the check errs on the side of warning).

    Returns:
        The :class:`HeldoutCheck`, or ``None`` when there are too few rows for a split.
    """
    split = holdout_split(y.shape[0], fraction, generator)
    if split is None:
        return None
    tr, te = (i.to(y.device) for i in split)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        predict = fit_copy(x[tr], y[tr])
        with torch.no_grad():
            mean, var = predict(x[te])
    return check_heldout(
        mean, var, y[te], train_mean=y[tr].double().mean(), name=name, result=result,
        what="rows held out from a refit on the rest", stacklevel=stacklevel + 1,
    )  # fmt: skip


@torch.no_grad()
def exact_gp_loo(model) -> tuple[torch.Tensor, torch.Tensor]:
    r"""Closed-form leave-one-out predictions of a fitted single-output exact GP.

    With :math:`\mathbf A = K + \sigma^2 I` on the training rows (Rasmussen and Williams 2006,
    Eq. 5.12), :math:`\mu_{-i} = y_i - [\mathbf A^{-1}(\mathbf y - \mathbf m)]_i /
    [\mathbf A^{-1}]_{ii}` and :math:`\sigma^2_{-i} = 1 / [\mathbf A^{-1}]_{ii}`, in the
    original units (a :class:`~gpext.fit.MultiOutputExactGP` with a standardiser is
    untransformed).  Hyperparameters are those fitted on all rows.

    Returns:
        ``(mean, variance)`` of the targets, noise included.  # shape: (N,) each
    """
    was_training = model.training
    model.train()
    try:
        x = model.train_inputs[0]
        t = model.train_targets
        prior = model.forward(x)
        full = model.likelihood(prior)
        a = full.covariance_matrix.to(torch.float64)
        r = (t - prior.mean).to(torch.float64)
    finally:
        model.train(was_training)
    chol = torch.linalg.cholesky(a + 1e-10 * a.diagonal().mean() * torch.eye(a.shape[-1]).to(a))
    a_inv = torch.cholesky_inverse(chol)
    diag = a_inv.diagonal()
    mean = t.to(torch.float64) - (a_inv @ r) / diag
    var = 1.0 / diag
    s = getattr(model, "standardizer", None)
    if s is not None and s.targets:
        mean = s.untransform_targets(mean.unsqueeze(-1)).reshape(-1)
        var = s.untransform_variance(var.unsqueeze(-1)).reshape(-1)
    return mean, var

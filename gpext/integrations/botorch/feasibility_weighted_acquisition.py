r"""Constrained Bayesian optimisation with a gpext classifier as the feasibility model."""

from __future__ import annotations

import math

import torch
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import AnalyticAcquisitionFunction
from botorch.exceptions.errors import UnsupportedError

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate

__all__ = ["FeasibilityWeightedAcquisition"]


class FeasibilityWeightedAcquisition(AcquisitionFunction):
    r"""An acquisition function weighted by a classifier's probability of feasibility.

    For a binary (or multiclass) feasibility label observed at every evaluation, the classifier
    gives :math:`\pi(x) = p(c(x) = c_{\text{feas}} \mid \mathcal D)`, and
    :math:`P(X) = \prod_{i=1}^q \pi(x_i)` is the probability that the whole batch is feasible
    (the ``q`` labels treated as independent).  The weighted acquisition is the expected value
    of the base acquisition :math:`\alpha` when a batch that turns out infeasible is worth
    :math:`\alpha_0` (``infeasible_value``),

    .. math::

        \alpha_{\text{feas}}(X) = \alpha_0 + P(X)\,\big(\alpha(X) - \alpha_0\big), \qquad
        \log\alpha_{\text{feas}}(X) = \log\alpha(X) + \sum_{i=1}^q \log \pi(x_i).

    The first form is used for acquisitions whose values are utilities (``acq_function._log``
    false).  It is non-decreasing in both :math:`\alpha` and :math:`P` only where
    :math:`\alpha(X) \ge \alpha_0`, so :math:`\alpha_0` must be a lower bound of
    :math:`\alpha` on the search space, and this is checked at every evaluation.  With the
    default :math:`\alpha_0 = 0`, for non-negative acquisitions (EI, PI, qEI, qNEI, qPI), it is
    constrained EI (Gardner et al. 2014) with the classifier in place of the GP
    constraint model, :math:`\alpha(X) P(X)`.  For acquisitions that can be negative
    (``PosteriorMean``, ``qSimpleRegret``, ``UpperConfidenceBound``, ``qUpperConfidenceBound``)
    pass a lower bound, e.g. ``-get_infeasible_cost(X_cover, model)`` from
    ``botorch.acquisition.utils`` (the smallest posterior mean minus six standard deviations,
    capped at 0, over points ``X_cover`` that cover the search space, such as a Sobol sample):
    this is the infeasible-cost construction of BoTorch's constrained Monte Carlo objectives,
    applied to the acquisition value.  The second form is used for log
    acquisitions (``_log`` true: ``LogExpectedImprovement``, ``qLogNoisyExpectedImprovement``,
    ...); it is the logarithm of the first with :math:`\alpha_0 = 0`, valid for any value.

    Pending points (:meth:`set_X_pending`, set by ``optimize_acqf(..., sequential=True)``) are
    passed on to the base acquisition, which accounts for them; their feasibility does not
    depend on ``X`` and is left out of :math:`P`.  The base acquisition should measure
    improvement over the best *feasible* observation (e.g. ``best_f`` = best feasible value, or
    an objective that penalises infeasible baseline points).

    Args:
        acq_function: The base acquisition function on the objective model.
        classifier: A gpext classifier adapter (:class:`DirichletClassifierSurrogate`,
            :class:`GWISurrogate` or :class:`IGNSurrogate` of a classifier, :class:`VBootSurrogate`
            of a classifier, or a categorical :class:`WeightEnsembleSurrogate`).
        feasible_class: The class index that means "feasible".
        infeasible_value: :math:`\alpha_0`, a lower bound of the (non-log) acquisition values
            (default 0); not accepted for log acquisitions.
        min_probability: Floor of :math:`\pi` before the logarithm.

    Raises:
        InputTypeError: If the arguments have the wrong types.
        InputDataError: If ``feasible_class`` is out of range, ``min_probability`` is not in
            ``(0, 1)``, or ``infeasible_value`` is not finite or is given for a log acquisition.

    Example:
        >>> import torch
        >>> from botorch.acquisition import LogExpectedImprovement, qUpperConfidenceBound
        >>> from botorch.acquisition.utils import get_infeasible_cost
        >>> from botorch.optim import optimize_acqf
        >>> from botorch.utils.sampling import draw_sobol_samples
        >>> from gpext.bootstrap import VBootRFF
        >>> from gpext.integrations.botorch import (
        ...     DirichletClassifierSurrogate, FeasibilityWeightedAcquisition, VBootSurrogate,
        ...     fit_gpext_surrogate)
        >>> from gpext.models import DirichletGPClassifier
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=g)
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> feasible = (X.sum(-1, keepdim=True) > 1).double()  # pass / fail labels
        >>> bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
        >>> vboot = VBootRFF(num_features=200, num_particles=16, noise=1e-3)
        >>> objective_model = fit_gpext_surrogate(
        ...     VBootSurrogate(vboot, train_X=X, train_Y=Y), generator=g)
        >>> classifier = fit_gpext_surrogate(
        ...     DirichletClassifierSurrogate(DirichletGPClassifier(2), train_X=X, train_Y=feasible))
        >>> best_feasible = Y[feasible.squeeze(-1) == 1].max()
        >>> base = LogExpectedImprovement(objective_model, best_f=best_feasible)
        >>> acqf = FeasibilityWeightedAcquisition(base, classifier, feasible_class=1)
        >>> candidate, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=64)
        >>> lower = -get_infeasible_cost(draw_sobol_samples(bounds, 256, 1)[:, 0],
        ...                              objective_model)
        >>> acqf = FeasibilityWeightedAcquisition(qUpperConfidenceBound(objective_model, 2.0),
        ...                                       classifier, infeasible_value=lower.item())
        >>> batch, _ = optimize_acqf(acqf, bounds, q=3, num_restarts=4, raw_samples=64,
        ...                          sequential=True)
    """

    def __init__(
        self,
        acq_function: AcquisitionFunction,
        classifier: LatentGPSurrogate | SampleEnsembleSurrogate,
        *,
        feasible_class: int = 1,
        infeasible_value: float | None = None,
        min_probability: float = 1e-12,
    ) -> None:
        what = "FeasibilityWeightedAcquisition"
        if not isinstance(acq_function, AcquisitionFunction):
            raise InputTypeError(
                expected_got(
                    f"{what}.acq_function",
                    "a BoTorch AcquisitionFunction",
                    type(acq_function).__name__,
                )
            )
        if not isinstance(classifier, (LatentGPSurrogate, SampleEnsembleSurrogate)):
            raise InputTypeError(
                expected_got(
                    f"{what}.classifier", "a gpext classifier adapter", type(classifier).__name__
                )
            )
        if isinstance(feasible_class, bool) or not isinstance(feasible_class, int):
            raise InputTypeError(
                expected_got(f"{what}.feasible_class", "an int", type(feasible_class).__name__)
            )
        if feasible_class < 0:
            raise InputDataError(
                expected_got(f"{what}.feasible_class", "a class index >= 0", feasible_class)
            )
        if not 0 < min_probability < 1:
            raise InputDataError(
                expected_got(f"{what}.min_probability", "in (0, 1)", min_probability)
            )
        log = bool(getattr(acq_function, "_log", False))
        if infeasible_value is not None:
            if log:
                raise InputDataError(
                    expected_got(
                        f"{what}.infeasible_value",
                        f"None for the log acquisition {type(acq_function).__name__}",
                        infeasible_value,
                        "Log acquisitions are weighted by adding log P(feasible), which is "
                        "valid for any value; leave infeasible_value unset.",
                    )
                )
            if not isinstance(infeasible_value, (int, float)) or not math.isfinite(
                infeasible_value
            ):
                raise InputDataError(
                    expected_got(f"{what}.infeasible_value", "a finite float", infeasible_value)
                )
        super().__init__(model=acq_function.model)
        self.acq_function = acq_function
        self.classifier = classifier
        self.feasible_class = feasible_class
        self.log = log
        self._log = log  # the wrapper returns log values exactly when the base does
        self.infeasible_value = 0.0 if infeasible_value is None else float(infeasible_value)
        self.min_probability = float(min_probability)

    @property
    def X_pending(self) -> torch.Tensor | None:
        """The pending points of the base acquisition (``None`` if it has none)."""
        return getattr(self.acq_function, "X_pending", None)

    def set_X_pending(self, X_pending: torch.Tensor | None = None) -> None:
        """Pass pending points on to the base acquisition.

        Args:
            X_pending: Points submitted for evaluation but not yet evaluated, or ``None`` to
                clear them. # shape: (n, d)

        Raises:
            InputTypeError: If ``X_pending`` is not a tensor or ``None``, or the base
                acquisition cannot take pending points (BoTorch's analytic acquisitions).
        """
        if X_pending is not None and not isinstance(X_pending, torch.Tensor):
            raise InputTypeError(
                expected_got(
                    "FeasibilityWeightedAcquisition.set_X_pending(X_pending)",
                    "a tensor of shape (n, d) or None",
                    type(X_pending).__name__,
                )
            )
        try:
            self.acq_function.set_X_pending(X_pending)
        except UnsupportedError as err:
            if X_pending is None:
                return  # analytic acquisitions refuse even None; they hold nothing to clear
            raise InputTypeError(
                expected_got(
                    "FeasibilityWeightedAcquisition.set_X_pending",
                    "a base acquisition that accounts for pending points (a Monte Carlo "
                    "acquisition such as qLogNoisyExpectedImprovement or qUpperConfidenceBound)",
                    type(self.acq_function).__name__,
                    "Analytic acquisitions take q = 1 and no pending points; use their q- "
                    "version for optimize_acqf(..., q > 1).",
                )
            ) from err

    def log_probability_of_feasibility(self, X: torch.Tensor) -> torch.Tensor:
        r""":math:`\log P(X) = \sum_{i=1}^q \log\pi(x_i)` for each batch.

        Args:
            X: Candidates. # shape: (*batch, q, d)

        Returns:
            Log probability that all ``q`` points are feasible. # shape: (*batch,)

        Raises:
            InputDataError: If ``feasible_class`` is not a class of the classifier.
        """
        probs = self.classifier.class_probabilities(X)  # shape: (*b, q, C)
        if self.feasible_class >= probs.shape[-1]:
            raise InputDataError(
                expected_got(
                    "FeasibilityWeightedAcquisition.feasible_class",
                    f"an index in [0, {probs.shape[-1]})",
                    self.feasible_class,
                )
            )
        p = probs[..., self.feasible_class].clamp_min(self.min_probability)
        return p.log().sum(-1)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Weighted acquisition value (see the class for the two forms).

        Args:
            X: Candidates. # shape: (*batch, q, d)

        Returns:
            Values (log values for a log base acquisition). # shape: (*batch,)

        Raises:
            InputDataError: If a non-log base acquisition returns a value below
                ``infeasible_value``.
            ShapeError: If an analytic base acquisition gets ``q > 1`` points per batch.
        """
        if (
            isinstance(self.acq_function, AnalyticAcquisitionFunction)
            and X.dim() >= 2
            and X.shape[-2] != 1
        ):
            raise ShapeError(
                expected_got(
                    "FeasibilityWeightedAcquisition(X)",
                    f"q = 1 point per batch for the analytic {type(self.acq_function).__name__}",
                    f"X of shape {tuple(X.shape)} (q = {X.shape[-2]})",
                    "Use the Monte Carlo version (e.g. qLogNoisyExpectedImprovement) for "
                    "optimize_acqf(..., q > 1).",
                )
            )
        value = self.acq_function(X)  # shape: (*batch,)
        log_pof = self.log_probability_of_feasibility(X)
        if self.log:
            return value + log_pof
        a0 = self.infeasible_value
        if bool((value < a0).any()):
            raise InputDataError(
                expected_got(
                    "FeasibilityWeightedAcquisition",
                    f"values of {type(self.acq_function).__name__} >= infeasible_value = {a0:g} "
                    "(weighting by P(feasible) is only monotone above it)",
                    f"a minimum of {float(value.detach().min()):.4g}",
                    "Pass infeasible_value=<a lower bound of the acquisition on the search "
                    "space>, e.g. -get_infeasible_cost(X_cover, model).item() from "
                    "botorch.acquisition.utils for PosteriorMean, qSimpleRegret or qUCB, or use "
                    "a log acquisition (LogEI, qLogNEI).",
                )
            )
        return a0 + log_pof.exp() * (value - a0)

r"""Constrained Bayesian optimisation with a gpext classifier as the feasibility model."""

from __future__ import annotations

import torch
from botorch.acquisition.acquisition import AcquisitionFunction

from gpext.errors import InputDataError, InputTypeError, expected_got
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate

__all__ = ["FeasibilityWeightedAcquisition"]


class FeasibilityWeightedAcquisition(AcquisitionFunction):
    r"""An acquisition function weighted by a classifier's probability of feasibility.

    For a binary (or multiclass) feasibility label observed at every evaluation, the classifier
    gives :math:`\pi(x) = p(c(x) = c_{\text{feas}} \mid \mathcal D)`.  The weighted acquisition
    is that of constrained EI (Gardner et al. 2014), with the classifier in place of the GP
    constraint model,

    .. math::

        \alpha_{\text{feas}}(X) = \alpha(X) \prod_{i=1}^q \pi(x_i), \qquad
        \log\alpha_{\text{feas}}(X) = \log\alpha(X) + \sum_{i=1}^q \log \pi(x_i)

    (the second form for log acquisition functions such as ``LogExpectedImprovement`` and
    ``qLogNoisyExpectedImprovement``, used when ``log=True``).  For ``q > 1`` the product treats
    the feasibility of the ``q`` points as independent.  The base acquisition function should
    measure improvement over the best *feasible* observation (e.g. ``best_f`` = best feasible
    value, or an objective that penalises infeasible baseline points).

    Args:
        acq_function: The base acquisition function on the objective model.
        classifier: A gpext classifier adapter (:class:`DirichletClassifierSurrogate`,
            :class:`GWISurrogate` or :class:`IGNSurrogate` of a classifier, :class:`VBootSurrogate`
            of a classifier, or a categorical :class:`WeightEnsembleSurrogate`).
        feasible_class: The class index that means "feasible".
        log: Whether ``acq_function`` returns log values (default: its class name starts with
            ``"Log"`` or ``"qLog"``).
        min_probability: Floor of :math:`\pi` before the logarithm.

    Raises:
        InputTypeError: If the arguments have the wrong types.
        InputDataError: If ``feasible_class`` is out of range.

    Example:
        >>> base = LogExpectedImprovement(objective_model, best_f=best_feasible)
        >>> acqf = FeasibilityWeightedAcquisition(base, classifier, feasible_class=1)
        >>> candidate, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=4, raw_samples=64)
    """

    def __init__(
        self,
        acq_function: AcquisitionFunction,
        classifier: LatentGPSurrogate | SampleEnsembleSurrogate,
        *,
        feasible_class: int = 1,
        log: bool | None = None,
        min_probability: float = 1e-12,
    ) -> None:
        if not isinstance(acq_function, AcquisitionFunction):
            raise InputTypeError(
                expected_got(
                    "FeasibilityWeightedAcquisition.acq_function",
                    "a BoTorch AcquisitionFunction",
                    type(acq_function).__name__,
                )
            )
        if not isinstance(classifier, (LatentGPSurrogate, SampleEnsembleSurrogate)):
            raise InputTypeError(
                expected_got(
                    "FeasibilityWeightedAcquisition.classifier",
                    "a gpext classifier adapter",
                    type(classifier).__name__,
                )
            )
        if not isinstance(feasible_class, int) or feasible_class < 0:
            raise InputDataError(
                expected_got(
                    "FeasibilityWeightedAcquisition.feasible_class",
                    "a class index >= 0",
                    feasible_class,
                )
            )
        if not 0 < min_probability < 1:
            raise InputDataError(
                expected_got(
                    "FeasibilityWeightedAcquisition.min_probability", "in (0, 1)", min_probability
                )
            )
        super().__init__(model=acq_function.model)
        self.acq_function = acq_function
        self.classifier = classifier
        self.feasible_class = feasible_class
        name = type(acq_function).__name__
        self.log = name.startswith(("Log", "qLog")) if log is None else bool(log)
        self.min_probability = float(min_probability)

    def log_probability_of_feasibility(self, X: torch.Tensor) -> torch.Tensor:
        r""":math:`\sum_{i=1}^q \log\pi(x_i)` for each batch.

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
        """Weighted acquisition value.

        Args:
            X: Candidates. # shape: (*batch, q, d)

        Returns:
            Values. # shape: (*batch,)
        """
        value = self.acq_function(X)
        log_pof = self.log_probability_of_feasibility(X)
        return value + log_pof if self.log else value * log_pof.exp()

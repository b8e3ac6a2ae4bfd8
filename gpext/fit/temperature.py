"""The result of a likelihood-temperature selection on held-out rows (one type for all models)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["HyperparameterSelection", "TemperatureSelection"]


class TemperatureSelection(NamedTuple):
    """What ``select_temperature`` of a gpext model returns.

    Every model that can temper its likelihood (:class:`~gpext.subspace.SubspaceModel` with ESS
    or VI, :class:`~gpext.models.GWIModel` and its subclasses) chooses :math:`T` on held-out
    rows by their mean log predictive density and returns this tuple (it unpacks like the
    former ``(temperature, samples, scores)`` triple).

    Attributes:
        temperature: The chosen :math:`T` (also stored on the model).
        samples: The posterior samples drawn at that :math:`T` (subspace ESS / VI: ``(S, r)``),
            or ``None`` when the selection needs no sampling (GWI tempers its predictive).
        scores: Held-out mean log predictive density of every candidate :math:`T` (higher is
            better).
    """

    temperature: float
    samples: torch.Tensor | None
    scores: dict[float, float]


class HyperparameterSelection(NamedTuple):
    """What the held-out selections of :mod:`gpext.subspace.tuning` return.

    The same layout as :class:`TemperatureSelection` (value, samples, scores), for any
    hyperparameter: a noise variance, a prior scale, a SWAG covariance scale, a likelihood.

    Attributes:
        value: The chosen value (a number, or a name for a choice between likelihoods).
        samples: The weight samples (``(S, D)``) or subspace samples (``(S, r)``) drawn at
            that value, or ``None`` when the selection draws none.
        scores: Held-out mean log predictive density of every candidate scored (higher is
            better; ``-inf`` for a failed candidate). A search refined between grid points
            (golden section) lists the grid and the refined point.
        parameter: Which hyperparameter (``"noise_variance"``, ``"prior_std"``,
            ``"swag_scale"``, ``"likelihood"``, ...).
        details: Anything else the selection keeps (e.g. the winning likelihood object).
    """

    value: float | str
    samples: torch.Tensor | None
    scores: dict
    parameter: str = ""
    details: object = None

"""The result of a likelihood-temperature selection on held-out rows (one type for all models)."""

from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["TemperatureSelection"]


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

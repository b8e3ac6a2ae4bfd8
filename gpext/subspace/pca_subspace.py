"""The PCA subspace of a weight trajectory (Izmailov, Maddox et al. 2019)."""

from __future__ import annotations

import math

import torch
from torch import nn

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.subspace.randomized_svd import randomized_svd
from gpext.utils import check_finite, check_positive_int
from gpext.utils.validation import as_float_tensor, check_not_low_precision

__all__ = ["PCASubspace"]


def _check_deviations(deviations: object, name: str) -> torch.Tensor:
    """Trajectory deviations ``(K, D)`` with ``K >= 2``: converted, at least single precision,
    finite (shared by the subspaces fitted to a trajectory).

    Raises:
        InputTypeError: For non-numeric or half-precision input.
        ShapeError: If ``deviations`` is not a matrix.
        InputDataError: With fewer than two deviations or non-finite entries.
    """
    deviations = check_not_low_precision(as_float_tensor(deviations, name), name)
    if deviations.dim() != 2:
        raise ShapeError(expected_got(name, "a (K, D) tensor", tuple(deviations.shape)))
    if deviations.shape[0] < 2:
        raise InputDataError(
            expected_got(
                name, "at least 2 deviations", deviations.shape[0], "Collect more weights first."
            )
        )
    return check_finite(deviations, name)


class PCASubspace(nn.Module):
    r"""Projection :math:`P = \operatorname{diag}(s)\, V^\top` from the SVD of the deviations.

    With the ``K`` deviations actually collected stacked as rows of :math:`\hat D`
    (000 Eq. 1-2, Sec. III-A; Izmailov et al. 2019),

    .. math::

        \frac{\hat D}{\sqrt{K - 1}} \approx U \operatorname{diag}(s) V^\top, \qquad
        w = \hat w + P^\top \theta, \quad P = \operatorname{diag}(s) V^\top \in \mathbb{R}^{r \times D},

    computed by :func:`~gpext.subspace.randomized_svd`. The rows of ``P`` are the principal
    directions scaled by the standard deviation of the trajectory along them, so a standard
    normal :math:`\theta` reproduces the trajectory's spread.

    Args:
        rank: Subspace dimension ``r``.
        power_iterations: Power iterations of the randomized SVD.
        oversample: Oversampling of the randomized SVD.

    Example:
        >>> sub = PCASubspace(rank=2).fit(torch.randn(10, 50))
        >>> sub.projection.shape
        torch.Size([2, 50])
    """

    def __init__(self, rank: int = 20, power_iterations: int = 5, oversample: int = 10) -> None:
        super().__init__()
        self.rank = check_positive_int(rank, "PCASubspace.rank")
        self.power_iterations = power_iterations
        self.oversample = oversample
        self.register_buffer("_projection", torch.empty(0, 0))

    @property
    def projection(self) -> torch.Tensor:
        """The projection matrix ``P``. # shape: (r, D)"""
        if self._projection.numel() == 0:
            raise NotFittedError("PCASubspace: call fit(deviations) first.")
        return self._projection

    def fit(
        self, deviations: torch.Tensor, *, generator: torch.Generator | None = None
    ) -> PCASubspace:
        """Compute ``P`` from the deviations (e.g. ``TrajectoryCollector.deviations()``).

        Args:
            deviations: The ``K`` collected deviations as rows. # shape: (K, D)
            generator: Random generator of the randomized SVD.

        Returns:
            ``self``.

        Raises:
            ShapeError: If ``deviations`` is not a matrix.
            InputDataError: If fewer than two deviations are given, ``rank > K`` (or ``> D``), or
                the deviations are not finite.
        """
        deviations = _check_deviations(deviations, "PCASubspace.fit(deviations)")
        k, d = deviations.shape
        if self.rank > min(k, d):
            raise InputDataError(
                expected_got(
                    "PCASubspace.rank",
                    f"at most the number of collected deviations ({k}) and of weights ({d})",
                    self.rank,
                    "Lower the rank or collect more deviations.",
                )
            )
        _, s, vh = randomized_svd(
            deviations / math.sqrt(k - 1),
            self.rank,
            oversample=self.oversample,
            power_iterations=self.power_iterations,
            generator=generator,
        )
        self._projection = s.unsqueeze(-1) * vh
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: D401
        key = prefix + "_projection"
        if key in state_dict:
            self._projection = torch.empty_like(state_dict[key])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

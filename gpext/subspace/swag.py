"""SWA-Gaussian: diagonal plus low-rank Gaussian over weights (Maddox et al. 2019)."""

from __future__ import annotations

import math

import torch

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.subspace.trajectory_collector import TrajectoryCollector
from gpext.subspace.weight_posterior import LowRankGaussianWeightPosterior
from gpext.utils import as_float_tensor, check_finite
from gpext.utils.validation import check_not_low_precision

__all__ = ["SWAG"]


class SWAG(LowRankGaussianWeightPosterior):
    r"""The SWAG posterior :math:`\mathcal{N}(\bar w, \tfrac{1}{2}(\Sigma_{\text{diag}} + \Sigma_{\text{low-rank}}))`.

    From the SWA mean :math:`\bar w`, the diagonal variance
    :math:`\sigma^2 = \overline{w^2} - \bar w^2` and the ``K`` deviations :math:`\hat D`
    actually collected (rows),

    .. math::

        \Sigma_{\text{diag}} = \operatorname{diag}(\sigma^2), \qquad
        \Sigma_{\text{low-rank}} = \frac{\hat D^\top \hat D}{K - 1}, \qquad
        w = \bar w + \sqrt{\text{scale}}\Big(\Sigma_{\text{diag}}^{1/2} z_1
            + \frac{\hat D^\top z_2}{\sqrt{K - 1}}\Big),

    :math:`z_1 \sim \mathcal{N}(0, I_D)`, :math:`z_2 \sim \mathcal{N}(0, I_K)`, so the sample
    covariance is ``scale`` times :math:`\Sigma_{\text{diag}} + \Sigma_{\text{low-rank}}`
    (:meth:`covariance`, a low-rank-plus-diagonal LinearOperator). ``scale = 0.5`` is the usual
    choice. ``K - 1`` counts the deviations really collected, not the buffer size.  SWAG is a
    :class:`~gpext.subspace.LowRankGaussianWeightPosterior` with
    :math:`F = \hat D^\top / \sqrt{K - 1}` and :math:`\psi = \sigma^2`, so it
    also has :meth:`log_prob` (with ``diagonal=True``) and mixes with other weight posteriors in
    :class:`~gpext.subspace.WeightMixture`.

    The variance is best passed directly (``variance=``, as :meth:`from_trajectory` does with
    the collector's Welford moments): recomputing it as :math:`\overline{w^2} - \bar w^2` from
    a float32 ``sq_mean`` loses it when :math:`|w|` is large against its spread. A ``sq_mean``
    is still accepted and subtracted in float64.

    Args:
        mean: SWA mean. # shape: (D,)
        sq_mean: Running mean of squared weights, or ``None`` with ``variance``. # shape: (D,)
        deviations: Deviations, one per row (``K >= 2``). # shape: (K, D)
        variance: Diagonal variance :math:`\sigma^2` instead of ``sq_mean``. # shape: (D,)
        diagonal: Include :math:`\Sigma_{\text{diag}}` (``False``: low-rank only).
        scale: Default covariance scale of :meth:`sample`, :meth:`covariance` and
            :meth:`log_prob`.

    Raises:
        ShapeError: On inconsistent shapes.
        InputDataError: With fewer than two deviations, no weights, non-finite inputs, a
            negative variance, or not exactly one of ``sq_mean`` and ``variance``.
        InputTypeError: For non-numeric or float16 / bfloat16 inputs.

    Example:
        >>> traj = TrajectoryCollector(torch.nn.Linear(3, 1), max_deviations=5)
        >>> for _ in range(4):
        ...     _ = traj.collect(torch.randn(4))
        >>> SWAG.from_trajectory(traj).sample(2).shape
        torch.Size([2, 4])
    """

    def __init__(
        self,
        mean: torch.Tensor,
        sq_mean: torch.Tensor | None,
        deviations: torch.Tensor,
        *,
        variance: torch.Tensor | None = None,
        diagonal: bool = True,
        scale: float = 0.5,
    ) -> None:
        super().__init__()
        if (sq_mean is None) == (variance is None):
            raise InputDataError(
                expected_got(
                    "SWAG(sq_mean, variance)",
                    "exactly one of them",
                    "both" if sq_mean is not None else "neither",
                    "Pass variance=trajectory.variance (or use SWAG.from_trajectory).",
                )
            )
        # numpy arrays and sequences are accepted like tensors (the mean's dtype for the rest)
        for name, value in (("mean", mean), ("sq_mean", sq_mean), ("variance", variance),
                            ("deviations", deviations)):  # fmt: skip
            if isinstance(value, torch.Tensor):
                check_not_low_precision(value, f"SWAG({name})")
        mean = as_float_tensor(mean, "SWAG(mean)")
        if sq_mean is not None:
            sq_mean = as_float_tensor(sq_mean, "SWAG(sq_mean)", dtype=mean.dtype).to(mean.device)
        if variance is not None:
            variance = as_float_tensor(variance, "SWAG(variance)", dtype=mean.dtype).to(mean.device)
        deviations = as_float_tensor(deviations, "SWAG(deviations)", dtype=mean.dtype).to(
            mean.device
        )
        second, second_name = (sq_mean, "sq_mean") if variance is None else (variance, "variance")
        if mean.dim() != 1 or second.shape != mean.shape:
            raise ShapeError(
                expected_got(
                    f"SWAG(mean, {second_name})",
                    "two vectors of equal length",
                    (tuple(mean.shape), tuple(second.shape)),
                )
            )
        if deviations.dim() != 2 or deviations.shape[-1] != mean.shape[0]:
            raise ShapeError(
                expected_got(
                    "SWAG(deviations)", f"shape (K, {mean.shape[0]})", tuple(deviations.shape)
                )
            )
        if mean.shape[0] == 0:
            raise InputDataError(
                expected_got("SWAG(mean)", "at least one weight", "an empty vector")
            )
        if deviations.shape[0] < 2:
            raise InputDataError(
                expected_got(
                    "SWAG(deviations)",
                    "at least 2 collected deviations",
                    deviations.shape[0],
                    "Collect more weights before building SWAG.",
                )
            )
        for name, t in (("mean", mean), (second_name, second), ("deviations", deviations)):
            check_finite(t, f"SWAG({name})")
        if variance is None:
            var = (sq_mean.detach().double() - mean.detach().double() ** 2).to(mean.dtype)
        else:
            if bool((variance < 0).any()):
                raise InputDataError(
                    expected_got(
                        "SWAG(variance)",
                        "non-negative entries",
                        f"minimum {float(variance.min()):.3g}",
                    )
                )
            var = variance.detach().to(mean.dtype)
        self.diagonal = bool(diagonal)
        self.scale = self._scale(scale, "SWAG.scale")
        self.register_buffer("mean", mean.detach().clone())
        self.register_buffer("variance", var.clamp_min(0.0).clone())
        self.register_buffer("deviations", deviations.detach().clone())

    @classmethod
    def from_trajectory(
        cls, trajectory: TrajectoryCollector, *, diagonal: bool = True, scale: float = 0.5
    ) -> SWAG:
        """Build from a :class:`~gpext.subspace.TrajectoryCollector`.

        Raises:
            NotFittedError: If nothing was collected.
            InputDataError: If fewer than two deviations were collected.
        """
        if trajectory.num_collected == 0:
            raise NotFittedError(
                "SWAG.from_trajectory: the trajectory is empty; collect weights first."
            )
        return cls(
            trajectory.mean,
            None,
            trajectory.deviations(),
            variance=trajectory.variance,
            diagonal=diagonal,
            scale=scale,
        )

    @property
    def num_parameters(self) -> int:
        """Number of weights ``D``."""
        return int(self.mean.shape[0])

    @property
    def rank(self) -> int:
        """Number of deviations ``K``."""
        return int(self.deviations.shape[0])

    def factor(self) -> torch.Tensor:
        r""":math:`F = \hat D^\top / \sqrt{K - 1}`. # shape: (D, K)"""
        return self.deviations.mT / math.sqrt(self.rank - 1)

    def diagonal_variance(self) -> torch.Tensor | None:
        r""":math:`\sigma^2 = \overline{w^2} - \bar w^2` with ``diagonal=True``, else ``None``. # shape: (D,)"""
        return self.variance if self.diagonal else None

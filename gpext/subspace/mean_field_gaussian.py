"""Mean-field Gaussian variational distribution over subspace coordinates."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import as_float_tensor, check_finite, check_positive_int
from gpext.utils.validation import check_not_low_precision

__all__ = ["MeanFieldGaussian"]

_STD_FLOOR = 1e-6


class MeanFieldGaussian(nn.Module):
    r"""Variational distribution :math:`q(\theta) = \mathcal{N}(\mu, \operatorname{diag}(s)^2)`.

    :math:`s = \operatorname{softplus}(\rho) + 10^{-6}`. Samples are reparameterised,
    :math:`\theta = \mu + s \odot \epsilon`, and the KL divergence to the prior
    :math:`\mathcal{N}(0, \sigma_p^2 I)` is in closed form (000 Eq. 10):

    .. math::

        \mathrm{KL}(q \,\|\, p) = \sum_{j=1}^r \Big[\log\frac{\sigma_p}{s_j}
            + \frac{s_j^2 + \mu_j^2}{2\sigma_p^2} - \frac12\Big].

    Args:
        dim: Dimension ``r``.
        init_std: Initial standard deviation.
        dtype: Dtype of the parameters.

    Example:
        >>> q = MeanFieldGaussian(3, init_std=0.1)
        >>> q.rsample(4).shape
        torch.Size([4, 3])
    """

    def __init__(
        self, dim: int, *, init_std: float = 0.05, dtype: torch.dtype = torch.float64
    ) -> None:
        super().__init__()
        self.dim = check_positive_int(dim, "MeanFieldGaussian.dim")
        if not init_std > _STD_FLOOR:
            raise InputDataError(
                expected_got("MeanFieldGaussian.init_std", f"a number > {_STD_FLOOR}", init_std)
            )
        rho0 = math.log(math.expm1(init_std - _STD_FLOOR))
        self.loc = nn.Parameter(torch.zeros(self.dim, dtype=dtype))
        self.rho = nn.Parameter(torch.full((self.dim,), rho0, dtype=dtype))

    @property
    def scale(self) -> torch.Tensor:
        """Standard deviations ``s``. # shape: (r,)"""
        return F.softplus(self.rho) + _STD_FLOOR

    def rsample(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Reparameterised samples. # shape: (S, r)"""
        num_samples = check_positive_int(num_samples, "MeanFieldGaussian.rsample.num_samples")
        eps = torch.randn(num_samples, self.dim, generator=generator, dtype=self.loc.dtype).to(
            self.loc.device
        )
        return self.loc + self.scale * eps

    @torch.no_grad()
    def set_moments(self, loc: torch.Tensor, scale: torch.Tensor) -> None:
        """Set the mean and the standard deviations (clamped to just above the floor).

        Args:
            loc: New mean :math:`\\mu`. # shape: (r,)
            scale: New standard deviations ``s``. # shape: (r,)

        Raises:
            ShapeError: If a shape is not ``(r,)``.
            InputDataError: If an entry is not finite or a standard deviation is negative.
            InputTypeError: If a value is not numeric or is a float16 / bfloat16 tensor.
        """
        checked = []
        for value, name in ((loc, "loc"), (scale, "scale")):
            what = f"MeanFieldGaussian.set_moments({name})"
            if isinstance(value, torch.Tensor):  # other float dtypes go to the model's dtype
                check_not_low_precision(value, what)
            value = as_float_tensor(value, what, dtype=self.loc.dtype).to(self.loc.device)
            checked.append(value)
            if value.shape != (self.dim,):
                raise ShapeError(
                    expected_got(
                        f"MeanFieldGaussian.set_moments({name})",
                        f"shape ({self.dim},)",
                        tuple(value.shape),
                    )
                )
            check_finite(value, what)
        loc, scale = checked
        if not bool((scale >= 0).all()):
            raise InputDataError(
                expected_got(
                    "MeanFieldGaussian.set_moments(scale)", "standard deviations >= 0",
                    f"minimum {float(scale.min()):.3g}",
                )
            )  # fmt: skip
        excess = (scale.to(self.rho) - _STD_FLOOR).clamp_min(1e-3 * _STD_FLOOR)
        # the inverse of softplus, stable for large arguments: s + log(1 - exp(-s))
        self.loc.copy_(loc.to(self.loc))
        self.rho.copy_(excess + torch.log(-torch.expm1(-excess)))

    def kl_divergence(self, prior_std: float) -> torch.Tensor:
        """Closed-form :math:`\\mathrm{KL}(q \\| \\mathcal{N}(0, \\sigma_p^2 I))` (scalar)."""
        if not prior_std > 0:
            raise InputDataError(
                expected_got("MeanFieldGaussian.kl_divergence.prior_std", "a number > 0", prior_std)
            )
        s = self.scale
        return (
            math.log(prior_std) - s.log() + (s**2 + self.loc**2) / (2 * prior_std**2) - 0.5
        ).sum()

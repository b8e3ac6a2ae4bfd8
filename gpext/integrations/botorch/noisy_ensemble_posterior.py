r"""The predictive of an ensemble adapter with observation noise: a mixture of Gaussians."""

from __future__ import annotations

import torch
from botorch.posteriors.ensemble import EnsemblePosterior
from torch.distributions.multinomial import Multinomial

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got

__all__ = ["NoisyEnsemblePosterior"]


def _take_members(values: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Member ``indices`` of ``values``, one member per sample and batch element.

    Args:
        values: Member values. # shape: (*batch, S, q, m)
        indices: Member indices. # shape: (*sample, *batch)

    Returns:
        ``out[i, b] = values[b, indices[i, b]]``. # shape: (*sample, *batch, q, m)
    """
    q, m = values.shape[-2:]
    shape = indices.shape + values.shape[-3:]
    expanded = values.expand(shape)
    index = indices[..., None, None, None].expand(*indices.shape, 1, q, m)
    return expanded.gather(-3, index).squeeze(-3)


class NoisyEnsemblePosterior(EnsemblePosterior):
    r"""Members plus Gaussian observation noise: a mixture of ``S`` Gaussians at the ``q`` points.

    With member values :math:`f^{(s)}(X)` (``values``), member noise variances
    :math:`\sigma^2_s(X)` (``noise``, independent across points and outputs) and member weights
    :math:`w_s` (uniform by default), the distribution of the noisy observations
    :math:`\mathbf y(X)` is

    .. math::

        p(\mathbf y(X)) = \sum_{s=1}^S w_s\,
            \mathcal N\big(\mathbf y;\ f^{(s)}(X),\ \operatorname{diag}\sigma^2_s(X)\big),

    and :meth:`rsample` draws from it exactly: a member :math:`s \sim w`, then
    :math:`\mathbf y = f^{(s)}(X) + \sigma_s(X) \odot \boldsymbol\varepsilon`,
    :math:`\boldsymbol\varepsilon \sim \mathcal N(0, I)`.  Its moments follow BoTorch's
    ``EnsemblePosterior`` (whose spread of the members uses reliability weights, i.e. the
    unbiased ``1 / (S - 1)`` for uniform weights) plus the members' mean noise:

    .. math::

        \operatorname{mean} = \sum_s w_s f^{(s)}, \qquad
        \operatorname{variance} = \frac{\sum_s w_s (f^{(s)} - \operatorname{mean})^2}
            {1 - \sum_s w_s^2} + \sum_s w_s \sigma^2_s.

    With ``noise = 0`` it is the plain ``EnsemblePosterior`` of the members.  Deterministic
    Monte Carlo acquisition values need fixed member indices *and* fixed normal draws, so
    ``get_sampler`` returns a :class:`~gpext.integrations.botorch.NoisyEnsembleSampler` for this
    posterior; BoTorch's ``IndexSampler`` (indices only) is refused.

    Args:
        values: Member values (the latent functions). # shape: (*batch, S, q, m)
        noise: Non-negative noise variances, broadcastable to ``values`` with the member
            dimension ``S`` or ``1``. # shape: (*batch, S or 1, q, m)
        weights: Optional member weights. # shape: (S,)

    Raises:
        InputTypeError: If ``noise`` is not a floating tensor.
        ShapeError: If ``noise`` does not broadcast to ``values``.
        InputDataError: If ``noise`` has negative or non-finite entries.

    Example:
        >>> import torch
        >>> from botorch.posteriors.ensemble import EnsemblePosterior
        >>> values = torch.randn(5, 3, 1)  # S = 5 members, q = 3
        >>> post = NoisyEnsemblePosterior(values, torch.full((1, 3, 1), 0.1))
        >>> torch.allclose(post.variance - EnsemblePosterior(values).variance, torch.tensor(0.1))
        True
        >>> post.rsample(torch.Size([4])).shape
        torch.Size([4, 3, 1])
    """

    def __init__(
        self, values: torch.Tensor, noise: torch.Tensor, weights: torch.Tensor | None = None
    ) -> None:
        super().__init__(values=values, weights=weights)
        what = "NoisyEnsemblePosterior.noise"
        if not isinstance(noise, torch.Tensor) or not noise.is_floating_point():
            raise InputTypeError(
                expected_got(what, "a floating torch.Tensor", type(noise).__name__)
            )
        try:
            shape = torch.broadcast_shapes(noise.shape, values.shape)
        except RuntimeError:
            shape = None
        if shape != values.shape or noise.dim() < 3 or noise.shape[-3] not in (1, values.shape[-3]):
            raise ShapeError(
                expected_got(
                    what,
                    f"variances broadcastable to the values' shape {tuple(values.shape)} "
                    "(member dimension S or 1)",
                    tuple(noise.shape),
                )
            )
        if not bool(torch.isfinite(noise).all()) or bool((noise < 0).any()):
            raise InputDataError(
                expected_got(what, "finite non-negative variances", "other values")
            )
        #: Noise variances of the members. # shape: (*batch, S or 1, q, m)
        self.noise = noise.to(values)

    @property
    def noise_variance(self) -> torch.Tensor:
        r"""Mean noise of the members, :math:`\sum_s w_s \sigma^2_s`. # shape: (*b, q, m)"""
        noise = self.noise.expand(*self.values.shape[:-3], *self.noise.shape[-3:])
        if noise.shape[-3] == 1:
            return noise.squeeze(-3)
        return (noise * self.weights[..., None, None]).sum(dim=-3)

    @property
    def variance(self) -> torch.Tensor:
        """Spread of the members plus their mean noise variance. # shape: (*batch, q, m)"""
        return super().variance + self.noise_variance

    @property
    def mixture_variance(self) -> torch.Tensor:
        """``mixture_variance`` of the members plus the mixture-weighted noise. # shape: (q, m)"""
        noise = self.noise.expand(self.values.shape)
        weights = self.mixture_weights[..., None, None]
        return super().mixture_variance + (weights * noise).sum(dim=self.mixture_dims)

    def _noise_sd(self) -> torch.Tensor:
        # clamped so that the square root has a finite gradient at zero noise
        tiny = torch.finfo(self.noise.dtype).tiny
        return self.noise.clamp_min(tiny).sqrt().expand(self.values.shape)

    def rsample(self, sample_shape: torch.Size | None = None) -> torch.Tensor:
        r"""Draws from the mixture (with gradients through the members and the noise scale).

        Args:
            sample_shape: Sample shape (default ``torch.Size([1])``).

        Returns:
            Samples. # shape: (*sample_shape, *batch, q, m)
        """
        if sample_shape is None or len(sample_shape) == 0:
            sample_shape = torch.Size([1])
        shape = self._extended_shape(sample_shape)
        if self.values.numel() == 0:
            return torch.empty(shape, dtype=self.dtype, device=self.device)
        indices = (
            Multinomial(probs=self.mixture_weights).sample(sample_shape=sample_shape).argmax(-1)
        )
        normals = torch.randn(shape, dtype=self.dtype, device=self.device)
        return self.rsample_from_base_samples(sample_shape, indices, noise_base_samples=normals)

    def rsample_from_base_samples(
        self,
        sample_shape: torch.Size,
        base_samples: torch.Tensor,
        noise_base_samples: torch.Tensor | None = None,
    ) -> torch.Tensor:
        r"""Draws from fixed member indices and fixed standard-normal noise draws.

        .. math::

            \mathbf y_i = f^{(s_i)}(X) + \sigma_{s_i}(X) \odot \boldsymbol\varepsilon_i

        Args:
            sample_shape: Sample shape.
            base_samples: Member indices :math:`s_i`. # shape: (*sample_shape, *batch)
            noise_base_samples: Standard normal :math:`\boldsymbol\varepsilon_i`.
                # shape: (*sample_shape, *batch, q, m)

        Returns:
            Samples. # shape: (*sample_shape, *batch, q, m)

        Raises:
            InputDataError: If ``noise_base_samples`` is missing (BoTorch's ``IndexSampler``
                only has indices; use ``get_sampler``, which gives a
                :class:`~gpext.integrations.botorch.NoisyEnsembleSampler`).
            ShapeError: If the base samples have the wrong shapes.
        """
        if noise_base_samples is None:
            raise InputDataError(
                "NoisyEnsemblePosterior.rsample_from_base_samples: expected member indices and "
                "normal noise draws, got indices only (BoTorch's IndexSampler). Sample with "
                "botorch.sampling.get_sampler(posterior, sample_shape) (a NoisyEnsembleSampler), "
                "or use observation_noise=False for the members alone."
            )
        shape = self._extended_shape(sample_shape)
        if tuple(base_samples.shape) != tuple(sample_shape + self.batch_shape):
            raise ShapeError(
                expected_got(
                    "NoisyEnsemblePosterior.rsample_from_base_samples(base_samples)",
                    f"member indices of shape {tuple(sample_shape + self.batch_shape)}",
                    tuple(base_samples.shape),
                )
            )
        if tuple(noise_base_samples.shape) != tuple(shape):
            raise ShapeError(
                expected_got(
                    "NoisyEnsemblePosterior.rsample_from_base_samples(noise_base_samples)",
                    f"normal draws of shape {tuple(shape)}",
                    tuple(noise_base_samples.shape),
                )
            )
        indices = base_samples.to(device=self.device, dtype=torch.long)
        members = _take_members(self.values, indices)
        sd = _take_members(self._noise_sd(), indices)
        return members + sd * noise_base_samples.to(members)

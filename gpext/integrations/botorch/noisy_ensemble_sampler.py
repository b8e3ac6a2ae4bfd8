r"""The BoTorch sampler of :class:`~gpext.integrations.botorch.NoisyEnsemblePosterior`."""

from __future__ import annotations

import torch
from botorch.posteriors.ensemble import EnsemblePosterior
from botorch.sampling.base import MCSampler
from botorch.sampling.get_sampler import GetSampler
from torch.distributions.multinomial import Multinomial

from gpext.errors import InputTypeError, expected_got
from gpext.integrations.botorch.noisy_ensemble_posterior import NoisyEnsemblePosterior

__all__ = ["NoisyEnsembleSampler"]


class NoisyEnsembleSampler(MCSampler):
    r"""Fixed member indices and fixed normal draws for an ensemble posterior with noise.

    The ``i``-th sample of a :class:`~gpext.integrations.botorch.NoisyEnsemblePosterior` is
    :math:`f^{(s_i)}(X) + \sigma_{s_i}(X) \odot \boldsymbol\varepsilon_i`; the sampler draws
    the indices :math:`s_i \sim w` (as BoTorch's ``IndexSampler``) and the standard normal
    :math:`\boldsymbol\varepsilon_i` once, from ``seed``, and reuses them while the posterior's
    shapes stay the same, so Monte Carlo acquisition values are deterministic in ``X``
    (sample average approximation).  ``botorch.sampling.get_sampler`` returns this sampler
    for a ``NoisyEnsemblePosterior``.  On a plain ``EnsemblePosterior`` it acts as an
    ``IndexSampler``.

    Args:
        sample_shape: The sample shape.
        seed: Seed of the base samples (default a random one, as BoTorch's samplers).

    Example:
        >>> import torch
        >>> from gpext.integrations.botorch import NoisyEnsemblePosterior
        >>> values = torch.randn(2, 5, 3, 1)  # batch 2, S = 5 members, q = 3
        >>> post = NoisyEnsemblePosterior(values, torch.full((2, 1, 3, 1), 0.1))
        >>> sampler = NoisyEnsembleSampler(torch.Size([64]), seed=0)
        >>> sampler(post).shape
        torch.Size([64, 2, 3, 1])
        >>> torch.equal(sampler(post), sampler(post))  # fixed base samples
        True
    """

    #: Standard normal draws of the noise. # shape: (*sample_shape, *batch, q, m)
    noise_base_samples: torch.Tensor | None

    def __init__(self, sample_shape: torch.Size, seed: int | None = None) -> None:
        super().__init__(sample_shape=sample_shape, seed=seed)
        self.register_buffer("noise_base_samples", None)

    def forward(self, posterior: EnsemblePosterior) -> torch.Tensor:
        """Draws ``sample_shape`` samples from ``posterior`` with the stored base samples.

        Args:
            posterior: A ``NoisyEnsemblePosterior`` (or a plain ``EnsemblePosterior``).

        Returns:
            Samples. # shape: (*sample_shape, *batch, q, m)

        Raises:
            InputTypeError: If ``posterior`` is not an ``EnsemblePosterior``.
        """
        if not isinstance(posterior, EnsemblePosterior):
            raise InputTypeError(
                expected_got(
                    "NoisyEnsembleSampler(posterior)",
                    "an EnsemblePosterior or NoisyEnsemblePosterior",
                    type(posterior).__name__,
                )
            )
        self._construct_base_samples(posterior)
        if not isinstance(posterior, NoisyEnsemblePosterior):
            return posterior.rsample_from_base_samples(self.sample_shape, self.base_samples)
        return posterior.rsample_from_base_samples(
            self.sample_shape, self.base_samples, noise_base_samples=self.noise_base_samples
        )

    def _construct_base_samples(self, posterior: EnsemblePosterior) -> None:
        index_shape = self.sample_shape + posterior.batch_shape
        noise_shape = posterior._extended_shape(self.sample_shape)
        if (
            self.base_samples is None
            or self.base_samples.shape != index_shape
            or self.noise_base_samples is None
            or self.noise_base_samples.shape != noise_shape
        ):
            with torch.random.fork_rng():
                torch.manual_seed(self.seed)
                indices = (
                    Multinomial(probs=posterior.mixture_weights.detach().cpu())
                    .sample(sample_shape=self.sample_shape)
                    .argmax(dim=-1)
                )
                normals = torch.randn(noise_shape, dtype=posterior.dtype)
            self.register_buffer("base_samples", indices.to(posterior.device))
            self.register_buffer("noise_base_samples", normals.to(posterior.device))
        if self.noise_base_samples.dtype != posterior.dtype:
            self.noise_base_samples = self.noise_base_samples.to(posterior.dtype)

    def _update_base_samples(self, posterior: EnsemblePosterior, base_sampler: MCSampler) -> None:
        r"""No-op, as BoTorch's ``IndexSampler`` (``CachedCholeskyAcquisitionFunction`` hook)."""


@GetSampler.register(NoisyEnsemblePosterior)
def _get_sampler_noisy_ensemble(
    posterior: NoisyEnsemblePosterior, sample_shape: torch.Size, *, seed: int | None = None
) -> NoisyEnsembleSampler:
    """BoTorch's ``get_sampler`` for the noisy ensemble posterior."""
    return NoisyEnsembleSampler(sample_shape=sample_shape, seed=seed)

"""Bayesian inference over a weight subspace :math:`w = \\hat w + P^\\top\\theta` (000 Eq. 1-6, 9-10)."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.subspace.bayesian_model_averaging import predict_weight_samples
from gpext.subspace.elliptical_slice_sampler import EllipticalSliceSampler
from gpext.subspace.flat_parameters import FlatParameters
from gpext.subspace.mean_field_gaussian import MeanFieldGaussian
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.utils import check_finite, check_positive_int, progress_bar

__all__ = ["SubspaceModel"]


class SubspaceModel(nn.Module):
    r"""A network restricted to an affine weight subspace, with ESS and mean-field VI over it.

    .. math::

        w(\theta) = \hat w + P^\top \theta, \qquad
        p(\theta \mid \mathcal{D}) \propto \exp\Big(\frac{1}{T}\sum_{n=1}^N
            \log p(y_n \mid f_{w(\theta)}(x_n))\Big)\, \mathcal{N}(\theta; 0, \sigma_p^2 I_r)

    (000 Eq. 2-4, 9; the temperature :math:`T` tempers the likelihood against posterior
    concentration). :meth:`sample_ess` draws from it by elliptical slice sampling;
    :meth:`fit_vi` maximises the tempered ELBO (000 Eq. 5, 10)

    .. math::

        \mathcal{L}(\mu, \rho) = \frac{1}{T}\,\mathbb{E}_{q}\Big[\sum_n \log p(y_n \mid
            f_{w(\theta)}(x_n))\Big] - \mathrm{KL}\big(q \,\|\, \mathcal{N}(0, \sigma_p^2 I)\big)

    with reparameterised samples and Adam; :meth:`predict` returns per-sample predictions for
    Bayesian model averaging. The network is evaluated functionally (``torch.func``) in eval
    mode; its own parameters are not changed.

    Args:
        module: The network.
        center: Subspace centre :math:`\hat w` (usually the SWA mean). # shape: (D,)
        projection: Projection ``P``. # shape: (r, D)
        likelihood: How to read the network's output.
        prior_std: Prior standard deviation :math:`\sigma_p`.
        temperature: Likelihood temperature :math:`T`.

    Example:
        >>> model = SubspaceModel(net, swa, pca.projection, OutputLikelihood("gaussian"))  # doctest: +SKIP
        >>> thetas = model.sample_ess(x, y, 30)                                              # doctest: +SKIP
        >>> pred = model.predict(x_test, thetas)                                             # doctest: +SKIP
    """

    def __init__(
        self,
        module: nn.Module,
        center: torch.Tensor,
        projection: torch.Tensor,
        likelihood: OutputLikelihood,
        *,
        prior_std: float = 1.0,
        temperature: float = 1.0,
    ) -> None:
        super().__init__()
        self.flat = FlatParameters(module)
        self.module = module.eval()
        d = self.flat.num_parameters
        self.flat.check_vector(center, "SubspaceModel.center")
        if projection.dim() != 2 or projection.shape[-1] != d or projection.shape[0] < 1:
            raise ShapeError(
                expected_got("SubspaceModel.projection", f"shape (r, {d})", tuple(projection.shape))
            )
        check_finite(center, "SubspaceModel.center")
        check_finite(projection, "SubspaceModel.projection")
        if not isinstance(likelihood, OutputLikelihood):
            raise InputDataError(
                expected_got(
                    "SubspaceModel.likelihood", "an OutputLikelihood", type(likelihood).__name__
                )
            )
        if not (prior_std > 0 and temperature > 0):
            raise InputDataError(
                expected_got(
                    "SubspaceModel", "prior_std > 0 and temperature > 0", (prior_std, temperature)
                )
            )
        self.register_buffer("center", center.detach().clone())
        self.register_buffer("projection", projection.detach().to(center.dtype).clone())
        self.likelihood = likelihood
        self.prior_std = float(prior_std)
        self.temperature = float(temperature)
        self.variational: MeanFieldGaussian | None = None

    @property
    def rank(self) -> int:
        """Subspace dimension ``r``."""
        return int(self.projection.shape[0])

    def weights(self, theta: torch.Tensor) -> torch.Tensor:
        """Full weights :math:`\\hat w + P^\\top\\theta`. ``(r,) -> (D,)`` or ``(S, r) -> (S, D)``."""
        if theta.shape[-1] != self.rank or theta.dim() > 2:
            raise ShapeError(
                expected_got(
                    "SubspaceModel.weights(theta)",
                    f"shape ({self.rank},) or (S, {self.rank})",
                    tuple(theta.shape),
                )
            )
        return self.center + theta.to(self.center) @ self.projection

    def log_likelihood(self, theta: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Untempered :math:`\\sum_n \\log p(y_n \\mid f_{w(\\theta)}(x_n))` (differentiable in ``theta``).

        Args:
            theta: # shape: (r,)
            x: Inputs. # shape: (N, ...)
            y: Targets. # shape: (N,)

        Returns:
            Scalar tensor.
        """
        out = self.flat.functional_call(self.weights(theta), x)
        return self.likelihood.log_prob(out, y).sum()

    def sample_ess(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        num_samples: int,
        *,
        burn_in: int = 0,
        thin: int = 1,
        initial: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> torch.Tensor:
        """Elliptical slice samples of :math:`\\theta` from the tempered posterior.

        Args:
            x: Training inputs. # shape: (N, ...)
            y: Training targets. # shape: (N,)
            num_samples: Number of returned samples ``S``.
            burn_in: Transitions discarded first.
            thin: Keep every ``thin``-th state.
            initial: Initial ``theta`` (default 0, the centre).
            generator: Random generator.
            show_progress: Progress bar.

        Returns:
            Samples. # shape: (S, r)
        """
        self._check_data(x, y)
        sampler = EllipticalSliceSampler(
            lambda t: self.log_likelihood(t, x, y) / self.temperature,
            self.rank,
            prior_std=self.prior_std,
            dtype=self.center.dtype,
            generator=generator,
        )
        return sampler.sample(
            num_samples, initial=initial, burn_in=burn_in, thin=thin, show_progress=show_progress
        )

    def fit_vi(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        *,
        num_steps: int = 1000,
        lr: float = 1e-2,
        num_mc: int = 1,
        batch_size: int | None = None,
        init_std: float = 0.05,
        final_lr_ratio: float = 0.01,
        generator: torch.Generator | None = None,
        show_progress: bool | None = None,
    ) -> MeanFieldGaussian:
        """Fit the mean-field Gaussian :math:`q(\\theta)` by maximising the tempered ELBO.

        Args:
            x: Training inputs. # shape: (N, ...)
            y: Training targets. # shape: (N,)
            num_steps: Adam steps.
            lr: Adam learning rate.
            num_mc: Monte Carlo samples per step.
            batch_size: Mini-batch size (``None``: full batch); the likelihood is rescaled by
                ``N / batch_size``.
            init_std: Initial standard deviation of ``q``.
            final_lr_ratio: The learning rate is annealed (cosine) from ``lr`` to
                ``lr * final_lr_ratio``, so the final iterate does not jitter at the scale of
                ``lr`` (1 keeps it constant).
            generator: Random generator for the samples and the mini-batches.
            show_progress: Progress bar.

        Returns:
            The fitted :class:`MeanFieldGaussian` (also stored as :attr:`variational`).
        """
        self._check_data(x, y)
        num_steps = check_positive_int(num_steps, "SubspaceModel.fit_vi.num_steps")
        num_mc = check_positive_int(num_mc, "SubspaceModel.fit_vi.num_mc")
        n = x.shape[0]
        bs = (
            n
            if batch_size is None
            else min(check_positive_int(batch_size, "SubspaceModel.fit_vi.batch_size"), n)
        )
        q = MeanFieldGaussian(self.rank, init_std=init_std, dtype=self.center.dtype).to(
            self.center.device
        )
        opt = torch.optim.Adam(q.parameters(), lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(
            opt, num_steps, eta_min=lr * final_lr_ratio
        )
        for _ in progress_bar(range(num_steps), desc="VI", show=show_progress):
            if bs < n:
                idx = torch.randperm(n, generator=generator)[:bs].to(x.device)
                xb, yb = x[idx], y[idx]
            else:
                xb, yb = x, y
            thetas = q.rsample(num_mc, generator=generator)
            ll = torch.stack([self.log_likelihood(t, xb, yb) for t in thetas]).mean() * (n / bs)
            loss = -(ll / self.temperature - q.kl_divergence(self.prior_std))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
        self.variational = q
        return q

    def sample_vi(
        self, num_samples: int, *, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Samples of :math:`\\theta` from the fitted ``q``. # shape: (S, r)"""
        if self.variational is None:
            raise NotFittedError("SubspaceModel.sample_vi: call fit_vi first.")
        with torch.no_grad():
            return self.variational.rsample(num_samples, generator=generator)

    def predict(
        self, x: torch.Tensor, thetas: torch.Tensor, *, bn_inputs: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """Per-sample predictions for Bayesian model averaging.

        Args:
            x: Test inputs. # shape: (N, ...)
            thetas: Subspace samples. # shape: (S, r)
            bn_inputs: Training inputs for refreshing batch-norm statistics per sample.

        Returns:
            ``{"means", "variances"}`` of shape ``(S, N)`` or ``{"probs"}`` of shape
            ``(S, N, C)``; see :func:`~gpext.subspace.regression_mixture_moments`.
        """
        if thetas.dim() != 2:
            raise ShapeError(
                expected_got(
                    "SubspaceModel.predict(thetas)", f"shape (S, {self.rank})", tuple(thetas.shape)
                )
            )
        return predict_weight_samples(
            self.module, self.weights(thetas), x, self.likelihood, bn_inputs=bn_inputs
        )

    def _check_data(self, x: torch.Tensor, y: torch.Tensor) -> None:
        if x.shape[0] != y.shape[0] or x.shape[0] == 0:
            raise ShapeError(
                expected_got(
                    "SubspaceModel(x, y)",
                    "equal, non-zero numbers of rows",
                    (tuple(x.shape), tuple(y.shape)),
                )
            )

"""Online factor analysis of weight iterates by online EM or online SGA (004, Chapter 4)."""

from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from gpext.errors import (
    InputDataError,
    NotFittedError,
    NumericalError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.utils import as_float_tensor, check_finite, check_float_dtype, check_positive_int

__all__ = ["OnlineFactorAnalysis"]

_METHODS = ("em", "sga")


class OnlineFactorAnalysis(nn.Module):
    r"""A factor-analysis Gaussian :math:`\mathcal{N}(c, F F^\top + \Psi)` fitted one sample at a time.

    The model (004 Eq. 2.1-2.3) is :math:`\theta = F h + c + \varepsilon`,
    :math:`h \sim \mathcal{N}(0, I_K)`, :math:`\varepsilon \sim \mathcal{N}(0, \Psi)`,
    :math:`\Psi = \operatorname{diag}(\psi)`. For each observation, with the running mean
    :math:`\bar\theta_t` and :math:`d_t = \theta_t - \bar\theta_t` (004 Eq. 4.23),

    .. math::

        C = (F \odot \psi^{-1})^\top, \quad \Sigma = (I + C F)^{-1}, \quad m_t = \Sigma C d_t .

    * ``method="em"`` (004 Algorithm 2, Eq. 4.32-4.36): running averages
      :math:`\bar A_t` of :math:`d_t m_t^\top`, :math:`\bar B_t` of :math:`m_t m_t^\top` and
      :math:`\bar{d^2_t}`; :math:`\bar H_t = \Sigma + \bar B_t`, :math:`F = \bar A_t \bar H_t^{-1}`,
      :math:`\psi = \bar{d^2_t} + \operatorname{rowsum}((F \bar H_t) \odot F - 2 F \odot \bar A_t)`.
      The running averages use the step :math:`\gamma_t = 1/t` of 004 (``step_weight=0``) or,
      after the warm-up, the polynomial-decay weights :math:`\gamma_t = (\eta + 1)/(t + \eta)`
      (``step_weight`` :math:`= \eta > 0`; Shamir & Zhang 2013), which give observation
      :math:`s` a weight proportional to :math:`s^\eta`. With :math:`1/t` every statistic keeps
      weight :math:`1/T` for ever, so the statistics gathered while :math:`F` is still far from
      the solution (e.g. latent means :math:`m_t` under the random initial :math:`F`) bias
      :math:`\bar A_T, \bar B_T` for the whole run; :math:`\eta > 0` forgets that transient
      at the price of a variance larger by :math:`(\eta+1)^2/(2\eta+1)`. On 004 Algorithm 3
      models (``benchmarks/online_fa.py``) :math:`\eta = 1` helps at ``D / K = 10`` and hurts
      at ``D / K = 100``, so the default stays the thesis's :math:`1/t`.
    * ``method="sga"`` (004 Algorithm 1, Eq. 4.24-4.26): one gradient-ascent step of size
      ``learning_rate`` on :math:`F` and on :math:`\beta = \log\psi`.

    During the first ``warmup`` observations only the running averages are updated; :math:`F`
    (initialised with orthonormal columns, 004 Sec. 4.3) and :math:`\psi = 1` stay fixed.

    Keeping :math:`\psi` positive: the EM formula is a difference of running averages and can
    become zero or negative (e.g. constant coordinates, or estimates that lag behind a drifting
    mean); it is floored at ``psi_min`` (relative to the mean of :math:`\bar{d^2_t}`, with an
    absolute floor ``tiny``). For SGA :math:`\beta` is clamped to
    :math:`[\log \psi_{\min}, \log \psi_{\max}]`. Both are counted in :attr:`num_psi_clamped`.

    Args:
        dim: Observation dimension ``D``.
        latent_dim: Number of factors ``K``.
        method: ``"em"`` or ``"sga"``.
        learning_rate: SGA step size (004 uses ``1e-3``).
        warmup: Number of warm-up observations (004 uses 100).
        step_weight: :math:`\eta \ge 0` of the EM step after the warm-up (0: 004's ``1/t``).
        psi_min: Relative floor of :math:`\psi`.
        psi_max: Upper bound of :math:`\psi` in SGA.
        dtype: Dtype of the state.
        device: Device of the state.
        generator: Random generator for the initial ``F``.

    Example:
        >>> fa = OnlineFactorAnalysis(dim=20, latent_dim=3)
        >>> fa.update(torch.randn(500, 20, dtype=torch.float64))
        OnlineFactorAnalysis()
        >>> fa.covariance().shape
        torch.Size([20, 20])
    """

    def __init__(
        self,
        dim: int,
        latent_dim: int,
        method: str = "em",
        *,
        learning_rate: float = 1e-3,
        warmup: int = 100,
        step_weight: float = 0.0,
        psi_min: float = 1e-6,
        psi_max: float = 1e8,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.dim = check_positive_int(dim, "OnlineFactorAnalysis.dim")
        self.latent_dim = check_positive_int(latent_dim, "OnlineFactorAnalysis.latent_dim")
        if self.latent_dim > self.dim:
            raise InputDataError(
                expected_got("OnlineFactorAnalysis.latent_dim", f"at most dim={dim}", latent_dim)
            )
        if method not in _METHODS:
            raise InputDataError(
                expected_got("OnlineFactorAnalysis.method", f"one of {_METHODS}", repr(method))
            )
        if not (learning_rate > 0 and 0 < psi_min < psi_max):
            raise InputDataError(
                expected_got(
                    "OnlineFactorAnalysis",
                    "learning_rate > 0 and 0 < psi_min < psi_max",
                    (learning_rate, psi_min, psi_max),
                )
            )
        if not (step_weight >= 0 and math.isfinite(step_weight)):
            raise InputDataError(
                expected_got(
                    "OnlineFactorAnalysis.step_weight", "a finite number >= 0", step_weight
                )
            )
        self.method = method
        self.step_weight = float(step_weight)
        self.learning_rate = float(learning_rate)
        self.warmup = check_positive_int(warmup, "OnlineFactorAnalysis.warmup", minimum=0)
        self.psi_min, self.psi_max = float(psi_min), float(psi_max)
        check_float_dtype(dtype, "OnlineFactorAnalysis.dtype")
        kw = {
            "dtype": dtype,
            "device": torch.device("cpu") if device is None else torch.device(device),
        }
        a = torch.randn(self.dim, self.latent_dim, generator=generator, dtype=dtype).to(
            kw["device"]
        )
        q, _ = torch.linalg.qr(a)
        self.register_buffer("loadings", q)  # F, shape: (D, K)
        self.register_buffer("psi", torch.ones(self.dim, **kw))
        self.register_buffer("mean", torch.zeros(self.dim, **kw))
        self.register_buffer("_a_bar", torch.zeros(self.dim, self.latent_dim, **kw))
        self.register_buffer("_b_bar", torch.zeros(self.latent_dim, self.latent_dim, **kw))
        self.register_buffer("_d2_bar", torch.zeros(self.dim, **kw))
        self.register_buffer("num_observations_", torch.zeros((), dtype=torch.long))
        self.register_buffer("num_psi_clamped_", torch.zeros((), dtype=torch.long))

    @property
    def num_observations(self) -> int:
        """Number of observations seen ``t``."""
        return int(self.num_observations_)

    @property
    def num_psi_clamped(self) -> int:
        """How many entries of :math:`\\psi` were floored or clamped so far."""
        return int(self.num_psi_clamped_)

    def update(self, theta: torch.Tensor) -> OnlineFactorAnalysis:
        """Process observations one at a time, in order.

        Args:
            theta: One observation or several. # shape: (D,) or (T, D)

        Returns:
            ``self``.

        Raises:
            ShapeError: If the last dimension is not ``D``.
            InputDataError: If an observation is not finite (the state is left unchanged).
            NumericalError: If the update produced non-finite values.
        """
        x = as_float_tensor(theta, "OnlineFactorAnalysis.update(theta)", dtype=self.mean.dtype).to(
            self.mean.device
        )
        x = x.unsqueeze(0) if x.dim() == 1 else x
        if x.dim() != 2 or x.shape[-1] != self.dim:
            raise ShapeError(
                expected_got(
                    "OnlineFactorAnalysis.update(theta)", f"shape (T, {self.dim})", tuple(x.shape)
                )
            )
        check_finite(x, "OnlineFactorAnalysis.update(theta)")
        with torch.no_grad():
            self._run(x)
        return self

    def _run(self, x: torch.Tensor) -> None:
        # the state is read into locals: nn.Module attribute access dominates tiny-op loops
        mean, f, psi = self.mean.clone(), self.loadings.clone(), self.psi.clone()
        a_bar, b_bar, d2_bar = self._a_bar.clone(), self._b_bar.clone(), self._d2_bar.clone()
        t0, clamped = self.num_observations, 0
        eye = torch.eye(self.latent_dim, dtype=f.dtype, device=f.device)
        lr, em, eta = self.learning_rate, self.method == "em", self.step_weight
        lo, hi = math.log(self.psi_min), math.log(self.psi_max)
        tiny = torch.finfo(f.dtype).tiny
        for i, theta in enumerate(x):
            t = t0 + i + 1
            mean += (theta - mean) / t
            d = theta - mean  # shape: (D,)
            c = (f / psi.unsqueeze(-1)).mT  # shape: (K, D)
            sigma = torch.linalg.inv(eye + c @ f)  # shape: (K, K)
            m = sigma @ (c @ d)  # shape: (K,)
            if em:
                gamma = 1.0 / t if t <= self.warmup else (eta + 1.0) / (t + eta)
                b_bar += gamma * (torch.outer(m, m) - b_bar)
                a_bar += gamma * (torch.outer(d, m) - a_bar)
                d2_bar += gamma * (d * d - d2_bar)
                if t <= self.warmup:
                    continue
                h = sigma + b_bar
                f_new = torch.linalg.solve(h, a_bar.mT).mT  # A H^{-1} (H symmetric)
                psi_new = d2_bar + ((f_new @ h) * f_new - 2 * f_new * a_bar).sum(-1)
                floor = max(self.psi_min * float(d2_bar.mean()), tiny)
                low = psi_new < floor
                clamped += int(low.sum())
                psi_new = psi_new.clamp_min(floor)
            else:
                if t <= self.warmup:
                    continue
                e_hh = sigma + torch.outer(m, m)
                f_ehh = f @ e_hh
                grad_f = (torch.outer(d, m) - f_ehh) / psi.unsqueeze(-1)  # Eq. 4.24
                resid2 = d * d - 2 * d * (f @ m) + (f_ehh * f).sum(-1)
                grad_psi = 0.5 * resid2 / psi**2 - 0.5 / psi  # Eq. 4.25
                beta = psi.log() + lr * grad_psi * psi  # Eq. 4.26
                f_new = f + lr * grad_f
                clamped += int(((beta < lo) | (beta > hi)).sum())
                psi_new = beta.clamp(lo, hi).exp()
            if not (torch.isfinite(f_new).all() and torch.isfinite(psi_new).all()):
                raise NumericalError(
                    f"OnlineFactorAnalysis ({self.method}): non-finite loadings or psi at "
                    f"observation {t}. For SGA lower learning_rate; check the scale of the data."
                )
            f, psi = f_new, psi_new
        self.mean.copy_(mean)
        self.loadings, self.psi = f, psi
        self._a_bar.copy_(a_bar)
        self._b_bar.copy_(b_bar)
        self._d2_bar.copy_(d2_bar)
        self.num_observations_ += x.shape[0]
        self.num_psi_clamped_ += clamped

    def covariance(self) -> torch.Tensor:
        """Dense :math:`F F^\\top + \\operatorname{diag}(\\psi)` (small ``D`` only). # shape: (D, D)"""
        self._check_fitted()
        return self.loadings @ self.loadings.mT + torch.diag(self.psi)

    def sample(
        self,
        num_samples: int,
        *,
        scale: float = 1.0,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        r"""Draw :math:`c + \sqrt{\text{scale}}\,(F z_1 + \psi^{1/2} \odot z_2)`.

        Args:
            num_samples: Number of draws ``S``.
            scale: Covariance scale (0.5 is SWAG's usual choice for weights).
            generator: Random generator.

        Returns:
            Samples. # shape: (S, D)
        """
        self._check_fitted()
        num_samples = check_positive_int(num_samples, "OnlineFactorAnalysis.sample.num_samples")
        if not scale >= 0:
            raise InputDataError(
                expected_got("OnlineFactorAnalysis.sample.scale", "a number >= 0", scale)
            )
        kw = {"dtype": self.mean.dtype, "generator": generator}
        z1 = torch.randn(num_samples, self.latent_dim, **kw).to(self.mean.device)
        z2 = torch.randn(num_samples, self.dim, **kw).to(self.mean.device)
        return self.mean + math.sqrt(scale) * (z1 @ self.loadings.mT + z2 * self.psi.sqrt())

    def _check_fitted(self) -> None:
        if self.num_observations <= self.warmup:
            if self.num_observations == 0:
                raise NotFittedError("OnlineFactorAnalysis: call update(theta) first.")
            warnings.warn(
                f"OnlineFactorAnalysis: only {self.num_observations} observations, not past the "
                f"warm-up of {self.warmup}; F and psi are still their initial values.",
                NumericalWarning,
                stacklevel=3,
            )

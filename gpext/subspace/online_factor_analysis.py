"""Online factor analysis of weight iterates by online EM or online SGA (004, Chapter 4)."""

from __future__ import annotations

import math
import warnings

import torch

from gpext.errors import (
    InputDataError,
    NotFittedError,
    NumericalError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.subspace.weight_posterior import LowRankGaussianWeightPosterior
from gpext.utils import as_float_tensor, check_finite, check_float_dtype, check_positive_int
from gpext.utils.validation import check_not_low_precision

__all__ = ["OnlineFactorAnalysis"]

_METHODS = ("em", "sga")
_STATISTICS = ("consistent", "thesis")


class OnlineFactorAnalysis(LowRankGaussianWeightPosterior):
    r"""A factor-analysis Gaussian :math:`\mathcal{N}(c, F F^\top + \Psi)` fitted one sample at a time.

    The model (004 Eq. 2.1-2.3) is :math:`\theta = F h + c + \varepsilon`,
    :math:`h \sim \mathcal{N}(0, I_K)`, :math:`\varepsilon \sim \mathcal{N}(0, \Psi)`,
    :math:`\Psi = \operatorname{diag}(\psi)`. For each observation, with the running mean
    :math:`\bar\theta_t` and :math:`d_t = \theta_t - \bar\theta_t` (004 Eq. 4.23),

    .. math::

        C = (F \odot \psi^{-1})^\top, \quad \Sigma = (I + C F)^{-1}, \quad m_t = \Sigma C d_t .

    * ``method="em"`` (004 Algorithm 2, Eq. 4.32-4.36, as a stochastic-approximation EM,
      Cappé & Moulines 2009): running averages :math:`\bar A_t` of :math:`d_t m_t^\top`,
      :math:`\bar B_t` of the conditional second moment of the latent variable and
      :math:`\bar{d^2_t}` of :math:`d_t \odot d_t`, then the M-step

      .. math::

          \bar A_t = \bar A_{t-1} + \gamma_t (d_t m_t^\top - \bar A_{t-1}), \quad
          \bar B_t = \bar B_{t-1} + \gamma_t (\Sigma_t + m_t m_t^\top - \bar B_{t-1}),

          F = \bar A_t \bar B_t^{-1}, \quad
          \psi = \bar{d^2_t} - \operatorname{rowsum}(F \odot \bar A_t)
          = \operatorname{diag}(\bar{d d^\top}_t - \bar A_t \bar B_t^{-1} \bar A_t^\top).

      ``statistics="consistent"`` (default) averages :math:`\Sigma_t + m_t m_t^\top`, the
      conditional second moment :math:`E[h h^\top \mid \theta_t]` under the parameters that
      produced :math:`m_t` (Cappé & Moulines' sufficient statistic). Every averaged term
      :math:`E[(d, h)(d, h)^\top \mid \theta_t]` is positive semi-definite, so the Schur complement
      above is too and :math:`\psi \ge 0` holds by construction. ``statistics="thesis"`` is
      004's Eq. 4.32: :math:`\bar B_t` averages :math:`m_t m_t^\top` only and the *current*
      :math:`\Sigma` is added, :math:`\bar H_t = \Sigma + \bar B_t`, which mixes the present
      posterior covariance with posterior means computed under older parameters; the difference
      is not positive semi-definite in general and :math:`\psi` can go negative.

      Step sizes: :math:`\gamma_t = 1/t` (004) up to the burn-in :math:`t_b` (``burnin``; default
      :math:`\max(\text{warmup}, D)`), then the polynomial-decay step
      :math:`\gamma_t = (\eta + 1)/(t + \eta)` (``step_weight`` :math:`= \eta`; Shamir & Zhang
      2013), which gives observation :math:`s` a weight proportional to :math:`s^\eta`. With
      :math:`1/t` the statistics gathered under the random initial :math:`F` keep weight
      :math:`1/T` for ever, and in stochastic-approximation terms the transient decays only like
      :math:`t^{-(1-\lambda)}`, with :math:`\lambda` the linear rate of batch EM (the fraction of
      missing information); :math:`\eta` raises this to :math:`t^{-(\eta+1)(1-\lambda)}` at the
      price of a variance larger by about :math:`(\eta+1)^2/(2\eta+1)` (4/3 for the default
      :math:`\eta = 1`). Before :math:`t_b \approx D` observations the averaged statistics of the
      :math:`D \times K` loadings are mostly noise, and forgetting them then only amplifies it,
      hence the burn-in with :math:`1/t`. ``step_weight=0`` and ``statistics="thesis"`` give
      004's Algorithm 2 exactly.
    * ``method="sga"`` (004 Algorithm 1, Eq. 4.24-4.26): one gradient-ascent step of size
      ``learning_rate`` on :math:`F` and on :math:`\beta = \log\psi`.

    As a weight posterior (``theta`` the weights of an SGD trajectory, 004) it is a
    :class:`~gpext.subspace.LowRankGaussianWeightPosterior` with :math:`F` the loadings and
    :math:`\psi` the diagonal: :meth:`sample`, :meth:`log_prob` (Woodbury) and
    :meth:`covariance` (a low-rank-plus-diagonal LinearOperator), default ``scale`` 1.

    During the first ``warmup`` observations only the running averages are updated; :math:`F`
    (initialised with orthonormal columns, 004 Sec. 4.3) and :math:`\psi = 1` stay fixed.

    Keeping :math:`\psi` positive: with ``statistics="consistent"`` the EM formula is
    non-negative by construction but reaches zero on constant or exactly explained coordinates
    (and can round below it); with ``statistics="thesis"`` it can also go negative when the
    statistics lag behind the parameters. It is floored at ``psi_min`` (relative to the mean of :math:`\bar{d^2_t}`, with an
    absolute floor ``tiny``). For SGA :math:`\beta` is clamped to
    :math:`[\log \psi_{\min}, \log \psi_{\max}]`. Both are counted in :attr:`num_psi_clamped`.

    Args:
        dim: Observation dimension ``D``.
        latent_dim: Number of factors ``K``.
        method: ``"em"`` or ``"sga"``.
        learning_rate: SGA step size (004 uses ``1e-3``).
        warmup: Number of warm-up observations (004 uses 100).
        step_weight: :math:`\eta \ge 0` of the EM step after the burn-in (0: 004's ``1/t``).
        burnin: Observations with the step ``1/t`` before ``step_weight`` applies (``None``:
            ``max(warmup, dim)``).
        statistics: ``"consistent"`` (Cappé & Moulines) or ``"thesis"`` (004 Eq. 4.32); EM only.
        psi_min: Relative floor of :math:`\psi`.
        psi_max: Upper bound of :math:`\psi` in SGA.
        dtype: Dtype of the state.
        device: Device of the state.
        generator: Random generator for the initial ``F``.

    Example:
        >>> fa = OnlineFactorAnalysis(dim=20, latent_dim=3)
        >>> fa.update(torch.randn(500, 20, dtype=torch.float64))
        OnlineFactorAnalysis()
        >>> fa.covariance().to_dense().shape
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
        step_weight: float = 1.0,
        burnin: int | None = None,
        statistics: str = "consistent",
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
        if statistics not in _STATISTICS:
            raise InputDataError(
                expected_got(
                    "OnlineFactorAnalysis.statistics", f"one of {_STATISTICS}", repr(statistics)
                )
            )
        self.method = method
        self.statistics = statistics
        self.step_weight = float(step_weight)
        self.learning_rate = float(learning_rate)
        self.warmup = check_positive_int(warmup, "OnlineFactorAnalysis.warmup", minimum=0)
        self.burnin = (
            max(self.warmup, self.dim)
            if burnin is None
            else check_positive_int(burnin, "OnlineFactorAnalysis.burnin", minimum=0)
        )
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
            InputDataError: If there is no observation or one is not finite (the state is left
                unchanged).
            InputTypeError: For non-numeric or float16 / bfloat16 observations.
            NumericalError: If the update produced non-finite values.
        """
        what = "OnlineFactorAnalysis.update(theta)"
        if isinstance(theta, torch.Tensor):  # float32 weights go to the model's dtype
            check_not_low_precision(theta, what)
        x = as_float_tensor(theta, what, dtype=self.mean.dtype).to(self.mean.device)
        x = x.unsqueeze(0) if x.dim() == 1 else x
        if x.dim() != 2 or x.shape[-1] != self.dim:
            raise ShapeError(expected_got(what, f"shape (T, {self.dim})", tuple(x.shape)))
        if x.shape[0] == 0:
            raise InputDataError(expected_got(what, "at least one observation", tuple(x.shape)))
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
        consistent = self.statistics == "consistent"
        slow_until = max(self.warmup, self.burnin)
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
                gamma = 1.0 / t if t <= slow_until else (eta + 1.0) / (t + eta)
                mm = torch.outer(m, m) + sigma if consistent else torch.outer(m, m)
                b_bar += gamma * (mm - b_bar)
                a_bar += gamma * (torch.outer(d, m) - a_bar)
                d2_bar += gamma * (d * d - d2_bar)
                # the first observation only sets the mean (d = 0); with no spread seen yet
                # psi would go to its floor and every other point would get log-density -inf
                if t <= max(self.warmup, 1) or float(d2_bar.mean()) == 0.0:
                    continue
                h = b_bar if consistent else sigma + b_bar  # shape: (K, K)
                f_new = torch.linalg.solve(h, a_bar.mT).mT  # A H^{-1} (H symmetric)
                # diag(d2 - 2 F A^T + F H F^T) = d2 - rowsum(F * A) at F = A H^{-1} (Eq. 4.35)
                psi_new = d2_bar - (f_new * a_bar).sum(-1)
                floor = max(self.psi_min * float(d2_bar.mean()), tiny)
                low = psi_new < floor
                clamped += int(low.sum())
                psi_new = psi_new.clamp_min(floor)
            else:
                if t <= max(self.warmup, 1):  # the first observation only sets the mean
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

    @property
    def num_parameters(self) -> int:
        """Observation dimension ``D`` (the weight-posterior protocol's name for ``dim``)."""
        return self.dim

    def factor(self) -> torch.Tensor:
        """The loadings ``F`` (after a fitted-state check). # shape: (D, K)"""
        self._check_fitted()
        return self.loadings

    def diagonal_variance(self) -> torch.Tensor:
        r"""The diagonal :math:`\psi`. # shape: (D,)"""
        return self.psi

    def _check_fitted(self) -> None:
        if self.num_observations <= max(self.warmup, 1):
            if self.num_observations == 0:
                raise NotFittedError("OnlineFactorAnalysis: call update(theta) first.")
            warnings.warn(
                f"OnlineFactorAnalysis: only {self.num_observations} observation(s), not past "
                f"the warm-up of {self.warmup} (the first observation only sets the mean); F "
                "and psi are still their initial values.",
                NumericalWarning,
                stacklevel=4,
            )

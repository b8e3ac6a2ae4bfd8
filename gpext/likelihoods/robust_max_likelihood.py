"""The robust-max multiclass likelihood with Gauss-Hermite quadrature (GPflow's ``RobustMax``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from gpytorch.constraints import Interval
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from gpytorch.likelihoods import Likelihood
from torch.distributions import Categorical

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_labels, check_positive_int

__all__ = ["RobustMaxLikelihood"]

# Upper bound on the number of elements of the (..., N, Y, K, J) quadrature tensor built at once.
_CHUNK_ELEMENTS = 2**23


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x <= 0``, accurate near 0 and for very negative ``x``.

    ``x`` is clamped above at ``-tiny`` (the dtype's smallest normal number), so ``x = 0`` (a
    probability of exactly 1) gives ``log(tiny)`` (about -708 in float64, -87 in float32) rather
    than ``-inf``.  Without the clamp both ``torch.where`` branches carry an infinite derivative
    at 0 and backpropagation turns ``inf * 0`` into NaN; the clamp passes zero gradient there.
    """
    tiny = torch.finfo(x.dtype).tiny
    x = x.clamp_max(-tiny)
    near_zero = x > -math.log(2.0)
    # evaluate each branch only on inputs where it is finite (double-where for clean gradients)
    x_near = torch.where(near_zero, x, -1.0)
    x_far = torch.where(near_zero, -1.0, x)
    return torch.where(near_zero, torch.log(-torch.expm1(x_near)), torch.log1p(-torch.exp(x_far)))


class RobustMaxLikelihood(Likelihood):
    r"""Robust-max likelihood over ``J`` latent functions, with quadrature-based inference.

    The class with the largest latent value is observed with probability :math:`1 - \epsilon`,
    every other class with probability :math:`\epsilon / (J - 1)` (003_...txt, Section 1):

    .. math::
        p(y \mid \mathbf f) = (1 - \epsilon)\,[y = \arg\max_j f_j]
            + \frac{\epsilon}{J - 1}\,[y \neq \arg\max_j f_j].

    Under independent Gaussian marginals :math:`f_j \sim \mathcal N(m_j, v_j)` the probability that
    :math:`f_y` is the largest is a one-dimensional integral, computed by Gauss-Hermite quadrature
    with nodes :math:`\xi_k` and weights :math:`w_k` (003_...txt, Section 2.1.1):

    .. math::
        S_y = \frac{1}{\sqrt\pi} \sum_{k} w_k \prod_{j \neq y}
            \Phi\!\left(\frac{m_y + \sqrt{2 v_y}\,\xi_k - m_j}{\sqrt{v_j}}\right),

    and :math:`\mathbb E_q[\log p(y \mid \mathbf f)] = \log(1 - \epsilon) S_y
    + \log(\epsilon / (J - 1)) (1 - S_y)`; the predictive probability is
    :math:`(1 - \epsilon) S_y + \epsilon / (J - 1) (1 - S_y)` (003_...txt, Section 2.2).
    Note the standard deviation :math:`\sqrt{v_j}` in the denominator (a public implementation
    uses the variance there).

    Numerics: the product is a sum of ``torch.special.log_ndtr`` terms, :math:`\log S_y` a
    ``logsumexp`` over nodes, and :math:`\log(1 - S_y)` is computed from the complementary form
    :math:`\sum_k w_k (1 - \prod_j \Phi_j)/\sqrt\pi` with an accurate ``log(1 - exp(.))``, so both
    stay finite for extreme means.  The only clipping: latent variances are clamped below at
    ``min_variance`` (default ``1e-10`` in float64, ``1e-6`` in float32) so that
    :math:`(f_y - m_j)/\sqrt{v_j}` stays finite; a point mass is then treated as a very narrow
    Gaussian.  The normal CDF itself is never clipped (GPflow clips it to
    :math:`[10^{-6}, 1 - 10^{-6}]`).

    Accuracy: the quadrature integrates over :math:`f_y`; when :math:`v_y` is much larger than
    the other variances the factors become steps that 20 nodes cannot resolve, and the integral
    is taken instead over the runner-up class, term by term (formula (b), chosen per point).
    When the variances of the *other* classes differ by orders of magnitude among themselves,
    neither form is exact at 20 nodes (errors up to ~0.02 in :math:`S`); raise ``num_locs``.

    Only the marginal variances of the latent functions are used; correlations between latent
    functions (e.g. an LMC model) are ignored by the quadrature, as in GPflow.

    Args:
        num_classes: Number of classes ``J >= 2`` (= number of latent functions).
        epsilon: Initial error probability :math:`\epsilon \in (0, 1)`.
        num_locs: Number of Gauss-Hermite nodes (default 20).
        learn_epsilon: Whether :math:`\epsilon` is a learnable parameter (constrained to
            ``epsilon_constraint``, default ``Interval(1e-6, 0.5)``).
        epsilon_constraint: Constraint of the learnable :math:`\epsilon`.
        min_variance: Lower clamp of latent variances (``None``: dtype dependent, see above).

    Raises:
        InputDataError: If ``num_classes < 2`` or ``epsilon`` is not in ``(0, 1)``.

    Example:
        >>> lik = RobustMaxLikelihood(num_classes=3)
        >>> mean, var = torch.zeros(4, 3), torch.ones(4, 3)
        >>> q_f = MultitaskMultivariateNormal(mean, torch.diag_embed(var.reshape(-1)))
        >>> lik(q_f).probs.shape
        torch.Size([4, 3])
    """

    def __init__(
        self,
        num_classes: int,
        epsilon: float = 1e-3,
        num_locs: int = 20,
        *,
        learn_epsilon: bool = False,
        epsilon_constraint: Interval | None = None,
        min_variance: float | None = None,
    ) -> None:
        super().__init__()
        self.num_classes = check_positive_int(
            num_classes, "RobustMaxLikelihood.num_classes", minimum=2
        )
        self.num_locs = check_positive_int(num_locs, "RobustMaxLikelihood.num_locs")
        if not 0.0 < float(epsilon) < 1.0:
            raise InputDataError(
                expected_got("RobustMaxLikelihood.epsilon", "a value in (0, 1)", epsilon)
            )
        self.learn_epsilon = bool(learn_epsilon)
        self.min_variance = min_variance
        if epsilon_constraint is None:
            epsilon_constraint = Interval(1e-6, 0.5) if learn_epsilon else Interval(0.0, 1.0)
        self.register_parameter(
            "raw_epsilon", torch.nn.Parameter(torch.zeros(()), requires_grad=learn_epsilon)
        )
        self.register_constraint("raw_epsilon", epsilon_constraint)
        self.epsilon = epsilon
        nodes, weights = np.polynomial.hermite.hermgauss(self.num_locs)
        self.register_buffer("locations", torch.as_tensor(nodes), persistent=False)
        self.register_buffer(
            "log_weights",
            torch.as_tensor(np.log(weights) - 0.5 * math.log(math.pi)),
            persistent=False,
        )

    @property
    def epsilon(self) -> torch.Tensor:
        """The error probability :math:`\\epsilon` (a 0-d tensor)."""
        return self.raw_epsilon_constraint.transform(self.raw_epsilon)

    @epsilon.setter
    def epsilon(self, value: float | torch.Tensor) -> None:
        value = torch.as_tensor(value, dtype=self.raw_epsilon.dtype, device=self.raw_epsilon.device)
        with torch.no_grad():
            self.raw_epsilon.copy_(self.raw_epsilon_constraint.inverse_transform(value))

    # ------------------------------------------------------------------ helpers
    def _check_features(self, num: int, what: str) -> None:
        if num != self.num_classes:
            raise ShapeError(
                expected_got(
                    f"RobustMaxLikelihood.{what}",
                    f"{self.num_classes} latent functions in the last dimension",
                    num,
                    "Use one latent GP per class (IndependentMultitaskVariationalStrategy "
                    "with num_tasks=num_classes).",
                )
            )

    def _moments(self, function_dist: MultivariateNormal) -> tuple[torch.Tensor, torch.Tensor]:
        """Marginal means and variances of shape ``(..., N, J)``."""
        if isinstance(function_dist, MultitaskMultivariateNormal):
            mean, var = function_dist.mean, function_dist.variance
        elif isinstance(function_dist, MultivariateNormal):
            # batch MVN with the J latent functions as the last batch dimension
            mean, var = (
                function_dist.mean.transpose(-1, -2),
                function_dist.variance.transpose(-1, -2),
            )
        else:
            raise InputTypeError(
                expected_got(
                    "RobustMaxLikelihood input",
                    "a MultitaskMultivariateNormal (..., N, J) or a tensor of function samples",
                    type(function_dist).__name__,
                )
            )
        self._check_features(mean.shape[-1], "function_dist")
        return mean, var

    def _min_var(self, dtype: torch.dtype) -> float:
        if self.min_variance is not None:
            return float(self.min_variance)
        return 1e-10 if dtype == torch.float64 else 1e-6

    def _log_s_over_y(self, mean, sd, y, xi, logw):
        """Formula (a): integrate over ``f_y``.  Shapes: mean/sd (P, J), y (P,); returns (P,) x 2."""
        j = mean.shape[-1]
        m_y = mean.gather(-1, y[:, None])  # shape: (P, 1)
        s_y = sd.gather(-1, y[:, None])
        f_y = m_y + math.sqrt(2.0) * s_y * xi  # shape: (P, K)
        z = (f_y[..., None] - mean[:, None, :]) / sd[:, None, :]  # shape: (P, K, J)
        is_y = (y[:, None] == torch.arange(j, device=mean.device))[:, None, :]
        log_prod = torch.special.log_ndtr(z).masked_fill(is_y, 0.0).sum(-1)  # shape: (P, K)
        log_s = torch.logsumexp(log_prod + logw, dim=-1)
        log_1ms = torch.logsumexp(_log1mexp(log_prod) + logw, dim=-1)
        return log_s, log_1ms

    def _log_s_over_others(self, mean, sd, y, xi, logw):
        """Formula (b): integrate over the runner-up ``f_j = max_{l != y} f_l``, term by term.

        .. math::
            S_y = \\sum_{j \\neq y} \\mathbb E_{f_j}\\Big[\\Phi\\big(\\tfrac{m_y - f_j}{\\sqrt{v_y}}\\big)
                \\prod_{l \\neq j, y} \\Phi\\big(\\tfrac{f_j - m_l}{\\sqrt{v_l}}\\big)\\Big],

        and :math:`1 - S_y` is the same sum with :math:`\\Phi((f_j - m_y)/\\sqrt{v_y})`.
        Accurate when :math:`v_y` is much larger than the other variances.
        """
        j = mean.shape[-1]
        ar = torch.arange(j, device=mean.device)
        t = mean[..., None] + math.sqrt(2.0) * sd[..., None] * xi  # shape: (P, J, K)
        z = (t[..., None] - mean[:, None, None, :]) / sd[:, None, None, :]  # shape: (P, J, K, L)
        skip = (ar[:, None] == ar[None, :])[None, :, None, :] | (y[:, None] == ar)[:, None, None, :]
        log_prod = torch.special.log_ndtr(z).masked_fill(skip, 0.0).sum(-1)  # shape: (P, J, K)
        m_y = mean.gather(-1, y[:, None])[..., None]
        s_y = sd.gather(-1, y[:, None])[..., None]
        u = (m_y - t) / s_y
        not_y = (y[:, None] == ar)[..., None]
        a = (log_prod + torch.special.log_ndtr(u) + logw).masked_fill(not_y, -math.inf)
        b = (log_prod + torch.special.log_ndtr(-u) + logw).masked_fill(not_y, -math.inf)
        return torch.logsumexp(a.flatten(-2), -1), torch.logsumexp(b.flatten(-2), -1)

    def _log_s_pairs(self, mean, var, y):
        """``log S_y`` and ``log(1 - S_y)`` for flat pairs: mean/var (P, J), y (P,)."""
        var = var.clamp_min(self._min_var(var.dtype))
        sd = var.sqrt()
        xi = self.locations.to(mean)
        logw = self.log_weights.to(mean)
        log_s, log_1ms = self._log_s_over_y(mean, sd, y, xi, logw)
        # pick formula (b) where the quadrature over f_y cannot resolve the other factors
        sd_y = sd.gather(-1, y[:, None]).squeeze(-1)
        sd_o = sd.scatter(-1, y[:, None], math.inf).amin(-1)
        sd_o_max = sd.scatter(-1, y[:, None], 0.0).amax(-1)
        rough_a = sd_y / sd_o
        rough_b = sd_o_max / torch.minimum(sd_y, sd_o)
        use_b = (rough_b < rough_a) & (rough_a > 1.0)
        if bool(use_b.any()):
            idx = use_b.nonzero().squeeze(-1)
            b_s, b_1ms = self._log_s_over_others(mean[idx], sd[idx], y[idx], xi, logw)
            log_s = log_s.index_put((idx,), b_s)
            log_1ms = log_1ms.index_put((idx,), b_1ms)
        return log_s, log_1ms

    def _log_s_chunked(self, mean: torch.Tensor, var: torch.Tensor, classes: torch.Tensor):
        """``log S_y`` and ``log(1 - S_y)`` for every entry of ``classes``.

        Args:
            mean: Latent means.  # shape: (..., N, J)
            var: Latent variances.  # shape: (..., N, J)
            classes: Class indices.  # shape: (..., N, Y)

        Returns:
            Two tensors of the shape of ``classes``; computed in chunks to bound memory.
        """
        shape = classes.shape
        j = mean.shape[-1]
        m = mean.unsqueeze(-2).expand(*shape, j).reshape(-1, j)
        v = var.unsqueeze(-2).expand(*shape, j).reshape(-1, j)
        y = classes.reshape(-1)
        chunk = max(1, _CHUNK_ELEMENTS // (self.num_locs * j * j))
        outs = [
            self._log_s_pairs(m[s : s + chunk], v[s : s + chunk], y[s : s + chunk])
            for s in range(0, y.numel(), chunk)
        ]
        log_s = torch.cat([o[0] for o in outs]).reshape(shape)
        log_1ms = torch.cat([o[1] for o in outs]).reshape(shape)
        return log_s, log_1ms

    def _log_probs_from_s(self, log_s: torch.Tensor, log_1ms: torch.Tensor) -> torch.Tensor:
        eps = self.epsilon.to(log_s)
        log_hit = torch.log1p(-eps)
        log_miss = torch.log(eps) - math.log(self.num_classes - 1)
        return torch.logaddexp(log_hit + log_s, log_miss + log_1ms)

    def _labels(self, observations: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        labels = check_labels(observations, self.num_classes, "RobustMaxLikelihood.observations")
        try:
            shape = torch.broadcast_shapes(labels.shape, mean.shape[:-1])
        except RuntimeError as err:
            raise ShapeError(
                expected_got(
                    "RobustMaxLikelihood.observations",
                    f"labels broadcastable to {tuple(mean.shape[:-1])}",
                    f"shape {tuple(labels.shape)}",
                )
            ) from err
        return labels.to(mean.device).expand(shape)

    # --------------------------------------------------------------- public API
    def log_s(self, function_dist: MultivariateNormal, observations: torch.Tensor) -> torch.Tensor:
        r""":math:`\log S_y`, the log-probability that the observed class has the largest latent.

        Args:
            function_dist: :math:`q(\mathbf f)` with marginals of shape ``(..., N, J)``.
            observations: Labels in ``[0, J)``.  # shape: (..., N)

        Returns:
            :math:`\log S_y`.  # shape: (..., N)
        """
        mean, var = self._moments(function_dist)
        labels = self._labels(observations, mean)
        mean, var = mean.expand(*labels.shape, -1), var.expand(*labels.shape, -1)
        return self._log_s_chunked(mean, var, labels.unsqueeze(-1))[0].squeeze(-1)

    def forward(self, function_samples: torch.Tensor, *args: Any, **kwargs: Any) -> Categorical:
        """The robust-max categorical distribution given latent values.

        Args:
            function_samples: Latent function values.  # shape: (..., N, J)

        Returns:
            A ``Categorical`` with batch shape ``(..., N)``; ties go to the first maximum.
        """
        self._check_features(function_samples.shape[-1], "function_samples")
        eps = self.epsilon.to(function_samples)
        miss = eps / (self.num_classes - 1)
        hit = torch.nn.functional.one_hot(function_samples.argmax(-1), self.num_classes).to(
            function_samples
        )
        return Categorical(probs=miss + (1.0 - eps - miss) * hit)

    def expected_log_prob(
        self,
        observations: torch.Tensor,
        function_dist: MultivariateNormal,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        r""":math:`\mathbb E_{q(\mathbf f)}[\log p(y \mid \mathbf f)]` by Gauss-Hermite quadrature.

        Args:
            observations: Labels in ``[0, J)``.  # shape: (..., N)
            function_dist: :math:`q(\mathbf f)` with marginals of shape ``(..., N, J)``.

        Returns:
            The expected log-likelihood of each point.  # shape: (..., N)

        Raises:
            InputDataError: If labels are outside ``[0, J)``.
            InputTypeError: If labels are not whole numbers.
        """
        mean, var = self._moments(function_dist)
        labels = self._labels(observations, mean)
        mean, var = mean.expand(*labels.shape, -1), var.expand(*labels.shape, -1)
        log_s, _ = self._log_s_chunked(mean, var, labels.unsqueeze(-1))
        s = log_s.squeeze(-1).exp()
        eps = self.epsilon.to(mean)
        log_hit = torch.log1p(-eps)
        log_miss = torch.log(eps) - math.log(self.num_classes - 1)
        return log_miss + (log_hit - log_miss) * s

    def log_marginal(
        self,
        observations: torch.Tensor,
        function_dist: MultivariateNormal,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Log predictive probability of the observed labels, by quadrature.

        Args:
            observations: Labels in ``[0, J)``.  # shape: (..., N)
            function_dist: :math:`q(\\mathbf f)` with marginals of shape ``(..., N, J)``.

        Returns:
            :math:`\\log[(1 - \\epsilon) S_y + \\epsilon / (J - 1) (1 - S_y)]`.  # shape: (..., N)
        """
        mean, var = self._moments(function_dist)
        labels = self._labels(observations, mean)
        mean, var = mean.expand(*labels.shape, -1), var.expand(*labels.shape, -1)
        log_s, log_1ms = self._log_s_chunked(mean, var, labels.unsqueeze(-1))
        return self._log_probs_from_s(log_s, log_1ms).squeeze(-1)

    def marginal(self, function_dist: MultivariateNormal, *args: Any, **kwargs: Any) -> Categorical:
        """Predictive class probabilities :math:`(1 - \\epsilon) S_c + \\epsilon/(J-1)(1 - S_c)`.

        Args:
            function_dist: :math:`q(\\mathbf f)` with marginals of shape ``(..., N, J)``.

        Returns:
            A ``Categorical`` with batch shape ``(..., N)`` (its ``probs`` are renormalised by
            torch; the quadrature sums to one up to rounding).
        """
        mean, var = self._moments(function_dist)
        classes = torch.arange(self.num_classes, device=mean.device).expand(*mean.shape)
        log_s, log_1ms = self._log_s_chunked(mean, var, classes)
        return Categorical(logits=self._log_probs_from_s(log_s, log_1ms))

    def __call__(self, input: torch.Tensor | MultivariateNormal, *args: Any, **kwargs: Any):
        if torch.is_tensor(input) or isinstance(input, MultivariateNormal):
            return super().__call__(input, *args, **kwargs)
        raise InputTypeError(
            expected_got(
                "RobustMaxLikelihood input",
                "function samples (..., N, J) or a MultitaskMultivariateNormal",
                type(input).__name__,
            )
        )

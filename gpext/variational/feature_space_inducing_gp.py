"""Inducing points and linear pseudo-labels in a learned feature space (002, sections 2.1-2.3)."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import LowRankRootLinearOperator
from torch import nn

from gpext.errors import (
    InputDataError,
    InputTypeError,
    NumericalWarning,
    ShapeError,
    expected_got,
)
from gpext.utils import check_finite, check_positive_int, safe_cholesky

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["FeatureSpaceInducingGP"]


def _check_mean_module(
    mean_module: object, inducing_points: torch.Tensor, batch_shape: torch.Size
) -> gpytorch.means.Mean:
    """A prior mean on features whose output at ``Z`` has shape ``(*batch_shape, m)``."""
    name = "FeatureSpaceInducingGP.mean_module"
    if not isinstance(mean_module, gpytorch.means.Mean):
        raise InputTypeError(
            expected_got(name, "a gpytorch.means.Mean", type(mean_module).__name__,
                         "Pass e.g. gpytorch.means.ConstantMean().")
        )  # fmt: skip
    expected = inducing_points.shape[:-1]
    try:
        with torch.no_grad():
            shape = mean_module(inducing_points.to(_mean_dtype(mean_module))).shape
        ok = torch.broadcast_shapes(shape, expected) == expected
    except RuntimeError:
        ok, shape = False, "an error"
    if not ok:
        raise ShapeError(
            expected_got(
                name, f"a mean of features (*, N, {inducing_points.shape[-1]}) with output "
                f"shape broadcastable to {tuple(expected)} at the inducing points", shape,
                f"Give it input size {inducing_points.shape[-1]} (the feature dimension) and "
                f"a batch shape of () or {tuple(batch_shape)}.",
            )
        )  # fmt: skip
    return mean_module


def _mean_dtype(module: torch.nn.Module) -> torch.dtype:
    param = next(iter(module.parameters()), None)
    return torch.get_default_dtype() if param is None else param.dtype


def _safe_cholesky(matrix: torch.Tensor, jitter: float, what: str) -> torch.Tensor:
    """Cholesky factor of ``matrix + jitter I``, escalating the jitter if that fails.

    :func:`gpext.utils.safe_cholesky` (x10 per retry, at least a dtype-relative floor of the
    mean diagonal, so a zero ``jitter`` escalates too; a
    :class:`~gpext.errors.NumericalWarning` per retry, :class:`~gpext.errors.NumericalError`
    when all fail).  The number of retries and the floor follow linear_operator's
    ``cholesky_max_tries`` (3) and ``cholesky_jitter`` (1e-6 float32, 1e-8 float64) settings.
    ``matrix`` has shape ``(*batch, n, n)``.
    """
    return safe_cholesky(
        matrix, jitter=jitter, name=what, hint="Check for NaN features or use a float64 model."
    )


class FeatureSpaceInducingGP(gpytorch.Module):
    r"""GP conditioned on pseudo-labels at inducing points that live in a feature space.

    An inducing GP network (Tibo & Nielsen 2022, document 002) embeds inputs with a network
    :math:`g: \mathcal{X} \to \mathbb{R}^d` and holds ``m`` inducing points
    :math:`Z \in \mathbb{R}^{m \times d}` *in that feature space*, with pseudo-labels given by a
    linear function :math:`r(z) = w^\top z + b`, :math:`\mathbf{r} = r(Z)`.  This module holds
    :math:`Z`, :math:`(w, b)` and a GPyTorch kernel :math:`k` on features, and returns the GP on
    features conditioned on :math:`\mathbf{r}` (002, Eq. 3, 4 and 7):

    .. math::

        p(\mathbf{f} \mid G, \theta) = \mathcal{N}\big(K_{GZ} K_{ZZ}^{-1} \mathbf{r},\;
        K_{GG} - K_{GZ} K_{ZZ}^{-1} K_{ZG}\big)

    for feature vectors :math:`G = g(X)`.  Observation noise (Eq. 4) and the likelihood are added
    by the caller, e.g. :class:`gpext.models.InducingGPNetwork`.  Because the kernel only sees
    :math:`Z` and :math:`G`, the gradient of any objective with respect to :math:`Z` does not
    involve the embedding's gradient (002, Proposition 1), and adding an inducing point never
    increases a predictive variance (002, Proposition 2; see :meth:`add_inducing_points`).

    Beyond 002, the pseudo-labels may carry a free per-point offset,
    :math:`\mathbf{r} = Z w + b + \boldsymbol{\delta}`.  It is zero unless it is set by
    :meth:`solve_pseudo_labels` (the exact minimiser of the independent form of Eq. 5 over
    :math:`\mathbf{r}` for fixed features, kernel and noise); it is not a trainable parameter,
    and with :math:`\boldsymbol{\delta} = 0` the model is that of 002.

    Also beyond 002 (whose GP has mean zero), a prior mean :math:`m` on features
    (``mean_module``, a GPyTorch mean): the pseudo-label function becomes
    :math:`r(z) = m(z) + w^\top z + b`, so the linear part models the residual from the prior
    mean, and the conditional mean is

    .. math::

        \mathbb{E}[\mathbf f] = m(G) + K_{GZ} K_{ZZ}^{-1}\big(\mathbf{r} - m(Z)\big)
        = m(G) + K_{GZ} K_{ZZ}^{-1}\big(Z w + b + \boldsymbol\delta\big),

    with the covariance unchanged.  The default :class:`gpytorch.means.ZeroMean` is 002's model
    (and adds no computation).

    Several independent heads (e.g. one per class) are a batch: ``Z`` has shape
    ``(*batch_shape, m, d)`` and features ``(*, N, d)`` broadcast against ``batch_shape``.

    Args:
        num_inducing: Number of inducing points ``m``.
        feature_dim: Feature dimension ``d``.
        batch_shape: Batch shape of independent heads.
        covar_module: Kernel on features with that batch shape (default: a scaled ARD RBF kernel).
        inducing_points: Initial ``Z``, shape ``(*batch_shape, m, d)`` (default: standard normal).
        learn_inducing_points: Whether ``Z`` is a trainable parameter.
        jitter: Added to the diagonal of :math:`K_{ZZ}` (default
            ``gpytorch.settings.variational_cholesky_jitter``: 1e-4 float32, 1e-6 float64).
        mean_module: Prior mean :math:`m` on features ``(*, N, d)``, with batch shape ``()``
            or ``batch_shape`` (default :class:`gpytorch.means.ZeroMean`).

    Raises:
        InputDataError: If a size is not a positive integer.
        ShapeError: If ``inducing_points`` has the wrong shape, or ``mean_module`` does not map
            them to shape ``(*batch_shape, m)``.
        InputTypeError: If ``mean_module`` is not a :class:`gpytorch.means.Mean`.

    Example:
        >>> gp = FeatureSpaceInducingGP(num_inducing=16, feature_dim=4)
        >>> f = gp(torch.randn(10, 4))
        >>> f.mean.shape, f.covariance_matrix.shape
        (torch.Size([10]), torch.Size([10, 10]))
    """

    def __init__(
        self,
        num_inducing: int,
        feature_dim: int,
        *,
        batch_shape: torch.Size | None = None,
        covar_module: gpytorch.kernels.Kernel | None = None,
        inducing_points: torch.Tensor | None = None,
        learn_inducing_points: bool = True,
        jitter: float | None = None,
        mean_module: gpytorch.means.Mean | None = None,
    ) -> None:
        super().__init__()
        m = check_positive_int(num_inducing, "FeatureSpaceInducingGP.num_inducing")
        d = check_positive_int(feature_dim, "FeatureSpaceInducingGP.feature_dim")
        batch_shape = torch.Size(() if batch_shape is None else batch_shape)
        if inducing_points is None:
            inducing_points = torch.randn(*batch_shape, m, d)
        elif tuple(inducing_points.shape) != (*batch_shape, m, d):
            raise ShapeError(
                expected_got(
                    "FeatureSpaceInducingGP.inducing_points",
                    f"shape {(*batch_shape, m, d)}",
                    tuple(inducing_points.shape),
                )
            )
        self.feature_dim = d
        self.batch_shape = batch_shape
        self.jitter = jitter
        self.inducing_points = nn.Parameter(
            inducing_points.detach().clone(), requires_grad=learn_inducing_points
        )
        # linear pseudo-label function r(z) = w^T z + b, one per head
        self.pseudo_label_weight = nn.Parameter(
            torch.zeros(*batch_shape, d, dtype=inducing_points.dtype)
        )
        self.pseudo_label_bias = nn.Parameter(torch.zeros(batch_shape, dtype=inducing_points.dtype))
        # offset delta of each pseudo-label (beyond 002): zero unless solve_pseudo_labels sets
        # it; a parameter without gradient, so that it follows .to() and the state dict
        self.pseudo_label_offset = nn.Parameter(
            torch.zeros(*batch_shape, m, dtype=inducing_points.dtype), requires_grad=False
        )
        if covar_module is None:
            covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch_shape),
                batch_shape=batch_shape,
            )
        self.covar_module = covar_module
        if mean_module is None:
            mean_module = gpytorch.means.ZeroMean(batch_shape=batch_shape)
        self.mean_module = _check_mean_module(mean_module, inducing_points, batch_shape)

    @property
    def num_inducing(self) -> int:
        """The current number of inducing points ``m``."""
        return self.inducing_points.shape[-2]

    def _jitter(self, dtype: torch.dtype) -> float:
        if self.jitter is not None:
            return float(self.jitter)
        return gpytorch.settings.variational_cholesky_jitter.value(dtype)

    def pseudo_labels(self) -> torch.Tensor:
        r"""The pseudo-labels :math:`\mathbf{r} = m(Z) + Z w + b + \boldsymbol{\delta}`.

        Shape ``(*batch_shape, m)``; :math:`m = 0` and :math:`\boldsymbol{\delta} = 0` in 002.
        """
        residual = self._residual_pseudo_labels()
        prior = self.prior_mean(self.inducing_points)
        return residual if prior is None else prior.to(residual) + residual

    def _residual_pseudo_labels(self) -> torch.Tensor:
        r""":math:`\mathbf r - m(Z) = Z w + b + \boldsymbol\delta`, shape ``(*batch_shape, m)``."""
        return self._linear_pseudo_labels() + self.pseudo_label_offset

    def prior_mean(self, features: torch.Tensor) -> torch.Tensor | None:
        """The prior mean :math:`m(G)` at features ``(*, N, d)``; ``None`` for a zero mean.

        Returns:
            Shape ``broadcast(*, batch_shape) + (N,)``, or ``None`` for
            :class:`gpytorch.means.ZeroMean` (so that the zero mean adds no work and no
            rounding).
        """
        if isinstance(self.mean_module, gpytorch.means.ZeroMean):
            return None
        return self.mean_module(features)

    def _linear_pseudo_labels(self) -> torch.Tensor:
        z = self.inducing_points
        linear = (z * self.pseudo_label_weight.unsqueeze(-2)).sum(-1)  # shape: (*batch, m)
        return linear + self.pseudo_label_bias.unsqueeze(-1)

    def _check_features(self, features: torch.Tensor) -> torch.Tensor:
        if not isinstance(features, torch.Tensor) or features.dim() < 2:
            raise ShapeError(
                expected_got(
                    "FeatureSpaceInducingGP features",
                    f"a tensor of shape (..., N, {self.feature_dim})",
                    getattr(features, "shape", type(features).__name__),
                )
            )
        if features.shape[-1] != self.feature_dim:
            raise ShapeError(
                expected_got(
                    "FeatureSpaceInducingGP features",
                    f"shape (..., N, {self.feature_dim})",
                    tuple(features.shape),
                    "The embedding's output size must equal feature_dim.",
                )
            )
        return check_finite(features, "FeatureSpaceInducingGP features")

    def _project(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return the conditional mean ``(*b, N)`` and ``A = L^{-1} K_ZG`` ``(*b, m, N)``."""
        z = self.inducing_points.to(features.dtype)
        kzz = self.covar_module(z).to_dense()  # shape: (*batch, m, m)
        chol = _safe_cholesky(kzz, self._jitter(kzz.dtype), "FeatureSpaceInducingGP K_ZZ")
        kzg = self.covar_module(z, features).to_dense()  # shape: (*b, m, N)
        a = torch.linalg.solve_triangular(chol, kzg, upper=False)  # shape: (*b, m, N)
        # r - m(Z), shape: (*batch, m, 1)
        r = self._residual_pseudo_labels().to(features.dtype).unsqueeze(-1)
        alpha = torch.linalg.solve_triangular(chol, r, upper=False)  # shape: (*batch, m, 1)
        mean = (a * alpha).sum(-2)  # shape: (*b, N)
        prior = self.prior_mean(features)
        if prior is not None:
            mean = prior.to(mean) + mean
        return mean, a

    def forward(self, features: torch.Tensor) -> MultivariateNormal:
        r"""The conditional GP on features, 002 Eq. 7, with a lazy covariance.

        The covariance is the sum of the lazily evaluated kernel :math:`K_{GG}` and the negated
        low-rank :math:`A^\top A`, :math:`A = L^{-1} K_{ZG}` (:math:`L L^\top = K_{ZZ}`): its
        diagonal (``.variance``) costs :math:`O(N m)` and nothing of size :math:`N \times N` is
        formed until ``covariance_matrix`` or sampling asks for it.

        Args:
            features: Feature vectors :math:`g(X)`, shape ``(*, N, d)``.

        Returns:
            :math:`\mathcal{N}(K_{GZ}K_{ZZ}^{-1}\mathbf{r},\ K_{GG} - K_{GZ}K_{ZZ}^{-1}K_{ZG})`
            with batch shape ``broadcast(*, batch_shape)`` and event shape ``(N,)``.

        Raises:
            ShapeError: If the features do not have ``d`` columns.
            InputDataError: If they have non-finite entries.
            NumericalError: If :math:`K_{ZZ}` cannot be factorised.
        """
        features = self._check_features(features)
        mean, a = self._project(features)
        kgg = self.covar_module(features)  # lazy: no N x N matrix until one is asked for
        # K_GG - A^T A with A = L^{-1} K_ZG (batch shapes broadcast as in the dense form)
        q = LowRankRootLinearOperator(a.transpose(-1, -2))
        batch = torch.broadcast_shapes(kgg.batch_shape, q.batch_shape)
        cov = kgg.expand(*batch, *kgg.shape[-2:]) + q.expand(*batch, *q.shape[-2:]).mul(-1.0)
        return MultivariateNormal(mean, cov)

    def marginal(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and variance of 002 Eq. 7 at each point, without the ``N x N`` covariance.

        Rounding can make :math:`k(x,x) - q(x,x)` slightly negative near an inducing point; the
        variance is clamped at zero (a relative error of ``1e-3`` of :math:`k(x,x)` or more is
        reported by a :class:`~gpext.errors.NumericalWarning`).

        Args:
            features: Feature vectors, shape ``(*, N, d)``.

        Returns:
            ``(mean, variance)``, each of shape ``(*b, N)``.
        """
        features = self._check_features(features)
        mean, a = self._project(features)
        kdiag = self.covar_module(features, diag=True)
        var = kdiag - (a * a).sum(-2)
        if bool((var < -1e-3 * kdiag.abs()).any()):
            warnings.warn(
                "FeatureSpaceInducingGP.marginal: clearly negative variances clamped at 0; "
                "K_ZZ is badly conditioned (use float64 or a larger jitter).",
                NumericalWarning,
                stacklevel=2,
            )
        return mean, var.clamp_min(0.0)

    @torch.no_grad()
    def add_inducing_points(self, new_points: torch.Tensor) -> None:
        """Append inducing points (their pseudo-labels follow from the linear function ``r``,
        with offset zero).

        By 002 Proposition 2 no predictive variance of :meth:`forward` increases.

        Args:
            new_points: Shape ``(*batch_shape, k, d)`` or ``(k, d)`` (shared by all heads).

        Raises:
            ShapeError: If the shape does not fit.
        """
        z = self.inducing_points
        if new_points.dim() == 2 and len(self.batch_shape):
            new_points = new_points.expand(*self.batch_shape, *new_points.shape)
        if new_points.shape[:-2] != self.batch_shape or new_points.shape[-1] != self.feature_dim:
            raise ShapeError(
                expected_got(
                    "FeatureSpaceInducingGP.add_inducing_points",
                    f"shape {(*self.batch_shape, 'k', self.feature_dim)}",
                    tuple(new_points.shape),
                )
            )
        self.inducing_points = nn.Parameter(
            torch.cat([z, new_points.to(z)], dim=-2), requires_grad=z.requires_grad
        )
        offset = self.pseudo_label_offset  # new points get delta = 0: r = r(z) there
        self.pseudo_label_offset = nn.Parameter(
            torch.cat([offset, offset.new_zeros(*offset.shape[:-1], new_points.shape[-2])], -1),
            requires_grad=offset.requires_grad,
        )

    @torch.no_grad()
    def initialize_from_features(
        self,
        features: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        ridge: float = 1e-3,
        generator: torch.Generator | None = None,
        fill: bool = False,
    ) -> None:
        r"""Place ``Z`` at a random subset of features and fit ``r`` to their targets.

        The pseudo-label offset is reset to zero.

        The pseudo-label function is set by ridge regression of ``targets`` on ``features``
        (all rows), so :math:`r(Z)` starts close to the observed labels near each inducing point.

        Args:
            features: Training features, shape ``(N, d)`` with ``N >= m``.
            targets: Targets, shape ``(*batch_shape, N)`` or ``(N,)``; ``None`` keeps ``r``.
            ridge: Ridge penalty (relative to the mean squared feature).
            generator: Random generator for the subset.
            fill: With fewer feature rows than inducing points, place ``Z`` at every row and
                the remaining ``m - N`` points at :math:`g_i + u (g_j - g_i)`,
                :math:`u \sim U(0, 1)`, for random pairs of rows, instead of raising (used by
                the small-table refit checks of the models, whose copies train on 80% of
                the rows).

        Raises:
            InputDataError: If there are fewer feature rows than inducing points (and not
                ``fill``), or fewer than two rows to fill from.
        """
        features = self._check_features(features)
        if features.dim() != 2:
            raise ShapeError(
                expected_got(
                    "initialize_from_features(features)", "shape (N, d)", tuple(features.shape)
                )
            )
        n, m = features.shape[0], self.num_inducing
        if n < m and not (fill and n >= 2):
            raise InputDataError(
                expected_got(
                    "FeatureSpaceInducingGP.initialize_from_features",
                    f"at least num_inducing={m} feature rows",
                    n,
                    "Pass more data or use fewer inducing points.",
                )
            )
        heads = max(1, self.batch_shape.numel())
        if n >= m:
            idx = torch.stack(
                [torch.randperm(n, generator=generator)[:m] for _ in range(heads)]
            ).to(features.device)
            z = features[idx]  # shape: (heads, m, d)
        else:
            extra = m - n
            i = torch.randint(0, n, (heads, extra), generator=generator).to(features.device)
            j = torch.randint(0, n - 1, (heads, extra), generator=generator).to(features.device)
            j = j + (j >= i).long()  # a different row
            u = torch.rand(heads, extra, 1, generator=generator, dtype=features.dtype)
            u = u.to(features.device)
            mixed = features[i] + u * (features[j] - features[i])
            z = torch.cat([features.expand(heads, n, -1), mixed], dim=-2)
        z = z.reshape(*self.batch_shape, m, self.feature_dim)
        self.inducing_points.copy_(z.to(self.inducing_points))
        self.pseudo_label_offset.zero_()
        if targets is None:
            return
        design = torch.cat([features, features.new_ones(n, 1)], dim=-1)  # shape: (N, d + 1)
        gram = design.T @ design
        lam = ridge * gram.diagonal().mean()
        targets = targets.to(features)
        prior = self.prior_mean(features)  # the linear function fits the residual y - m(g)
        if prior is not None:
            targets = targets - prior.to(features)
        t = targets.reshape(-1, n).T  # shape: (N, heads)
        if t.shape[1] != heads:
            if t.shape[1] != 1:
                raise ShapeError(
                    expected_got(
                        "initialize_from_features(targets)",
                        f"shape {(*self.batch_shape, n)} or ({n},)",
                        tuple(targets.shape),
                    )
                )
            t = t.expand(n, heads)
        coef = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0]).to(gram), design.T @ t)
        self.pseudo_label_weight.copy_(coef[:-1].T.reshape(*self.batch_shape, self.feature_dim))
        self.pseudo_label_bias.copy_(coef[-1].reshape(self.batch_shape))

    @torch.no_grad()
    def solve_pseudo_labels(
        self,
        batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        *,
        ridge: float = 1.0,
    ) -> torch.Tensor:
        r"""Set :math:`\mathbf{r}` to the MAP minimiser of the independent form of 002 Eq. 5.

        For fixed features, kernel, :math:`Z` and noise, the sum over points of
        :math:`-\log\mathcal N(y_i;\ \mathbf{a}_i^\top\mathbf{r},\ v_i)` with
        :math:`\mathbf{a}_i = K_{ZZ}^{-1}k_Z(\mathbf{g}_i)` and
        :math:`v_i = k_{ii} - q_{ii} + \sigma_i^2` is quadratic in :math:`\mathbf{r}` (the
        log-determinant does not depend on it).  The offset
        :math:`\boldsymbol\delta = \mathbf r - r(Z)` from the linear pseudo-labels gets the
        Gaussian prior :math:`\boldsymbol\delta \sim \mathcal N(0,\ \tfrac{s_y^2}{\lambda
        \bar k}K_{ZZ})`, where :math:`s_y^2` is the variance of the targets and
        :math:`\bar k` the mean of :math:`\operatorname{diag} K_{ZZ}`: each offset has prior
        standard deviation :math:`s_y/\sqrt{\lambda}` whatever the kernel's scale, and
        inducing points that no data point informs keep their linear pseudo-label instead of
        drifting far outside the range of the targets.  In whitened coordinates
        :math:`\boldsymbol{\alpha} = L^{-1}\mathbf{r}`, :math:`K_{ZZ} = LL^\top`, with
        :math:`\tilde{\mathbf a}_i = L^{-1}k_Z(\mathbf g_i)`,
        :math:`\boldsymbol\alpha_0 = L^{-1}r(Z)` and :math:`\rho = \lambda\bar k / s_y^2`,
        the mode solves

        .. math::

            \Big(\sum_i \frac{\tilde{\mathbf a}_i\tilde{\mathbf a}_i^\top}{v_i}
            + \rho I\Big)\boldsymbol{\alpha} = \sum_i \frac{\tilde{\mathbf a}_i y_i}{v_i}
            + \rho\,\boldsymbol\alpha_0, \qquad \mathbf{r} = L\boldsymbol{\alpha}.

        With a prior mean :math:`m` (``mean_module``) the same holds for the residuals:
        :math:`y_i` is replaced by :math:`y_i - m(\mathbf g_i)` (also in :math:`s_y^2`),
        :math:`\mathbf r` by :math:`\mathbf r - m(Z)` and :math:`r(Z)` by its linear part
        :math:`Zw + b`, and :math:`\mathbf r = m(Z) + L\boldsymbol\alpha`.

        ``ridge=0`` gives the unregularised weighted least-squares solution.  The system is
        accumulated over the batches in float64 (:math:`O(Nm^2)` time, :math:`O(m^2)` memory
        per head), so the whole training set can be streamed.  The result is stored in the
        offset :math:`\boldsymbol{\delta}`; the linear function ``r`` itself is unchanged.

        Args:
            batches: Iterable of ``(features, targets, noise)``: features ``(B, d)``, targets
                ``(*batch_shape, B)`` or ``(B,)``, and the observation noise variances
                :math:`\sigma_i^2`, broadcastable to the targets.
            ridge: Prior precision multiplier :math:`\lambda \ge 0`.

        Returns:
            The new pseudo-labels, shape ``(*batch_shape, m)``.

        Raises:
            InputDataError: If ``ridge`` is negative or there are no batches.
            ShapeError: If a batch does not fit.
            NumericalError: If the system cannot be factorised.

        Example:
            >>> gp = FeatureSpaceInducingGP(num_inducing=8, feature_dim=2)
            >>> g, y = torch.randn(100, 2), torch.randn(100)
            >>> batches = [(g[:50], y[:50], torch.tensor(0.1)), (g[50:], y[50:], torch.tensor(0.1))]
            >>> gp.solve_pseudo_labels(batches).shape
            torch.Size([8])
        """
        if not float(ridge) >= 0.0:
            raise InputDataError(
                expected_got("FeatureSpaceInducingGP.solve_pseudo_labels.ridge", ">= 0", ridge)
            )
        z = self.inducing_points
        kzz = self.covar_module(z).to_dense()  # shape: (*batch, m, m)
        chol = _safe_cholesky(kzz, self._jitter(kzz.dtype), "FeatureSpaceInducingGP K_ZZ")
        m, heads = self.num_inducing, self.batch_shape
        opts = {"dtype": torch.float64, "device": z.device}
        gram = torch.zeros(*heads, m, m, **opts)
        rhs = torch.zeros(*heads, m, **opts)
        y_sum, y_sq = torch.zeros(heads, **opts), torch.zeros(heads, **opts)
        seen = 0
        for features, targets, noise in batches:
            features = self._check_features(features)
            if features.dim() != 2:
                raise ShapeError(
                    expected_got("solve_pseudo_labels features", "(B, d)", tuple(features.shape))
                )
            b = features.shape[0]
            targets = check_finite(targets.to(features), "solve_pseudo_labels targets")
            if targets.shape[-1] != b or targets.shape[:-1] not in (torch.Size(), heads):
                raise ShapeError(
                    expected_got(
                        "solve_pseudo_labels targets",
                        f"shape {(*heads, b)} or ({b},)",
                        tuple(targets.shape),
                    )
                )
            prior = self.prior_mean(features)  # targets relative to the prior mean m(g)
            if prior is not None:
                targets = targets - prior.to(targets)
            kzg = self.covar_module(z, features).to_dense()  # shape: (*batch, m, B)
            a = torch.linalg.solve_triangular(chol, kzg, upper=False)  # shape: (*batch, m, B)
            kdiag = self.covar_module(features, diag=True)  # shape: (*batch, B)
            var = (kdiag - (a * a).sum(-2)).clamp_min(0.0) + noise.to(features)
            prec = var.clamp_min(torch.finfo(var.dtype).tiny).reciprocal().double()
            a, t = a.double(), targets.double()
            gram += (a * prec.unsqueeze(-2)) @ a.transpose(-1, -2)
            rhs += (a * (prec * t).unsqueeze(-2)).sum(-1)
            y_sum, y_sq = y_sum + t.sum(-1), y_sq + (t * t).sum(-1)
            seen += b
        if seen == 0:
            raise InputDataError(
                "FeatureSpaceInducingGP.solve_pseudo_labels: expected at least one batch of "
                "data, got none."
            )
        if float(ridge) > 0.0:
            y_var = (y_sq / seen - (y_sum / seen) ** 2).clamp_min(1e-12)  # shape: (*batch)
            k_bar = kzz.diagonal(dim1=-2, dim2=-1).mean(-1).double()  # shape: (*batch)
            rho = float(ridge) * k_bar / y_var  # shape: (*batch)
            lin = self._linear_pseudo_labels().double().unsqueeze(-1)  # shape: (*batch, m, 1)
            alpha0 = torch.linalg.solve_triangular(chol.double(), lin, upper=False).squeeze(-1)
            eye = torch.eye(m, **opts)
            gram = gram + rho[..., None, None] * eye
            rhs = rhs + rho.unsqueeze(-1) * alpha0
        # relative jitter 1e-12 (float64); _safe_cholesky raises it with a warning if needed
        jitter = 1e-12 * float(gram.diagonal(dim1=-2, dim2=-1).abs().max().clamp_min(1e-300))
        factor = _safe_cholesky(gram, jitter, "FeatureSpaceInducingGP.solve_pseudo_labels")
        alpha = torch.cholesky_solve(rhs.unsqueeze(-1), factor)  # shape: (*batch, m, 1)
        r = (chol.double() @ alpha).squeeze(-1).to(z)  # r - m(Z), shape: (*batch, m)
        self.pseudo_label_offset.copy_(r - self._linear_pseudo_labels())
        prior = self.prior_mean(z)
        return r if prior is None else prior.to(r) + r

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # state dicts saved before the offset existed load with delta = 0
        key, z_key = prefix + "pseudo_label_offset", prefix + "inducing_points"
        if key not in state_dict and z_key in state_dict:
            state_dict[key] = state_dict[z_key].new_zeros(state_dict[z_key].shape[:-1])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

r"""Generalized variational inference in function space with the Wasserstein-2 distance (GWI).

Prior :math:`\mathbb P = \mathcal{GP}(m_P, k)` (the model's ``forward``, fitted beforehand and
frozen); variational measure :math:`\mathbb Q = \mathcal{GP}(m_Q, r)` with a free mean module
:math:`m_Q` (a neural network by default) and

.. math::

    r(x, x') = k(x, x') - k_{xZ} K_{ZZ}^{-1} k_{Zx'} + k_{xZ} L L^\top k_{Zx'}

(REFERENCES.md, GWI).  The divergence is the Wasserstein-2 estimator of
003_4a6349f7433d9fd1.txt section 2.1.2 (see :func:`~gpext.variational.wasserstein2_estimate`).
"""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.variational._variational_strategy import _VariationalStrategy
from linear_operator.operators import (
    DenseLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)

from gpext.errors import InputTypeError, NotFittedError, ShapeError, expected_got
from gpext.utils import check_finite, check_positive_int
from gpext.variational.wasserstein_distance import safe_cholesky, wasserstein2_estimate
from gpext.variational.wasserstein_network_mean import WassersteinNetworkMean
from gpext.variational.wasserstein_variational_distribution import (
    WassersteinVariationalDistribution,
)

__all__ = ["WassersteinVariationalStrategy"]


class WassersteinVariationalStrategy(_VariationalStrategy):
    r"""Variational strategy of GWI: :math:`\mathbb Q = \mathcal{GP}(m_Q, r)` and a W2 divergence.

    .. math::

        \mathcal L = -\mathbb E_{\mathbb Q}[\log p(y \mid F)] + \sum_j W_2^2(\mathbb P_j, \mathbb Q_j)

    (003, section 2.1).  Calling the strategy on inputs ``x`` returns
    :math:`\mathcal N(m_Q(x), r(x, x))`.  In ``train()`` mode each call also estimates
    :math:`W_2^2(\mathbb P, \mathbb Q)` on that batch with a fresh random subsample
    :math:`X_S` of ``num_subsample`` of its points; :meth:`kl_divergence` returns that estimate,
    so the strategy plugs into GPyTorch's approximate-MLL machinery
    (:class:`gpext.mlls.GWIObjective`, or any ``_ApproximateMarginalLogLikelihood``, which divides
    it by ``num_data`` as 003's objective scaled per datum requires).

    Contract differences from GPyTorch's strategies: the mean of :math:`\mathbb Q` is a free
    module, not a function of inducing values, so there is no pseudo-point exact GP and
    :meth:`get_fantasy_model` raises ``NotImplementedError``; the divergence depends on the last
    training batch, not only on the variational parameters.

    The cached estimate of the last training batch carries that batch's autograd graph only
    while the strategy is in train mode: leaving it (``eval()``, ``train(False)``) detaches the
    cache, which frees the graph, and copies (``copy.deepcopy``, ``pickle``, as made by
    BoTorch's ``subset_output`` and GPyTorch's fantasy models) hold a detached clone in any
    mode.

    The prior kernel should be fitted beforehand and frozen (``requires_grad_(False)``); the
    strategy does not freeze it, so that it can also be trained jointly if wanted.

    Args:
        model: The :class:`~gpytorch.models.ApproximateGP` whose ``forward`` is the prior.
        inducing_points: Inducing inputs ``Z`` (GWI uses a subset of the data).
            # shape: (*batch, M, D)
        variational_distribution: A :class:`WassersteinVariationalDistribution` holding ``L``.
        learn_inducing_locations: Whether ``Z`` is a parameter.
        mean_module: The mean :math:`m_Q`; default a :class:`WassersteinNetworkMean` MLP.
        num_subsample: Size ``N_S`` of the subsample ``X_S`` of each batch (100 as in the
            public code); the whole batch is used when it is smaller.
        latent_dim: Negative batch dimension that indexes ``J`` independent latent functions;
            their W2 terms are summed (003 eq. for :math:`\mathcal L`).  ``None``: no sum.
        jitter_val: Absolute jitter for the Cholesky factor of ``K_ZZ`` (default GPyTorch's
            ``variational_cholesky_jitter``).
        w2_jitter: Relative jitter for the subsample Gram matrices of the W2 estimator (default
            1e-6 in float64, 1e-4 in float32); raised with a ``NumericalWarning`` if needed.
            The estimator's small blocks are computed in float64 whatever the model's dtype
            (see :func:`~gpext.variational.wasserstein2_estimate`); with ``w2_jitter=0`` an
            estimate that comes out negative is clamped to 0 with a ``NumericalWarning``.
        generator: Random generator for the subsamples.

    Raises:
        InputTypeError: If ``variational_distribution`` is not a
            :class:`WassersteinVariationalDistribution`.

    Example:
        >>> import gpytorch, torch
        >>> from gpytorch.distributions import MultivariateNormal
        >>> from gpext.variational import (
        ...     WassersteinVariationalDistribution, WassersteinVariationalStrategy)
        >>> class GWI(gpytorch.models.ApproximateGP):
        ...     def __init__(self, z):
        ...         dist = WassersteinVariationalDistribution(z.shape[0])
        ...         super().__init__(WassersteinVariationalStrategy(self, z, dist))
        ...         self.mean_module = gpytorch.means.ZeroMean()
        ...         self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        ...     def forward(self, x):
        ...         return MultivariateNormal(self.mean_module(x), self.covar_module(x))
        >>> model = GWI(torch.randn(10, 2))  # 10 inducing points in 2-d
        >>> model(torch.randn(50, 2)).mean.shape
        torch.Size([50])
    """

    has_fantasy_strategy = False

    def __init__(
        self,
        model,
        inducing_points: torch.Tensor,
        variational_distribution: WassersteinVariationalDistribution,
        learn_inducing_locations: bool = True,
        *,
        mean_module: torch.nn.Module | None = None,
        num_subsample: int = 100,
        latent_dim: int | None = None,
        jitter_val: float | None = None,
        w2_jitter: float | None = None,
        generator: torch.Generator | None = None,
    ):
        if not isinstance(variational_distribution, WassersteinVariationalDistribution):
            raise InputTypeError(
                expected_got(
                    "WassersteinVariationalStrategy.variational_distribution",
                    "a WassersteinVariationalDistribution",
                    type(variational_distribution).__name__,
                )
            )
        if not isinstance(inducing_points, torch.Tensor):
            raise InputTypeError(
                expected_got("inducing_points", "a torch.Tensor", type(inducing_points).__name__)
            )
        check_finite(inducing_points, "inducing_points")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise InputTypeError(
                expected_got("generator", "a torch.Generator", type(generator).__name__)
            )
        if latent_dim is not None and (not isinstance(latent_dim, int) or latent_dim >= 0):
            raise InputTypeError(
                expected_got("latent_dim", "a negative int or None", repr(latent_dim))
            )
        super().__init__(
            model, inducing_points, variational_distribution, learn_inducing_locations, jitter_val
        )
        self.num_subsample = check_positive_int(num_subsample, "num_subsample")
        self.latent_dim = latent_dim
        self.w2_jitter = w2_jitter
        self.generator = generator
        if mean_module is None:
            num_outputs = 1
            if latent_dim is not None:
                num_outputs = variational_distribution.batch_shape[latent_dim]
            mean_module = WassersteinNetworkMean(self.inducing_points.shape[-1], num_outputs)
            mean_module = mean_module.to(self.inducing_points)
        self.mean_module = mean_module
        self._w2_cache: torch.Tensor | None = None

    @property
    def prior_distribution(self) -> MultivariateNormal:
        """The prior :math:`\\mathcal N(m_P(Z), K_{ZZ})` over the inducing values."""
        prior = self.model.forward(self.inducing_points)
        return MultivariateNormal(
            prior.mean, prior.lazy_covariance_matrix.add_jitter(self.jitter_val)
        )

    def train(self, mode: bool = True) -> WassersteinVariationalStrategy:
        """Set train mode; leaving it detaches the cached W2 estimate (see the class).

        Args:
            mode: ``True`` for train mode, ``False`` for eval mode.

        Returns:
            The strategy.
        """
        if not mode and self._w2_cache is not None:
            self._w2_cache = self._w2_cache.detach()
        return super().train(mode)

    def __getstate__(self) -> dict:
        # deepcopy and pickle refuse tensors that carry an autograd graph: copy the cached
        # estimate of the last training batch detached (the live strategy keeps its graph)
        state = super().__getstate__()
        cache = state.get("_w2_cache")
        if isinstance(cache, torch.Tensor) and cache.grad_fn is not None:
            state["_w2_cache"] = cache.detach().clone()
        # GPyTorch's memoised variational distribution (built from L with its graph) is a cache:
        # the copy rebuilds it on first use
        if state.get("_memoize_cache"):
            state["_memoize_cache"] = {}
        return state

    def _w2_relative_jitter(self, dtype: torch.dtype) -> float:
        if self.w2_jitter is not None:
            return float(self.w2_jitter)
        return 1e-6 if dtype == torch.float64 else 1e-4

    def _check_inputs(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, torch.Tensor):
            raise InputTypeError(expected_got("x", "a torch.Tensor", type(x).__name__))
        if x.dim() == 1:
            x = x.unsqueeze(-1)
        d = self.inducing_points.shape[-1]
        if x.shape[-1] != d:
            raise ShapeError(
                expected_got("x", f"shape (..., N, {d}) like the inducing points", tuple(x.shape))
            )
        if x.shape[-2] == 0:
            raise ShapeError(expected_got("x", "at least one input point", tuple(x.shape)))
        return check_finite(x, "x")

    def _moments(self, x: torch.Tensor, z: torch.Tensor | None = None, *, dense: bool, **kwargs):
        """Prior/variational blocks on ``[Z, x]`` shared by forward and the W2 estimate."""
        z = self.inducing_points if z is None else z
        if z.shape[:-2] != x.shape[:-2]:
            x, z = self._expand_inputs(x, z)
        m = z.shape[-2]
        prior = self.model.forward(torch.cat([z, x], dim=-2), **kwargs)
        kfull = prior.lazy_covariance_matrix
        kzz = kfull[..., :m, :m].to_dense()
        kzx = kfull[..., :m, m:].to_dense()
        kxx = kfull[..., m:, m:]
        kxx = kxx.to_dense() if dense else kxx
        lower = self._variational_distribution.lower
        batch = torch.broadcast_shapes(kzx.shape[:-2], lower.shape[:-2], prior.batch_shape)
        kzz = kzz.expand(*batch, m, m)
        kzx = kzx.expand(*batch, *kzx.shape[-2:])
        chol = safe_cholesky(kzz, jitter=self.jitter_val, name="K_ZZ")
        a = torch.linalg.solve_triangular(chol, kzx, upper=False)  # K_ZZ^{-1/2} K_ZX
        b = lower.mT @ kzx  # L^T K_ZX, shape: (*batch, M, N)
        mean_p = prior.mean[..., m:].expand(*batch, x.shape[-2])
        mean_q = self.mean_module(x)
        mean_q = mean_q.expand(*torch.broadcast_shapes(mean_q.shape, mean_p.shape))
        return x, mean_p, mean_q, kxx, a, b

    def __call__(self, x: torch.Tensor, prior: bool = False, **kwargs) -> MultivariateNormal:
        """Check the inputs, then GPyTorch's strategy call, which runs :meth:`forward`.

        GPyTorch's ``_VariationalStrategy.__call__`` clears the caches in train mode,
        initialises ``L`` from :attr:`prior_distribution` on first use, expands ``x`` and ``Z``
        to common batch shapes and calls :meth:`forward`.
        """
        if not prior:
            x = self._check_inputs(x)
        return super().__call__(x, prior=prior, **kwargs)

    def forward(
        self,
        x: torch.Tensor,
        inducing_points: torch.Tensor,
        inducing_values: torch.Tensor | None = None,
        variational_inducing_covar=None,
        diag: bool = True,
        **kwargs,
    ) -> MultivariateNormal:
        r""":math:`\mathcal N(m_Q(x), r(x, x))`; in train mode also the W2 estimate of the batch.

        The strategy hook of GPyTorch's ``_VariationalStrategy``.  With
        :math:`A = K_{ZZ}^{-1/2} K_{ZX}` and :math:`B = L^\top K_{ZX}`,
        :math:`r(x, x) = K_{XX} - A^\top A + B^\top B`.  The inducing values and their
        covariance that GPyTorch passes are not used: :math:`\mathbb Q` is parametrised by
        ``L`` and the free mean :math:`m_Q`, not by a distribution over inducing values.
        ``diag`` is ignored (the full covariance is returned, lazily in eval mode).

        Args:
            x: Inputs. # shape: (*batch, N, D)
            inducing_points: ``Z``, expanded to the batch of ``x``. # shape: (*batch, M, D)
            inducing_values: Unused.
            variational_inducing_covar: Unused.
            diag: Unused.
            **kwargs: Passed to the model's ``forward`` (the prior).

        Returns:
            The variational marginal at ``x``.
        """
        x, mean_p, mean_q, kxx, a, b = self._moments(
            x, inducing_points, dense=self.training, **kwargs
        )
        if self.training:
            self._w2_cache = self._estimate(mean_p, mean_q, kxx, a, b, subsample=None)
            covar = DenseLinearOperator(kxx - a.mT @ a + b.mT @ b)
        else:
            n = x.shape[-2]
            kxx = kxx.expand(*a.shape[:-2], n, n)
            covar = kxx + MatmulLinearOperator(-a.mT, a) + RootLinearOperator(b.mT)
        batch = torch.broadcast_shapes(mean_q.shape[:-1], covar.shape[:-2])
        return MultivariateNormal(
            mean_q.expand(*batch, mean_q.shape[-1]), covar.expand(*batch, *covar.shape[-2:])
        )

    def _estimate(self, mean_p, mean_q, kxx, a, b, subsample: torch.Tensor | None) -> torch.Tensor:
        n = kxx.shape[-1]
        if subsample is None:
            if self.num_subsample >= n:
                subsample = torch.arange(n)
            else:
                subsample = torch.randperm(n, generator=self.generator)[: self.num_subsample]
        idx = subsample.to(kxx.device)
        k_diag = kxx.diagonal(dim1=-2, dim2=-1)
        r_diag = k_diag - (a**2).sum(-2) + (b**2).sum(-2)
        k_xs = kxx[..., :, idx]
        r_sx = k_xs.mT - a[..., idx].mT @ a + b[..., idx].mT @ b
        k_ss = k_xs[..., idx, :]
        r_ss = r_sx[..., idx]
        w2 = wasserstein2_estimate(
            mean_p, mean_q, k_diag.expand_as(r_diag), r_diag, k_xs.expand_as(r_sx.mT), r_sx,
            k_ss.expand_as(r_ss), r_ss, jitter=self._w2_relative_jitter(kxx.dtype),
        )  # fmt: skip
        if self.latent_dim is not None:
            w2 = w2.sum(self.latent_dim)
        return w2

    def wasserstein_distance(
        self, x: torch.Tensor, subsample: torch.Tensor | None = None, **kwargs
    ) -> torch.Tensor:
        """Estimate :math:`W_2^2(\\mathbb P, \\mathbb Q)` on the empirical measure of ``x``.

        Args:
            x: Inputs whose empirical measure replaces the input measure. # shape: (*batch, N, D)
            subsample: Indices of ``X_S`` in ``x`` (default: a random subset of
                ``num_subsample`` points, or all of ``x`` if it is smaller).

        Returns:
            The estimate (summed over ``latent_dim`` if set). # shape: (*batch,)
        """
        x = self._check_inputs(x)
        if not self.variational_params_initialized.item():
            self._variational_distribution.initialize_variational_distribution(
                self.prior_distribution
            )
            self.variational_params_initialized.fill_(1)
        x, mean_p, mean_q, kxx, a, b = self._moments(x, dense=True, **kwargs)
        return self._estimate(mean_p, mean_q, kxx, a, b, subsample)

    def kl_divergence(self) -> torch.Tensor:
        """The W2 estimate of the last training batch (stands in for the KL of SVGP).

        Raises:
            NotFittedError: If the strategy has not been called on a batch in train mode.
        """
        if self._w2_cache is None:
            raise NotFittedError(
                "WassersteinVariationalStrategy.kl_divergence: no training batch seen. Call the "
                "model on a batch in train() mode before evaluating the objective."
            )
        return self._w2_cache

    def initialize_from_data(self, x: torch.Tensor, noise_variance: float | torch.Tensor) -> None:
        r"""Set :math:`L = \operatorname{chol}((K_{ZZ} + K_{ZX}K_{XZ}/\sigma^2)^{-1})` (REFERENCES.md).

        Args:
            x: Training inputs (or a subset). # shape: (N, D)
            noise_variance: Observation-noise variance of the fitted prior.
        """
        x = self._check_inputs(x)
        with torch.no_grad():
            z = self.inducing_points
            if z.shape[:-2] != x.shape[:-2]:
                x, z = self._expand_inputs(x, z)
            m = z.shape[-2]
            kfull = self.model.forward(torch.cat([z, x], dim=-2)).lazy_covariance_matrix
            kzz = kfull[..., :m, :m].to_dense()
            kzx = kfull[..., :m, m:].to_dense()
            eye = torch.eye(m, dtype=kzz.dtype, device=kzz.device)
            self._variational_distribution.initialize_from_data(
                kzz + self.jitter_val * eye, kzx, noise_variance
            )
        self.variational_params_initialized.fill_(1)

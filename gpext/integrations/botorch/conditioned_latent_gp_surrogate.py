r"""A gpext latent-GP adapter conditioned on extra observations (``condition_on_observations``)."""

from __future__ import annotations

import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DenseLinearOperator

from gpext.errors import InputDataError
from gpext.integrations.botorch._fantasize import (
    noise_floor,
    prepare_conditioning,
)
from gpext.integrations.botorch.latent_gp_surrogate import LatentGPSurrogate
from gpext.utils import safe_cholesky

__all__ = ["ConditionedLatentGPSurrogate"]


class ConditionedLatentGPSurrogate(LatentGPSurrogate):
    r"""The Gaussian posterior of a latent-GP adapter, conditioned on observations ``(X, Y)``.

    The base adapter reports, output by output, a Gaussian process posterior
    :math:`f \mid \mathcal D \sim \mathcal{GP}(m, k)` (in the outcome-transformed space).
    Observing :math:`\mathbf y = f(X) + \boldsymbol\varepsilon`,
    :math:`\boldsymbol\varepsilon \sim \mathcal N(0, \Sigma)`,
    :math:`\Sigma = \operatorname{diag}(\sigma^2_1, \dots, \sigma^2_n)`, gives the Gaussian
    process

    .. math::

        m'(x) &= m(x) + k(x, X)\,(k(X, X) + \Sigma)^{-1}\,(\mathbf y - m(X)), \\
        k'(x, x') &= k(x, x') - k(x, X)\,(k(X, X) + \Sigma)^{-1}\,k(X, x'),

    a rank-``n`` update of the mean and covariance computed from the base's joint posterior at
    ``[X, x]``.  The update is exact for the Gaussian posterior the adapter reports, so further
    conditioning equals conditioning on all the data at once (the model stores the union).  It
    is refit-free: the wrapped model (network, inducing points, hyperparameters, GWI's
    variational mean) is not retrained, so the new data change neither the features nor the
    kernel; refitting on the augmented data set would in general give a different posterior.
    The outputs of the base are independent, so each is conditioned on its own column of ``Y``.

    Noise: ``noise`` (outcome-transformed space) if given, else the base's noise model
    (:math:`T\sigma^2` for GWI regression, the Gaussian noise of IGN regression), else none
    (a classifier's latent functions are observed directly).  Every variance is raised to at
    least :math:`\rho\,\overline{k(X, X)}` (``noise_floor``: :math:`\rho` is
    ``linear_operator.settings.cholesky_jitter``, ``1e-8`` in float64), which keeps the
    noise-free update stable.

    The model holds the base adapter by reference (refitting the base in place changes it)
    and the conditioning data in the transformed spaces as plain attributes, with their
    autograd graphs (so that ``qKnowledgeGradient`` differentiates through the fantasy
    points); copies (``copy.deepcopy``, ``pickle``) hold them detached.  Its batch shape is that of the data, fantasy dimension first after
    ``fantasize``: ``num_fantasies x batch``; a query ``(*batch_q, q, d)`` broadcasts with it.
    :meth:`class_probabilities` is not available (the posterior is that of the latents).

    Args:
        base: A :class:`LatentGPSurrogate` (a conditioned one is extended with the new data).
        X: New inputs, in the original input space. # shape: (*batch_x, n, d)
        Y: New observations, in the original outcome space. # shape: (*batch_y, n, m)
        noise: Noise variances in the outcome-transformed space, broadcastable to ``Y``.

    Raises:
        InputTypeError: If ``base`` is not a latent-GP adapter, or the data are not floating
            tensors of the model's dtype.
        ShapeError: If the data shapes do not match the model.
        InputDataError: For non-finite data or negative noise, or when ``base`` is a
            conditioned model restricted by ``subset_output`` (condition first, then subset).

    Example:
        >>> import torch
        >>> from gpext.integrations.botorch import IGNSurrogate, fit_gpext_surrogate
        >>> from gpext.models import InducingGPNetwork
        >>> from gpext.nn import MLP
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=g)
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> ign = InducingGPNetwork(MLP(2, [16], 4), num_inducing=8).double()
        >>> model = fit_gpext_surrogate(IGNSurrogate(ign, train_X=X, train_Y=Y), epochs=50)
        >>> X_new = torch.rand(2, 2, dtype=torch.float64, generator=g)
        >>> Y_new = (6 * X_new).sin().sum(-1, keepdim=True)
        >>> fantasy = model.condition_on_observations(X_new, Y_new)  # X_new: (2, d)
        >>> fantasy.posterior(torch.rand(5, 1, 2, dtype=X_new.dtype)).variance.shape
        torch.Size([5, 1, 1])
    """

    def __init__(
        self,
        base: LatentGPSurrogate,
        X: torch.Tensor,
        Y: torch.Tensor,
        noise: torch.Tensor | None = None,
    ) -> None:
        what = "ConditionedLatentGPSurrogate"
        X, Y, noise, Xt, Yt = prepare_conditioning(
            base,
            X,
            Y,
            noise,
            base_class=LatentGPSurrogate,
            conditioned_class=ConditionedLatentGPSurrogate,
            what=what,
        )
        batch = torch.broadcast_shapes(Xt.shape[:-2], Yt.shape[:-2], base.batch_shape)
        if noise is None:
            default = base._exposed_noise_variance(Xt)  # shape: (*b, m or 1, n) or None
            noise = Yt.new_zeros(()) if default is None else default.mT.to(Yt)
        else:
            batch = torch.broadcast_shapes(batch, noise.shape[:-2])
        n, d, m = Xt.shape[-2], Xt.shape[-1], Yt.shape[-1]
        Xt, Yt = Xt.expand(*batch, n, d), Yt.expand(*batch, n, m)
        noise = noise.expand(*batch, n, m)
        root = base
        if isinstance(base, ConditionedLatentGPSurrogate):
            root = base.base_model
            n0 = base.conditioning_X.shape[-2]
            Xt = torch.cat([base.conditioning_X.expand(*batch, n0, d), Xt], dim=-2)
            Yt = torch.cat([base.conditioning_Y.expand(*batch, n0, m), Yt], dim=-2)
            noise = torch.cat([base.conditioning_noise.expand(*batch, n0, m), noise], dim=-2)
        self._input_dim = root._input_dim
        super().__init__()
        self.base_model = root
        self.model = root.model
        if hasattr(root, "input_transform"):
            self.input_transform = root.input_transform
        if hasattr(root, "outcome_transform"):
            self.outcome_transform = root.outcome_transform
        self._num_outputs = root.num_outputs
        #: Conditioning inputs (input-transformed). # shape: (*batch, n, d)
        self.conditioning_X = Xt
        #: Conditioning observations (outcome-transformed). # shape: (*batch, n, m)
        self.conditioning_Y = Yt
        #: Their noise variances before the floor (outcome-transformed). # shape: (*batch, n, m)
        self.conditioning_noise = noise
        self.eval()

    def __getstate__(self) -> dict:
        # deepcopy and pickle refuse tensors that carry an autograd graph (fantasies drawn from
        # the posterior do): copies hold the data detached, the live model keeps its graph
        state = super().__getstate__()
        for key in ("conditioning_X", "conditioning_Y", "conditioning_noise"):
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                state[key] = value.detach()
        return state

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the conditioning data (``num_fantasies x batch`` after fantasize)."""
        return self.conditioning_X.shape[:-2]

    def _latent(self, X: torch.Tensor) -> MultivariateNormal:
        Xc = self.conditioning_X
        n, q, d = Xc.shape[-2], X.shape[-2], X.shape[-1]
        batch = torch.broadcast_shapes(X.shape[:-2], Xc.shape[:-2])
        joint = torch.cat([Xc.expand(*batch, n, d), X.expand(*batch, q, d)], dim=-2)
        mean, cov = self.base_model._latent_moments(joint)  # shape: (*b, m, n+q), (.., n+q)
        cov = cov.to_dense()
        if n == 0:
            return MultivariateNormal(mean, DenseLinearOperator(cov))
        m_c, m_q = mean[..., :n], mean[..., n:]
        k_cc, k_qc, k_qq = cov[..., :n, :n], cov[..., n:, :n], cov[..., n:, n:]
        noise = self.conditioning_noise.mT  # shape: (*b, m, n)
        noise = torch.maximum(noise, noise_floor(k_cc.diagonal(dim1=-2, dim2=-1)))
        k_noisy = k_cc + torch.diag_embed(noise.expand(k_cc.shape[:-1]))
        chol = safe_cholesky(k_noisy, name="ConditionedLatentGPSurrogate k(X, X) + Sigma")
        resid = (self.conditioning_Y.mT - m_c).unsqueeze(-1)  # shape: (*b, m, n, 1)
        alpha = torch.cholesky_solve(resid, chol)
        v = torch.linalg.solve_triangular(chol, k_qc.mT, upper=False)  # shape: (*b, m, n, q)
        mean_q = m_q + (k_qc @ alpha).squeeze(-1)
        cov_q = k_qq - v.mT @ v
        cov_q = 0.5 * (cov_q + cov_q.mT)
        return MultivariateNormal(mean_q, DenseLinearOperator(cov_q))

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        return self.base_model._exposed_noise_variance(X)

    def _class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        raise InputDataError(
            "ConditionedLatentGPSurrogate.class_probabilities: expected an unconditioned "
            "adapter, got a conditioned one; its posterior is that of the conditioned latent "
            "functions (use posterior)."
        )

r"""An ensemble adapter updated on extra observations by an ensemble square-root transform."""

from __future__ import annotations

import math

import torch

from gpext.errors import InputDataError, expected_got
from gpext.integrations.botorch._fantasize import (
    noise_floor,
    prepare_conditioning,
)
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate
from gpext.utils import safe_cholesky

__all__ = ["ConditionedEnsembleSurrogate"]


def square_root_update(
    values: torch.Tensor, Y: torch.Tensor, noise: torch.Tensor | None
) -> torch.Tensor:
    r"""Member-mixing matrix :math:`\mathrm M` of the square-root update (see the class).

    Args:
        values: Member values at the conditioning points. # shape: (*b, S, n, m)
        Y: Observations. # shape: (*b, n, m)
        noise: Noise variances (``None``: none, a jitter is used). # shape: (*b, n, m or 1)

    Returns:
        :math:`\mathrm M` with :math:`f'_s = \sum_t f_t \mathrm M_{ts}`. # shape: (*b, S, S)
    """
    s, n, m = values.shape[-3:]
    p = n * m
    f = values.reshape(*values.shape[:-3], s, p)
    mean = f.mean(-2)  # shape: (*b, p)
    u = (f - mean.unsqueeze(-2)).mT / math.sqrt(s - 1)  # shape: (*b, p, S)
    c = u @ u.mT
    var = c.diagonal(dim1=-2, dim2=-1)
    if noise is None:
        noise = var.new_zeros(())
    else:
        noise = noise.expand(*noise.shape[:-1], m).reshape(*noise.shape[:-2], p)
    noise = torch.maximum(noise, noise_floor(var))
    y = Y.reshape(*Y.shape[:-2], p)
    batch = torch.broadcast_shapes(u.shape[:-2], y.shape[:-1], noise.shape[:-1])
    u, c = u.expand(*batch, p, s), c.expand(*batch, p, p)
    noise = noise.expand(*batch, p)
    chol = safe_cholesky(
        c + torch.diag_embed(noise), name="ConditionedEnsembleSurrogate C(X, X) + Sigma"
    )
    resid = (y - mean).expand(*batch, p).unsqueeze(-1)
    beta = u.mT @ torch.cholesky_solve(resid, chol)  # shape: (*b, S, 1)
    w = torch.linalg.solve_triangular(chol + torch.diag_embed(noise.sqrt()), u, upper=False)
    z = torch.linalg.solve_triangular(chol.mT, w, upper=True)
    eye = torch.eye(s, dtype=values.dtype, device=values.device)
    return eye - u.mT @ z + beta / math.sqrt(s - 1)


class ConditionedEnsembleSurrogate(SampleEnsembleSurrogate):
    r"""An ensemble adapter updated on observations ``(X, Y)`` without retraining any member.

    Exact Bayesian conditioning of an ensemble would need the members' likelihood and a refit;
    this is the refit-free approximation of the ensemble square-root filters (the square-root
    form of Andrews, 1968, as surveyed by Tippett et al., 2003, *Mon. Wea. Rev.* 131).  Let
    :math:`F = [f_1(X), \dots, f_S(X)] \in \mathbb R^{p \times S}` be the member values at the
    ``p = n m`` observed (point, output) pairs (in the outcome-transformed space),
    :math:`\bar f = F\mathbf 1/S`, :math:`U = (F - \bar f\mathbf 1^\top)/\sqrt{S-1}` (so the
    ensemble covariance is :math:`\hat C = UU^\top`), :math:`\Sigma = \operatorname{diag}(\sigma^2)`
    the noise, and :math:`LL^\top = UU^\top + \Sigma`.  Member :math:`s` becomes

    .. math::

        f'_s(x) &= \sum_{t=1}^S f_t(x)\,\mathrm M_{ts}, \qquad
        \mathrm M = \frac{\boldsymbol\beta\mathbf 1^\top}{\sqrt{S-1}} + T, \\
        \boldsymbol\beta &= U^\top (UU^\top + \Sigma)^{-1}(\mathbf y - \bar f), \qquad
        T = I - U^\top L^{-\top}(L + \Sigma^{1/2})^{-1}U,

    where :math:`TT^\top = I - U^\top(UU^\top + \Sigma)^{-1}U` and :math:`T\mathbf 1 = \mathbf 1`.
    Consequently, at every pair of inputs, the updated ensemble's mean and unbiased covariance
    are exactly the Gaussian update of the ensemble's own moments,

    .. math::

        \bar f'(x) = \bar f(x) + \hat C(x, X)(\hat C(X, X) + \Sigma)^{-1}(\mathbf y - \bar f(X)),
        \quad
        \hat C'(x, x') = \hat C(x, x') - \hat C(x, X)(\hat C(X, X) + \Sigma)^{-1}\hat C(X, x'),

    and every updated member is still a function (a fixed combination of member functions), so
    the posterior stays an ``EnsemblePosterior`` whose samples are whole functions.  Further
    conditioning composes the mixing matrices.

    Limits: (i) the update acts in the span of the members: :math:`\hat C` has rank at most
    :math:`S - 1`, so with ``n m >= S - 1`` nearly noise-free observations the ensemble
    collapses, and directions the members do not span are never learned; (ii) the ensemble
    is treated as Gaussian: skewed or multimodal member sets are updated by their first two
    moments only; (iii) with few members, spurious sample correlations move the ensemble far
    from ``X`` as well (no localisation); (iv) nothing is retrained: features, weights and
    hyperparameters stay as fitted, so refitting on the augmented data would differ.

    Noise: ``noise`` (outcome-transformed space) if given, else the adapter's noise model
    (VBoot's fitted noise, a Gaussian network's mean predicted variance times its
    ``variance_scale``: the mean of the member noises that
    ``posterior(X, observation_noise=True)`` mixes), else none; every variance is raised to
    at least :math:`\rho\,\overline{\hat C(X, X)}` (``noise_floor``).

    The model holds the base adapter by reference and the mixing matrix (with its autograd
    graph; copies hold it detached) as a plain attribute; its batch shape is that of the data (``num_fantasies x
    batch`` after ``fantasize``).  :meth:`class_probabilities` is not available.

    Args:
        base: A :class:`SampleEnsembleSurrogate` (a conditioned one is updated further).
        X: New inputs, in the original input space. # shape: (*batch_x, n, d)
        Y: New observations, in the original outcome space. # shape: (*batch_y, n, m)
        noise: Noise variances in the outcome-transformed space, broadcastable to ``Y``.

    Raises:
        InputTypeError: If ``base`` is not an ensemble adapter, or the data are not floating
            tensors of the model's dtype.
        ShapeError: If the data shapes do not match the model.
        InputDataError: For non-finite data, negative noise, fewer than two members, or a
            conditioned base restricted by ``subset_output`` (condition first, then subset).

    Example:
        >>> import torch
        >>> from gpext.bootstrap import VBootRFF
        >>> from gpext.integrations.botorch import VBootSurrogate, fit_gpext_surrogate
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=g)
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> vboot = VBootRFF(num_features=200, num_particles=16, noise=1e-3)
        >>> ensemble = fit_gpext_surrogate(VBootSurrogate(vboot, train_X=X, train_Y=Y), generator=g)
        >>> X_new = torch.rand(2, 2, dtype=torch.float64, generator=g)
        >>> Y_new = (6 * X_new).sin().sum(-1, keepdim=True)
        >>> updated = ensemble.condition_on_observations(X_new, Y_new)
        >>> updated.posterior(torch.rand(5, 1, 2, dtype=X_new.dtype)).values.shape  # S = 16
        torch.Size([5, 16, 1, 1])
    """

    def __init__(
        self,
        base: SampleEnsembleSurrogate,
        X: torch.Tensor,
        Y: torch.Tensor,
        noise: torch.Tensor | None = None,
    ) -> None:
        what = "ConditionedEnsembleSurrogate"
        X, Y, noise, Xt, Yt = prepare_conditioning(
            base,
            X,
            Y,
            noise,
            base_class=SampleEnsembleSurrogate,
            conditioned_class=ConditionedEnsembleSurrogate,
            what=what,
        )
        if Xt.shape[-2] == 0:  # nothing to condition on: the identity mix (S from one point)
            num = base.forward(Xt.new_zeros(1, Xt.shape[-1])).shape[-3]
            batch = torch.broadcast_shapes(Xt.shape[:-2], Yt.shape[:-2], base.batch_shape)
            mix = torch.eye(num, dtype=Xt.dtype, device=Xt.device).expand(*batch, num, num)
        else:
            values = base.forward(Xt)  # shape: (*b, S, n, m)
            if values.shape[-3] < 2:
                raise InputDataError(
                    expected_got(
                        f"{what}.base", "an ensemble of at least 2 members", values.shape[-3]
                    )
                )
            if noise is None:
                noise = base._exposed_noise_variance(Xt)
            mix = square_root_update(values, Yt, noise)
        root = base
        if isinstance(base, ConditionedEnsembleSurrogate):
            root = base.base_model
            mix = base.member_mix @ mix
        self._input_dim = root._input_dim
        super().__init__()
        self.base_model = root
        self.model = root.model
        self.ensemble_weights = root.ensemble_weights
        if hasattr(root, "input_transform"):
            self.input_transform = root.input_transform
        if hasattr(root, "outcome_transform"):
            self.outcome_transform = root.outcome_transform
        self._num_outputs = root.num_outputs
        #: Mixing matrix of the members, :math:`f' = f\,\mathrm M`. # shape: (*batch, S, S)
        self.member_mix = mix
        self.eval()

    def __getstate__(self) -> dict:
        # deepcopy and pickle refuse tensors that carry an autograd graph (fantasies drawn from
        # the posterior do): copies hold the data detached, the live model keeps its graph
        state = super().__getstate__()
        for key in ("member_mix",):
            value = state.get(key)
            if isinstance(value, torch.Tensor) and value.grad_fn is not None:
                state[key] = value.detach()
        return state

    @property
    def batch_shape(self) -> torch.Size:
        """Batch shape of the conditioning data (``num_fantasies x batch`` after fantasize)."""
        return self.member_mix.shape[:-2]

    @property
    def num_members(self) -> int:
        """Number of members ``S``."""
        return int(self.member_mix.shape[-1])

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """Updated member values at ``X`` (``batch x q x d``), shape ``batch x S x q x m``."""
        values = self.base_model.forward(X)  # shape: (*b, S, q, m)
        s, q, m = values.shape[-3:]
        flat = values.reshape(*values.shape[:-3], s, q * m).mT @ self.member_mix
        out = flat.mT.reshape(*flat.shape[:-2], s, q, m)
        if self._output_subset is not None:
            out = out[..., self._output_subset]
        return out

    def _members(self, X: torch.Tensor) -> torch.Tensor:
        if self.batch_shape != torch.Size([]):
            raise InputDataError(
                f"ConditionedEnsembleSurrogate: expected an unbatched model for member values "
                f"at (N, d) inputs, got batch shape {tuple(self.batch_shape)}; use forward."
            )
        return self.forward(X.unsqueeze(-2)).squeeze(-2).transpose(0, 1)  # shape: (S, N, m)

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        return self.base_model._exposed_noise_variance(X)

    def _member_class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        raise InputDataError(
            "ConditionedEnsembleSurrogate.class_probabilities: expected an unconditioned "
            "adapter, got a conditioned one; its members are combinations of the latent "
            "outputs (use posterior)."
        )

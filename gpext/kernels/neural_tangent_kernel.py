"""Infinite-width kernels (NTK and NNGP) of the NTK-parameterised ReLU MLP of VBootMLP."""

from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from gpytorch.priors import Prior

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.kernels._checked_inputs import CheckedInputsMixin
from gpext.utils import check_positive_int

__all__ = ["NeuralTangentKernel"]

_KINDS = ("ntk", "nngp")


def _arccos_kappas(rho: torch.Tensor, same: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
    r"""Normalised arc-cosine functions of degree 0 and 1 (Cho & Saul) at the cosine ``rho``.

    .. math::
        \kappa_0(\rho) = \frac{\pi - \arccos\rho}{\pi}, \qquad
        \kappa_1(\rho) = \frac{\sqrt{1 - \rho^2} + (\pi - \arccos\rho)\,\rho}{\pi}.

    ``rho`` is clamped to ``[-1, 1]``.  Within a few ulps of :math:`\pm 1` (and where ``same``
    marks a point paired with itself) the limits :math:`\kappa_0 \in \{0, 1\}` and
    :math:`\kappa_1 = \max(\rho, 0)` are used instead (:math:`\kappa_1` is exact to
    :math:`O(\delta^{3/2})` there, :math:`\kappa_0` to :math:`O(\delta^{1/2})`, the accuracy
    that rounding of ``rho`` allows anyway), which keeps ``arccos`` and ``sqrt`` away from their
    infinite derivatives: gradients stay finite on the diagonal and at duplicated inputs.
    """
    rho = rho.clamp(-1.0, 1.0)
    tol = 16.0 * torch.finfo(rho.dtype).eps
    inner = rho.abs() < 1.0 - tol
    if same is not None:
        inner = inner & ~same
    safe = torch.where(inner, rho, torch.zeros_like(rho))
    angle = torch.acos(safe)
    k0 = (math.pi - angle) / math.pi
    k1 = (torch.sqrt(1.0 - safe * safe) + (math.pi - angle) * safe) / math.pi
    if same is not None:
        rho = torch.where(same, torch.ones_like(rho), rho)
    k0 = torch.where(inner, k0, (rho > 0).to(rho.dtype))
    k1 = torch.where(inner, k1, rho.clamp_min(0.0))
    return k0, k1


class NeuralTangentKernel(CheckedInputsMixin, Kernel):
    r"""NTK or NNGP kernel of the infinite-width NTK-parameterised ReLU MLP of 001 Eq. (2).

    The network is the one :class:`~gpext.bootstrap.VBootMLP` trains
    (:class:`~gpext.bootstrap.EnsembleMLP`): ``L = num_layers`` ReLU hidden layers and a linear
    output layer,

    .. math::
        f_l(\mathbf x) = \frac{1}{\sqrt{D_{l-1}}} \mathbf W_l \varphi(f_{l-1}(\mathbf x))
        + \mathbf b_l, \quad l = 1, \dots, L + 1, \qquad
        W_{l,ij} \sim \mathcal N(0, \sigma_w^2),\ b_{l,i} \sim \mathcal N(0, \sigma_b^2),

    with :math:`\varphi` = ReLU (the identity on the input, :math:`D_0 = d`).  As every width
    :math:`D_1, \dots, D_L \to \infty`, with :math:`\rho = \Sigma^{l}(\mathbf x, \mathbf x') /
    \sqrt{\Sigma^{l}(\mathbf x, \mathbf x) \Sigma^{l}(\mathbf x', \mathbf x')}` and the
    arc-cosine functions :math:`\kappa_0, \kappa_1` of Cho & Saul (2009),

    .. math::
        \Sigma^1(\mathbf x, \mathbf x') &= \sigma_w^2 \frac{\mathbf x^\top \mathbf x'}{d}
        + \sigma_b^2, \\
        \Sigma^{l+1} &= \frac{\sigma_w^2}{2} \sqrt{\Sigma^l(\mathbf x, \mathbf x)
        \Sigma^l(\mathbf x', \mathbf x')}\ \kappa_1(\rho) + \sigma_b^2, \qquad
        \dot\Sigma^{l+1} = \frac{\sigma_w^2}{2} \kappa_0(\rho), \\
        \Theta^1 &= \Sigma^1, \qquad \Theta^{l+1} = \Theta^l \dot\Sigma^{l+1} + \Sigma^{l+1},
        \\
        \kappa_0(\rho) &= 1 - \frac{\arccos\rho}{\pi}, \qquad
        \kappa_1(\rho) = \frac{\sqrt{1 - \rho^2} + (\pi - \arccos\rho)\,\rho}{\pi},

    (Jacot et al. 2018; Arora et al. 2019).  ``kind="nngp"`` returns the output's prior
    covariance at initialisation, :math:`\Sigma^{L+1}`; ``kind="ntk"`` returns
    :math:`\Theta^{L+1}`, the limit of the prior-weighted tangent kernel
    :math:`\nabla_\theta f(\mathbf x)^\top \mathbf P\, \nabla_\theta f(\mathbf x')` with
    :math:`\mathbf P` the prior covariance of the parameters (:math:`\sigma_w^2` on weights,
    :math:`\sigma_b^2` on biases): the function-space prior covariance of the network
    linearised at its initialisation.  For VBootMLP, where every parameter has prior variance
    :math:`\alpha^2`, this is :math:`\alpha^2 J J^\top`; the raw gradient Gram matrix
    :math:`J J^\top` that sets the gradient-descent dynamics is this kernel divided by
    :math:`\alpha^2` (the two coincide at VBootMLP's default ``prior_std=1``).  Each output of
    a multi-output network is an independent copy with this kernel.

    **Matching VBootMLP.**  For ``VBootMLP(hidden_sizes=hs, prior_std=alpha)`` use
    ``NeuralTangentKernel(num_layers=len(hs), weight_variance=alpha**2,
    bias_variance=alpha**2)`` (or :meth:`from_vboot_mlp`); the widths do not enter the limit.
    The defaults (two layers, variances 1) match VBootMLP's defaults.  VBootMLP centres the
    targets, so pair the kernel with a constant mean equal to the target offset.

    **Which GP limit describes the anchored ensemble.**  Each VBootMLP particle starts at its
    anchor, :math:`\theta_0 = \tilde\theta \sim \mathcal N(0, \alpha^2 I)`, and minimises
    001 Eq. (7).  In the infinite-width (lazy) limit the network is linear in
    :math:`\theta - \theta_0`, Eq. (7) becomes strongly convex, and its minimiser predicts

    .. math::
        f(\mathbf x_*) = f_0(\mathbf x_*) + \Theta_{*X} (\Theta_{XX} + \mathbf S)^{-1}
        (\tilde{\mathbf y} - f_0(X)), \qquad f_0 \sim \mathcal{GP}(0, \Sigma),\
        \tilde{\mathbf y} \sim \mathcal N(\mathbf y, \mathbf S),

    with :math:`\mathbf S` the (diagonal) label noise and :math:`\Theta, \Sigma` this kernel's
    NTK and NNGP at ``L = len(hidden_sizes)``.  Hence (Lee et al. 2019, He et al. 2020):

    * the ensemble **mean** is the posterior mean of the GP with the **NTK** kernel;
    * the ensemble **covariance** is :math:`\Sigma_{**} - \Theta_{*X} A^{-1}\Sigma_{X*} -
      \Sigma_{*X} A^{-1} \Theta_{X*} + \Theta_{*X} A^{-1} (\Sigma_{XX} + \mathbf S) A^{-1}
      \Theta_{X*}`, :math:`A = \Theta_{XX} + \mathbf S`: the posterior covariance of neither
      GP, because the initial function has the NNGP prior while the fitted correction has the
      NTK prior.  It equals a GP posterior only when :math:`\Theta = \Sigma`, i.e.
      ``num_layers=0`` (a linear model); for ReLU networks :math:`\Theta - \Sigma` is positive
      semi-definite and non-zero.  He et al. (2020) obtain exact NTK-GP posterior samples by
      adding an untrainable random function with kernel :math:`\Theta - \Sigma`; VBootMLP does
      not, so it does not sample the NTK-GP posterior;
    * the exact Bayesian posterior of the infinitely wide network with the prior of 001
      Eq. (4) (what MCMC targets) is the GP posterior with the **NNGP** kernel.

    This is a statement about the limit: at finite width, with Adam at VBootMLP's large
    learning rates and a fixed number of epochs, the network need not stay in the linear
    regime, so use the limit as a reference, not a guarantee.

    Variances are raw parameters behind :class:`gpytorch.constraints.Positive` (trainable by
    the marginal likelihood; call ``requires_grad_(False)`` on them to fix them).

    Args:
        num_layers: Number ``L`` of ReLU hidden layers (``len(VBootMLP.hidden_sizes)``);
            ``0`` gives the linear kernel :math:`\Sigma^1`.
        weight_variance: Prior variance :math:`\sigma_w^2` of every weight
            (VBootMLP: ``prior_std**2``).
        bias_variance: Prior variance :math:`\sigma_b^2` of every bias (VBootMLP:
            ``prior_std**2``; its biases are added unscaled).  Must be positive.
        kind: ``"ntk"`` (:math:`\Theta`) or ``"nngp"`` (:math:`\Sigma`).
        weight_variance_prior: Optional prior on :math:`\sigma_w^2`.
        bias_variance_prior: Optional prior on :math:`\sigma_b^2`.
        weight_variance_constraint: Constraint on :math:`\sigma_w^2` (default ``Positive()``).
        bias_variance_constraint: Constraint on :math:`\sigma_b^2` (default ``Positive()``).
        **kwargs: ``batch_shape``, ``active_dims`` and the other arguments of
            :class:`gpytorch.kernels.Kernel`.

    Raises:
        InputTypeError: If ``num_layers`` is not an integer or ``kind`` not a string.
        InputDataError: If ``num_layers < 0``, a variance is not positive and finite, or
            ``kind`` is unknown.

    Example:
        >>> kernel = NeuralTangentKernel(num_layers=2, kind="ntk")
        >>> x = torch.randn(10, 3)
        >>> kernel(x).shape, kernel(x, diag=True).shape
        (torch.Size([10, 10]), torch.Size([10]))
    """

    has_lengthscale = False

    def __init__(
        self,
        num_layers: int = 2,
        weight_variance: float = 1.0,
        bias_variance: float = 1.0,
        kind: str = "ntk",
        *,
        weight_variance_prior: Prior | None = None,
        bias_variance_prior: Prior | None = None,
        weight_variance_constraint: Interval | None = None,
        bias_variance_constraint: Interval | None = None,
        **kwargs,
    ) -> None:
        num_layers = check_positive_int(num_layers, "NeuralTangentKernel.num_layers", minimum=0)
        if not isinstance(kind, str):
            raise InputTypeError(
                expected_got("NeuralTangentKernel.kind", "'ntk' or 'nngp'", repr(kind))
            )
        if kind.lower() not in _KINDS:
            raise InputDataError(
                expected_got(
                    "NeuralTangentKernel.kind",
                    "'ntk' or 'nngp'",
                    repr(kind),
                    "Use 'ntk' for the tangent kernel Theta, 'nngp' for the prior covariance.",
                )
            )
        for name, value in (("weight_variance", weight_variance), ("bias_variance", bias_variance)):
            _check_variance(value, f"NeuralTangentKernel.{name}")
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self.kind = kind.lower()
        for name, value, prior, constraint in (
            ("weight_variance", weight_variance, weight_variance_prior, weight_variance_constraint),
            ("bias_variance", bias_variance, bias_variance_prior, bias_variance_constraint),
        ):
            self._register_variance(name, value, prior, constraint)

    # ------------------------------------------------------------------ parameters
    def _register_variance(
        self, name: str, value: object, prior: Prior | None, constraint: Interval | None
    ) -> None:
        raw = f"raw_{name}"
        self.register_parameter(raw, torch.nn.Parameter(torch.zeros(self.batch_shape)))
        self.register_constraint(raw, Positive() if constraint is None else constraint)
        if prior is not None:
            if not isinstance(prior, Prior):
                raise InputTypeError(
                    expected_got(
                        f"NeuralTangentKernel.{name}_prior",
                        "a gpytorch.priors.Prior or None",
                        type(prior).__name__,
                    )
                )
            param, closure = {
                "weight_variance": (self._weight_variance_param, self._weight_variance_closure),
                "bias_variance": (self._bias_variance_param, self._bias_variance_closure),
            }[name]
            self.register_prior(f"{name}_prior", prior, param, closure)
        self._set_variance(name, value)

    def _set_variance(self, name: str, value: object) -> None:
        raw = getattr(self, f"raw_{name}")
        value = torch.as_tensor(value).to(raw)
        constraint = getattr(self, f"raw_{name}_constraint")
        self.initialize(**{f"raw_{name}": constraint.inverse_transform(value)})

    # bound methods (not lambdas) so that a kernel with priors can be pickled
    def _weight_variance_param(self, m: NeuralTangentKernel) -> torch.Tensor:
        return m.weight_variance

    def _weight_variance_closure(self, m: NeuralTangentKernel, v: torch.Tensor) -> None:
        m._set_variance("weight_variance", v)

    def _bias_variance_param(self, m: NeuralTangentKernel) -> torch.Tensor:
        return m.bias_variance

    def _bias_variance_closure(self, m: NeuralTangentKernel, v: torch.Tensor) -> None:
        m._set_variance("bias_variance", v)

    @property
    def weight_variance(self) -> torch.Tensor:
        """Prior variance :math:`\\sigma_w^2` of the weights.  # shape: batch_shape"""
        return self.raw_weight_variance_constraint.transform(self.raw_weight_variance)

    @weight_variance.setter
    def weight_variance(self, value: float | torch.Tensor) -> None:
        _check_variance(value, "NeuralTangentKernel.weight_variance")
        self._set_variance("weight_variance", value)

    @property
    def bias_variance(self) -> torch.Tensor:
        """Prior variance :math:`\\sigma_b^2` of the biases.  # shape: batch_shape"""
        return self.raw_bias_variance_constraint.transform(self.raw_bias_variance)

    @bias_variance.setter
    def bias_variance(self, value: float | torch.Tensor) -> None:
        _check_variance(value, "NeuralTangentKernel.bias_variance")
        self._set_variance("bias_variance", value)

    @property
    def is_stationary(self) -> bool:
        """``False``: the kernel depends on norms and angles, not only on differences."""
        return False

    @classmethod
    def from_vboot_mlp(cls, model: object, kind: str = "ntk", **kwargs) -> NeuralTangentKernel:
        """The kernel of a :class:`~gpext.bootstrap.VBootMLP`'s network (fitted or not).

        Args:
            model: A ``VBootMLP`` (anything with ``hidden_sizes`` and ``prior_std``).
            kind: ``"ntk"`` or ``"nngp"``.
            **kwargs: Further constructor arguments (``batch_shape``, ``active_dims``, ...).

        Returns:
            ``NeuralTangentKernel(len(model.hidden_sizes), model.prior_std**2,
            model.prior_std**2, kind)``.

        Raises:
            InputTypeError: If ``model`` lacks ``hidden_sizes`` or ``prior_std``.
        """
        if not (hasattr(model, "hidden_sizes") and hasattr(model, "prior_std")):
            raise InputTypeError(
                expected_got(
                    "NeuralTangentKernel.from_vboot_mlp model",
                    "a VBootMLP (with hidden_sizes and prior_std)",
                    type(model).__name__,
                )
            )
        var = float(model.prior_std) ** 2
        return cls(len(model.hidden_sizes), var, var, kind, **kwargs)

    # ------------------------------------------------------------------ evaluation
    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        diag: bool = False,
        last_dim_is_batch: bool = False,
        **params,
    ) -> torch.Tensor:
        """Evaluate the kernel.

        Args:
            x1: First inputs.  # shape: (*batch, N, d)
            x2: Second inputs.  # shape: (*batch, M, d)
            diag: Return only :math:`k(\\mathbf x_{1,i}, \\mathbf x_{2,i})` (needs ``N == M``).
            last_dim_is_batch: Treat each input dimension as a separate one-dimensional input
                (``d = 1``), giving ``(*batch, d, N, M)`` (deprecated by GPyTorch).

        Returns:
            ``(*batch, N, M)``, or ``(*batch, N)`` when ``diag``.

        Raises:
            ShapeError: If ``diag`` and ``N != M``, or ``x1`` and ``x2`` differ in ``d``.
            InputTypeError: For float16 / bfloat16 inputs, or ``x1`` and ``x2`` of two dtypes.
            InputDataError: For NaN or infinite inputs.
        """
        x1, x2 = self._check_inputs(x1, x2, finite=True)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        if last_dim_is_batch:
            x1 = x1.transpose(-1, -2).unsqueeze(-1)  # shape: (*batch, d, N, 1)
            x2 = x1 if same else x2.transpose(-1, -2).unsqueeze(-1)
        sw = self.weight_variance.to(x1)  # shape: batch_shape
        sb = self.bias_variance.to(x1)
        extra = (1,) if last_dim_is_batch else ()
        d = x1.shape[-1]
        sq1 = x1.square().sum(-1)  # shape: (*batch, N)
        sq2 = sq1 if same else x2.square().sum(-1)  # shape: (*batch, M)
        if diag:
            if x1.shape[-2] != x2.shape[-2]:
                raise ShapeError(
                    expected_got(
                        "NeuralTangentKernel(x1, x2, diag=True)",
                        "x1 and x2 with the same number of rows",
                        f"{x1.shape[-2]} and {x2.shape[-2]} rows",
                        "Drop diag=True to get the full (N, M) matrix.",
                    )
                )
            sw, sb = sw.view(*sw.shape, *extra, 1), sb.view(*sb.shape, *extra, 1)
            q1 = sw * sq1 / d + sb  # shape: (*batch, N)
            if same:
                return self._recursion(q1, q1, q1, sw, sb, None, diagonal=True)
            s12 = sw * (x1 * x2).sum(-1) / d + sb
            q2 = sw * sq2 / d + sb
            return self._recursion(s12, q1, q2, sw, sb, None, diagonal=False)
        sw, sb = sw.view(*sw.shape, *extra, 1, 1), sb.view(*sb.shape, *extra, 1, 1)
        s12 = sw * torch.matmul(x1, x2.transpose(-1, -2)) / d + sb  # shape: (*batch, N, M)
        q1 = sw * sq1.unsqueeze(-1) / d + sb  # shape: (*batch, N, 1)
        q2 = sw * sq2.unsqueeze(-2) / d + sb  # shape: (*batch, 1, M)
        mask = None
        if same:
            n = x1.shape[-2]
            mask = torch.eye(n, dtype=torch.bool, device=x1.device)
        return self._recursion(s12, q1, q2, sw, sb, mask, diagonal=False)

    _match_dtype = False

    def _input_reference(self) -> torch.Tensor:
        return self.raw_weight_variance

    def _recursion(
        self,
        s12: torch.Tensor,
        q1: torch.Tensor,
        q2: torch.Tensor,
        sw: torch.Tensor,
        sb: torch.Tensor,
        same: torch.Tensor | None,
        diagonal: bool,
    ) -> torch.Tensor:
        """Run the layer recursion from the first-layer covariances.

        ``s12`` holds :math:`\\Sigma^1(\\mathbf x, \\mathbf x')` for the pairs wanted (a matrix
        or paired rows), ``q1``/``q2`` the variances :math:`\\Sigma^1(\\mathbf x, \\mathbf x)`
        broadcastable to it.  ``same`` marks pairs of a point with itself; ``diagonal`` says
        that every pair is (``rho = 1``, no arc-cosine needed).
        """
        ntk = self.kind == "ntk"
        theta = s12
        tiny = torch.finfo(s12.dtype).tiny
        for _ in range(self.num_layers):
            if diagonal:  # kappa_0 = kappa_1 = 1 and sqrt(q1 q2) = q
                s_new = 0.5 * sw * s12 + sb
                dot = 0.5 * sw
            else:
                norm = (q1 * q2).clamp_min(tiny).sqrt()
                k0, k1 = _arccos_kappas(s12 / norm, same)
                s_new = 0.5 * sw * norm * k1 + sb
                dot = 0.5 * sw * k0
                q1, q2 = 0.5 * sw * q1 + sb, 0.5 * sw * q2 + sb
            if ntk:
                theta = theta * dot + s_new
            s12 = s_new
        return theta if ntk else s12

    def extra_repr(self) -> str:
        return f"num_layers={self.num_layers}, kind={self.kind!r}"


def _check_variance(value: object, name: str) -> None:
    """Raise unless ``value`` is a positive, finite number or tensor."""
    try:
        t = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as err:
        raise InputTypeError(expected_got(name, "a positive number", repr(value))) from err
    if t.numel() == 0 or not bool(torch.isfinite(t).all()) or not bool((t > 0).all()):
        raise InputDataError(
            expected_got(
                name,
                "a positive, finite variance",
                value,
                "Pass e.g. VBootMLP.prior_std**2; a bias-free network is not supported "
                "(use a small positive bias_variance instead).",
            )
        )

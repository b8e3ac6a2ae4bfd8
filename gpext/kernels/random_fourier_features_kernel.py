r"""Random Fourier features for the RBF and Matern kernels (Rahimi & Recht 2008, Bochner).

By Bochner's theorem a stationary kernel with :math:`k(0) = 1` is the characteristic function of
its spectral measure, :math:`k(\tau) = \mathbb E_{\omega \sim p}[\cos(\omega^\top \tau)]`; a Monte
Carlo average over ``S`` frequencies, written with sine/cosine pairs (Sutherland & Schneider
2015), is an explicit rank-``2S`` feature map whose inner products approximate the kernel.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from linear_operator.operators import (
    LinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    RootLinearOperator,
)

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.kernels._checked_inputs import CheckedInputsMixin
from gpext.utils import check_finite, check_positive_int

__all__ = ["RandomFourierFeaturesKernel"]

#: Matern smoothness of each base kernel (``None``: the RBF kernel, the limit nu -> infinity).
_NU = {"rbf": None, "matern12": 0.5, "matern32": 1.5, "matern52": 2.5}


class RandomFourierFeaturesKernel(CheckedInputsMixin, gpytorch.kernels.Kernel):
    r"""Random-Fourier-feature approximation of the RBF or a Matern kernel.

    With lengthscales :math:`\ell` and ``S`` spectral samples :math:`\omega_1, \dots, \omega_S`
    of the unit-lengthscale kernel, the feature map and the kernel it defines are

    .. math::

        \phi(\mathbf x) = \sqrt{\tfrac1S}\,\big[\cos(\omega_s^\top \mathbf x / \ell)_{s=1}^S,\
        \sin(\omega_s^\top \mathbf x / \ell)_{s=1}^S\big], \qquad
        \phi(\mathbf x)^\top \phi(\mathbf x') = \frac1S \sum_{s=1}^S
        \cos\big(\omega_s^\top (\mathbf x - \mathbf x') / \ell\big)
        \approx k(\mathbf x, \mathbf x'),

    an unbiased estimate with standard error :math:`O(S^{-1/2})` (``x / ell`` divides each input
    column by its lengthscale).  The spectral measures, for GPyTorch's parameterisation
    (:class:`~gpytorch.kernels.RBFKernel`, :class:`~gpytorch.kernels.MaternKernel`) at unit
    lengthscale, are

    .. math::

        \text{RBF: } \omega \sim \mathcal N(0, I_d), \qquad
        \text{Matern-}\nu\text{: } \omega = \mathbf z \sqrt{2\nu / u},\quad
        \mathbf z \sim \mathcal N(0, I_d),\ u \sim \chi^2_{2\nu},

    i.e. a multivariate Student-t with :math:`2\nu` degrees of freedom, whose density
    :math:`\propto (2\nu + \lVert\omega\rVert^2)^{-(\nu + d/2)}` is the Fourier transform of
    the Matern kernel :math:`k(r) = \frac{2^{1-\nu}}{\Gamma(\nu)} (\sqrt{2\nu} r)^\nu
    K_\nu(\sqrt{2\nu} r)` (Rasmussen & Williams 2006, Eq. 4.15).  For
    :math:`\nu \in \{1/2, 3/2, 5/2\}`, :math:`u` is a sum of :math:`2\nu` squared standard
    normals, so every draw comes from ``torch.randn`` and a :class:`torch.Generator`.  (In
    terms of :math:`g \sim \mathrm{Gamma}(\nu, \text{rate}=1)`, :math:`u = 2g` and
    :math:`\omega = \mathbf z \sqrt{\nu / g}`.)

    The standard samples :math:`\omega` are drawn once and stored in the buffer ``omega``
    (shape ``(*batch_shape, d, S)``); the lengthscale is an ordinary GPyTorch hyperparameter
    applied at evaluation, so gradients with respect to it are exact.  ``omega`` follows the
    module's dtype and device and is part of the ``state_dict``.  The output scale is not
    included: wrap the kernel in a :class:`~gpytorch.kernels.ScaleKernel`.

    **When the frequencies are drawn.** With ``num_dims`` (or ``ard_num_dims``) given they are
    drawn in the constructor.  Otherwise they are drawn lazily, for ``d = x.shape[-1]``, at the
    first evaluation (as GPyTorch's :class:`~gpytorch.kernels.RFFKernel` does); a
    ``generator`` passed to the constructor then fixes them through a seed taken from it at
    construction, and without one the lazy draw uses torch's global random state.  Loading a
    ``state_dict`` into an undrawn kernel adopts the stored frequencies.  Draws are made in the
    module's dtype at the time of the draw (the default dtype in the constructor), on the
    generator's device; ``.double()`` after construction keeps the drawn values, while
    :meth:`resample` after ``.double()`` draws float64 normals (a different stream from float32
    ones for the same seed).

    **last_dim_is_batch** (GPyTorch's convention, deprecated upstream) treats each input
    dimension ``j`` as a batch of one-dimensional kernels; dimension ``j`` uses row ``j`` of
    ``omega``, whose marginal is the one-dimensional spectral measure of the same kernel.

    Args:
        num_samples: Number of frequencies ``S`` (``2S`` features).
        base: Kernel to approximate: ``"rbf"``, ``"matern12"``, ``"matern32"`` or
            ``"matern52"`` (Matern with nu = 1/2, 3/2, 5/2).
        num_dims: Input dimension ``d`` (after ``active_dims`` selection); ``None`` takes
            ``ard_num_dims`` when that is given and otherwise draws lazily (see above).
        generator: Random generator for the frequency draw (``None``: global random state).
        **kwargs: Passed on to :class:`gpytorch.kernels.Kernel` (``ard_num_dims``,
            ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint``).

    Raises:
        InputDataError: For an unknown ``base``, or ``num_dims`` disagreeing with
            ``ard_num_dims``.
        InputTypeError: If ``num_samples``/``num_dims`` are not integers or ``generator`` is
            not a :class:`torch.Generator`.

    Example:
        >>> kernel = RandomFourierFeaturesKernel(
        ...     512, base="matern52", ard_num_dims=2, generator=torch.Generator().manual_seed(0)
        ... )
        >>> x = torch.randn(10, 2)
        >>> kernel.featurize(x).shape
        torch.Size([10, 1024])
        >>> covar = gpytorch.kernels.ScaleKernel(kernel)(x)  # a low-rank LinearOperator
    """

    has_lengthscale = True

    def __init__(
        self,
        num_samples: int,
        base: str = "rbf",
        *,
        num_dims: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> None:
        name = "RandomFourierFeaturesKernel"
        num_samples = check_positive_int(num_samples, f"{name}.num_samples")
        if not isinstance(base, str) or base not in _NU:
            raise InputDataError(
                expected_got(
                    f"{name}.base", f"one of {tuple(_NU)}", repr(base),
                    "Use 'matern12', 'matern32' or 'matern52' for Matern nu = 1/2, 3/2, 5/2.",
                )
            )  # fmt: skip
        ard = kwargs.get("ard_num_dims")
        if num_dims is not None:
            num_dims = check_positive_int(num_dims, f"{name}.num_dims")
            if ard is not None and ard != num_dims:
                raise InputDataError(
                    expected_got(
                        f"{name}.num_dims", f"ard_num_dims = {ard} (one lengthscale per input)",
                        num_dims, "Pass the same input dimension to both, or only one of them.",
                    )
                )  # fmt: skip
        elif ard is not None:
            num_dims = check_positive_int(ard, f"{name}.ard_num_dims")
        _check_generator(generator, f"{name}.generator")
        super().__init__(**kwargs)
        self.num_samples = num_samples
        self.base = base
        self.nu = _NU[base]
        self._seed: int | None = None
        dtype, device = self.raw_lengthscale.dtype, self.raw_lengthscale.device
        # an undrawn kernel holds an empty (*batch, 0, S) buffer, so that indexing, batch
        # expansion, dtype/device moves and state_dict loading work before the first call
        self.register_buffer(
            "omega", torch.zeros(*self.batch_shape, 0, num_samples, dtype=dtype, device=device)
        )
        if num_dims is not None:
            self._draw(num_dims, generator)
        elif generator is not None:
            self._seed = _seed_from(generator)

    # ------------------------------------------------------------------ frequencies
    @property
    def num_dims(self) -> int | None:
        """Input dimension ``d`` of the drawn frequencies (``None`` before the lazy draw)."""
        d = self.omega.shape[-2]
        return d if d > 0 else None

    def resample(self, generator: torch.Generator | None = None) -> RandomFourierFeaturesKernel:
        """Redraw the standard spectral samples ``omega`` (the lengthscale is kept).

        Args:
            generator: Random generator (``None``: torch's global random state).  On an
                undrawn (lazy) kernel it fixes the draw that the first evaluation makes.

        Returns:
            ``self``.

        Raises:
            InputTypeError: If ``generator`` is not a :class:`torch.Generator` or ``None``.
        """
        _check_generator(generator, "RandomFourierFeaturesKernel.resample generator")
        if self.num_dims is None:
            self._seed = None if generator is None else _seed_from(generator)
        else:
            self._draw(self.num_dims, generator)
        return self

    def _draw(self, d: int, generator: torch.Generator | None) -> None:
        """Draw ``omega`` of shape ``(*batch_shape, d, S)`` in the module's dtype."""
        dtype, device = self.raw_lengthscale.dtype, self.raw_lengthscale.device
        gen_device = generator.device if generator is not None else device
        shape = (*self.batch_shape, d, self.num_samples)
        z = torch.randn(shape, generator=generator, dtype=dtype, device=gen_device)
        if self.nu is not None:
            # u ~ chi^2 with 2 nu (an integer) degrees of freedom: a sum of squared normals
            dof = int(round(2 * self.nu))
            e = torch.randn(
                (*self.batch_shape, dof, self.num_samples),
                generator=generator, dtype=dtype, device=gen_device,
            )  # fmt: skip
            u = e.square().sum(-2, keepdim=True)  # shape: (*batch, 1, S)
            z = z * (2 * self.nu / u).sqrt()
        self.omega = z.to(device)
        self._seed = None

    def _ensure_drawn(self, d: int) -> None:
        if self.num_dims is None:
            gen = None if self._seed is None else torch.Generator().manual_seed(self._seed)
            self._draw(d, gen)
        elif self.num_dims != d:
            raise ShapeError(
                expected_got(
                    "RandomFourierFeaturesKernel inputs",
                    f"{self.num_dims} columns (the frequencies were drawn for that dimension)",
                    f"{d} columns",
                    "Pass inputs of the right width, or build a new kernel for this dimension.",
                )
            )

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        stored = state_dict.get(prefix + "omega")
        if self.num_dims is None and isinstance(stored, torch.Tensor) and stored.dim() >= 2:
            # an undrawn kernel adopts the stored frequencies' input dimension
            self.omega = torch.zeros(stored.shape, dtype=self.omega.dtype, device=self.omega.device)
            self._seed = None
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # ------------------------------------------------------------------ features
    def featurize(self, x: torch.Tensor) -> torch.Tensor:
        r"""The feature map :math:`\phi(\mathbf x)` (active dimensions applied).

        ``featurize(x1) @ featurize(x2).mT`` equals ``kernel(x1, x2)`` (without output scale).

        Args:
            x: Inputs.  # shape: (*batch, N, D)

        Returns:
            The features, cosines first.  # shape: (*batch, N, 2 * num_samples)

        Raises:
            InputTypeError: If ``x`` is not a floating-point tensor.
            ShapeError: If ``x`` has fewer than two dimensions or the wrong number of columns.
            InputDataError: If ``x`` has NaN or infinite entries.
        """
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise InputTypeError(
                expected_got(
                    "RandomFourierFeaturesKernel.featurize x",
                    "a floating-point tensor of shape (*batch, N, D)",
                    type(x).__name__ if not isinstance(x, torch.Tensor) else f"dtype {x.dtype}",
                )
            )
        if x.dim() < 2:
            raise ShapeError(
                expected_got(
                    "RandomFourierFeaturesKernel.featurize x", "shape (*batch, N, D)",
                    f"shape {tuple(x.shape)}", "Use x.unsqueeze(-1) for one-dimensional inputs.",
                )
            )  # fmt: skip
        check_finite(x, "RandomFourierFeaturesKernel.featurize x")
        if self.active_dims is not None:
            x = x.index_select(-1, self.active_dims)
        return self._features(x)

    def _features(self, x: torch.Tensor, last_dim_is_batch: bool = False) -> torch.Tensor:
        """Features of inputs with active dimensions already selected."""
        self._ensure_drawn(x.shape[-1])
        omega = self.omega.to(x.dtype)
        ell = self.lengthscale.to(x.dtype)  # shape: (*batch, 1, D or 1)
        if last_dim_is_batch:
            # dimension j is its own 1-D kernel with frequencies omega[..., j, :]
            xs = x.div(ell).mT.unsqueeze(-1)  # shape: (*batch, D, N, 1)
            proj = xs * omega.unsqueeze(-2)  # shape: (*batch, D, N, S)
        else:
            # frequencies divided by the lengthscales: omega_s / ell, one row per input
            proj = x.matmul(omega / ell.mT)  # shape: (*batch, N, S)
        return torch.cat([proj.cos(), proj.sin()], dim=-1) / math.sqrt(self.num_samples)

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        diag: bool = False,
        last_dim_is_batch: bool = False,
        **params,
    ) -> torch.Tensor | LinearOperator:
        r"""The approximate kernel :math:`\phi(\mathbf x_1) \phi(\mathbf x_2)^\top`.

        Args:
            x1: First inputs.  # shape: (*batch, N, D)
            x2: Second inputs.  # shape: (*batch, M, D)
            diag: Return only the diagonal (``N == M``).
            last_dim_is_batch: Treat each input dimension as a batch of 1-D kernels.

        Returns:
            With ``diag``, a tensor ``(*batch, N)`` (``(*batch, D, N)`` with
            ``last_dim_is_batch``); otherwise a low-rank operator ``(*batch, N, M)``
            (``(*batch, D, N, M)``): a :class:`~linear_operator.operators.LowRankRootLinearOperator`
            (or :class:`~linear_operator.operators.RootLinearOperator` when ``2S >= N``) for
            ``x1 == x2`` and a :class:`~linear_operator.operators.MatmulLinearOperator` otherwise.

        Raises:
            ShapeError: If the inputs' width differs from the frequencies' dimension or
                between ``x1`` and ``x2``.
            InputTypeError: For float16 / bfloat16 inputs, or ``x1`` and ``x2`` of two dtypes.
            InputDataError: For NaN or infinite inputs.
        """
        x1, x2 = self._check_inputs(x1, x2, finite=True)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        z1 = self._features(x1, last_dim_is_batch)
        z2 = z1 if same else self._features(x2, last_dim_is_batch)
        if diag:
            return (z1 * z2).sum(-1)
        if same:
            if z1.shape[-1] < z1.shape[-2]:
                return LowRankRootLinearOperator(z1)
            return RootLinearOperator(z1)
        return MatmulLinearOperator(z1, z2.mT)

    _match_dtype = False

    def _input_reference(self) -> torch.Tensor:
        return self.raw_lengthscale


def _check_generator(generator: object, name: str) -> None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise InputTypeError(
            expected_got(name, "a torch.Generator or None", type(generator).__name__)
        )


def _seed_from(generator: torch.Generator) -> int:
    """A seed for a later (lazy) draw, taken from ``generator``."""
    return int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))

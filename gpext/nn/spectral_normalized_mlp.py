"""A distance-aware (bi-Lipschitz) residual MLP feature extractor."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["SpectralNormalizedMLP"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "silu": nn.SiLU}


class SpectralNormalizedMLP(nn.Module):
    r"""A residual MLP whose feature distances track input distances (bi-Lipschitz).

    .. math::

        h_0 = s\, P x, \qquad
        h_{l} = h_{l-1} + c\, \sigma\big(\bar W_l h_{l-1} + b_l\big)\ (l = 1..L), \qquad
        g(x) = h_L,

    where :math:`P` is a fixed random projection with orthonormal columns (so
    :math:`\lVert P x - P x'\rVert = \lVert x - x'\rVert` for ``width >= in_features``),
    :math:`s` is ``input_scale``, :math:`\bar W_l = W_l / \lVert W_l \rVert_2` is spectrally
    normalised (power iteration, :func:`torch.nn.utils.parametrizations.spectral_norm`) and
    :math:`\sigma` is 1-Lipschitz.  Each block is then :math:`(1 \pm c)`-Lipschitz in both
    directions, so for ``coefficient`` :math:`c < 1`

    .. math::

        s(1 - c)^L \lVert x - x' \rVert \le \lVert g(x) - g(x') \rVert
        \le s(1 + c)^L \lVert x - x' \rVert .

    The lower bound is what makes a stationary kernel on :math:`g(x)` *distance aware*
    (Liu et al. 2020, SNGP; van Amersfoort et al. 2021, DUE): inputs far from the training
    data cannot be mapped onto the training features, so a GP on the features (for instance
    :class:`gpext.models.InducingGPNetwork`) returns its prior variance there instead of a
    confident extrapolation.  An unconstrained :class:`MLP` may collapse such inputs onto the
    data (feature collapse).  The output dimension equals ``width``; a projection to fewer
    features would break the lower bound.

    Args:
        in_features: Input dimension ``D``.
        width: Hidden and output width ``d`` (at least ``D`` keeps the projection isometric).
        depth: Number of residual blocks ``L``.
        coefficient: Residual scale :math:`c \in (0, 1)`.
        input_scale: Scale :math:`s` of the input projection (inputs are best standardised).
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        generator: Random generator for the projection :math:`P`.

    Raises:
        InputDataError: For a size that is not a positive integer, a coefficient outside
            ``(0, 1)`` or an unknown activation.

    Example:
        >>> g = SpectralNormalizedMLP(2, width=16, depth=2)
        >>> g(torch.randn(10, 2)).shape
        torch.Size([10, 16])
    """

    def __init__(
        self,
        in_features: int,
        width: int = 32,
        depth: int = 2,
        *,
        coefficient: float = 0.9,
        input_scale: float = 1.0,
        activation: str = "relu",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "SpectralNormalizedMLP.in_features")
        self.out_features = check_positive_int(width, "SpectralNormalizedMLP.width")
        depth = check_positive_int(depth, "SpectralNormalizedMLP.depth")
        if not 0.0 < float(coefficient) < 1.0:
            raise InputDataError(
                expected_got("SpectralNormalizedMLP.coefficient", "a number in (0, 1)", coefficient)
            )
        if activation not in _ACTIVATIONS:
            raise InputDataError(
                expected_got(
                    "SpectralNormalizedMLP.activation", f"one of {sorted(_ACTIVATIONS)}",
                    repr(activation),
                )
            )  # fmt: skip
        self.coefficient = float(coefficient)
        gauss = torch.randn(max(width, in_features), in_features, generator=generator)
        proj = torch.linalg.qr(gauss).Q[:width]  # shape: (width, D); orthonormal if width >= D
        self.register_buffer("projection", float(input_scale) * proj)
        self.blocks = nn.ModuleList(spectral_norm(nn.Linear(width, width)) for _ in range(depth))
        self.activation = _ACTIVATIONS[activation]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs to features.

        Args:
            x: Inputs, shape ``(*batch, N, D)``.

        Returns:
            Features, shape ``(*batch, N, width)``.

        Raises:
            ShapeError: If the last dimension is not ``in_features``.
        """
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got(
                    "SpectralNormalizedMLP.forward(x)",
                    f"shape (..., {self.in_features})",
                    tuple(x.shape),
                )
            )
        h = x @ self.projection.to(x).T
        for block in self.blocks:
            h = h + self.coefficient * self.activation(block(h))
        return h

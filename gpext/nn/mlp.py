"""A multilayer perceptron feature extractor."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_layer_widths, check_positive_int

__all__ = ["MLP", "UnitNorm"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "silu": nn.SiLU}


class UnitNorm(nn.Module):
    r""":math:`h \mapsto h / \lVert h\rVert_2` over the last dimension (:class:`MLP`'s
    ``normalize_last_hidden``).

    Args:
        eps: Rows of smaller norm (e.g. an all-zero ReLU layer) map to zero, with zero
            gradient, instead of a division by a vanishing norm.
    """

    def __init__(self, eps: float = 1e-12) -> None:
        super().__init__()
        self.eps = float(eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """Rows of unit norm; rows of norm below ``eps`` become zero, with zero gradient.
        # shape: same as ``h``"""
        norm = h.norm(dim=-1, keepdim=True)
        big = norm > self.eps
        return torch.where(big, h / torch.where(big, norm, torch.ones_like(norm)), 0.0)


class MLP(nn.Module):
    r"""A fully connected network :math:`g: \mathbb{R}^D \to \mathbb{R}^d`.

    .. math::

        g(x) = W_L\, \sigma(\cdots \sigma(W_1 x + b_1) \cdots) + b_L

    Used as the embedding :math:`g_{\theta_g}` of an inducing GP network (002, section 2.1) or as
    the feature extractor of a deep kernel.

    Args:
        in_features: Input dimension ``D``.
        hidden_features: Widths of the hidden layers (may be empty: a linear map; one integer:
            one hidden layer).
        out_features: Feature dimension ``d``.
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        layer_norm: Apply :class:`torch.nn.LayerNorm` to the output features, which keeps them on
            the scale a stationary kernel's lengthscale is initialised for.
        normalize_last_hidden: Divide the last hidden layer's activations by their Euclidean
            norm, :math:`h \mapsto h / \lVert h\rVert`, before the output layer.  A Gaussian
            prior :math:`\mathcal N(0, \alpha^{-1} I)` on the output layer's weights then
            gives every input the same prior variance :math:`\alpha^{-1}(1 + [\text{bias}])`
            (as a stationary kernel does, and as the constant-norm random-feature output
            layer of SNGP, Liu et al. 2020), instead of one that grows with the ReLU
            features' norm towards the corners of the input box; the output is bounded by
            :math:`\lVert W_L\rVert + \lvert b_L\rvert`.  Needs a hidden layer.

    Raises:
        InputDataError: If a size is not a positive integer or the activation is unknown.

    Example:
        >>> g = MLP(8, [64, 64], 4)
        >>> g(torch.randn(10, 8)).shape
        torch.Size([10, 4])
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: Sequence[int] = (64, 64),
        out_features: int = 16,
        *,
        activation: str = "relu",
        layer_norm: bool = False,
        normalize_last_hidden: bool = False,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "MLP.in_features")
        self.out_features = check_positive_int(out_features, "MLP.out_features")
        hidden = list(check_layer_widths(hidden_features, "MLP.hidden_features"))
        if activation not in _ACTIVATIONS:
            raise InputDataError(
                expected_got("MLP.activation", f"one of {sorted(_ACTIVATIONS)}", repr(activation))
            )
        if normalize_last_hidden and not hidden:
            raise InputDataError(
                expected_got("MLP.normalize_last_hidden", "at least one hidden layer",
                             "hidden_features=()")
            )  # fmt: skip
        sizes = [self.in_features, *hidden, self.out_features]
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(_ACTIVATIONS[activation]())
        if normalize_last_hidden:
            layers.insert(len(layers) - 1, UnitNorm())
        if layer_norm:
            layers.append(nn.LayerNorm(self.out_features))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map inputs to features.

        Args:
            x: Inputs, shape ``(*batch, N, D)`` (any leading dimensions).

        Returns:
            Features, shape ``(*batch, N, d)``.

        Raises:
            ShapeError: If the last dimension is not ``in_features``.
        """
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got("MLP.forward(x)", f"shape (..., {self.in_features})", tuple(x.shape))
            )
        return self.net(x)

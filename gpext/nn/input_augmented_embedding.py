"""An embedding that appends the (scaled) inputs to a network's features: distance aware."""

from __future__ import annotations

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["InputAugmentedEmbedding"]


class InputAugmentedEmbedding(nn.Module):
    r"""Features :math:`\phi(x) = [\,g(x),\ s\,x\,]`: a network's output with the inputs appended.

    For any network :math:`g`,

    .. math::

        \lVert \phi(x) - \phi(x') \rVert^2 = \lVert g(x) - g(x') \rVert^2
        + s^2 \lVert x - x' \rVert^2 \ \ge\ s^2 \lVert x - x' \rVert^2,

    so inputs far from the training inputs cannot be mapped onto the training features (the
    lower Lipschitz bound that makes spectral-normalised networks distance aware, obtained
    here without constraining :math:`g`).  A stationary kernel on :math:`\phi` (the default
    kernel of :class:`gpext.models.InducingGPNetwork`) then returns towards its prior variance
    in gaps of the training inputs, while :math:`g` keeps all of its flexibility.  Inputs
    should be standardised; :math:`s` (``input_scale``) sets how much input distance counts
    against feature distance.

    Measured on the 1-D and 2-D gap toys of ``benchmarks/robustness.py`` (standardised data,
    ``MLP(d, [64, 64], 8)``, 32 inducing points, 200 epochs, 10 seeds, IGN's default
    learning rates): the share of gap points more than 2 predictive sd from the mean fell
    from 0.224 to 0.060 (1-D) and from 0.143 to 0.106 (2-D) with ``input_scale=1``, with the
    in-range coverage of the central 95% interval about the same (0.983 vs 0.978 in 1-D,
    0.934 vs 0.936 in 2-D).

    Args:
        network: The feature network :math:`g`, mapping ``(N, D)`` to ``(N, d)``.
        in_features: Input dimension ``D``.
        input_scale: :math:`s > 0`.
        out_features: ``d`` (default ``network.out_features``).

    Raises:
        InputTypeError: If ``network`` is not a module.
        InputDataError: If ``input_scale`` is not positive or ``d`` cannot be found.

    Example:
        >>> from gpext.nn import MLP
        >>> emb = InputAugmentedEmbedding(MLP(2, [16], 4), in_features=2)
        >>> emb(torch.randn(5, 2)).shape, emb.out_features
        (torch.Size([5, 6]), 6)
    """

    def __init__(
        self,
        network: nn.Module,
        in_features: int,
        *,
        input_scale: float = 1.0,
        out_features: int | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(network, nn.Module):
            raise InputTypeError(
                expected_got("InputAugmentedEmbedding.network", "a torch.nn.Module",
                             type(network).__name__)
            )  # fmt: skip
        self.in_features = check_positive_int(in_features, "InputAugmentedEmbedding.in_features")
        if not (isinstance(input_scale, (int, float)) and input_scale > 0):
            raise InputDataError(
                expected_got("InputAugmentedEmbedding.input_scale", "a number > 0", input_scale)
            )
        d = out_features if out_features is not None else getattr(network, "out_features", None)
        if d is None:
            raise InputDataError(
                "InputAugmentedEmbedding: expected out_features or a network with an "
                f"`out_features` attribute, got neither ({type(network).__name__})."
            )
        self.network = network
        self.input_scale = float(input_scale)
        self.out_features = int(d) + self.in_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``[g(x), s x]``.  # x shape: (*batch, N, D) -> (*batch, N, d + D)"""
        if x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got("InputAugmentedEmbedding input", f"last dimension {self.in_features}",
                             tuple(x.shape))
            )  # fmt: skip
        feats = self.network(x)
        return torch.cat([feats, self.input_scale * x.to(feats)], dim=-1)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, input_scale={self.input_scale}"

"""An MLP classifier (logits), optionally with batch normalisation."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_layer_widths, check_positive_int

__all__ = ["ClassifierMLP"]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "elu": nn.ELU, "silu": nn.SiLU}


class ClassifierMLP(nn.Module):
    r"""Fully connected classifier returning logits, :math:`p(y = c \mid x) = \operatorname{softmax}(g(x))_c`.

    Each hidden block is ``Linear - [BatchNorm1d] - activation``. Batch norm makes the network's
    predictions depend on running statistics, which weight-space samplers must refresh
    (:func:`gpext.subspace.refresh_batch_norm`).

    Args:
        in_features: Input dimension.
        hidden_features: Hidden widths (one integer: one hidden layer).
        num_classes: Number of classes ``C`` (>= 2).
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        batch_norm: Insert :class:`torch.nn.BatchNorm1d` after each hidden linear layer.

    Example:
        >>> net = ClassifierMLP(4, [32], 3)
        >>> probs = net.predict_proba(torch.randn(5, 4))
        >>> probs.shape, bool(torch.allclose(probs.sum(-1), torch.ones(5)))
        (torch.Size([5, 3]), True)
    """

    def __init__(
        self,
        in_features: int,
        hidden_features: Sequence[int] = (64, 64),
        num_classes: int = 2,
        *,
        activation: str = "relu",
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "ClassifierMLP.in_features")
        self.num_classes = check_positive_int(num_classes, "ClassifierMLP.num_classes", minimum=2)
        if activation not in _ACTIVATIONS:
            raise InputDataError(
                expected_got(
                    "ClassifierMLP.activation", f"one of {sorted(_ACTIVATIONS)}", repr(activation)
                )
            )
        layers: list[nn.Module] = []
        width = self.in_features
        for h in check_layer_widths(hidden_features, "ClassifierMLP.hidden_features"):
            layers.append(nn.Linear(width, h))
            if batch_norm:
                layers.append(nn.BatchNorm1d(h))
            layers.append(_ACTIVATIONS[activation]())
            width = h
        layers.append(nn.Linear(width, self.num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits. ``(N, D) -> (N, C)``."""
        if x.dim() != 2 or x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got(
                    "ClassifierMLP.forward(x)", f"shape (N, {self.in_features})", tuple(x.shape)
                )
            )
        return self.net(x)

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """Class probabilities. ``(N, D) -> (N, C)``."""
        return torch.softmax(self(x), dim=-1)

"""A small convolutional feature extractor for 28 x 28 images (MNIST-sized)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from gpext.errors import ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["SmallCNN"]


class SmallCNN(nn.Module):
    r"""Two conv-ReLU-max-pool blocks and a two-layer head: images to :math:`\mathbb{R}^d`.

    Architecture (LeNet-like, for ``(C, 28, 28)`` images)::

        conv 5x5 (C -> c1) - ReLU - maxpool 2  ->  (c1, 14, 14)
        conv 5x5 (c1 -> c2) - ReLU - maxpool 2 ->  (c2, 7, 7)
        flatten - linear (49 c2 -> hidden) - ReLU - linear (hidden -> d)

    Flattened inputs of shape ``(N, C * H * W)`` (how :func:`gpext_bench.data.load_dataset` stores
    MNIST) are reshaped to ``image_shape`` first.

    Args:
        out_features: Feature dimension ``d``.
        image_shape: ``(C, H, W)`` of one image; ``H`` and ``W`` must be divisible by 4.
        channels: Output channels ``(c1, c2)`` of the two convolutions.
        hidden_features: Width of the hidden linear layer.
        dropout: Dropout probability before the last linear layer (0 disables it).
        layer_norm: Apply :class:`torch.nn.LayerNorm` to the output features.  Recommended
            under a stationary kernel: without it the feature scale can grow during training
            much faster than the kernel's lengthscale, until all cross-covariances vanish.

    Raises:
        InputDataError: If a size is not a positive integer.
        ShapeError: If ``image_shape`` is not three positive integers with ``H, W`` divisible by 4.

    Example:
        >>> g = SmallCNN(out_features=16)
        >>> g(torch.rand(5, 784)).shape
        torch.Size([5, 16])
    """

    def __init__(
        self,
        out_features: int = 16,
        *,
        image_shape: Sequence[int] = (1, 28, 28),
        channels: Sequence[int] = (16, 32),
        hidden_features: int = 128,
        dropout: float = 0.0,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        image_shape = tuple(int(s) for s in image_shape)
        if (
            len(image_shape) != 3
            or min(image_shape) < 1
            or image_shape[1] % 4
            or image_shape[2] % 4
        ):
            raise ShapeError(
                expected_got(
                    "SmallCNN.image_shape",
                    "(C, H, W) with H and W divisible by 4",
                    image_shape,
                )
            )
        self.out_features = check_positive_int(out_features, "SmallCNN.out_features")
        hidden = check_positive_int(hidden_features, "SmallCNN.hidden_features")
        c1, c2 = (check_positive_int(c, "SmallCNN.channels") for c in channels)
        self.image_shape = image_shape
        c, h, w = image_shape
        self.features = nn.Sequential(
            nn.Conv2d(c, c1, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
        )
        self.head = nn.Sequential(
            nn.Linear(c2 * (h // 4) * (w // 4), hidden),
            nn.ReLU(),
            nn.Dropout(dropout) if dropout > 0 else nn.Identity(),
            nn.Linear(hidden, self.out_features),
            nn.LayerNorm(self.out_features) if layer_norm else nn.Identity(),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map images to features.

        Args:
            x: Images, shape ``(N, C, H, W)``, or flattened ``(N, C * H * W)``; extra leading
                batch dimensions are allowed.

        Returns:
            Features, shape ``(*batch, N, d)``.

        Raises:
            ShapeError: If the trailing dimensions match neither form.
        """
        numel = math.prod(self.image_shape)
        if x.dim() >= 2 and x.shape[-1] == numel:
            lead = x.shape[:-1]
        elif x.dim() >= 4 and tuple(x.shape[-3:]) == self.image_shape:
            lead = x.shape[:-3]
        else:
            raise ShapeError(
                expected_got(
                    "SmallCNN.forward(x)",
                    f"shape (N, {numel}) or (N, {', '.join(map(str, self.image_shape))})",
                    tuple(x.shape),
                )
            )
        imgs = x.reshape(-1, *self.image_shape)
        return self.head(self.features(imgs)).reshape(*lead, self.out_features)

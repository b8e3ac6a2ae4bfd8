r"""A neural-network mean function :math:`m_Q` for GWI's variational measure.

GWI (003_4a6349f7433d9fd1.txt, section 2; Wild et al. 2022) lets the variational mean be any
function; the default is a small fully connected network, as in the public research scripts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gpytorch.means import Mean

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["WassersteinNetworkMean"]


class WassersteinNetworkMean(Mean):
    r"""Mean function :math:`m_Q(x) = g_\theta(x)` given by a neural network.

    .. math::

        m_Q: \mathbb R^D \to \mathbb R^J, \quad x \mapsto g_\theta(x)

    Args:
        input_dim: Input dimension ``D``.
        num_outputs: Number of latent functions ``J``. With ``J = 1`` the output has shape
            ``(*batch, N)``; otherwise ``(*batch, J, N)`` (the latent dimension is a batch
            dimension, as for GPyTorch's batch of independent GPs).
        hidden: Widths of the hidden layers of the default MLP (tanh activations).
        net: A custom ``torch.nn.Module`` mapping ``(*batch, N, D)`` to ``(*batch, N, J)``;
            replaces the default MLP.

    Example:
        >>> mean = WassersteinNetworkMean(input_dim=3).double()
        >>> mean(torch.randn(10, 3, dtype=torch.float64)).shape
        torch.Size([10])
    """

    def __init__(
        self,
        input_dim: int,
        num_outputs: int = 1,
        hidden: Sequence[int] = (50, 50),
        net: torch.nn.Module | None = None,
    ):
        super().__init__()
        self.input_dim = check_positive_int(input_dim, "input_dim")
        self.num_outputs = check_positive_int(num_outputs, "num_outputs")
        if net is None:
            widths = [self.input_dim, *[check_positive_int(h, "hidden") for h in hidden]]
            layers: list[torch.nn.Module] = []
            for a, b in zip(widths[:-1], widths[1:]):
                layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
            layers.append(torch.nn.Linear(widths[-1], self.num_outputs))
            net = torch.nn.Sequential(*layers)
        elif not isinstance(net, torch.nn.Module):
            raise InputDataError(expected_got("net", "a torch.nn.Module", type(net).__name__))
        self.net = net

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Evaluate the network. # x shape: (*batch, N, D)"""
        if x.shape[-1] != self.input_dim:
            raise ShapeError(
                expected_got(
                    "WassersteinNetworkMean input", f"(..., N, {self.input_dim})", tuple(x.shape)
                )
            )
        batch = x.shape[:-2]
        out = self.net(x.reshape(-1, x.shape[-1]))  # shape: (B*N, J)
        if out.dim() != 2 or out.shape[-1] != self.num_outputs:
            raise ShapeError(
                expected_got(
                    "WassersteinNetworkMean.net output",
                    f"(N, {self.num_outputs})",
                    tuple(out.shape),
                )
            )
        out = out.reshape(*batch, x.shape[-2], self.num_outputs)
        if self.num_outputs == 1:
            return out.squeeze(-1)
        return out.movedim(-1, -2)

"""A stack of ``K`` independent MLPs evaluated as one vectorised module (NTK parameterisation)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext.utils import (
    as_model_input,
    check_finite,
    check_float_dtype,
    check_layer_widths,
    check_positive_int,
)

__all__ = ["EnsembleMLP"]


class EnsembleMLP(torch.nn.Module):
    r"""``K`` fully connected ReLU networks with stacked weights, evaluated by batched matmuls.

    Every layer follows the NTK parameterisation of 001 Eq. (2):

    .. math::
        f_l(\mathbf{x}) = \frac{1}{\sqrt{D_{l-1}}} \mathbf{W}_l \varphi(f_{l-1}(\mathbf{x}))
        + \mathbf{b}_l, \qquad l = 1, \dots, L + 1,

    with :math:`\varphi` = ReLU between layers (the identity on the input).  Particle ``k`` owns
    the slices ``weight_l[k]`` and ``bias_l[k]``; particles never mix, so the gradient of a sum
    of per-particle losses is the stack of the per-particle gradients, and the outputs equal
    those of ``K`` separately built networks with the same weights.  The weights are stored as
    ``(K, D_in, D_out)`` so that a layer is one ``torch.baddbmm``.

    Args:
        num_particles: Number of networks ``K``.
        in_features: Input dimension ``d``.
        out_features: Output dimension ``C``.
        hidden_sizes: Widths of the hidden layers, e.g. ``(512, 512)`` (one integer: one layer).
        dtype: Parameter dtype (float32 or float64).
        device: Parameter device.

    Example:
        >>> net = EnsembleMLP(4, in_features=3, out_features=2, hidden_sizes=(16,))
        >>> net(torch.randn(5, 3)).shape
        torch.Size([4, 5, 2])
    """

    def __init__(
        self,
        num_particles: int,
        in_features: int,
        out_features: int,
        hidden_sizes: Sequence[int] = (512, 512),
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        k = check_positive_int(num_particles, "EnsembleMLP.num_particles")
        d = check_positive_int(in_features, "EnsembleMLP.in_features")
        c = check_positive_int(out_features, "EnsembleMLP.out_features")
        hidden = list(check_layer_widths(hidden_sizes, "EnsembleMLP.hidden_sizes"))
        dtype = check_float_dtype(dtype or torch.get_default_dtype(), "EnsembleMLP.dtype")
        self.num_particles = k
        self.in_features = d
        self.out_features = c
        self.hidden_sizes = tuple(hidden)
        sizes = [d, *hidden, c]
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(k, a, b, dtype=dtype, device=device))
            for a, b in zip(sizes[:-1], sizes[1:])
        )
        self.biases = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(k, 1, b, dtype=dtype, device=device)) for b in sizes[1:]
        )

    @property
    def layer_sizes(self) -> list[int]:
        """``[d, *hidden_sizes, C]``."""
        return [self.in_features, *self.hidden_sizes, self.out_features]

    def parameter_shapes(self) -> list[torch.Size]:
        """Shapes of the per-particle tensors, weights then biases (no leading ``K``)."""
        return [w.shape[1:] for w in self.weights] + [b.shape[1:] for b in self.biases]

    def stacked_parameters(self) -> list[torch.Tensor]:
        """The parameters in the order of :meth:`parameter_shapes`, each ``(K, ...)``."""
        return [*self.weights, *self.biases]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Evaluate every network.

        Args:
            x: Inputs shared by all networks, ``(N, d)``, or one input set per network,
                ``(K, N, d)``.

        Returns:
            The outputs.  # shape: (K, N, C)

        Raises:
            ShapeError: If the trailing dimension is not ``d`` or a leading ``K`` mismatches.
            InputDataError: If ``x`` has no rows or non-finite entries.
            InputTypeError: If ``x`` is a tensor of another floating dtype or device than the
                parameters (numpy arrays, sequences and integers are converted).
        """
        x = as_model_input(x, self.weights[0], "EnsembleMLP.forward x")
        if x.dim() not in (2, 3) or x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got(
                    "EnsembleMLP.forward x",
                    f"shape (N, {self.in_features}) or (K, N, {self.in_features})",
                    tuple(x.shape),
                )
            )
        if x.dim() == 3 and x.shape[0] != self.num_particles:
            raise ShapeError(
                expected_got(
                    "EnsembleMLP.forward x", f"leading size K={self.num_particles}", x.shape[0]
                )
            )
        if x.shape[-2] == 0:
            raise InputDataError(
                expected_got("EnsembleMLP.forward x", "at least one row", tuple(x.shape))
            )
        check_finite(x, "EnsembleMLP.forward x")
        return self._forward(x)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        """:meth:`forward` without the input checks (for training loops on checked data)."""
        h = x
        n_layers = len(self.weights)
        for i, (w, b) in enumerate(zip(self.weights, self.biases)):
            scale = 1.0 / math.sqrt(w.shape[1])
            if h.dim() == 2:  # first layer with shared inputs: (N, d) @ (K, d, H) -> (K, N, H)
                h = torch.matmul(h, w).mul(scale).add(b)
            else:
                h = torch.baddbmm(b, h, w, alpha=scale)
            if i < n_layers - 1:
                h = torch.relu(h)
        return h

    def squared_distance(self, anchors: Sequence[torch.Tensor]) -> torch.Tensor:
        """Per-particle squared Euclidean distance of the parameters to ``anchors``.

        Args:
            anchors: Tensors in the order and shapes of :meth:`stacked_parameters`.

        Returns:
            :math:`\\|\\theta^{(k)} - \\tilde\\theta^{(k)}\\|^2` for each particle.  # shape: (K,)
        """
        params = self.stacked_parameters()
        if len(anchors) != len(params):
            raise InputDataError(
                expected_got(
                    "EnsembleMLP.squared_distance anchors", f"{len(params)} tensors", len(anchors)
                )
            )
        total = params[0].new_zeros(self.num_particles)
        for p, a in zip(params, anchors):
            total = total + (p - a).pow(2).flatten(1).sum(1)
        return total

    @torch.no_grad()
    def load_particle(self, index: int, tensors: Sequence[torch.Tensor]) -> None:
        """Copy one particle's tensors (order of :meth:`parameter_shapes`) into slot ``index``."""
        for p, t in zip(self.stacked_parameters(), tensors):
            if t.shape != p.shape[1:]:
                raise ShapeError(
                    expected_got(
                        "EnsembleMLP.load_particle", f"shape {tuple(p.shape[1:])}", tuple(t.shape)
                    )
                )
            p[index].copy_(t)

    def particle(self, index: int) -> list[torch.Tensor]:
        """Detached copies of particle ``index``'s tensors (order of :meth:`parameter_shapes`)."""
        return [p[index].detach().clone() for p in self.stacked_parameters()]

    def extra_repr(self) -> str:
        return f"num_particles={self.num_particles}, layer_sizes={self.layer_sizes}"

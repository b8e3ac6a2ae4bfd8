"""A permutation-invariant encoder for sets of vectors (Deep Sets)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["SetEncoder"]


def _mlp(sizes: Sequence[int]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class SetEncoder(nn.Module):
    r"""Deep Sets encoder: variable-size sets :math:`\{x_1, \dots, x_L\}` to :math:`\mathbb{R}^d`.

    .. math::

        g(\{x_1, \dots, x_L\}) = \rho\Big(\operatorname{pool}_{l=1}^{L} \phi(x_l)\Big)

    with element network :math:`\phi`, pooling ``"mean"``, ``"sum"`` or ``"max"`` and set
    network :math:`\rho`.  The output is invariant to the order of the elements and defined for
    any set size, so an inducing GP network (002, section 2.1) can place its inducing points in
    this feature space although sets of different sizes do not share an input space.

    A minibatch of sets is a padded tensor ``(N, L_max, D)``.  Padding rows are marked either
    by a boolean ``mask`` (``True`` for real elements) or, when no mask is given, by rows that
    are entirely NaN; :meth:`pad` builds that tensor from a list of ``(L_i, D)`` tensors.  The
    NaN convention lets padded sets travel through code that only indexes rows (minibatching).

    Args:
        in_features: Element dimension ``D``.
        out_features: Feature dimension ``d``.
        hidden_features: Width of the hidden layers of :math:`\phi` and :math:`\rho`.
        pooling: ``"mean"`` (default), ``"sum"`` or ``"max"``.

    Raises:
        InputDataError: If a size is not a positive integer or the pooling is unknown.

    Example:
        >>> enc = SetEncoder(2, 8)
        >>> sets = [torch.randn(3, 2), torch.randn(7, 2)]
        >>> enc(SetEncoder.pad(sets)).shape
        torch.Size([2, 8])
    """

    def __init__(
        self,
        in_features: int,
        out_features: int = 16,
        *,
        hidden_features: int = 64,
        pooling: str = "mean",
    ) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "SetEncoder.in_features")
        self.out_features = check_positive_int(out_features, "SetEncoder.out_features")
        hidden = check_positive_int(hidden_features, "SetEncoder.hidden_features")
        if pooling not in ("mean", "sum", "max"):
            raise InputDataError(
                expected_got("SetEncoder.pooling", "'mean', 'sum' or 'max'", repr(pooling))
            )
        self.pooling = pooling
        self.phi = _mlp([self.in_features, hidden, hidden])
        self.rho = _mlp([hidden, hidden, self.out_features])

    @staticmethod
    def pad(sets: Sequence[torch.Tensor], max_size: int | None = None) -> torch.Tensor:
        """Stack ``(L_i, D)`` tensors into a NaN-padded ``(N, L_max, D)`` tensor.

        Args:
            sets: Non-empty sequence of non-empty sets, each of shape ``(L_i, D)``.
            max_size: Padded length (default: the largest ``L_i``).

        Returns:
            The padded tensor, shape ``(N, L_max, D)``.

        Raises:
            InputDataError: If there are no sets, a set is empty or longer than ``max_size``.
            ShapeError: If the sets differ in ``D`` or are not 2-D.
        """
        if len(sets) == 0:
            raise InputDataError(expected_got("SetEncoder.pad(sets)", "at least one set", 0))
        for s in sets:
            if not isinstance(s, torch.Tensor) or s.dim() != 2 or s.shape[-1] != sets[0].shape[-1]:
                raise ShapeError(
                    expected_got(
                        "SetEncoder.pad(sets)",
                        f"2-D tensors (L_i, {sets[0].shape[-1]})",
                        tuple(s.shape) if isinstance(s, torch.Tensor) else type(s).__name__,
                    )
                )
            if s.shape[0] == 0:
                raise InputDataError(expected_got("SetEncoder.pad(sets)", "non-empty sets", 0))
        longest = max(s.shape[0] for s in sets)
        size = longest if max_size is None else int(max_size)
        if size < longest:
            raise InputDataError(expected_got("SetEncoder.pad.max_size", f">= {longest}", size))
        out = sets[0].new_full((len(sets), size, sets[0].shape[-1]), float("nan"))
        for i, s in enumerate(sets):
            out[i, : s.shape[0]] = s
        return out

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Encode a padded minibatch of sets.

        Args:
            x: Padded sets, shape ``(*batch, N, L, D)``.
            mask: Boolean, shape ``(*batch, N, L)``; ``True`` marks real elements.  Default:
                rows of ``x`` that are not all NaN.

        Returns:
            Set features, shape ``(*batch, N, d)``.

        Raises:
            ShapeError: If ``x`` or ``mask`` has the wrong shape.
            InputTypeError: If ``mask`` is not boolean.
            InputDataError: If a set has no element or a real element has NaN entries.
        """
        if x.dim() < 3 or x.shape[-1] != self.in_features:
            raise ShapeError(
                expected_got(
                    "SetEncoder.forward(x)", f"shape (N, L, {self.in_features})", tuple(x.shape)
                )
            )
        if mask is None:
            mask = ~torch.isnan(x).all(-1)
        else:
            if mask.dtype != torch.bool:
                raise InputTypeError(
                    expected_got("SetEncoder.forward(mask)", "a bool tensor", mask.dtype)
                )
            if mask.shape != x.shape[:-1]:
                raise ShapeError(
                    expected_got("SetEncoder.forward(mask)", tuple(x.shape[:-1]), tuple(mask.shape))
                )
        counts = mask.sum(-1, keepdim=True)  # shape: (*batch, N, 1)
        if bool((counts == 0).any()):
            raise InputDataError(
                expected_got(
                    "SetEncoder.forward(x)", "sets with at least one element", "an empty set"
                )
            )
        clean = torch.where(mask.unsqueeze(-1), x, torch.zeros_like(x))
        if bool(torch.isnan(clean).any()):
            raise InputDataError(
                expected_got(
                    "SetEncoder.forward(x)",
                    "finite values in real elements",
                    "NaN entries",
                    "Only whole padding rows may be NaN.",
                )
            )
        h = self.phi(clean)  # shape: (*batch, N, L, H)
        m = mask.unsqueeze(-1).to(h.dtype)
        if self.pooling == "max":
            pooled = h.masked_fill(~mask.unsqueeze(-1), float("-inf")).amax(-2)
        else:
            pooled = (h * m).sum(-2)
            if self.pooling == "mean":
                pooled = pooled / counts.to(h.dtype)
        return self.rho(pooled)

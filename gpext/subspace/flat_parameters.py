"""A flat view of a network's parameters for functional evaluation with ``torch.func``."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn
from torch.func import functional_call

from gpext.errors import InputTypeError, ShapeError, expected_got
from gpext.utils import check_finite

__all__ = ["FlatParameters"]


class FlatParameters:
    r"""Map between a network's parameters and one flat weight vector :math:`w \in \mathbb{R}^D`.

    Weight-space algorithms (SWA, SWAG, subspaces, factor analysis) work on flat vectors; the
    network is evaluated at any :math:`w` functionally, with
    :func:`torch.func.functional_call`, so the module's own parameters are never overwritten:

    .. math::

        f_w(x) = \texttt{functional\_call}(\text{module}, \text{unflatten}(w), x).

    The order is that of ``module.named_parameters()``; buffers (e.g. batch-norm statistics) are
    taken from the module unless passed explicitly.

    Args:
        module: The network.

    Raises:
        InputTypeError: If ``module`` is not a :class:`torch.nn.Module` or has no parameters.

    Example:
        >>> net = torch.nn.Linear(3, 2)
        >>> flat = FlatParameters(net)
        >>> w = flat.flatten()            # shape: (8,)
        >>> flat.functional_call(2 * w, torch.randn(5, 3)).shape
        torch.Size([5, 2])
    """

    def __init__(self, module: nn.Module) -> None:
        if not isinstance(module, nn.Module):
            raise InputTypeError(
                expected_got("FlatParameters.module", "a torch.nn.Module", type(module).__name__)
            )
        named = list(module.named_parameters())
        if not named:
            raise InputTypeError(
                expected_got("FlatParameters.module", "a module with parameters", "none")
            )
        self.module = module
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.num_parameters = int(sum(self.numels))

    def flatten(self, module: nn.Module | None = None) -> torch.Tensor:
        """Current parameters of ``module`` (default: the wrapped one) as a detached vector.

        Returns:
            The flat weights. # shape: (D,)
        """
        params = dict((module or self.module).named_parameters())
        return torch.cat([params[n].detach().reshape(-1) for n in self.names])

    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        """Split a flat vector into named parameter tensors (views, gradients flow through).

        Args:
            w: Flat weights. # shape: (D,)

        Returns:
            ``{name: tensor}`` with the parameter shapes.

        Raises:
            ShapeError: If ``w`` is not a vector of length ``D``.
        """
        self.check_vector(w, "FlatParameters.unflatten(w)")
        chunks = torch.split(w, self.numels)
        return {n: c.view(s) for n, c, s in zip(self.names, chunks, self.shapes)}

    def assign(self, w: torch.Tensor, module: nn.Module | None = None) -> None:
        """Copy flat weights into the parameters of ``module`` (default: the wrapped one).

        Raises:
            ShapeError: If ``w`` has the wrong shape.
            InputDataError: If ``w`` has non-finite entries.
        """
        check_finite(self.check_vector(w, "FlatParameters.assign(w)"), "FlatParameters.assign(w)")
        params = dict((module or self.module).named_parameters())
        with torch.no_grad():
            for name, value in self.unflatten(w).items():
                params[name].copy_(value)

    def functional_call(
        self,
        w: torch.Tensor,
        *args: object,
        buffers: Mapping[str, torch.Tensor] | None = None,
        **kwargs: object,
    ) -> torch.Tensor:
        """Evaluate the network at weights ``w`` without touching its parameters.

        Args:
            w: Flat weights. # shape: (D,)
            *args: Positional inputs of the module's ``forward``.
            buffers: Buffers to use instead of the module's own (e.g. refreshed batch-norm
                statistics).
            **kwargs: Keyword inputs of ``forward``.

        Returns:
            The module's output.
        """
        state: dict[str, torch.Tensor] = dict(self.unflatten(w))
        if buffers is not None:
            state.update(buffers)
        return functional_call(self.module, state, args, kwargs)

    def check_vector(self, w: torch.Tensor, name: str) -> torch.Tensor:
        """Raise :class:`~gpext.errors.ShapeError` unless ``w`` has shape ``(D,)``."""
        if not isinstance(w, torch.Tensor):
            raise InputTypeError(expected_got(name, "a torch.Tensor", type(w).__name__))
        if w.dim() != 1 or w.shape[0] != self.num_parameters:
            raise ShapeError(expected_got(name, f"shape ({self.num_parameters},)", tuple(w.shape)))
        return w

"""A flat view of (a selection of) a network's parameters for functional evaluation.

:class:`FlatParameters` maps the selected parameters to one weight vector and evaluates the
network at any such vector with ``torch.func``; the selection (``parameters="all"``,
``"requires_grad"``, ``"last_layer"``, a list of names or a predicate on names, see
:data:`ParameterSelection`) decides which weights every weight-space algorithm built on it
(SWAG, subspaces, factor analysis, :class:`~gpext.subspace.SubspaceModel`) sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn
from torch.func import functional_call

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_finite

__all__ = ["FlatParameters", "ParameterSelection", "PARAMETER_SELECTIONS"]

#: Which parameters a weight-space method works on: one of :data:`PARAMETER_SELECTIONS`, a
#: sequence of parameter names (as in ``module.named_parameters()``) or a predicate
#: ``name -> bool``.
ParameterSelection = str | Sequence[str] | Callable[[str], bool]

#: The named selections: every parameter, the trainable ones, the last layer's.
PARAMETER_SELECTIONS = ("all", "requires_grad", "last_layer")


class FlatParameters:
    r"""Map between a network's parameters and one flat weight vector :math:`w \in \mathbb{R}^D`.

    Weight-space algorithms (SWA, SWAG, subspaces, factor analysis) work on flat vectors; the
    network is evaluated at any :math:`w` functionally, with
    :func:`torch.func.functional_call`, so the module's own parameters are never overwritten:

    .. math::

        f_w(x) = \texttt{functional\_call}(\text{module}, \text{unflatten}(w), x).

    The order is that of ``module.named_parameters()``; buffers (e.g. batch-norm statistics) are
    taken from the module unless passed explicitly.

    Parameter selection: ``parameters`` restricts :math:`w` to a subset of the parameters,
    :math:`w = \text{vec}(\theta_{\mathcal S})`, and :math:`D` is the number of selected
    weights; the parameters outside :math:`\mathcal S` keep the module's current values in
    :meth:`functional_call` (they are read from the module at every call) and are never
    written by :meth:`assign`.  Every algorithm built on a :class:`FlatParameters` then holds
    memory and does work only for the selected weights:

    * ``"all"`` (default): every parameter.
    * ``"requires_grad"``: the parameters with ``requires_grad=True`` (frozen ones excluded).
    * ``"last_layer"``: the parameters held directly by the last module, in
      ``module.modules()`` order, that holds parameters itself (the output layer of an
      ``nn.Sequential`` MLP), as laplace-torch's last-layer approximation.  It is an error
      when no module holds parameters, or when the root module holds parameters itself
      besides submodules that do (which of them acts last is then unknown).
    * a sequence of names from ``module.named_parameters()``, e.g. ``["2.weight", "2.bias"]``.
    * a predicate ``name -> bool``, e.g. ``lambda name: name.startswith("head.")``.

    Args:
        module: The network.
        parameters: Which parameters make up :math:`w` (:data:`ParameterSelection`).

    Raises:
        InputTypeError: If ``module`` is not a :class:`torch.nn.Module` or has no parameters,
            or ``parameters`` is of another type.
        InputDataError: For an unknown selection name or parameter name (the message lists the
            valid ones), a selection of no parameter, or an ambiguous last layer.

    Example:
        >>> net = torch.nn.Linear(3, 2)
        >>> flat = FlatParameters(net)
        >>> w = flat.flatten()            # shape: (8,)
        >>> flat.functional_call(2 * w, torch.randn(5, 3)).shape
        torch.Size([5, 2])
        >>> mlp = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        >>> head = FlatParameters(mlp, parameters="last_layer")
        >>> head.names, head.num_parameters
        (['2.weight', '2.bias'], 5)
    """

    def __init__(self, module: nn.Module, parameters: ParameterSelection = "all") -> None:
        if not isinstance(module, nn.Module):
            raise InputTypeError(
                expected_got("FlatParameters.module", "a torch.nn.Module", type(module).__name__)
            )
        if not list(module.parameters()):
            raise InputTypeError(
                expected_got("FlatParameters.module", "a module with parameters", "none")
            )
        selected = set(_select(module, parameters))
        named = [(n, p) for n, p in module.named_parameters() if n in selected]
        self.module = module
        #: The selection as given (resolved to :attr:`names`).
        self.selection = parameters
        self.names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.num_parameters = int(sum(self.numels))

    @property
    def is_subset(self) -> bool:
        """Whether only some of the module's parameters are selected."""
        return len(self.names) < len(list(self.module.parameters()))

    def flatten(self, module: nn.Module | None = None) -> torch.Tensor:
        """Current selected parameters of ``module`` (default: the wrapped one) as a detached vector.

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
        """Copy flat weights into the selected parameters of ``module`` (default: the wrapped one).

        The parameters outside the selection are left as they are.

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

        Parameters outside the selection take the module's current values.

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


def _select(module: nn.Module, parameters: ParameterSelection) -> list[str]:
    """Names of the selected parameters, in ``module.named_parameters()`` order."""
    what = "FlatParameters.parameters"
    named = list(module.named_parameters())
    valid = [n for n, _ in named]
    if isinstance(parameters, str):
        if parameters == "all":
            chosen = valid
        elif parameters == "requires_grad":
            chosen = [n for n, p in named if p.requires_grad]
        elif parameters == "last_layer":
            chosen = _last_layer(module)
        else:
            raise InputDataError(
                expected_got(what, f"one of {PARAMETER_SELECTIONS}, a list of parameter names "
                             "or a callable name -> bool", repr(parameters),
                             f"Parameter names of this module: {valid}.")
            )  # fmt: skip
    elif callable(parameters):
        chosen = [n for n in valid if parameters(n)]
    elif isinstance(parameters, Sequence) and all(isinstance(n, str) for n in parameters):
        unknown = [n for n in parameters if n not in valid]
        if unknown:
            raise InputDataError(
                expected_got(what, f"names of the module's parameters, from {valid}",
                             f"unknown names {unknown}", "Check module.named_parameters().")
            )  # fmt: skip
        wanted = set(parameters)
        chosen = [n for n in valid if n in wanted]
    else:
        raise InputTypeError(
            expected_got(what, f"one of {PARAMETER_SELECTIONS}, a list of parameter names or a "
                         "callable name -> bool", type(parameters).__name__)
        )  # fmt: skip
    if not chosen:
        raise InputDataError(
            expected_got(what, "a selection of at least one parameter",
                         f"none selected by {parameters!r}", f"Parameter names: {valid}.")
        )  # fmt: skip
    return chosen


def _last_layer(module: nn.Module) -> list[str]:
    """Parameters held directly by the last module (``modules()`` order) that holds any."""
    holders = [
        (prefix, m) for prefix, m in module.named_modules() if list(m.parameters(recurse=False))
    ]
    if not holders:  # pragma: no cover - FlatParameters already requires parameters
        raise InputDataError(
            expected_got("FlatParameters.parameters='last_layer'", "a module holding parameters",
                         "none")
        )  # fmt: skip
    if holders[0][0] == "" and len(holders) > 1:
        raise InputDataError(
            expected_got(
                "FlatParameters.parameters='last_layer'",
                "parameters held by submodules only (the last of them is the last layer)",
                f"a root module ({type(module).__name__}) that holds parameters itself "
                f"({[n for n, _ in module.named_parameters(recurse=False)]}) besides submodules",
                "Pass the names of the last layer's parameters instead.",
            )
        )  # fmt: skip
    prefix, last = holders[-1]
    return [f"{prefix}.{n}" if prefix else n for n, _ in last.named_parameters(recurse=False)]

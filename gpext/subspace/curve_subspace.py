"""The curve subspace: the plane of a trained quadratic Bezier curve between two solutions."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from gpext.errors import InputDataError, NotFittedError, ShapeError, expected_got
from gpext.subspace.batch_norm import has_batch_norm
from gpext.subspace.data import _merge_single_rows
from gpext.subspace.flat_parameters import FlatParameters, ParameterSelection
from gpext.subspace.output_likelihood import OutputLikelihood
from gpext.utils import check_finite, check_positive_int, progress_bar

__all__ = ["CurveSubspace", "bezier_point"]


def bezier_point(
    w0: torch.Tensor, control: torch.Tensor, w1: torch.Tensor, t: float | torch.Tensor
) -> torch.Tensor:
    r"""The quadratic Bezier curve :math:`\phi(t) = (1-t)^2 w_0 + 2t(1-t)\,c + t^2 w_1`.

    Args:
        w0: Start. # shape: (D,)
        control: Control point :math:`c`. # shape: (D,)
        w1: End. # shape: (D,)
        t: Position in ``[0, 1]`` (a number or a 0-d tensor).

    Returns:
        :math:`\phi(t)`. # shape: (D,)
    """
    return (1 - t) ** 2 * w0 + 2 * t * (1 - t) * control + t**2 * w1


class CurveSubspace(nn.Module):
    r"""The 2-D subspace of a low-loss quadratic Bezier curve between two trained networks.

    Two independently trained weight vectors :math:`w_0, w_1` are joined by the curve
    :math:`\phi_c(t)` of :func:`bezier_point` whose control point :math:`c` minimises the
    expected loss along it (Garipov et al. 2018; the "curve subspace" that 000 and Izmailov,
    Maddox et al. 2019 compare with),

    .. math::

        c^\star = \arg\min_c \; \mathbb{E}_{t \sim U(0, 1)}
        \Big[-\tfrac{1}{N} \textstyle\sum_n \log p(y_n \mid f_{\phi_c(t)}(x_n))
        + \tfrac{\lambda}{2} \lVert \phi_c(t) \rVert^2\Big],

    trained by SGD with one :math:`t` per mini-batch. The subspace is the plane through
    :math:`w_0, w_1, c^\star`, centred at the chord's midpoint:

    .. math::

        \hat w = \tfrac{1}{2}(w_0 + w_1), \quad
        p_1 = \tfrac{1}{2}(w_1 - w_0), \quad
        p_2 = (c^\star - \hat w) - \frac{(c^\star - \hat w)^\top p_1}{p_1^\top p_1}\, p_1,
        \qquad w = \hat w + P^\top \theta, \; P = [p_1; p_2],

    so :math:`\theta = (\mp 1, 0)` are the two end points and the whole curve lies in the
    plane (:math:`\phi(t) = \hat w + P^\top\theta(t)` with :meth:`curve_coordinates`). Use
    ``center`` and ``projection`` wherever a PCA or InKPCA subspace goes, e.g.
    ``SubspaceModel(net, sub.center, sub.projection, likelihood)``.

    Parameter selection: :meth:`fit` takes ``parameters`` (:class:`~gpext.subspace.FlatParameters`:
    ``"all"``, ``"requires_grad"``, ``"last_layer"``, names or a predicate); :math:`w_0, w_1, c`
    and the subspace then hold the :math:`D` selected weights only (memory :math:`O(D)`,
    gradients only for them), and the other parameters keep the module's values at every
    point of the curve, e.g. a curve between two last layers on one shared body.  The
    selection's names are kept in :attr:`parameter_names`:
    ``SubspaceModel(net, sub.center, sub.projection, likelihood,
    parameters=sub.parameter_names)``.

    Args:
        epochs: Training epochs of the control point.
        lr: SGD learning rate.
        momentum: SGD momentum.
        weight_decay: :math:`\lambda`.
        batch_size: Mini-batch size when the data are tensors (default ``ceil(N / 10)``).
        show_progress: Progress bar (``None``: only on an interactive terminal).

    Example:
        >>> torch.manual_seed(0)  # doctest: +ELLIPSIS
        <torch._C.Generator object at ...>
        >>> net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        >>> x = torch.linspace(-2, 2, 40).unsqueeze(-1); y = x.squeeze(-1).sin()
        >>> flat = FlatParameters(net)
        >>> w0, w1 = flat.flatten(), flat.flatten() + 0.1 * torch.randn(flat.num_parameters)
        >>> lik = OutputLikelihood("gaussian", noise_variance=0.1)
        >>> sub = CurveSubspace(epochs=5).fit(net, w0, w1, (x, y), lik)
        >>> sub.projection.shape, sub.center.shape
        (torch.Size([2, 25]), torch.Size([25]))
    """

    def __init__(
        self,
        *,
        epochs: int = 100,
        lr: float = 1e-2,
        momentum: float = 0.9,
        weight_decay: float = 1e-4,
        batch_size: int | None = None,
        show_progress: bool | None = None,
    ) -> None:
        super().__init__()
        self.epochs = check_positive_int(epochs, "CurveSubspace.epochs")
        for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
            lower_ok = value > 0 if name == "lr" else value >= 0
            if not (isinstance(value, (int, float)) and lower_ok):
                raise InputDataError(
                    expected_got(f"CurveSubspace.{name}", "a non-negative number", value)
                )
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.batch_size = batch_size
        self.show_progress = show_progress
        for name in ("_w0", "_w1", "_control"):
            self.register_buffer(name, torch.empty(0))
        self.losses: list[float] = []
        #: Names of the parameters the curve lives on (set by :meth:`fit`; ``None`` before).
        self.parameter_names: list[str] | None = None

    # ------------------------------------------------------------------ fitted quantities
    def _fitted(self) -> None:
        if self._control.numel() == 0:
            raise NotFittedError("CurveSubspace: call fit(module, w0, w1, data, likelihood) first.")

    @property
    def endpoints(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(w0, w1)``. # shape: (D,) each"""
        self._fitted()
        return self._w0, self._w1

    @property
    def control(self) -> torch.Tensor:
        """The trained control point :math:`c^\\star`. # shape: (D,)"""
        self._fitted()
        return self._control

    @property
    def center(self) -> torch.Tensor:
        """The chord's midpoint :math:`\\hat w`. # shape: (D,)"""
        self._fitted()
        return 0.5 * (self._w0 + self._w1)

    @property
    def projection(self) -> torch.Tensor:
        """The projection ``P = [p_1; p_2]``. # shape: (2, D)"""
        self._fitted()
        p1 = 0.5 * (self._w1 - self._w0)
        v = self._control - self.center
        p2 = v - (v @ p1) / (p1 @ p1) * p1
        return torch.stack([p1, p2])

    def curve_point(self, t: float) -> torch.Tensor:
        """:math:`\\phi(t)` on the trained curve. # shape: (D,)"""
        self._fitted()
        return bezier_point(self._w0, self._control, self._w1, t)

    def curve_coordinates(self, t: float) -> torch.Tensor:
        r"""Coordinates :math:`\theta(t)` with :math:`\phi(t) = \hat w + P^\top \theta(t)`.

        Returns:
            # shape: (2,)
        """
        p = self.projection
        rhs = p @ (self.curve_point(t) - self.center)
        return torch.linalg.solve(p @ p.T, rhs)

    # ------------------------------------------------------------------------- training
    def fit(
        self,
        module: nn.Module,
        w0: torch.Tensor,
        w1: torch.Tensor,
        data: tuple[torch.Tensor, torch.Tensor] | Iterable,
        likelihood: OutputLikelihood,
        *,
        generator: torch.Generator | None = None,
        parameters: ParameterSelection = "all",
    ) -> CurveSubspace:
        """Train the control point between ``w0`` and ``w1`` (the module is not changed).

        The module's parameters, buffers, gradients (``.grad``) and train/eval mode are left as
        they are: the control point's gradient is taken with :func:`torch.autograd.grad`, which
        runs the backward pass only as far as the selected weights.

        Args:
            module: The network (evaluated functionally at curve points).
            w0: First solution's flat weights of the selected parameters
                (``FlatParameters(module, parameters).flatten()``). # shape: (D,)
            w1: Second solution's flat weights. # shape: (D,)
            data: ``(x, y)`` tensors (shuffled into mini-batches of ``batch_size``) or any
                iterable of ``(x, y)`` batches, e.g. a ``torch.utils.data.DataLoader``
                (iterated once per epoch).
            likelihood: How the outputs score the targets.
            generator: Random generator (mini-batches and curve positions).
            parameters: Which parameters the curve moves
                (:data:`~gpext.subspace.ParameterSelection`); the others keep the module's
                values, and the weight decay acts on the selected weights only.

        Returns:
            ``self``; ``losses`` holds the mean loss of every epoch, ``parameter_names`` the
            selected parameters.

        Raises:
            ShapeError: If ``w0`` or ``w1`` does not have the selection's number of weights.
            InputDataError: If the end points coincide or are not finite, or no batch is given;
                for an unknown selection or parameter name.
            InputTypeError: For a ``parameters`` of another type.
        """
        flat = FlatParameters(module, parameters)
        w0 = flat.check_vector(w0, "CurveSubspace.fit(w0)").detach()
        w1 = flat.check_vector(w1, "CurveSubspace.fit(w1)").detach().to(w0)
        check_finite(w0, "CurveSubspace.fit(w0)")
        check_finite(w1, "CurveSubspace.fit(w1)")
        if bool(torch.equal(w0, w1)):
            raise InputDataError(
                expected_got(
                    "CurveSubspace.fit(w0, w1)", "two different solutions", "w0 == w1",
                    "Train two networks from different initialisations.",
                )
            )  # fmt: skip
        batches = self._batches(data, w0, generator)
        control = (0.5 * (w0 + w1)).clone().requires_grad_(True)
        opt = torch.optim.SGD(
            [control], lr=self.lr, momentum=self.momentum
        )  # weight decay acts on phi(t), not on c: it is in the loss
        was_training = module.training
        module.train()
        # batch norm in train mode updates running statistics in place: give it copies, so
        # the module's own buffers are not changed
        buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
        # and it has no variance for a batch of one row: merge such a batch into its neighbour
        bn = has_batch_norm(module)
        self.losses = []
        try:
            for _ in progress_bar(range(self.epochs), desc="curve", show=self.show_progress):
                total, count = 0.0, 0
                for xb, yb in _merge_single_rows(batches()) if bn else batches():
                    t = torch.rand((), generator=generator, dtype=w0.dtype).to(w0.device)
                    w = bezier_point(w0, control, w1, t)
                    out = flat.functional_call(w, xb, buffers=buffers)
                    loss = -likelihood.log_prob(out, yb).mean()
                    if self.weight_decay:
                        loss = loss + 0.5 * self.weight_decay * w.pow(2).sum()
                    # the gradient of the control point only: nothing accumulates in the
                    # module's own .grad, and the backward pass stops at the selection
                    (control.grad,) = torch.autograd.grad(loss, [control])
                    opt.step()
                    total, count = total + float(loss.detach()), count + 1
                if count == 0:
                    raise InputDataError(
                        expected_got("CurveSubspace.fit(data)", "at least one batch", "none")
                    )
                self.losses.append(total / count)
        finally:
            module.train(was_training)
        self._w0, self._w1, self._control = w0, w1, control.detach()
        self.parameter_names = list(flat.names)
        return self

    def _batches(self, data, like: torch.Tensor, generator):
        if isinstance(data, tuple) and len(data) == 2 and isinstance(data[0], torch.Tensor):
            x, y = data
            if not isinstance(y, torch.Tensor) or x.shape[0] != y.shape[0]:
                raise ShapeError(
                    expected_got(
                        "CurveSubspace.fit(data)", "(x, y) with the same number of rows",
                        (tuple(x.shape), tuple(getattr(y, "shape", ()))),
                    )
                )  # fmt: skip
            n = x.shape[0]
            if n == 0:
                raise InputDataError(expected_got("CurveSubspace.fit(data)", "N >= 1 rows", 0))
            size = self.batch_size or max(1, -(-n // 10))
            size = check_positive_int(size, "CurveSubspace.batch_size")

            def tensors():
                perm = torch.randperm(n, generator=generator).to(x.device)
                for start in range(0, n, size):
                    idx = perm[start : start + size]
                    yield x[idx], y[idx]

            return tensors
        if not isinstance(data, Iterable):
            raise InputDataError(
                expected_got(
                    "CurveSubspace.fit(data)", "(x, y) tensors or an iterable of (x, y) batches",
                    type(data).__name__,
                )
            )  # fmt: skip
        return lambda: iter(data)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: D401
        for name in ("_w0", "_w1", "_control"):
            if prefix + name in state_dict:
                setattr(self, name, torch.empty_like(state_dict[prefix + name]))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

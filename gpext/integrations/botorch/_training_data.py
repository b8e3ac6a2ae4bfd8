"""Training data and transforms of the adapters, stored the way BoTorch models store them."""

from __future__ import annotations

import copy
from typing import Any

import torch
from botorch.models.model import Model

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.integrations.botorch._checks import check_query

__all__ = ["TrainingDataMixin", "attach_training_data", "labels_from_targets", "take_over_state"]


def attach_training_data(
    model: Model,
    train_X: torch.Tensor | None,
    train_Y: torch.Tensor | None,
    input_transform: torch.nn.Module | None,
    outcome_transform: torch.nn.Module | None,
    *,
    input_dim: int | None,
    what: str,
) -> None:
    """Set ``input_transform``, ``outcome_transform``, ``train_X`` and ``train_Y`` on ``model``.

    As in BoTorch's ``SingleTaskGP``, the input transform is called once on ``train_X`` in train
    mode (so that e.g. ``Normalize(learn_bounds=True)`` learns its bounds) and the outcome
    transform is applied to ``train_Y`` once, here; ``model.train_Y`` holds the transformed
    targets.

    Args:
        model: The adapter.
        train_X: Training inputs or ``None``. # shape: (n, d)
        train_Y: Training targets or ``None``. # shape: (n, m)
        input_transform: BoTorch ``InputTransform`` or ``None``.
        outcome_transform: BoTorch ``OutcomeTransform`` or ``None``.
        input_dim: Expected ``d``.
        what: Adapter name for messages.

    Raises:
        ShapeError: If the data do not have the shapes ``(n, d)`` and ``(n, m)``.
    """
    if input_transform is not None:
        model.input_transform = input_transform
    if outcome_transform is not None:
        model.outcome_transform = outcome_transform
    model.train_X, model.train_Y = None, None
    if (train_X is None) != (train_Y is None):
        raise InputDataError(
            expected_got(f"{what}(train_X, train_Y)", "both or neither", "only one of them")
        )
    if train_X is None:
        return
    check_query(train_X, input_dim, None, f"{what}.train_X")
    if train_X.dim() != 2 or train_Y.dim() != 2 or train_Y.shape[0] != train_X.shape[0]:
        raise ShapeError(
            expected_got(
                f"{what}(train_X, train_Y)",
                "train_X of shape (n, d) and train_Y of shape (n, m) (BoTorch convention: an "
                "explicit output dimension)",
                f"{tuple(train_X.shape)} and {tuple(train_Y.shape)}",
                "Use train_Y.unsqueeze(-1) for a single output.",
            )
        )
    if input_transform is not None:
        model.train()
        with torch.no_grad():
            model.transform_inputs(train_X)
    if outcome_transform is not None:
        outcome_transform.train()
        train_Y, _ = outcome_transform(train_Y, X=train_X)
    model.train_X, model.train_Y = train_X, train_Y
    model.eval()


def labels_from_targets(train_Y: torch.Tensor, num_classes: int, what: str) -> torch.Tensor:
    """Class labels ``(n,)`` from BoTorch-style targets ``(n, 1)`` holding whole numbers.

    Raises:
        ShapeError: If ``train_Y`` is not ``(n, 1)``.
        InputDataError: If the values are not whole numbers in ``[0, num_classes)``.
    """
    if train_Y.dim() != 2 or train_Y.shape[-1] != 1:
        raise ShapeError(
            expected_got(f"{what} train_Y", "labels of shape (n, 1)", tuple(train_Y.shape))
        )
    y = train_Y.squeeze(-1)
    if bool((y != y.round()).any()) or bool(((y < 0) | (y >= num_classes)).any()):
        raise InputDataError(
            expected_got(f"{what} train_Y", f"whole numbers in [0, {num_classes})", "other values")
        )
    return y.round().long()


# what an adapter keeps of its own when it takes over another adapter's fitted state
_OWN_STATE = ("input_transform", "outcome_transform", "train_X", "train_Y")


def take_over_state(
    target: torch.nn.Module, source: torch.nn.Module, keep: tuple[str, ...]
) -> None:
    """Make ``target`` hold ``source``'s state, except the attributes named in ``keep``.

    ``target``'s submodules, buffers and attributes are replaced by ``source``'s, whatever they
    are, except the attributes in ``keep`` (those that are not ``None``), which it keeps.  Used where
    an adapter's model is made by a function returning a new adapter (``fit_weight_ensemble``)
    and when an adapter takes a fitted adapter's ``state_dict``.  ``source`` must not be used
    afterwards (the values are shared, the registries copied).

    Args:
        target: The adapter to fill.
        source: An adapter of the same class.
        keep: Names of ``target``'s attributes to keep.
    """
    kept = {name: getattr(target, name) for name in keep if getattr(target, name, None) is not None}
    state = vars(source).items()
    target.__dict__.clear()  # e.g. a plain ``model = None`` would hide a submodule ``model``
    target.__dict__.update({k: copy.copy(v) if isinstance(v, (dict, set)) else v for k, v in state})
    for name, value in kept.items():
        setattr(target, name, value)


class TrainingDataMixin:
    """Constructor shared by the adapter base classes: optional training data and transforms.

    Put it before the BoTorch base class (``class A(TrainingDataMixin, Model)``); it stores
    ``train_X``/``train_Y`` with :func:`attach_training_data` and leaves the transformation of the
    training inputs to :func:`~gpext.integrations.botorch.fit_gpext_surrogate`.

    State dicts: a gpext adapter's posterior is its wrapped model (network weights, inducing
    points, ensemble members), not a few hyperparameters over training data as for BoTorch's
    GPs, and an adapter built from data (``construct_inputs``) may have no model or one of
    another size before it is fitted.  So ``state_dict()`` also holds a reference to the adapter
    (the ``_extra_state`` entry), and ``load_state_dict`` of such a state first makes this
    adapter a copy of that one (its wrapped model, members and settings), keeping its own
    training data and transform objects, then loads the tensors as usual.  This is what Ax's
    cross-validation does (it builds an adapter on each fold and loads the fitted model's state
    without refitting): the fold predictions are those of the fitted model.
    """

    _input_dim: int | None = None

    def __init__(
        self,
        *,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
        input_transform: torch.nn.Module | None = None,
        outcome_transform: torch.nn.Module | None = None,
    ) -> None:
        super().__init__()
        attach_training_data(
            self,
            train_X,
            train_Y,
            input_transform,
            outcome_transform,
            input_dim=self._input_dim,
            what=type(self).__name__,
        )

    def get_extra_state(self) -> dict[str, Any]:
        """The ``_extra_state`` entry of ``state_dict()``: a reference to this adapter."""
        return {"gpext_adapter": self}

    def set_extra_state(self, state: Any) -> None:
        """Become a copy of the adapter in ``state`` (see the class), keeping own data.

        Args:
            state: The ``_extra_state`` entry of a gpext adapter's ``state_dict()``, or ``None``.

        Raises:
            InputTypeError: If the entry holds an adapter of another class.
        """
        source = state.get("gpext_adapter") if isinstance(state, dict) else None
        if source is None or source is self:
            return
        if type(source) is not type(self):
            raise InputTypeError(
                expected_got(
                    f"{type(self).__name__}.load_state_dict",
                    f"the state_dict of a {type(self).__name__}",
                    f"that of a {type(source).__name__}",
                )
            )
        from gpext.integrations.botorch.sample_ensemble_surrogate import _deepcopy_detached

        take_over_state(self, _deepcopy_detached(source), _OWN_STATE)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # take the other adapter's structure before its tensors are copied in
        key = prefix + "_extra_state"
        if key in state_dict:
            self.set_extra_state(state_dict[key])
            state_dict = {**state_dict, key: None}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    # the adapters transform their training inputs explicitly (fit_gpext_surrogate)
    def _set_transformed_inputs(self) -> None:
        return None

    def _revert_to_original_inputs(self) -> None:
        return None

r"""The data contract of every gpext model: inputs and regression targets standardised inside.

A :class:`Standardizer` is fitted on the training data when a model is fitted and stored in the
model's ``state_dict``; the model works on

.. math::
    z = (x - \mu_x) / s_x, \qquad t = (y - \mu_y) / s_y

(per input column and per target column; inputs with more than two dimensions, such as images
or sets, get one location and scale over all their entries) and returns predictive means
:math:`\mu_y + s_y m` and variances :math:`s_y^2 v` in the original units, as scikit-learn's
``normalize_y`` and BoTorch's ``Normalize`` / ``Standardize`` do.  Every default (learning
rates, priors, initial noise, step budgets) is then stated for data with unit spread, whatever
the units of the user's table.  A constant input column keeps scale 1 (it is only centred) and a
constant target gets scale 1, each with a :class:`~gpext.errors.DataWarning`.

Models take ``standardize=True`` (the default) and document the opt-out ``standardize=False``
(the data are then used as given, e.g. when they are already on a unit scale).
"""

from __future__ import annotations

import warnings

import torch

from gpext.errors import DataWarning, InputDataError, NotFittedError, ShapeError, expected_got

__all__ = ["Standardizer"]


def _loc_scale(
    values: torch.Tensor, per_column: bool
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """Mean and standard deviation (float64) over rows, and the indices of constant columns."""
    v = values.detach().to(torch.float64)
    v = v.reshape(v.shape[0], -1) if per_column else v.reshape(-1, 1)
    loc = v.mean(0)
    scale = v.std(0) if v.shape[0] > 1 else torch.zeros_like(loc)
    # A column whose spread is at rounding level of its magnitude carries no information.
    eps = torch.finfo(values.dtype).eps if values.dtype.is_floating_point else 0.0
    floor = 16 * eps * loc.abs().clamp_min(torch.finfo(torch.float64).tiny)
    const = (~(scale > floor)) | (~torch.isfinite(scale))
    scale = torch.where(const, torch.ones_like(scale), scale)
    return loc, scale, [int(i) for i in torch.nonzero(const).reshape(-1)]


class Standardizer(torch.nn.Module):
    r"""Affine standardisation of inputs and targets, fitted on training data.

    .. math::
        z = (x - \mu_x) / s_x, \qquad t = (y - \mu_y) / s_y,

    with :math:`\mu, s` the column means and standard deviations of the training data.
    Untransforming a Gaussian prediction :math:`\mathcal N(m, v)` of :math:`t` gives
    :math:`\mathcal N(\mu_y + s_y m,\ s_y^2 v)` for :math:`y`.

    The statistics are buffers (``x_loc``, ``x_scale``, ``y_loc``, ``y_scale``), so they travel
    with the model's ``state_dict`` and ``.to(device)``; a fresh (unfitted) standardiser accepts
    a fitted one's state dict whatever the shapes.

    Args:
        inputs: Standardise inputs (``False``: :meth:`transform_inputs` is the identity).
        targets: Standardise targets (``False`` for classification labels).
        name: Name of the owner, for messages.

    Example:
        >>> s = Standardizer().fit(torch.tensor([[1.0], [3.0]]), torch.tensor([10.0, 30.0]))
        >>> s.transform_inputs(torch.tensor([[3.0]]))
        tensor([[0.7071]])
        >>> s.untransform_targets(torch.tensor([0.0]))
        tensor([20.])
    """

    def __init__(self, *, inputs: bool = True, targets: bool = True, name: str = "model") -> None:
        super().__init__()
        self.inputs = bool(inputs)
        self.targets = bool(targets)
        self.name = name
        for key in ("x_loc", "x_scale", "y_loc", "y_scale"):
            self.register_buffer(key, torch.empty(0, dtype=torch.float64))
        self.register_buffer("_is_fitted", torch.tensor(False))

    # ------------------------------------------------------------------ fitting
    @property
    def fitted(self) -> bool:
        """Whether :meth:`fit` ran (or a fitted state dict was loaded)."""
        return bool(self._is_fitted)

    def fit(self, x: torch.Tensor, y: torch.Tensor | None = None) -> Standardizer:
        """Fit the statistics on training inputs ``x`` (N, ...) and targets ``y`` (N,) or (N, C).

        Returns:
            ``self``.

        Raises:
            InputDataError: If there are no rows, or the data are not finite.
            ShapeError: If ``x`` and ``y`` have different numbers of rows.

        Warns:
            DataWarning: For constant input columns (scale 1, only centred) and constant
                targets (scale 1).
        """
        if not torch.is_tensor(x) or x.dim() < 1 or x.shape[0] < 1:
            raise InputDataError(
                expected_got(f"{self.name}: training inputs", "a tensor with at least one row",
                             getattr(x, "shape", type(x).__name__))
            )  # fmt: skip
        if y is not None and y.shape[0] != x.shape[0]:
            raise ShapeError(
                expected_got(f"{self.name}: training targets", f"{x.shape[0]} rows (as x)",
                             tuple(y.shape))
            )  # fmt: skip
        dev = x.device
        if self.inputs and x.dtype.is_floating_point:
            if not bool(torch.isfinite(x).all()):
                raise InputDataError(expected_got(f"{self.name}: training inputs",
                                                  "finite values", "NaN or inf"))  # fmt: skip
            loc, scale, const = _loc_scale(x, per_column=x.dim() == 2)
            if const and x.shape[0] > 1:
                cols = ", ".join(str(c) for c in const[:10]) + (" ..." if len(const) > 10 else "")
                what = "the inputs are constant" if x.dim() != 2 else f"input column(s) {cols}"
                warnings.warn(
                    f"{self.name}: {what} take a single value on the {x.shape[0]} training rows; "
                    "they carry no information here and are only centred (scale 1). Drop "
                    "them, or check that the training rows are representative.",
                    DataWarning,
                    stacklevel=3,
                )
            self.x_loc, self.x_scale = loc.to(dev), scale.to(dev)
        if self.targets and y is not None and y.dtype.is_floating_point:
            if not bool(torch.isfinite(y).all()):
                raise InputDataError(expected_got(f"{self.name}: training targets",
                                                  "finite values", "NaN or inf"))  # fmt: skip
            loc, scale, const = _loc_scale(y, per_column=True)
            if const and y.shape[0] > 1:
                warnings.warn(
                    f"{self.name}: the training targets are constant (value "
                    f"{float(loc[const[0]]):.6g}); there is nothing to fit and every prediction "
                    "will be that value with an uncertainty on a unit scale.",
                    DataWarning,
                    stacklevel=3,
                )
            self.y_loc, self.y_scale = loc.to(dev), scale.to(dev)
        self._is_fitted = torch.tensor(True, device=dev)
        return self

    def _require(self) -> None:
        if not self.fitted:
            raise NotFittedError(
                f"{self.name}: the data standardisation is not fitted; call fit(x, y) first."
            )

    # ------------------------------------------------------------------ transforms
    def _affine(self, v: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor, inverse: bool):
        if loc.numel() == 0:
            return v
        if loc.numel() > 1 and (v.dim() < 1 or v.shape[-1] != loc.numel()):
            raise ShapeError(
                expected_got(f"{self.name}: inputs", f"{loc.numel()} columns (as in training)",
                             tuple(v.shape))
            )  # fmt: skip
        loc = loc.to(v).reshape(-1) if loc.numel() > 1 else loc.to(v).reshape(())
        scale = scale.to(v).reshape(loc.shape)
        return v * scale + loc if inverse else (v - loc) / scale

    def transform_inputs(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`(x - \\mu_x) / s_x` (identity when inputs are not standardised)."""
        if not self.inputs or not x.dtype.is_floating_point:
            return x
        self._require()
        return self._affine(x, self.x_loc, self.x_scale, inverse=False)

    def untransform_inputs(self, z: torch.Tensor) -> torch.Tensor:
        """:math:`\\mu_x + s_x z`."""
        if not self.inputs or not z.dtype.is_floating_point:
            return z
        self._require()
        return self._affine(z, self.x_loc, self.x_scale, inverse=True)

    def _col(self, v: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, scale = self.y_loc.to(v), self.y_scale.to(v)
        if loc.numel() > 1 and v.dim() >= 1 and v.shape[-1] != loc.numel():
            raise ShapeError(
                expected_got(f"{self.name}: targets", f"{loc.numel()} columns", tuple(t.shape))
            )
        if loc.numel() == 1:
            loc, scale = loc.reshape(()), scale.reshape(())
        return loc, scale

    def transform_targets(self, y: torch.Tensor) -> torch.Tensor:
        """:math:`(y - \\mu_y) / s_y` (identity when targets are not standardised)."""
        if not self.targets or self.y_loc.numel() == 0:
            return y
        loc, scale = self._col(y, y)
        return (y - loc) / scale

    def untransform_targets(self, t: torch.Tensor) -> torch.Tensor:
        """:math:`\\mu_y + s_y t`: predictive means (and samples) back to original units."""
        if not self.targets or self.y_loc.numel() == 0:
            return t
        loc, scale = self._col(t, t)
        return t * scale + loc

    untransform_mean = untransform_targets

    def untransform_variance(self, v: torch.Tensor) -> torch.Tensor:
        """:math:`s_y^2 v`: predictive variances back to original units."""
        if not self.targets or self.y_loc.numel() == 0:
            return v
        _, scale = self._col(v, v)
        return v * scale.pow(2)

    @property
    def target_scale(self) -> float:
        """:math:`s_y` (the first target column's; 1 without target standardisation)."""
        if not self.targets or self.y_scale.numel() == 0:
            return 1.0
        return float(self.y_scale.reshape(-1)[0])

    # ------------------------------------------------------------------ state dict
    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for key in ("x_loc", "x_scale", "y_loc", "y_scale"):
            value = state_dict.get(prefix + key)
            if value is not None and value.shape != getattr(self, key).shape:
                setattr(self, key, torch.empty_like(value))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"inputs={self.inputs}, targets={self.targets}, fitted={self.fitted}"

r"""BoTorch adapter of the variational-bootstrap ensembles :class:`gpext.bootstrap.VBootRFF` and
:class:`gpext.bootstrap.VBootMLP`."""

from __future__ import annotations

from typing import Any

import torch
from botorch.utils.datasets import SupervisedDataset

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.errors import InputDataError, InputTypeError, NotFittedError, expected_got
from gpext.fit import AUTO_VALIDATION_MIN_POINTS
from gpext.integrations.botorch._construct_inputs import dataset_tensors
from gpext.integrations.botorch._training_data import labels_from_targets
from gpext.integrations.botorch.sample_ensemble_surrogate import SampleEnsembleSurrogate

__all__ = ["SMALL_DESIGN_HIDDEN_SIZES", "VBootSurrogate"]

#: Hidden widths of :meth:`VBootSurrogate.construct_inputs`'s ``VBootMLP`` on small designs.
SMALL_DESIGN_HIDDEN_SIZES = (64, 64)


class VBootSurrogate(SampleEnsembleSurrogate):
    r"""A variational-bootstrap ensemble as a BoTorch ``EnsembleModel``.

    Member ``k`` is particle ``k``, the perturbed-MAP solution of 001 Eq. (7)/(8),
    :math:`f^{(k)}(x) = m + \phi(x)^\top \hat{\mathbf w}^{(k)}` for ``VBootRFF`` and the ``k``-th
    network for ``VBootMLP``; the posterior values are the particles' latent outputs
    (``C`` of them for a classifier, whose :meth:`class_probabilities` average the softmax over
    particles, 001 Eq. 12).  ``condition_on_observations`` and ``fantasize`` use the fitted
    regression noise as the observation noise.

    Args:
        model: A :class:`~gpext.bootstrap.VBootRFF` or :class:`~gpext.bootstrap.VBootMLP`
            (fitted, or fitted by :func:`~gpext.integrations.botorch.fit_gpext_surrogate`).
        input_dim: ``d``; needed only when the model is not fitted yet and ``train_X`` is not
            given (it is read from the fitted model otherwise).
        train_X: Training inputs. # shape: (n, d)
        train_Y: Targets ``(n, m)`` (class labels ``(n, 1)`` for a classifier).
        input_transform: BoTorch ``InputTransform``.
        outcome_transform: BoTorch ``OutcomeTransform`` (regression only).

    Raises:
        InputTypeError: If ``model`` is not a VBoot ensemble.

    Example:
        >>> import torch
        >>> from botorch.models.transforms import Standardize
        >>> from gpext.bootstrap import VBootRFF
        >>> from gpext.integrations.botorch import VBootSurrogate, fit_gpext_surrogate
        >>> X = torch.rand(20, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        >>> Y = (6 * X).sin().sum(-1, keepdim=True)
        >>> vboot = VBootRFF(num_features=200, num_particles=32, noise=1e-3)
        >>> model = VBootSurrogate(vboot, train_X=X, train_Y=Y, outcome_transform=Standardize(1))
        >>> model = fit_gpext_surrogate(model, generator=torch.Generator().manual_seed(0))
        >>> model.posterior(torch.rand(5, 2, X.shape[-1], dtype=X.dtype)).values.shape
        torch.Size([5, 32, 2, 1])
    """

    def __init__(
        self,
        model: VBootRFF | VBootMLP,
        input_dim: int | None = None,
        train_X: torch.Tensor | None = None,
        train_Y: torch.Tensor | None = None,
        input_transform: torch.nn.Module | None = None,
        outcome_transform: torch.nn.Module | None = None,
    ) -> None:
        if not isinstance(model, (VBootRFF, VBootMLP)):
            raise InputTypeError(
                expected_got("VBootSurrogate.model", "a VBootRFF or VBootMLP", type(model).__name__)
            )
        if input_dim is None and train_X is not None:
            input_dim = int(train_X.shape[-1])
        self._input_dim = input_dim
        super().__init__(
            train_X=train_X,
            train_Y=train_Y,
            input_transform=input_transform,
            outcome_transform=outcome_transform,
        )
        self.model = model
        self._classifier = model.task == "classification"
        if self._classifier:
            self._num_outputs = model.num_classes
        else:
            self._num_outputs = 1 if train_Y is None else int(train_Y.shape[-1])

    @property
    def _calibrate_by_default(self) -> bool:
        """A VBootMLP regression ensemble fitted to a few points interpolates them and its
        particles agree away from them (Branin, 10 points, 500 steps: 16% of test values inside
        the 90% intervals), so :func:`~gpext.integrations.botorch.fit_gpext_surrogate`
        calibrates its spread on small designs; VBootRFF's spread is its kernel's."""
        return isinstance(self.model, VBootMLP) and not self._classifier

    @property
    def _reverts_to_prior(self) -> bool:
        """A VBootMLP regression ensemble extrapolates its fit: its calibrated spread at the
        corners of Hartmann-6's cube (10 points) reached 1.5 against the targets' 0.36, so
        a calibrated one is combined with a :class:`~gpext.integrations.botorch.PriorReversion`;
        VBootRFF's random features are stationary and its spread is its kernel's."""
        return self._calibrate_by_default

    @classmethod
    def construct_inputs(
        cls, training_data: SupervisedDataset, *, ensemble: str = "rff", **vboot_kwargs: Any
    ) -> dict[str, Any]:
        """Constructor arguments for an unfitted regression ensemble on a dataset (used by Ax).

        Ax passes ``ModelConfig.model_options`` here and fits with
        :func:`~gpext.integrations.botorch.ax_support.fit_ax_surrogate` (``mll_options``: the
        ensemble's ``fit`` arguments).

        Args:
            training_data: A ``SupervisedDataset`` (one or more outcomes).
            ensemble: ``"rff"``: ``VBootRFF(num_features=512, num_particles=32)`` (the sizes of
                ``benchmarks/bo.py``; kernel hyperparameters are fitted with the ensemble), or
                ``"mlp"``: ``VBootMLP()`` in the data's dtype, with hidden layers of
                :data:`SMALL_DESIGN_HIDDEN_SIZES` on designs of fewer than
                :data:`~gpext.fit.AUTO_VALIDATION_MIN_POINTS` points.  The 512-512 default
                is made for data sets of thousands of points; on the 5-50 points of a BO
                loop its 2.6 million weights per particle made every step cost tens of
                milliseconds, so the hundreds of steps a small design needs
                (:meth:`~gpext.bootstrap.VBootMLP.fit`'s ``num_epochs``) were out of reach.
            **vboot_kwargs: Arguments of ``VBootRFF`` / ``VBootMLP``, overriding those.

        Returns:
            ``{"model", "train_X", "train_Y"}``.

        Raises:
            InputTypeError: If ``training_data`` is not a ``SupervisedDataset``.
            InputDataError: If ``ensemble`` is neither ``"rff"`` nor ``"mlp"``.
        """
        X, Y = dataset_tensors(
            training_data, "VBootSurrogate.construct_inputs", single_output=False
        )
        if ensemble == "rff":
            model = VBootRFF(**{"num_features": 512, "num_particles": 32, **vboot_kwargs})
        elif ensemble == "mlp":
            if X.shape[0] < AUTO_VALIDATION_MIN_POINTS:
                vboot_kwargs = {"hidden_sizes": SMALL_DESIGN_HIDDEN_SIZES, **vboot_kwargs}
            model = VBootMLP(**{"dtype": X.dtype, **vboot_kwargs})
        else:
            raise InputDataError(
                expected_got(
                    "VBootSurrogate.construct_inputs(ensemble)", "'rff' or 'mlp'", ensemble
                )
            )
        return {"model": model, "train_X": X, "train_Y": Y}

    def _members(self, X: torch.Tensor) -> torch.Tensor:
        if not self.model.is_fitted:
            raise NotFittedError("VBootSurrogate: fit the VBoot model first.")
        return self.model(X)  # shape: (K, N, C)

    def _noise_variance(self, X: torch.Tensor) -> torch.Tensor | None:
        # the fitted scalar regression noise (NaN when it was given per training point)
        if self._classifier or not self.model.is_fitted:
            return None
        noise = self.model.noise_.to(X)
        if not bool(torch.isfinite(noise)) or not bool(noise > 0):
            return None
        return noise.reshape(1, 1)

    def _fit_wrapped(self, X: torch.Tensor, Y: torch.Tensor, **kwargs: Any) -> None:
        if self._classifier:
            y = labels_from_targets(Y, self.model.num_classes, "VBootSurrogate")
        else:
            y = Y.squeeze(-1) if Y.shape[-1] == 1 else Y
        self.model.fit(X, y, **kwargs)

    def _member_class_probabilities(self, X: torch.Tensor) -> torch.Tensor:
        if not self._classifier:
            return super()._member_class_probabilities(X)
        return torch.softmax(self._members(X), dim=-1)

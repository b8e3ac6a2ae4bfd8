"""A base kernel applied to the output of a neural feature extractor (a "deep kernel")."""

from __future__ import annotations

import copy

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_positive_int

__all__ = ["FeatureMapKernel"]


class FeatureMapKernel(Kernel):
    r"""Any GPyTorch kernel evaluated on the features of a network :math:`g`.

    .. math::

        k(\mathbf x, \mathbf x') = k_{\text{base}}\big(g(\mathbf x),\, g(\mathbf x')\big),

    the covariance of deep kernel learning and of the feature-space GPs of 002.  The extractor
    :math:`g` maps inputs ``(*batch, N, D)`` to features ``(*batch, N, d)``; its parameters are
    ordinary module parameters, so an exact marginal likelihood or an ELBO trains the network
    and the base kernel's hyperparameters together.  When ``x1`` and ``x2`` are the same
    tensor (the training covariance), :math:`g` runs once.

    * **ARD over features**: the default base kernel is
      ``ScaleKernel(RBFKernel(ard_num_dims=d))``, one lengthscale per feature.
    * **Batch shapes** are those of the base kernel; indexing (``kernel[i]``) and
      :meth:`expand_batch` act on the base kernel, the network is shared.
    * ``diag=True`` evaluates the base kernel's diagonal on the features.
    * ``last_dim_is_batch=True`` treats the **feature** dimension as a batch dimension (an
      additive or product structure over features): the result has shape
      ``(*batch, d, N, M)``.  GPyTorch has deprecated the flag; it is supported here by
      evaluating eagerly, since the lazy kernel tensor would infer ``D`` instead of ``d``.
    * ``active_dims`` of this kernel select input dimensions before :math:`g`; the base
      kernel's own ``active_dims`` select features.

    Args:
        feature_extractor: The network :math:`g` (any ``torch.nn.Module``).
        base_kernel: The kernel on features (default: a scaled ARD RBF kernel over
            ``num_features`` features with the given ``batch_shape``).
        num_features: Feature dimension ``d`` for the default base kernel (default
            ``feature_extractor.out_features``).
        ard: One lengthscale per feature in the default base kernel.
        batch_shape: Batch shape of the default base kernel.
        active_dims: Input dimensions passed to :math:`g`.

    Raises:
        InputTypeError: If ``feature_extractor`` is not a module or ``base_kernel`` not a kernel.
        InputDataError: If ``d`` is needed but cannot be found.

    Example:
        >>> from gpext.nn import MLP
        >>> kernel = FeatureMapKernel(MLP(3, [32], 4))
        >>> x = torch.randn(10, 3)
        >>> kernel(x).shape, kernel(x, diag=True).shape
        (torch.Size([10, 10]), torch.Size([10]))
    """

    has_lengthscale = False

    def __init__(
        self,
        feature_extractor: nn.Module,
        base_kernel: Kernel | None = None,
        *,
        num_features: int | None = None,
        ard: bool = True,
        batch_shape: torch.Size | None = None,
        active_dims: tuple[int, ...] | None = None,
    ) -> None:
        if not isinstance(feature_extractor, nn.Module):
            raise InputTypeError(
                expected_got("FeatureMapKernel.feature_extractor", "a torch.nn.Module",
                             type(feature_extractor).__name__)
            )  # fmt: skip
        if base_kernel is not None and not isinstance(base_kernel, Kernel):
            raise InputTypeError(
                expected_got("FeatureMapKernel.base_kernel", "a gpytorch.kernels.Kernel or None",
                             type(base_kernel).__name__)
            )  # fmt: skip
        super().__init__(active_dims=active_dims)
        if base_kernel is None:
            d = num_features
            if d is None:
                d = getattr(feature_extractor, "out_features", None)
            if d is None:
                raise InputDataError(
                    "FeatureMapKernel: expected num_features or a feature_extractor with an "
                    f"`out_features` attribute for the default ARD kernel, got neither "
                    f"({type(feature_extractor).__name__}).  Pass num_features=d or a base_kernel."
                )
            d = check_positive_int(d, "FeatureMapKernel.num_features")
            batch = torch.Size([]) if batch_shape is None else torch.Size(batch_shape)
            base_kernel = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=d if ard else None, batch_shape=batch),
                batch_shape=batch,
            )
        self.feature_extractor = feature_extractor
        self.base_kernel = base_kernel

    @property
    def is_stationary(self) -> bool:
        """``False``: a network in front of any kernel breaks stationarity in the inputs."""
        return False

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The features :math:`g(\\mathbf x)`, ``(*batch, N, d)``, with a shape check.

        Args:
            x: Inputs.  # shape: (*batch, N, D)

        Returns:
            The extractor's output.

        Raises:
            ShapeError: If the extractor does not return ``(*batch, N, d)``.
        """
        f = self.feature_extractor(x)
        if not isinstance(f, torch.Tensor) or f.dim() < 2 or f.shape[:-1] != x.shape[:-1]:
            got = tuple(f.shape) if isinstance(f, torch.Tensor) else type(f).__name__
            raise ShapeError(
                expected_got(
                    "FeatureMapKernel.feature_extractor(x)",
                    f"a tensor of shape {tuple(x.shape[:-1])} + (d,) for inputs {tuple(x.shape)}",
                    got, "The extractor must map each row of x to one feature vector.",
                )
            )  # fmt: skip
        return f

    def forward(
        self,
        x1: torch.Tensor,
        x2: torch.Tensor,
        diag: bool = False,
        last_dim_is_batch: bool = False,
        **params,
    ):
        f1 = self.features(x1)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        f2 = f1 if same else self.features(x2)
        return self.base_kernel.forward(
            f1, f2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params
        )

    def __call__(self, x1, x2=None, diag=False, last_dim_is_batch=False, **params):
        """Evaluate the kernel (eagerly when ``last_dim_is_batch``; see the class docstring)."""
        if last_dim_is_batch and not diag:
            with gpytorch.settings.lazily_evaluate_kernels(False):
                return super().__call__(x1, x2, diag=diag, last_dim_is_batch=True, **params)
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)

    def __getitem__(self, index) -> FeatureMapKernel:
        """Index the base kernel's batch (the copy's network is a copy of this one's)."""
        if len(self.batch_shape) == 0:
            return self
        new_kernel = copy.deepcopy(self)
        new_kernel._batch_shape = torch.Size([])  # the batch lives in the base kernel
        new_kernel.base_kernel = self.base_kernel.__getitem__(index)
        return new_kernel

    def expand_batch(self, *sizes) -> FeatureMapKernel:
        """Expand the base kernel's batch shape (GPyTorch's version would also re-attach the
        base kernel's own sub-kernels under dotted names)."""
        new_kernel = copy.deepcopy(self)
        new_kernel.base_kernel = self.base_kernel.expand_batch(*sizes)
        return new_kernel

    def num_outputs_per_input(self, x1: torch.Tensor, x2: torch.Tensor) -> int:
        """Those of the base kernel (1 unless it is a multitask kernel)."""
        return self.base_kernel.num_outputs_per_input(x1, x2)

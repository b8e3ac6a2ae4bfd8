"""A base kernel applied to the output of a neural feature extractor (a "deep kernel")."""

from __future__ import annotations

import copy
import itertools

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import nn

from gpext.errors import InputDataError, InputTypeError, ShapeError, expected_got
from gpext.utils import check_positive_int
from gpext.utils.validation import as_kernel_inputs

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
            x: Inputs (numpy arrays and integer tensors are converted to the network's dtype).
                # shape: (*batch, N, D)

        Returns:
            The extractor's output.

        Raises:
            InputTypeError: If ``x`` is float16 / bfloat16 or has another floating dtype (or
                device) than the network's parameters.
            InputDataError: If ``x`` has NaN or infinite entries.
            ShapeError: If ``D`` differs from the network's ``in_features``, or the extractor
                does not return ``(*batch, N, d)``.
        """
        x, _ = self._check_inputs(x, None, finite=True)
        return self._features(x)

    def _features(self, x: torch.Tensor) -> torch.Tensor:
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
        """Evaluate the base kernel on the features (arguments as in ``Kernel.forward``).

        Raises:
            InputTypeError: For float16 / bfloat16 inputs, ``x1`` and ``x2`` of two dtypes, or
                a dtype other than the network's.
            ShapeError: If ``x1`` and ``x2`` differ in ``D``, or ``D`` differs from the
                network's ``in_features``.
            InputDataError: For NaN or infinite inputs.
        """
        x1, x2 = self._check_inputs(x1, x2, finite=True)
        f1 = self._features(x1)
        same = x1 is x2 or (x1.shape == x2.shape and torch.equal(x1, x2))
        f2 = f1 if same else self._features(x2)
        return self.base_kernel.forward(
            f1, f2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params
        )

    def __call__(self, x1, x2=None, diag=False, last_dim_is_batch=False, **params):
        """Evaluate the kernel (eagerly when ``last_dim_is_batch``; see the class docstring).

        Numpy arrays and integer tensors are converted to the network's dtype.
        """
        x1, x2 = self._check_inputs(x1, x2, before_active_dims=True)
        if last_dim_is_batch and not diag:
            with gpytorch.settings.lazily_evaluate_kernels(False):
                return super().__call__(x1, x2, diag=diag, last_dim_is_batch=True, **params)
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)

    def _check_inputs(self, x1, x2, *, finite: bool = False, before_active_dims: bool = False):
        """Inputs in the network's dtype and of its input width (when it declares one)."""
        net = self.feature_extractor
        ref = next(
            (t for t in itertools.chain(net.parameters(), net.buffers()) if t.is_floating_point()),
            None,
        )
        match = ref is not None  # a network without floating state follows the inputs' dtype
        if ref is None:
            ref = next((p for p in self.base_kernel.parameters() if p.is_floating_point()), None)
        dtype = torch.get_default_dtype() if ref is None else ref.dtype
        device = None if ref is None else ref.device
        raw = before_active_dims and self.active_dims is not None
        return as_kernel_inputs(
            x1, x2, "FeatureMapKernel", dtype=dtype, device=device, match_dtype=match,
            num_features=None if raw else _in_features(net), same_width=not raw, finite=finite,
        )  # fmt: skip

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


def _in_features(net: nn.Module) -> int | None:
    """The input width a network declares (``in_features`` of it or of a Sequential's head)."""
    for module in (net, net[0] if isinstance(net, nn.Sequential) and len(net) else None):
        width = getattr(module, "in_features", None)
        if isinstance(width, int) and not isinstance(width, bool) and width > 0:
            return width
    return None

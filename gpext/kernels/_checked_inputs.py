"""The input contract shared by gpext's kernels (numpy, integers, dtypes, widths, NaN)."""

from __future__ import annotations

import torch

from gpext.utils.validation import as_kernel_inputs


class CheckedInputsMixin:
    """Put before :class:`gpytorch.kernels.Kernel`: checks and converts ``x1``, ``x2``.

    ``__call__`` converts numpy arrays and integer tensors and checks that ``x1`` and ``x2``
    have the same width (before GPyTorch's own code can fail on them); ``forward`` calls
    :meth:`_check_inputs` with ``finite=True``.  A kernel defines :meth:`_input_reference`
    (the tensor whose dtype and device inputs take) and :attr:`_match_dtype` (``True``:
    float inputs of another dtype are an error rather than followed).
    """

    _match_dtype: bool = False

    def _input_reference(self) -> torch.Tensor:
        raise NotImplementedError

    def __call__(self, x1, x2=None, diag=False, last_dim_is_batch=False, **params):
        """Evaluate the kernel; numpy arrays and integer tensors become the kernel's dtype."""
        x1, x2 = self._check_inputs(x1, x2, width=self.active_dims is None)
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)

    def _check_inputs(self, x1, x2, *, finite: bool = False, width: bool = True):
        """``(x1, x2)`` in the reference's dtype class and on its device (checked)."""
        ref = self._input_reference()
        return as_kernel_inputs(
            x1, x2, type(self).__name__, dtype=ref.dtype, device=ref.device,
            match_dtype=self._match_dtype, same_width=width, finite=finite,
        )  # fmt: skip

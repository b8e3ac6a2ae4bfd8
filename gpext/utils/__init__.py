"""Small shared helpers: progress bars, input validation and guarded linear algebra."""

from gpext.utils.linalg import safe_cholesky
from gpext.utils.progress import progress_bar, progress_enabled
from gpext.utils.validation import (
    as_float_tensor,
    as_model_input,
    check_finite,
    check_float_dtype,
    check_labels,
    check_layer_widths,
    check_learning_rate,
    check_positive_int,
    check_shape,
)

__all__ = [
    "as_float_tensor",
    "as_model_input",
    "check_finite",
    "check_float_dtype",
    "check_labels",
    "check_learning_rate",
    "check_layer_widths",
    "check_positive_int",
    "check_shape",
    "progress_bar",
    "progress_enabled",
    "safe_cholesky",
]

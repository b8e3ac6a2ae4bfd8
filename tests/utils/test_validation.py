import numpy as np
import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.utils import (
    as_float_tensor,
    check_finite,
    check_float_dtype,
    check_labels,
    check_positive_int,
    check_shape,
    progress_bar,
    progress_enabled,
)


def test_as_float_tensor_converts_and_keeps_dtype():
    assert as_float_tensor([1, 2], "x").dtype == torch.get_default_dtype()
    x64 = torch.zeros(2, dtype=torch.float64)
    assert as_float_tensor(x64, "x").dtype == torch.float64
    assert as_float_tensor(np.ones(3, dtype=np.float32), "x").dtype == torch.float32
    assert as_float_tensor(x64, "x", torch.float32).dtype == torch.float32
    with pytest.raises(InputTypeError, match="x: expected"):
        as_float_tensor(torch.zeros(2, dtype=torch.bool), "x")
    with pytest.raises(InputTypeError):
        as_float_tensor(object(), "x")


def test_check_finite_counts_bad_entries():
    with pytest.raises(InputDataError, match="1 NaN and 2 infinite"):
        check_finite(torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0]), "v")
    check_finite(torch.ones(3), "v")


def test_check_shape():
    check_shape(torch.zeros(4, 5, 3), "x", (None, 3))
    with pytest.raises(ShapeError, match=r"shape \(\.\.\., \*, 2\), got shape \(4, 3\)"):
        check_shape(torch.zeros(4, 3), "x", (None, 2))
    with pytest.raises(ShapeError):
        check_shape(torch.zeros(2, 4, 3), "x", (None, 3), allow_batch=False)


def test_check_labels():
    out = check_labels(torch.tensor([[0.0, 2.0]]), 3)
    assert out.dtype == torch.long and out.tolist() == [[0, 2]]
    with pytest.raises(InputDataError, match=r"labels in \[0, 3\)"):
        check_labels(torch.tensor([0, 3]), 3)
    with pytest.raises(InputDataError, match="labels >= 0"):
        check_labels([-1, 0], 3)
    with pytest.raises(InputTypeError, match="non-integer"):
        check_labels(torch.tensor([0.5]), 3)
    with pytest.raises(InputTypeError):
        check_labels(torch.tensor([1j]), 3)


def test_check_positive_int_and_dtype():
    assert check_positive_int(np.int64(3), "k") == 3
    with pytest.raises(InputDataError):
        check_positive_int(0, "k")
    with pytest.raises(InputTypeError):
        check_positive_int(2.0, "k")
    with pytest.raises(InputTypeError):
        check_positive_int(True, "k")
    with pytest.raises(InputDataError, match="float32 or torch.float64"):
        check_float_dtype(torch.float16)


def test_progress_respects_env(monkeypatch):
    monkeypatch.setenv("GPEXT_PROGRESS", "0")
    assert not progress_enabled()
    monkeypatch.setenv("GPEXT_PROGRESS", "1")
    assert progress_enabled()
    assert progress_enabled(False) is False
    assert list(progress_bar(range(3), show=False)) == [0, 1, 2]

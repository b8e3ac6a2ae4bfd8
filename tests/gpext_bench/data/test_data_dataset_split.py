"""Tests of the DatasetSplit container and of the package's exported names."""

from __future__ import annotations

import pytest
import torch

import gpext_bench.data
from gpext.errors import InputDataError, ShapeError
from gpext_bench.data import DatasetSplit, Standardizer


def _split(**changes: object) -> DatasetSplit:
    y_scaler = Standardizer(torch.tensor(10.0), torch.tensor(2.0))
    fields = dict(
        name="toy",
        task="regression",
        split_index=0,
        num_splits=1,
        train_x=torch.zeros(5, 3),
        train_y=torch.zeros(5),
        test_x=torch.zeros(2, 3),
        test_y=torch.tensor([1.0, -0.5]),
        x_scaler=Standardizer.identity(3, torch.float32),
        y_scaler=y_scaler,
    )
    fields.update(changes)
    return DatasetSplit(**fields)


def test_properties_and_original_units() -> None:
    split = _split()
    assert (split.num_train, split.num_test, split.num_features) == (5, 2, 3)
    assert torch.allclose(split.test_y_original, torch.tensor([12.0, 9.0]))
    text = repr(split)
    assert text.startswith("DatasetSplit(name='toy'") and "train=5" in text and "test=2" in text
    assert len(text) < 250 and "\n" not in text


def test_classification_original_targets_are_labels() -> None:
    labels = torch.tensor([1, 0])
    split = _split(
        task="classification", y_scaler=None, num_classes=2, test_y=labels, train_y=torch.zeros(5)
    )
    assert split.test_y_original is split.test_y
    assert "classes=2" in repr(split)


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"task": "ranking"}, InputDataError),
        ({"train_y": torch.zeros(4)}, ShapeError),
        ({"test_x": torch.zeros(2, 4)}, ShapeError),
        ({"train_x": torch.zeros(5)}, ShapeError),
        ({"y_scaler": None}, InputDataError),
        ({"task": "classification", "y_scaler": None}, InputDataError),
    ],
)
def test_invalid_splits_rejected(changes: dict, error: type[Exception]) -> None:
    with pytest.raises(error):
        _split(**changes)


def test_public_names_exported_and_documented() -> None:
    expected = {
        "load_dataset",
        "list_datasets",
        "dataset_info",
        "resolve_data_dir",
        "DatasetSplit",
        "Standardizer",
        "DATA_DIR_ENV",
    }
    assert set(gpext_bench.data.__all__) == expected
    assert gpext_bench.data.DATA_DIR_ENV == "GPEXT_DATA_DIR"
    for name in expected - {"DATA_DIR_ENV"}:
        obj = getattr(gpext_bench.data, name)
        assert obj.__doc__ and len(obj.__doc__.strip()) > 20, name

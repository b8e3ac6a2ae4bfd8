"""Bundled scikit-learn sets: usable without any data directory."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn import datasets

from gpext_bench.data import dataset_info, list_datasets, load_dataset

SETS = {"diabetes": None, "breast_cancer": 2, "digits": 10, "wine": 3, "iris": 3}


@pytest.mark.usefixtures("no_data_env")
def test_listed_without_data_dir() -> None:
    assert list_datasets() == dict.fromkeys(sorted(SETS), "sklearn")


@pytest.mark.usefixtures("no_data_env")
@pytest.mark.parametrize("name", sorted(SETS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_loads_and_matches_sklearn(name: str, dtype: torch.dtype) -> None:
    bunch = getattr(datasets, f"load_{name}")()
    rows = len(bunch.target)
    split = load_dataset(name, 1, dtype=dtype)
    assert split.format == "sklearn" and split.num_classes == SETS[name]
    assert split.train_x.dtype == dtype and split.num_features == bunch.data.shape[1]
    train, test = split.train_indices.numpy(), split.test_indices.numpy()
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(rows))
    rtol = 1e-5 if dtype == torch.float32 else 1e-10
    x_back = split.x_scaler.inverse_transform(split.test_x.double()).numpy()
    np.testing.assert_allclose(x_back, bunch.data[test], rtol=rtol, atol=rtol)
    if name == "diabetes":
        assert (split.num_train, split.num_test, split.task) == (397, 45, "regression")
        np.testing.assert_allclose(
            split.test_y_original.double().numpy(), bunch.target[test], rtol=rtol
        )
    else:
        assert split.task == "classification" and split.train_y.dtype == torch.long
        assert split.num_test == int(np.ceil(0.2 * rows))
        assert np.array_equal(split.test_y.numpy(), bunch.target[test])
        assert split.class_names == [str(c) for c in bunch.target_names]
        assert set(split.test_y.tolist()) == set(range(SETS[name]))  # stratified


@pytest.mark.usefixtures("no_data_env")
def test_info_and_digits_image_shape() -> None:
    info = dataset_info("digits")
    assert info == {
        "name": "digits",
        "task": "classification",
        "format": "sklearn",
        "num_splits": 10,
        "num_rows": 1797,
        "num_features": 64,
        "num_classes": 10,
        "path": None,
    }
    assert load_dataset("digits").image_shape == (1, 8, 8)
    assert dataset_info("diabetes")["num_classes"] is None


@pytest.mark.usefixtures("no_data_env")
def test_diabetes_custom_test_size_and_seed() -> None:
    a = load_dataset("diabetes", 0, test_size=100, seed=3)
    b = load_dataset("diabetes", 0, test_size=100, seed=4)
    assert a.num_test == 100 and not torch.equal(a.test_indices, b.test_indices)

"""uci_splits format: checks against the shared benchmark data, read independently with numpy."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from gpext_bench.data import dataset_info, list_datasets, load_dataset


def _raw(folder: Path) -> tuple[np.ndarray, np.ndarray, int]:
    data = np.loadtxt(folder / "data.txt")
    features = np.loadtxt(folder / "index_features.txt", dtype=int, ndmin=1)
    target = int(np.loadtxt(folder / "index_target.txt"))
    return data, features, target


def test_boston_split0_sizes(shared_data_dir: Path, dataset_dir: Callable) -> None:
    dataset_dir("boston")
    split = load_dataset("boston", 0, data_dir=shared_data_dir)
    assert (split.num_train, split.num_test, split.num_features) == (455, 51, 13)
    assert (split.task, split.format, split.num_splits) == ("regression", "uci_splits", 20)
    assert split.train_y.shape == (455,) and split.train_y.dtype == torch.float64


@pytest.mark.parametrize(
    ("name", "rows", "num_splits"),
    [("boston", 506, 20), ("concrete", 1030, 20), ("energy", 768, 20), ("yacht", 308, 20),
     ("protein", 45730, 5)],
)  # fmt: skip
def test_every_split_partitions_rows_and_matches_files(
    name: str, rows: int, num_splits: int, shared_data_dir: Path, dataset_dir: Callable
) -> None:
    folder = dataset_dir(name)
    data, features, target = _raw(folder)
    assert data.shape[0] == rows
    info = dataset_info(name, data_dir=shared_data_dir)
    assert (info["num_splits"], info["num_rows"], info["num_features"]) == (
        num_splits,
        rows,
        len(features),
    )
    for i in range(num_splits):
        split = load_dataset(name, i, data_dir=shared_data_dir)
        train, test = split.train_indices.numpy(), split.test_indices.numpy()
        assert np.intersect1d(train, test).size == 0
        assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(rows))
        assert np.array_equal(train, np.loadtxt(folder / f"index_train_{i}.txt", dtype=int))
        assert np.array_equal(test, np.loadtxt(folder / f"index_test_{i}.txt", dtype=int))
        if i in (0, num_splits - 1):
            x_back = split.x_scaler.inverse_transform(split.test_x).numpy()
            np.testing.assert_allclose(x_back, data[test][:, features], rtol=1e-10, atol=1e-9)
            np.testing.assert_allclose(
                split.test_y_original.numpy(), data[test, target], rtol=1e-12, atol=1e-10
            )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_standardisation_statistics(
    dtype: torch.dtype, shared_data_dir: Path, dataset_dir: Callable
) -> None:
    folder = dataset_dir("concrete")
    data, features, target = _raw(folder)
    split = load_dataset("concrete", 3, data_dir=shared_data_dir, dtype=dtype)
    for t in (split.train_x, split.test_x, split.train_y, split.test_y):
        assert t.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    x = split.train_x.double()
    np.testing.assert_allclose(x.mean(0).numpy(), 0.0, atol=tol)
    np.testing.assert_allclose(x.std(0, correction=0).numpy(), 1.0, atol=tol)
    assert float(split.train_y.double().mean()) == pytest.approx(0.0, abs=tol)
    assert float(split.train_y.double().std(correction=0)) == pytest.approx(1.0, abs=tol)
    train = np.loadtxt(folder / "index_train_3.txt", dtype=int)
    np.testing.assert_allclose(
        split.x_scaler.mean.double().numpy(), data[train][:, features].mean(0), rtol=1e-6
    )
    np.testing.assert_allclose(float(split.y_scaler.std), data[train, target].std(), rtol=1e-6)
    back = split.y_scaler.inverse_transform(split.train_y).double().numpy()
    np.testing.assert_allclose(
        back, data[train, target], rtol=1e-6 if dtype == torch.float32 else 1e-12, atol=1e-9
    )


def test_unstandardised_values_are_raw(shared_data_dir: Path, dataset_dir: Callable) -> None:
    data, features, target = _raw(dataset_dir("yacht"))
    split = load_dataset("yacht", 5, data_dir=shared_data_dir, standardize=False)
    train = split.train_indices.numpy()
    np.testing.assert_array_equal(split.train_x.numpy(), data[train][:, features])
    np.testing.assert_array_equal(split.train_y.numpy(), data[train, target])
    assert split.x_scaler.is_identity and split.y_scaler.is_identity


def test_naval_constant_column_is_only_centred(
    shared_data_dir: Path, dataset_dir: Callable
) -> None:
    data, features, target = _raw(dataset_dir("naval"))
    assert target == 16 and data[:, 8].std() == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        split = load_dataset("naval", 0, data_dir=shared_data_dir)
    assert split.num_features == 16
    assert float(split.x_scaler.std[8]) == 1.0
    assert torch.equal(split.train_x[:, 8], torch.zeros(split.num_train, dtype=torch.float64))
    np.testing.assert_allclose(
        split.test_y_original.numpy(), data[split.test_indices.numpy(), 16], rtol=1e-12, atol=1e-10
    )


def test_renamed_copy_loads_by_path_and_by_data_dir(
    copy_dataset: Callable, shared_data_dir: Path
) -> None:
    folder = copy_dataset("boston", "mydata")
    reference = load_dataset("boston", 2, data_dir=shared_data_dir)
    for split in (
        load_dataset(str(folder), 2),
        load_dataset(folder, 2),
        load_dataset("mydata", 2, data_dir=folder.parent),
    ):
        assert split.name == "mydata" and split.format == "uci_splits" and split.num_splits == 20
        assert torch.equal(split.train_x, reference.train_x)
        assert torch.equal(split.test_y, reference.test_y)
    assert list_datasets(folder.parent)["mydata"] == "uci_splits"
    assert dataset_info(str(folder))["num_rows"] == 506


def test_repeated_loads_use_the_parse_cache(shared_data_dir: Path, dataset_dir: Callable) -> None:
    from gpext_bench.data.parsers import _read_matrix

    dataset_dir("energy")
    load_dataset("energy", 0, data_dir=shared_data_dir)
    before = _read_matrix.cache_info()
    load_dataset("energy", 1, data_dir=shared_data_dir)
    after = _read_matrix.cache_info()
    assert after.misses == before.misses and after.hits > before.hits

"""dkl_folds format: checks against the shared benchmark data, read independently with numpy."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpext_bench.data import dataset_info, load_dataset


@pytest.mark.parametrize(("name", "rows", "inputs"), [("skillcraft", 3338, 19), ("pol", 15000, 26)])
def test_ten_folds_partition_rows_and_match_files(
    name: str, rows: int, inputs: int, shared_data_dir: Path, dataset_dir: Callable
) -> None:
    folder = dataset_dir(name)
    data = np.loadtxt(folder / "data.csv.gz", delimiter=",")
    mask = np.loadtxt(folder / "test_mask.csv.gz", delimiter=",")
    assert data.shape == (rows, inputs + 1)
    info = dataset_info(name, data_dir=shared_data_dir)
    assert info["format"] == "dkl_folds" and info["num_splits"] == 10
    tested = np.zeros(rows, dtype=int)
    for j in range(10):
        split = load_dataset(name, j, data_dir=shared_data_dir)
        assert (split.num_splits, split.num_features, split.task) == (10, inputs, "regression")
        train, test = split.train_indices.numpy(), split.test_indices.numpy()
        assert np.intersect1d(train, test).size == 0
        assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(rows))
        assert np.array_equal(test, np.flatnonzero(mask[:, j] == 1))
        tested[test] += 1
        np.testing.assert_allclose(
            split.test_y_original.numpy(), data[test, -1], rtol=1e-12, atol=1e-10
        )
        x_back = split.x_scaler.inverse_transform(split.train_x).numpy()
        np.testing.assert_allclose(x_back, data[train, :-1], rtol=1e-9, atol=1e-12)
        assert float(split.train_y.mean()) == pytest.approx(0.0, abs=1e-10)
        assert float(split.train_y.std(correction=0)) == pytest.approx(1.0, abs=1e-10)
    assert np.array_equal(tested, np.ones(rows, dtype=int))  # 10-fold: each row tested once

"""classification_table format: shared UCI tables and small synthetic tables."""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from gpext.errors import InputDataError
from gpext_bench.data import dataset_info, load_dataset


def _read_raw(path: Path, label_col: int, header: bool) -> tuple[np.ndarray, list[str]]:
    with open(path, newline="") as handle:  # csv handles bare CR itself with newline=""
        rows = [r for r in csv.reader(handle) if r]
    rows = rows[1:] if header else rows
    labels = [r[label_col] for r in rows]
    x = np.array([[float(v) for j, v in enumerate(r) if j != label_col] for r in rows])
    return x, labels


@pytest.mark.parametrize(
    ("name", "file", "rows", "inputs", "classes", "label_col", "header"),
    [
        ("magic", "magic04.data", 19020, 10, ["g", "h"], -1, False),
        ("htru2", "HTRU_2.csv", 17898, 8, ["0", "1"], -1, True),
        ("letter", "letter-recognition.data", 20000, 16, [chr(65 + i) for i in range(26)], 0, True),
    ],
)
def test_uci_tables(
    name: str,
    file: str,
    rows: int,
    inputs: int,
    classes: list[str],
    label_col: int,
    header: bool,
    shared_data_dir: Path,
    dataset_dir: Callable,
) -> None:
    x_raw, labels = _read_raw(dataset_dir(name) / file, label_col % (inputs + 1), header)
    assert x_raw.shape == (rows, inputs)
    info = dataset_info(name, data_dir=shared_data_dir)
    assert (info["task"], info["format"], info["num_rows"]) == (
        "classification",
        "classification_table",
        rows,
    )
    assert (info["num_features"], info["num_classes"]) == (inputs, len(classes))
    split = load_dataset(name, 0, data_dir=shared_data_dir)
    assert split.class_names == classes and split.num_classes == len(classes)
    assert split.num_test == int(np.ceil(0.2 * rows)) and split.num_train + split.num_test == rows
    assert split.train_y.dtype == torch.long and split.y_scaler is None
    codes = np.array([classes.index(v) for v in labels])
    train, test = split.train_indices.numpy(), split.test_indices.numpy()
    assert np.array_equal(np.sort(np.concatenate([train, test])), np.arange(rows))
    assert np.array_equal(split.test_y.numpy(), codes[test])
    assert np.array_equal(split.train_y.numpy(), codes[train])
    np.testing.assert_allclose(
        split.x_scaler.inverse_transform(split.test_x).numpy(), x_raw[test], rtol=1e-9, atol=1e-9
    )
    np.testing.assert_allclose(split.train_x.mean(0).numpy(), 0.0, atol=1e-9)
    # Stratified: class frequencies of the test part follow the whole table.
    full = np.bincount(codes, minlength=len(classes)) / rows
    part = np.bincount(split.test_y.numpy(), minlength=len(classes)) / split.num_test
    np.testing.assert_allclose(part, full, atol=2.0 / split.num_test)


def test_random_splits_are_seeded(shared_data_dir: Path, dataset_dir: Callable) -> None:
    dataset_dir("magic")
    a = load_dataset("magic", 1, data_dir=shared_data_dir, seed=0)
    b = load_dataset("magic", 1, data_dir=shared_data_dir, seed=0)
    c = load_dataset("magic", 2, data_dir=shared_data_dir, seed=0)
    d = load_dataset("magic", 0, data_dir=shared_data_dir, seed=1)  # same seed + split
    assert torch.equal(a.test_indices, b.test_indices)
    assert not torch.equal(a.test_indices, c.test_indices)
    assert torch.equal(a.test_indices, d.test_indices)
    assert torch.equal(a.train_x, d.train_x)


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(exist_ok=True)
    (folder / name).write_bytes(text.encode())
    return folder


def test_header_label_column_and_sorted_label_codes(tmp_path: Path) -> None:
    rows = [f"{i}.5,{i % 4 * 3}," + ["10", "2", "33"][i % 3] for i in range(30)]
    folder = _write(tmp_path / "num", "t.csv", '"a","b","label"\r' + "\r".join(rows) + "\r")
    split = load_dataset(str(folder), test_size=6)
    # Numeric labels are ordered by value, not as strings.
    assert split.class_names == ["2", "10", "33"]
    assert (split.num_train, split.num_test, split.num_features) == (24, 6, 2)
    expected = np.array([[1, 0, 2][i % 3] for i in range(30)])
    assert np.array_equal(split.test_y.numpy(), expected[split.test_indices.numpy()])


def test_text_label_in_first_column_and_blank_lines(tmp_path: Path) -> None:
    rows = [f"{'yx'[i % 2]},{i},{i * i}" for i in range(20)]
    folder = _write(
        tmp_path / "txt", "t.data", "\n".join(rows[:10]) + "\n\n" + "\n".join(rows[10:])
    )
    info = dataset_info(str(folder))
    assert (info["num_rows"], info["num_features"], info["num_classes"]) == (20, 2, 2)
    split = load_dataset(str(folder), test_size=0.25, standardize=False)
    assert split.class_names == ["x", "y"]
    x = split.train_x.numpy()
    assert np.array_equal(x[:, 1], x[:, 0] ** 2)
    assert np.array_equal(split.train_y.numpy(), (x[:, 0] % 2 == 0).astype(int))


def test_readme_is_ignored_and_header_detected_by_label(tmp_path: Path) -> None:
    rows = ["kind,f1,f2"] + [f"{'ab'[i % 2]},{i},{-i}" for i in range(12)]
    folder = _write(tmp_path / "doc", "t.txt", "\n".join(rows))
    (folder / "Readme.txt").write_text("not data")
    assert dataset_info(str(folder))["num_rows"] == 12


@pytest.mark.parametrize("test_size", [0, 1.0, 0.0, -3, 30, 100, "0.2", True, 1])
def test_bad_test_size(test_size: object, tmp_path: Path) -> None:
    rows = [f"{i},{i % 3}" for i in range(30)]
    folder = _write(tmp_path / "ts", "t.csv", "\n".join(rows))
    with pytest.raises(InputDataError, match="test_size"):
        load_dataset(str(folder), test_size=test_size)

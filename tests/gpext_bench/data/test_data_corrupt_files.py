"""Corrupt or inconsistent files raise DataFormatError naming the file (tiny files in tmp_path)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gpext.errors import DataFormatError
from gpext_bench.data import dataset_info, load_dataset


def test_tiny_uci_folder_loads(write_uci: Callable) -> None:
    folder = write_uci(n_splits="2\n")
    split = load_dataset(str(folder), 0, standardize=False)
    data = np.arange(30, dtype=float).reshape(10, 3) ** 1.5
    np.testing.assert_allclose(split.train_x.numpy(), data[:8, :2], rtol=1e-6)
    np.testing.assert_allclose(split.test_y.numpy(), data[8:, 2], rtol=1e-6)


def test_nan_in_data_reports_count_and_place(write_uci: Callable) -> None:
    lines = ["1 2 3"] * 10
    lines[3], lines[6] = "1 nan 3", "NaN 2 nan"
    folder = write_uci(data="\n".join(lines))
    with pytest.raises(DataFormatError) as info:
        load_dataset(str(folder))
    message = str(info.value)
    assert "data.txt" in message and "3 NaN/infinite value(s) in 2 row(s)" in message
    assert "line 4 column 1" in message and "line 7 column 0" in message


def test_unparseable_number(write_uci: Callable) -> None:
    lines = ["1 2 3"] * 10
    lines[5] = "1 2 abc"
    with pytest.raises(DataFormatError, match="data.txt.*cannot parse"):
        load_dataset(str(write_uci(data="\n".join(lines))))


def test_ragged_rows(write_uci: Callable) -> None:
    lines = ["1 2 3"] * 10
    lines[2] = "1 2"
    with pytest.raises(DataFormatError, match="data.txt"):
        load_dataset(str(write_uci(data="\n".join(lines))))


def test_index_out_of_range(write_uci: Callable) -> None:
    folder = write_uci(splits=[(list(range(8)), [8, 10])])
    with pytest.raises(DataFormatError, match=r"index_test_0.txt: row index 10 out of range"):
        load_dataset(str(folder))


def test_train_test_overlap(write_uci: Callable) -> None:
    folder = write_uci(splits=[(list(range(9)), [8, 9])])
    with pytest.raises(DataFormatError, match=r"index_test_0.txt: 1 row\(s\) also in index_train"):
        load_dataset(str(folder))


def test_non_integer_and_duplicate_indices(write_uci: Callable, tmp_path: Path) -> None:
    folder = write_uci()
    (folder / "index_train_1.txt").write_text("2\n3.5\n4\n")
    with pytest.raises(DataFormatError, match="index_train_1.txt.*non-negative integer"):
        load_dataset(str(folder), 1)
    assert load_dataset(str(folder), 0).num_train == 8  # other splits still load
    (folder / "index_train_1.txt").write_text("2\n3\n3\n")
    with pytest.raises(DataFormatError, match="index_train_1.txt: repeated"):
        load_dataset(str(folder), 1)


def test_missing_split_file_and_count_mismatch(write_uci: Callable) -> None:
    folder = write_uci(name="a")
    (folder / "index_test_1.txt").unlink()
    with pytest.raises(DataFormatError, match="missing index_test_1.txt"):
        load_dataset(str(folder))
    folder = write_uci(name="b", n_splits="3\n")
    with pytest.raises(DataFormatError, match=r"n_splits.txt: states \[3\] splits.*for 2"):
        dataset_info(str(folder))


def test_bad_column_indices(write_uci: Callable) -> None:
    with pytest.raises(DataFormatError, match="index_target.txt.*3 columns"):
        load_dataset(str(write_uci(name="a", target="3\n")))
    with pytest.raises(DataFormatError, match="one column index"):
        load_dataset(str(write_uci(name="b", target="1\n2\n")))


def test_changed_file_is_reparsed(write_uci: Callable) -> None:
    folder = write_uci()
    first = load_dataset(str(folder), 0, standardize=False)
    lines = ["1 2 3"] * 10
    (folder / "data.txt").write_text("\n".join(lines) + "\n")
    stat = (folder / "data.txt").stat()
    os.utime(folder / "data.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = load_dataset(str(folder), 0, standardize=False)
    assert float(first.train_y[0]) != 3.0 and float(second.train_y[0]) == 3.0


def test_dkl_tiny_folder_and_mask_errors(write_dkl: Callable) -> None:
    split = load_dataset(str(write_dkl(name="ok")), 2)
    assert (split.num_splits, split.num_train, split.num_test) == (3, 8, 4)
    mask = np.zeros((12, 3), dtype=int)
    mask[np.arange(12), np.arange(12) % 3] = 1
    mask[5, 1] = 2
    with pytest.raises(DataFormatError, match=r"test_mask.csv.gz: expected only 0/1.*first 2"):
        load_dataset(str(write_dkl(name="two", mask=mask)))
    with pytest.raises(DataFormatError, match="test_mask.csv.gz: expected 12 rows"):
        load_dataset(str(write_dkl(name="short", mask=mask[:10].clip(0, 1))))
    empty_fold = np.zeros((12, 2), dtype=int)
    empty_fold[:, 0] = 1
    with pytest.raises(DataFormatError, match="column 1 marks 0 of 12"):
        load_dataset(str(write_dkl(name="emptyfold", mask=empty_fold)), 1)
    folder = write_dkl(name="nomask")
    (folder / "test_mask.csv.gz").unlink()
    with pytest.raises(DataFormatError, match="missing test_mask.csv.gz"):
        load_dataset(str(folder))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("1,2,a\n3,x,b\n5,6,a\n7,8,b\n", r"input column 1.*'x' on line 2"),
        ("1,2,a\n3,4\n5,6,a\n", "line 2 has 2 comma-separated fields"),
        ("1,2,a\n3,nan,a\n5,6,a\n", "1 NaN/infinite value.*line 2 column 1"),
        ("1,2,a\n3,4,a\n5,6,a\n", "at least 2 classes"),
        ("1 2 3\n4 5 6\n", "at least 2 rows and 2 columns"),
    ],
)
def test_corrupt_classification_tables(text: str, match: str, tmp_path: Path) -> None:
    folder = tmp_path / "table"
    folder.mkdir()
    (folder / "t.csv").write_text(text)
    with pytest.raises(DataFormatError, match=match) as info:
        load_dataset(str(folder))
    assert "t.csv" in str(info.value)

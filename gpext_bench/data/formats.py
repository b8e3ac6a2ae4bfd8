"""Detection of a dataset folder's format from its file names, and the folder readers.

Formats, tried in this order:

* ``uci_splits``: ``data.txt`` (whitespace separated, no header), ``index_features.txt``,
  ``index_target.txt`` and ``index_train_{i}.txt`` / ``index_test_{i}.txt`` (0-based
  rows; optional ``n_splits.txt`` is cross-checked).  Regression.
* ``dkl_folds``: ``data.csv.gz`` (comma separated, no header, target last) and
  ``test_mask.csv.gz`` (N x F of 0/1; column ``j`` marks fold ``j``'s test rows).
* ``mnist_idx``: ``<prefix>images-idx3-ubyte[.gz]`` with ``<prefix>labels-idx1-ubyte[.gz]``.
* ``classification_table``: exactly one ``*.data``, ``*.csv`` or ``*.txt`` file besides
  read-me and licence files, comma separated; a classification or (``task="regression"``,
  or a target with non-integer numbers) a regression table.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gpext.errors import DataFormatError
from gpext_bench.data.classification_table import read_table
from gpext_bench.data.mnist_idx import IMAGES_PATTERN, LABELS_PATTERN, read_mnist_idx
from gpext_bench.data.parsers import read_index, read_matrix
from gpext_bench.data.raw_dataset import RawDataset

__all__ = ["FORMAT_FILES", "detect_format", "read_folder", "unrecognized_message"]

#: Files each on-disk format expects, for error messages.
FORMAT_FILES = {
    "uci_splits": "data.txt, index_features.txt, index_target.txt and index_train_{i}.txt / "
    "index_test_{i}.txt for each split i (n_splits.txt optional)",
    "dkl_folds": "data.csv.gz (comma separated, target last) and test_mask.csv.gz (N x F of 0/1)",
    "mnist_idx": "<prefix>images-idx3-ubyte[.gz] and <prefix>labels-idx1-ubyte[.gz]",
    "classification_table": "exactly one comma-separated *.data, *.csv or *.txt file "
    "(optional header; target = the one non-numeric column, else the last, or --target; "
    "read as classification unless the target has non-integer numbers or --task regression)",
}
TABLE_SUFFIXES = (".data", ".csv", ".txt")
_DOC_FILE = re.compile(r"^(readme|licen[cs]e|copying|notice|citation|changelog)", re.IGNORECASE)
_SPLIT_FILE = re.compile(r"^index_(train|test)_(\d+)\.txt$")


def _file_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))


def _table_candidates(names: list[str]) -> list[str]:
    return [n for n in names if n.lower().endswith(TABLE_SUFFIXES) and not _DOC_FILE.match(n)]


def detect_format(folder: Path) -> str | None:
    """Name of the format of ``folder``, or ``None`` if no format matches its files.

    Args:
        folder: An existing directory.

    Returns:
        One of the keys of :data:`FORMAT_FILES`, or ``None``.
    """
    names = _file_names(folder)
    if "data.txt" in names and any(n.startswith("index_") for n in names):
        return "uci_splits"
    if "data.csv.gz" in names or "test_mask.csv.gz" in names:
        return "dkl_folds"
    if any(IMAGES_PATTERN.match(n) or LABELS_PATTERN.match(n) for n in names):
        return "mnist_idx"
    if len(_table_candidates(names)) == 1:
        return "classification_table"
    return None


def unrecognized_message(folder: Path) -> str:
    """Error message for a folder whose format cannot be detected."""
    names = _file_names(folder)
    shown = ", ".join(names[:12]) + (" ..." if len(names) > 12 else "") if names else "no files"
    expected = "; ".join(f"{fmt}: {files}" for fmt, files in FORMAT_FILES.items())
    return (
        f"{folder}: cannot detect the dataset format; the folder holds {shown}. "
        f"Expected the files of one format: {expected}."
    )


def read_folder(
    folder: Path, name: str, task: str | None = None, target: str | None = None
) -> RawDataset:
    """Detect the format of ``folder`` and parse it (file parses are cached).

    Args:
        folder: Dataset folder.
        name: Dataset name to report.
        task: Task of a single-table folder (see :func:`read_table`); other formats fix it.
        target: Target column of a single-table folder (header name or 0-based index).

    Returns:
        The parsed dataset.

    Raises:
        DataFormatError: If the format is not recognised or a file is corrupt.
    """
    fmt = detect_format(folder)
    if fmt == "uci_splits":
        return _read_uci(folder, name)
    if fmt == "dkl_folds":
        return _read_dkl(folder, name)
    if fmt == "mnist_idx":
        return read_mnist_idx(folder, name)
    if fmt == "classification_table":
        path = folder / _table_candidates(_file_names(folder))[0]
        x, y, names, kind = read_table(path, task, target)
        if kind == "regression":
            return RawDataset(name, fmt, kind, x, y, default_test_size=0.1, path=folder)
        return RawDataset(
            name, fmt, "classification", x, y, default_test_size=0.2, stratify=True,
            class_names=names, path=folder,
        )  # fmt: skip
    raise DataFormatError(unrecognized_message(folder))


def _read_uci(folder: Path, name: str) -> RawDataset:
    names = _file_names(folder)
    ids: dict[str, set[int]] = {"train": set(), "test": set()}
    for n in names:
        match = _SPLIT_FILE.match(n)
        if match:
            ids[match[1]].add(int(match[2]))
    num = max(ids["train"] | ids["test"], default=-1) + 1
    missing = [f for f in ("index_features.txt", "index_target.txt") if f not in names]
    missing += [f"index_{part}_{i}.txt" for i in range(num) for part in ids if i not in ids[part]]
    if num == 0 or missing:
        raise DataFormatError(
            f"{folder}: incomplete uci_splits folder, missing "
            f"{', '.join(missing) or 'index_train_0.txt and index_test_0.txt'}. "
            f"Expected {FORMAT_FILES['uci_splits']}."
        )
    if "n_splits.txt" in names:
        stated = read_index(folder / "n_splits.txt")
        if stated.tolist() != [num]:
            raise DataFormatError(
                f"{folder / 'n_splits.txt'}: states {stated.tolist()} splits but the folder "
                f"holds index files for {num}."
            )
    data = read_matrix(folder / "data.txt")
    features = read_index(folder / "index_features.txt")
    target = read_index(folder / "index_target.txt")
    cols = data.shape[1]
    if features.max() >= cols or target.size != 1 or target[0] >= cols:
        raise DataFormatError(
            f"{folder}: index_features.txt must hold column indices and index_target.txt one "
            f"column index, all in [0, {cols - 1}] (data.txt has {cols} columns); got "
            f"{features.tolist()} and {target.tolist()}."
        )
    num_rows = data.shape[0]

    def split(i: int) -> tuple[np.ndarray, np.ndarray]:
        train = read_index(folder / f"index_train_{i}.txt")
        test = read_index(folder / f"index_test_{i}.txt")
        for part, rows in (("train", train), ("test", test)):
            path = folder / f"index_{part}_{i}.txt"
            if rows.max() >= num_rows:
                raise DataFormatError(
                    f"{path}: row index {int(rows.max())} out of range; data.txt has "
                    f"{num_rows} rows (valid 0 .. {num_rows - 1})."
                )
            if np.unique(rows).size != rows.size:
                raise DataFormatError(f"{path}: repeated row indices.")
        overlap = np.intersect1d(train, test)
        if overlap.size:
            raise DataFormatError(
                f"{folder / f'index_test_{i}.txt'}: {overlap.size} row(s) also in "
                f"index_train_{i}.txt (e.g. {overlap[:5].tolist()}); train and test must be "
                "disjoint."
            )
        return train, test

    return RawDataset(
        name, "uci_splits", "regression", data[:, features], data[:, int(target[0])],
        num_splits=num, fixed_split=split, path=folder,
    )  # fmt: skip


def _read_dkl(folder: Path, name: str) -> RawDataset:
    names = _file_names(folder)
    missing = [f for f in ("data.csv.gz", "test_mask.csv.gz") if f not in names]
    if missing:
        raise DataFormatError(
            f"{folder}: incomplete dkl_folds folder, missing {', '.join(missing)}. "
            f"Expected {FORMAT_FILES['dkl_folds']}."
        )
    data = read_matrix(folder / "data.csv.gz", delimiter=",")
    mask_path = folder / "test_mask.csv.gz"
    mask = read_matrix(mask_path, delimiter=",")
    if data.shape[1] < 2:
        raise DataFormatError(f"{folder / 'data.csv.gz'}: expected inputs and a target column.")
    if mask.shape[0] != data.shape[0]:
        raise DataFormatError(
            f"{mask_path}: expected {data.shape[0]} rows like data.csv.gz, got {mask.shape[0]}."
        )
    bad = (mask != 0) & (mask != 1)
    if bad.any():
        rows, cols = np.nonzero(bad)
        raise DataFormatError(
            f"{mask_path}: expected only 0/1 entries, got {int(bad.sum())} other value(s), "
            f"first {mask[rows[0], cols[0]]:g} at line {rows[0] + 1} column {cols[0]}."
        )

    def split(j: int) -> tuple[np.ndarray, np.ndarray]:
        test = np.flatnonzero(mask[:, j] == 1)
        if test.size == 0 or test.size == mask.shape[0]:
            raise DataFormatError(
                f"{mask_path}: column {j} marks {test.size} of {mask.shape[0]} rows as test; "
                "each fold needs both training and test rows."
            )
        return np.flatnonzero(mask[:, j] == 0), test

    return RawDataset(
        name, "dkl_folds", "regression", data[:, :-1], data[:, -1],
        num_splits=mask.shape[1], fixed_split=split, path=folder,
    )  # fmt: skip

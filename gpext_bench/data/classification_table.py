"""Parser of comma-separated classification tables (``*.data``, ``*.csv``, ``*.txt``)."""

from __future__ import annotations

import csv
import functools
import warnings
from pathlib import Path

import numpy as np

from gpext.errors import DataFormatError, DataWarning, InputDataError, expected_got
from gpext_bench.data.parsers import check_finite, file_stamp

__all__ = ["read_classification_table", "read_table"]


def read_classification_table(path: Path) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read a labelled table, detecting the header row and the label column.

    * The file is read with universal newlines (bare ``\\r`` line ends work), quoted fields
      are allowed and blank lines are skipped.
    * Label column: the only column that is not numeric, if exactly one is; else the last.
    * Header: the first row is a header if it has a non-numeric cell in a column that is
      numeric below it, or if its label cell (in a non-numeric label column) never occurs
      again (a class with one sample cannot be split anyway).
    * Labels are mapped to ``0 .. C-1`` in sorted order of the original values (numeric
      order when all labels are numbers).

    Args:
        path: Text file.

    Returns:
        ``(x, y, class_names)``: read-only float64 inputs with shape ``(N, D)``, read-only
        int64 labels with shape ``(N,)`` and the original label of each class index.

    Raises:
        DataFormatError: If the file cannot be decoded, rows differ in length, a feature
            column is not numeric, values are NaN/inf, or there are fewer than two classes.
    """
    x, y, names, _ = _read(*file_stamp(path))
    return x, y, names


def read_table(
    path: Path, task: str | None = None, target: str | None = None
) -> tuple[np.ndarray, np.ndarray, list[str] | None, str]:
    """Read a comma-separated table as a regression or a classification dataset.

    Args:
        path: Text file (see :func:`read_classification_table` for header detection).
        task: ``"regression"``, ``"classification"`` or ``None``: classification, unless
            the target column holds numbers that are not all integers (then regression); an
            all-integer target read as labels this way warns with
            :class:`~gpext.errors.DataWarning`, saying how to override it.
        target: Target column: a header name or a 0-based column index (as text or int);
            default as :func:`read_classification_table` picks the label column.

    Returns:
        ``(x, y, class_names, task)``; ``y`` is float64 for regression (``class_names``
        ``None``) and int64 class indices for classification.

    Raises:
        DataFormatError: As :func:`read_classification_table`; also for a regression target
            that is not numeric.
        InputDataError: If ``task`` is unknown or ``target`` names no column.
    """
    if task not in (None, "regression", "classification"):
        raise InputDataError(
            expected_got("task", "'regression', 'classification' or None", repr(task))
        )
    out = _read(*file_stamp(path), task=task, target=None if target is None else str(target))
    names = out[2]
    if task is None and out[3] == "classification" and all(_is_number(n) for n in names):
        # (after the cached read: said on every read, not only the first)
        warnings.warn(
            f"{path}: the target column holds integers only ({len(names)} distinct values), "
            "so it is read as class labels (classification). Pass --task regression (or "
            "task='regression') to treat it as a number (counts, years, scores).",
            DataWarning,
            stacklevel=2,
        )
    return out


def _read_cells(path: str) -> tuple[np.ndarray, list[int]]:
    rows: list[list[str]] = []
    lines: list[int] = []
    try:
        with open(path, encoding="utf-8-sig", newline=None) as handle:
            reader = csv.reader(handle)
            for row in reader:
                cells = [cell.strip() for cell in row]
                if any(cells):
                    rows.append(cells)
                    lines.append(reader.line_num)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise DataFormatError(f"{path}: cannot read as comma-separated text: {err}") from err
    if len(rows) < 2 or len(rows[-1]) < 2:
        raise DataFormatError(
            f"{path}: expected a comma-separated table with at least 2 rows and 2 columns "
            f"(inputs and a label), got {len(rows)} row(s) of {len(rows[-1]) if rows else 0} "
            "field(s)."
        )
    width = len(rows[-1])
    for row, line in zip(rows, lines):
        if len(row) != width:
            raise DataFormatError(
                f"{path}: line {line} has {len(row)} comma-separated fields, expected {width} "
                "like the last line."
            )
    return np.array(rows, dtype=str), lines


def _as_float(cells: np.ndarray) -> np.ndarray | None:
    try:
        return cells.astype(np.float64)
    except ValueError:
        return None


def _is_number(cell: str) -> bool:
    return _as_float(np.array([cell])) is not None


def _target_column(target: str, first_row: np.ndarray, header: bool, path: str) -> int:
    width = len(first_row)
    if target.lstrip("-").isdigit():
        j = int(target)
        if 0 <= j < width:
            return j
    elif header and target in first_row.tolist():
        return first_row.tolist().index(target)
    names = f"header names {first_row.tolist()} or " if header else ""
    raise InputDataError(
        expected_got(
            f"target column of {path}",
            f"one of the {names}0-based indices 0 .. {width - 1}",
            repr(target),
        )
    )


@functools.lru_cache(maxsize=8)
def _read(
    path: str, mtime_ns: int, size: int, task: str | None = "classification",
    target: str | None = None,
) -> tuple[np.ndarray, np.ndarray, list[str] | None, str]:  # fmt: skip
    cells, lines = _read_cells(path)
    width = cells.shape[1]
    numeric = [_as_float(cells[1:, j]) is not None for j in range(width)]
    text_cols = [j for j in range(width) if not numeric[j]]
    label = text_cols[0] if len(text_cols) == 1 else width - 1
    header = any(numeric[j] and not _is_number(cells[0, j]) for j in range(width)) or (
        not numeric[label] and cells[0, label] not in set(cells[1:, label].tolist())
    )
    if target is not None:
        label = _target_column(target, cells[0], header, path)
    first = cells[0]
    if header:
        cells, lines = cells[1:], lines[1:]
    features = [j for j in range(width) if j != label]
    for j in features:
        if not numeric[j] or _as_float(cells[:, j]) is None:
            bad = next(i for i in range(len(cells)) if not _is_number(cells[i, j]))
            raise DataFormatError(
                f"{path}: expected numbers in input column {j} (0-based; label column is "
                f"{label}), got {str(cells[bad, j])!r} on line {lines[bad]}."
            )
    x = cells[:, features].astype(np.float64)
    check_finite(x, path, line_numbers=lines, column_numbers=features)
    values = _as_float(cells[:, label])
    if task is None:
        fractional = values is not None and not np.all(np.mod(values[np.isfinite(values)], 1) == 0)
        task = "regression" if fractional else "classification"
    if task == "regression":
        if values is None:
            column = f"{first[label]!r} (column {label})" if header else f"column {label}"
            raise DataFormatError(
                f"{path}: expected numbers in the regression target {column}, got text such "
                f"as {str(cells[0, label])!r}. Pass --target <column> to choose another column "
                "or --task classification."
            )
        check_finite(values[:, None], path, line_numbers=lines, column_numbers=[label])
        y, names = values, None
    else:
        y, names = _encode_labels(cells[:, label], path)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y, names, task


def _encode_labels(labels: np.ndarray, path: str) -> tuple[np.ndarray, list[str]]:
    values = _as_float(labels)
    if values is not None:
        if not np.isfinite(values).all():
            raise DataFormatError(f"{path}: the label column holds NaN/infinite values.")
        uniq, codes = np.unique(values, return_inverse=True)
        names = [str(int(v)) if float(v).is_integer() else repr(float(v)) for v in uniq]
    else:
        uniq, codes = np.unique(labels, return_inverse=True)
        names = [str(v) for v in uniq]
    if len(names) < 2:
        raise DataFormatError(
            f"{path}: expected at least 2 classes in the label column, got {names}."
        )
    return codes.astype(np.int64).reshape(-1), names

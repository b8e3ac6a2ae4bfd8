"""Cached parsers for the files of the supported dataset formats.

Every parser takes a :class:`~pathlib.Path`, caches its result per ``(path, mtime, size)``
with :func:`functools.lru_cache` (so loading split after split re-reads nothing), returns
read-only numpy arrays, and raises :class:`~gpext.errors.DataFormatError` naming the file
when the content cannot be used.
"""

from __future__ import annotations

import functools
import gzip
import warnings
import zlib
from pathlib import Path

import numpy as np

from gpext.errors import DataFormatError

__all__ = ["read_matrix", "read_index", "read_idx", "check_finite", "file_stamp", "clear_cache"]

#: IDX element type codes (third magic byte) and their big-endian numpy dtypes.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_READ_ERRORS = (ValueError, OSError, EOFError, zlib.error, UnicodeDecodeError)


def file_stamp(path: Path) -> tuple[str, int, int]:
    """Cache key of a file: ``(resolved path, mtime in ns, size in bytes)``."""
    stat = path.stat()
    return str(path.resolve()), stat.st_mtime_ns, stat.st_size


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def check_finite(
    values: np.ndarray,
    path: str,
    line_numbers: list[int] | None = None,
    column_numbers: list[int] | None = None,
) -> None:
    """Raise if ``values`` (2-D) holds NaN/inf, saying how many and where.

    Args:
        values: Parsed numbers.  # shape: (N, C)
        path: File name for the message.
        line_numbers: 1-based file line of each row; default ``row + 1``.
        column_numbers: 0-based file column of each column; default the column index.

    Raises:
        DataFormatError: If any entry is not finite.
    """
    bad = ~np.isfinite(values)
    if bad.any():
        rows, cols = np.nonzero(bad)
        lines = [int(r) + 1 if line_numbers is None else line_numbers[r] for r in rows[:5]]
        cols = [int(c) if column_numbers is None else column_numbers[c] for c in cols[:5]]
        where = ", ".join(f"line {line} column {c}" for line, c in zip(lines, cols))
        more = " ..." if rows.size > 5 else ""
        raise DataFormatError(
            f"{path}: found {rows.size} NaN/infinite value(s) in {np.unique(rows).size} row(s) "
            f"(at {where}{more}; columns are 0-based). Remove or impute these rows."
        )


def read_matrix(path: Path, delimiter: str | None = None) -> np.ndarray:
    """Read a numeric table without header (``.gz`` is decompressed transparently).

    Args:
        path: Text file.
        delimiter: Column separator, ``None`` for whitespace.

    Returns:
        Read-only float64 array.  # shape: (N, C)

    Raises:
        DataFormatError: If the file is empty, unparseable, ragged or has NaN/inf.
    """
    return _read_matrix(*file_stamp(path), delimiter)


@functools.lru_cache(maxsize=32)
def _read_matrix(path: str, mtime_ns: int, size: int, delimiter: str | None) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data"
            values = np.loadtxt(path, delimiter=delimiter, dtype=np.float64, ndmin=2)
    except _READ_ERRORS as err:
        raise DataFormatError(f"{path}: cannot parse as a numeric table: {err}") from err
    if values.size == 0:
        raise DataFormatError(f"{path}: the file holds no numbers.")
    check_finite(values, path)
    return _frozen(values)


def read_index(path: Path) -> np.ndarray:
    """Read a list of non-negative integers (one or more per line).

    Args:
        path: Text file.

    Returns:
        Read-only int64 array.  # shape: (K,)

    Raises:
        DataFormatError: If the file is empty or holds anything but non-negative integers.
    """
    return _read_index(*file_stamp(path))


@functools.lru_cache(maxsize=256)
def _read_index(path: str, mtime_ns: int, size: int) -> np.ndarray:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            values = np.loadtxt(path, dtype=np.float64, ndmin=1).reshape(-1)
    except _READ_ERRORS as err:
        raise DataFormatError(f"{path}: cannot parse as integer indices: {err}") from err
    if values.size == 0:
        raise DataFormatError(f"{path}: expected at least one integer index, the file is empty.")
    bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0)
    if bad.any():
        raise DataFormatError(
            f"{path}: expected non-negative integer indices, got {values[bad][:5].tolist()} "
            f"({int(bad.sum())} bad entries)."
        )
    return _frozen(values.astype(np.int64))


def read_idx(path: Path) -> np.ndarray:
    """Read an IDX file (the MNIST container), optionally gzipped.

    The header is two zero bytes, a type code (``0x08`` = uint8, ...), the number of
    dimensions, then each dimension as a big-endian uint32; the body must hold exactly
    ``prod(dims)`` elements.

    Args:
        path: ``*.idx?-ubyte`` or ``*.idx?-ubyte.gz`` file.

    Returns:
        Read-only array with the dims of the header.

    Raises:
        DataFormatError: On a bad magic number, a truncated file or a size mismatch.
    """
    return _read_idx(*file_stamp(path))


@functools.lru_cache(maxsize=8)
def _read_idx(path: str, mtime_ns: int, size: int) -> np.ndarray:
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as handle:
                raw = handle.read()
        else:
            raw = Path(path).read_bytes()
    except _READ_ERRORS as err:
        raise DataFormatError(f"{path}: cannot read the (gzipped) IDX file: {err}") from err
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in IDX_DTYPES:
        raise DataFormatError(
            f"{path}: not an IDX file: expected magic bytes 00 00 <type> <ndim> with type in "
            f"{sorted(hex(k) for k in IDX_DTYPES)}, got {raw[:4].hex(' ') or 'an empty file'}."
        )
    ndim, header = raw[3], 4 + 4 * raw[3]
    if ndim == 0 or len(raw) < header:
        raise DataFormatError(f"{path}: IDX header truncated or with {ndim} dimensions.")
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    expected = int(np.prod(dims)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataFormatError(
            f"{path}: IDX size mismatch: the header gives shape {dims} of {dtype} "
            f"({expected} bytes) but the file holds {len(raw) - header} bytes after the "
            "header (truncated or corrupt file)."
        )
    values = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return _frozen(values.astype(dtype.newbyteorder("=")))


def clear_cache() -> None:
    """Forget every cached parse of this module (files are re-read on the next load)."""
    for cached in (_read_matrix, _read_index, _read_idx):
        cached.cache_clear()

"""Fixtures of the gpext_bench.data tests: the shared benchmark data and tiny synthetic folders."""

from __future__ import annotations

import gzip
import os
import shutil
import struct
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

# The ``shared`` folder beside the repository checkout, overridable by GPEXT_DATA_DIR.
DEFAULT_DATA_DIR = Path(__file__).resolve().parents[3].parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """Folder of the benchmark data; tests using it are skipped when it is absent."""
    path = Path(os.environ.get("GPEXT_DATA_DIR") or DEFAULT_DATA_DIR)
    if not path.is_dir():
        pytest.skip(f"benchmark data not found at {path}; set GPEXT_DATA_DIR to run these tests")
    return path


@pytest.fixture
def dataset_dir(shared_data_dir: Path) -> Callable[[str], Path]:
    """Return the folder of one shared dataset, skipping the test when it is missing."""

    def get(name: str) -> Path:
        folder = shared_data_dir / name
        if not folder.is_dir():
            pytest.skip(f"dataset folder {folder} not found")
        return folder

    return get


@pytest.fixture
def no_data_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset GPEXT_DATA_DIR for the test."""
    monkeypatch.delenv("GPEXT_DATA_DIR", raising=False)


@pytest.fixture
def write_uci(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny uci_splits folder: 10 rows, 3 columns (target = column 2), 2 splits."""

    def write(
        name: str = "tiny",
        data: str | None = None,
        splits: list[tuple[list[int], list[int]]] | None = None,
        features: str = "0\n1\n",
        target: str = "2\n",
        n_splits: str | None = None,
    ) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        if data is None:
            rows = np.arange(30, dtype=float).reshape(10, 3) ** 1.5
            data = "\n".join(" ".join(f"{v:.6f}" for v in row) for row in rows) + "\n"
        (folder / "data.txt").write_text(data)
        (folder / "index_features.txt").write_text(features)
        (folder / "index_target.txt").write_text(target)
        if splits is None:
            splits = [(list(range(8)), [8, 9]), (list(range(2, 10)), [0, 1])]
        for i, (train, test) in enumerate(splits):
            (folder / f"index_train_{i}.txt").write_text("\n".join(map(str, train)) + "\n")
            (folder / f"index_test_{i}.txt").write_text("\n".join(map(str, test)) + "\n")
        if n_splits is not None:
            (folder / "n_splits.txt").write_text(n_splits)
        return folder

    return write


@pytest.fixture
def write_dkl(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny dkl_folds folder: 12 rows, 2 inputs + target, 3 folds of 4 rows."""

    def write(name: str = "tinydkl", mask: np.ndarray | None = None) -> Path:
        folder = tmp_path / name
        folder.mkdir()
        rng = np.random.default_rng(0)
        data = rng.normal(size=(12, 3))
        if mask is None:
            mask = np.zeros((12, 3), dtype=int)
            mask[np.arange(12), np.arange(12) % 3] = 1
        with gzip.open(folder / "data.csv.gz", "wt") as handle:
            np.savetxt(handle, data, delimiter=",", fmt="%.17g")
        with gzip.open(folder / "test_mask.csv.gz", "wt") as handle:
            np.savetxt(handle, mask, delimiter=",", fmt="%g")
        return folder

    return write


def idx_bytes(array: np.ndarray) -> bytes:
    """Encode a uint8 array in the IDX format (magic 0x0000080N, big-endian dims)."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


@pytest.fixture
def write_idx(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny mnist_idx folder of ``n`` 4x5 images with labels ``i % 3``."""

    def write(name: str = "tinyidx", n: int = 30, gz: bool = True, labels_n: int | None = None):
        folder = tmp_path / name
        folder.mkdir()
        rng = np.random.default_rng(1)
        images = rng.integers(0, 256, size=(n, 4, 5), dtype=np.uint8)
        labels = (np.arange(n if labels_n is None else labels_n) % 3).astype(np.uint8)
        for stem, array in (("imgs-images-idx3-ubyte", images), ("imgs-labels-idx1-ubyte", labels)):
            if gz:
                with gzip.open(folder / f"{stem}.gz", "wb") as handle:
                    handle.write(idx_bytes(array))
            else:
                (folder / stem).write_bytes(idx_bytes(array))
        return folder

    return write


@pytest.fixture
def copy_dataset(tmp_path: Path, dataset_dir: Callable[[str], Path]) -> Callable[[str, str], Path]:
    """Copy a shared dataset folder into tmp_path under a new name (files made writable)."""

    def copy(name: str, new_name: str) -> Path:
        target = tmp_path / new_name
        shutil.copytree(dataset_dir(name), target)
        for path in [target, *target.iterdir()]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        return target

    return copy

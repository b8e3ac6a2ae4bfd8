"""mnist_idx format: the shared MNIST test images and tiny synthetic IDX folders."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from gpext.errors import DataFormatError
from gpext_bench.data import dataset_info, load_dataset


def _read_idx_gz(path: Path, offset: int) -> np.ndarray:
    with gzip.open(path, "rb") as handle:
        return np.frombuffer(handle.read(), dtype=np.uint8, offset=offset)


def test_mnist_default_split(shared_data_dir: Path, dataset_dir: Callable) -> None:
    folder = dataset_dir("mnist_test_idx")
    images = _read_idx_gz(folder / "t10k-images-idx3-ubyte.gz", 16).reshape(10000, 784)
    labels = _read_idx_gz(folder / "t10k-labels-idx1-ubyte.gz", 8)
    info = dataset_info("mnist_test_idx", data_dir=shared_data_dir)
    assert (info["num_rows"], info["num_features"], info["num_classes"]) == (10000, 784, 10)
    split = load_dataset("mnist_test_idx", data_dir=shared_data_dir, dtype=torch.float32)
    assert (split.num_train, split.num_test) == (8000, 2000)
    assert split.image_shape == (1, 28, 28) and split.format == "mnist_idx"
    assert split.x_scaler.is_identity and split.train_x.dtype == torch.float32
    assert float(split.train_x.min()) == 0.0 and float(split.train_x.max()) == 1.0
    test = split.test_indices.numpy()
    np.testing.assert_allclose(split.test_x.numpy(), images[test] / 255.0, rtol=1e-6)
    assert np.array_equal(split.test_y.numpy(), labels[test])
    assert split.class_names == [str(d) for d in range(10)]
    counts = np.bincount(split.test_y.numpy(), minlength=10) / 2000
    np.testing.assert_allclose(counts, np.bincount(labels) / 10000, atol=1e-3)


@pytest.mark.parametrize("gz", [True, False])
def test_tiny_idx_folder(gz: bool, write_idx: Callable) -> None:
    folder = write_idx(gz=gz, n=30)
    split = load_dataset(str(folder), test_size=6, dtype=torch.float64)
    assert (split.num_train, split.num_test, split.num_features) == (24, 6, 20)
    assert split.image_shape == (1, 4, 5) and split.num_classes == 3
    assert np.array_equal(split.train_y.numpy(), split.train_indices.numpy() % 3)
    pixels = split.train_x.numpy() * 255
    np.testing.assert_allclose(pixels, np.round(pixels), atol=1e-9)


def test_truncated_idx_file(write_idx: Callable) -> None:
    folder = write_idx(gz=False)
    path = folder / "imgs-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(DataFormatError, match="imgs-images-idx3-ubyte.*size mismatch"):
        load_dataset(str(folder))


def test_truncated_gzip_stream(write_idx: Callable) -> None:
    folder = write_idx(gz=True)
    path = folder / "imgs-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataFormatError, match="imgs-images-idx3-ubyte.gz"):
        load_dataset(str(folder))


def test_label_count_mismatch(write_idx: Callable) -> None:
    folder = write_idx(n=30, labels_n=29)
    with pytest.raises(DataFormatError, match="labels-idx1-ubyte.*expected 30"):
        load_dataset(str(folder))


def test_bad_magic_and_missing_labels(write_idx: Callable) -> None:
    folder = write_idx(gz=False)
    (folder / "imgs-images-idx3-ubyte").write_bytes(b"\x01\x02\x08\x03" + bytes(100))
    with pytest.raises(DataFormatError, match="not an IDX file"):
        load_dataset(str(folder))
    (folder / "imgs-labels-idx1-ubyte").unlink()
    with pytest.raises(DataFormatError, match="no matching labels file"):
        load_dataset(str(folder))


def test_mnist_alias_loads_the_same_split(shared_data_dir: Path) -> None:
    a = load_dataset("mnist", data_dir=shared_data_dir, dtype=torch.float32)
    b = load_dataset("mnist_test_idx", data_dir=shared_data_dir, dtype=torch.float32)
    assert a.name == "mnist"
    assert torch.equal(a.test_indices, b.test_indices) and torch.equal(a.train_y, b.train_y)

"""Reader of image folders in the IDX format of MNIST."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from gpext.errors import DataFormatError
from gpext_bench.data.parsers import read_idx
from gpext_bench.data.raw_dataset import RawDataset

__all__ = ["IMAGES_PATTERN", "LABELS_PATTERN", "read_mnist_idx", "MNIST_TEST_SIZE"]

IMAGES_PATTERN = re.compile(r"^(?P<prefix>.*)images[-.]idx3-ubyte(?:\.gz)?$")
LABELS_PATTERN = re.compile(r"^(?P<prefix>.*)labels[-.]idx1-ubyte(?:\.gz)?$")
#: Default number of test images of a random split.
MNIST_TEST_SIZE = 2000


def _pairs(folder: Path) -> list[tuple[Path, Path]]:
    names = sorted(p.name for p in folder.iterdir() if p.is_file())
    labels = {}
    for name in names:
        match = LABELS_PATTERN.match(name)
        if match:
            labels.setdefault(match["prefix"], folder / name)
    pairs = []
    for name in names:
        match = IMAGES_PATTERN.match(name)
        if not match:
            continue
        if match["prefix"] not in labels:
            raise DataFormatError(
                f"{folder / name}: no matching labels file; expected "
                f"{match['prefix']}labels-idx1-ubyte[.gz] in {folder}."
            )
        pairs.append((folder / name, labels[match["prefix"]]))
    if not pairs:
        raise DataFormatError(
            f"{folder}: found IDX label files but no images file "
            "(<prefix>images-idx3-ubyte[.gz] with a matching <prefix>labels-idx1-ubyte[.gz])."
        )
    return pairs


def read_mnist_idx(folder: Path, name: str) -> RawDataset:
    """Read every images/labels IDX pair of a folder (concatenated in file-name order).

    Images must be uint8 with shape ``(N, H, W)``; they are scaled to ``[0, 1]`` and
    flattened to ``(N, H * W)`` with ``image_shape = (1, H, W)``.  A labels file without
    matching images (e.g. MNIST's training labels next to the test images) is ignored.

    Args:
        folder: Folder holding the IDX files.
        name: Dataset name.

    Returns:
        The parsed dataset (classification, stratified random splits, no standardisation).

    Raises:
        DataFormatError: If a file is corrupt or an images file has no matching labels
            file with the same number of items.
    """
    xs, ys, shape = [], [], None
    for images_path, labels_path in _pairs(folder):
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DataFormatError(
                f"{images_path}: expected uint8 images of shape (N, H, W), got "
                f"{images.dtype} of shape {images.shape}."
            )
        if labels.ndim != 1 or labels.dtype.kind not in "iu" or len(labels) != len(images):
            raise DataFormatError(
                f"{labels_path}: expected {len(images)} integer labels to match {images_path.name}, "
                f"got {labels.dtype} of shape {labels.shape}."
            )
        if shape is not None and images.shape[1:] != shape:
            raise DataFormatError(
                f"{images_path}: image size {images.shape[1:]} differs from {shape}."
            )
        shape = images.shape[1:]
        xs.append(images.reshape(len(images), -1))
        ys.append(labels)
    pixels = xs[0] if len(xs) == 1 else np.concatenate(xs)
    uniq, codes = np.unique(np.concatenate(ys), return_inverse=True)
    return RawDataset(
        name=name,
        format="mnist_idx",
        task="classification",
        x=pixels,
        y=codes.astype(np.int64).reshape(-1),
        default_test_size=MNIST_TEST_SIZE,
        stratify=True,
        class_names=[str(int(v)) for v in uniq],
        image_shape=(1, *shape),
        standardize_x=False,
        x_divisor=255.0,
        path=folder,
    )

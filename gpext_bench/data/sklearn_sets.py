"""Small datasets bundled with scikit-learn (no download, no data directory needed)."""

from __future__ import annotations

import functools

import numpy as np
from sklearn import datasets

from gpext_bench.data.raw_dataset import RawDataset

__all__ = ["SKLEARN_DATASETS", "read_sklearn"]

#: Bundled datasets and their task.
SKLEARN_DATASETS = {
    "diabetes": "regression",
    "breast_cancer": "classification",
    "digits": "classification",
    "wine": "classification",
    "iris": "classification",
}


@functools.cache
def read_sklearn(name: str) -> RawDataset:
    """Load a bundled scikit-learn dataset with ``sklearn.datasets.load_<name>``.

    diabetes gets seeded random 90/10 splits; the classification sets get seeded stratified
    splits with 20% test rows and keep scikit-learn's class indices and ``target_names``.
    digits records ``image_shape = (1, 8, 8)``.

    Args:
        name: A key of :data:`SKLEARN_DATASETS`.

    Returns:
        The parsed dataset.
    """
    bunch = getattr(datasets, f"load_{name}")()
    x = np.asarray(bunch.data, dtype=np.float64)
    x.flags.writeable = False
    if SKLEARN_DATASETS[name] == "regression":
        y = np.asarray(bunch.target, dtype=np.float64)
        y.flags.writeable = False
        return RawDataset(name, "sklearn", "regression", x, y, default_test_size=0.1)
    y = np.asarray(bunch.target, dtype=np.int64)
    y.flags.writeable = False
    return RawDataset(
        name, "sklearn", "classification", x, y, default_test_size=0.2, stratify=True,
        class_names=[str(c) for c in bunch.target_names],
        image_shape=(1, 8, 8) if name == "digits" else None,
    )  # fmt: skip

"""Dataset loaders for benchmarks and tutorials.

Reads the benchmark folders described in ``../shared/data/README.md`` (UCI regression with
fixed splits, deep-kernel-learning folds, UCI classification tables, MNIST IDX files) from a
data directory given as ``data_dir`` or by ``$GPEXT_DATA_DIR``, and falls back to the small
datasets bundled with scikit-learn.  Nothing is ever downloaded.

Example:
    >>> from gpext_bench.data import load_dataset
    >>> split = load_dataset("diabetes", split=0)
    >>> split.task, split.num_train, split.num_test
    ('regression', 397, 45)
"""

from gpext_bench.data.dataset_split import DatasetSplit
from gpext_bench.data.loader import (
    DATA_DIR_ENV,
    dataset_info,
    list_datasets,
    load_dataset,
    resolve_data_dir,
)
from gpext_bench.data.standardizer import Standardizer

__all__ = [
    "DATA_DIR_ENV",
    "DatasetSplit",
    "Standardizer",
    "dataset_info",
    "list_datasets",
    "load_dataset",
    "resolve_data_dir",
]

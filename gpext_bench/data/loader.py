"""Finding, describing and loading datasets: the public entry points of :mod:`gpext_bench.data`."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from gpext.errors import (
    DatasetNotFoundError,
    DataWarning,
    InputDataError,
    InputTypeError,
    expected_got,
)
from gpext_bench.data.dataset_split import DatasetSplit
from gpext_bench.data.formats import detect_format, read_folder
from gpext_bench.data.raw_dataset import RawDataset
from gpext_bench.data.sklearn_sets import SKLEARN_DATASETS, read_sklearn
from gpext_bench.data.standardizer import Standardizer

__all__ = ["DATA_DIR_ENV", "resolve_data_dir", "list_datasets", "dataset_info", "load_dataset"]

#: Environment variable naming the data directory when no ``data_dir`` argument is given.
DATA_DIR_ENV = "GPEXT_DATA_DIR"
_HOW_TO_POINT = (
    f"Pass data_dir=<folder> or set the {DATA_DIR_ENV} environment variable to the folder that "
    "holds the dataset folders (e.g. ../shared/data), or pass the path of a dataset folder as "
    "the name."
)


def resolve_data_dir(data_dir: str | os.PathLike | None = None) -> Path | None:
    """The data directory: the argument if given, else ``$GPEXT_DATA_DIR``, else ``None``.

    A ``data_dir`` argument that is not an existing directory is an error.  A
    ``$GPEXT_DATA_DIR`` that is not one only warns and gives ``None``, so that the bundled
    scikit-learn sets stay loadable when the benchmark data is absent.

    Args:
        data_dir: Folder holding one sub-folder per dataset, or ``None``.

    Returns:
        The existing directory (user ``~`` expanded), or ``None``.

    Raises:
        DatasetNotFoundError: If ``data_dir`` is given but is not an existing directory.
    """
    if data_dir is None:
        configured = os.environ.get(DATA_DIR_ENV)
        if not configured:
            return None
        path = Path(configured).expanduser()
        if not path.is_dir():
            warnings.warn(
                f"${DATA_DIR_ENV}={configured!r} is not an existing directory; only the bundled "
                "scikit-learn datasets are available. " + _HOW_TO_POINT,
                DataWarning,
                stacklevel=2,
            )
            return None
        return path
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        state = "is not a directory" if path.exists() else "does not exist"
        raise DatasetNotFoundError(
            expected_got(
                "data directory (data_dir argument)",
                "an existing directory",
                f"{str(path)!r}, which {state}",
                _HOW_TO_POINT,
            )
        )
    return path


def list_datasets(data_dir: str | os.PathLike | None = None) -> dict[str, str]:
    """Names of the loadable datasets and their format.

    Args:
        data_dir: Data directory (default ``$GPEXT_DATA_DIR``); without one only the
            scikit-learn sets are listed.

    Returns:
        ``{name: format}`` sorted by name: the bundled scikit-learn sets (``"sklearn"``)
        plus every sub-folder of the data directory whose format is detected (a folder
        shadows a bundled set of the same name).
    """
    found = dict.fromkeys(SKLEARN_DATASETS, "sklearn")
    root = resolve_data_dir(data_dir)
    if root is not None:
        for folder in sorted(p for p in root.iterdir() if p.is_dir()):
            try:
                fmt = detect_format(folder)
            except OSError:  # unreadable folder: not a dataset we can offer
                continue
            if fmt is not None:
                found[folder.name] = fmt
    return dict(sorted(found.items()))


#: Short names for folders whose names describe their content (``mnist`` -> ``mnist_test_idx``).
ALIASES = {"mnist": "mnist_test_idx"}


def _looks_like_path(name: str) -> bool:
    return os.sep in name or "/" in name or name.startswith((".", "~")) or os.path.isabs(name)


def _read_raw(
    name: str | os.PathLike,
    data_dir: str | os.PathLike | None,
    task: str | None = None,
    target: str | None = None,
) -> RawDataset:
    raw = _find_raw(name, data_dir, task, target)
    if task is not None and raw.task != task:
        raise InputDataError(
            expected_got(
                f"task of dataset {raw.name!r}",
                f"{task!r}",
                f"{raw.task!r}, fixed by its {raw.format} format",
                "Only single-table folders (classification_table) can be read as either task.",
            )
        )
    if target is not None and raw.format != "classification_table":
        raise InputDataError(
            expected_got(
                f"target column of dataset {raw.name!r}",
                "no target option, since its format names the target itself",
                f"{raw.format} with target={target!r}",
                "Use --target only with single-table folders.",
            )
        )
    return raw


def _find_raw(
    name: str | os.PathLike,
    data_dir: str | os.PathLike | None,
    task: str | None,
    target: str | None,
) -> RawDataset:
    if isinstance(name, os.PathLike) or (isinstance(name, str) and _looks_like_path(name)):
        path = Path(name).expanduser()
        if not path.is_dir():
            state = "is not a directory" if path.exists() else "does not exist"
            raise DatasetNotFoundError(
                expected_got(
                    "dataset folder", "an existing directory", f"{str(path)!r}, which {state}"
                )
            )
        return read_folder(path, path.resolve().name, task, target)
    if not isinstance(name, str) or not name:
        raise InputTypeError(expected_got("dataset name", "a non-empty str or a path", repr(name)))
    root = resolve_data_dir(data_dir)
    if root is not None and (root / name).is_dir():
        return read_folder(root / name, name, task, target)
    alias = ALIASES.get(name)
    if root is not None and alias is not None and (root / alias).is_dir():
        return read_folder(root / alias, name, task, target)
    if name in SKLEARN_DATASETS:
        return read_sklearn(name)
    if Path(name).is_dir() and detect_format(Path(name)) is not None:
        # a dataset folder in the working directory
        return read_folder(Path(name), name, task, target)
    where = f"data directory {str(root)!r}" if root is not None else "no data directory set"
    raise DatasetNotFoundError(
        f"Unknown dataset {name!r} ({where}). Available: {', '.join(list_datasets(root))}. "
        + _HOW_TO_POINT
    )


def dataset_info(
    name: str | os.PathLike,
    data_dir: str | os.PathLike | None = None,
    *,
    task: str | None = None,
    target: str | None = None,
) -> dict[str, object]:
    """Describe a dataset without splitting it.

    Args:
        name: Dataset name or folder path (see :func:`load_dataset`).
        data_dir: Data directory (default ``$GPEXT_DATA_DIR``).
        task: See :func:`load_dataset`.
        target: See :func:`load_dataset`.

    Returns:
        Dict with keys ``name``, ``task``, ``format``, ``num_splits``, ``num_rows``,
        ``num_features``, ``num_classes`` (``None`` for regression) and ``path``
        (``None`` for bundled sets).

    Raises:
        DatasetNotFoundError: If the dataset cannot be found.
        DataFormatError: If its files cannot be parsed.
    """
    raw = _read_raw(name, data_dir, task, target)
    return {
        "name": raw.name,
        "task": raw.task,
        "format": raw.format,
        "num_splits": raw.num_splits,
        "num_rows": raw.num_rows,
        "num_features": raw.num_features,
        "num_classes": raw.num_classes,
        "path": raw.path,
    }


def load_dataset(
    name: str | os.PathLike,
    split: int = 0,
    *,
    data_dir: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float64,
    seed: int = 0,
    test_size: int | float | None = None,
    standardize: bool = True,
    device: torch.device | str | None = None,
    task: str | None = None,
    target: str | None = None,
) -> DatasetSplit:
    r"""Load one train/test split of a dataset as standardised tensors.

    ``name`` is looked up as a sub-folder of the data directory, then among the bundled
    scikit-learn sets; a path (containing a separator, or a ``PathLike``) names a dataset
    folder directly, whose format is detected from its files.  Fixed splits (``uci_splits``
    20 or 5, ``dkl_folds`` 10) come from the files; other formats draw seeded random splits
    (stratified for classification) with ``random_state = seed + split`` and offer
    :data:`~gpext_bench.data.raw_dataset.NUM_RANDOM_SPLITS` of them.

    .. math::

        \tilde x = (x - \bar x_{\text{train}}) / s_{\text{train}}, \qquad
        \tilde y = (y - \bar y_{\text{train}}) / s_{\text{train}, y}.

    Args:
        name: Dataset name (see :func:`list_datasets`) or dataset folder path.
        split: Split index in ``0 .. num_splits - 1``.
        data_dir: Data directory (default ``$GPEXT_DATA_DIR``).
        dtype: ``torch.float32`` or ``torch.float64`` for inputs and regression targets.
        seed: Base seed of random splits (ignored for fixed splits).
        test_size: Random splits only: number (int) or fraction (float) of test rows;
            default 0.2 (classification), 0.1 (diabetes), 2000 (IDX images).
        standardize: Standardise inputs and regression targets with training statistics
            (pixels of IDX images are never standardised).
        device: Device of the returned tensors.
        task: ``"regression"`` or ``"classification"`` for a single-table folder (default:
            classification unless the target holds non-integer numbers); for other datasets,
            which fix their task, a different value is an error.
        target: Target column of a single-table folder: header name or 0-based index.

    Returns:
        The split; ``x`` has shape ``(N, D)``, ``y`` shape ``(N,)``.

    Raises:
        DatasetNotFoundError: Unknown name or missing folder.
        DataFormatError: Unrecognised folder or corrupt files.
        InputDataError: Split out of range, bad ``test_size`` or unsupported ``dtype``.

    Example:
        >>> split = load_dataset("iris", split=1, dtype=torch.float32)
        >>> split.train_x.shape, split.test_y.dtype
        (torch.Size([120, 4]), torch.int64)
    """
    if dtype not in (torch.float32, torch.float64):
        raise InputDataError(
            expected_got("load_dataset(dtype=...)", "torch.float32 or torch.float64", dtype)
        )
    raw = _read_raw(name, data_dir, task, target)
    train, test = raw.split_indices(split, seed, test_size)
    # Prepare in float64 numpy and convert once: torch's threaded elementwise ops cost more
    # than they save on arrays of this size.
    x_train = raw.x[train].astype(np.float64) / raw.x_divisor  # shape: (N, D)
    x_test = raw.x[test].astype(np.float64) / raw.x_divisor  # shape: (M, D)
    x_scaler = Standardizer.identity(raw.num_features)
    if standardize and raw.standardize_x:
        x_scaler = Standardizer.fit(torch.from_numpy(x_train))
        mean, std = x_scaler.mean.numpy(), x_scaler.std.numpy()
        x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    y_train, y_test = raw.y[train], raw.y[test]  # shapes: (N,), (M,)
    y_scaler = None
    if raw.task == "regression":
        y_scaler = Standardizer.identity(None)
        if standardize:
            y_scaler = Standardizer.fit(torch.from_numpy(y_train))
        mean, std = y_scaler.mean.numpy(), y_scaler.std.numpy()
        y_train, y_test = (y_train - mean) / std, (y_test - mean) / std
        y_scaler, y_dtype = y_scaler.to(device, dtype), dtype
    else:
        y_dtype = torch.long

    def tensor(array: np.ndarray, kind: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(array, dtype=kind, device=device)

    return DatasetSplit(
        name=raw.name,
        task=raw.task,
        split_index=int(split),
        num_splits=raw.num_splits,
        train_x=tensor(x_train, dtype),
        train_y=tensor(y_train, y_dtype),
        test_x=tensor(x_test, dtype),
        test_y=tensor(y_test, y_dtype),
        x_scaler=x_scaler.to(device, dtype),
        y_scaler=y_scaler,
        num_classes=raw.num_classes,
        class_names=None if raw.class_names is None else list(raw.class_names),
        image_shape=raw.image_shape,
        format=raw.format,
        train_indices=torch.tensor(train, dtype=torch.long),  # CPU: rows of the source data
        test_indices=torch.tensor(test, dtype=torch.long),
    )

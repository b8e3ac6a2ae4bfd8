"""Parsed dataset before splitting and standardisation (internal)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from gpext.errors import InputDataError, InputTypeError, expected_got

__all__ = ["RawDataset", "NUM_RANDOM_SPLITS"]

#: Number of seeded random splits offered by formats without fixed splits.
NUM_RANDOM_SPLITS = 10

IndexPair = tuple[np.ndarray, np.ndarray]


def _is_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


@dataclass(frozen=True, eq=False)
class RawDataset:
    """All rows of one dataset in original units, plus how to split them.

    Either ``fixed_split`` maps a split index to ``(train_rows, test_rows)`` (formats that
    ship their splits), or the split is drawn with scikit-learn's ``train_test_split``
    using ``random_state = seed + split`` (stratified by label when ``stratify``).

    Attributes:
        name: Dataset name.
        format: Format name (``"uci_splits"``, ``"dkl_folds"``, ...).
        task: ``"regression"`` or ``"classification"``.
        x: Inputs (any real dtype), read-only.  # shape: (N, D)
        y: Float targets (regression) or int64 class indices.  # shape: (N,)
        num_splits: Number of splits.
        fixed_split: Function returning the row indices of split ``i``, or ``None``.
        default_test_size: ``test_size`` used for random splits when none is given.
        stratify: Whether random splits are stratified by ``y``.
        class_names: Original label of each class index.
        image_shape: ``(C, H, W)`` of a flattened input row, for images.
        standardize_x: Whether inputs may be standardised (``False`` for pixels).
        x_divisor: Inputs are ``x / x_divisor`` (255 keeps uint8 pixels compact).
        path: Folder the data came from, ``None`` for bundled data.
    """

    name: str
    format: str
    task: str
    x: np.ndarray
    y: np.ndarray
    num_splits: int = NUM_RANDOM_SPLITS
    fixed_split: Callable[[int], IndexPair] | None = None
    default_test_size: int | float | None = None
    stratify: bool = False
    class_names: list[str] | None = None
    image_shape: tuple[int, ...] | None = None
    standardize_x: bool = True
    x_divisor: float = 1.0
    path: Path | None = None

    @property
    def num_rows(self) -> int:
        """Number of rows ``N``."""
        return int(self.x.shape[0])

    @property
    def num_features(self) -> int:
        """Number of input columns ``D``."""
        return int(self.x.shape[1])

    @property
    def num_classes(self) -> int | None:
        """Number of classes, ``None`` for regression."""
        return None if self.class_names is None else len(self.class_names)

    def split_indices(self, split: int, seed: int, test_size: int | float | None) -> IndexPair:
        """Row indices of the training and test part of split ``split``.

        Args:
            split: Split index in ``0 .. num_splits - 1``.
            seed: Base seed of random splits (split ``i`` uses ``seed + i``).
            test_size: Test rows (int) or fraction (float in (0, 1)) for random splits;
                ``None`` for the default.  Must be ``None`` for fixed splits.

        Returns:
            ``(train_rows, test_rows)``, int64 arrays.  # shapes: (N_train,), (N_test,)

        Raises:
            InputDataError: If ``split`` is out of range or ``test_size`` is invalid.
            InputTypeError: If ``split`` or ``seed`` is not an integer.
        """
        what = f"load_dataset({self.name!r}, split=...)"
        if not _is_int(split):
            raise InputTypeError(expected_got(what, "an int", repr(split)))
        if not 0 <= split < self.num_splits:
            raise InputDataError(
                expected_got(
                    what,
                    f"an integer in [0, {self.num_splits - 1}] ({self.num_splits} splits)",
                    split,
                )
            )
        if self.fixed_split is not None:
            if test_size is not None:
                raise InputDataError(
                    expected_got(
                        f"load_dataset({self.name!r}, test_size=...)",
                        f"None, since the {self.format} format ships fixed splits",
                        repr(test_size),
                        "Leave test_size unset to use the split files.",
                    )
                )
            return self.fixed_split(int(split))
        if not _is_int(seed):
            raise InputTypeError(expected_got("load_dataset(seed=...)", "an int", repr(seed)))
        size = self.default_test_size if test_size is None else test_size
        self._check_test_size(size)
        try:
            train, test = train_test_split(
                np.arange(self.num_rows),
                test_size=size,
                random_state=int(seed) + int(split),
                stratify=self.y if self.stratify else None,
            )
        except ValueError as err:
            raise InputDataError(
                f"load_dataset({self.name!r}): cannot draw split {split} with "
                f"test_size={size!r} and seed={seed!r}: {err}"
            ) from err
        return train, test

    def _check_test_size(self, size: object) -> None:
        n = self.num_rows
        ok = (_is_int(size) and 1 <= size <= n - 1) or (
            isinstance(size, (float, np.floating)) and 0.0 < size < 1.0
        )
        if not ok:
            raise InputDataError(
                expected_got(
                    f"load_dataset({self.name!r}, test_size=...)",
                    f"an int in [1, {n - 1}] (number of test rows) or a float in (0, 1) "
                    "(test fraction)",
                    repr(size),
                )
            )

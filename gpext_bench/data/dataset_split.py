"""One train/test split of a dataset, as returned by :func:`gpext_bench.data.load_dataset`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpext.errors import InputDataError, ShapeError, expected_got
from gpext_bench.data.standardizer import Standardizer

__all__ = ["DatasetSplit"]

TASKS = ("regression", "classification")


@dataclass(eq=False)
class DatasetSplit:
    """Train and test tensors of one split, with the scalers needed to undo standardisation.

    Inputs are standardised with the mean and standard deviation of the training part
    (``x_scaler``).  Regression targets are standardised likewise (``y_scaler``, scalar
    statistics) and stored in the float dtype of the inputs; classification targets are
    ``torch.long`` class indices in ``0 .. num_classes - 1`` and ``y_scaler`` is ``None``.

    Attributes:
        name: Dataset name (or folder name when loaded from a path).
        task: ``"regression"`` or ``"classification"``.
        split_index: Index of this split in ``0 .. num_splits - 1``.
        num_splits: Number of available splits.
        train_x: Standardised training inputs.  # shape: (N, D)
        train_y: Training targets.  # shape: (N,)
        test_x: Standardised test inputs.  # shape: (M, D)
        test_y: Test targets.  # shape: (M,)
        x_scaler: Input standardizer (identity for images).
        y_scaler: Target standardizer for regression, ``None`` for classification.
        num_classes: Number of classes (classification only).
        class_names: Original label of each class index (classification only).
        image_shape: ``(C, H, W)`` of one flattened input row, for image data.
        format: Name of the on-disk format the data came from.
        train_indices: Rows of the source data used for training.  # shape: (N,)
        test_indices: Rows of the source data used for testing.  # shape: (M,)

    Example:
        >>> from gpext_bench.data import load_dataset
        >>> split = load_dataset("diabetes")
        >>> split.num_train, split.num_test, split.num_features
        (397, 45, 10)
    """

    name: str
    task: str
    split_index: int
    num_splits: int
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    x_scaler: Standardizer
    y_scaler: Standardizer | None = None
    num_classes: int | None = None
    class_names: list[str] | None = None
    image_shape: tuple[int, ...] | None = None
    format: str = "custom"
    train_indices: torch.Tensor | None = None
    test_indices: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise InputDataError(expected_got("DatasetSplit.task", f"one of {TASKS}", self.task))
        for part, x, y in (
            ("train", self.train_x, self.train_y),
            ("test", self.test_x, self.test_y),
        ):
            if x.dim() != 2 or y.dim() != 1 or x.shape[0] != y.shape[0]:
                raise ShapeError(
                    expected_got(
                        f"DatasetSplit.{part}_x/{part}_y",
                        "shapes (N, D) and (N,)",
                        f"{tuple(x.shape)} and {tuple(y.shape)}",
                    )
                )
        if self.train_x.shape[1] != self.test_x.shape[1]:
            raise ShapeError(
                expected_got(
                    "DatasetSplit.test_x",
                    f"{self.train_x.shape[1]} columns like train_x",
                    self.test_x.shape[1],
                )
            )
        if self.task == "regression" and self.y_scaler is None:
            raise InputDataError(
                expected_got(
                    "DatasetSplit.y_scaler",
                    "a Standardizer for regression",
                    None,
                    "Use Standardizer.identity(None, dtype) for unscaled targets.",
                )
            )
        if self.task == "classification" and self.num_classes is None:
            raise InputDataError(
                expected_got("DatasetSplit.num_classes", "an int for classification", None)
            )

    @property
    def num_train(self) -> int:
        """Number of training rows ``N``."""
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        """Number of test rows ``M``."""
        return int(self.test_x.shape[0])

    @property
    def num_features(self) -> int:
        """Number of input columns ``D``."""
        return int(self.train_x.shape[1])

    @property
    def test_y_original(self) -> torch.Tensor:
        """Test targets in original units (regression) or the class indices (classification).

        Returns:
            ``y_scaler.inverse_transform(test_y)`` for regression, else ``test_y``.  # shape: (M,)
        """
        if self.y_scaler is None:
            return self.test_y
        return self.y_scaler.inverse_transform(self.test_y)

    def __repr__(self) -> str:
        extra = f", classes={self.num_classes}" if self.num_classes is not None else ""
        return (
            f"DatasetSplit(name={self.name!r}, task={self.task!r}, "
            f"split={self.split_index}/{self.num_splits}, train={self.num_train}, "
            f"test={self.num_test}, features={self.num_features}{extra}, "
            f"dtype={self.train_x.dtype}, format={self.format!r})"
        )

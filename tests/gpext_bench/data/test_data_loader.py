"""Name resolution, listing and argument checks of the loader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from gpext.errors import (
    DataFormatError,
    DatasetNotFoundError,
    DataWarning,
    InputDataError,
    InputTypeError,
)
from gpext_bench.data import (
    DATA_DIR_ENV,
    dataset_info,
    list_datasets,
    load_dataset,
    resolve_data_dir,
)

SHARED_FORMATS = {
    **dict.fromkeys(["boston", "concrete", "energy", "yacht", "naval", "protein"], "uci_splits"),
    **dict.fromkeys(
        ["elevators", "keggdirected", "keggundirected", "pol", "skillcraft", "bike"], "dkl_folds"
    ),
    **dict.fromkeys(["magic", "htru2", "letter"], "classification_table"),
    "mnist_test_idx": "mnist_idx",
}


def test_resolve_data_dir_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DATA_DIR_ENV, raising=False)
    assert resolve_data_dir(None) is None
    other = tmp_path / "other"
    other.mkdir()
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path))
    assert resolve_data_dir(None) == tmp_path
    assert resolve_data_dir(other) == other
    monkeypatch.setenv(DATA_DIR_ENV, str(tmp_path / "missing"))
    with pytest.warns(DataWarning, match=f"{DATA_DIR_ENV}=.*missing"):
        assert resolve_data_dir(None) is None
    with pytest.warns(DataWarning):  # the bundled sets stay available
        assert load_dataset("iris").num_classes == 3
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        resolve_data_dir(tmp_path / "missing")  # an explicit argument is an error


def test_resolve_missing_argument(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="does not exist.*data_dir"):
        resolve_data_dir(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(DatasetNotFoundError, match="not a directory"):
        resolve_data_dir(tmp_path / "file")


def test_list_shared_datasets(shared_data_dir: Path) -> None:
    found = list_datasets(shared_data_dir)
    present = {k: v for k, v in SHARED_FORMATS.items() if (shared_data_dir / k).is_dir()}
    sklearn = dict.fromkeys(["breast_cancer", "diabetes", "digits", "iris", "wine"], "sklearn")
    assert found == dict(sorted({**sklearn, **present}.items()))
    assert "licenses" not in found


def test_env_var_used_when_no_argument(
    shared_data_dir: Path, dataset_dir: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset_dir("yacht")
    monkeypatch.setenv(DATA_DIR_ENV, str(shared_data_dir))
    assert load_dataset("yacht").num_train + load_dataset("yacht").num_test == 308
    assert dataset_info("yacht")["path"] == shared_data_dir / "yacht"


def test_unknown_name_lists_available(shared_data_dir: Path, no_data_env: None) -> None:
    with pytest.raises(DatasetNotFoundError) as info:
        load_dataset("nosuchset", data_dir=shared_data_dir)
    message = str(info.value)
    for name in ("'nosuchset'", "iris", "diabetes", "data_dir", DATA_DIR_ENV):
        assert name in message
    if (shared_data_dir / "boston").is_dir():
        assert "boston" in message
    with pytest.raises(DatasetNotFoundError, match="no data directory set.*iris.*GPEXT_DATA_DIR"):
        dataset_info("boston-typo")


def test_missing_folder_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_dataset(str(tmp_path / "absent"))
    with pytest.raises(DatasetNotFoundError, match="does not exist"):
        load_dataset("iris", data_dir=tmp_path / "absent")


def test_empty_and_unrecognised_folders(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataFormatError) as info:
        load_dataset(str(empty))
    for expected in ("no files", "uci_splits", "index_train_{i}.txt", "dkl_folds",
                     "test_mask.csv.gz", "classification_table", "mnist_idx"):  # fmt: skip
        assert expected in str(info.value)
    odd = tmp_path / "odd"
    odd.mkdir()
    (odd / "a.csv").write_text("1,2\n")
    (odd / "b.csv").write_text("1,2\n")
    with pytest.raises(DataFormatError, match="a.csv, b.csv"):
        load_dataset(str(odd))
    found = list_datasets(tmp_path)
    assert "odd" not in found and "empty" not in found and found["iris"] == "sklearn"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.int64, "float32"])
def test_bad_dtype(dtype: object, no_data_env: None) -> None:
    with pytest.raises(InputDataError, match="float32 or torch.float64"):
        load_dataset("iris", dtype=dtype)


def test_split_out_of_range(write_uci: Callable, no_data_env: None) -> None:
    folder = write_uci()
    assert load_dataset(str(folder), 1).num_splits == 2
    for bad in (2, -1):
        with pytest.raises(InputDataError, match=r"\[0, 1\] \(2 splits\)"):
            load_dataset(str(folder), bad)
    with pytest.raises(InputDataError, match=r"\[0, 9\]"):
        load_dataset("iris", 10)
    with pytest.raises(InputTypeError):
        load_dataset("iris", 1.0)
    with pytest.raises(InputDataError, match="fixed splits"):
        load_dataset(str(folder), 0, test_size=0.5)


def test_device_argument(no_data_env: None) -> None:
    split = load_dataset("wine", device="cpu")
    assert split.train_x.device == torch.device("cpu") == split.x_scaler.mean.device


def test_bare_name_of_dataset_folder_in_working_directory(
    write_uci: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, no_data_env: None
) -> None:
    write_uci(name="mydata")
    (tmp_path / "notdata").mkdir()
    monkeypatch.chdir(tmp_path)
    assert load_dataset("mydata").name == "mydata"
    with pytest.raises(DatasetNotFoundError, match="Unknown dataset 'notdata'"):
        load_dataset("notdata")

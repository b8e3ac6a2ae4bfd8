"""``gpext bench --task/--target`` on a user's own single-table folder."""

import json
import warnings

import numpy as np
import pytest

from gpext.errors import DataFormatError, DataWarning, InputDataError
from gpext_bench.cli import main
from gpext_bench.data import dataset_info, load_dataset


def _table(folder, y, header="a,b,price"):
    folder.mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(len(y), 2))
    lines = [header] + [f"{a:.4f},{b:.4f},{t}" for (a, b), t in zip(x, y)]
    (folder / "my.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_fractional_target_is_read_as_regression(tmp_path):
    folder = _table(tmp_path / "prices", [f"{v:.3f}" for v in np.linspace(1, 9, 60)])
    info = dataset_info(str(folder))
    assert info["task"] == "regression" and info["num_classes"] is None
    split = load_dataset(str(folder), seed=0)
    assert split.task == "regression" and split.train_y.is_floating_point()


def test_integer_target_needs_task_regression(tmp_path):
    folder = _table(tmp_path / "counts", [str(v) for v in range(60)])
    # the default reads integers as labels, and says so and how to override it (it was silent)
    with pytest.warns(DataWarning, match="--task regression"):
        assert dataset_info(str(folder))["task"] == "classification"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DataWarning)
        assert dataset_info(str(folder), task="regression")["task"] == "regression"
        assert dataset_info(str(folder), task="classification")["task"] == "classification"


def test_target_by_name_and_index(tmp_path):
    folder = _table(tmp_path / "t", [f"{v:.3f}" for v in np.linspace(1, 9, 60)])
    by_name = load_dataset(str(folder), task="regression", target="a")
    by_index = load_dataset(str(folder), task="regression", target="0")
    assert by_name.num_features == 2
    assert np.allclose(by_name.test_y_original.numpy(), by_index.test_y_original.numpy())
    with pytest.raises(InputDataError, match="target column"):
        load_dataset(str(folder), target="nope")


def test_task_or_target_that_the_format_fixes_is_an_error(tmp_path):
    with pytest.raises(InputDataError, match="task of dataset 'diabetes'"):
        dataset_info("diabetes", task="classification")
    with pytest.raises(InputDataError, match="no target option"):
        dataset_info("diabetes", target="0")
    folder = tmp_path / "labels"
    folder.mkdir()
    (folder / "t.csv").write_text("1,2,cat\n3,4,dog\n5,6,cat\n7,8,dog\n")
    with pytest.raises(DataFormatError, match="expected numbers in the regression target"):
        dataset_info(str(folder), task="regression")


def test_cli_runs_a_user_regression_table(tmp_path, capsys):
    folder = _table(tmp_path / "counts", [str(v) for v in range(80)])
    out = tmp_path / "o"
    code = main(["bench", "--quick", "--dataset", str(folder), "--task", "regression",
                 "--target", "price", "--methods", "gpytorch_exact_gp", "--out", str(out),
                 "--no-plot"])  # fmt: skip
    assert code == 0, capsys.readouterr().err
    payload = json.loads((out / "gpext_bench.json").read_text())
    assert payload["rows"][0]["method"] == "gpytorch_exact_gp" and "rmse" in payload["rows"][0]

import json

import pytest
import torch

from gpext.errors import InputDataError, ShapeError
from gpext_bench import (
    Prediction,
    aggregate_rows,
    format_markdown_table,
    get_method,
    list_methods,
    register_method,
    write_results,
)


def test_builtin_baselines_are_registered():
    names = {m.name: m.task for m in list_methods()}
    assert names["gpytorch_exact_gp"] == "regression"
    assert names["gpytorch_svgp"] == "regression"
    assert names["gpytorch_svgp_softmax"] == "classification"
    assert all(m.task == "classification" for m in list_methods("classification"))


def test_unknown_method_lists_registered():
    with pytest.raises(InputDataError, match="gpytorch_svgp"):
        get_method("no_such_method")


def test_register_rejects_bad_task_and_duplicates():
    with pytest.raises(InputDataError, match="regression"):
        register_method("x", task="ranking")

    def impostor(split, config):
        return None

    impostor.__module__ = "somewhere.else"
    with pytest.raises(InputDataError, match="already registered"):
        register_method("gpytorch_svgp", task="regression")(impostor)


def test_prediction_mixture_moments():
    means = torch.tensor([[0.0, 1.0], [2.0, 1.0]], dtype=torch.float64)
    variances = torch.tensor([[1.0, 1.0], [1.0, 3.0]], dtype=torch.float64)
    p = Prediction(mixture_means=means, mixture_variances=variances)
    assert p.is_mixture
    torch.testing.assert_close(p.mean, torch.tensor([1.0, 1.0], dtype=torch.float64))
    # law of total variance: E[var] + Var[mean]
    torch.testing.assert_close(p.variance, torch.tensor([2.0, 2.0], dtype=torch.float64))
    with pytest.raises(ShapeError):
        Prediction(mixture_means=means, mixture_variances=variances[:1])
    with pytest.raises(InputDataError, match="either probs"):
        Prediction()


def test_aggregate_rows_mean_and_standard_error():
    rows = [
        {"dataset": "a", "method": "m", "split": 0, "rmse": 1.0},
        {"dataset": "a", "method": "m", "split": 1, "rmse": 3.0},
        {"dataset": "b", "method": "m", "split": 0, "rmse": 5.0},
    ]
    agg = aggregate_rows(rows)
    assert agg[0]["rmse"] == 2.0 and agg[0]["n"] == 2
    assert agg[0]["rmse_se"] == pytest.approx(1.0)  # sd sqrt(2) / sqrt(2)
    assert agg[1] == {"dataset": "b", "method": "m", "rmse": 5.0, "n": 1}


def test_write_results_layout(tmp_path):
    rows = [{"dataset": "d", "method": "m", "rmse": 0.5}]
    jp, mp = write_results(
        "demo", rows, tmp_path, command="gpext bench", extra={"goals": {"g": True}}
    )
    payload = json.loads(jp.read_text())
    assert payload["benchmark"] == "demo"
    assert payload["command"] == "gpext bench"
    assert payload["rows"] == rows
    assert payload["goals"] == {"g": True}
    md = mp.read_text()
    assert "| dataset | method | rmse |" in md and "| d | m | 0.5000 |" in md


def test_write_results_markdown_skip_keeps_json_complete(tmp_path):
    runs = [{"seed": i, "regret": float(i)} for i in range(3)]
    jp, mp = write_results(
        "demo", [{"dataset": "d", "method": "m"}], tmp_path, command="c",
        extra={"runs": runs, "goals": {"g": False}}, markdown_skip=("runs",),
    )  # fmt: skip
    assert json.loads(jp.read_text())["runs"] == runs
    md = mp.read_text()
    assert "**runs**: in `demo.json`" in md and '"regret"' not in md
    assert '**goals**: {"g": false}' in md


def test_markdown_table_formats_small_and_large_numbers():
    table = format_markdown_table([{"x": 1e-5, "y": 123456.0, "z": "s"}])
    assert "1.000e-05" in table and "1.235e+05" in table and "| s |" in table


def test_default_flag_selects_what_runs_without_methods():
    from gpext_bench.runner import _resolve_methods

    defaults = {m.name for m in _resolve_methods(None, "classification")}
    everything = {m.name for m in _resolve_methods(["all"], "classification")}
    assert "gpytorch_svgp_softmax" in defaults
    assert "gpytorch_dirichlet_exact" in everything - defaults  # reference recipe: opt-in
    assert defaults < everything
    assert {m.name for m in list_methods("classification", default_only=True)} == defaults

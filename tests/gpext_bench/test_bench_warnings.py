"""``gpext bench`` records the gpext warnings of every fit in its rows, JSON and markdown."""

import json
import math
import warnings

import numpy as np
import pytest
import torch

from gpext.errors import ConvergenceWarning, VarianceCollapseWarning
from gpext_bench import BenchConfig, Prediction, aggregate_rows, registry, run_benchmark
from gpext_bench.cli import main
from gpext_bench.results import format_markdown_table
from gpext_bench.runner import reissue_warnings, summarize_warnings


def _trivial(split):
    m = split.test_y.shape[0]
    return Prediction(mean=split.test_y.new_zeros(m), variance=split.test_y.new_ones(m))


@pytest.fixture
def warning_methods(monkeypatch):
    """Fake regression methods: ``fake_clean``, ``fake_warns`` (two gpext warnings and one
    other warning), ``fake_warns_then_fails`` (a gpext warning, then an error)."""
    registry.list_methods()  # load the built-ins first

    def clean(split, config):
        return _trivial(split)

    def warns(split, config):
        warnings.warn(
            "loss still improving | at the budget\nsecond line", ConvergenceWarning, stacklevel=1
        )
        warnings.warn("a torch-style warning", UserWarning, stacklevel=1)
        warnings.warn("signal variance collapsed", VarianceCollapseWarning, stacklevel=1)
        return _trivial(split)

    def warns_then_fails(split, config):
        warnings.warn("signal variance collapsed", VarianceCollapseWarning, stacklevel=1)
        raise RuntimeError("boom")

    for name, fn in (
        ("fake_clean", clean),
        ("fake_warns", warns),
        ("fake_warns_then_fails", warns_then_fails),
    ):
        method = registry.BenchMethod(name, "regression", fn, "test", __name__, False)
        monkeypatch.setitem(registry._REGISTRY, name, method)


def test_rows_record_gpext_warnings_and_clean_fits_have_none(warning_methods):
    with warnings.catch_warnings(record=True) as outer:
        warnings.simplefilter("always")
        run = run_benchmark(
            ["diabetes"],
            ["fake_clean", "fake_warns", "fake_warns_then_fails"],
            config=BenchConfig(quick=True),
        )
    rows = {r["method"]: r for r in run.rows}
    clean = rows["fake_clean"]
    assert clean["warnings"] == 0 and clean["warning"] == "" and clean["warning_classes"] == ""
    warned = rows["fake_warns"]
    assert warned["warnings"] == 2  # the UserWarning is not a gpext warning
    assert warned["warning"] == "ConvergenceWarning: loss still improving | at the budget"
    assert warned["warning_classes"] == "ConvergenceWarning,VarianceCollapseWarning"
    assert "rmse" in warned and "failure" not in warned
    failed = rows["fake_warns_then_fails"]
    assert failed["failure"] == "RuntimeError: boom"
    assert failed["warnings"] == 1 and failed["warning"].startswith("VarianceCollapseWarning")
    # nothing is swallowed: every warning of the fits reaches the caller's filters
    seen = [(w.category, str(w.message).splitlines()[0]) for w in outer]
    assert (ConvergenceWarning, "loss still improving | at the budget") in seen
    assert (UserWarning, "a torch-style warning") in seen
    assert sum(w.category is VarianceCollapseWarning for w in outer) == 2


def test_aggregated_rows_count_warned_fits(warning_methods):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_benchmark(
            ["diabetes"], ["fake_clean", "fake_warns"], config=BenchConfig(quick=True), splits=2
        )
    agg = {r["method"]: r for r in aggregate_rows(run.rows)}
    assert agg["fake_clean"]["warned_fits"] == 0 and agg["fake_clean"]["warnings"] == 0
    assert agg["fake_warns"]["warned_fits"] == 2 and agg["fake_warns"]["warnings"] == 4
    assert agg["fake_warns"]["warning"].startswith("ConvergenceWarning: loss still improving")
    assert agg["fake_warns"]["n"] == 2
    table = format_markdown_table(list(agg.values()))
    assert "warned_fits" in table and "loss still improving \\| at the budget" in table


def test_cli_json_and_markdown_show_warnings(tmp_path, capsys, warning_methods):
    out = tmp_path / "o"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        code = main(["bench", "--quick", "--dataset", "diabetes", "--out", str(out),
                     "--no-plot", "--methods", "fake_clean", "fake_warns"])  # fmt: skip
    assert code == 0
    captured = capsys.readouterr()
    assert "warned_fits" in captured.out and "ConvergenceWarning" in captured.out
    assert "1 of 2 fit(s) issued gpext warnings" in captured.err
    payload = json.loads((out / "gpext_bench.json").read_text())
    per_split = {r["method"]: r for r in payload["per_split"]}
    assert per_split["fake_clean"]["warnings"] == 0
    assert (
        per_split["fake_warns"]["warning_classes"] == "ConvergenceWarning,VarianceCollapseWarning"
    )
    rows = {r["method"]: r for r in payload["rows"]}
    assert rows["fake_warns"]["warned_fits"] == 1 and rows["fake_clean"]["warned_fits"] == 0
    md = (out / "gpext_bench.md").read_text()
    assert "warned_fits" in md and "ConvergenceWarning: loss still improving" in md


def test_summarize_and_reissue():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("not gpext", RuntimeWarning, stacklevel=1)
    assert summarize_warnings(caught) == {"warnings": 0, "warning": "", "warning_classes": ""}
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        reissue_warnings(caught)
    assert [w.category for w in again] == [RuntimeWarning]
    assert again[0].filename == caught[0].filename and again[0].lineno == caught[0].lineno
    with warnings.catch_warnings(), pytest.raises(RuntimeWarning):
        warnings.simplefilter("error")
        reissue_warnings(caught)


def _tiny_table(folder, n=60):
    folder.mkdir()
    rng = np.random.default_rng(0)
    x = rng.uniform(-2, 2, size=(n, 2))
    y = np.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * rng.normal(size=n)
    lines = ["a,b,y"] + [f"{a:.5f},{b:.5f},{t:.5f}" for (a, b), t in zip(x, y)]
    (folder / "tiny.csv").write_text("\n".join(lines) + "\n")
    return folder


def test_vboot_mlp_runs_under_float64(tmp_path):
    # the ensemble trains in float32; the float64 test inputs of the default --dtype used to
    # be refused at prediction (InputTypeError), failing every fit
    folder = _tiny_table(tmp_path / "tiny")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run = run_benchmark(
            [str(folder)],
            ["vboot_mlp"],
            config=BenchConfig(quick=True, dtype=torch.float64),
            task="regression",
            raise_errors=True,
        )
    (row,) = run.rows
    assert "failure" not in row
    assert all(math.isfinite(row[k]) for k in ("rmse", "nll", "coverage95"))
    (split, pred) = next(iter(run.predictions.values()))
    assert split.test_x.dtype == torch.float64 and pred.mixture_means.dtype == torch.float64
    assert pred.info["dtype"] == "torch.float32"


def test_methods_sharing_a_subspace_run_all_report_its_training_warnings(monkeypatch):
    # swag, pca_ess, inkpca_ess, ... share one cached training run per split; its warnings
    # must reach the row of every method that uses it, not only the first
    import gpext_bench.methods_subspace as ms
    from gpext_bench.data import load_dataset

    def train(split, config, candidates, rank, validation_fraction, likelihood):
        warnings.warn("the trajectory explains nothing", VarianceCollapseWarning, stacklevel=1)
        return ms.SubspaceRun(None, None, None, None, 0.0, 1, (None,) * 4)

    monkeypatch.setattr(ms, "_train_split_run", train)
    split = load_dataset("diabetes")
    config = BenchConfig(quick=True)
    for _ in range(2):  # trained, then reused from the cache
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run = ms.fit_subspace_run(split, config)
        assert summarize_warnings(caught)["warning"] == (
            "VarianceCollapseWarning: the trajectory explains nothing"
        )
    assert len(run.training_warnings) == 1

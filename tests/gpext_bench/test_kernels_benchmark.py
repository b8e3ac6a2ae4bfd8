"""Tests of ``benchmarks/kernels.py``: goal bookkeeping, and a tiny end-to-end run."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_kernels_bench", BENCH / "kernels.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _rec(dataset, method, split, nll, seconds, n_train=2000):
    return {"dataset": dataset, "method": method, "split": split, "n_train": n_train,
            "error": None, "nll": nll, "rmse": 1.0, "coverage95": 0.95, "r2": 0.5,
            "seconds": seconds, "cpu_seconds": seconds, "gpext_warned": False,
            "degenerate": False, "warnings": {}}  # fmt: skip


def test_goals_from_means_standard_errors_and_ratios(bench):
    records = []
    # big: exact nll 1.0 / 1.2 (mean 1.1, se 0.1); rff 1.15 / 1.25 (mean 1.2 <= 1.2), 10x faster
    for s, (ex, rff) in enumerate([(1.0, 1.15), (1.2, 1.25)]):
        records += [_rec("big", "exact_matern52", s, ex, 100.0),
                    _rec("big", "vboot_rff_matern52", s, rff, 10.0)]  # fmt: skip
    # arm B: nystrom wins on a, loses beyond one se on b and c -> 1 of 3, goal missed
    for d, (sg, ny) in {"a": (1.0, 0.9), "b": (1.0, 1.5), "c": (1.0, 1.2)}.items():
        for s in range(2):
            records += [_rec(d, "sgpr", s, sg + 0.1 * s, 1.0, 300),
                        _rec(d, "nystrom_kpca_gp", s, ny + 0.1 * s, 2.0, 300)]  # fmt: skip
    rows = bench.aggregate(records)
    get = {(r["dataset"], r["method"]): r for r in rows}
    rff = get[("big", "vboot_rff_matern52")]
    assert rff["time_ratio"] == pytest.approx(0.1)
    assert get[("big", "exact_matern52")]["nll_se"] == pytest.approx(0.1)
    assert get[("a", "nystrom_kpca_gp")]["time_ratio"] == pytest.approx(2.0)
    goals, notes = bench.evaluate_goals(rows)
    assert goals["matern_vboot_rff_within_1se_and_faster_from_n2000"] is True
    assert goals["nystrom_kpca_vs_sgpr[a]"] is True
    assert goals["nystrom_kpca_vs_sgpr[b]"] is False
    assert goals["nystrom_kpca_at_least_as_accurate_as_sgpr"] is False
    assert not notes
    diff = bench.paired_differences(records)["vboot_rff_matern52-exact_matern52[big]"]
    assert diff["mean"] == pytest.approx(0.1) and diff["splits"] == 2
    # below N = 2000 the RFF goal is not evaluated, and says so
    small = [r for r in rows if r["dataset"] != "big"]
    for r in rows:
        if r["dataset"] == "big":
            small.append({**r, "n_train": 1999.0})
    goals, notes = bench.evaluate_goals(small)
    assert "matern_vboot_rff_within_1se_and_faster_from_n2000" not in goals
    assert "matern_vboot_rff_within_1se_and_faster_from_n2000" in notes


def test_tiny_run_writes_numeric_rows(bench, tmp_path):
    argv = ["--quick", "--data-dir", "", "--max-train", "60", "--rank", "16",
            "--mlp-min-steps", "20", "--out", str(tmp_path)]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "kernels.json").read_text())
    assert (tmp_path / "kernels.md").exists()
    assert {r["method"] for r in data["rows"]} == set(bench.METHODS)
    for row in data["rows"]:
        assert row["dataset"] == "diabetes" and row["n_train"] == 60
        for key, value in row.items():
            if key not in ("dataset", "method"):
                assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
    assert "nystrom_kpca_at_least_as_accurate_as_sgpr" in data["goals"]
    assert "matern_vboot_rff_within_1se_and_faster_from_n2000" in data["goals_not_evaluated"]
    assert all(isinstance(v, bool) for v in data["goals"].values())

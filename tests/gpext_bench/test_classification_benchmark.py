"""Tests of the bookkeeping of ``benchmarks/classification.py`` (ratios, paired differences, goals)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_cls_bench", BENCH / "classification.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _rows():
    rows = []
    for split, (e_rm, e_sm, t_rm, t_sm) in enumerate(
        [(0.02, 0.03, 10.0, 8.0), (0.04, 0.02, 6.0, 12.0)]
    ):
        rows.append({"dataset": "htru2", "method": "gpext_robust_max_svgp", "split": split,
                     "error": e_rm, "seconds": t_rm, "cpu_seconds": t_rm / 2})  # fmt: skip
        rows.append({"dataset": "htru2", "method": "gpytorch_svgp_softmax", "split": split,
                     "error": e_sm, "seconds": t_sm, "cpu_seconds": t_sm / 2})  # fmt: skip
    return rows


def test_ratios_paired_differences_and_goals(bench):
    rows = _rows()
    bench.add_seconds_ratio(rows)
    robust = [r for r in rows if r["method"] == bench.ROBUST]
    assert [r["seconds_ratio"] for r in robust] == pytest.approx([1.25, 0.5])
    assert [r["cpu_ratio"] for r in robust] == pytest.approx([1.25, 0.5])
    assert all("seconds_ratio" not in r for r in rows if r["method"] == bench.SOFTMAX)
    diff = bench.paired_differences(rows)["htru2"]
    assert diff["splits"] == 2 and diff["mean_error_diff"] == pytest.approx(0.005)
    assert diff["se"] == pytest.approx(0.015)
    summary = bench.aggregate_rows(rows)
    goals = bench.evaluate_goals(summary)
    # means: error 0.03 vs 0.025 (missed); mean time ratio 0.875 (met)
    assert goals["htru2_robust_max_error<=softmax"] is False
    assert goals["htru2_robust_max_time<=softmax"] is True
    assert goals["htru2_robust_max_cpu_time<=softmax"] is True
    assert "digits_dirichlet_accuracy>=0.975" not in goals

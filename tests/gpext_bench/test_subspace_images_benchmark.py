"""Tests of ``benchmarks/subspace_images.py``: goal bookkeeping, and a tiny end-to-end run."""

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
        spec = importlib.util.spec_from_file_location(
            "_subspace_images", BENCH / "subspace_images.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def _row(method, acc, nll, ece, ratio=1.0):
    se = math.sqrt(acc * (1 - acc) / 2000)
    return {"dataset": "mnist", "method": method, "accuracy": acc, "accuracy_se": se,
            "nll": nll, "ece": ece, "peak_mem_ratio": ratio}  # fmt: skip


def test_goals_follow_the_rows(bench):
    rows = [_row("plain", 0.97, 0.10, 0.010), _row("pca_ess", 0.966, 0.09, 0.008),
            _row("curve_ess", 0.99, 0.095, 0.001, ratio=1.1)]  # fmt: skip
    goals = bench.goals_of(rows)
    # the best subspace by NLL (pca_ess) is within max(se, 0.005) of plain's accuracy
    assert goals["best_subspace_beats_plain_nll_and_ece_at_no_accuracy_loss"]
    assert goals["peak_memory_independent_of_n"]
    rows[1]["accuracy"] = 0.96  # 0.01 below plain: an accuracy loss
    rows[2]["peak_mem_ratio"] = 1.3
    goals = bench.goals_of(rows)
    assert not goals["best_subspace_beats_plain_nll_and_ece_at_no_accuracy_loss"]
    assert not goals["peak_memory_independent_of_n"]


def test_tiny_run_writes_numeric_rows(bench, tmp_path):
    data_dir = bench.base_parser("").parse_args([]).data_dir  # $GPEXT_DATA_DIR or shared/data
    if not data_dir or not (Path(data_dir) / "mnist_test_idx").is_dir():
        pytest.skip("no MNIST data directory")
    assert bench.main(["--tiny", "--data-dir", data_dir, "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "subspace_images.json").read_text())
    assert (tmp_path / "subspace_images.md").exists()
    methods = {r["method"] for r in data["rows"]}
    assert set(bench.SUBSPACE_ARMS) | {"plain", "swa", "swag", "multiswag", "deep_ensemble",
                                        "lastlayer_swag"} == methods  # fmt: skip
    for row in data["rows"]:
        for key, value in row.items():
            if key not in ("dataset", "method"):
                assert isinstance(value, (int, float)), (key, value)
    assert all(isinstance(v, bool) for v in data["goals"].values())
    assert set(data["warnings"]) == methods

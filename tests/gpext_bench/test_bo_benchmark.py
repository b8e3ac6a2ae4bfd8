"""Tests of ``benchmarks/bo.py``: problems, regret convention, goals, resume and combine."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("botorch")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_bo_bench", BENCH / "bo.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up by name
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


def test_exp2d_optimum_matches_a_grid_search(bench):
    problem = bench.make_problem("exp2d")
    grid = torch.linspace(0, 1, 801, dtype=torch.float64)
    x = torch.cartesian_prod(grid, grid)
    y, feasible = problem.evaluate(x)
    assert feasible is None
    assert float(y.max()) == pytest.approx(problem.optimal_value, abs=1e-5)
    best = x[y.squeeze(-1).argmax()] * 8.0 - 2.0  # back to [-2, 6]^2
    assert best.tolist() == pytest.approx([-1 / math.sqrt(2), 0.0], abs=1e-2)


def test_constrained_regret_counts_only_feasible_points(bench):
    problem = bench.make_problem("chartmann6")
    assert problem.constrained and problem.optimal_value == pytest.approx(3.32237)
    x = torch.tensor([[0.2017, 0.1500, 0.4769, 0.2753, 0.3117, 0.6573], [1.0] * 6],
                     dtype=torch.float64)  # fmt: skip
    y, feasible = problem.evaluate(x)
    assert feasible.tolist() == [True, False]
    assert bench.best_value(problem, y, feasible) == pytest.approx(3.32237, abs=1e-3)
    # no feasible point: the worst feasible value, however good the infeasible objective is
    y_bad = torch.tensor([[5.0]], dtype=torch.float64)
    none = torch.tensor([False])
    assert bench.best_value(problem, y_bad, none) == problem.worst_feasible_value


def _run(dataset, method, seed, regret, seconds=1.0):
    return {"dataset": dataset, "method": method, "seed": seed, "config": "c",
            "simple_regret": regret, "initial_regret": 3.0, "seconds_per_iteration": seconds,
            "evaluations": 12, "coverage90": 0.5, "fits": 2, "error_fits": 0, "warned_fits": 1,
            "flat_fits": 0, "degenerate_fits": 1, "warnings": {"VarianceCollapseWarning": 1},
            "errors": []}  # fmt: skip


def test_goals_and_margins(bench):
    runs = []
    for s, (gp, ign, swag, vbll, rnd) in enumerate(
        [(1.0, 1.1, 2.0, 1.5, 2.5), (1.2, 1.3, 2.2, 1.7, 2.1)]
    ):
        for method, regret in zip(("singletaskgp", "ign", "swag", "vbll", "random"),
                                  (gp, ign, swag, vbll, rnd)):  # fmt: skip
            runs.append(_run("hartmann6", method, s, regret))
            runs.append(_run("exp2d", method, s, regret + (0.5 if method == "singletaskgp" else 0)))
    rows = bench.summarise(runs)
    by = {(r["dataset"], r["method"]): r for r in rows}
    assert by[("hartmann6", "ign")]["regret_mean"] == pytest.approx(1.2)
    assert by[("hartmann6", "ign")]["regret_se"] == pytest.approx(0.1)
    assert by[("hartmann6", "ign")]["degenerate_fits"] == 2
    assert by[("hartmann6", "random")]["time_ratio_vs_singletaskgp"] == pytest.approx(1.0)
    goals, margins = bench.goals_from(rows)
    assert all(isinstance(v, bool) for v in goals.values())
    assert goals["hartmann6_ign_beats_random"] and goals["hartmann6_swag_beats_random"]
    # ign 1.2 vs singletaskgp 1.1, se of the difference 0.1 * sqrt(2)
    assert goals["hartmann6_best_gpext_within_1se_of_singletaskgp"]
    assert margins["hartmann6_best_gpext_arm"] == "ign"
    assert margins["hartmann6_best_gpext_within_1se_of_singletaskgp"] == pytest.approx(
        -0.1 / (0.1 * math.sqrt(2))
    )
    assert goals["hartmann6_best_gpext_ahead_of_vbll"]
    assert goals["exp2d_a_gpext_surrogate_beats_singletaskgp"]
    # only two problems and two gpext arms were run: the overall goal is not met
    assert goals["every_gpext_surrogate_beats_random_on_every_problem"] is False
    assert bench.per_arm(runs, "warnings")["exp2d/ign"] == {"VarianceCollapseWarning": 2}


def test_tiny_run_resume_and_combine(bench, tmp_path):
    part_a, part_b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    common = ["--quick", "--iterations", "1", "--problems", "branin,chartmann6"]
    argv = [*common, "--arms", "random,singletaskgp,singletaskgp_constraints", "--seeds", "2",
            "--partial", str(part_a), "--out", str(tmp_path / "a")]  # fmt: skip
    assert bench.main(argv) == 0
    data = json.loads((tmp_path / "a" / "bo.json").read_text())
    assert (tmp_path / "a" / "bo.md").exists()
    pairs = {(r["dataset"], r["method"]) for r in data["rows"]}
    # the BoTorch-constraints arm runs on the constrained problem only
    assert ("branin", "singletaskgp_constraints") not in pairs
    assert ("chartmann6", "singletaskgp_constraints") in pairs
    for row in data["rows"]:
        assert row["seeds"] == 2 and row["evaluations"] in (6, 11)
        for key, value in row.items():
            if key not in ("dataset", "method"):
                assert isinstance(value, (int, float)) and math.isfinite(value), (key, value)
        assert row["error_fits"] == 0, data["errors"]
    assert all(isinstance(v, bool) for v in data["goals"].values())
    assert data["config"]["quick"] is True
    # a GP's uncertainty grows away from the evaluated points
    gp = [r for r in data["rows"] if r["method"] == "singletaskgp" and r["dataset"] == "branin"]
    assert gp[0]["sd_distance_corr"] > 0.3
    # resume: a second call with the same partial file reruns nothing
    lines = part_a.read_text().splitlines()
    assert bench.main(argv) == 0
    assert part_a.read_text().splitlines() == lines
    # another piece (a third seed), combined with the first
    argv_b = [*common, "--arms", "random", "--seed", "2", "--seeds", "1", "--partial",
              str(part_b), "--out", str(tmp_path / "b")]  # fmt: skip
    assert bench.main(argv_b) == 0
    out = tmp_path / "combined"
    assert bench.main(["--combine", str(part_a), str(part_b), "--out", str(out)]) == 0
    combined = json.loads((out / "bo.json").read_text())
    rows = {(r["dataset"], r["method"]): r for r in combined["rows"]}
    assert rows[("branin", "random")]["seeds"] == 3
    assert rows[("branin", "singletaskgp")]["seeds"] == 2
    assert combined["config"]["quick"] is True and combined["command"].startswith(
        "python benchmarks/bo.py --combine"
    )


def test_posterior_check_correlates_the_sd_with_the_distance_to_the_data(bench):
    x_train = torch.tensor([[0.2, 0.2], [0.8, 0.7]], dtype=torch.float64)

    class _Posterior:
        def __init__(self, sd):
            self.mean, self.variance = torch.zeros_like(sd), sd**2

    class _DistanceModel:  # sd = distance to the nearest training input, or to the centre
        def __init__(self, to_data):
            self.to_data = to_data

        def posterior(self, X):
            pts = X.squeeze(-2)
            ref = x_train if self.to_data else torch.full((1, 2), 0.5, dtype=pts.dtype)
            return _Posterior(torch.cdist(pts, ref).min(-1).values.reshape(-1, 1, 1))

    x_check = torch.rand(200, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    f_check = torch.zeros(200, 1, dtype=torch.float64)
    y = torch.tensor([[0.0], [1.0]], dtype=torch.float64)
    _, _, corr = bench.posterior_check(bench.Fitted(_DistanceModel(True)), x_check, f_check,
                                       y, x_train)  # fmt: skip
    assert corr == pytest.approx(1.0)
    _, _, corr = bench.posterior_check(bench.Fitted(_DistanceModel(False)), x_check, f_check,
                                       y, x_train)  # fmt: skip
    assert corr < 0.9
    # without training inputs: no correlation
    assert math.isnan(bench.posterior_check(bench.Fitted(_DistanceModel(True)), x_check,
                                            f_check, y)[2])  # fmt: skip

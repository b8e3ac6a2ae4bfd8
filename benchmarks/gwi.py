"""Benchmark of GWI (generalized variational inference with the Wasserstein-2 distance).

Regression on boston, concrete, energy, yacht (the 20 standard 90/10 splits): ``gwi`` against
``gpytorch_svgp`` and ``gpytorch_exact_gp``; test RMSE and NLL in original units, mean and
standard error over the splits.  Classification on digits and MNIST (8000/2000 images):
``gwi_robustmax`` against ``gpytorch_svgp_softmax``; accuracy, error, MNLL.

Goals (issue 8): GWI test NLL below SVGP's on at least 3 of the 4 regression sets (mean over the
splits); MNIST accuracy >= 0.97.  Both are evaluated here and written into the JSON, with the
paired per-split differences GWI - SVGP (mean, standard error, number of splits GWI wins), also
restricted to the splits that played no part in the development of the GWI settings
(``DEV_SPLITS``: splits 0-4 of boston and concrete were used to diagnose and compare designs).

GWI settings (fixed before the full run): the variational mean is the whitened expansion
``m_P + k_m(x, C) L_C^{-T} u + MLP(x)`` (``L_C L_C^T = K_m(C, C) + delta I``) with trainable
centres ``C`` (starting at the greedy subset ``Z``) and its own trainable copy ``k_m`` of the
prior kernel (the "adaptive" mean; the prior, ``Z`` and the covariance ``r`` keep the frozen
kernel and the fixed subset), trained at SVGP's learning rate 0.02; ``L`` and the noise at
1e-3.  Why adaptive: with a frozen exact-GP kernel and 64 fixed centres the mean underfits
(concrete split 0: sparse posterior mean RMSE 7.3 vs 4.9 for the exact GP).  Why whitened: the
previous run's mean (values ``v`` at the centres, ``k_m(x, C) K_m(C, C)^{-1} v``) ran away
outside the data in the 1-D tutorial.  Choices made on validation splits carved from the
training data (concrete and boston) and on the 1-D toy, never on test splits.

Per-fit budget.  The methods' full budgets (SVGP 256 inducing points and about 1500 Adam steps,
exact GP 150 steps, GWI 256 inducing points and 1500 steps) cost 1 to 3 minutes per fit on a
shared 2-core CPU, so 20 splits x 4 sets x 3 methods do not fit in half an hour.  By default
every method therefore runs with the *reduced* budget of ``gpext bench --quick`` (the same for
all methods: 64 inducing points and about 300 Adam steps for SVGP and GWI, 50 steps for the
exact GP; the GWI prior fit uses 50 exact-GP steps), on all 20 splits.  ``--fit-budget full``
runs the full per-fit budgets instead.  ``--quick`` runs split 0 only and writes to
``results/quick/``.

Usage::

    python benchmarks/gwi.py --quick                   # split 0, about 4 minutes
    python benchmarks/gwi.py                           # 20 splits, reduced per-fit budget
    python benchmarks/gwi.py --fit-budget full         # 20 splits, full per-fit budget (hours)
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import base_parser, out_dir  # noqa: E402

import gpext_bench.methods_gwi  # noqa: E402, F401  (registers gwi, gwi_robustmax)
from gpext_bench import (  # noqa: E402
    BenchConfig,
    aggregate_rows,
    format_markdown_table,
    run_benchmark,
    write_results,
)

REGRESSION = ("boston", "concrete", "energy", "yacht")
REG_METHODS = ("gwi", "gpytorch_svgp", "gpytorch_exact_gp")
CLASSIFICATION = ("digits", "mnist")
CLS_METHODS = ("gwi_robustmax", "gpytorch_svgp_softmax")
#: splits looked at while diagnosing and choosing the GWI settings (boston and concrete only)
DEV_SPLITS = frozenset(range(5))
COLUMNS = (
    "dataset", "method", "n", "rmse", "rmse_se", "nll", "nll_se", "coverage95",
    "accuracy", "error", "mnll", "mnll_se", "ece", "seconds",
)  # fmt: skip


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--splits", type=int, default=None, help="regression splits (20; quick 1)")
    parser.add_argument(
        "--fit-budget",
        choices=("reduced", "full"),
        default="reduced",
        help="per-fit budget of every method (default: the reduced budget of gpext bench --quick)",
    )
    parser.add_argument("--skip-classification", action="store_true")
    parser.add_argument("--skip-regression", action="store_true")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the rows of an earlier run in the output folder and run only what is missing",
    )
    parser.add_argument(
        "--redo",
        nargs="*",
        default=(),
        help="with --resume: drop the earlier rows of these datasets and run them again",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    config = BenchConfig(
        quick=args.quick or args.fit_budget == "reduced", seed=args.seed, show_progress=False
    )
    num_splits = args.splits or (1 if args.quick else 20)
    out = out_dir(args)
    t0 = time.perf_counter()
    rows: list[dict] = []
    failures: list = []
    splits_run: dict[str, list[int]] = {}
    done: set[tuple[str, str, int]] = set()
    previous = Path(out) / "gwi.json"
    if args.resume and previous.exists():
        old = json.loads(previous.read_text())
        rows.extend(r for r in old.get("rows", []) if r["dataset"] not in args.redo)
        done = {(r["dataset"], r["method"], r["split"]) for r in rows}
        for ds, splits in old.get("splits_run", {}).items():
            if ds not in args.redo:
                splits_run[ds] = list(splits)
        print(f"resuming with {len(rows)} rows from {previous}")

    def run(datasets, methods, split):
        datasets = [d for d in datasets if any((d, m, split) not in done for m in methods)]
        if not datasets:
            return
        res = run_benchmark(
            list(datasets), list(methods), config=config, data_dir=args.data_dir,
            splits=[split], keep_predictions=False,
        )  # fmt: skip
        for r in res.rows:
            if "error" in r:
                r["accuracy"] = 1.0 - r["error"]
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()})
        rows.extend(res.rows)
        failures.extend(res.failures)
        for ds in datasets:
            splits_run.setdefault(ds, []).append(split)
        sys.stdout.flush()

    def save(final: bool) -> None:
        agg, extra = summary(rows, failures, splits_run, t0, final, args, num_splits)
        write_results("gwi", rows, out, extra=extra, title="GWI benchmark")
        if final:
            cols = [c for c in COLUMNS if any(c in r for r in agg)]
            print(format_markdown_table(agg, cols))
            print("goals:", extra["goals"], extra["goal_notes"])

    if not args.skip_classification:
        for ds in CLASSIFICATION:
            run([ds], CLS_METHODS, 0)
            save(False)
    if not args.skip_regression:
        for split in range(num_splits):
            run(REGRESSION, REG_METHODS, split)
            save(False)
    save(True)


def paired_differences(rows, metric, exclude=frozenset()):
    """Per regression set: mean and standard error of GWI - SVGP over the shared splits."""
    out = {}
    for ds in REGRESSION:
        by = {}
        for r in rows:
            if r["dataset"] == ds and metric in r and r["split"] not in exclude:
                by.setdefault(r["split"], {})[r["method"]] = r[metric]
        d = [v["gwi"] - v["gpytorch_svgp"] for v in by.values() if len(v.keys() & _PAIR) == 2]
        if len(d) > 1:
            mean = sum(d) / len(d)
            se = math.sqrt(sum((x - mean) ** 2 for x in d) / (len(d) - 1) / len(d))
            out[ds] = {"mean": mean, "se": se, "n": len(d), "gwi_wins": sum(x < 0 for x in d)}
    return out


_PAIR = {"gwi", "gpytorch_svgp"}


def summary(rows, failures, splits_run, t0, final, args, num_splits):
    """Aggregate the rows and evaluate the issue's goals."""
    agg = aggregate_rows(rows)
    goals, notes = {}, {}
    nll = {(r["dataset"], r["method"]): r.get("nll") for r in agg if "nll" in r}
    have = [ds for ds in REGRESSION if (ds, "gwi") in nll and (ds, "gpytorch_svgp") in nll]
    wins = [ds for ds in have if nll[(ds, "gwi")] < nll[(ds, "gpytorch_svgp")]]
    if have:
        goals["gwi_nll_below_svgp_on_3_of_4_regression_sets"] = len(wins) >= 3
        notes["regression_sets_where_gwi_nll_below_svgp"] = wins
        notes["nll_gwi_minus_svgp"] = {
            ds: nll[(ds, "gwi")] - nll[(ds, "gpytorch_svgp")] for ds in have
        }
    notes["nll_gwi_minus_svgp_paired"] = paired_differences(rows, "nll")
    notes["nll_gwi_minus_svgp_paired_splits_not_used_in_development"] = paired_differences(
        rows, "nll", exclude=DEV_SPLITS
    )
    acc = [r["accuracy"] for r in agg if r["method"] == "gwi_robustmax" and r["dataset"] == "mnist"]
    if acc:
        goals["mnist_accuracy_ge_0.97"] = acc[0] >= 0.97
        notes["mnist_gwi_accuracy"] = acc[0]
    extra = {
        "goals": goals,
        "goal_notes": notes,
        "splits_run": splits_run,
        "complete": final,
        "fit_budget": "reduced (gpext bench --quick budgets)"
        if args.quick or (args.fit_budget == "reduced")
        else "full",
        "protocol_note": (
            f"regression: {num_splits} standard split(s) per set, every method with the same "
            "per-fit budget (inducing points, Adam steps, batch size); GWI's mean (whitened "
            "kernel expansion with trainable centres and kernel copy, plus an MLP) at "
            "SVGP's learning rate 0.02, L and noise at 1e-3; classification: digits (seeded random "
            "split 0) and MNIST "
            "8000/2000; 10% of each training split is held out inside GWI for early stopping "
            "and the temperature (the test split is never used for fitting or selection)"
        ),
        "aggregated": agg,
        "failures": failures,
        "seconds": time.perf_counter() - t0,
    }
    return agg, extra


if __name__ == "__main__":
    main()

"""Classification likelihoods benchmark (issue 3): robust max, Dirichlet GPs, GPyTorch baselines.

Datasets: digits (scikit-learn, bundled) and magic, htru2, letter (UCI, from ``--data-dir``), each
with one seeded stratified 80/20 split (split 0, seed 0; no official splits exist).  Methods:

* ``gpext_robust_max_svgp`` vs ``gpytorch_svgp_softmax`` (same SVGP, inducing points, budget);
* ``gpext_dirichlet_gp`` (exact for N <= 2000, sparse otherwise);
* ``gpytorch_dirichlet_exact`` (GPyTorch's recipe, 50 Adam steps; digits only).

Metrics: error, MNLL, ECE (10 bins), Brier, training-and-prediction seconds.  The goals of the
issue are evaluated on the rows of this run and written to the JSON.  The deterministic class
probability approximation of the Dirichlet transform is compared with Monte Carlo on the
exact digits model (``approx_vs_mc``).

Usage::

    python benchmarks/classification.py --quick     # about a minute or two
    python benchmarks/classification.py             # full run
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

import gpext.bench.methods_classification  # noqa: F401  (registers the methods)
from gpext.bench import BenchConfig, format_markdown_table, run_benchmark, write_results
from gpext.bench.results import invocation

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = ["dataset", "method", "error", "mnll", "ece", "brier", "seconds"]


def default_data_dir() -> str | None:
    env = os.environ.get("GPEXT_DATA_DIR")
    if env:
        return env
    shared = Path(__file__).resolve().parents[2] / "shared" / "data"
    return str(shared) if shared.exists() else None


def approx_vs_mc(data_dir: str | None, quick: bool) -> dict:
    """Error of the deterministic E[softmax] approximation against 20k-draw Monte Carlo."""
    from gpext.data import load_dataset
    from gpext.metrics import categorical_nll, error_rate
    from gpext.models import DirichletGPClassifier

    split = load_dataset("digits", data_dir=data_dir, dtype=torch.float64, seed=0)
    gen = torch.Generator().manual_seed(0)
    clf = DirichletGPClassifier(split.num_classes)
    clf.fit(
        split.train_x, split.train_y, max_iter=20 if quick else 40, hyper_subset=600, generator=gen
    )
    mc = clf.predict_proba(split.test_x, method="mc", num_samples=20000, generator=gen)
    t0 = time.perf_counter()
    approx = clf.predict_proba(split.test_x, method="approx")
    t_approx = time.perf_counter() - t0
    diff = (mc - approx).abs()
    return {
        "dataset": "digits",
        "max_abs_prob_diff": float(diff.max()),
        "mean_abs_prob_diff": float(diff.mean()),
        "mnll_mc": categorical_nll(mc, split.test_y),
        "mnll_approx": categorical_nll(approx, split.test_y),
        "error_mc": error_rate(mc, split.test_y),
        "error_approx": error_rate(approx, split.test_y),
        "approx_seconds": t_approx,
    }


def evaluate_goals(rows: list[dict]) -> dict:
    """The issue's goals, evaluated on this run's rows (missing rows give ``None``)."""
    by = {(r["dataset"], r["method"]): r for r in rows}

    def get(ds, m, key):
        r = by.get((ds, m))
        return None if r is None else r[key]

    goals = {}
    acc = get("digits", "gpext_dirichlet_gp", "error")
    mnll = get("digits", "gpext_dirichlet_gp", "mnll")
    t_ours = get("digits", "gpext_dirichlet_gp", "seconds")
    t_ref = get("digits", "gpytorch_dirichlet_exact", "seconds")
    if None not in (acc, mnll, t_ours, t_ref):
        goals["digits_dirichlet_accuracy>=0.975"] = 1 - acc >= 0.975
        goals["digits_dirichlet_mnll<=0.27"] = mnll <= 0.27
        goals["digits_dirichlet_time<=1/3_gpytorch_exact"] = t_ours <= t_ref / 3
    for ds in sorted({r["dataset"] for r in rows}):
        e_rm = get(ds, "gpext_robust_max_svgp", "error")
        e_sm = get(ds, "gpytorch_svgp_softmax", "error")
        t_rm = get(ds, "gpext_robust_max_svgp", "seconds")
        t_sm = get(ds, "gpytorch_svgp_softmax", "seconds")
        if None not in (e_rm, e_sm, t_rm, t_sm):
            goals[f"{ds}_robust_max_error<=softmax"] = e_rm <= e_sm
            goals[f"{ds}_robust_max_time<=softmax"] = t_rm <= t_sm
    limits = {"letter": ("error", 0.08), "magic": ("error", 0.14), "htru2": ("error", 0.025)}
    for ds, (key, lim) in limits.items():
        v = get(ds, "gpext_dirichlet_gp", key)
        if v is not None:
            goals[f"{ds}_dirichlet_{key}<={lim}"] = v <= lim
    v = get("letter", "gpext_dirichlet_gp", "mnll")
    if v is not None:
        goals["letter_dirichlet_mnll<=0.30"] = v <= 0.30
    return goals


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default=default_data_dir())
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument("--out", default=None)
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default 2)")
    parser.add_argument("--skip-approx", action="store_true", help="skip the approx-vs-MC check")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = BenchConfig(quick=args.quick, seed=0, dtype=torch.float64, show_progress=False)
    datasets = args.datasets or ["digits", "htru2", "magic", "letter"]
    if args.data_dir is None:
        datasets = [d for d in datasets if d == "digits"]
        print("no data dir: running digits only", file=sys.stderr)
    common = ["gpext_dirichlet_gp", "gpext_robust_max_svgp", "gpytorch_svgp_softmax"]
    rows, failures = [], []
    out = args.out or str(ROOT / "benchmarks" / "results" / ("quick" if args.quick else ""))
    extra: dict = {}
    for ds in datasets:
        methods = common + (["gpytorch_dirichlet_exact"] if ds == "digits" else [])
        run = run_benchmark(
            [ds], methods, config=config, data_dir=args.data_dir, splits=[0], keep_predictions=False
        )
        rows.extend({k: r[k] for k in COLUMNS if k in r} for r in run.rows)
        failures.extend(run.failures)
        for r in run.rows:
            print(f"{r['dataset']:8s} {r['method']:26s} error={r['error']:.4f} mnll={r['mnll']:.4f} "
                  f"ece={r['ece']:.4f} seconds={r['seconds']:.1f}", flush=True)  # fmt: skip
        # write after every dataset so that a long run leaves partial results
        extra = {
            "goals": evaluate_goals(rows),
            "protocol": "split 0 (seed 0), stratified 80/20 (digits: loader default), float64, "
            f"{args.threads} CPU threads; seconds = fit + predict",
            "datasets_done": [r for r in dict.fromkeys(x["dataset"] for x in rows)],
        }
        if failures:
            extra["failures"] = failures
        write_results(
            "classification",
            rows,
            out,
            command=invocation(),
            extra=extra,
            title="Classification likelihoods",
        )
    if not args.skip_approx:
        extra["approx_vs_mc"] = approx_vs_mc(args.data_dir, args.quick)
        write_results(
            "classification",
            rows,
            out,
            command=invocation(),
            extra=extra,
            title="Classification likelihoods",
        )
    goals = extra.get("goals", {})
    print(format_markdown_table(rows, COLUMNS))
    for k, v in goals.items():
        print(f"{k}: {'met' if v else 'MISSED'}")
    print("approx_vs_mc:", extra.get("approx_vs_mc"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: inducing GP networks (002) against GPyTorch SVGP and deep-kernel SVGP.

Regression on the deep-kernel-learning 10-fold splits of elevators, pol, keggdirected, protein
and bike (first ``--folds`` folds), metrics RMSE and test NLL in original units and seconds;
IGN, GPyTorch's input-space SVGP and a deep-kernel SVGP share epochs, minibatch size and the
number of inducing points (:func:`gpext.bench.methods_ign.ign_budget`).  Classification on
scikit-learn's digits and on the 10000 MNIST test images split 8000/2000: IGN (one-vs-all
probit with Laplace, and with the Dirichlet transform), the deep-kernel SVGP (softmax) and the
plain network, all on the same embedding and epochs.

Every fit runs single-threaded (``torch.set_num_threads(1)``, the same for all methods) because
the benchmark machine's cores are shared; float32 throughout.

Usage::

    python benchmarks/ign.py --quick     # elevators + pol (1 fold), digits; about two minutes
    python benchmarks/ign.py             # full: 5 regression sets x --folds, digits, MNIST
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch

from gpext.bench import aggregate_rows, format_markdown_table, write_results
from gpext.bench import methods_ign as M
from gpext.bench.registry import BenchConfig
from gpext.bench.runner import evaluate_prediction
from gpext.data import load_dataset
from gpext.errors import DatasetNotFoundError

REGRESSION = ("elevators", "pol", "keggdirected", "protein", "bike")
CLASSIFICATION = ("digits", "mnist")


def _default_data_dir() -> str | None:
    if os.environ.get("GPEXT_DATA_DIR"):
        return os.environ["GPEXT_DATA_DIR"]
    cand = Path(__file__).resolve().parents[2] / "shared" / "data"
    return str(cand) if cand.exists() else None


def _dirichlet_available() -> bool:
    try:
        from gpext.likelihoods import DirichletTransform  # noqa: F401
    except ImportError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--folds", type=int, default=2, help="regression folds (full run)")
    parser.add_argument("--data-dir", default=_default_data_dir())
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = BenchConfig(quick=args.quick, seed=args.seed, dtype=torch.float32, show_progress=False)
    regression = ("elevators", "pol") if args.quick else REGRESSION
    classification = ("digits",) if args.quick else CLASSIFICATION
    folds = 1 if args.quick else args.folds
    reg_methods = {
        "ign": M.fit_predict_ign,
        "gpytorch_svgp": M.fit_predict_svgp,
        "dkl_svgp": M.fit_predict_dkl_svgp,
    }
    cls_methods = {
        "ign_ova": lambda s, c: M.fit_predict_ign(s, c, task="one_vs_all"),
        "dkl_svgp_softmax": M.fit_predict_dkl_svgp,
        "nn_classifier": M.fit_predict_nn_classifier,
    }
    if _dirichlet_available():
        cls_methods["ign_dirichlet"] = lambda s, c: M.fit_predict_ign(s, c, task="dirichlet")
    rows = []
    jobs = [(d, f, reg_methods) for d in regression for f in range(folds)]
    jobs += [(d, 0, cls_methods) for d in classification]
    budgets = {}
    for name, fold, methods in jobs:
        try:
            split = load_dataset(name, split=fold, data_dir=args.data_dir, dtype=torch.float32)
        except DatasetNotFoundError:  # the MNIST folder is also known by its folder name
            split = load_dataset(
                f"{name}_test_idx", split=fold, data_dir=args.data_dir, dtype=torch.float32
            )
        for method, fn in methods.items():
            cfg = BenchConfig(
                quick=config.quick, seed=config.seed + 1000 * fold, dtype=config.dtype,
                show_progress=False,
            )  # fmt: skip
            budgets[name] = M.ign_budget(split, cfg)
            t0 = time.perf_counter()
            pred = fn(split, cfg)
            seconds = time.perf_counter() - t0
            scores = evaluate_prediction(split, pred)
            if split.task == "classification":
                scores = {"accuracy": 1.0 - scores["error"], **scores}
            row = {"dataset": name, "method": method, "split": fold, **scores, "seconds": seconds}
            rows.append(row)
            print(
                {k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True
            )
    agg = aggregate_rows(rows)
    for r in agg:
        r.pop("n", None)
        r["n_folds"] = sum(
            1 for x in rows if x["dataset"] == r["dataset"] and x["method"] == r["method"]
        )

    def metric(ds, method, key):
        return next(r[key] for r in agg if r["dataset"] == ds and r["method"] == method)

    below_svgp = [
        d for d in regression if metric(d, "ign", "rmse") < metric(d, "gpytorch_svgp", "rmse")
    ]
    below_dkl = [d for d in regression if metric(d, "ign", "rmse") < metric(d, "dkl_svgp", "rmse")]
    t_ign = sum(r["seconds"] for r in rows if r["method"] == "ign")
    t_svgp = sum(r["seconds"] for r in rows if r["method"] == "gpytorch_svgp")
    ratios = {
        d: metric(d, "ign", "seconds") / metric(d, "gpytorch_svgp", "seconds") for d in regression
    }
    goals = {
        "ign_rmse_below_svgp_on_4_of_5": len(below_svgp) >= min(4, len(regression)),
        "ign_rmse_below_dkl_svgp_on_3_of_5": len(below_dkl) >= min(3, len(regression)),
        "ign_total_time_at_most_1.5x_svgp": t_ign <= 1.5 * t_svgp,
    }
    if "mnist" in classification:
        goals["ign_mnist8k_accuracy_at_least_0.97"] = metric("mnist", "ign_ova", "accuracy") >= 0.97
    details = {
        "ign_below_svgp": below_svgp,
        "ign_below_dkl_svgp": below_dkl,
        "time_ratio_ign_over_svgp_total": t_ign / t_svgp,
        "time_ratio_ign_over_svgp_per_dataset": ratios,
    }
    protocol = {
        "quick": args.quick,
        "regression_folds": list(range(folds)),
        "budgets": budgets,
        "dtype": "float32",
        "threads": 1,
        "regression_embedding": "MLP(D, [64, 64], 8)",
        "classification_embedding": "SmallCNN(16, layer_norm=True) for MNIST, MLP(64, [64, 64], 16, layer_norm=True) for digits",
        "dirichlet_transform": "ign_dirichlet" in cls_methods,
    }
    out = args.out or str(
        Path(__file__).resolve().parent / "results" / ("quick" if args.quick else "")
    )
    write_results(
        "ign", agg, out, extra={"goals": goals, "goal_details": details, "protocol": protocol, "fold_rows": rows},
        title="Inducing GP networks (002) vs SVGP and deep-kernel SVGP",
    )  # fmt: skip
    print(format_markdown_table(agg))
    print("goals:", goals)
    print("details:", details)


if __name__ == "__main__":
    main()

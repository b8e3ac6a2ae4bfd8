"""Variational bootstrap for classification (001): accuracy, scaling and vectorisation.

Three parts, all in one run:

1. Accuracy (001 Tables 2-3): magic, htru2, letter (5000 test points, seeded stratified splits),
   methods VBoot-MLP (2 x 512 ReLU, 10 particles), VBoot-RFF (5000 features, 50 particles), the
   gpext Dirichlet GP (if registered) and GPyTorch SVGP + SoftmaxLikelihood (run with the
   baseline's quick budget, 64 inducing points and 300 steps, in every mode: its full budget
   does not fit a 2-core run on letter); metrics error, MNLL, seconds.
2. Scaling (001 Fig. 3): training time of VBoot-RFF (full fits: frequencies, features, all 50
   particles; hyperparameters fitted once beforehand and timed separately) and of SVGP
   (seconds per optimisation step, median of timed steps after a warm-up, times the number of
   steps of the SVGP baseline's schedule; a full SVGP fit per size does not fit in the time
   budget on this machine, so its total is extrapolated from measured step times) against the
   number of features / inducing points.
3. Vectorisation: VBoot-MLP with K = 10 particles trained as one vectorised ensemble against
   the same 10 particles trained one after another (the subset API, one particle per fit), same
   epochs, batch and data.

    python benchmarks/vboot.py --quick      # small subsets, about a few minutes on 2 busy cores
    python benchmarks/vboot.py              # full run (see --seeds, --mlp-epochs)
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch
from _common import base_parser, out_dir

import gpext.bench.methods_bootstrap as mb
from gpext.bench import (
    BenchConfig,
    aggregate_rows,
    evaluate_prediction,
    format_markdown_table,
    get_method,
    write_results,
)
from gpext.bench.baselines import SVGPModel, select_inducing_points
from gpext.bench.results import invocation
from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.data import load_dataset
from gpext.errors import GpextError

DATASETS = ("magic", "htru2", "letter")
# 001 Table 2 (error) and Table 3 (MNLL)
PAPER = {
    ("magic", "vboot_mlp"): (0.12, 0.31),
    ("magic", "vboot_rff"): (0.13, 0.33),
    ("htru2", "vboot_mlp"): (0.02, 0.08),
    ("htru2", "vboot_rff"): (0.02, 0.07),
    ("letter", "vboot_mlp"): (0.05, 0.31),
    ("letter", "vboot_rff"): (0.05, 0.28),
}


def _subsample(split, n_train, n_test, seed):
    gen = torch.Generator().manual_seed(seed)
    tr = torch.randperm(split.num_train, generator=gen)[:n_train]
    te = torch.randperm(split.num_test, generator=gen)[:n_test]
    return replace(
        split,
        train_x=split.train_x[tr],
        train_y=split.train_y[tr],
        test_x=split.test_x[te],
        test_y=split.test_y[te],
        train_indices=None,
        test_indices=None,
    )


def _dirichlet_gp_method():
    """The gpext Dirichlet GP classifier registered by the likelihoods capability, if present."""
    try:
        importlib.import_module("gpext.bench.methods_classification")
        return get_method("gpext_dirichlet_gp")
    except (ImportError, GpextError):
        return None


def accuracy_part(args, cfg, seeds):
    settings = {
        "vboot_mlp": dict(
            num_particles=cfg.budget(5, 10),
            hidden_sizes=cfg.budget((128, 128), (512, 512)),
            num_epochs=cfg.budget(10, args.mlp_epochs),
            min_steps=cfg.budget(150, 0),
            batch_size=cfg.budget(128, 512),
            lr=3e-3,
        ),
        "vboot_rff": dict(
            num_features=cfg.budget(500, 5000),
            num_particles=cfg.budget(20, 50),
            hyper_num_points=cfg.budget(300, 1000),
        ),
    }
    methods = {
        "vboot_mlp": lambda s, c: mb.fit_predict_vboot_mlp(s, c, **settings["vboot_mlp"]),
        "vboot_rff": lambda s, c: mb.fit_predict_vboot_rff(s, c, **settings["vboot_rff"]),
    }
    dgp = _dirichlet_gp_method()
    if dgp is not None:
        methods[dgp.name] = dgp.fit_predict
    svgp = get_method("gpytorch_svgp_softmax").fit_predict
    # the baseline's quick budget (64 inducing points, 300 steps) in every mode: its full budget
    # (256 points, 1500 steps, 26 latent GPs on letter) does not fit the time of a 2-core run
    methods["gpytorch_svgp_softmax"] = lambda s, c: svgp(s, replace(c, quick=True))
    if args.methods:
        methods = {k: v for k, v in methods.items() if k in args.methods.split(",")}
    rows, failures = [], []
    for name in DATASETS:
        for seed in seeds:
            split = load_dataset(
                name, split=seed, data_dir=args.data_dir, test_size=5000, seed=args.seed
            )
            if cfg.quick:
                split = _subsample(split, 1500, 1000, seed)
            for method, fn in methods.items():
                torch.manual_seed(args.seed + 1000 * seed)
                c = replace(cfg, seed=args.seed + 1000 * seed)
                t0 = time.perf_counter()
                try:
                    pred = fn(split, c)
                except Exception as err:  # record and go on; reported in the JSON
                    failures.append({"dataset": name, "method": method, "error": repr(err)})
                    print(f"FAILED {name}/{seed} {method}: {err!r}", flush=True)
                    continue
                seconds = time.perf_counter() - t0
                scores = evaluate_prediction(split, pred)
                row = {"dataset": name, "method": method, "seed": seed}
                row.update({k: scores[k] for k in ("error", "mnll", "ece")})
                row["seconds"] = seconds
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows, failures, settings, (dgp.name if dgp else None)


def _svgp_step_seconds(split, m, cfg, n_timed):
    """Median seconds per SVGP-softmax Adam step (batch 256) with ``m`` inducing points.

    One untimed warm-up step precedes the timed ones for ``m <= 1000``; beyond, a step takes
    seconds to minutes and is dominated by the ``m x m`` factorisations, so no warm-up is run.
    """
    import gpytorch

    gen = torch.Generator().manual_seed(cfg.seed)
    x, y = split.train_x, split.train_y
    c = int(split.num_classes)
    model = SVGPModel(select_inducing_points(x, m, gen), num_latents=c).to(x)
    lik = gpytorch.likelihoods.SoftmaxLikelihood(
        num_features=c, num_classes=c, mixing_weights=False
    )
    lik = lik.to(x)
    mll = gpytorch.mlls.VariationalELBO(lik, model, num_data=x.shape[0])
    opt = torch.optim.Adam([*model.parameters(), *lik.parameters()], lr=0.02)
    model.train()
    lik.train()
    times = []
    warm = 1 if m <= 1000 else 0
    for i in range(n_timed + warm):
        idx = torch.randint(0, x.shape[0], (256,), generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = -mll(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        if i >= warm:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def scaling_part(args, cfg):
    sizes = cfg.budget([250, 500, 1000], [500, 1000, 2000, 3000, 5000])
    split = load_dataset("magic", split=0, data_dir=args.data_dir, test_size=5000, seed=args.seed)
    if cfg.quick:
        split = _subsample(split, 3000, 1000, 0)
    n = split.num_train
    # steps of the registered SVGP baseline's schedule (gpext.bench.baselines)
    batch = min(n, 256)
    epochs = max(1, cfg.budget(300, 1500) * batch // n)
    svgp_steps = epochs * math.ceil(n / batch)
    gen = torch.Generator().manual_seed(cfg.seed)
    t0 = time.perf_counter()
    probe = VBootRFF(2, 1, task="classification", num_classes=2, hyper_num_points=1000)
    probe.fit(split.train_x, split.train_y, generator=gen)
    hyper_seconds = time.perf_counter() - t0
    hp = probe.hyperparameters
    rows = []
    for m in sizes:
        model = VBootRFF(
            m, 50, task="classification", num_classes=2, lengthscale=hp.lengthscale,
            outputscale=hp.outputscale, mean=hp.mean,
        )  # fmt: skip
        t0 = time.perf_counter()
        model.fit(split.train_x, split.train_y, generator=torch.Generator().manual_seed(m))
        rff_seconds = time.perf_counter() - t0
        err = float((model.predict_proba(split.test_x).argmax(-1) != split.test_y).double().mean())
        step = _svgp_step_seconds(split, m, cfg, n_timed=3 if m <= 1000 else 1)
        row = {
            "dataset": "magic",
            "size": m,
            "vboot_rff_seconds": rff_seconds,
            "vboot_rff_error": err,
            "svgp_seconds_per_step": step,
            "svgp_steps": svgp_steps,
            "svgp_seconds_extrapolated": step * svgp_steps,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows, hyper_seconds


def vectorisation_part(args, cfg):
    split = load_dataset("magic", split=0, data_dir=args.data_dir, test_size=5000, seed=args.seed)
    if cfg.quick:
        split = _subsample(split, 3000, 1000, 0)
    x = split.train_x.float()
    y = split.train_y
    hidden = cfg.budget((128, 128), (512, 512))
    kw = dict(num_epochs=1, batch_size=512, lr=3e-3)
    k = 10
    make = lambda: VBootMLP(k, hidden, task="classification", num_classes=2, seed=cfg.seed)  # noqa: E731
    t0 = time.perf_counter()
    joint = make().fit(x, y, **kw)
    vec = time.perf_counter() - t0
    t0 = time.perf_counter()
    parts = [make().fit(x, y, particle_indices=[i], **kw) for i in range(k)]
    seq = time.perf_counter() - t0
    merged = VBootMLP.merge(parts)
    test = split.test_x.float()
    with torch.no_grad():
        max_diff = float((merged(test) - joint(test)).abs().max())
    return {
        "num_particles": k,
        "hidden_sizes": list(hidden),
        "epochs": 1,
        "batch_size": 512,
        "num_train": int(x.shape[0]),
        "vectorised_seconds": vec,
        "sequential_seconds": seq,
        "speedup": seq / vec,
        "max_abs_output_diff_merged_vs_joint": max_diff,
    }


def main():
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument(
        "--seeds", type=int, default=None, help="splits per dataset (default 1 quick / 2 full)"
    )
    p.add_argument("--mlp-epochs", type=int, default=12, help="VBoot-MLP epochs in the full run")
    p.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on busy cores)"
    )
    p.add_argument("--parts", default="accuracy,scaling,vectorisation")
    p.add_argument("--methods", default=None, help="comma-separated subset of the accuracy methods")
    p.add_argument(
        "--append-from",
        default=None,
        help="run nothing; add the accuracy rows of another vboot.json (e.g. a --methods run "
        "made in parallel with --out elsewhere) to the results file",
    )
    p.add_argument(
        "--append",
        action="store_true",
        help="add this run's accuracy rows to the existing results file (other parts kept)",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = BenchConfig(quick=args.quick, seed=args.seed, dtype=torch.float64, show_progress=False)
    seeds = list(range(args.seeds if args.seeds is not None else cfg.budget(1, 2)))
    parts = args.parts.split(",")
    t_start = time.perf_counter()
    extra = {"seeds": seeds, "threads": args.threads, "quick": args.quick}
    rows = []
    goals = {}
    previous = None
    if args.append or args.append_from:
        previous = json.loads((out_dir(args) / "vboot.json").read_text())
        for key in ("scaling", "scaling_hyperparameter_fit_seconds", "vectorisation"):
            if key in previous:
                extra[key] = previous[key]
        goals.update(previous.get("goals", {}))
        extra["commands"] = previous.get("commands", [previous["command"]])
    if args.append_from:
        other = json.loads(Path(args.append_from).read_text())
        extra["commands"] = [*extra["commands"], other["command"]]
        extra["appended_run_seconds"] = other.get("total_seconds")
        parts = ["accuracy"]
    if "accuracy" in parts:
        if args.append_from:
            rows, failures = other["rows"], other.get("failures", [])
            settings, dgp = other.get("settings", {}), other.get("dirichlet_gp_method")
        else:
            rows, failures, settings, dgp = accuracy_part(args, cfg, seeds)
        if previous is not None:
            rows = previous["rows"] + rows
            failures = previous.get("failures", []) + failures
            settings = previous.get("settings", settings)
            dgp = dgp or previous.get("dirichlet_gp_method")
        agg = aggregate_rows(rows)
        extra.update(
            {
                "settings": settings,
                "dirichlet_gp_method": dgp,
                "failures": failures,
                "aggregate": agg,
            }
        )
        for (ds, method), (err, mnll) in PAPER.items():
            got = [r for r in agg if r["dataset"] == ds and r["method"] == method]
            if got:
                ok = got[0]["error"] <= err + 0.01 and got[0]["mnll"] <= mnll + 0.03
                goals[f"{method}_{ds}_within_paper(+0.01 err,+0.03 mnll)"] = bool(ok)
        print(
            format_markdown_table(
                agg, ["dataset", "method", "error", "mnll", "ece", "seconds", "n"]
            )
        )
    if "scaling" in parts:
        scaling, hyper_seconds = scaling_part(args, cfg)
        extra["scaling"] = scaling
        extra["scaling_hyperparameter_fit_seconds"] = hyper_seconds
        big = [r for r in scaling if r["size"] >= 2000]
        if big:
            goals["vboot_rff_faster_than_svgp_from_2000"] = all(
                r["vboot_rff_seconds"] < r["svgp_seconds_extrapolated"] for r in big
            )
        print(format_markdown_table(scaling))
    if "vectorisation" in parts:
        vec = vectorisation_part(args, cfg)
        extra["vectorisation"] = vec
        goals["vectorised_mlp_k10_at_least_4x"] = bool(vec["speedup"] >= 4.0)
        print(json.dumps(vec))
    extra["goals"] = goals
    extra["total_seconds"] = time.perf_counter() - t_start
    if previous is not None:
        extra["commands"] = [*extra["commands"], invocation()]
        extra["total_seconds"] += previous.get("total_seconds", 0.0)
    print(json.dumps(goals, indent=1))
    write_results("vboot", rows, out_dir(args), extra=extra, title="Variational bootstrap (001)")


if __name__ == "__main__":
    main()

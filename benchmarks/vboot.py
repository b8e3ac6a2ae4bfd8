"""Variational bootstrap for classification (001): accuracy, scaling and vectorisation.

Three parts, all in one run:

1. Accuracy (001 Tables 2-3): magic, htru2, letter (5000 test points, seeded stratified splits),
   methods VBoot-MLP (2 x 512 ReLU, 10 particles; Adam lr 0.1 for the NTK parameterisation,
   batch 256, cosine decay, 12 epochs where 001 trains 200: what one CPU core affords),
   VBoot-RFF (5000 features, 50 particles), the gpext Dirichlet GP (if registered) and
   GPyTorch SVGP + SoftmaxLikelihood (run with the baseline's quick budget, 64 inducing points
   and 300 steps, in every mode: its full budget does not fit a 2-core run on letter); metrics
   error, MNLL, seconds.
2. Scaling (001 Fig. 3): training time of VBoot-RFF (full fits: frequencies, features, all 50
   particles; hyperparameters fitted once beforehand and timed separately) and of SVGP
   (seconds per optimisation step, median of timed steps after a warm-up, times the number of
   steps of the SVGP baseline's schedule; a full SVGP fit per size does not fit in the time
   budget on this machine, so its total is extrapolated from measured step times) against the
   number of features / inducing points.
3. Vectorisation: VBoot-MLP with K = 10 particles trained as one vectorised ensemble against
   the same 10 particles trained one after another (the subset API, one particle per fit), same
   epochs, batch and data, single-threaded, interleaved; at the benchmark's network and batch
   and at two overhead-bound configurations, with the fixed per-step cost measured apart.

    python benchmarks/vboot.py --quick      # small subsets, about a few minutes on 2 busy cores
    python benchmarks/vboot.py              # full run (see --seeds, --mlp-epochs)
    python benchmarks/vboot.py --reuse vboot_rff,gpext_dirichlet_gp,gpytorch_svgp_softmax,scaling
                                            # re-run only VBoot-MLP and the vectorisation part;
                                            # the named arms' rows are copied from the existing
                                            # results file and marked as reused in the JSON
"""

from __future__ import annotations

import importlib
import json
import math
import statistics
import subprocess
import time
from dataclasses import replace

import torch
from _common import REPO, base_parser, out_dir

import gpext_bench.methods_bootstrap as mb
from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.errors import GpextError
from gpext_bench import (
    BenchConfig,
    aggregate_rows,
    evaluate_prediction,
    format_markdown_table,
    get_method,
    write_results,
)
from gpext_bench.baselines import SVGPModel, select_inducing_points
from gpext_bench.data import load_dataset

DATASETS = ("magic", "htru2", "letter")
ALL_METHODS = ("vboot_mlp", "vboot_rff", "gpext_dirichlet_gp", "gpytorch_svgp_softmax")
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
        importlib.import_module("gpext_bench.methods_classification")
        return get_method("gpext_dirichlet_gp")
    except (ImportError, GpextError):
        return None


def accuracy_part(args, cfg, seeds, done=frozenset()):
    settings = {
        "vboot_mlp": dict(
            num_particles=cfg.budget(5, 10),
            hidden_sizes=cfg.budget((128, 128), (512, 512)),
            num_epochs=cfg.budget(10, args.mlp_epochs),
            min_steps=cfg.budget(150, 0),
            batch_size=cfg.budget(128, 256),
            lr=0.1,
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
            todo = [m for m in methods if (name, m, seed) not in done]
            if not todo:
                continue
            split = load_dataset(
                name, split=seed, data_dir=args.data_dir, test_size=5000, seed=args.seed
            )
            if cfg.quick:
                split = _subsample(split, 1500, 1000, seed)
            for method in todo:
                fn = methods[method]
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
    # steps of the registered SVGP baseline's schedule (gpext_bench.baselines)
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


def _overhead_step_seconds(repeats=200):
    """Seconds of one training step of a 1-particle 2 x 8 network on 8 points.

    Its matmuls are negligible, so this is the fixed per-step cost (Python, autograd, the
    optimizer and kernel launches) that vectorisation removes ``K - 1`` times per step.
    """
    x = torch.randn(8, 10)
    y = torch.randint(0, 2, (8,))
    model = VBootMLP(1, (8, 8), task="classification", num_classes=2)
    model.fit(x, y, num_epochs=3, batch_size=8)  # warm-up
    t0 = time.perf_counter()
    model.fit(x, y, num_epochs=repeats, batch_size=8)
    return (time.perf_counter() - t0) / repeats


def vectorisation_part(args, cfg):
    """Vectorised K = 10 training against the same particles trained one after another.

    Both arms run single-threaded on the same data for one epoch with the same batch, and each
    pair is timed interleaved (vectorised, sequential, sequential, vectorised) so that load
    changes of the shared machine hit both; the ratio of the summed times is reported.  The
    benchmark's own network and batch (2 x 512, batch 256) come first; two overhead-bound
    configurations (small batch, small network) show what vectorisation buys when the per-step
    fixed cost, not the matmul FLOPs, dominates.
    """
    split = load_dataset("magic", split=0, data_dir=args.data_dir, test_size=5000, seed=args.seed)
    x = split.train_x.float()
    y = split.train_y
    k = 10
    configs = [
        ("benchmark network and batch", cfg.budget((128, 128), (512, 512)), 256, cfg.budget(3000, x.shape[0])),
        ("same network, batch 32", cfg.budget((128, 128), (512, 512)), 32, cfg.budget(1024, 4096)),
        ("small network 2 x 64, batch 256", (64, 64), 256, cfg.budget(3000, x.shape[0])),
    ]  # fmt: skip
    overhead = _overhead_step_seconds()
    out = {"num_particles": k, "epochs": 1, "threads": torch.get_num_threads()}
    out["fixed_seconds_per_step"] = overhead
    rows = []
    for label, hidden, batch, n in configs:
        xs, ys = x[:n], y[:n]
        kw = dict(num_epochs=1, batch_size=batch)
        make = lambda h=hidden: VBootMLP(k, h, task="classification", num_classes=2, seed=cfg.seed)  # noqa: E731
        vec_t, seq_t = [], []
        for arm in "vssv":  # interleaved: load changes of the shared machine hit both arms
            t0 = time.perf_counter()
            if arm == "v":
                joint = make()
                joint.fit(xs, ys, **kw)
                vec_t.append(time.perf_counter() - t0)
            else:
                parts = [make() for _ in range(k)]
                for i, part in enumerate(parts):
                    part.fit(xs, ys, particle_indices=[i], **kw)
                seq_t.append(time.perf_counter() - t0)
        with torch.no_grad():
            max_diff = float(
                (VBootMLP.merge(parts)(split.test_x.float()) - joint(split.test_x.float()))
                .abs()
                .max()
            )
        steps = n // batch
        sizes = [x.shape[1], *hidden, 2]
        flops_step = 6 * batch * sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))  # fwd + bwd
        vec_step = statistics.mean(vec_t) / steps
        seq_step = statistics.mean(seq_t) / (k * steps)
        rows.append(
            {
                "config": label,
                "hidden_sizes": list(hidden),
                "batch_size": batch,
                "num_train": n,
                "steps": steps,
                "vectorised_seconds": vec_t,
                "sequential_seconds": seq_t,
                "speedup": sum(seq_t) / sum(vec_t),
                "vectorised_seconds_per_particle_step": vec_step / k,
                "sequential_seconds_per_particle_step": seq_step,
                "fixed_overhead_share_of_sequential_step": min(1.0, overhead / seq_step),
                "sequential_gflops": flops_step / seq_step / 1e9,
                "vectorised_gflops": k * flops_step / vec_step / 1e9,
                "max_abs_output_diff_merged_vs_joint": max_diff,
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    out["configs"] = rows
    out["speedup"] = rows[0]["speedup"]
    return out


def _git_commit(path):
    """The last commit that touched ``path`` (short hash), or ``None`` outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "log", "-1", "--format=%h %cI", "--", str(path)],
            cwd=REPO, capture_output=True, text=True, check=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


REUSABLE_PARTS = {
    "scaling": ("scaling", "scaling_hyperparameter_fit_seconds"),
    "vectorisation": ("vectorisation",),
}


def _load_reused(args, arms):
    """Rows and parts of the existing results file for the arms named in ``--reuse``."""
    path = out_dir(args) / "vboot.json"
    previous = json.loads(path.read_text())
    rows = [
        {**r, "source": "reused"}
        for r in previous["rows"]
        if r.get("method") in arms and "dataset" in r
    ]
    parts = {
        key: previous[key]
        for arm in arms & REUSABLE_PARTS.keys()
        for key in REUSABLE_PARTS[arm]
        if key in previous
    }
    info = {
        "file": str(path.relative_to(REPO) if path.is_relative_to(REPO) else path),
        "file_last_commit": _git_commit(path),
        "arms": sorted(arms),
        "commands_that_produced_them": previous.get("commands", [previous.get("command")]),
        "note": "rows and parts copied verbatim from the previous results file, not re-run "
        "(marked source=reused); they reflect the code at file_last_commit, not later changes "
        "to those arms",
    }
    return rows, parts, info


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
        "--reuse",
        default=None,
        help="comma-separated accuracy methods (and/or 'scaling', 'vectorisation') whose rows "
        "are copied from the "
        "existing results file instead of being run; recorded under 'reused' in the JSON",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="keep the accuracy rows (dataset, method, seed) the results file already has "
        "(marked source=earlier run) and run only the missing ones, e.g. --seeds 3 adds seed 2",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = BenchConfig(quick=args.quick, seed=args.seed, dtype=torch.float64, show_progress=False)
    seeds = list(range(args.seeds if args.seeds is not None else cfg.budget(1, 2)))
    parts = args.parts.split(",")
    t_start = time.perf_counter()
    extra = {"seeds": seeds, "threads": args.threads, "quick": args.quick}
    goals = {}
    reused_rows, reused_parts = [], {}
    if args.reuse:
        arms = set(args.reuse.split(","))
        reused_rows, reused_parts, extra["reused"] = _load_reused(args, arms)
        for part in arms & REUSABLE_PARTS.keys():
            if REUSABLE_PARTS[part][0] not in reused_parts:
                raise SystemExit(f"--reuse {part}: the results file has no {part} part")
            parts = [q for q in parts if q != part]
        skip = arms - REUSABLE_PARTS.keys()
        args.methods = ",".join(
            m for m in (args.methods or ",".join(ALL_METHODS)).split(",") if m not in skip
        )
    rows, kept_rows = [], []
    if args.resume:
        previous = json.loads((out_dir(args) / "vboot.json").read_text())
        skip = {r["method"] for r in reused_rows}
        kept_rows = [
            {**r, "source": "earlier run" if r.get("source") == "this run" else r["source"]}
            for r in previous["rows"]
            if "dataset" in r and r.get("seed") in seeds and r["method"] not in skip
        ]
        extra["resumed_from"] = {
            "file_last_commit": _git_commit(out_dir(args) / "vboot.json"),
            "commands_that_produced_them": previous.get("commands", [previous.get("command")]),
        }
    done = frozenset((r["dataset"], r["method"], r["seed"]) for r in kept_rows)
    if "accuracy" in parts:
        if args.methods == "":  # every accuracy method is reused
            rows, failures, settings, dgp = [], [], {}, None
        else:
            rows, failures, settings, dgp = accuracy_part(args, cfg, seeds, done)
        rows = [{**r, "source": "this run"} for r in rows] + kept_rows + reused_rows
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
    scaling = None
    if "scaling" in parts:
        scaling, hyper_seconds = scaling_part(args, cfg)
        extra["scaling"] = scaling
        extra["scaling_hyperparameter_fit_seconds"] = hyper_seconds
    elif "scaling" in reused_parts:
        extra["scaling"] = reused_parts["scaling"]
        extra["scaling_hyperparameter_fit_seconds"] = reused_parts.get(
            "scaling_hyperparameter_fit_seconds"
        )
        scaling = reused_parts["scaling"]
    if scaling is not None:
        big = [r for r in scaling if r["size"] >= 2000]
        if big:
            goals["vboot_rff_faster_than_svgp_from_2000"] = all(
                r["vboot_rff_seconds"] < r["svgp_seconds_extrapolated"] for r in big
            )
        print(format_markdown_table(scaling))
    vec = None
    if "vectorisation" in parts:
        vec = vectorisation_part(args, cfg)
        extra["vectorisation"] = vec
    elif "vectorisation" in reused_parts:
        vec = extra["vectorisation"] = reused_parts["vectorisation"]
    if vec is not None:
        goals["vectorised_mlp_k10_at_least_4x"] = bool(vec["speedup"] >= 4.0)
        print(format_markdown_table(vec["configs"], [
            "config", "batch_size", "steps", "speedup", "sequential_seconds_per_particle_step",
            "vectorised_seconds_per_particle_step", "fixed_overhead_share_of_sequential_step",
            "sequential_gflops", "vectorised_gflops",
        ]))  # fmt: skip
    extra["goals"] = goals
    extra["total_seconds"] = time.perf_counter() - t_start
    print(json.dumps(goals, indent=1))
    write_results("vboot", rows, out_dir(args), extra=extra, title="Variational bootstrap (001)")


if __name__ == "__main__":
    main()

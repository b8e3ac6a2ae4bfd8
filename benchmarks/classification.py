"""Classification likelihoods benchmark (issue 3): robust max, Dirichlet GPs, GPyTorch baselines.

Datasets: digits (scikit-learn, bundled) and magic, htru2, letter (UCI, from ``--data-dir``).
Split ``s`` of a dataset is a seeded stratified 80/20 split with ``random_state = 10007 seed + s``
(digits: the loader's default split; no official splits exist); every method of split ``s`` is
reseeded with ``1000 (10007 seed + s)`` (``gpext_bench.split_seeds``: different seeds never share
a split; seed 0 gives the earlier ``s`` and ``1000 s``).  Methods:

* ``gpext_robust_max_svgp`` vs ``gpytorch_svgp_softmax``: the same SVGP (one latent GP per
  class, the same 256 seeded inducing points, about 1500 minibatch Adam steps of batch 256,
  lr 0.02; the softmax uses GPyTorch's default 10 Monte Carlo samples in the ELBO), run back
  to back on each split;
* ``gpext_dirichlet_gp`` (exact for N <= 2000, sparse otherwise);
* ``gpytorch_dirichlet_exact`` (GPyTorch's recipe, 50 Adam steps; digits only).

Metrics: error, MNLL, ECE (10 bins), Brier, training-and-prediction seconds, and
``seconds_ratio`` = robust-max seconds / softmax seconds on the same split (the two arms run
back to back in this process, their order alternating over splits) and ``cpu_ratio``, the same
ratio of the process CPU time (one thread: insensitive to other processes on a shared
machine; it includes loading the split, the same for both arms).  The table gives the mean and standard error over splits; the
issue's goals are evaluated on the means and written to the JSON (``goals``).  The
deterministic class-probability approximation of the Dirichlet transform is compared with
Monte Carlo on the exact digits model (``approx_vs_mc``).

``--reuse DATASET ...`` copies that dataset's rows from the existing results JSON (e.g. letter,
whose two SVGP arms take about 15 minutes each on one thread) instead of running it; such rows
are marked ``source: earlier run`` and their ``seconds_ratio`` comes from that earlier run.
``--resume`` keeps the splits of the datasets being run that the existing results JSON already
holds for every method (marked ``source: earlier run``) and runs only the missing ones, so
``--splits htru2=10 --resume`` adds splits 5..9 to an existing five-split result.

Usage::

    python benchmarks/classification.py --quick     # about two minutes
    python benchmarks/classification.py             # full protocol (letter included; long)
    python benchmarks/classification.py --datasets digits htru2 magic --reuse letter
    python benchmarks/classification.py --reuse digits letter --splits htru2=10 magic=3 --resume
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import torch
from _common import base_parser, out_dir

import gpext_bench.methods_classification  # noqa: F401  (registers the methods)
from gpext_bench import BenchConfig, run_benchmark, write_results
from gpext_bench.results import aggregate_rows, format_markdown_table, invocation

METRICS = ["error", "mnll", "ece", "brier", "seconds"]
ROBUST, SOFTMAX = "gpext_robust_max_svgp", "gpytorch_svgp_softmax"
#: Splits per dataset of the full protocol (the time of one split differs ~10x across datasets).
DEFAULT_SPLITS = {"digits": 1, "htru2": 5, "magic": 3, "letter": 1}


def approx_vs_mc(data_dir: str | None, quick: bool) -> dict:
    """Error of the deterministic E[softmax] approximation against 20k-draw Monte Carlo."""
    from gpext.metrics import categorical_nll, error_rate
    from gpext.models import DirichletGPClassifier
    from gpext_bench.data import load_dataset

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


def add_seconds_ratio(rows: list[dict]) -> None:
    """Set ``seconds_ratio`` and ``cpu_ratio`` (robust max / softmax, same split) on robust-max rows."""
    soft = {(r["dataset"], r["split"]): r for r in rows if r["method"] == SOFTMAX}
    for r in rows:
        ref = soft.get((r["dataset"], r["split"]))
        if r["method"] == ROBUST and ref is not None:
            r["seconds_ratio"] = r["seconds"] / ref["seconds"]
            if "cpu_seconds" in r and "cpu_seconds" in ref:
                r["cpu_ratio"] = r["cpu_seconds"] / ref["cpu_seconds"]


def paired_differences(rows: list[dict]) -> dict:
    """Per dataset: mean and standard error over splits of robust-max minus softmax error."""
    by = {(r["dataset"], r["method"], r["split"]): r for r in rows}
    out = {}
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        diffs = [
            by[(ds, ROBUST, s)]["error"] - by[(ds, SOFTMAX, s)]["error"]
            for (d, m, s) in by
            if d == ds and m == ROBUST and (ds, SOFTMAX, s) in by
        ]
        if not diffs:
            continue
        n = len(diffs)
        mean = sum(diffs) / n
        se = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1) / n) if n > 1 else None
        out[ds] = {"splits": n, "mean_error_diff": mean, "se": se}
    return out


def evaluate_goals(summary: list[dict]) -> dict:
    """The issue's goals, evaluated on the means over splits (missing rows are skipped)."""
    by = {(r["dataset"], r["method"]): r for r in summary}

    def get(ds, m, key):
        r = by.get((ds, m))
        return None if r is None else r.get(key)

    goals = {}
    acc = get("digits", "gpext_dirichlet_gp", "error")
    mnll = get("digits", "gpext_dirichlet_gp", "mnll")
    t_ours = get("digits", "gpext_dirichlet_gp", "seconds")
    t_ref = get("digits", "gpytorch_dirichlet_exact", "seconds")
    if None not in (acc, mnll, t_ours, t_ref):
        goals["digits_dirichlet_accuracy>=0.975"] = 1 - acc >= 0.975
        goals["digits_dirichlet_mnll<=0.27"] = mnll <= 0.27
        goals["digits_dirichlet_time<=1/3_gpytorch_exact"] = t_ours <= t_ref / 3
    for ds in dict.fromkeys(r["dataset"] for r in summary):
        e_rm, e_sm = get(ds, ROBUST, "error"), get(ds, SOFTMAX, "error")
        ratio, cpu_ratio = get(ds, ROBUST, "seconds_ratio"), get(ds, ROBUST, "cpu_ratio")
        if None not in (e_rm, e_sm, ratio):
            goals[f"{ds}_robust_max_error<=softmax"] = e_rm <= e_sm
            goals[f"{ds}_robust_max_time<=softmax"] = ratio <= 1.0
        if cpu_ratio is not None:
            goals[f"{ds}_robust_max_cpu_time<=softmax"] = cpu_ratio <= 1.0
    limits = {"letter": ("error", 0.08), "magic": ("error", 0.14), "htru2": ("error", 0.025)}
    for ds, (key, lim) in limits.items():
        v = get(ds, "gpext_dirichlet_gp", key)
        if v is not None:
            goals[f"{ds}_dirichlet_{key}<={lim}"] = v <= lim
    v = get("letter", "gpext_dirichlet_gp", "mnll")
    if v is not None:
        goals["letter_dirichlet_mnll<=0.30"] = v <= 0.30
    return goals


def summary_markdown(summary: list[dict]) -> str:
    """Mean +- standard error over splits, one row per (dataset, method)."""

    def cell(r, key):
        if key not in r:
            return ""
        se = r.get(f"{key}_se")
        return f"{r[key]:.4f}" if se is None else f"{r[key]:.4f} ± {se:.4f}"

    cols = ["dataset", "method", "splits", *METRICS, "seconds_ratio", "cpu_ratio", "source"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in summary:
        cells = [r["dataset"], r["method"], str(r["n"])]
        cells += [cell(r, k) for k in [*METRICS, "seconds_ratio", "cpu_ratio"]]
        cells.append(r.get("source", "this run"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def reused_rows(path, datasets: list[str]) -> list[dict]:
    """Rows of ``datasets`` from an existing results JSON, marked as coming from that run."""
    payload = json.loads(path.read_text())
    rows = payload.get("per_split_rows", payload["rows"])
    out = []
    for r in rows:
        if r["dataset"] in datasets:
            r = {**r, "split": r.get("split", 0)}
            src = r.get("source")
            # rows keep their provenance; a new run's own rows carry no source
            r["source"] = (
                f"earlier run: {payload.get('command', '?')}"
                if src is None
                else (src if src.startswith("earlier run") else f"earlier run ({src})")
            )
            out.append(r)
    add_seconds_ratio(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = base_parser(__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=None)
    parser.add_argument(
        "--splits",
        nargs="+",
        default=None,
        help="splits per dataset as NAME=K (default digits=1 htru2=5 magic=3 letter=1; "
        "quick: 1 each)",
    )
    parser.add_argument("--reuse", nargs="+", default=[], help="datasets copied from a JSON")
    parser.add_argument(
        "--reuse-from", default=None, help="results JSON to copy them from (default: the output)"
    )
    parser.add_argument(
        "--resume",
        action="store_true",
        help="keep the splits the results JSON already has; run only the missing ones",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--skip-approx", action="store_true", help="skip the approx-vs-MC check")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = BenchConfig(quick=args.quick, seed=args.seed, dtype=torch.float64, show_progress=False)
    datasets = args.datasets or ["digits", "htru2", "magic", "letter"]
    datasets = [d for d in datasets if d not in args.reuse]
    if args.data_dir is None:
        datasets = [d for d in datasets if d == "digits"]
        print("no data dir: running digits only", file=sys.stderr)
    splits = {d: 1 for d in DEFAULT_SPLITS} if args.quick else dict(DEFAULT_SPLITS)
    for item in args.splits or []:
        name, _, k = item.partition("=")
        splits[name] = int(k)
    out = out_dir(args)
    json_path = out / "classification.json"
    reuse_path = Path(args.reuse_from) if args.reuse_from else json_path
    rows = reused_rows(reuse_path, args.reuse) if args.reuse else []
    done: set[tuple[str, int]] = set()
    if args.resume and reuse_path.exists():
        kept = [
            r for r in reused_rows(reuse_path, datasets) if r["split"] < splits.get(r["dataset"], 1)
        ]
        for ds, split in {(r["dataset"], r["split"]) for r in kept}:
            have = {r["method"] for r in kept if (r["dataset"], r["split"]) == (ds, split)}
            need = {"gpext_dirichlet_gp", ROBUST, SOFTMAX}
            need |= {"gpytorch_dirichlet_exact"} if ds == "digits" else set()
            if need <= have:
                done.add((ds, split))
        rows += [r for r in kept if (r["dataset"], r["split"]) in done]
    reused_approx = json.loads(reuse_path.read_text()).get("approx_vs_mc") if args.reuse else None
    failures: list[dict] = []
    extra: dict = {}
    protocol = (
        "splits s = 0..k-1 per dataset (seeded stratified 80/20 with random_state = 10007 seed + s; "
        f"digits: loader default), seed {args.seed}, float64, {args.threads} CPU thread(s); "
        "seconds = fit + predict; seconds_ratio = robust max / softmax on the same split, "
        "arms back to back in alternating order; cpu_ratio = the same for process CPU time; "
        "table: mean ± standard error over splits"
    )

    def save() -> None:
        per_split = [dict(r) for r in rows]
        add_seconds_ratio(per_split)
        summary = aggregate_rows([{k: v for k, v in r.items() if k != "source"} for r in per_split])
        for r in summary:
            kinds = {
                "earlier run" if "source" in q else "this run"
                for q in per_split
                if (q["dataset"], q["method"]) == (r["dataset"], r["method"])
            }
            r["source"] = " + ".join(sorted(kinds, reverse=True))
        extra.update(
            goals=evaluate_goals(summary),
            protocol=protocol,
            splits_requested={d: splits.get(d, 1) for d in datasets},
            splits_done={
                d: len({r["split"] for r in per_split if r["dataset"] == d})
                for d in dict.fromkeys(r["dataset"] for r in per_split)
            },
            reused=args.reuse,
            robust_minus_softmax_error=paired_differences(per_split),
            per_split_rows=per_split,
        )
        if failures:
            extra["failures"] = failures
        title = "Classification likelihoods"
        write_results(
            "classification", summary, out, command=invocation(), extra=extra, title=title
        )
        # a readable markdown file: mean ± se table, then the goals and the details
        md = [f"# {title}", "", f"Command: `{invocation()}`", "", summary_markdown(summary)]
        keys = ("goals", "protocol", "splits_requested", "splits_done", "reused")
        for key in (*keys, "robust_minus_softmax_error"):
            md.append(f"**{key}**: {json.dumps(extra[key], default=float)}\n")
        if "approx_vs_mc" in extra:
            md.append(f"**approx_vs_mc**: {json.dumps(extra['approx_vs_mc'], default=float)}\n")
        if failures:
            md.append(f"**failures**: {json.dumps(failures)}\n")
        md += ["Per split:", "", format_markdown_table(per_split, ["dataset", "method", "split", *METRICS, "cpu_seconds", "seconds_ratio", "cpu_ratio"])]  # fmt: skip
        (out / "classification.md").write_text("\n".join(md))

    for ds in datasets:
        for split in range(splits.get(ds, 1)):
            if (ds, split) in done:
                continue
            # the two SVGP arms back to back, their order alternating over splits
            arms = [ROBUST, SOFTMAX] if split % 2 == 0 else [SOFTMAX, ROBUST]
            methods = ["gpext_dirichlet_gp", *arms]
            if ds == "digits":
                methods.append("gpytorch_dirichlet_exact")
            for method in methods:
                cpu0 = time.process_time()
                run = run_benchmark(
                    [ds],
                    [method],
                    config=config,
                    data_dir=args.data_dir,
                    splits=[split],
                    keep_predictions=False,
                )
                cpu = time.process_time() - cpu0
                for r in run.rows:
                    rows.append({k: r[k] for k in ["dataset", "method", "split", *METRICS]})
                    rows[-1]["cpu_seconds"] = cpu
                    print(f"{ds:8s} {split} {method:26s} error={r['error']:.4f} "
                          f"mnll={r['mnll']:.4f} seconds={r['seconds']:.1f} cpu={cpu:.1f}", flush=True)  # fmt: skip
                failures.extend(run.failures)
            save()  # after every split, so that a long run leaves partial results
    if not args.skip_approx:
        extra["approx_vs_mc"] = approx_vs_mc(args.data_dir, args.quick)
    elif reused_approx is not None:
        extra["approx_vs_mc"] = {**reused_approx, "source": "earlier run"}
    save()
    print((out / "classification.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The ``gpext`` command line (also ``python -m gpext_bench``).

``gpext bench [--quick] [--data-dir DIR] [--dataset NAME ...] [--methods NAME ...] [--out DIR]``
fits the registered methods on the chosen datasets, prints a results table, and writes
``<out>/gpext_bench.json``, ``<out>/gpext_bench.md`` and (with matplotlib) ``<out>/gpext_bench.png``
(one panel per metric, methods side by side) and ``<out>/gpext_bench_predictions.png``.
``gpext datasets`` lists the datasets found; ``gpext bench --list`` the registered methods.

Exit codes: 0 when every fit succeeded; 1 when at least one (dataset, method, split) fit raised
(its row is kept in the results with a ``failure`` field and the run went on); 2 for bad
arguments (unknown dataset or method, ``--splits`` below 1, a method of the other task, an
unavailable ``--device``), reported as one ``gpext: error:`` line.  When standard error is not a
terminal, one progress line per finished fit is written to it.  Every row of the results
records the gpext warnings of its fit (``warnings``: how many, ``warning``: the class and first
line of the first, ``warning_classes``); the aggregated rows count the warned fits
(``warned_fits``), and the printed tables show them when any fit warned.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import torch

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``gpext`` command."""
    from gpext import __version__

    parser = argparse.ArgumentParser(
        prog="gpext", description="gpext: GP and Bayesian-deep-learning extensions for GPyTorch."
    )
    parser.add_argument("--version", action="version", version=f"gpext {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    bench = sub.add_parser("bench", help="fit the registered methods on datasets and score them")
    bench.add_argument("--quick", action="store_true", help="small budget (about a minute)")
    bench.add_argument("--data-dir", default=None, help="data folder (default: $GPEXT_DATA_DIR)")
    bench.add_argument(
        "--dataset", "--datasets", dest="datasets", nargs="+", default=None, metavar="NAME",
        help="dataset names or folder paths (default: scikit-learn's bundled sets)",
    )  # fmt: skip
    bench.add_argument(
        "--methods", nargs="+", default=None, metavar="NAME",
        help="method names, or 'all' (default: the methods marked default in --list)",
    )  # fmt: skip
    bench.add_argument(
        "--task", choices=("regression", "classification"), default=None,
        help="task of a single-table dataset folder (default: classification unless the target "
        "column holds non-integer numbers); other formats fix their task",
    )  # fmt: skip
    bench.add_argument(
        "--target", default=None, metavar="COLUMN",
        help="target column of a single-table dataset folder: header name or 0-based index "
        "(default: the one non-numeric column, else the last)",
    )  # fmt: skip
    bench.add_argument(
        "--splits", type=int, default=None,
        help="number of splits per dataset (>= 1; default 1 with --quick, else up to 5)",
    )  # fmt: skip
    bench.add_argument(
        "--seed", type=int, default=0,
        help="base seed (>= 0); split s of seed k uses random_state k*10007+s, so seeds never "
        "share a split",
    )  # fmt: skip
    bench.add_argument("--dtype", choices=("float32", "float64"), default="float64")
    bench.add_argument("--device", default="cpu")
    bench.add_argument(
        "--threads", type=int, default=1,
        help="torch intra-op threads (default 1: the small models here run fastest single-threaded)",
    )  # fmt: skip
    bench.add_argument("--out", default="gpext_bench_results", help="output folder")
    bench.add_argument("--no-plot", action="store_true", help="skip the PNG figure")
    bench.add_argument("--list", action="store_true", help="list registered methods and exit")

    ds = sub.add_parser("datasets", help="list the datasets that can be loaded")
    ds.add_argument("--data-dir", default=None)
    return parser


def _cmd_datasets(args: argparse.Namespace) -> int:
    from gpext_bench.data import list_datasets

    for name, fmt in list_datasets(args.data_dir).items():
        print(f"{name:20s} {fmt}")
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from gpext_bench import (
        BenchConfig,
        aggregate_rows,
        format_markdown_table,
        get_method,
        list_methods,
        run_benchmark,
        write_results,
    )
    from gpext_bench.results import invocation
    from gpext_bench.runner import check_device

    if args.list:
        for m in list_methods():
            mark = "*" if m.default else " "
            print(f"{mark} {m.name:28s} {m.task:15s} {m.description}")
        print("* runs by default; name others with --methods (or --methods all)")
        return 0
    if args.threads < 1:
        from gpext.errors import InputDataError

        raise InputDataError(f"--threads: expected an integer >= 1, got {args.threads}.")
    torch.set_num_threads(args.threads)
    config = BenchConfig(
        quick=args.quick,
        seed=args.seed,
        dtype=getattr(torch, args.dtype),
        device=check_device(args.device),
    )
    run = run_benchmark(
        args.datasets,
        args.methods,
        config=config,
        data_dir=args.data_dir,
        splits=args.splits,
        log=None if sys.stderr.isatty() else sys.stderr,
        task=args.task,
        target=args.target,
    )
    rows = aggregate_rows(run.rows)
    failed = ["failed"] if run.failures else []
    warned = ["warned_fits", "warning"] if any(r.get("warned_fits") for r in rows) else []
    for task, task_cols in (
        ("regression", ["dataset", "method", "rmse", "nll", "coverage95", "seconds", "n"]),
        ("classification", ["dataset", "method", "error", "mnll", "ece", "brier", "seconds", "n"]),
    ):
        sel = [r for r in rows if get_method(r["method"]).task == task]
        if sel:
            print(format_markdown_table(sel, task_cols + failed + warned, max_width=100))
    for f in run.failures:
        print(
            f"FAILED {f['dataset']} split {f['split']} / {f['method']}: {f['error']}",
            file=sys.stderr,
        )
    num_warned = sum(1 for r in run.rows if r.get("warnings"))
    if num_warned:
        print(f"gpext: {num_warned} of {len(run.rows)} fit(s) issued gpext warnings; see "
              "'warnings' and 'warning' in the results.", file=sys.stderr)  # fmt: skip
    json_path, md_path = write_results(
        "gpext_bench",
        rows,
        args.out,
        command=invocation(),
        extra={"per_split": run.rows},
        markdown_skip=("per_split",),
    )
    print(f"wrote {json_path} and {md_path}")
    if not args.no_plot:
        from gpext_bench.plots import plot_metrics, plot_run

        for png in (
            plot_metrics(rows, f"{args.out}/gpext_bench.png"),
            plot_run(run, f"{args.out}/gpext_bench_predictions.png"),
        ):
            if png is not None:
                print(f"wrote {png}")
    if run.failures:
        print(f"gpext: {len(run.failures)} fit(s) failed; see the rows with 'failure'.",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gpext`` console script."""
    from gpext.errors import GpextError

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        if args.command == "bench":
            return _cmd_bench(args)
        return _cmd_datasets(args)
    except GpextError as err:
        print(f"gpext: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

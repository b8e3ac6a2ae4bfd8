"""Upstream GPyTorch baselines through the ``gpext bench`` harness, on bundled and UCI data.

Full run: the scikit-learn sets (diabetes, breast_cancer, wine, digits; 5 seeded splits) and the
UCI regression sets boston, concrete, energy, yacht (first 5 of the 20 standard splits), with the full
budget.  Quick run: the scikit-learn sets, one split, quick budget.  These rows are the reference
the capability benchmarks compare against.
"""

from __future__ import annotations

import sys

import torch

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from _common import base_parser, out_dir  # noqa: E402

from gpext.bench import (
    BenchConfig,
    aggregate_rows,
    format_markdown_table,
    run_benchmark,
    write_results,
)  # noqa: E402
from gpext.bench.results import invocation  # noqa: E402

BUNDLED = ["diabetes", "breast_cancer", "wine", "digits"]
UCI = ["boston", "concrete", "energy", "yacht"]
METHODS = ["gpytorch_exact_gp", "gpytorch_svgp", "gpytorch_svgp_softmax"]


def main() -> None:
    args = base_parser(__doc__.splitlines()[0]).parse_args()
    torch.set_num_threads(1)  # small models: single-threaded is fastest
    datasets = list(BUNDLED)
    if not args.quick and args.data_dir:
        datasets += UCI
    config = BenchConfig(quick=args.quick, seed=args.seed)
    run = run_benchmark(
        datasets, None, config=config, data_dir=args.data_dir, splits=1 if args.quick else 5,
        keep_predictions=False,
    )  # fmt: skip
    rows = aggregate_rows(run.rows)
    for cols in (
        ["dataset", "method", "rmse", "nll", "coverage95", "seconds", "n"],
        ["dataset", "method", "error", "mnll", "ece", "brier", "seconds", "n"],
    ):
        sel = [r for r in rows if cols[2] in r]
        if sel:
            print(format_markdown_table(sel, cols))
    paths = write_results(
        "baselines", rows, out_dir(args), command=invocation(),
        extra={"failures": run.failures, "per_split": run.rows},
    )  # fmt: skip
    print("wrote", *paths)


if __name__ == "__main__":
    main()

"""Helpers shared by the benchmark scripts (argument parsing, data folder, result paths)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def default_data_dir() -> str | None:
    """``$GPEXT_DATA_DIR``, else the ``shared/data`` folder beside the checkout, else ``None``."""
    env = os.environ.get("GPEXT_DATA_DIR")
    if env:
        return env
    shared = REPO.parent / "shared" / "data"
    return str(shared) if shared.is_dir() else None


def base_parser(description: str) -> argparse.ArgumentParser:
    """Parser with the flags every benchmark script accepts."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument(
        "--quick", action="store_true", help="about a minute; results go to results/quick/"
    )
    p.add_argument("--data-dir", default=default_data_dir())
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="output folder (default benchmarks/results[/quick])")
    return p


def out_dir(args: argparse.Namespace) -> Path:
    """Where a run writes: ``--out``, else ``results/quick`` for quick runs, else ``results``."""
    if args.out:
        return Path(args.out)
    return RESULTS / "quick" if args.quick else RESULTS

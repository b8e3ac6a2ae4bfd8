"""The benchmark harness behind ``gpext bench`` and the scripts in ``benchmarks/``."""

from gpext.bench.registry import (
    BUILTIN_METHOD_MODULES,
    BenchConfig,
    BenchMethod,
    Prediction,
    get_method,
    list_methods,
    register_method,
)
from gpext.bench.results import aggregate_rows, format_markdown_table, write_results
from gpext.bench.runner import DEFAULT_DATASETS, BenchRun, evaluate_prediction, run_benchmark

__all__ = [
    "BUILTIN_METHOD_MODULES",
    "DEFAULT_DATASETS",
    "BenchConfig",
    "BenchMethod",
    "BenchRun",
    "Prediction",
    "aggregate_rows",
    "evaluate_prediction",
    "format_markdown_table",
    "get_method",
    "list_methods",
    "register_method",
    "run_benchmark",
    "write_results",
]

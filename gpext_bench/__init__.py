"""gpext_bench: the benchmark harness, dataset loaders and command line beside the gpext library.

The harness behind the ``gpext bench`` command and the scripts in ``benchmarks/``: a registry of
methods (:mod:`gpext_bench.registry`; GPyTorch baselines in :mod:`gpext_bench.baselines`, one
``methods_*`` module per gpext capability), the runner and scoring (:mod:`gpext_bench.runner`),
result files (:mod:`gpext_bench.results`, :mod:`gpext_bench.plots`), the dataset loaders
(:mod:`gpext_bench.data`) and the command line (:mod:`gpext_bench.cli`).  It depends on
:mod:`gpext` and on scikit-learn (``pip install "gpext[bench]"``); :mod:`gpext` never imports it,
so the library carries none of its dependencies or its module-level state (method registry,
cached subspace runs, per-fit seeding of the global RNG).
"""

from gpext.errors import MissingExtraError

try:
    import sklearn  # noqa: F401  (the dataset loaders need it)
except ImportError as err:
    raise MissingExtraError(
        "gpext_bench: expected the optional dependency 'scikit-learn' (the dataset loaders use "
        f"it), got an ImportError ({err}). Install it with `pip install gpext[bench]`."
    ) from err

from gpext_bench.registry import (  # noqa: E402
    BUILTIN_METHOD_MODULES,
    BenchConfig,
    BenchMethod,
    Prediction,
    get_method,
    list_methods,
    register_method,
)
from gpext_bench.results import aggregate_rows, format_markdown_table, write_results  # noqa: E402
from gpext_bench.runner import (  # noqa: E402
    DEFAULT_DATASETS,
    BenchRun,
    evaluate_prediction,
    run_benchmark,
)

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

"""Running registered methods on datasets and scoring them in original units."""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TextIO

import torch

from gpext import metrics
from gpext.errors import GpextWarning, InputDataError, expected_got
from gpext.utils import progress_bar
from gpext_bench.data import DatasetSplit, dataset_info, load_dataset
from gpext_bench.registry import BenchConfig, BenchMethod, Prediction, get_method, list_methods

__all__ = [
    "MAX_SEED",
    "SEED_STRIDE",
    "BenchRun",
    "check_device",
    "evaluate_prediction",
    "reissue_warnings",
    "run_benchmark",
    "split_seeds",
    "summarize_warnings",
]

#: Datasets used when none are named: scikit-learn's bundled sets, always available offline.
DEFAULT_DATASETS = ("diabetes", "breast_cancer", "wine", "digits")


def evaluate_prediction(split: DatasetSplit, pred: Prediction) -> dict[str, float]:
    """Score a prediction on the split's test part.

    Regression metrics are in the original target units: ``rmse``, ``nll`` (negative mean
    per-point Gaussian, or Gaussian-mixture, test log-likelihood) and ``coverage95`` (fraction
    of targets in the central 95% predictive interval).  Classification metrics: ``error``,
    ``mnll``, ``ece`` (10 equal-width bins) and ``brier``.
    """
    if split.task == "regression":
        if pred.mean is None:
            raise InputDataError(
                expected_got("Prediction", "mean and variance for a regression task", "probs")
            )
        scale = float(split.y_scaler.std)
        y = split.test_y_original
        mean = split.y_scaler.inverse_transform(pred.mean.to(y))
        out = {"rmse": metrics.rmse(mean, y)}
        if pred.is_mixture:
            mm = pred.mixture_means.to(split.test_y)
            mv = pred.mixture_variances.to(split.test_y)
            w = None if pred.mixture_weights is None else pred.mixture_weights.to(mm)
            out["nll"] = -metrics.mixture_gaussian_log_likelihood(
                mm, mv, split.test_y, weights=w, y_scale=scale
            )
            out["coverage95"] = metrics.mixture_interval_coverage(
                mm, mv, split.test_y, weights=w, level=0.95
            )
        else:
            var = pred.variance.to(split.test_y)
            out["nll"] = -metrics.gaussian_log_likelihood(
                pred.mean.to(split.test_y), var, split.test_y, y_scale=scale
            )
            out["coverage95"] = metrics.interval_coverage(
                pred.mean.to(split.test_y), var, split.test_y, level=0.95
            )
        return out
    if pred.probs is None:
        raise InputDataError(expected_got("Prediction", "probs for a classification task", "none"))
    probs = pred.probs.to(torch.float64)
    probs = probs / probs.sum(-1, keepdim=True)
    y = split.test_y
    return {
        "error": metrics.error_rate(probs, y),
        "mnll": metrics.categorical_nll(probs, y),
        "ece": metrics.expected_calibration_error(probs, y),
        "brier": metrics.brier_score(probs, y),
    }


def _first_line(text: str) -> str:
    lines = str(text).strip().splitlines()
    return lines[0].strip() if lines else ""


def summarize_warnings(caught: Iterable[warnings.WarningMessage]) -> dict[str, object]:
    """The gpext warnings among recorded warnings, as fields of a result row.

    Only warnings whose category is a :class:`gpext.errors.GpextWarning` count; other
    warnings (from torch, GPyTorch, ...) are left out of the row.

    Args:
        caught: Warnings recorded by ``warnings.catch_warnings(record=True)``.

    Returns:
        ``warnings``: the number of gpext warnings (an ``int``, 0 for a clean fit);
        ``warning``: ``"<ClassName>: <first line of its message>"`` of the first one, or
        ``""``; ``warning_classes``: the sorted, comma-joined names of their distinct classes,
        or ``""``.

    Example:
        >>> import warnings
        >>> from gpext.errors import ConvergenceWarning
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("budget used up\\nmore", ConvergenceWarning)
        >>> summarize_warnings(caught)["warning"]
        'ConvergenceWarning: budget used up'
        >>> summarize_warnings(caught)["warnings"], summarize_warnings(caught)["warning_classes"]
        (1, 'ConvergenceWarning')
    """
    gpext = [w for w in caught if issubclass(w.category, GpextWarning)]
    first = ""
    if gpext:
        first = f"{gpext[0].category.__name__}: {_first_line(str(gpext[0].message))}"
    classes = sorted({w.category.__name__ for w in gpext})
    return {"warnings": len(gpext), "warning": first, "warning_classes": ",".join(classes)}


def _module_of(filename: str) -> tuple[str | None, dict | None]:
    for name, mod in list(sys.modules.items()):
        if getattr(mod, "__file__", None) == filename:
            return name, vars(mod)
    return None, None


def reissue_warnings(caught: Iterable[warnings.WarningMessage]) -> None:
    """Issue recorded warnings again, as if they had not been caught.

    Each warning goes through :func:`warnings.warn_explicit` with its original category,
    file, line and (when the file is an imported module) module name and registry, so the
    filters in force outside the recording block (``ignore``, ``once``, ``error``, ...)
    apply as they would have to the original call.
    """
    modules: dict[str, tuple[str | None, dict | None]] = {}
    for w in caught:
        if w.filename not in modules:
            modules[w.filename] = _module_of(w.filename)
        module, module_globals = modules[w.filename]
        registry = None
        if module_globals is not None:
            registry = module_globals.setdefault("__warningregistry__", {})
        warnings.warn_explicit(
            w.message, w.category, w.filename, w.lineno, module=module, registry=registry,
            module_globals=module_globals, source=w.source,
        )  # fmt: skip


@dataclass
class BenchRun:
    """Everything one ``run_benchmark`` call produced."""

    rows: list[dict] = field(default_factory=list)
    predictions: dict[tuple[str, str, int], tuple[DatasetSplit, Prediction]] = field(
        default_factory=dict
    )
    failures: list[dict] = field(default_factory=list)


#: Seeds of different ``--seed`` values never coincide: split ``s`` of base seed ``k`` draws its
#: random train/test split with ``random_state = k * SEED_STRIDE + s`` and seeds the fit with
#: ``1000 * (k * SEED_STRIDE + s)``; both are one-to-one in ``(k, s)`` for ``s < SEED_STRIDE``.
#: Seed 0 keeps the earlier values (``random_state = s``, fit seed ``1000 s``).
SEED_STRIDE = 10_007
#: Largest base seed: scikit-learn's ``random_state`` must stay below ``2**32``.
MAX_SEED = (2**32 - 1) // SEED_STRIDE - 1


def split_seeds(seed: int, split: int) -> tuple[int, int]:
    """The ``(load_dataset seed, fit seed)`` of split ``split`` under base seed ``seed``.

    ``load_dataset`` adds the split index itself, so its seed is ``seed * SEED_STRIDE``
    (random splits then use ``random_state = seed * SEED_STRIDE + split``).
    """
    return seed * SEED_STRIDE, 1000 * (seed * SEED_STRIDE + split)


def _check_int(what: str, value: object, low: int, high: int | None, fix: str) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if ok and high is not None:
        ok = value <= high
    if not ok:
        rng = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
        raise InputDataError(expected_got(what, rng, repr(value), fix))


def check_device(device: torch.device | str) -> torch.device:
    """The device as a ``torch.device``, checked to exist on this machine.

    Raises:
        InputDataError: If the name is not a device, or CUDA / MPS is not available.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise InputDataError(
            expected_got("device", "a torch device such as 'cpu' or 'cuda:0'", repr(device))
        ) from err
    if dev.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0 or (dev.index is not None and dev.index >= count):
            have = "no CUDA device" if count == 0 else f"{count} CUDA device(s)"
            raise InputDataError(
                expected_got(
                    "device",
                    "a device available on this machine",
                    f"{str(dev)!r} while this torch build sees {have}",
                    "Use --device cpu, or install a CUDA build of torch on a GPU machine.",
                )
            )
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise InputDataError(
            expected_got("device", "a device available on this machine", "'mps' (unavailable)",
                         "Use --device cpu.")
        )  # fmt: skip
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise InputDataError(
            expected_got("device", "'cpu', 'cuda', 'cuda:<index>' or 'mps'", repr(str(dev)))
        )
    return dev


def _resolve_methods(methods: Sequence[str] | None, task: str) -> list[BenchMethod]:
    if not methods:
        return list_methods(task, default_only=True)
    if list(methods) == ["all"]:
        return list_methods(task)
    chosen = [get_method(m) for m in methods]
    return [m for m in chosen if m.task == task]


def _split_indices(name: str, splits: Sequence[int] | int | None, num: int, quick: bool) -> list:
    if splits is None:
        return list(range(min(num, 1 if quick else 5)))
    if isinstance(splits, int) and not isinstance(splits, bool):
        return list(range(min(splits, num)))
    idx = list(splits)
    for s in idx:
        _check_int(f"split index of {name}", s, 0, min(num, SEED_STRIDE) - 1,
                   f"{name} has {num} split(s).")  # fmt: skip
    return idx


def _check_arguments(
    datasets: list, methods: Sequence[str] | None, splits: object, seed: object
) -> None:
    if not datasets:
        raise InputDataError(expected_got("datasets", "at least one dataset name", "none"))
    if isinstance(splits, int) and not isinstance(splits, bool):
        _check_int("splits", splits, 1, None, "Pass a count of at least 1 (e.g. --splits 3).")
    elif splits is not None:
        if isinstance(splits, (str, bytes)) or not list(splits):
            raise InputDataError(
                expected_got("splits", "a count >= 1 or a non-empty list of indices", repr(splits))
            )
    _check_int("seed", seed, 0, MAX_SEED, "Pass a non-negative seed (e.g. --seed 1).")
    if methods is not None and not list(methods):
        raise InputDataError(
            expected_got("methods", "at least one method name, or 'all'", "an empty list")
        )
    if methods and list(methods) != ["all"]:
        for m in methods:
            get_method(m)  # fail early on unknown names


def run_benchmark(
    datasets: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    *,
    config: BenchConfig | None = None,
    data_dir: str | None = None,
    splits: Sequence[int] | int | None = None,
    keep_predictions: bool = True,
    raise_errors: bool = False,
    log: TextIO | None = None,
    task: str | None = None,
    target: str | None = None,
) -> BenchRun:
    """Fit every matching method on every dataset split and score it.

    Split ``s`` under ``config.seed = k`` is drawn and fitted with the seeds of
    :func:`split_seeds`, so different base seeds never share a split or a fit seed.

    Args:
        datasets: Dataset names or folder paths (default :data:`DEFAULT_DATASETS`).
        methods: Method names; default: the registered methods of the dataset's task marked
            ``default``; ``["all"]``: every registered method. Methods of the other task are
            skipped for a dataset, but a named method that fits no dataset is an error.
        config: Shared :class:`BenchConfig`.
        data_dir: Data folder (argument, then ``$GPEXT_DATA_DIR``).
        splits: Split indices, or a count >= 1 (the first ``k`` splits). Default: 1 split in
            quick mode, up to 5 otherwise.
        keep_predictions: Keep predictions for plotting.
        raise_errors: Re-raise a method's failure instead of recording it and going on.
        log: Stream that gets one flushed line per finished (dataset, split, method), e.g.
            ``sys.stderr`` when it is not a terminal (the progress bar is off there).
        task: Task of single-table dataset folders (``"regression"`` or
            ``"classification"``; see :func:`~gpext_bench.data.load_dataset`).
        target: Target column of single-table dataset folders (header name or index).

    Returns:
        A :class:`BenchRun` with one row per (dataset, method, split). A fit that raised any
        exception gets a row with ``failure`` (the error text) and no metrics, and an entry
        in ``failures``; the run goes on with the next fit. Every row records the gpext
        warnings (:class:`~gpext.errors.GpextWarning`) its fit and prediction issued, as
        :func:`summarize_warnings` does: ``warnings`` (their number, 0 for a clean fit),
        ``warning`` (``"<ClassName>: <first line>"`` of the first) and ``warning_classes``.
        All warnings recorded during a fit, gpext's and others, are issued again after it
        (:func:`reissue_warnings`), so the caller's warning filters apply as usual; under an
        ``error`` filter that exception is raised after the row is recorded.

    Raises:
        InputDataError: Bad ``splits``, seed, method names, a named method that matches the
            task of no dataset, or an unavailable device.
        DatasetNotFoundError: An unknown dataset.
    """
    config = config or BenchConfig()
    datasets = list(datasets or DEFAULT_DATASETS)
    _check_arguments(datasets, methods, splits, config.seed)
    config = replace(config, device=check_device(config.device))
    run = BenchRun()
    jobs = []
    tasks: dict[str, str] = {}
    skipped: list[str] = []
    for name in datasets:
        info = dataset_info(name, data_dir=data_dir, task=task, target=target)
        tasks[name] = info["task"]
        idx = _split_indices(name, splits, info["num_splits"], config.quick)
        chosen = _resolve_methods(methods, info["task"])
        if not chosen:
            skipped.append(f"{name} ({info['task']})")
        for s in idx:
            for method in chosen:
                jobs.append((name, s, method))
    if methods and list(methods) != ["all"]:
        for m in methods:
            method = get_method(m)
            if method.task not in tasks.values():
                sets = ", ".join(f"{n} ({t})" for n, t in tasks.items())
                raise InputDataError(
                    expected_got(
                        f"method {m!r}",
                        f"a method of the datasets' task; {m!r} is a {method.task} method",
                        f"datasets {sets}",
                        f"Run `gpext bench --list` for the {'/'.join(sorted(set(tasks.values())))}"
                        " methods, or name a dataset of its task.",
                    )
                )
    for what in skipped:
        warnings.warn(f"no registered method for {what}; skipped", stacklevel=2)
    if not jobs:
        raise InputDataError(
            expected_got("gpext bench", "at least one (dataset, method) pair to run", "none")
        )
    bar = progress_bar(jobs, desc="gpext bench", show=config.show_progress, leave=True)
    for k, (name, s, method) in enumerate(bar, start=1):
        bar.set_postfix_str(f"{name}/{s} {method.name}")
        data_seed, fit_seed = split_seeds(config.seed, s)
        t0 = time.perf_counter()
        caught: list[warnings.WarningMessage] = []
        try:
            split = load_dataset(
                name, split=s, data_dir=data_dir, dtype=config.dtype, seed=data_seed,
                task=task, target=target,
            )  # fmt: skip
            torch.manual_seed(fit_seed)
            cfg = replace(config, seed=fit_seed)
            # Every warning of the fit is recorded (gpext ones go into the row) and issued
            # again below, so the caller's filters still see all of them.
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                t0 = time.perf_counter()
                pred = method.fit_predict(split, cfg)
                seconds = time.perf_counter() - t0
                scores = evaluate_prediction(split, pred)
        except Exception as err:  # noqa: BLE001 (recorded with its row; the run goes on)
            if raise_errors:
                reissue_warnings(caught)
                raise
            text = f"{type(err).__name__}: {err}"
            seconds = time.perf_counter() - t0
            run.failures.append({"dataset": name, "method": method.name, "split": s,
                                 "error": text})  # fmt: skip
            run.rows.append({"dataset": name, "method": method.name, "split": s,
                             "seconds": seconds, "failure": text,
                             **summarize_warnings(caught)})  # fmt: skip
            _log(log, k, len(jobs), name, s, method.name, f"FAILED {text}")
            reissue_warnings(caught)
            continue
        # Methods sharing one training run (the subspace family) report their own share.
        seconds = float(pred.info.get("seconds", seconds))
        row = {"dataset": split.name, "method": method.name, "split": s, **scores}
        row["seconds"] = seconds
        row.update(summarize_warnings(caught))
        run.rows.append(row)
        if keep_predictions:
            run.predictions[(split.name, method.name, s)] = (split, pred)
        what = f"{seconds:.2f} s"
        if row["warnings"]:
            what += f", {row['warnings']} gpext warning(s): {row['warning']}"
        _log(log, k, len(jobs), split.name, s, method.name, what)
        reissue_warnings(caught)
    return run


def _log(log: TextIO | None, k: int, total: int, name: str, s: int, method: str, what: str):
    if log is not None:
        print(f"gpext bench [{k}/{total}] {name} split {s} {method}: {what}", file=log, flush=True)

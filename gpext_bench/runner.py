"""Running registered methods on datasets and scoring them in original units."""

from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from gpext import metrics
from gpext.errors import GpextError, InputDataError, expected_got
from gpext.utils import progress_bar
from gpext_bench.data import DatasetSplit, dataset_info, load_dataset
from gpext_bench.registry import BenchConfig, BenchMethod, Prediction, get_method, list_methods

__all__ = ["BenchRun", "evaluate_prediction", "run_benchmark"]

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


@dataclass
class BenchRun:
    """Everything one ``run_benchmark`` call produced."""

    rows: list[dict] = field(default_factory=list)
    predictions: dict[tuple[str, str, int], tuple[DatasetSplit, Prediction]] = field(
        default_factory=dict
    )
    failures: list[dict] = field(default_factory=list)


def _resolve_methods(methods: Sequence[str] | None, task: str) -> list[BenchMethod]:
    if not methods:
        return list_methods(task, default_only=True)
    if list(methods) == ["all"]:
        return list_methods(task)
    chosen = [get_method(m) for m in methods]
    return [m for m in chosen if m.task == task]


def run_benchmark(
    datasets: Sequence[str] | None = None,
    methods: Sequence[str] | None = None,
    *,
    config: BenchConfig | None = None,
    data_dir: str | None = None,
    splits: Sequence[int] | int | None = None,
    keep_predictions: bool = True,
    raise_errors: bool = False,
) -> BenchRun:
    """Fit every matching method on every dataset split and score it.

    Args:
        datasets: Dataset names or folder paths (default :data:`DEFAULT_DATASETS`).
        methods: Method names; default: the registered methods of the dataset's task marked
            ``default``; ``["all"]``: every registered method. Methods of the other task are
            skipped for a dataset.
        config: Shared :class:`BenchConfig`.
        data_dir: Data folder (argument, then ``$GPEXT_DATA_DIR``).
        splits: Split indices, or a count (the first ``k`` splits). Default: 1 split in quick
            mode, up to 5 otherwise.
        keep_predictions: Keep predictions for plotting.
        raise_errors: Re-raise a method's failure instead of recording it and going on.

    Returns:
        A :class:`BenchRun` with one row per (dataset, method, split).
    """
    config = config or BenchConfig()
    datasets = list(datasets or DEFAULT_DATASETS)
    if methods and list(methods) != ["all"]:
        for m in methods:
            get_method(m)  # fail early on unknown names
    run = BenchRun()
    jobs = []
    for name in datasets:
        info = dataset_info(name, data_dir=data_dir)
        if splits is None:
            idx = list(range(min(info["num_splits"], 1 if config.quick else 5)))
        elif isinstance(splits, int):
            idx = list(range(min(splits, info["num_splits"])))
        else:
            idx = list(splits)
        chosen = _resolve_methods(methods, info["task"])
        if not chosen:
            warnings.warn(
                f"no registered method for {name} ({info['task']}); skipped", stacklevel=2
            )
        for s in idx:
            for method in chosen:
                jobs.append((name, s, method))
    bar = progress_bar(jobs, desc="gpext bench", show=config.show_progress, leave=True)
    for name, s, method in bar:
        bar.set_postfix_str(f"{name}/{s} {method.name}")
        split = load_dataset(name, split=s, data_dir=data_dir, dtype=config.dtype, seed=config.seed)
        torch.manual_seed(config.seed + 1000 * s)
        cfg = replace(config, seed=config.seed + 1000 * s)
        t0 = time.perf_counter()
        try:
            pred = method.fit_predict(split, cfg)
            seconds = time.perf_counter() - t0
            scores = evaluate_prediction(split, pred)
        except GpextError as err:
            if raise_errors:
                raise
            run.failures.append({"dataset": split.name, "method": method.name, "error": str(err)})
            continue
        row = {"dataset": split.name, "method": method.name, "split": s, **scores}
        row["seconds"] = seconds
        run.rows.append(row)
        if keep_predictions:
            run.predictions[(split.name, method.name, s)] = (split, pred)
    return run

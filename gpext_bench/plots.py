"""Figures for ``gpext bench`` (matplotlib is imported only here, from the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

import torch

from gpext import metrics
from gpext_bench.runner import BenchRun

__all__ = ["plot_metrics", "plot_run"]


def plot_run(run: BenchRun, path: str | Path) -> Path | None:
    """Save one panel per dataset: predicted vs true (regression) or a reliability diagram.

    Uses split 0 of each dataset. Returns the path, or ``None`` when matplotlib is missing or
    there is nothing to plot.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    by_dataset: dict[str, list] = {}
    for (dataset, method, s), (split, pred) in run.predictions.items():
        if s == min(k[2] for k in run.predictions if k[0] == dataset):
            by_dataset.setdefault(dataset, []).append((method, split, pred))
    if not by_dataset:
        return None
    n = len(by_dataset)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 4), squeeze=False)
    for ax, (dataset, entries) in zip(axes[0], by_dataset.items()):
        split = entries[0][1]
        if split.task == "regression":
            y = split.test_y_original.cpu()
            lo, hi = float(y.min()), float(y.max())
            for method, _, pred in entries:
                mean = split.y_scaler.inverse_transform(pred.mean.to(split.test_y)).cpu()
                sd = (pred.variance.to(split.test_y).sqrt() * split.y_scaler.std).cpu()
                ax.errorbar(y, mean, yerr=2 * sd, fmt="o", ms=3, alpha=0.5, label=method)
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
            ax.set_xlabel("true")
            ax.set_ylabel("predicted (±2 sd)")
        else:
            for method, _, pred in entries:
                d = metrics.reliability_diagram_data(pred.probs.to(torch.float64), split.test_y)
                mask = d["bin_count"] > 0
                ax.plot(d["bin_confidence"][mask], d["bin_accuracy"][mask], "o-", label=method)
            ax.plot([0, 1], [0, 1], "k--", lw=1)
            ax.set_xlabel("confidence")
            ax.set_ylabel("accuracy")
        ax.set_title(dataset)
        ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_metrics(rows: list[dict], path: str | Path, metrics_order: tuple[str, ...] = (
    "rmse", "nll", "coverage95", "error", "mnll", "ece", "brier", "seconds",
)) -> Path | None:  # fmt: skip
    """Save one panel per metric, methods side by side (bars, ± one standard error) per dataset.

    Args:
        rows: Aggregated rows (:func:`~gpext_bench.results.aggregate_rows`).
        path: PNG path.
        metrics_order: Metrics to draw, in panel order; those no row has are left out.

    Returns:
        The path, or ``None`` when matplotlib is missing or no row has a metric.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    names = [m for m in metrics_order if any(m in r for r in rows)]
    if not names:
        return None
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.6), squeeze=False)
    for ax, metric in zip(axes[0], names):
        sel = [r for r in rows if metric in r]
        datasets = list(dict.fromkeys(r["dataset"] for r in sel))
        methods = list(dict.fromkeys(r["method"] for r in sel))
        width = 0.8 / len(methods)
        for j, method in enumerate(methods):
            xs, ys, es = [], [], []
            for i, dataset in enumerate(datasets):
                r = next(
                    (r for r in sel if r["dataset"] == dataset and r["method"] == method), None
                )
                if r is not None:
                    xs.append(i - 0.4 + width * (j + 0.5))
                    ys.append(r[metric])
                    es.append(r.get(f"{metric}_se", 0.0))
            ax.bar(xs, ys, width, yerr=es, capsize=2, label=method)
        ax.set_xticks(range(len(datasets)), datasets, rotation=30, ha="right", fontsize=8)
        ax.set_title(metric)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

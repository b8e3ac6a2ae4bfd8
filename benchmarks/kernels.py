"""gpext.kernels: RFF-Matern VBoot vs exact Matern GP, Nystrom-KPCA GP vs SGPR, NTK GP vs VBootMLP.

Three arms, each run on every split of every dataset, the arms' methods back to back in this
process on one thread (the order of each compared pair alternates over splits, so that load
changes of a shared machine hit both):

* **Arm A, RFF.** ``exact_matern52``: ``gpext.fit.build_exact_gp(x, y, kernel="matern52")``
  + ``fit_exact_gp`` (MAP under the default priors, L-BFGS from several starts) against
  ``vboot_rff_matern52``: ``VBootRFF(kernel="matern52")`` with its defaults (5000 features, 50
  particles; lengthscales, output scale, mean and noise fitted once by the same exact-GP fit on
  a random subset of ``hyper_num_points = 1000`` training points, 100 L-BFGS iterations per
  start).  ``time_ratio`` = VBoot-RFF seconds / exact seconds (fit and test prediction) on the
  same split.
* **Arm B, Nystrom.** ``nystrom_kpca_gp``: an exact GP whose kernel is
  ``ScaleKernel(NystromKPCAKernel(MaternKernel(nu=2.5, ARD), Z))`` against ``sgpr``: GPyTorch's
  ``InducingPointKernel(ScaleKernel(MaternKernel(nu=2.5, ARD)), Z, likelihood)``, with the same
  ``m`` landmarks / initial inducing points ``Z`` (a seeded random subset of the training
  inputs; ``--rank``, 128, quick 64: equal rank), the same initial values
  (``build_exact_gp(..., priors=False)``: lengthscales ``sqrt(d)``, output scale and noise
  from the targets' variance) and the same optimiser: ``gpext.fit.minimize_lbfgs`` on GPyTorch's
  ``ExactMarginalLogLikelihood`` (no priors), one start, 200 iterations (quick 100).  What is
  maximised differs by design: SGPR maximises Titsias' collapsed bound (the Nystrom/DTC
  marginal likelihood minus the trace term :math:`\\operatorname{tr}(K - Q)/2\\sigma^2`, which
  GPyTorch adds through the kernel's added loss term) and *learns the inducing locations*;
  the Nystrom-KPCA GP keeps its landmarks fixed and maximises the plain marginal likelihood of
  the Nystrom prior :math:`\\mathcal N(m, s\\,\\tilde K + \\sigma^2 I)` (subset-of-regressors
  / DTC evidence, no trace term).  Its predictions are those of an exact GP with the low-rank
  prior (SoR: the predictive variance far from the landmarks shrinks to the noise); SGPR's
  are GPyTorch's ``InducingPointKernel`` predictions.  ``nystrom_rank`` is the number of
  eigenpairs the KPCA kept (at most ``m``).  Priors are left out of this arm because
  ``named_priors`` yields a prior twice when a module is reachable by two paths
  (``NystromKPCAKernel.kpca.kernel`` is its base kernel; ``InducingPointKernel.likelihood``
  is the model's likelihood), so a MAP loss would count some priors twice for one arm only.
* **Arm C, NTK.** ``vboot_mlp``: ``VBootMLP()`` with its constructor defaults (10 particles of
  a 2 x 512 NTK-parameterised ReLU MLP, ``prior_std = 1``, the regression noise fitted once by
  an exact RBF GP on 500 points), trained with the schedule of the ``gpext bench`` VBoot-MLP
  recipe (``gpext_bench.methods_bootstrap``: float32, Adam lr 0.1 with cosine decay, batch
  ``min(256, max(32, N // 8))``, ``max(12 epochs, 600 steps)``; quick: 5 particles of 2 x 128,
  300 steps), against exact GPs with ``NeuralTangentKernel.from_vboot_mlp(model, kind=...)``:
  ``ntk_gp`` (the NTK :math:`\\Theta`, whose posterior mean is the infinite-width limit of the
  ensemble mean) and ``nngp_gp`` (the NNGP :math:`\\Sigma`, the exact Bayesian posterior of the
  infinitely wide network).  Both use VBootMLP's noise variance and its target offset as the
  constant mean, and are not fitted (the limit of the trained ensemble, not a separately tuned
  GP); their ``seconds`` are prediction only.  ``mean_rmse_vs_ntk_gp`` (on the ``vboot_mlp``
  row) is the RMSE between the ensemble mean and the NTK-GP posterior mean on the test inputs,
  in standardised units: how far the finite network is from its limit.  No goal.

Data: ``boston``, ``concrete``, ``energy``, ``yacht`` (the 90/10 UCI splits of
``../shared/data``, splits ``0 .. K-1``) and ``skillcraft`` (3338 rows, 19 inputs, the 10-fold
masks of the deep-kernel-learning protocol; split ``s`` is fold ``s``), loaded by
``gpext_bench.data.load_dataset``: inputs and targets standardised with the training part's statistics.
A training part larger than ``--max-train`` (default 2000) is subsampled to that many rows
without replacement (seeded by ``seed`` and the split; the standardisation is that of the whole
training fold): skillcraft's ~3005 training rows become 2000, what one core affords for the
exact GP (about 500 loss evaluations of ~1 to 2 s each per split); ``--max-train 0`` keeps all.
Without a data directory the bundled scikit-learn ``diabetes`` set is used instead.

Metrics per (dataset, method), mean and standard error over splits as separate numeric columns
(``nll``, ``nll_se``, ...): ``rmse`` and ``nll`` in the *original* target units (as in the UCI
literature; ``gpext_bench.evaluate_prediction``: the exact Gaussian-mixture density for the
bootstrap ensembles), ``coverage95``, ``r2`` (test :math:`R^2`), ``seconds`` (wall) and
``cpu_seconds`` (process CPU time, insensitive to other processes on one thread), ``time_ratio``
and ``cpu_time_ratio`` against the arm's baseline on the same split (mean of per-split ratios),
``n_train``, ``splits``; ``errors`` (fits that raised), ``warned`` (splits with a gpext warning)
and ``degenerate`` (fits that raised, predicted non-finite values, issued a
``VarianceCollapseWarning`` or ``ConstantPredictionWarning``, or explain less than 10% of the test
targets' variance).  Every warning raised during a fit is counted by class name in ``warnings``
(gpext warnings by name, others prefixed by their module); nothing is suppressed.

Goals (``goals`` in the JSON; what each means is in ``goal_definitions``):

* ``matern_vboot_rff_within_1se_and_faster_from_n2000``: on every dataset with ``n_train >=
  2000``, mean NLL of ``vboot_rff_matern52`` <= mean NLL of ``exact_matern52`` + its standard
  error over splits, and mean ``time_ratio`` < 1 (not evaluated when no such dataset ran);
* ``nystrom_kpca_at_least_as_accurate_as_sgpr``: on a strict majority of the datasets, mean NLL
  of ``nystrom_kpca_gp`` <= mean NLL of ``sgpr`` + SGPR's standard error over splits; the
  per-dataset outcomes are the ``nystrom_kpca_vs_sgpr[<dataset>]`` entries.

With one split a standard error is 0 (the comparisons become strict); ``paired_nll_difference``
gives the mean and standard error of the per-split differences of each compared pair.

``--quick`` runs one split per dataset with smaller budgets for both sides of every pair: exact
fit from 1 start with 50 L-BFGS iterations, VBoot-RFF with 1000 features, 20 particles and a
500-point hyperparameter fit from 1 start with 50 iterations, rank 64, 100 iterations in arm B,
the small VBootMLP above.  It checks that everything runs; its numbers are not the benchmark's.

    python benchmarks/kernels.py --quick    # 1 split per set: 3 min 10 s on a shared 2-core
                                            # machine (100 s of it the exact GP on skillcraft)
    python benchmarks/kernels.py            # 5 splits (skillcraft 3); estimated from the
                                            # quick run's evaluation costs at 1.5 to 2 hours
                                            # on one busy core, most of it the exact GP on
                                            # skillcraft (~500 evaluations of 1-2 s per split)
    python benchmarks/kernels.py --datasets skillcraft --splits 5 --max-train 0   # all rows
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import replace
from pathlib import Path

import gpytorch
import torch
from _common import base_parser, out_dir

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.errors import ConstantPredictionWarning, GpextWarning, VarianceCollapseWarning
from gpext.fit import (
    build_exact_gp,
    check_signal_to_noise,
    diagnose_exact_gp,
    fit_exact_gp,
    minimize_lbfgs,
)
from gpext.kernels import NeuralTangentKernel, NystromKPCAKernel
from gpext_bench import evaluate_prediction, write_results
from gpext_bench.data import load_dataset
from gpext_bench.registry import Prediction

SMALL = ("boston", "concrete", "energy", "yacht")
LARGE = ("skillcraft",)
FALLBACK = ("diabetes",)
#: Methods in order: arm A, arm B, arm C.  Baselines of the compared pairs below.
METHODS = (
    "exact_matern52",
    "vboot_rff_matern52",
    "sgpr",
    "nystrom_kpca_gp",
    "vboot_mlp",
    "ntk_gp",
    "nngp_gp",
)
PAIRS = {"vboot_rff_matern52": "exact_matern52", "nystrom_kpca_gp": "sgpr"}
DEGENERATE_WARNINGS = (VarianceCollapseWarning.__name__, ConstantPredictionWarning.__name__)
GOAL_DEFINITIONS = {
    "matern_vboot_rff_within_1se_and_faster_from_n2000": "on every dataset with n_train >= "
    "2000: mean nll(vboot_rff_matern52) <= mean nll(exact_matern52) + nll_se(exact_matern52) "
    "(standard error over splits; 0 with one split) and mean per-split time_ratio (wall "
    "seconds, fit + predict) < 1; absent when no such dataset ran",
    "nystrom_kpca_at_least_as_accurate_as_sgpr": "mean nll(nystrom_kpca_gp) <= mean nll(sgpr) "
    "+ nll_se(sgpr) on a strict majority of the datasets run (per dataset: "
    "nystrom_kpca_vs_sgpr[<dataset>]), at equal rank m",
}
MAX_CHOLESKY = 10**5  # Cholesky, never CG, as in gpext.fit.fit_exact_gp


# ---------------------------------------------------------------- settings
def settings(args) -> dict:
    """Budgets of every method (quick: reduced for both sides of each pair)."""
    q = args.quick
    return {
        "exact": dict(num_restarts=1, max_iter=50) if q else {},  # fit_exact_gp defaults
        "vboot_rff": (
            dict(
                num_features=1000,
                num_particles=20,
                hyper_num_points=500,
                hyper_restarts=1,
                hyper_iters=50,
            )
            if q
            else {}  # VBootRFF defaults
        ),
        "rank": args.rank or (64 if q else 128),
        "low_rank_max_iter": 100 if q else 200,
        "mlp": dict(
            num_particles=5 if q else 10,
            hidden_sizes=(128, 128) if q else (512, 512),
            min_steps=args.mlp_min_steps or (300 if q else 600),
        ),
    }


# ---------------------------------------------------------------- arm A
def _gp_predict(model, x):
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(MAX_CHOLESKY):
        out = model.likelihood(model(x))
        return Prediction(mean=out.mean.detach(), variance=out.variance.detach())


def exact_matern52(split, seed, cfg, _context):
    model = build_exact_gp(split.train_x, split.train_y, kernel="matern52")
    res = fit_exact_gp(model, generator=torch.Generator().manual_seed(seed), **cfg["exact"])
    info = {"stop_reason": res.stop_reason.value, "evaluations": float(res.num_evaluations)}
    return _gp_predict(model, split.test_x), info


def vboot_rff_matern52(split, seed, cfg, _context):
    model = VBootRFF(kernel="matern52", **cfg["vboot_rff"])
    res = model.fit(split.train_x, split.train_y, generator=torch.Generator().manual_seed(seed))
    means, variances = model.predict_mixture(split.test_x)
    info = {"stop_reason": res.stop_reason.value, "evaluations": float(res.num_evaluations)}
    return Prediction(mixture_means=means, mixture_variances=variances), info


# ---------------------------------------------------------------- arm B
def landmarks(split, m: int, seed: int) -> torch.Tensor:
    """``m`` training inputs drawn without replacement (shared by both arm-B methods)."""
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randperm(split.num_train, generator=gen)[: min(m, split.num_train)]
    return split.train_x[idx].clone()


def _fit_low_rank(model, scale, split, cfg, name):
    x, y = split.train_x, split.train_y
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    with gpytorch.settings.max_cholesky_size(MAX_CHOLESKY):
        res = minimize_lbfgs(lambda: -mll(model(x), y), params,
                             max_iter=cfg["low_rank_max_iter"], desc=name)  # fmt: skip
    model.eval()
    if not isinstance(model.covar_module, gpytorch.kernels.ScaleKernel):
        check_signal_to_noise(scale.outputscale.detach(), model.likelihood.noise.detach().mean(),
                              name=name, result=res)  # fmt: skip
    diagnose_exact_gp(model, res, name=name)  # signal-to-noise (ScaleKernel) and flat means
    return res


def nystrom_kpca_gp(split, _seed, cfg, context):
    model = build_exact_gp(split.train_x, split.train_y, kernel="matern52", priors=False)
    scale = model.covar_module
    scale.base_kernel = NystromKPCAKernel(scale.base_kernel, context["landmarks"])
    res = _fit_low_rank(model, scale, split, cfg, "nystrom_kpca_gp")
    with torch.no_grad():
        rank = scale.base_kernel.features(context["landmarks"][:1]).shape[-1]
    info = {"stop_reason": res.stop_reason.value, "evaluations": float(res.num_evaluations),
            "nystrom_rank": float(rank), "landmarks": float(context["landmarks"].shape[0])}  # fmt: skip
    return _gp_predict(model, split.test_x), info


def sgpr(split, _seed, cfg, context):
    model = build_exact_gp(split.train_x, split.train_y, kernel="matern52", priors=False)
    scale = model.covar_module
    model.covar_module = gpytorch.kernels.InducingPointKernel(
        scale, inducing_points=context["landmarks"].clone(), likelihood=model.likelihood
    )
    res = _fit_low_rank(model, scale, split, cfg, "sgpr")
    info = {"stop_reason": res.stop_reason.value, "evaluations": float(res.num_evaluations),
            "landmarks": float(context["landmarks"].shape[0])}  # fmt: skip
    return _gp_predict(model, split.test_x), info


# ---------------------------------------------------------------- arm C
def vboot_mlp(split, seed, cfg, context):
    s = cfg["mlp"]
    x = split.train_x.float()
    n = x.shape[0]
    model = VBootMLP(s["num_particles"], s["hidden_sizes"], seed=seed, dtype=torch.float32)
    batch = min(256, max(32, n // 8), n)
    epochs = max(12, -(-s["min_steps"] // max(1, n // batch)))
    res = model.fit(x, split.train_y.float(), num_epochs=epochs, batch_size=batch, lr=0.1,
                    cosine_decay=True)  # fmt: skip
    means, variances = model.predict_mixture(split.test_x.float())
    context["mlp"] = model
    context["mlp_mean"] = means.double().mean(0)
    info = {"stop_reason": res.stop_reason.value, "epochs": float(epochs),
            "batch_size": float(batch), "noise": float(model.noise_)}  # fmt: skip
    return Prediction(mixture_means=means.double(), mixture_variances=variances.double()), info


def _limit_gp(split, context, kind):
    mlp = context.get("mlp")
    if mlp is None:
        raise RuntimeError(f"{kind}_gp needs the fitted VBootMLP of this split, which failed")
    kernel = NeuralTangentKernel.from_vboot_mlp(mlp, kind=kind)
    model = build_exact_gp(split.train_x, split.train_y, kernel=kernel)
    with torch.no_grad():
        model.likelihood.noise = float(mlp.noise_)
        const = model.mean_module.constant
        const.copy_(mlp.offset.to(const).reshape(const.shape))
    model.eval()
    pred = _gp_predict(model, split.test_x)
    info = {"noise": float(mlp.noise_)}
    if kind == "ntk":
        context["ntk_mean"] = pred.mean
    return pred, info


def ntk_gp(split, _seed, _cfg, context):
    return _limit_gp(split, context, "ntk")


def nngp_gp(split, _seed, _cfg, context):
    return _limit_gp(split, context, "nngp")


FUNCTIONS = {
    "exact_matern52": exact_matern52,
    "vboot_rff_matern52": vboot_rff_matern52,
    "sgpr": sgpr,
    "nystrom_kpca_gp": nystrom_kpca_gp,
    "vboot_mlp": vboot_mlp,
    "ntk_gp": ntk_gp,
    "nngp_gp": nngp_gp,
}


# ---------------------------------------------------------------- running and scoring
def _warning_name(w) -> str:
    cat = w.category
    if issubclass(cat, GpextWarning):
        return cat.__name__
    return f"{cat.__module__.split('.')[0]}.{cat.__name__}"


def run_method(method, split, seed, cfg, context) -> dict:
    """Fit and predict (timed together), catching and recording warnings and errors."""
    rec = {"dataset": split.name, "method": method, "split": split.split_index,
           "n_train": split.num_train, "error": None}  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            pred, info = FUNCTIONS[method](split, seed, cfg, context)
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            pred, info = None, {}
            rec["error"] = f"{type(err).__name__}: {err}"
            rec["traceback"] = traceback.format_exc(limit=4)
        rec["seconds"] = time.perf_counter() - t0
        rec["cpu_seconds"] = time.process_time() - c0
    rec["warnings"] = dict(Counter(_warning_name(w) for w in caught))
    rec["gpext_warned"] = any(issubclass(w.category, GpextWarning) for w in caught)
    rec.update(info)
    if pred is not None:
        finite = bool(torch.isfinite(pred.mean).all() and torch.isfinite(pred.variance).all())
        rec["finite"] = finite
        if finite:
            rec.update(evaluate_prediction(split, pred))
            y = split.test_y
            rec["r2"] = 1.0 - float((y - pred.mean.to(y)).square().mean() / y.var())
    rec["degenerate"] = (
        pred is None
        or not rec.get("finite", False)
        or rec.get("r2", -math.inf) < 0.1
        or any(name in rec["warnings"] for name in DEGENERATE_WARNINGS)
    )
    return rec


def _mean_se(values):
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return statistics.fmean(vals), se


def aggregate(records) -> list[dict]:
    """One row per (dataset, method): means and standard errors over splits, ratios, counts."""
    by_key: dict[tuple, list[dict]] = {}
    for r in records:
        by_key.setdefault((r["dataset"], r["method"]), []).append(r)
    rows = []
    for (dataset, method), runs in by_key.items():
        row = {"dataset": dataset, "method": method, "splits": float(len(runs))}
        row["n_train"] = statistics.fmean(r["n_train"] for r in runs)
        for key in ("nll", "rmse", "coverage95", "r2", "seconds", "cpu_seconds"):
            mean, se = _mean_se(r.get(key) for r in runs)
            row[key] = mean
            if key in ("nll", "rmse", "seconds"):
                row[f"{key}_se"] = se
        base = PAIRS.get(method)
        if base is not None:
            ref = {r["split"]: r for r in by_key.get((dataset, base), [])}
            for key, name in (("seconds", "time_ratio"), ("cpu_seconds", "cpu_time_ratio")):
                ratios = [r[key] / ref[r["split"]][key] for r in runs
                          if r["split"] in ref and ref[r["split"]][key] > 0]  # fmt: skip
                row[name] = statistics.fmean(ratios) if ratios else math.nan
        for key in ("nystrom_rank", "landmarks", "evaluations", "mean_rmse_vs_ntk_gp"):
            vals = [r[key] for r in runs if key in r]
            if vals:
                row[key] = statistics.fmean(vals)
        row["errors"] = float(sum(r["error"] is not None for r in runs))
        row["warned"] = float(sum(r["gpext_warned"] for r in runs))
        row["degenerate"] = float(sum(r["degenerate"] for r in runs))
        rows.append(row)
    return rows


def paired_differences(records) -> dict:
    """Mean and standard error over splits of ``nll(method) - nll(baseline)`` per pair."""
    out = {}
    for method, base in PAIRS.items():
        for dataset in dict.fromkeys(r["dataset"] for r in records):
            ref = {r["split"]: r for r in records
                   if r["dataset"] == dataset and r["method"] == base and "nll" in r}  # fmt: skip
            diffs = [r["nll"] - ref[r["split"]]["nll"] for r in records
                     if r["dataset"] == dataset and r["method"] == method and "nll" in r
                     and r["split"] in ref]  # fmt: skip
            if diffs:
                mean, se = _mean_se(diffs)
                out[f"{method}-{base}[{dataset}]"] = {"mean": mean, "se": se,
                                                      "splits": float(len(diffs))}  # fmt: skip
    return out


def evaluate_goals(rows) -> tuple[dict, dict]:
    """The issue's goals (``{name: bool}``) and notes on goals that could not be evaluated."""
    get = {(r["dataset"], r["method"]): r for r in rows}
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    goals, notes = {}, {}
    big = [d for d in datasets
           if (d, "exact_matern52") in get and (d, "vboot_rff_matern52") in get
           and get[(d, "exact_matern52")]["n_train"] >= 2000]  # fmt: skip
    if big:
        ok = True
        for d in big:
            ex, rff = get[(d, "exact_matern52")], get[(d, "vboot_rff_matern52")]
            ok &= rff["nll"] <= ex["nll"] + ex["nll_se"] and rff.get("time_ratio", math.inf) < 1
        goals["matern_vboot_rff_within_1se_and_faster_from_n2000"] = bool(ok)
    else:
        notes["matern_vboot_rff_within_1se_and_faster_from_n2000"] = (
            "not evaluated: no dataset with n_train >= 2000 ran both arm-A methods"
        )
    pairs = [d for d in datasets if (d, "sgpr") in get and (d, "nystrom_kpca_gp") in get]
    if pairs:
        wins = 0
        for d in pairs:
            sg, ny = get[(d, "sgpr")], get[(d, "nystrom_kpca_gp")]
            ok = bool(ny["nll"] <= sg["nll"] + sg["nll_se"])
            goals[f"nystrom_kpca_vs_sgpr[{d}]"] = ok
            wins += ok
        goals["nystrom_kpca_at_least_as_accurate_as_sgpr"] = bool(2 * wins > len(pairs))
    else:
        notes["nystrom_kpca_at_least_as_accurate_as_sgpr"] = "not evaluated: arm B did not run"
    return goals, notes


# ---------------------------------------------------------------- main
def load_split(name, split_index, args):
    split = load_dataset(name, split=split_index, data_dir=args.data_dir or None, seed=args.seed)
    if args.max_train and split.num_train > args.max_train:
        gen = torch.Generator().manual_seed(args.seed + 7919 * split_index)
        idx = torch.randperm(split.num_train, generator=gen)[: args.max_train]
        split = replace(split, train_x=split.train_x[idx], train_y=split.train_y[idx],
                        train_indices=None)  # fmt: skip
    return split


def _brief(rec) -> str:
    parts = [f"{k}={rec[k]:.4g}" for k in ("nll", "rmse", "r2", "seconds") if k in rec]
    if rec["warnings"]:
        parts.append(f"warnings={rec['warnings']}")
    if rec["error"]:
        parts.append(f"error={rec['error'][:160]}")
    if rec["degenerate"]:
        parts.append("DEGENERATE")
    return " ".join(parts)


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--datasets", nargs="+", default=None,
                   help="default boston concrete energy yacht skillcraft (diabetes without "
                   "a data directory)")  # fmt: skip
    p.add_argument("--splits", type=int, default=None,
                   help="splits per dataset (default 1 quick; full 5, 3 for skillcraft)")  # fmt: skip
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--max-train", type=int, default=2000,
                   help="subsample larger training parts to this many rows (0: keep all)")  # fmt: skip
    p.add_argument("--rank", type=int, default=None,
                   help="landmarks / inducing points of arm B (default 128, quick 64)")  # fmt: skip
    p.add_argument("--mlp-min-steps", type=int, default=None,
                   help="minimum VBootMLP Adam steps (default 600, quick 300)")  # fmt: skip
    p.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                   help="merge the records of earlier runs into one results file")  # fmt: skip
    args = p.parse_args(argv)
    if args.combine:
        return _combine(args)
    torch.set_num_threads(1)
    cfg = settings(args)
    datasets = args.datasets or (SMALL + LARGE if args.data_dir else FALLBACK)
    methods = [m for m in METHODS if m in args.methods]
    for method, base in PAIRS.items():  # a compared method always runs with its baseline
        if method in methods and base not in methods:
            methods.insert(methods.index(method), base)
    if ("ntk_gp" in methods or "nngp_gp" in methods) and "vboot_mlp" not in methods:
        methods.insert(methods.index("ntk_gp" if "ntk_gp" in methods else "nngp_gp"), "vboot_mlp")
    start = time.perf_counter()
    records = []
    for name in datasets:
        n_splits = args.splits or (1 if args.quick else (3 if name in LARGE else 5))
        for s in range(n_splits):
            split = load_split(name, s, args)
            seed = args.seed + 1000 * s
            context = {"landmarks": landmarks(split, cfg["rank"], seed)}
            order = list(methods)
            if s % 2:  # alternate the order within each compared pair
                for method, base in PAIRS.items():
                    if method in order and base in order:
                        i, j = order.index(base), order.index(method)
                        order[i], order[j] = order[j], order[i]
            split_recs = {}
            for method in order:
                rec = run_method(method, split, seed, cfg, context)
                split_recs[method] = rec
                records.append(rec)
                print(f"[kernels] {name} split {s} (n={split.num_train}) {method}: {_brief(rec)}",
                      flush=True)  # fmt: skip
            if "mlp_mean" in context and "ntk_mean" in context:
                gap = (context["mlp_mean"] - context["ntk_mean"]).square().mean().sqrt()
                split_recs["vboot_mlp"]["mean_rmse_vs_ntk_gp"] = float(gap)
    command = "python benchmarks/kernels.py " + " ".join(sys.argv[1:] if argv is None else argv)
    settings_record = {
        **cfg,
        "quick": args.quick,
        "max_train": args.max_train,
        "threads": torch.get_num_threads(),
        "seed": args.seed,
        "nll_units": "original target units",
    }
    return _write(records, args, command.strip(), settings_record, time.perf_counter() - start)


def _combine(args) -> int:
    """Merge the per-split records of earlier runs (e.g. parallel runs over disjoint sets)."""
    import json

    records, commands, settings_list, seconds = [], [], [], 0.0
    for path in args.combine:
        data = json.loads(Path(path).read_text())
        records.extend(data["per_split"])
        commands.append(data["command"])
        settings_list.append(data.get("settings", {}))
        seconds += float(data.get("total_seconds", 0.0))
    return _write(records, args, " ; ".join(commands), settings_list, seconds)


def _write(records, args, command, settings_record, total_seconds) -> int:
    rows = aggregate(records)
    goals, notes = evaluate_goals(rows)
    warn_summary = {}
    for rec in records:
        key = f"{rec['dataset']}/{rec['method']}"
        warn_summary.setdefault(key, Counter()).update(rec["warnings"])
    extra = {
        "goals": goals,
        "goal_definitions": GOAL_DEFINITIONS,
        "goals_not_evaluated": notes,
        "paired_nll_difference": paired_differences(records),
        "warnings": {k: dict(v) for k, v in warn_summary.items() if v},
        "settings": settings_record,
        "total_seconds": total_seconds,
        "per_split": records,
    }
    write_results("kernels", rows, out_dir(args), command=command, extra=extra,
                  title="gpext.kernels: RFF, Nystrom-KPCA and NTK kernels against their "
                  "baselines", markdown_skip=("per_split",))  # fmt: skip
    print(f"[kernels] goals: {goals} {notes}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

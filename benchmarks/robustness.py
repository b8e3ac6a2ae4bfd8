"""Ordinary-use robustness: every gpext model with its defaults, counted for silent failures.

A new user fits a model with its default settings on an ordinary problem.  This benchmark does
exactly that, 10 seeds per problem (2 in ``--quick``), and records per (problem, model):

* ``silent_failures``: fits that ended degenerate with no gpext warning or error.  A fit is
  *degenerate* (judged here, independently of the model's own checks) when it crashed with a
  non-gpext exception, predicts non-finite values, or explains less than 10% of the training
  targets' variance (train :math:`R^2 < 0.1`) while GPyTorch's exact GP on the same data
  explains at least 30% (there is signal to fit); for classification, when its accuracy is
  below 1.5 / C.  A fit counts as *warned* when a :class:`gpext.errors.GpextWarning` was
  issued or a :class:`gpext.errors.GpextError` raised;
* ``degenerate``, ``warned``: the counts behind it, and ``warnings``: which warnings (JSON);
* ``coverage95``: share of test targets inside the central 95% predictive interval
  (predictive variance including the observation noise);
* ``gap_beyond_2sd`` (toys): share of test targets in the gap of the training inputs that lie
  more than 2 predictive standard deviations (noise included) from the predictive mean;
* ``rmse``, ``nll`` (standardised units), accuracy and MNLL (digits);
* ``seconds`` and ``time_ratio``: fit plus prediction time, and its ratio to the GPyTorch
  baseline of the same problem and seed (same process, back to back, one thread).

Problems:

* ``gap1d``: :math:`y = \\sin x + \\epsilon`, sd 0.15, 300 points on :math:`[-6,-2]\\cup[2,6]`
  (the trustworthy-fits issue's toy); gap test points on :math:`(-2, 2)`;
* ``gap2d``: :math:`y = \\sin(2x_1)\\cos(1.5x_2) + 0.3x_1 + \\epsilon`, sd 0.1, 400 points on
  :math:`[-2,2]^2` outside the disc of radius 0.9; gap test points inside the disc;
* ``branin_n4``, ``branin_n20``, ``hartmann6_n12``, ``hartmann6_n60``: BoTorch test functions
  on the unit cube with ``n = 2d`` and ``10d`` scrambled Sobol points (noise-free), 500 random
  test points;
* ``boston``, ``concrete``, ``energy``, ``yacht``: the standard 90/10 UCI splits 0-9 (seed =
  split) from ``../shared/data``;
* ``digits``: scikit-learn digits, 70/30 stratified split (``random_state`` = seed; 3 seeds in
  the full run, 1 in quick), ``DirichletGPClassifier(10).fit(x, y)`` against GPyTorch's
  Dirichlet recipe (``DirichletClassificationLikelihood``, batch ExactGP, Adam lr 0.1, 50 steps,
  256 posterior samples).

Inputs and targets are standardised with training statistics (the designs' inputs stay on the
unit cube).  Regression models, each with its defaults:

* ``gpytorch_exact`` (baseline): GPyTorch ``ExactGP``, constant mean, ``ScaleKernel(RBF, ARD)``,
  ``GaussianLikelihood``, Adam lr 0.1 for 100 steps on the exact marginal likelihood (the
  GPyTorch tutorial recipe);
* ``exact_gp``: ``gpext.fit.build_exact_gp`` + ``fit_exact_gp`` (MAP, default priors, restarts);
* ``vboot_rff``: ``VBootRFF()``;
* ``ign``: ``InducingGPNetwork(MLP(d, [64, 64], 8), num_inducing=32).fit(x, y, epochs=200)``;
* ``ign_input_aware``: the same with the documented distance-aware embedding
  ``InputAugmentedEmbedding(MLP(d, [64, 64], 8), in_features=d)``;
* ``gwi``: ``GWIRegressionModel.from_data(x, y)`` then ``fit(likelihood, x, y, epochs=100)``;
* ``pca_ess``: ``HeteroscedasticMLP(d, [50])`` trained by ``train_sgd_trajectory`` (200 epochs,
  the last 50 collected), PCA subspace of rank 10, 32 elliptical-slice samples at temperature
  ``N / rank`` or, from 200 rows, chosen on a 10% hold-out by
  ``SubspaceModel.select_temperature`` together with its factor on the network's predicted
  variances (``fit_weight_ensemble``'s defaults).

Goals: zero silent failures for every gpext model; ``coverage95`` in [0.90, 0.98] on the UCI
sets; for the GP-based models (``exact_gp``, ``vboot_rff``, ``ign``, ``ign_input_aware``, ``gwi``) ``gap_beyond_2sd``
at most 0.2 on both toys; digits ``DirichletGPClassifier`` accuracy at least 0.985, MNLL at most
0.11 and time at most GPyTorch's recipe.

    python benchmarks/robustness.py --quick    # 2 seeds, a few minutes
    python benchmarks/robustness.py            # 10 seeds (see --seeds, --problems, --models)
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import traceback
import warnings
from pathlib import Path

import gpytorch
import numpy as np
import torch
from _common import base_parser, out_dir

from gpext.errors import GpextError, GpextWarning
from gpext_bench import write_results

TOYS = ("gap1d", "gap2d")
DESIGNS = ("branin_n4", "branin_n20", "hartmann6_n12", "hartmann6_n60")
UCI = ("boston", "concrete", "energy", "yacht")
PROBLEMS = TOYS + DESIGNS + UCI + ("digits",)
REG_MODELS = ("gpytorch_exact", "exact_gp", "vboot_rff", "ign", "ign_input_aware", "gwi", "pca_ess")
GP_BASED = ("exact_gp", "vboot_rff", "ign", "ign_input_aware", "gwi")
CLS_MODELS = ("gpytorch_dirichlet", "dirichlet_gp")
BASELINES = ("gpytorch_exact", "gpytorch_dirichlet")


# ---------------------------------------------------------------- data
def _toy(name: str, seed: int):
    gen = torch.Generator().manual_seed(1000 + seed)
    dt = torch.float64
    if name == "gap1d":
        side = torch.randint(0, 2, (300,), generator=gen).to(dt)
        x = (torch.rand(300, generator=gen, dtype=dt) * 4 + 2) * (2 * side - 1)
        xte = (torch.rand(200, generator=gen, dtype=dt) * 4 + 2) * (
            2 * torch.randint(0, 2, (200,), generator=gen).to(dt) - 1
        )
        xgap = torch.linspace(-1.95, 1.95, 100, dtype=dt)
        f = torch.sin
        x, xte, xgap = x[:, None], xte[:, None], xgap[:, None]
        sd = 0.15
    else:
        pts = []
        while sum(p.shape[0] for p in pts) < 600:
            c = torch.rand(400, 2, generator=gen, dtype=dt) * 4 - 2
            pts.append(c[c.norm(dim=-1) > 0.9])
        allx = torch.cat(pts)
        x, xte = allx[:400], allx[400:600]
        r = torch.rand(100, generator=gen, dtype=dt).sqrt() * 0.85
        a = torch.rand(100, generator=gen, dtype=dt) * 2 * math.pi
        xgap = torch.stack([r * a.cos(), r * a.sin()], -1)

        def f(z):
            return torch.sin(2 * z[..., 0]) * torch.cos(1.5 * z[..., 1]) + 0.3 * z[..., 0]

        sd = 0.1

    def obs(z):
        fz = f(z[:, 0]) if z.shape[-1] == 1 else f(z)
        return fz + sd * torch.randn(z.shape[0], generator=gen, dtype=dt)

    return x, obs(x), {"test": (xte, obs(xte)), "gap": (xgap, obs(xgap))}


def _design(name: str, seed: int):
    from botorch.test_functions import Branin, Hartmann

    fn, n = {
        "branin_n4": (Branin(), 4),
        "branin_n20": (Branin(), 20),
        "hartmann6_n12": (Hartmann(dim=6), 12),
        "hartmann6_n60": (Hartmann(dim=6), 60),
    }[name]
    d = fn.dim
    lo, hi = fn.bounds[0].double(), fn.bounds[1].double()
    x = torch.quasirandom.SobolEngine(d, scramble=True, seed=seed).draw(n).double()
    gen = torch.Generator().manual_seed(2000 + seed)
    xte = torch.rand(500, d, generator=gen, dtype=torch.float64)

    def f(z):
        return fn(lo + z * (hi - lo)).double()

    return x, f(x), {"test": (xte, f(xte))}


def _uci(name: str, split: int, data_dir: str):
    folder = Path(data_dir) / name
    data = np.loadtxt(folder / "data.txt")
    feats = np.loadtxt(folder / "index_features.txt", dtype=int)
    target = int(np.loadtxt(folder / "index_target.txt"))
    tr = np.loadtxt(folder / f"index_train_{split}.txt", dtype=int)
    te = np.loadtxt(folder / f"index_test_{split}.txt", dtype=int)
    x = torch.tensor(data[:, feats], dtype=torch.float64)
    y = torch.tensor(data[:, target], dtype=torch.float64)
    return x[tr], y[tr], {"test": (x[te], y[te])}


def _standardise(x, y, tests, scale_x: bool):
    mx, sx = x.mean(0), x.std(0)
    sx = torch.where(sx > 0, sx, torch.ones_like(sx))
    my, sy = y.mean(), y.std()
    tx = (lambda z: (z - mx) / sx) if scale_x else (lambda z: z)
    out = {k: (tx(a), (b - my) / sy) for k, (a, b) in tests.items()}
    return tx(x), (y - my) / sy, out


# ---------------------------------------------------------------- regression models
def _gpytorch_exact(x, y, gen):
    class Model(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1])
            )

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(z), self.covar_module(z)
            )

    model = Model().double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model.train()
    with gpytorch.settings.max_cholesky_size(10**5):
        for _ in range(100):
            opt.zero_grad()
            (-mll(model(x), y)).backward()
            opt.step()
    model.eval()

    def predict(z):
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**5):
            out = model.likelihood(model(z))
            return out.mean, out.variance

    return predict


def _exact_gp(x, y, gen):
    from gpext.fit import build_exact_gp, fit_exact_gp

    model = build_exact_gp(x, y)
    fit_exact_gp(model, generator=gen)

    def predict(z):
        with torch.no_grad(), gpytorch.settings.max_cholesky_size(10**5):
            out = model.likelihood(model(z))
            return out.mean, out.variance

    return predict


def _vboot_rff(x, y, gen):
    from gpext.bootstrap import VBootRFF

    model = VBootRFF()
    model.fit(x, y, generator=gen)

    def predict(z):
        means, variances = model.predict_mixture(z)  # (K, M) each
        means, variances = means.squeeze(-1), variances.squeeze(-1)
        mean = means.mean(0)
        return mean, (variances + means.square()).mean(0) - mean.square()

    return predict


def _ign(x, y, gen):
    from gpext.models import InducingGPNetwork
    from gpext.nn import MLP

    model = InducingGPNetwork(MLP(x.shape[-1], [64, 64], 8), num_inducing=32).double()
    model.fit(x, y, epochs=200, generator=gen)
    return lambda z: model.predict(z)


def _ign_input_aware(x, y, gen):
    from gpext.models import InducingGPNetwork
    from gpext.nn import MLP, InputAugmentedEmbedding

    d = x.shape[-1]
    emb = InputAugmentedEmbedding(MLP(d, [64, 64], 8), in_features=d)
    model = InducingGPNetwork(emb, num_inducing=32).double()
    model.fit(x, y, epochs=200, generator=gen)
    return lambda z: model.predict(z)


def _gwi(x, y, gen):
    from gpext.models import GWIRegressionModel

    model, likelihood = GWIRegressionModel.from_data(x, y, generator=gen)
    model.fit(likelihood, x, y, epochs=100, generator=gen)
    return lambda z: model.predict(likelihood, z)


def _pca_ess(x, y, gen):
    from gpext.nn import HeteroscedasticMLP
    from gpext.subspace import (
        OutputLikelihood,
        PCASubspace,
        SubspaceModel,
        regression_mixture_moments,
        train_sgd_trajectory,
    )

    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=gen)))
    x_val = y_val = None
    if x.shape[0] >= 200:  # fit_weight_ensemble's default hold-out for the temperature
        perm = torch.randperm(x.shape[0], generator=gen)
        n_val = round(0.1 * x.shape[0])
        x_val, y_val, x, y = x[perm[:n_val]], y[perm[:n_val]], x[perm[n_val:]], y[perm[n_val:]]
    net = HeteroscedasticMLP(x.shape[-1], [50]).double()
    likelihood = OutputLikelihood("heteroscedastic_gaussian", min_variance=1e-6)
    traj = train_sgd_trajectory(net, x, y, likelihood, epochs=200, swa_start=150, lr=1e-2,
                                weight_decay=1e-3, max_deviations=20, generator=gen)  # fmt: skip
    devs = traj.deviations()
    pca = PCASubspace(min(10, devs.shape[0] - 1)).fit(devs, generator=gen)
    sub = SubspaceModel(net, traj.mean, pca.projection, likelihood,
                        temperature=x.shape[0] / pca.rank)  # fmt: skip
    if x_val is None:
        thetas = sub.sample_ess(x, y, 32, burn_in=32, generator=gen)
        sub.check_fit(x, y, thetas)
    else:
        _, thetas, _ = sub.select_temperature(
            x, y, x_val, y_val, num_samples=32, burn_in=32, generator=gen
        )

    def predict(z):
        out = sub.predict(z, thetas)
        return regression_mixture_moments(out["means"], out["variances"])

    return predict


REGRESSORS = {
    "gpytorch_exact": _gpytorch_exact,
    "exact_gp": _exact_gp,
    "vboot_rff": _vboot_rff,
    "ign": _ign,
    "ign_input_aware": _ign_input_aware,
    "gwi": _gwi,
    "pca_ess": _pca_ess,
}


def _run_regression(model_name, x, y, tests, seed):
    gen = torch.Generator().manual_seed(seed)
    rec = {"warnings": [], "error": None}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            predict = REGRESSORS[model_name](x, y, gen)
            with torch.no_grad():
                rec["train"] = [t.detach() for t in predict(x)]
                rec["tests"] = {k: [t.detach() for t in predict(a)] for k, (a, _) in tests.items()}
        except Exception as err:  # noqa: BLE001 - recorded, the run goes on
            rec["error"] = f"{type(err).__name__}: {err}"
            rec["gpext_error"] = isinstance(err, GpextError)
            rec["traceback"] = traceback.format_exc(limit=3)
    rec["seconds"] = time.perf_counter() - start
    rec["warnings"] = sorted(
        {type(w.message).__name__ for w in caught if issubclass(w.category, GpextWarning)}
    )
    return rec


def _r2(mean, y):
    return 1.0 - float((y - mean).pow(2).mean()) / float(y.var())


def _score_regression(rec, y, tests, baseline_r2):
    out = {"seconds": rec["seconds"], "warnings": rec["warnings"], "error": rec["error"]}
    warned = bool(rec["warnings"]) or bool(rec.get("gpext_error"))
    if rec["error"] is not None:
        out.update(degenerate=True, warned=warned)
        return out
    mean_tr = rec["train"][0]
    finite = all(bool(torch.isfinite(t).all()) for pair in rec["tests"].values() for t in pair)
    r2 = _r2(mean_tr, y) if bool(torch.isfinite(mean_tr).all()) else -math.inf
    degenerate = (not finite) or (r2 < 0.1 and baseline_r2 >= 0.3)
    out.update(train_r2=r2, degenerate=degenerate, warned=warned)
    for key, (_, yt) in tests.items():
        mean, var = rec["tests"][key]
        sd = var.clamp_min(1e-300).sqrt()
        z = (yt - mean) / sd
        if key == "test":
            out["coverage95"] = float((z.abs() <= 1.959964).double().mean())
            out["rmse"] = float((yt - mean).pow(2).mean().sqrt())
            out["nll"] = float((0.5 * z.square() + sd.log() + 0.5 * math.log(2 * math.pi)).mean())
        else:
            out["gap_beyond_2sd"] = float((z.abs() > 2.0).double().mean())
    return out


# ---------------------------------------------------------------- digits
def _digits(seed: int):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.3, stratify=y, random_state=seed)
    xtr, xte = torch.tensor(xtr, dtype=torch.float64), torch.tensor(xte, dtype=torch.float64)
    mu, sd = xtr.mean(0), xtr.std(0)
    sd[sd == 0] = 1
    return (xtr - mu) / sd, torch.tensor(ytr), (xte - mu) / sd, torch.tensor(yte)


def _gpytorch_dirichlet(xtr, ytr, xte, seed):
    from gpytorch.likelihoods import DirichletClassificationLikelihood

    lik = DirichletClassificationLikelihood(ytr, learn_additional_noise=True, dtype=torch.float64)
    c = lik.num_classes

    class Model(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(xtr, lik.transformed_targets, lik)
            b = torch.Size((c,))
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=b)
            self.covar_module = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(batch_shape=b), batch_shape=b
            )

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(
                self.mean_module(z), self.covar_module(z)
            )

    model = Model().double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model.train()
    lik.train()
    for _ in range(50):
        opt.zero_grad()
        (-mll(model(xtr), lik.transformed_targets).sum()).backward()
        opt.step()
    model.eval()
    lik.eval()
    torch.manual_seed(seed)
    with torch.no_grad():
        s = model(xte).sample(torch.Size((256,))).exp()
        return (s / s.sum(-2, keepdim=True)).mean(0).T


def _dirichlet_gp(xtr, ytr, xte, seed):
    from gpext.models import DirichletGPClassifier

    clf = DirichletGPClassifier(10)
    clf.fit(xtr, ytr)
    return clf.predict_proba(xte, generator=torch.Generator().manual_seed(seed))


def _run_digits(model_name, seed):
    xtr, ytr, xte, yte = _digits(seed)
    fn = {"gpytorch_dirichlet": _gpytorch_dirichlet, "dirichlet_gp": _dirichlet_gp}[model_name]
    out = {"error": None}
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            probs = fn(xtr, ytr, xte, seed)
        except Exception as err:  # noqa: BLE001
            out["error"] = f"{type(err).__name__}: {err}"
            probs = None
            gpext_error = isinstance(err, GpextError)
    out["seconds"] = time.perf_counter() - start
    out["warnings"] = sorted(
        {type(w.message).__name__ for w in caught if issubclass(w.category, GpextWarning)}
    )
    warned = bool(out["warnings"]) or (out["error"] is not None and gpext_error)
    if probs is None:
        out.update(degenerate=True, warned=warned)
        return out
    acc = float((probs.argmax(-1) == yte).double().mean())
    mnll = float(-probs[torch.arange(len(yte)), yte].clamp_min(1e-12).log().mean())
    out.update(accuracy=acc, mnll=mnll, degenerate=acc < 1.5 / 10, warned=warned)
    return out


# ---------------------------------------------------------------- aggregation
def _mean_se(values):
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return math.nan, math.nan
    se = statistics.stdev(vals) / math.sqrt(len(vals)) if len(vals) > 1 else 0.0
    return statistics.fmean(vals), se


def _aggregate(problem, model, runs, base_seconds):
    row = {"dataset": problem, "method": model, "seeds": float(len(runs))}
    row["degenerate"] = float(sum(r["degenerate"] for r in runs))
    row["warned"] = float(sum(r["warned"] for r in runs))
    row["silent_failures"] = float(sum(r["degenerate"] and not r["warned"] for r in runs))
    row["errors"] = float(sum(r["error"] is not None for r in runs))
    for key in ("coverage95", "gap_beyond_2sd", "rmse", "nll", "train_r2", "accuracy", "mnll",
                "seconds"):  # fmt: skip
        vals = [r.get(key) for r in runs]
        if any(v is not None for v in vals):
            row[key], row[f"{key}_se"] = _mean_se(vals)
    if base_seconds:
        ratios = [r["seconds"] / b for r, b in zip(runs, base_seconds) if b]
        row["time_ratio"] = statistics.fmean(ratios) if ratios else math.nan
    return row


def main(argv=None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=None, help="seeds per problem (default 10)")
    p.add_argument("--digits-seeds", type=int, default=None, help="digits splits (default 3)")
    p.add_argument("--problems", nargs="+", default=list(PROBLEMS), choices=PROBLEMS)
    p.add_argument("--models", nargs="+", default=list(REG_MODELS + CLS_MODELS),
                   choices=REG_MODELS + CLS_MODELS)  # fmt: skip
    p.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                   help="merge the rows of earlier runs (e.g. parallel runs over disjoint "
                   "problems, or a rerun of some models first and the earlier full run "
                   "after it) into one results file instead of running; for a (problem, model) "
                   "in several files the first file's rows are kept")  # fmt: skip
    args = p.parse_args(argv)
    if args.combine:
        return _combine(args)
    torch.set_num_threads(1)
    seeds = args.seeds or (2 if args.quick else 10)
    digit_seeds = args.digits_seeds or (1 if args.quick else 3)
    rows, per_seed = [], {}
    for problem in args.problems:
        if problem == "digits":
            models = [m for m in CLS_MODELS if m in args.models]
            if "dirichlet_gp" in models and "gpytorch_dirichlet" not in models:
                models.insert(0, "gpytorch_dirichlet")
            runs = {m: [] for m in models}
            for seed in range(digit_seeds):
                for m in models:
                    runs[m].append(_run_digits(m, seed))
                    print(f"[robustness] digits seed {seed} {m}: {_brief(runs[m][-1])}",
                          flush=True)  # fmt: skip
            base = [r["seconds"] for r in runs.get("gpytorch_dirichlet", [])]
            for m in models:
                rows.append(_aggregate(problem, m, runs[m], base if m != BASELINES[1] else None))
                per_seed[f"{problem}/{m}"] = runs[m]
            continue
        if problem in UCI and not args.data_dir:
            print(f"[robustness] skipping {problem}: no --data-dir", flush=True)
            continue
        models = [m for m in REG_MODELS if m in args.models]
        if "gpytorch_exact" not in models:
            models.insert(0, "gpytorch_exact")
        runs = {m: [] for m in models}
        for seed in range(seeds):
            if problem in TOYS:
                x, y, tests = _toy(problem, seed)
                x, y, tests = _standardise(x, y, tests, scale_x=True)
            elif problem in DESIGNS:
                x, y, tests = _design(problem, seed)
                x, y, tests = _standardise(x, y, tests, scale_x=False)
            else:
                x, y, tests = _uci(problem, seed, args.data_dir)
                x, y, tests = _standardise(x, y, tests, scale_x=True)
            base_r2 = None
            for m in models:
                rec = _run_regression(m, x, y, tests, seed)
                if m == "gpytorch_exact":
                    ok = rec["error"] is None and bool(torch.isfinite(rec["train"][0]).all())
                    base_r2 = _r2(rec["train"][0], y) if ok else 1.0
                scored = _score_regression(rec, y, tests, base_r2)
                scored["baseline_train_r2"] = base_r2
                runs[m].append(scored)
                print(f"[robustness] {problem} seed {seed} {m}: {_brief(scored)}", flush=True)
        base = [r["seconds"] for r in runs["gpytorch_exact"]]
        for m in models:
            rows.append(_aggregate(problem, m, runs[m], base if m != BASELINES[0] else None))
            per_seed[f"{problem}/{m}"] = runs[m]
    goals = _goals(rows)
    command = "python benchmarks/robustness.py" + (" " + " ".join(argv) if argv else
                                                    " " + " ".join(sys.argv[1:]))  # fmt: skip
    write_results("robustness", rows, out_dir(args), command=command.strip(),
                  extra={"goals": goals, "per_seed": per_seed},
                  title="Robustness of default fits", markdown_skip=("per_seed",))  # fmt: skip
    print(f"[robustness] goals: {goals}", flush=True)
    return 0


def _combine(args) -> int:
    import json

    rows, per_seed, commands = [], {}, []
    seen = set()
    for path in args.combine:
        data = json.loads(Path(path).read_text())
        # the first file with a (problem, model) wins: a baseline or a model rerun in an
        # earlier file replaces the later file's rows and per-seed records
        for row in data["rows"]:
            if (row["dataset"], row["method"]) not in seen:
                seen.add((row["dataset"], row["method"]))
                rows.append(row)
        for key, value in data.get("per_seed", {}).items():
            per_seed.setdefault(key, value)
        commands.append(data["command"])
    order = {p: i for i, p in enumerate(PROBLEMS)}
    rows.sort(key=lambda r: order.get(r["dataset"], len(order)))
    goals = _goals(rows)
    write_results("robustness", rows, out_dir(args), command=" ; ".join(commands),
                  extra={"goals": goals, "per_seed": per_seed},
                  title="Robustness of default fits", markdown_skip=("per_seed",))  # fmt: skip
    print(f"[robustness] goals: {goals}", flush=True)
    return 0


def _brief(r):
    keys = ("train_r2", "coverage95", "gap_beyond_2sd", "accuracy", "mnll", "seconds")
    parts = [f"{k}={r[k]:.3g}" for k in keys if isinstance(r.get(k), float)]
    if r.get("warnings"):
        parts.append(f"warnings={r['warnings']}")
    if r.get("error"):
        parts.append(f"error={r['error'][:120]}")
    if r.get("degenerate"):
        parts.append("DEGENERATE" + ("" if r.get("warned") else " (silent)"))
    return " ".join(parts)


def _goals(rows):
    gpext_rows = [r for r in rows if r["method"] not in BASELINES]
    goals = {"zero_silent_failures": all(r["silent_failures"] == 0 for r in gpext_rows)}
    uci = [r for r in gpext_rows if r["dataset"] in UCI]
    if uci:
        goals["uci_coverage_in_0.90_0.98"] = all(
            0.90 <= r.get("coverage95", -1) <= 0.98 for r in uci
        )
    gap = [r for r in gpext_rows if r["dataset"] in TOYS and r["method"] in GP_BASED]
    if gap:
        goals["gp_gap_beyond_2sd_at_most_0.2"] = all(r.get("gap_beyond_2sd", 1) <= 0.2 for r in gap)
    dig = [r for r in gpext_rows if r["dataset"] == "digits" and r["method"] == "dirichlet_gp"]
    if dig:
        r = dig[0]
        goals["digits_accuracy_at_least_0.985"] = r.get("accuracy", 0) >= 0.985
        goals["digits_mnll_at_most_0.11"] = r.get("mnll", 1) <= 0.11
        goals["digits_time_at_most_gpytorch"] = r.get("time_ratio", math.inf) <= 1.0
    return goals


if __name__ == "__main__":
    raise SystemExit(main())

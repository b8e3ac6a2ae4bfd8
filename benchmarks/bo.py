"""Bayesian optimisation with gpext surrogates against BoTorch's SingleTaskGP.

Problems (BoTorch test functions, maximised after negation, inputs scaled to the unit cube):

* ``hartmann6``: Hartmann-6 on [0, 1]^6, 10 Sobol initial points;
* ``ackley20``: Ackley in 20 dimensions on [-5, 10]^20 (the TuRBO convention; BoTorch's default
  box [-32.768, 32.768]^20 is flat for every method at these budgets), 20 Sobol initial points.

Methods (one point per iteration, ``LogExpectedImprovement`` maximised by ``optimize_acqf``; targets
standardised by ``Standardize(1)``):

* ``singletaskgp``: ``SingleTaskGP`` fitted by ``fit_gpytorch_mll`` (the baseline);
* ``ign``: ``IGNSurrogate`` of an ``InducingGPNetwork`` (MLP embedding 32-32 -> 8, 16 inducing
  points, 100 Adam epochs on minibatches of 16; 30 in --quick);
* ``vboot_rff``: ``VBootSurrogate`` of ``VBootRFF`` (512 features, 32 particles; ARD RBF
  hyperparameters from ``fit_rbf_hyperparameters`` (L-BFGS, 50 evaluations) on each iteration's
  standardised data, with an Adam fallback (300 steps) when L-BFGS diverges to NaN, which
  happens on some 10-20 point data sets; the fallbacks are counted in the JSON);
* ``pca_ess``: subspace BNN, ``fit_weight_ensemble(method="pca_ess")`` (heteroscedastic MLP with
  50 hidden units, 100 SGD epochs of which the last 33 collect weights, PCA rank 10, 16
  elliptical-slice samples; 30 / 10 epochs in --quick);
* ``swag``: ``fit_weight_ensemble(method="swag")`` (same network and trajectory, 16 SWAG draws);
* ``random``: uniform random search (reference).

Budget (full run): 20 iterations after the initial design (30 evaluations on Hartmann-6, 40 on
Ackley-20), 10 seeds, ``optimize_acqf`` with ``num_restarts=2``, ``raw_samples=64``, L-BFGS-B
``maxiter=50``; ``--quick``: 2 seeds, 3 iterations, ``raw_samples=32``, ``maxiter=20``.  These
are small budgets chosen so that the full run fits in about 30 minutes on two busy cores.

Every surrogate is refitted from scratch at every iteration.  Reported per (problem, method): the
simple regret ``f* - max_{i <= budget} f(x_i)`` after the budget (mean and standard error over
seeds) and the wall time per iteration (surrogate fit + acquisition optimisation; the methods of
a seed run back to back, so times are comparable within the run).

    python benchmarks/bo.py --quick     # 2 seeds, short budgets, about a minute
    python benchmarks/bo.py             # 10 seeds (see --seeds, --iterations, --problems)
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings
from collections import Counter

import torch
from _common import base_parser, out_dir
from botorch.acquisition import LogExpectedImprovement
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.test_functions import Ackley, Hartmann
from botorch.utils.sampling import draw_sobol_samples
from gpytorch.mlls import ExactMarginalLogLikelihood

from gpext.bootstrap import VBootRFF, fit_rbf_hyperparameters
from gpext.errors import GpextWarning, NumericalWarning
from gpext.integrations.botorch import (
    IGNSurrogate,
    VBootSurrogate,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.models import InducingGPNetwork
from gpext.nn import MLP
from gpext_bench import write_results

METHODS = ("singletaskgp", "ign", "vboot_rff", "pca_ess", "swag", "random")
DTYPE = torch.float64
FALLBACKS = {"vboot_rff_adam_hyperparameters": 0}


def make_problem(name: str):
    """Test function (negated, to maximise), number of initial points."""
    if name == "hartmann6":
        return Hartmann(dim=6, negate=True).to(DTYPE), 10
    if name == "ackley20":
        return Ackley(dim=20, negate=True, bounds=[(-5.0, 10.0)] * 20).to(DTYPE), 20
    raise ValueError(f"unknown problem {name!r}")


def evaluate(fn, x_unit: torch.Tensor) -> torch.Tensor:
    lo, hi = fn.bounds[0], fn.bounds[1]
    return fn(lo + (hi - lo) * x_unit).unsqueeze(-1)


def fit_surrogate(method: str, x: torch.Tensor, y: torch.Tensor, g: torch.Generator, cfg: dict):
    d = x.shape[-1]
    if method == "singletaskgp":
        model = SingleTaskGP(x, y, outcome_transform=Standardize(1))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        return model
    if method == "ign":
        torch.manual_seed(int(torch.randint(2**31 - 1, (1,), generator=g)))
        net = InducingGPNetwork(MLP(d, [32, 32], 8), num_inducing=min(16, x.shape[0])).to(DTYPE)
        model = IGNSurrogate(net, train_X=x, train_Y=y, outcome_transform=Standardize(1))
        return fit_gpext_surrogate(
            model, epochs=cfg["nn_epochs"], batch_size=16, lr=1e-2, generator=g
        )
    if method == "vboot_rff":
        # Hyperparameters by gpext's own fit_rbf_hyperparameters (L-BFGS, as inside VBootRFF) on
        # the standardised targets; L-BFGS diverges to NaN on some 10-20 point data sets, where
        # the function falls back to 300 Adam steps and warns (the warnings are counted).
        ys = (y - y.mean()) / y.std()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", NumericalWarning)
            hp = fit_rbf_hyperparameters(x, ys, num_iters=50, fallback_iters=300, lr=0.1)
        if any(issubclass(w.category, NumericalWarning) for w in caught):
            FALLBACKS["vboot_rff_adam_hyperparameters"] += 1
        vb = VBootRFF(
            num_features=512, num_particles=32, lengthscale=hp.lengthscale,
            outputscale=hp.outputscale, mean=hp.mean, noise=max(hp.noise, 1e-6),
        )  # fmt: skip
        model = VBootSurrogate(vb, train_X=x, train_Y=y, outcome_transform=Standardize(1))
        return fit_gpext_surrogate(model, generator=g)
    if method in ("pca_ess", "swag"):
        return fit_weight_ensemble(
            x, y, method=method, num_samples=16, hidden_features=(50,),
            epochs=cfg["nn_epochs"], swa_epochs=cfg["nn_epochs"] // 3, rank=10,
            outcome_transform=Standardize(1), generator=g,
        )  # fmt: skip
    raise ValueError(method)


def run_one(problem: str, method: str, seed: int, cfg: dict) -> dict:
    fn, n_init = make_problem(problem)
    d = fn.dim
    bounds = torch.stack([torch.zeros(d, dtype=DTYPE), torch.ones(d, dtype=DTYPE)])
    x = draw_sobol_samples(bounds, n=n_init, q=1, seed=seed).squeeze(-2)
    y = evaluate(fn, x)
    g = torch.Generator().manual_seed(10_000 + seed)
    times = []
    warned = Counter()  # warning class -> iterations in which it was issued (recorded, not hidden)
    for _ in range(cfg["iterations"]):
        t0 = time.perf_counter()
        if method == "random":
            cand = torch.rand(1, d, generator=g, dtype=DTYPE)
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                model = fit_surrogate(method, x, y, g, cfg)
                acqf = LogExpectedImprovement(model, best_f=float(y.max()))
                torch.manual_seed(seed * 1000 + len(y))  # optimize_acqf's raw samples
                cand, _ = optimize_acqf(
                    acqf, bounds, q=1, num_restarts=cfg["num_restarts"],
                    raw_samples=cfg["raw_samples"], options={"maxiter": cfg["maxiter"]},
                )  # fmt: skip
            warned.update({_warning_name(w.category) for w in caught})
        times.append(time.perf_counter() - t0)
        x = torch.cat([x, cand.detach()])
        y = torch.cat([y, evaluate(fn, cand.detach())])
    best = float(y.max())
    return {
        "dataset": problem,
        "method": method,
        "seed": seed,
        "simple_regret": float(fn.optimal_value) - best,
        "initial_regret": float(fn.optimal_value) - float(y[:n_init].max()),
        "seconds_per_iteration": statistics.mean(times),
        "evaluations": len(y),
        "warnings": dict(warned),
        "gpext_warned_iterations": sum(
            v for k, v in warned.items() if "." not in k  # gpext's own classes
        ),
    }


def _warning_name(category: type) -> str:
    """gpext warnings by class name, others as ``module.Class`` (e.g. BoTorch's)."""
    if issubclass(category, GpextWarning):
        return category.__name__
    return f"{category.__module__.split('.')[0]}.{category.__name__}"


def summarise(runs: list[dict]) -> list[dict]:
    rows = []
    for problem in dict.fromkeys(r["dataset"] for r in runs):
        for method in dict.fromkeys(r["method"] for r in runs):
            sel = [r for r in runs if r["dataset"] == problem and r["method"] == method]
            if not sel:
                continue
            reg = [r["simple_regret"] for r in sel]
            sec = [r["seconds_per_iteration"] for r in sel]
            se = statistics.stdev(reg) / math.sqrt(len(reg)) if len(reg) > 1 else float("nan")
            rows.append(
                {
                    "dataset": problem,
                    "method": method,
                    "seeds": len(sel),
                    "evaluations": sel[0]["evaluations"],
                    "regret_mean": statistics.mean(reg),
                    "regret_se": se,
                    "initial_regret_mean": statistics.mean(r["initial_regret"] for r in sel),
                    "seconds_per_iteration": statistics.mean(sec),
                    "gpext_warned_iterations_mean": statistics.mean(
                        r.get("gpext_warned_iterations", 0) for r in sel
                    ),
                }
            )
    return rows


def goals_from(rows: list[dict]) -> dict:
    goals = {}
    by = {(r["dataset"], r["method"]): r for r in rows}
    for (problem, method), r in by.items():
        if method in ("singletaskgp", "random"):
            continue
        rnd, gp = by.get((problem, "random")), by.get((problem, "singletaskgp"))
        if rnd is not None:
            goals[f"{problem}_{method}_beats_random"] = r["regret_mean"] < rnd["regret_mean"]
        if gp is not None:
            slack = 2.0 * math.hypot(r["regret_se"], gp["regret_se"])
            goals[f"{problem}_{method}_within_2se_of_singletaskgp"] = (
                r["regret_mean"] <= gp["regret_mean"] + slack
            )
            goals[f"{problem}_{method}_time_ratio_vs_singletaskgp"] = round(
                r["seconds_per_iteration"] / gp["seconds_per_iteration"], 2
            )
    return goals


def main() -> None:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=None)
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--problems", default="hartmann6,ackley20")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--partial", default=None, help="JSON lines file of finished runs (resume)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.quick:
        cfg = {"seeds": 2, "iterations": 3, "num_restarts": 2, "raw_samples": 32, "maxiter": 20,
               "nn_epochs": 30}  # fmt: skip
    else:
        cfg = {"seeds": 10, "iterations": 20, "num_restarts": 2, "raw_samples": 64,
               "maxiter": 50, "nn_epochs": 100}  # fmt: skip
    if args.seeds is not None:
        cfg["seeds"] = args.seeds
    if args.iterations is not None:
        cfg["iterations"] = args.iterations
    problems = args.problems.split(",")
    methods = args.methods.split(",")
    done: dict[tuple, dict] = {}
    if args.partial:
        try:
            with open(args.partial) as fh:
                for line in fh:
                    r = json.loads(line)
                    done[(r["dataset"], r["method"], r["seed"])] = r
        except FileNotFoundError:
            pass
    runs = []
    for problem in problems:
        for seed in range(args.seed, args.seed + cfg["seeds"]):
            for method in methods:  # methods of one seed back to back
                key = (problem, method, seed)
                if key in done:
                    runs.append(done[key])
                    continue
                r = run_one(problem, method, seed, cfg)
                runs.append(r)
                print(json.dumps(r), flush=True)
                if args.partial:
                    with open(args.partial, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
    rows = summarise(runs)
    goals = goals_from(rows)
    print(json.dumps(goals, indent=1))
    extra = {"config": cfg, "threads": args.threads, "quick": args.quick, "runs": runs,
             "goals": goals, "fallbacks": FALLBACKS}  # fmt: skip
    write_results("bo", rows, out_dir(args), extra=extra,
                  title="Bayesian optimisation with gpext surrogates", markdown_skip=("runs",))  # fmt: skip


if __name__ == "__main__":
    main()

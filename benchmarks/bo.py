"""Bayesian optimisation with every gpext surrogate against SingleTaskGP, VBLL and random search.

Problems (maximised; BoTorch test functions are negated; inputs are scaled to the unit cube):

* ``branin``: Branin on [-5, 10] x [0, 15], 5 Sobol initial points;
* ``hartmann6``: Hartmann-6 on [0, 1]^6, 10 Sobol initial points;
* ``ackley20``: Ackley in 20 dimensions on [-5, 10]^20 (the TuRBO convention; BoTorch's default
  box [-32.768, 32.768]^20 is flat for every method at these budgets), 20 Sobol initial points;
* ``exp2d`` (non-stationary): :math:`f(x) = -x_1 \\exp(-x_1^2 - x_2^2)` on [-2, 6]^2, 5 Sobol
  initial points; maximum :math:`e^{-1/2}/\\sqrt 2 \\approx 0.42888` at
  :math:`(-1/\\sqrt 2, 0)`.  This is the "2-d exponential" function of the treed-GP
  literature (Gramacy, "tgp: an R package for Bayesian nonstationary, semiparametric
  nonlinear regression and design by treed Gaussian process models", J. Stat. Softw. 19(9),
  2007, data set ``exp2d``, documented as "a 2-dimensional data set that can be used to
  validate non-stationary models"; Gramacy and Lee, JASA 103, 2008), negated so that its
  minimum is our maximum: on [-2, 6]^2 the function varies on a length scale of about 1
  inside [-2, 2]^2 (a quarter of the box) and is flat (below 1e-3 in absolute value) on 93%
  of the rest, so no single stationary length scale and signal variance fit both regions
  (most of an initial design lands in the flat one);
* ``chartmann6`` (constrained, pass/fail): BoTorch's ``ConstrainedHartmann`` (Letham et al.,
  "Constrained Bayesian optimization with noisy experiments", Bayesian Analysis 2019):
  Hartmann-6 subject to :math:`\\lVert x \\rVert_2 \\le 1` on [0, 1]^6 (about 8% of the cube
  is feasible; the unconstrained optimum, norm 0.946, is feasible, so :math:`f^* = 3.32237`).
  Only the label feasible / infeasible is observed (``is_feasible``), never the slack; the
  objective is observed at every evaluated point.  10 Sobol initial points.

Regret: :math:`f^* - \\max_{i \\le \\text{budget}} f(x_i)`; on ``chartmann6`` the maximum is
over feasible points only, and an infeasible point counts as the problem's
``worst_feasible_value`` (BoTorch's convention; so a run that never finds a feasible point has
regret 3.322).

Arms (one point per iteration; ``LogExpectedImprovement`` with ``best_f`` the best observed
value, maximised by ``optimize_acqf``; every model is refitted from scratch at every iteration):

* ``random``: uniform random search;
* ``singletaskgp``: ``SingleTaskGP`` with ``Standardize(1)`` fitted by ``fit_gpytorch_mll``;
* ``vbll``: BoTorch's own ``botorch_community.models.vblls.VBLLModel`` (Brunzema et al., ICLR
  2025) as in BoTorch's VBLL notebook: ``VBLLModel(in_features=d, hidden_features=64,
  num_layers=3, out_features=1)`` fitted by its ``fit`` with its default optimisation
  settings (AdamW, lr 1e-3, up to 10,000 epochs, early stopping with patience 100 on the
  training loss) on standardised targets (the model has no outcome transform; ``best_f`` is
  standardised with the same statistics, which leaves the argmax of EI unchanged).
  ``VBLLModel`` ships with BoTorch (added in 0.14) and BoTorch vendors the ``vbll`` code it
  uses in ``botorch_community.models.vbll_helper`` (checked with BoTorch 0.18.1), so the arm
  needs the ``bench-bo`` extra (``botorch>=0.14``), not the ``vbll`` package;
* every gpext surrogate with its defaults, built as Ax builds them (the adapters'
  ``construct_inputs`` on a ``SupervisedDataset``, ``Standardize(1)``, fitted by
  ``fit_gpext_surrogate`` with ``ax_support.ax_fit_defaults``), or by
  ``fit_weight_ensemble`` with its defaults:

  - ``ign``: ``IGNSurrogate`` (input-augmented MLP 32-32 -> 8, 16 inducing points; 100 epochs,
    batch 16, lr 1e-2);
  - ``gwi``: ``GWISurrogate`` built by ``GWIRegressionModel.from_data`` at the fit, 200 epochs;
  - ``vboot_rff``: ``VBootSurrogate`` of ``VBootRFF(num_features=512, num_particles=32)``
    (kernel hyperparameters fitted with the ensemble);
  - ``vboot_mlp``: ``VBootSurrogate`` of ``VBootMLP()`` (10 particles) as its
    ``construct_inputs`` builds it: 64-64 hidden units below 200 points, at least 500 Adam
    steps, the particles' spread calibrated by 5-fold cross-validation (since 2026-11-26;
    before: 512-512 and 12 epochs, i.e. 12 full-batch steps, uncalibrated; the runs' ``code``
    field says which) and, since 2026-11-27, combined with the outcome's prior
    (``PriorReversion``: where the particles disagree more than the targets vary, the mean
    reverts to the targets' mean and the spread saturates at theirs);
  - ``swag``, ``multiswag``, ``pca_ess``, ``pca_vi``: ``fit_weight_ensemble(method=...)``
    (MLP with 50 hidden units and learned homoscedastic noise, which is the default without a
    hold-out since 2026-11-26, the heteroscedastic MLP before (the runs' ``code`` field says
    which); 200 SGD epochs of which the last 50 collect weights, 16 samples; PCA rank 10; 3
    MultiSWAG components; since 2026-11-26 (commit a5edec7) every member's last layer
    redrawn from its exact posterior given the member's body, ``bayesian_last_layer``, the
    default without a hold-out, and since commit 8473598 the network's last hidden layer
    scaled to unit norm under it, ``normalize_last_hidden``; the ensemble's spread calibrated
    by 5-fold cross-validation and, since 2026-11-27, combined with the outcome's prior,
    ``prior_reversion``, as for ``vboot_mlp``);
  - ``last_layer``: ``fit_weight_ensemble(method="last_layer")``: the same network (unit-norm
    last hidden layer since 8473598) at its SWA mean with the exact posterior of its last
    layer (DNGO's surrogate), 16 draws, calibrated the same way;

* ``singletaskgp_constraints`` (``chartmann6`` only): BoTorch's own constraint mechanism, a
  reference for the classifier: ``qLogExpectedImprovement`` on a ``ModelListGP`` of the
  objective ``SingleTaskGP`` and a ``SingleTaskGP`` regressed on the labels (+1 feasible,
  -1 infeasible), with ``constraints=[-label sample]`` (negative = feasible, BoTorch's
  sigmoid with ``eta=1e-3``), i.e. the probability of feasibility is :math:`P(g(x) > 0)`
  under a GP on the labels.

Constrained problem, every other arm: the feasibility model is a gpext classifier,
``DirichletClassifierSurrogate(DirichletGPClassifier(2))`` fitted with its defaults by
``fit_gpext_surrogate`` on the labels, and the acquisition is
``FeasibilityWeightedAcquisition(LogExpectedImprovement(objective model, best_f = best
feasible value), classifier)``, i.e. :math:`\\log\\mathrm{EI}(x) + \\log P(\\text{feasible}
\\mid x)` (constrained EI, Gardner et al. 2014).  ``singletaskgp`` and ``vbll`` use the same
wrapper with the same kind of classifier, so on this problem the arms differ only in the
objective model.  Until a feasible point has been observed, every arm maximises the log
probability of feasibility alone (Gelbart, Snoek and Adams 2014): a zero log acquisition in
the wrapper (``qLogProbabilityOfFeasibility`` on the label GP for
``singletaskgp_constraints``).

Reported per (problem, arm), mean and standard error over seeds where it applies:

* ``regret_mean``, ``regret_se``, ``initial_regret_mean`` (after the initial design);
* ``seconds_per_iteration``: model fit(s) plus acquisition optimisation (the arms of one seed
  run back to back in one process, one thread), and ``time_ratio_vs_singletaskgp``;
* ``coverage90``: share of 256 uniform held-out points (fixed per seed) whose true value lies
  in the central 90% interval of the objective model's posterior (Gaussian, mean +- 1.645
  sd, no observation noise), averaged over all fits;
* ``sd_distance_corr``: on the same points, the correlation between the posterior sd and the
  distance to the nearest evaluated point (does the uncertainty grow away from the data, or
  towards the box's corners?), averaged over all fits (runs recorded before 2026-11-26 lack
  it);
* ``fits`` and the degenerate ones among them: ``error_fits`` (fit or acquisition raised;
  the iteration then takes a uniform random point, and the message is recorded under
  ``errors``), ``warned_fits`` (a ``gpext.errors.GpextWarning`` was issued while fitting the
  objective or feasibility model), ``flat_fits`` (the posterior on the held-out points is
  non-finite, or its mean varies by less than 1% of the training targets' standard
  deviation, or its largest sd is below 1e-6 of it), ``degenerate_fits`` (any of these);
* on ``chartmann6``: ``feasible_fraction`` of the points chosen after the initial design and
  ``no_feasible_runs`` (runs that never observed a feasible point).

Every warning (gpext's by class name, others as ``package.Class``) is counted per arm under
``warnings`` (number of fits in which it was issued), with its first message under
``warning_messages`` (JSON); none is suppressed.

Goals (booleans; "beats" means a lower mean regret):

* ``every_gpext_surrogate_beats_random_on_every_problem`` (and one goal per problem and arm);
* ``hartmann6_best_gpext_within_1se_of_singletaskgp``: the best gpext arm's mean regret is at
  most SingleTaskGP's plus one standard error of the difference
  :math:`\\sqrt{se_a^2 + se_b^2}`;
* ``hartmann6_best_gpext_ahead_of_vbll``;
* ``exp2d_a_gpext_surrogate_beats_singletaskgp``.

``goal_margins`` in the JSON give each comparison's difference in units of its standard error
(the best of eight arms beats a baseline by chance more often than one arm does).

Budget, full run: 20 iterations after the initial design, 10 seeds, ``optimize_acqf`` with
``num_restarts=2``, ``raw_samples=64``, L-BFGS-B ``maxiter=50``.  ``--quick``: 2 seeds,
2 iterations, ``raw_samples=32``, ``maxiter=20``, the same models and fit settings.

Estimated run time of the full configuration: about 9 hours on one idle core (one thread).
Basis: one fit plus one acquisition optimisation per arm at the full run's settings and its
mid-run design size (initial design + 10 points), timed on an otherwise idle core: 154 s for
all arms of all five problems together (``vbll`` 98 s of it, 14-32 s per fit because its
default fit runs about 3,000-3,600 epochs before early stopping; ``ackley20`` 45 s), times
20 iterations and 10 seeds.  Without ``vbll`` about 3 hours.  On the shared two-core
development machine everything took 2-3 times longer.  Run it in pieces (``--problems`` /
``--arms`` / ``--seed`` with one ``--partial`` file each, merged by ``--combine``; every run
records the commit it was made with, ``code``, and the written JSON counts them in
``code_versions``), e.g. one
process per problem (1.3-2.5 hours each, ``ackley20`` the longest) or a separate process for ``vbll``.  The quick run
takes about 10 minutes.

    python benchmarks/bo.py --quick                   # 2 seeds, 2 iterations, all arms
    python benchmarks/bo.py --partial /tmp/bo.jsonl   # full run, resumable
    python benchmarks/bo.py --problems exp2d --arms singletaskgp,ign --partial /tmp/a.jsonl
    python benchmarks/bo.py --combine /tmp/a.jsonl /tmp/b.jsonl   # merge pieces, write results
"""

from __future__ import annotations

import json
import math
import statistics
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import base_parser, out_dir
from botorch.acquisition import LogExpectedImprovement, qLogExpectedImprovement
from botorch.acquisition.acquisition import AcquisitionFunction
from botorch.acquisition.logei import qLogProbabilityOfFeasibility
from botorch.acquisition.objective import GenericMCObjective
from botorch.fit import fit_gpytorch_mll
from botorch.models import ModelListGP, SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.optim import optimize_acqf
from botorch.test_functions import Ackley, Branin, Hartmann
from botorch.test_functions.synthetic import ConstrainedHartmann
from botorch.utils.datasets import SupervisedDataset
from botorch.utils.sampling import draw_sobol_samples
from gpytorch.mlls import ExactMarginalLogLikelihood

from gpext.errors import GpextWarning
from gpext_bench import write_results

DTYPE = torch.float64
PROBLEMS = ("branin", "hartmann6", "ackley20", "exp2d", "chartmann6")
GPEXT_ARMS = (
    "ign",
    "gwi",
    "vboot_rff",
    "vboot_mlp",
    "swag",
    "multiswag",
    "pca_ess",
    "pca_vi",
    "last_layer",
)
ARMS = ("random", "singletaskgp", "vbll", *GPEXT_ARMS, "singletaskgp_constraints")
CONSTRAINED_ONLY_ARMS = ("singletaskgp_constraints",)
NUM_CHECK_POINTS = 256
Z90 = 1.6448536269514722  # standard normal 95% quantile: central 90% interval

QUICK = {"seeds": 2, "iterations": 2, "num_restarts": 2, "raw_samples": 32, "maxiter": 20}
FULL = {"seeds": 10, "iterations": 20, "num_restarts": 2, "raw_samples": 64, "maxiter": 50}


# ----------------------------------------------------------------------------------- problems
@dataclass(frozen=True)
class Problem:
    """A maximisation problem on the unit cube.

    ``evaluate(x)`` returns the objective ``(n, 1)`` and, for a constrained problem, the
    pass/fail labels ``(n,)`` (``None`` otherwise).
    """

    name: str
    dim: int
    num_initial: int
    optimal_value: float
    evaluate: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
    worst_feasible_value: float | None = None

    @property
    def constrained(self) -> bool:
        return self.worst_feasible_value is not None


def _scaled(fn) -> Callable[[torch.Tensor], torch.Tensor]:
    lo, hi = fn.bounds[0], fn.bounds[1]
    return lambda x: lo + (hi - lo) * x


def exp2d(x: torch.Tensor) -> torch.Tensor:
    """Negated Gramacy-Lee 2-d exponential function on [-2, 6]^2 (``x`` in original units)."""
    x1, x2 = x[..., 0], x[..., 1]
    return -x1 * torch.exp(-(x1**2) - x2**2)


EXP2D_OPTIMUM = math.exp(-0.5) / math.sqrt(2.0)  # at (-1/sqrt(2), 0)


def make_problem(name: str) -> Problem:
    """The problem called ``name`` (see the module docstring)."""
    if name in ("branin", "hartmann6", "ackley20"):
        fn, n0 = {
            "branin": (Branin(negate=True), 5),
            "hartmann6": (Hartmann(dim=6, negate=True), 10),
            "ackley20": (Ackley(dim=20, negate=True, bounds=[(-5.0, 10.0)] * 20), 20),
        }[name]
        fn = fn.to(DTYPE)
        scale = _scaled(fn)
        return Problem(name, fn.dim, n0, float(fn.optimal_value),
                       lambda x: (fn(scale(x)).unsqueeze(-1), None))  # fmt: skip
    if name == "exp2d":
        lo, hi = -2.0, 6.0
        return Problem(name, 2, 5, EXP2D_OPTIMUM,
                       lambda x: (exp2d(lo + (hi - lo) * x).unsqueeze(-1), None))  # fmt: skip
    if name == "chartmann6":
        fn = ConstrainedHartmann(dim=6, negate=True).to(DTYPE)  # bounds are the unit cube

        def evaluate(x):
            return fn(x).unsqueeze(-1), fn.is_feasible(x, noise=False)

        return Problem(name, 6, 10, float(fn.optimal_value), evaluate,
                       worst_feasible_value=float(fn.worst_feasible_value))  # fmt: skip
    raise ValueError(f"unknown problem {name!r}; expected one of {PROBLEMS}")


def best_value(problem: Problem, y: torch.Tensor, feasible: torch.Tensor | None) -> float:
    """Best objective value, feasible points only (infeasible ones count as the worst feasible)."""
    if feasible is None:
        return float(y.max())
    vals = torch.where(feasible, y.squeeze(-1), torch.full_like(y.squeeze(-1), -math.inf))
    return max(float(vals.max()), problem.worst_feasible_value)


# -------------------------------------------------------------------------------------- models
@dataclass
class Fitted:
    """An objective model and the affine map from raw targets to its units (``(y - shift) / scale``)."""

    model: object
    shift: float = 0.0
    scale: float = 1.0


def fit_objective(arm: str, x: torch.Tensor, y: torch.Tensor, g: torch.Generator) -> Fitted:
    """Fit the objective model of ``arm`` on ``(x, y)`` with its defaults."""
    if arm in ("singletaskgp", "singletaskgp_constraints"):
        model = SingleTaskGP(x, y, outcome_transform=Standardize(1))
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
        return Fitted(model)
    if arm == "vbll":
        from botorch_community.models.vblls import VBLLModel

        mu = float(y.mean())
        sd = float(y.std()) if y.shape[0] > 1 else 1.0
        sd = sd if sd > 0 else 1.0
        model = VBLLModel(in_features=x.shape[-1], hidden_features=64, num_layers=3,
                          out_features=1, device=x.device)  # fmt: skip
        model.fit(x, (y - mu) / sd)
        return Fitted(model, mu, sd)
    from gpext.integrations.botorch import (
        GWISurrogate,
        IGNSurrogate,
        VBootSurrogate,
        fit_gpext_surrogate,
        fit_weight_ensemble,
    )
    from gpext.integrations.botorch.ax_support import ax_fit_defaults

    if arm in ("swag", "multiswag", "pca_ess", "pca_vi", "last_layer"):
        return Fitted(
            fit_weight_ensemble(x, y, method=arm, outcome_transform=Standardize(1), generator=g)
        )
    data = SupervisedDataset(x, y, feature_names=[f"x{i}" for i in range(x.shape[-1])],
                             outcome_names=["y"])  # fmt: skip
    if arm == "ign":
        model, fit_kw = IGNSurrogate(**IGNSurrogate.construct_inputs(data),
                                     outcome_transform=Standardize(1)), {"generator": g}  # fmt: skip
    elif arm == "gwi":
        model, fit_kw = GWISurrogate(**GWISurrogate.construct_inputs(data),
                                     outcome_transform=Standardize(1)), {"generator": g}  # fmt: skip
    elif arm == "vboot_rff":
        model = VBootSurrogate(**VBootSurrogate.construct_inputs(data, ensemble="rff"),
                               outcome_transform=Standardize(1))  # fmt: skip
        fit_kw = {"generator": g}
    elif arm == "vboot_mlp":  # VBootMLP.fit takes no generator (its seed is a constructor arg)
        model = VBootSurrogate(**VBootSurrogate.construct_inputs(data, ensemble="mlp"),
                               outcome_transform=Standardize(1))  # fmt: skip
        fit_kw = {}
    else:
        raise ValueError(f"unknown arm {arm!r}; expected one of {ARMS}")
    return Fitted(fit_gpext_surrogate(model, **{**ax_fit_defaults(model), **fit_kw}))


def fit_classifier(x: torch.Tensor, feasible: torch.Tensor):
    """gpext's feasibility model: a two-class Dirichlet GP classifier with its defaults."""
    from gpext.integrations.botorch import DirichletClassifierSurrogate, fit_gpext_surrogate
    from gpext.models import DirichletGPClassifier

    labels = feasible.to(x).unsqueeze(-1)  # 1 = feasible
    clf = DirichletClassifierSurrogate(DirichletGPClassifier(2), train_X=x, train_Y=labels)
    return fit_gpext_surrogate(clf)


class ZeroLogAcquisition(AcquisitionFunction):
    """``log 1 = 0`` everywhere: wrapped by the feasibility weighting it leaves log P(feasible)."""

    _log = True

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X.new_zeros(X.shape[:-2])


def make_acquisition(problem, arm, fitted, x, y, feasible, g, record) -> AcquisitionFunction:
    """The acquisition of ``arm`` (see the module docstring)."""
    if not problem.constrained:
        best = (float(y.max()) - fitted.shift) / fitted.scale
        return LogExpectedImprovement(fitted.model, best_f=best)
    any_feasible = bool(feasible.any())
    if arm == "singletaskgp_constraints":
        labels = feasible.to(x).unsqueeze(-1) * 2.0 - 1.0
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            label_gp = SingleTaskGP(x, labels, outcome_transform=Standardize(1))
            fit_gpytorch_mll(ExactMarginalLogLikelihood(label_gp.likelihood, label_gp))
        record(caught, "constraint model")
        if not any_feasible:
            return qLogProbabilityOfFeasibility(label_gp, constraints=[lambda z: -z[..., 0]])
        best = float(y[feasible].max())
        return qLogExpectedImprovement(
            ModelListGP(fitted.model, label_gp), best_f=best,
            objective=GenericMCObjective(lambda z, X=None: z[..., 0]),
            constraints=[lambda z: -z[..., 1]],
        )  # fmt: skip
    from gpext.integrations.botorch import FeasibilityWeightedAcquisition

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        classifier = fit_classifier(x, feasible)
    record(caught, "classifier")
    if not any_feasible:
        base = ZeroLogAcquisition(fitted.model)
    else:
        best = (float(y[feasible].max()) - fitted.shift) / fitted.scale
        base = LogExpectedImprovement(fitted.model, best_f=best)
    return FeasibilityWeightedAcquisition(base, classifier, feasible_class=1)


def posterior_check(
    fitted: Fitted, x_check, f_check, y_train, x_train=None
) -> tuple[bool, float, float]:
    """(flat or non-finite posterior, 90% coverage of the true values, correlation of the
    predictive sd with the distance to the nearest training input) on the check points (the
    correlation is NaN without ``x_train`` or for a constant sd)."""
    with torch.no_grad():
        post = fitted.model.posterior(x_check.unsqueeze(-2))
        mean = post.mean.reshape(-1) * fitted.scale + fitted.shift
        sd = post.variance.reshape(-1).clamp_min(0.0).sqrt() * fitted.scale
    if not (bool(torch.isfinite(mean).all()) and bool(torch.isfinite(sd).all())):
        return True, float("nan"), float("nan")
    y_sd = float(y_train.std())
    flat = y_sd > 0 and (float(mean.std()) < 1e-2 * y_sd or float(sd.max()) < 1e-6 * y_sd)
    coverage = float(((f_check.reshape(-1) - mean).abs() <= Z90 * sd).double().mean())
    corr = float("nan")
    if x_train is not None and float(sd.std()) > 0:
        dist = torch.cdist(x_check.to(sd), x_train.to(sd)).min(-1).values
        corr = float(torch.corrcoef(torch.stack([sd, dist]))[0, 1])
    return flat, coverage, corr


# -------------------------------------------------------------------------------------- one run
def warning_name(category: type) -> str:
    """gpext warnings by class name, others as ``package.Class`` (e.g. ``botorch.X``)."""
    if issubclass(category, GpextWarning):
        return category.__name__
    return f"{category.__module__.split('.')[0]}.{category.__name__}"


CONFIG_KEYS = ("quick", "iterations", "num_restarts", "raw_samples", "maxiter")


def code_version() -> str:
    """The commit the runs were made with (``+dirty`` with uncommitted changes outside
    ``benchmarks/results``), recorded in every run so that results combined from pieces run
    at different times say which code made them; ``"unknown"`` outside a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    try:
        sha = git("rev-parse", "--short=10", "HEAD").strip()
        # results files being written (e.g. another piece's --partial file) are not code
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".",
                    ":(exclude)benchmarks/results")  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty.strip() else "")


CODE_VERSION = code_version()


def config_key(cfg: dict) -> str:
    """What a finished run depends on besides (problem, arm, seed); partial files check it."""
    return ",".join(f"{k}={int(cfg[k])}" for k in CONFIG_KEYS)


def run_one(problem_name: str, arm: str, seed: int, cfg: dict) -> dict:
    """One BO run of ``arm`` on ``problem_name`` from the seed's Sobol design."""
    problem = make_problem(problem_name)
    d = problem.dim
    bounds = torch.stack([torch.zeros(d, dtype=DTYPE), torch.ones(d, dtype=DTYPE)])
    x = draw_sobol_samples(bounds, n=problem.num_initial, q=1, seed=seed).squeeze(-2)
    y, feasible = problem.evaluate(x)
    check_gen = torch.Generator().manual_seed(20_000 + seed)
    x_check = torch.rand(NUM_CHECK_POINTS, d, generator=check_gen, dtype=DTYPE)
    f_check = problem.evaluate(x_check)[0]
    g = torch.Generator().manual_seed(10_000 + seed)
    times, coverages, distance_corrs = [], [], []
    counts = Counter()  # fits, error_fits, warned_fits, flat_fits, degenerate_fits
    warned = Counter()  # warning name -> number of fits in which it was issued
    messages: dict[str, str] = {}
    errors: list[str] = []

    def record(caught, what):
        fit_warnings.update(warning_name(w.category) for w in caught)
        for w in caught:  # the first message of each warning class, for diagnosis
            messages.setdefault(warning_name(w.category), str(w.message)[:300])
        if any(issubclass(w.category, GpextWarning) for w in caught):
            flags.add("warned")

    for it in range(cfg["iterations"]):
        torch.manual_seed(1_000_003 * seed + 1_009 * it + 17)  # global RNG: inits, raw samples
        flags: set[str] = set()
        fit_warnings: set[str] = set()  # warning classes issued in this iteration's fits
        t0 = time.perf_counter()
        fitted = None
        if arm == "random":
            cand = torch.rand(1, d, generator=g, dtype=DTYPE)
        else:
            counts["fits"] += 1
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    fitted = fit_objective(arm, x, y, g)
                record(caught, "objective")
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    acqf = make_acquisition(problem, arm, fitted, x, y, feasible, g, record)
                    cand, _ = optimize_acqf(
                        acqf, bounds, q=1, num_restarts=cfg["num_restarts"],
                        raw_samples=cfg["raw_samples"], options={"maxiter": cfg["maxiter"]},
                    )  # fmt: skip
                record(caught, "acquisition")
                cand = cand.detach()
            except Exception as err:  # noqa: BLE001 - recorded; the iteration goes on at random
                flags.add("error")
                msg = f"{type(err).__name__}: {err}".replace("\n", " ")[:300]
                where = traceback.extract_tb(err.__traceback__)[-1]
                msg += f" [{Path(where.filename).name}:{where.lineno}]"
                if msg not in errors:
                    errors.append(msg)
                cand = torch.rand(1, d, generator=g, dtype=DTYPE)
        times.append(time.perf_counter() - t0)
        if fitted is not None:
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    flat, cov, corr = posterior_check(fitted, x_check, f_check, y, x)
                record(caught, "posterior")
            except Exception as err:  # noqa: BLE001
                flat, cov, corr = True, float("nan"), float("nan")
                msg = f"posterior check: {type(err).__name__}: {err}"[:300]
                if msg not in errors:
                    errors.append(msg)
            if flat:
                flags.add("flat")
            if not math.isnan(cov):
                coverages.append(cov)
            if not math.isnan(corr):
                distance_corrs.append(corr)
        warned.update(fit_warnings)
        for flag in ("error", "warned", "flat"):
            counts[f"{flag}_fits"] += flag in flags
        counts["degenerate_fits"] += bool(flags)
        y_new, feas_new = problem.evaluate(cand)
        x, y = torch.cat([x, cand]), torch.cat([y, y_new])
        if feasible is not None:
            feasible = torch.cat([feasible, feas_new])
    n0 = problem.num_initial
    init_feasible = None if feasible is None else feasible[:n0]
    out = {
        "dataset": problem_name,
        "method": arm,
        "seed": seed,
        "config": config_key(cfg),
        "code": CODE_VERSION,
        "simple_regret": problem.optimal_value - best_value(problem, y, feasible),
        "initial_regret": problem.optimal_value - best_value(problem, y[:n0], init_feasible),
        "seconds_per_iteration": statistics.mean(times) if times else 0.0,
        "evaluations": int(y.shape[0]),
        "coverage90": statistics.mean(coverages) if coverages else None,
        "sd_distance_corr": statistics.mean(distance_corrs) if distance_corrs else None,
        **{
            k: int(counts[k])
            for k in ("fits", "error_fits", "warned_fits", "flat_fits", "degenerate_fits")
        },  # fmt: skip
        "warnings": dict(warned),
        "warning_messages": messages,
        "errors": errors,
    }
    if feasible is not None:
        out["feasible_fraction"] = float(feasible[n0:].double().mean()) if len(y) > n0 else 0.0
        out["found_feasible"] = bool(feasible.any())
    return out


# --------------------------------------------------------------------------- summary and goals
def _se(values: list[float]) -> float:
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else math.nan


def summarise(runs: list[dict]) -> list[dict]:
    """One row per (problem, arm), in the order of ``PROBLEMS`` and ``ARMS``."""
    rows = []
    problems = sorted({r["dataset"] for r in runs}, key=lambda p: (PROBLEMS + (p,)).index(p))
    arms = sorted({r["method"] for r in runs}, key=lambda a: (ARMS + (a,)).index(a))
    for problem in problems:
        base = [r for r in runs if r["dataset"] == problem and r["method"] == "singletaskgp"]
        base_sec = statistics.mean(r["seconds_per_iteration"] for r in base) if base else None
        for arm in arms:
            sel = [r for r in runs if r["dataset"] == problem and r["method"] == arm]
            if not sel:
                continue
            reg = [r["simple_regret"] for r in sel]
            sec = statistics.mean(r["seconds_per_iteration"] for r in sel)
            cov = [r["coverage90"] for r in sel if r.get("coverage90") is not None]
            row = {
                "dataset": problem,
                "method": arm,
                "seeds": len(sel),
                "evaluations": sel[0]["evaluations"],
                "regret_mean": statistics.mean(reg),
                "regret_se": _se(reg),
                "initial_regret_mean": statistics.mean(r["initial_regret"] for r in sel),
                "seconds_per_iteration": sec,
            }
            if base_sec:
                row["time_ratio_vs_singletaskgp"] = sec / base_sec
            if cov:
                row["coverage90"] = statistics.mean(cov)
            corr = [r["sd_distance_corr"] for r in sel if r.get("sd_distance_corr") is not None]
            if corr:
                row["sd_distance_corr"] = statistics.mean(corr)
            for k in ("fits", "error_fits", "warned_fits", "flat_fits", "degenerate_fits"):
                row[k] = sum(r[k] for r in sel)
            if "feasible_fraction" in sel[0]:
                row["feasible_fraction"] = statistics.mean(r["feasible_fraction"] for r in sel)
                row["no_feasible_runs"] = sum(not r["found_feasible"] for r in sel)
            rows.append(row)
    return rows


def _margin(a: dict, b: dict) -> float:
    """(b - a) regret difference in units of its standard error (positive: a is better)."""
    se = math.hypot(a["regret_se"], b["regret_se"])
    diff = b["regret_mean"] - a["regret_mean"]
    return diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0


def goals_from(rows: list[dict]) -> tuple[dict, dict]:
    """Goals (booleans) and their margins in standard errors (see the module docstring)."""
    by = {(r["dataset"], r["method"]): r for r in rows}
    goals, margins = {}, {}
    problems = list(dict.fromkeys(r["dataset"] for r in rows))
    beats = []
    for p in problems:
        rnd = by.get((p, "random"))
        for arm in GPEXT_ARMS:
            r = by.get((p, arm))
            if r is None or rnd is None:
                continue
            key = f"{p}_{arm}_beats_random"
            goals[key] = r["regret_mean"] < rnd["regret_mean"]
            margins[key] = _margin(r, rnd)
            beats.append(goals[key])
    if beats:
        complete = all((p, a) in by for p in PROBLEMS for a in (*GPEXT_ARMS, "random"))
        goals["every_gpext_surrogate_beats_random_on_every_problem"] = complete and all(beats)
    gp_rows = [by[("hartmann6", a)] for a in GPEXT_ARMS if ("hartmann6", a) in by]
    if gp_rows:
        best = min(gp_rows, key=lambda r: r["regret_mean"])
        gp, vbll = by.get(("hartmann6", "singletaskgp")), by.get(("hartmann6", "vbll"))
        if gp is not None:
            key = "hartmann6_best_gpext_within_1se_of_singletaskgp"
            se = math.hypot(best["regret_se"], gp["regret_se"])
            goals[key] = best["regret_mean"] <= gp["regret_mean"] + (se if se == se else 0.0)
            margins[key] = _margin(best, gp)
            margins["hartmann6_best_gpext_arm"] = best["method"]
        if vbll is not None:
            key = "hartmann6_best_gpext_ahead_of_vbll"
            goals[key] = best["regret_mean"] < vbll["regret_mean"]
            margins[key] = _margin(best, vbll)
    ns_rows = [by[("exp2d", a)] for a in GPEXT_ARMS if ("exp2d", a) in by]
    gp = by.get(("exp2d", "singletaskgp"))
    if ns_rows and gp is not None:
        best = min(ns_rows, key=lambda r: r["regret_mean"])
        key = "exp2d_a_gpext_surrogate_beats_singletaskgp"
        goals[key] = best["regret_mean"] < gp["regret_mean"]
        margins[key] = _margin(best, gp)
        margins["exp2d_best_gpext_arm"] = best["method"]
    return goals, margins


def per_arm(runs: list[dict], field: str) -> dict:
    """``{"problem/arm": ...}``: ``"warnings"`` summed over seeds, the first of each class's
    ``"warning_messages"``, or the distinct ``"errors"``."""
    out: dict = {}
    for r in runs:
        key = f"{r['dataset']}/{r['method']}"
        if field == "warnings":
            out.setdefault(key, Counter()).update(r.get("warnings", {}))
        elif field == "warning_messages":
            for name, msg in r.get("warning_messages", {}).items():
                out.setdefault(key, {}).setdefault(name, msg)
        else:
            for msg in r.get("errors", []):
                out.setdefault(key, [])
                if msg not in out[key]:
                    out[key].append(msg)
    return {k: dict(v) if isinstance(v, Counter) else v for k, v in out.items() if v}


# ---------------------------------------------------------------------------------------- main
def read_runs(path: str | Path) -> list[dict]:
    """Runs from a ``--partial`` JSON-lines file or from a written ``bo.json``."""
    path = Path(path)
    text = path.read_text()
    if path.suffix == ".json":
        return json.loads(text)["runs"]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write(runs: list[dict], cfg: dict, args, command: str | None = None) -> dict:
    rows = summarise(runs)
    goals, margins = goals_from(rows)
    extra = {
        "goals": goals,
        "goal_margins": margins,
        "config": cfg,
        "threads": args.threads,
        "warnings": per_arm(runs, "warnings"),
        "errors": per_arm(runs, "errors"),
        "warning_messages": per_arm(runs, "warning_messages"),
        # which code made the runs (pieces may come from different sessions)
        "code_versions": dict(Counter(r.get("code", "unrecorded") for r in runs)),
        "runs": runs,
    }
    write_results("bo", rows, out_dir(args), command=command, extra=extra,
                  title="Bayesian optimisation with gpext surrogates",
                  markdown_skip=("runs", "warning_messages"))  # fmt: skip
    return goals


def main(argv: list[str] | None = None) -> int:
    p = base_parser(__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seeds", type=int, default=None, help="number of seeds from --seed")
    p.add_argument("--iterations", type=int, default=None)
    p.add_argument("--problems", default=",".join(PROBLEMS), help="comma-separated")
    p.add_argument("--arms", "--methods", dest="arms", default=",".join(ARMS),
                   help="comma-separated")  # fmt: skip
    p.add_argument("--partial", default=None, help="JSON-lines file of finished runs (resume)")
    p.add_argument("--combine", nargs="+", default=None, metavar="FILE",
                   help="merge runs of --partial files or bo.json files (first wins) and write "
                   "the results; nothing is run")  # fmt: skip
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = {**(QUICK if args.quick else FULL), "quick": bool(args.quick)}
    if args.seeds is not None:
        cfg["seeds"] = args.seeds
    if args.iterations is not None:
        cfg["iterations"] = args.iterations
    if args.combine:
        runs, seen = [], set()
        for path in args.combine:
            for r in read_runs(path):
                key = (r["dataset"], r["method"], r["seed"])
                if key not in seen:
                    seen.add(key)
                    runs.append(r)
        configs = {r["config"] for r in runs}
        if len(configs) != 1:
            p.error(f"--combine: runs of different configurations {sorted(configs)}")
        cfg = {k: int(v) for k, v in (kv.split("=") for kv in configs.pop().split(","))}
        cfg.update(quick=bool(cfg["quick"]), seeds=len({r["seed"] for r in runs}))
        args.quick = cfg["quick"]  # quick runs are written to results/quick/
        goals = write(runs, cfg, args, command="python benchmarks/bo.py --combine "
                      + " ".join(args.combine))  # fmt: skip
        print(json.dumps(goals, indent=1))
        return 0
    problems = [s for s in args.problems.split(",") if s]
    arms = [s for s in args.arms.split(",") if s]
    for name, allowed, given in (("--problems", PROBLEMS, problems), ("--arms", ARMS, arms)):
        bad = [s for s in given if s not in allowed]
        if bad:
            p.error(f"{name}: unknown {bad}; expected some of {list(allowed)}")
    key = config_key(cfg)
    done: dict[tuple, dict] = {}
    if args.partial and Path(args.partial).exists():
        for r in read_runs(args.partial):
            if r.get("config") == key:
                done[(r["dataset"], r["method"], r["seed"])] = r
    runs = []
    for problem in problems:
        for seed in range(args.seed, args.seed + cfg["seeds"]):
            for arm in arms:  # the arms of one seed back to back
                if arm in CONSTRAINED_ONLY_ARMS and not make_problem(problem).constrained:
                    continue
                if (problem, arm, seed) in done:
                    runs.append(done[(problem, arm, seed)])
                    continue
                r = run_one(problem, arm, seed, cfg)
                runs.append(r)
                print(json.dumps(r), flush=True)
                if args.partial:
                    with open(args.partial, "a") as fh:
                        fh.write(json.dumps(r) + "\n")
    goals = write(runs, cfg, args)
    print(json.dumps(goals, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

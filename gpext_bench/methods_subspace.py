"""Weight-space Bayesian deep learning methods (000, 004, SWAG) registered in ``gpext bench``.

All methods share one protocol: a :class:`~gpext.nn.HeteroscedasticMLP` with one hidden layer of
50 units trained by SGD with momentum 0.9 on the negative mean log-likelihood, with the
per-dataset :class:`TrainingRecipe` of drbayes's small-UCI experiments (000 Sec. IV-B;
:func:`training_recipe`, hyper-parameters read from drbayes's run script, no code taken):

==========  ======  =====  ======  ============  ============
data set    epochs  batch  lr      weight decay  collect from
==========  ======  =====  ======  ============  ============
boston      300     30     1e-3    1e-1          epoch 200
concrete    1000    100    1e-3    1e-2          epoch 500
energy      1000    100    1e-3    1e-1          epoch 500
naval       1000    100    5e-4    1e-4          epoch 500
yacht       1000    30     1e-3    1e-1          epoch 500
other       200     N/10   1e-2(*) 1e-3          epoch 100
==========  ======  =====  ======  ============  ============

(*) cosine-decayed from 1e-2 to 5e-3 over the first 100 epochs, then constant (the recipe of the
earlier gpext protocol, kept for data sets drbayes did not run).

The drbayes recipes use a constant learning rate; the collection phase takes one collection per
epoch (the last 20 deviations kept for SWAG and PCA). Two deliberate differences from drbayes:
mini-batches are drawn from a seeded shuffle every epoch (standard shuffled SGD; drbayes did not
shuffle), and gradients are clipped to norm 10 as a safety net: a heteroscedastic NLL step taken
while the predicted variance collapses can throw the weights into another basin, and the SWA
mean then averages two unrelated solutions (this is what made the SWA mean useless on energy
under an earlier recipe). ``--quick`` divides the epochs by ``QUICK_EPOCH_DIVISOR`` (10, at
least 20 epochs), keeping the collecting fraction (:meth:`TrainingRecipe.with_epochs`) but
collecting over at least the last 20 epochs, so that the rank-20 subspaces exist (boston: 30
epochs, collection from epoch 10; the others: 100 epochs, collection from epoch 50).

The recipes, the temperature grid and the recipe search are the library's
(:class:`gpext.subspace.TrainingRecipe`, :func:`gpext.subspace.temperature_grid`,
:func:`gpext.subspace.select_recipe`); this module only quick-scales them and scores the
candidates. The recipe is chosen per split on validation rows (:func:`recipe_candidates`,
:class:`RecipeSelection`): drbayes's recipe of the data set and the earlier gpext recipe each
train a network on 90% of the training rows, and the one whose ESS model average reaches the
higher validation log-likelihood (over both subspaces and the temperature grid below) is used.
The search exists because drbayes's recipe does not carry over to our implementation on every
set: on yacht its weight decay of 0.1 leaves our network underfit on its own training rows
(training RMSE about 0.25 standard deviations at the SWA mean on split 0), while on naval it
trains about 50 times more steps than the earlier recipe and removes that recipe's underfit.

Data contract: every run trains with :func:`gpext.subspace.train_sgd_trajectory`'s default
``standardize=True``: the network standardises its own inputs and its likelihood (one object
per run) maps its outputs back to the targets' units, with statistics of the rows the run is
trained on, so the recipes below hold on tables in raw units (``benchmarks/generalization.py``)
as on the harness's standardised splits (where the transform is close to the identity), and
every prediction is in the split's target units.

One training run on all training rows per (split, seed) is shared by every method
(cached): SWA, SWAG, the PCA and InKPCA subspaces and FA-SWAG all come from the same iterates,
and only the inference (ESS / VI) differs. Before it, the recipe and the likelihood temperature
are chosen on a validation set (below) with runs on the other 90% of the rows. The reported
seconds of a method are the shared training time, the whole validation search (every method
depends on the chosen recipe) and its own time.

* ``subspace_sgd`` / ``subspace_swa``: the final SGD weights / the SWA mean (single network);
* ``swag``: SWAG (diagonal + rank-20 low-rank, scale 0.5) over every collection, 30 samples;
  ``swag_tuned`` (not a default): the same at the scale :func:`swag_scale` chose on the
  validation rows;
* ``subspace_swa_homo``, ``swag_tuned_homo``, ``pca_ess_homo`` (not defaults): the same
  protocol (recipe search, validation rows, temperature grid) with a homoscedastic network,
  :class:`~gpext.nn.MLP` with one output and noise learned during training
  (``OutputLikelihood("homoscedastic_gaussian")``: the maximum-likelihood noise at the SWA
  mean of its own run), a second shared run per split;
* ``pca_ess`` / ``pca_vi``: :class:`~gpext.subspace.PCASubspace` of the last 20 deviations;
* ``inkpca_ess`` / ``inkpca_vi``: :class:`~gpext.subspace.InKPCASubspace` with an RBF kernel over
  the collected deviations in arrival order; its lengthscale is the median pairwise distance of
  the first five non-zero fed deviations (they are buffered, then fed in order, so the kernel is
  fixed before the first update). An update costs ``O(m^2)`` and more at ``m`` stored points
  (about 4 s for 500 updates at ``D = 952`` on one core, against about 7 s for a whole
  1000-epoch concrete or yacht training run), so the subspace is fed every ``c``-th
  collection, ``c = max(1, round(C / 100))`` for ``C`` collections (:func:`inkpca_feed_every`):
  it sees about 100 deviations, in strict arrival order (boston: every one of its 100; the
  1000-epoch recipes: every 5th of 500);
* ``fa_swag``: :class:`~gpext.subspace.OnlineFactorAnalysis` (online EM, 004) over every SGD
  iterate of the collection phase (naval: about 54,000), 30 samples.

Variance calibration and held-out check (``swag``, ``pca_ess``, ``inkpca_ess``): on the
selection run's validation rows the method's per-sample predictions give a factor on the
predicted variances (:func:`gpext.subspace.select_mixture_variance_scale`), applied to the final
run's predictions (``info["variance_scale"]``), and the same rows go through the library's
held-out check (:func:`gpext.subspace.check_mixture_heldout`, factor cross-fitted), whose
warnings are the method's. The validation rows are :func:`gpext.fit.validation_rows` of the
training rows (10%, but at least 50 or a quarter): without the factor the heteroscedastic
network's variances were 10-50 times too large on some small tables in raw units (test mean
squared z-score 0.02-0.1, every test point inside the 95% interval) and several times too small
on others, with no warning (``benchmarks/generalization.py``).

ESS (30 samples, burn-in 50, thinning 2) and VI (400 Adam steps, learning rate 0.02,
mini-batches of at most 1000 points, 30 samples) use prior standard deviation 1 (000 Sec. IV-B)
and a likelihood temperature ``T = (N / rank)^e`` chosen per split and per subspace on held-out
data (drbayes treats ``T`` as a hyperparameter and hand-set it per data set, from 0.01 to 1e4):
:func:`gpext.fit.validation_rows` of the training rows (10%, at least 50 or a quarter; a
seeded random subset) are held out, a network is trained on the rest
with the same recipe, and ESS in its subspace is run at every ``e`` in
``(-1, -0.5, 0, 0.5, 1, 1.5, 2, 2.5)`` (:func:`temperature_grid`: from ``rank / N`` through 1,
the untempered posterior, and ``N / rank``, the drbayes default, to ``(N / rank)^2.5``, which
reaches drbayes's concrete ``T = 1e4``; its boston VI value 0.01 lies below the grid's lowest
``rank / N``, about 0.044 there; the grid was fixed before any run); the ``e`` whose
30-sample Bayesian model average has the highest validation log-likelihood is kept and used,
with the full ``N``, by the ESS and the VI method of that subspace on the final run (a VI
search per grid point would multiply its cost by eight). The test data play no part in any
choice. With ``validation_fraction=0`` there is no search and ``e = 1``. Predictions are the
equally weighted Gaussian mixture of the per-sample heteroscedastic predictions.
"""

from __future__ import annotations

import math
import time
import warnings

import gpytorch
import torch

from gpext.errors import GpextError, InputDataError, expected_got
from gpext.fit import reference_heldout_nll, validation_rows
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    GPEXT_RECIPE,
    SWAG,
    InKPCASubspace,
    OnlineFactorAnalysis,
    OutputLikelihood,
    PCASubspace,
    RecipeSelection,
    SubspaceModel,
    TrainingRecipe,
    check_mixture_heldout,
    predict_weight_samples,
    regression_mixture_log_likelihood,
    regression_network,
    select_mixture_variance_scale,
    select_recipe,
    select_swag_scale,
    temperature_grid,
    train_sgd_trajectory,
)
from gpext.subspace import recipe_candidates as _library_recipe_candidates
from gpext.subspace import training_recipe as _library_training_recipe
from gpext.subspace.tuning import TEMPERATURE_EXPONENTS
from gpext.utils import check_positive_int
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method
from gpext_bench.runner import reissue_warnings

__all__ = [
    "calibrate_on_validation",
    "DelayedRBFInKPCA",
    "RecipeSelection",
    "SubspaceRun",
    "TemperatureSelection",
    "TrainingRecipe",
    "fit_predict_fa_swag",
    "fit_predict_inkpca_ess",
    "fit_predict_inkpca_vi",
    "fit_predict_pca_ess",
    "fit_predict_pca_ess_homo",
    "fit_predict_pca_vi",
    "fit_predict_sgd",
    "subspace_posterior_predict",
    "fit_predict_swa",
    "fit_predict_swa_homo",
    "fit_predict_swag",
    "fit_predict_swag_tuned",
    "fit_predict_swag_tuned_homo",
    "fit_subspace_run",
    "inkpca_feed_every",
    "recipe_candidates",
    "select_temperature",
    "swag_scale",
    "temperature_grid",
    "training_recipe",
]

HETEROSCEDASTIC, HOMOSCEDASTIC = "heteroscedastic_gaussian", "homoscedastic_gaussian"
_CACHE: dict[tuple, SubspaceRun] = {}
MAX_GRAD_NORM = 10.0
VI_BATCH_SIZE = 1000
VALIDATION_FRACTION = 0.1
QUICK_EPOCH_DIVISOR = 10
QUICK_MIN_COLLECTIONS = 20
INKPCA_TARGET_POINTS = 100


# the recipes live in the library (gpext.subspace.training_recipe); the benchmark's names
FALLBACK_RECIPE = GPEXT_RECIPE


def training_recipe(dataset: str, quick: bool = False) -> TrainingRecipe:
    """The training recipe of a data set (:data:`DRBAYES_RECIPES`, else the fallback).

    :func:`gpext.subspace.training_recipe`, quick-scaled under ``quick``.

    Args:
        dataset: Data set name (``split.name``).
        quick: Divide the epochs by ``QUICK_EPOCH_DIVISOR`` (at least 20), keeping the
            collecting fraction, but collect over at least the last ``QUICK_MIN_COLLECTIONS``
            (20) epochs (boston: 30 epochs, collection from epoch 10).

    Returns:
        The :class:`~gpext.subspace.TrainingRecipe`.

    Example:
        >>> training_recipe("naval").lr
        0.0005
        >>> training_recipe("yacht", quick=True).epochs
        100
    """
    recipe = _library_training_recipe(dataset)
    return _quick_scaled(recipe) if quick else recipe


def _quick_scaled(recipe: TrainingRecipe) -> TrainingRecipe:
    # at least QUICK_MIN_COLLECTIONS collections, so the rank-20 subspaces can be built
    return recipe.shortened(QUICK_EPOCH_DIVISOR, min_epochs=20,
                            min_collections=QUICK_MIN_COLLECTIONS)  # fmt: skip


def recipe_candidates(dataset: str, quick: bool = False) -> dict[str, TrainingRecipe]:
    """The training recipes the validation search chooses from for a data set.

    :func:`gpext.subspace.recipe_candidates` (``"drbayes"`` where drbayes ran the data set,
    always ``"gpext"``), quick-scaled like :func:`training_recipe` under ``quick``.

    Example:
        >>> list(recipe_candidates("yacht")), list(recipe_candidates("kin8nm"))
        (['drbayes', 'gpext'], ['gpext'])
    """
    out = _library_recipe_candidates(dataset)
    return {k: _quick_scaled(r) for k, r in out.items()} if quick else out


def inkpca_feed_every(num_collections: int, target: int = INKPCA_TARGET_POINTS) -> int:
    """Feed period ``c = max(1, round(C / target))`` of the InKPCA subspace over ``C`` collections.

    Example:
        >>> inkpca_feed_every(500), inkpca_feed_every(100), inkpca_feed_every(10)
        (5, 1, 1)
    """
    num_collections = check_positive_int(num_collections, "inkpca_feed_every.num_collections")
    target = check_positive_int(target, "inkpca_feed_every.target")
    return max(1, round(num_collections / target))


class SubspaceRun:
    """One trained network with its trajectory, SWAG, subspaces and factor analysis.

    ``x, y`` are the rows the network was trained on and ``val_x, val_y`` held-out validation
    rows (empty for the final run of a split); ``recipe`` is its :class:`TrainingRecipe`;
    ``selections`` caches :func:`select_temperature` per subspace. The final run of a split
    keeps the run of its temperature search (trained on the fit rows only) as
    ``selection_run``.
    """

    def __init__(
        self,
        net,
        trajectory,
        inkpca,
        fa,
        seconds: float,
        rank: int,
        data: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
    ) -> None:
        self.net, self.trajectory, self.inkpca, self.fa = net, trajectory, inkpca, fa
        self.train_seconds = seconds
        self.rank = rank
        self.x, self.y, self.val_x, self.val_y = data
        #: :func:`gpext.fit.reference_heldout_nll` of these fit and validation rows
        #: (:func:`calibrate_on_validation`; computed on first use, ``None`` if unavailable).
        self.reference_nll: float | None = None
        self.reference_done = False
        self.selections: dict[str, TemperatureSelection] = {}
        #: :func:`swag_scale`'s selection on this (validation) run, and its seconds.
        self.swag_selection = None
        self.swag_seconds = 0.0
        self.selection_run: SubspaceRun | None = None
        self.recipe: TrainingRecipe | None = None
        self.recipe_search: RecipeSelection | None = None
        self.recipe_name: str | None = None
        #: The output likelihood the network was trained with (one object per run: it holds
        #: the run's target transform, and its learned noise).
        self.likelihood: OutputLikelihood = OutputLikelihood(HETEROSCEDASTIC, min_variance=1e-6)
        #: Warnings issued while the run was trained (by :func:`fit_subspace_run`), issued
        #: again whenever a method reuses the cached run, so that every method's fit reports
        #: them (``gpext bench`` records the gpext ones in each method's row).
        self.training_warnings: list[warnings.WarningMessage] = []

    def temperature_exponent(self, subspace: str, config: BenchConfig) -> float:
        """Exponent ``e`` (``T = (N / rank)^e``) chosen for ``subspace`` by
        :func:`select_temperature` on ``selection_run`` (run on first use); 1 without one."""
        if self.selection_run is None:
            return 1.0
        return select_temperature(self.selection_run, subspace, config).exponent

    def selection_seconds(self, subspace: str | None = None) -> float:
        """Time of the validation search a method of this run depends on.

        After a recipe search (:class:`RecipeSelection`) every method depends on all of it:
        every candidate's fit-rows run and the ESS grids of both subspaces. Without one, only
        the subspace methods depend on a search: the fit-rows run and the ESS grid of
        ``subspace`` (``None``, for the methods without a subspace, gives 0).
        """
        if self.recipe_search is not None:
            return self.recipe_search.seconds
        if subspace is None or self.selection_run is None:
            return 0.0
        if subspace not in self.selection_run.selections:
            return 0.0
        sel = self.selection_run
        return sel.train_seconds + sel.selections[subspace].seconds


class TemperatureSelection:
    """The validation choice of the likelihood temperature for one subspace of a run.

    Attributes:
        temperature: The chosen ``T``.
        exponent: Its grid exponent ``e`` (``T = (N / rank)^e``).
        validation_ll: Mean validation log-likelihood (the split's target units) per grid ``T``.
        model: The :class:`~gpext.subspace.SubspaceModel` at the chosen ``T``.
        thetas: Its ESS samples. # shape: (S, r)
        seconds: Time spent on the subspace and the ESS grid.
    """

    def __init__(self, temperature, exponent, validation_ll, model, thetas, seconds) -> None:
        self.temperature, self.exponent, self.validation_ll = temperature, exponent, validation_ll
        self.model, self.thetas, self.seconds = model, thetas, seconds


class DelayedRBFInKPCA:
    """Observer feeding an RBF-kernel :class:`~gpext.subspace.InKPCASubspace` from a trajectory.

    Only every ``feed_every``-th collection (the 1st, the ``(c + 1)``-th, ...) is used.  The
    lengthscale is the library's median rule (``InKPCASubspace(..., lengthscale="median")``):
    the first ``num_init`` non-zero used deviations are buffered, the RBF lengthscale is set to
    their median pairwise distance, then the buffered deviations (the zero first one included)
    are fed in arrival order and every later used one incrementally.  Call as
    ``observer(weights, deviation)``.

    Args:
        rank: Subspace rank.
        num_init: Number of non-zero deviations used for the lengthscale.
        feed_every: Use every ``feed_every``-th collection (:func:`inkpca_feed_every`).
    """

    def __init__(self, rank: int, num_init: int = 5, feed_every: int = 1) -> None:
        self.rank, self.num_init = rank, num_init
        self.feed_every = check_positive_int(feed_every, "DelayedRBFInKPCA.feed_every")
        self.num_seen = 0
        self.subspace = InKPCASubspace(
            rank, gpytorch.kernels.RBFKernel(), lengthscale="median", num_init=num_init
        )
        self.update_seconds = 0.0

    def __call__(self, weights: torch.Tensor, deviation: torch.Tensor) -> None:
        self.num_seen += 1
        if (self.num_seen - 1) % self.feed_every:
            return
        t0 = time.perf_counter()
        self.subspace.update(deviation)
        self.update_seconds += time.perf_counter() - t0


class _BatchedFeed:
    """Buffers every iterate and hands them, in order, to ``update`` once per collection.

    :meth:`OnlineFactorAnalysis.update` processes rows strictly one after the other, so feeding
    an epoch's iterates at once gives the same state as feeding them one by one, with less
    per-call overhead.
    """

    def __init__(self, update) -> None:
        self.update, self.rows = update, []

    def __call__(self, weights: torch.Tensor) -> None:
        self.rows.append(weights.detach().clone())

    def flush(self, *_args) -> None:
        if self.rows:
            self.update(torch.stack(self.rows))
            self.rows = []


def fit_subspace_run(
    split: DatasetSplit,
    config: BenchConfig,
    *,
    recipe: TrainingRecipe | None = None,
    epochs: int | None = None,
    rank: int = 20,
    validation_fraction: float = VALIDATION_FRACTION,
    likelihood: str = HETEROSCEDASTIC,
) -> SubspaceRun:
    """Train (or fetch from the cache) the shared network and trajectory of a split.

    With ``validation_fraction > 0`` the likelihood temperature is chosen first: a random
    ``validation_fraction`` of the training rows (seeded by ``config.seed`` and the split index)
    is held out and a network is trained on the rest (``run.selection_run``), on which
    :func:`select_temperature` scores the grid on the held-out rows, per subspace, when a
    subspace method first asks for it. The network every method uses is trained
    afresh, with the same recipe and seed, on all training rows, and the subspace methods
    use the chosen exponent ``e`` as ``T = (N / rank)^e`` with the full ``N`` (the usual
    refit after validation). The warnings of the training are kept
    (``run.training_warnings``) and issued again each time the cached run is returned, so that
    each method sharing it reports them. The cache holds the last run, keyed by split and
    config (so the registered methods, which pass neither, reuse a run trained with explicit
    settings);
    ``recipe``, ``epochs``, ``rank`` and ``validation_fraction`` only apply when a new run is
    trained.

    Without an explicit ``recipe`` or ``epochs`` the recipe itself is chosen on the same
    validation rows from :func:`recipe_candidates` (drbayes's recipe of the data set and the
    earlier gpext recipe): each candidate trains a network on the fit rows, the temperature
    grid is scored in both of its subspaces, and the candidate with the best validation
    log-likelihood anywhere on the grid wins (``run.recipe_search``, a
    :class:`RecipeSelection`; ``run.recipe_name``). Its fit-rows run becomes
    ``run.selection_run``, so the temperatures come from the same search.

    Args:
        split: The data split.
        config: Benchmark settings.
        recipe: Training recipe (default: chosen on validation rows as above; with
            ``validation_fraction=0``, the first candidate, drbayes's where it exists).
        epochs: Override of the epochs of ``recipe``, else of the data set's full recipe
            (:meth:`TrainingRecipe.with_epochs`: collection over the same fraction).
        rank: Subspace rank, SWAG deviations and factors.
        validation_fraction: Fraction of the training rows held out, in ``[0, 0.5]``.
        likelihood: ``"heteroscedastic_gaussian"`` (the protocol's
            :class:`~gpext.nn.HeteroscedasticMLP`) or ``"homoscedastic_gaussian"`` (an
            :class:`~gpext.nn.MLP` with one output and learned noise; the ``*_homo`` methods).
            The cache keeps one run per likelihood of the current split.

    Raises:
        InputDataError: If ``validation_fraction`` is outside ``[0, 0.5]`` or the likelihood
            is not one of the two.
    """
    if likelihood not in (HETEROSCEDASTIC, HOMOSCEDASTIC):
        raise InputDataError(
            expected_got("fit_subspace_run.likelihood", f"{HETEROSCEDASTIC!r} or "
                         f"{HOMOSCEDASTIC!r}", likelihood)
        )  # fmt: skip
    if not 0 <= validation_fraction <= 0.5:
        raise InputDataError(
            expected_got(
                "fit_subspace_run.validation_fraction", "a number in [0, 0.5]", validation_fraction
            )
        )
    if recipe is not None or epochs is not None:
        if recipe is None:
            recipe = training_recipe(split.name)
        candidates = {"given": recipe if epochs is None else recipe.with_epochs(epochs)}
    else:
        candidates = recipe_candidates(split.name, config.quick)
    base = (split.name, split.split_index, split.num_train, config.seed, config.quick, config.dtype)
    key = (*base, likelihood)
    if key in _CACHE:
        run = _CACHE[key]
        # a method reusing the run reports the warnings of its training as its own
        reissue_warnings(run.training_warnings)
        return run
    for old in [k for k in _CACHE if k[:-1] != base]:
        del _CACHE[old]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = _train_split_run(split, config, candidates, rank, validation_fraction, likelihood)
    run.training_warnings = list(caught)
    reissue_warnings(caught)
    _CACHE[key] = run
    return run


def _train_split_run(split, config, candidates, rank, validation_fraction, likelihood):
    seed = config.seed + split.split_index
    all_x = split.train_x.to(config.device, config.dtype)
    all_y = split.train_y.to(config.device, config.dtype)
    n = split.num_train
    n_val = validation_rows(n, validation_fraction)
    selection_run, search = None, None
    name = next(iter(candidates))
    if n_val > 0:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        val_idx = perm[:n_val].sort().values.to(all_x.device)
        fit_idx = perm[n_val:].sort().values.to(all_x.device)
        data = (all_x[fit_idx], all_y[fit_idx], all_x[val_idx], all_y[val_idx])
        if len(candidates) == 1:
            selection_run = _train_run(data, candidates[name], rank, seed, config, likelihood)
        else:
            name, selection_run, search = _select_recipe(
                candidates, data, rank, seed, config, likelihood
            )
    empty = all_x[:0], all_y[:0]
    run = _train_run((all_x, all_y, *empty), candidates[name], rank, seed, config, likelihood)
    run.selection_run, run.recipe_search, run.recipe_name = selection_run, search, name
    return run


def _select_recipe(
    candidates: dict[str, TrainingRecipe],
    data: tuple,
    rank: int,
    seed: int,
    config: BenchConfig,
    likelihood: str = "heteroscedastic_gaussian",
) -> tuple[str, SubspaceRun, RecipeSelection]:
    """Train every candidate on the fit rows and keep the best by validation log-likelihood.

    A candidate's score is the best validation log-likelihood of the ESS model averages over
    both subspaces and the whole temperature grid (:func:`select_temperature`); a subspace
    that cannot be built on a candidate's trajectory scores ``-inf`` there.
    """

    def score(name: str, recipe: TrainingRecipe) -> tuple[float, SubspaceRun]:
        run = _train_run(data, recipe, rank, seed, config, likelihood)
        best = -math.inf
        for subspace in ("pca", "inkpca"):
            try:
                sel = select_temperature(run, subspace, config)
            except GpextError:
                continue
            best = max([best, *(v for v in sel.validation_ll.values() if math.isfinite(v))])
        return best, run

    search = select_recipe(candidates, score)
    return search.name, search.results[search.name], search


def _train_run(
    data: tuple,
    recipe: TrainingRecipe,
    rank: int,
    seed: int,
    config: BenchConfig,
    likelihood: str = "heteroscedastic_gaussian",
) -> SubspaceRun:
    x, y = data[0], data[1]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    # one likelihood object per run: the run's target transform (and learned noise)
    lik = OutputLikelihood(likelihood, min_variance=1e-6)
    if likelihood == HETEROSCEDASTIC:
        net = HeteroscedasticMLP(x.shape[-1], [50]).to(config.device, config.dtype)
    else:
        net = regression_network(lik, x.shape[-1], [50]).to(config.device, config.dtype)
    inkpca = DelayedRBFInKPCA(rank, feed_every=inkpca_feed_every(recipe.num_collections))
    fa = OnlineFactorAnalysis(
        sum(p.numel() for p in net.parameters()),
        rank,
        "em",
        warmup=100,
        dtype=config.dtype,
        device=config.device,
        generator=gen,
    )
    fa_feed = _BatchedFeed(fa.update)
    t0 = time.perf_counter()
    traj = train_sgd_trajectory(
        net,
        x,
        y,
        lik,
        epochs=recipe.epochs,
        swa_start=recipe.collect_from,
        lr=recipe.lr,
        swa_lr=recipe.lr if recipe.swa_lr is None else recipe.swa_lr,
        weight_decay=recipe.weight_decay,
        batch_size=recipe.batch_size,
        max_grad_norm=MAX_GRAD_NORM,
        max_deviations=rank,
        observers=[inkpca, fa_feed.flush],
        step_observers=[fa_feed],
        generator=gen,
        show_progress=config.show_progress,
    )
    fa_feed.flush()
    run = SubspaceRun(net, traj, inkpca, fa, time.perf_counter() - t0, rank, data)
    run.recipe, run.likelihood = recipe, lik
    return run


def _mixture(pred: dict, info: dict) -> Prediction:
    return Prediction(
        mixture_means=pred["means"].detach().to(torch.float64).cpu(),
        mixture_variances=pred["variances"].detach().to(torch.float64).cpu(),
        info=info,
    )


def _single(
    run: SubspaceRun, w: torch.Tensor, split: DatasetSplit, config: BenchConfig, t0: float
) -> Prediction:
    test_x = split.test_x.to(config.device, config.dtype)
    pred = predict_weight_samples(run.net, w[None], test_x, run.likelihood)
    return _mixture(pred, _info(run, t0))


def _info(run: SubspaceRun, t0: float, subspace: str | None = None) -> dict:
    """Seconds (shared training, the validation search the method depends on, its own time)
    and which recipe the run used (``drbayes_recipe``: 1 for drbayes's, 0 otherwise)."""
    seconds = run.train_seconds + run.selection_seconds(subspace) + time.perf_counter() - t0
    return {"seconds": seconds, "drbayes_recipe": float(run.recipe_name == "drbayes")}


@register_method(
    "subspace_sgd",
    task="regression",
    description="Heteroscedastic MLP, final SGD weights",
    default=False,
)
def fit_predict_sgd(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """The final SGD iterate of the shared run."""
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    return _single(run, run.trajectory.flat.flatten(), split, config, t0)


@register_method(
    "subspace_swa", task="regression", description="Heteroscedastic MLP, SWA mean", default=False
)
def fit_predict_swa(
    split: DatasetSplit, config: BenchConfig, likelihood: str = HETEROSCEDASTIC
) -> Prediction:
    """The SWA mean of the shared run."""
    run = fit_subspace_run(split, config, likelihood=likelihood)
    t0 = time.perf_counter()
    return _single(run, run.trajectory.swa_weights(), split, config, t0)


@register_method(
    "swag",
    task="regression",
    description="SWAG (diag + rank 20, scale 0.5), 30 samples, variance factor on validation rows",
)
def fit_predict_swag(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """SWAG over the shared trajectory."""
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    kappa = 1.0
    if run.selection_run is not None:
        sel = run.selection_run
        gen = torch.Generator().manual_seed(config.seed)
        w = SWAG.from_trajectory(sel.trajectory).sample(30, scale=0.5, generator=gen)
        kappa = calibrate_on_validation(
            sel, predict_weight_samples(sel.net, w, sel.val_x, sel.likelihood), "SWAG"
        )
    gen = torch.Generator().manual_seed(config.seed)
    w = SWAG.from_trajectory(run.trajectory).sample(30, scale=0.5, generator=gen)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), run.likelihood
    )
    pred["variances"] = pred["variances"] * kappa
    return _mixture(pred, {**_info(run, t0), "variance_scale": kappa})


def calibrate_on_validation(sel: SubspaceRun, pred: dict, name: str) -> float:
    """The variance factor of a method, chosen on the validation rows of its selection run.

    :func:`gpext.subspace.select_mixture_variance_scale` on the per-sample validation
    predictions ``pred`` (``means``, ``variances``: ``(S, M)``) of the run trained on the fit
    rows; the factor multiplies the final run's predicted variances. The same rows then go
    through the library's held-out check (:func:`gpext.subspace.check_mixture_heldout`, the
    factor cross-fitted), whose warnings (no signal, over- or underconfidence, and a
    :class:`~gpext.errors.ReferenceGapWarning` when an exact GP fitted to the same fit rows,
    :func:`gpext.fit.reference_heldout_nll`, cached on ``sel``, does more than 0.5 nats per
    point better) are the method's own.
    """
    kappa, _ = select_mixture_variance_scale(pred["means"], pred["variances"], sel.val_y)
    if not sel.reference_done:
        sel.reference_nll = reference_heldout_nll(
            sel.x, sel.y, sel.val_x, sel.val_y, generator=torch.Generator().manual_seed(0)
        )
        sel.reference_done = True
    check_mixture_heldout(
        pred["means"], pred["variances"], sel.val_y, cross_fit_variance=True,
        train_mean=sel.y.double().mean(), name=f"{name} (validation run)",
        reference_nll=sel.reference_nll,
    )  # fmt: skip
    return kappa


@register_method(
    "swag_tuned",
    task="regression",
    description="SWAG (diag + rank 20), scale chosen on validation rows, 30 samples",
    default=False,
)
def fit_predict_swag_tuned(
    split: DatasetSplit, config: BenchConfig, likelihood: str = HETEROSCEDASTIC
) -> Prediction:
    """SWAG over the shared trajectory at the scale :func:`swag_scale` chose."""
    run = fit_subspace_run(split, config, likelihood=likelihood)
    t0 = time.perf_counter()
    scale = swag_scale(run, config)
    gen = torch.Generator().manual_seed(config.seed)
    w = SWAG.from_trajectory(run.trajectory).sample(30, scale=scale, generator=gen)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), run.likelihood
    )
    info = _info(run, t0)
    sel = run.selection_run
    if sel is not None:  # the validation run (unless the recipe search counted it) and search
        info["seconds"] += sel.swag_seconds + (0 if run.recipe_search else sel.train_seconds)
    return _mixture(pred, {**info, "swag_scale": scale})


def swag_scale(run: SubspaceRun, config: BenchConfig) -> float:
    """SWAG covariance scale chosen on the validation rows of ``run.selection_run``.

    :func:`gpext.subspace.select_swag_scale` (30 draws, scales 0 to 4, common random numbers)
    on the SWAG of the run trained on the fit rows, scored on its validation rows; 0.5 (the
    customary value) without a selection run. Cached on ``run``.
    """
    if run.selection_run is None:
        return 0.5
    sel = run.selection_run
    if sel.swag_selection is None:
        gen = torch.Generator().manual_seed(config.seed)
        t0 = time.perf_counter()
        sel.swag_selection = select_swag_scale(
            sel.net, SWAG.from_trajectory(sel.trajectory), sel.val_x, sel.val_y, sel.likelihood,
            num_samples=30, tune_noise=False, generator=gen,
        )  # fmt: skip
        sel.swag_seconds = time.perf_counter() - t0
    return float(sel.swag_selection.value)


@register_method(
    "fa_swag",
    task="regression",
    description="Online-EM factor analysis of SGD iterates (004), 30 samples",
    default=False,
)
def fit_predict_fa_swag(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Samples from the online factor-analysis Gaussian over weights."""
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(config.seed)
    w = run.fa.sample(30, scale=1.0, generator=gen).to(config.dtype)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), run.likelihood
    )
    return _mixture(pred, _info(run, t0))


def select_temperature(
    run: SubspaceRun, subspace: str, config: BenchConfig
) -> TemperatureSelection:
    """Choose the likelihood temperature of a subspace of ``run`` on its validation rows.

    ESS (30 samples) is run at ``T = (N / rank)^e`` for each exponent ``e`` of
    ``TEMPERATURE_EXPONENTS`` (:func:`temperature_grid`); the ``e`` whose Bayesian model average
    has the highest mean validation log-likelihood is kept (without validation rows only
    ``e = 1`` is run). Every chain starts from the same random state. Cached per subspace on
    ``run``.

    Args:
        run: The shared run.
        subspace: ``"pca"`` or ``"inkpca"``.
        config: Benchmark settings.

    Returns:
        The :class:`TemperatureSelection`.

    Raises:
        InputDataError: On an unknown subspace name.
    """
    if subspace in run.selections:
        return run.selections[subspace]
    t0 = time.perf_counter()
    proj = _projection(run, subspace, config)
    has_val = run.val_x.shape[0] > 0
    best, scores = None, {}
    for exponent in TEMPERATURE_EXPONENTS if has_val else (1.0,):
        temperature, model = _tempered_model(run, proj, exponent)
        thetas = _ess_draws(model, run, config, torch.Generator().manual_seed(config.seed))
        score = float("nan")
        if has_val:
            pred = model.predict(run.val_x, thetas)
            score = float(
                regression_mixture_log_likelihood(
                    pred["means"], pred["variances"], run.val_y
                ).mean()
            )
        scores[temperature] = score
        if best is None or score > best[0]:
            best = (score, temperature, exponent, model, thetas)
    _, temperature, exponent, model, thetas = best
    selection = TemperatureSelection(
        temperature, exponent, scores, model, thetas, time.perf_counter() - t0
    )
    run.selections[subspace] = selection
    return selection


def _tempered_model(
    run: SubspaceRun, proj: torch.Tensor, exponent: float
) -> tuple[float, SubspaceModel]:
    """The subspace model around the run's SWA weights at temperature ``(N / rank)^exponent``."""
    temperature = temperature_grid(run.x.shape[0], proj.shape[0], (exponent,))[0]
    model = SubspaceModel(
        run.net,
        run.trajectory.swa_weights(),
        proj,
        run.likelihood,
        prior_std=1.0,
        temperature=temperature,
    )
    return temperature, model


def _ess_draws(
    model: SubspaceModel, run: SubspaceRun, config: BenchConfig, generator: torch.Generator
) -> torch.Tensor:
    """30 elliptical-slice draws of the subspace coordinates on the run's training rows."""
    return model.sample_ess(
        run.x,
        run.y,
        30,
        burn_in=config.budget(20, 50),
        thin=2,
        generator=generator,
        show_progress=config.show_progress,
    )


def _projection(run: SubspaceRun, subspace: str, config: BenchConfig) -> torch.Tensor:
    if subspace == "pca":
        gen = torch.Generator().manual_seed(config.seed)
        return PCASubspace(run.rank).fit(run.trajectory.deviations(), generator=gen).projection
    if subspace == "inkpca":
        return run.inkpca.subspace.projection.to(config.dtype)
    raise InputDataError(expected_got("subspace", "'pca' or 'inkpca'", subspace))


def subspace_posterior_predict(
    run: SubspaceRun,
    subspace: str,
    inference: str,
    exponent: float,
    test_x: torch.Tensor,
    config: BenchConfig,
    generator: torch.Generator,
) -> tuple[dict[str, torch.Tensor], float, int]:
    """30 posterior draws of a subspace of ``run`` at ``T = (N / rank)^exponent`` and their
    test predictions.

    Args:
        run: A trained run (its trajectory, InKPCA state and training rows).
        subspace: ``"pca"`` or ``"inkpca"``.
        inference: ``"ess"`` (elliptical slice sampling) or ``"vi"`` (mean-field VI).
        exponent: Temperature exponent.
        test_x: Inputs to predict. # shape: (M, D)
        config: Benchmark settings.
        generator: Random state of the sampler.

    Returns:
        ``(prediction, temperature, rank)``: :meth:`SubspaceModel.predict`'s ``means`` and
        ``variances`` (shapes ``(30, M)``), the temperature and the subspace rank.
    """
    proj = _projection(run, subspace, config)
    temperature, model = _tempered_model(run, proj, exponent)
    if inference == "ess":
        thetas = _ess_draws(model, run, config, generator)
    elif inference == "vi":
        model.fit_vi(
            run.x,
            run.y,
            num_steps=config.budget(200, 400),
            lr=2e-2,
            batch_size=VI_BATCH_SIZE,
            generator=generator,
            show_progress=config.show_progress,
        )
        thetas = model.sample_vi(30, generator=generator)
    else:
        raise InputDataError(expected_got("inference", "'ess' or 'vi'", inference))
    return model.predict(test_x, thetas), temperature, int(proj.shape[0])


def _subspace_method(
    split: DatasetSplit,
    config: BenchConfig,
    subspace: str,
    inference: str,
    likelihood: str = HETEROSCEDASTIC,
) -> Prediction:
    run = fit_subspace_run(split, config, likelihood=likelihood)
    t0 = time.perf_counter()
    exponent = run.temperature_exponent(subspace, config)
    kappa = 1.0
    # the default (heteroscedastic) arms; the homoscedastic ones keep the learned noise
    if run.selection_run is not None and inference == "ess" and likelihood == HETEROSCEDASTIC:
        chosen = select_temperature(run.selection_run, subspace, config)
        kappa = calibrate_on_validation(
            run.selection_run,
            chosen.model.predict(run.selection_run.val_x, chosen.thetas),
            f"{subspace.upper()} subspace + ESS",
        )
    pred, temperature, rank = subspace_posterior_predict(
        run,
        subspace,
        inference,
        exponent,
        split.test_x.to(config.device, config.dtype),
        config,
        torch.Generator().manual_seed(config.seed),
    )
    info = {
        # the validation search (training runs and ESS grids) is part of the cost
        **_info(run, t0, subspace),
        "rank": rank,
        "temperature": temperature,
        "temperature_exponent": exponent,
        "variance_scale": kappa,
    }
    pred["variances"] = pred["variances"] * kappa
    return _mixture(pred, info)


@register_method(
    "pca_ess",
    task="regression",
    description="PCA subspace (rank 20) + elliptical slice sampling, variance factor on "
    "validation rows",
)
def fit_predict_pca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """PCA subspace + ESS."""
    return _subspace_method(split, config, "pca", "ess")


@register_method(
    "pca_vi",
    task="regression",
    description="PCA subspace (rank 20) + mean-field VI",
    default=False,
)
def fit_predict_pca_vi(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """PCA subspace + VI."""
    return _subspace_method(split, config, "pca", "vi")


@register_method(
    "inkpca_ess",
    task="regression",
    description="Incremental RBF-kernel PCA subspace (rank 20) + ESS, variance factor on validation "
    "rows",
)
def fit_predict_inkpca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """InKPCA subspace + ESS."""
    return _subspace_method(split, config, "inkpca", "ess")


@register_method(
    "inkpca_vi",
    task="regression",
    description="Incremental RBF-kernel PCA subspace (rank 20) + mean-field VI",
    default=False,
)
def fit_predict_inkpca_vi(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """InKPCA subspace + VI."""
    return _subspace_method(split, config, "inkpca", "vi")


@register_method(
    "subspace_swa_homo",
    task="regression",
    description="MLP with learned homoscedastic noise, SWA mean",
    default=False,
)
def fit_predict_swa_homo(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """The SWA mean of the homoscedastic run (noise: its maximum-likelihood value there)."""
    return fit_predict_swa(split, config, HOMOSCEDASTIC)


@register_method(
    "swag_tuned_homo",
    task="regression",
    description="Learned homoscedastic noise, SWAG at the validation scale, 30 samples",
    default=False,
)
def fit_predict_swag_tuned_homo(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """:func:`fit_predict_swag_tuned` on the homoscedastic run."""
    return fit_predict_swag_tuned(split, config, HOMOSCEDASTIC)


@register_method(
    "pca_ess_homo",
    task="regression",
    description="Learned homoscedastic noise, PCA subspace (rank 20) + ESS",
    default=False,
)
def fit_predict_pca_ess_homo(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """PCA subspace + ESS on the homoscedastic run."""
    return _subspace_method(split, config, "pca", "ess", HOMOSCEDASTIC)

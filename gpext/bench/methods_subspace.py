"""Weight-space Bayesian deep learning methods (000, 004, SWAG) registered in ``gpext bench``.

All methods share one protocol (the drbayes small-UCI setting, 000 Sec. IV-B): a
:class:`~gpext.nn.HeteroscedasticMLP` with one hidden layer of 50 units, SGD with momentum 0.9,
batch size ``N / 10``, weight decay ``1e-3`` and gradients clipped to norm 10, for 200 epochs
(quick: 100): the first half at learning rate ``1e-2`` cosine-decayed to ``5e-3``, the second
half at a constant ``5e-3`` with one collection per epoch (the last 20 deviations kept). One
training run on all training rows per (split, seed, budget) is shared by every method
(cached): SWA, SWAG, the PCA and InKPCA subspaces and FA-SWAG all come from the same iterates,
and only the inference (ESS / VI) differs. Before it, the likelihood temperature is chosen on
a validation set (below) with a second run of the same recipe on the other 90% of the rows.
The reported seconds of a method are the shared training time plus its own time (for the
subspace methods also the temperature search).
Gradient clipping matters: without it a heteroscedastic NLL step taken while the
predicted variance collapses can throw the weights into another basin, and the SWA mean then
averages two unrelated solutions (this is what made the SWA mean useless on energy).

* ``subspace_sgd`` / ``subspace_swa``: the final SGD weights / the SWA mean (single network);
* ``swag``: SWAG (diagonal + rank-20 low-rank, scale 0.5), 30 samples;
* ``pca_ess`` / ``pca_vi``: :class:`~gpext.subspace.PCASubspace` of the last 20 deviations;
* ``inkpca_ess`` / ``inkpca_vi``: :class:`~gpext.subspace.InKPCASubspace` with an RBF kernel over
  all collected deviations, updated at every collection in arrival order; its lengthscale is the
  median pairwise distance of the first five non-zero deviations (they are buffered, then fed in
  order, so the kernel is fixed before the first update);
* ``fa_swag``: :class:`~gpext.subspace.OnlineFactorAnalysis` (online EM, 004) over every SGD
  iterate of the collection phase, 30 samples.

ESS (30 samples, burn-in 50, thinning 2) and VI (400 Adam steps, learning rate 0.02,
mini-batches of at most 1000 points, 30 samples) use prior standard deviation 1 (000 Sec. IV-B)
and a likelihood temperature ``T = (N / rank)^e`` chosen per split and per subspace on held-out
data (drbayes treats ``T`` as a hyperparameter): 10% of the training rows (a seeded random
subset) are held out, a network is trained on the rest, and ESS in its subspace is run at every
``e`` in ``(0, 0.5, 1, 1.5)`` (:func:`temperature_grid`: from 1, the untempered posterior,
through ``N / rank``, the drbayes default, to one step beyond); the ``e`` whose 30-sample
Bayesian model average has the highest validation log-likelihood is kept and used, with the
full ``N``, by the ESS and the VI method of that subspace on the final run (a VI search per
grid point would quadruple its cost). The test data play no part in any choice. With
``validation_fraction=0`` there is no search and ``e = 1``. Predictions are the equally
weighted Gaussian mixture of the per-sample heteroscedastic predictions.

Why the temperature matters here: the heteroscedastic head is trained on SGD iterates, whose
mean jitters at the constant collection rate, and its variance stays several times larger than
the squared residual of the SWA mean (on yacht the median ratio of squared residual to
predicted variance at the SWA mean is about 0.02 on the training data). At ``T = N / rank`` the
subspace posterior is nearly the prior, adds epistemic spread on top and over-covers; the
validation data pick a smaller ``T`` where the subspace posterior moves to weights that explain
the data with less spread. On boston the opposite happens (the head under-estimates the noise
of held-out points) and the validation data pick a ``T`` above ``N / rank``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

import gpytorch
import torch

from gpext.bench.registry import BenchConfig, Prediction, register_method
from gpext.data import DatasetSplit
from gpext.errors import InputDataError, expected_got
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    SWAG,
    InKPCASubspace,
    OnlineFactorAnalysis,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    predict_weight_samples,
    regression_mixture_log_likelihood,
    train_sgd_trajectory,
)
from gpext.utils import check_positive_int

__all__ = [
    "DelayedRBFInKPCA",
    "SubspaceRun",
    "TemperatureSelection",
    "fit_predict_fa_swag",
    "fit_predict_inkpca_ess",
    "fit_predict_inkpca_vi",
    "fit_predict_pca_ess",
    "fit_predict_pca_vi",
    "fit_predict_sgd",
    "fit_predict_swa",
    "fit_predict_swag",
    "fit_subspace_run",
    "select_temperature",
    "temperature_grid",
]

_LIKELIHOOD = OutputLikelihood("heteroscedastic_gaussian", min_variance=1e-6)
_CACHE: dict[tuple, SubspaceRun] = {}
WEIGHT_DECAY = 1e-3
MAX_GRAD_NORM = 10.0
VI_BATCH_SIZE = 1000
VALIDATION_FRACTION = 0.1
TEMPERATURE_EXPONENTS = (0.0, 0.5, 1.0, 1.5)


class SubspaceRun:
    """One trained network with its trajectory, SWAG, subspaces and factor analysis.

    ``x, y`` are the rows the network was trained on and ``val_x, val_y`` held-out validation
    rows (empty for the final run of a split); ``selections`` caches :func:`select_temperature`
    per subspace. The final run of a split keeps the run of its temperature search (trained on
    the fit rows only) as ``selection_run``.
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
        self.selections: dict[str, TemperatureSelection] = {}
        self.selection_run: SubspaceRun | None = None

    def temperature_exponent(self, subspace: str, config: BenchConfig) -> float:
        """Exponent ``e`` (``T = (N / rank)^e``) chosen for ``subspace`` by
        :func:`select_temperature` on ``selection_run`` (run on first use); 1 without one."""
        if self.selection_run is None:
            return 1.0
        return select_temperature(self.selection_run, subspace, config).exponent

    def selection_seconds(self, subspace: str) -> float:
        """Time of the temperature search of ``subspace``: the fit-rows run and its ESS grid."""
        if self.selection_run is None or subspace not in self.selection_run.selections:
            return 0.0
        sel = self.selection_run
        return sel.train_seconds + sel.selections[subspace].seconds


class TemperatureSelection:
    """The validation choice of the likelihood temperature for one subspace of a run.

    Attributes:
        temperature: The chosen ``T``.
        exponent: Its grid exponent ``e`` (``T = (N / rank)^e``).
        validation_ll: Mean validation log-likelihood (standardised units) per grid ``T``.
        model: The :class:`~gpext.subspace.SubspaceModel` at the chosen ``T``.
        thetas: Its ESS samples. # shape: (S, r)
        seconds: Time spent on the subspace and the ESS grid.
    """

    def __init__(self, temperature, exponent, validation_ll, model, thetas, seconds) -> None:
        self.temperature, self.exponent, self.validation_ll = temperature, exponent, validation_ll
        self.model, self.thetas, self.seconds = model, thetas, seconds


def temperature_grid(
    num_train: int, rank: int, exponents: Sequence[float] = TEMPERATURE_EXPONENTS
) -> list[float]:
    r"""Geometric grid of likelihood temperatures around the drbayes default ``N / rank``.

    .. math::

        T_k = (N / r)^{e_k}

    With the default exponents ``(0, 0.5, 1, 1.5)`` the grid runs from 1 (the untempered
    posterior) through the default ``N / r`` to one geometric step beyond it.

    Args:
        num_train: Number of training points ``N``.
        rank: Subspace rank ``r``.
        exponents: The exponents :math:`e_k` (at least one).

    Returns:
        The distinct temperatures, increasing.

    Raises:
        InputDataError: If ``exponents`` is empty or not finite.

    Example:
        >>> temperature_grid(400, 20, (0.0, 0.5, 1.0))
        [1.0, 4.47213595499958, 20.0]
    """
    num_train = check_positive_int(num_train, "temperature_grid.num_train")
    rank = check_positive_int(rank, "temperature_grid.rank")
    exps = [float(e) for e in exponents]
    if not exps or not all(math.isfinite(e) for e in exps):
        raise InputDataError(
            expected_got("temperature_grid.exponents", "one or more finite numbers", exponents)
        )
    return sorted({(num_train / rank) ** e for e in exps})


class DelayedRBFInKPCA:
    """Observer building an RBF-kernel :class:`~gpext.subspace.InKPCASubspace` from a trajectory.

    The first ``num_init`` non-zero deviations are buffered; the RBF lengthscale is set to their
    median pairwise distance, then the buffered deviations (the zero first one included) are fed
    in arrival order and every later one incrementally. Call as ``observer(weights, deviation)``.

    Args:
        rank: Subspace rank.
        num_init: Number of non-zero deviations used for the lengthscale.
    """

    def __init__(self, rank: int, num_init: int = 5) -> None:
        self.rank, self.num_init = rank, num_init
        self.pending: list[torch.Tensor] = []
        self.subspace: InKPCASubspace | None = None
        self.update_seconds = 0.0

    def __call__(self, weights: torch.Tensor, deviation: torch.Tensor) -> None:
        t0 = time.perf_counter()
        if self.subspace is not None:
            self.subspace.update(deviation)
        else:
            self.pending.append(deviation)
            nonzero = [d for d in self.pending if float(d.norm()) > 0]
            if len(nonzero) >= self.num_init:
                x = torch.stack(nonzero).double()
                dist = torch.cdist(x, x)
                ls = float(dist[dist > 0].median())
                kernel = gpytorch.kernels.RBFKernel()
                kernel.lengthscale = ls
                self.subspace = InKPCASubspace(self.rank, kernel)
                self.subspace.update(torch.stack(self.pending))
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
    epochs: int | None = None,
    rank: int = 20,
    validation_fraction: float = VALIDATION_FRACTION,
) -> SubspaceRun:
    """Train (or fetch from the cache) the shared network and trajectory of a split.

    With ``validation_fraction > 0`` the likelihood temperature is chosen first: a random
    ``validation_fraction`` of the training rows (seeded by ``config.seed`` and the split index)
    is held out and a network is trained on the rest (``run.selection_run``), on which
    :func:`select_temperature` scores the grid on the held-out rows, per subspace, when a
    subspace method first asks for it. The network every method uses is trained
    afresh, with the same settings and seed, on all training rows, and the subspace methods
    use the chosen exponent ``e`` as ``T = (N / rank)^e`` with the full ``N`` (the usual
    refit after validation). The cache holds the last run, keyed by split and config;
    ``epochs``, ``rank`` and ``validation_fraction`` only apply when a new run is trained.

    Args:
        split: The data split.
        config: Benchmark settings.
        epochs: Total epochs (default 100 quick / 200 full); the second half collects.
        rank: Subspace rank, SWAG deviations and factors.
        validation_fraction: Fraction of the training rows held out, in ``[0, 0.5]``.

    Raises:
        InputDataError: If ``validation_fraction`` is outside ``[0, 0.5]``.
    """
    if not 0 <= validation_fraction <= 0.5:
        raise InputDataError(
            expected_got(
                "fit_subspace_run.validation_fraction", "a number in [0, 0.5]", validation_fraction
            )
        )
    epochs = epochs or config.budget(100, 200)
    key = (split.name, split.split_index, split.num_train, config.seed, config.quick, config.dtype)
    if key in _CACHE:
        return _CACHE[key]
    _CACHE.clear()
    seed = config.seed + split.split_index
    all_x = split.train_x.to(config.device, config.dtype)
    all_y = split.train_y.to(config.device, config.dtype)
    n = split.num_train
    n_val = round(validation_fraction * n)
    selection_run = None
    if n_val > 0:
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
        val_idx = perm[:n_val].sort().values.to(all_x.device)
        fit_idx = perm[n_val:].sort().values.to(all_x.device)
        data = (all_x[fit_idx], all_y[fit_idx], all_x[val_idx], all_y[val_idx])
        selection_run = _train_run(data, epochs, rank, seed, config)
    empty = all_x[:0], all_y[:0]
    run = _train_run((all_x, all_y, *empty), epochs, rank, seed, config)
    run.selection_run = selection_run
    _CACHE[key] = run
    return run


def _train_run(data: tuple, epochs: int, rank: int, seed: int, config: BenchConfig) -> SubspaceRun:
    x, y = data[0], data[1]
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    swa_start = epochs // 2
    net = HeteroscedasticMLP(x.shape[-1], [50]).to(config.device, config.dtype)
    inkpca = DelayedRBFInKPCA(rank)
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
        _LIKELIHOOD,
        epochs=epochs,
        swa_start=swa_start,
        lr=1e-2,
        swa_lr=5e-3,
        weight_decay=WEIGHT_DECAY,
        max_grad_norm=MAX_GRAD_NORM,
        max_deviations=rank,
        observers=[inkpca, fa_feed.flush],
        step_observers=[fa_feed],
        generator=gen,
        show_progress=config.show_progress,
    )
    fa_feed.flush()
    return SubspaceRun(net, traj, inkpca, fa, time.perf_counter() - t0, rank, data)


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
    pred = predict_weight_samples(run.net, w[None], test_x, _LIKELIHOOD)
    info = {"seconds": run.train_seconds + time.perf_counter() - t0}
    return _mixture(pred, info)


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
def fit_predict_swa(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """The SWA mean of the shared run."""
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    return _single(run, run.trajectory.swa_weights(), split, config, t0)


@register_method(
    "swag", task="regression", description="SWAG (diag + rank 20, scale 0.5), 30 samples"
)
def fit_predict_swag(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """SWAG over the shared trajectory."""
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(config.seed)
    w = SWAG.from_trajectory(run.trajectory).sample(30, scale=0.5, generator=gen)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), _LIKELIHOOD
    )
    return _mixture(pred, {"seconds": run.train_seconds + time.perf_counter() - t0})


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
        run.net, w, split.test_x.to(config.device, config.dtype), _LIKELIHOOD
    )
    return _mixture(pred, {"seconds": run.train_seconds + time.perf_counter() - t0})


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
        _LIKELIHOOD,
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


def _subspace_method(
    split: DatasetSplit, config: BenchConfig, subspace: str, inference: str
) -> Prediction:
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    proj = _projection(run, subspace, config)
    exponent = run.temperature_exponent(subspace, config)
    temperature, model = _tempered_model(run, proj, exponent)
    gen = torch.Generator().manual_seed(config.seed)
    if inference == "ess":
        thetas = _ess_draws(model, run, config, gen)
    else:
        model.fit_vi(
            run.x,
            run.y,
            num_steps=config.budget(200, 400),
            lr=2e-2,
            batch_size=VI_BATCH_SIZE,
            init_std=0.05,
            generator=gen,
            show_progress=config.show_progress,
        )
        thetas = model.sample_vi(30, generator=gen)
    pred = model.predict(split.test_x.to(config.device, config.dtype), thetas)
    info = {
        # the temperature search (its training run and ESS grids) is part of the cost
        "seconds": run.train_seconds + run.selection_seconds(subspace) + time.perf_counter() - t0,
        "rank": int(proj.shape[0]),
        "temperature": temperature,
        "temperature_exponent": exponent,
    }
    return _mixture(pred, info)


@register_method(
    "pca_ess", task="regression", description="PCA subspace (rank 20) + elliptical slice sampling"
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
    description="Incremental RBF-kernel PCA subspace (rank 20) + ESS",
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

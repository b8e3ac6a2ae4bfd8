"""Weight-space Bayesian deep learning methods (000, 004, SWAG) registered in ``gpext bench``.

All methods share one protocol (the drbayes small-UCI setting, 000 Sec. IV-B): a
:class:`~gpext.nn.HeteroscedasticMLP` with one hidden layer of 50 units, SGD with momentum 0.9,
batch size ``N / 10``, weight decay ``1e-3`` and gradients clipped to norm 10, for 200 epochs
(quick: 100): the first half at learning rate ``1e-2`` cosine-decayed to ``5e-3``, the second
half at a constant ``5e-3`` with one collection per epoch (the last 20 deviations kept). One
training run per (split, seed, budget) is shared by every method (cached): SWA, SWAG, the PCA
and InKPCA subspaces and FA-SWAG all come from the same iterates, and only the inference
(ESS / VI) differs. The reported seconds of a method are the shared training time plus its own
time. Gradient clipping matters: without it a heteroscedastic NLL step taken while the
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
mini-batches of at most 1000 points, 30 samples) both use temperature ``N / rank`` (the
drbayes default for VI; with temperature 1 the subspace posterior over-concentrates and ESS
under-covers) and prior standard deviation 1 (000 Sec. IV-B). Predictions are the equally
weighted Gaussian mixture of the per-sample heteroscedastic predictions.
"""

from __future__ import annotations

import time

import gpytorch
import torch

from gpext.bench.registry import BenchConfig, Prediction, register_method
from gpext.data import DatasetSplit
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    SWAG,
    InKPCASubspace,
    OnlineFactorAnalysis,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    predict_weight_samples,
    train_sgd_trajectory,
)

__all__ = [
    "DelayedRBFInKPCA",
    "SubspaceRun",
    "fit_predict_fa_swag",
    "fit_predict_inkpca_ess",
    "fit_predict_inkpca_vi",
    "fit_predict_pca_ess",
    "fit_predict_pca_vi",
    "fit_predict_sgd",
    "fit_predict_swa",
    "fit_predict_swag",
    "fit_subspace_run",
]

_LIKELIHOOD = OutputLikelihood("heteroscedastic_gaussian", min_variance=1e-6)
_CACHE: dict[tuple, SubspaceRun] = {}
WEIGHT_DECAY = 1e-3
MAX_GRAD_NORM = 10.0
VI_BATCH_SIZE = 1000


class SubspaceRun:
    """One trained network with its trajectory, SWAG, subspaces and factor analysis."""

    def __init__(self, net, trajectory, inkpca, fa, seconds: float, rank: int) -> None:
        self.net, self.trajectory, self.inkpca, self.fa = net, trajectory, inkpca, fa
        self.train_seconds = seconds
        self.rank = rank


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
    split: DatasetSplit, config: BenchConfig, *, epochs: int | None = None, rank: int = 20
) -> SubspaceRun:
    """Train (or fetch from the cache) the shared network and trajectory of a split.

    The cache holds the last run, keyed by split and config; ``epochs`` and ``rank`` only apply
    when a new run is trained.

    Args:
        split: The data split.
        config: Benchmark settings.
        epochs: Total epochs (default 100 quick / 200 full); the second half collects.
        rank: Subspace rank, SWAG deviations and factors.
    """
    epochs = epochs or config.budget(100, 200)
    key = (split.name, split.split_index, split.num_train, config.seed, config.quick, config.dtype)
    if key in _CACHE:
        return _CACHE[key]
    _CACHE.clear()
    torch.manual_seed(config.seed + split.split_index)
    gen = torch.Generator().manual_seed(config.seed + split.split_index)
    x = split.train_x.to(config.device, config.dtype)
    y = split.train_y.to(config.device, config.dtype)
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
    run = SubspaceRun(net, traj, inkpca, fa, time.perf_counter() - t0, rank)
    _CACHE[key] = run
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


def _subspace_method(
    split: DatasetSplit, config: BenchConfig, subspace: str, inference: str
) -> Prediction:
    run = fit_subspace_run(split, config)
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(config.seed)
    x = split.train_x.to(config.device, config.dtype)
    y = split.train_y.to(config.device, config.dtype)
    if subspace == "pca":
        proj = PCASubspace(run.rank).fit(run.trajectory.deviations(), generator=gen).projection
    else:
        proj = run.inkpca.subspace.projection.to(config.dtype)
    temperature = x.shape[0] / proj.shape[0]
    model = SubspaceModel(
        run.net,
        run.trajectory.swa_weights(),
        proj,
        _LIKELIHOOD,
        prior_std=1.0,
        temperature=temperature,
    )
    if inference == "ess":
        thetas = model.sample_ess(
            x,
            y,
            30,
            burn_in=config.budget(20, 50),
            thin=2,
            generator=gen,
            show_progress=config.show_progress,
        )
    else:
        model.fit_vi(
            x,
            y,
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
        "seconds": run.train_seconds + time.perf_counter() - t0,
        "rank": int(proj.shape[0]),
        "temperature": temperature,
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

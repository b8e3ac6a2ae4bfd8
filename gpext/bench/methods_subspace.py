"""Weight-space Bayesian deep learning methods (000, 004, SWAG) registered in ``gpext bench``.

All methods share one protocol (the drbayes small-UCI setting, 000 Sec. IV-B): a
:class:`~gpext.nn.HeteroscedasticMLP` with one hidden layer of 50 units, SGD with momentum and
batch size ``N / 10``, then a constant-rate collection phase with one collection per epoch. One
training run per (split, seed, budget) is shared by every method (cached), so the methods differ
only in what they do with the same trajectory:

* ``subspace_sgd`` / ``subspace_swa``: the final SGD weights / the SWA mean (single network);
* ``swag``: SWAG (diagonal + rank-20 low-rank, scale 0.5), 30 samples;
* ``pca_ess`` / ``pca_vi``: :class:`~gpext.subspace.PCASubspace` of the last 20 deviations;
* ``inkpca_ess`` / ``inkpca_vi``: :class:`~gpext.subspace.InKPCASubspace` with an RBF kernel over
  all collected deviations, updated at every collection in arrival order; its lengthscale is the
  median pairwise distance of the first five non-zero deviations (they are buffered, then fed in
  order, so the kernel is fixed before the first update);
* ``fa_swag``: :class:`~gpext.subspace.OnlineFactorAnalysis` (online EM, 004) over every SGD
  iterate of the collection phase, 30 samples.

ESS and VI both use temperature ``N / rank`` (the drbayes default for VI; with temperature 1 the
subspace posterior over-concentrates and ESS under-covers) and prior standard deviation 1
(000 Sec. IV-B). Predictions are the equally weighted Gaussian mixture of
the per-sample heteroscedastic predictions.
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


def fit_subspace_run(
    split: DatasetSplit, config: BenchConfig, *, epochs: int | None = None, rank: int = 20
) -> SubspaceRun:
    """Train (or fetch from the cache) the shared network and trajectory of a split.

    The cache holds the last run, keyed by split and config; ``epochs`` and ``rank`` only apply
    when a new run is trained.

    Args:
        split: The data split.
        config: Benchmark settings.
        epochs: Total epochs (default 200 quick / 400 full); the second half collects.
        rank: Subspace rank, SWAG deviations and factors.
    """
    epochs = epochs or config.budget(200, 400)
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
        max_deviations=rank,
        observers=[inkpca],
        step_observers=[fa.update],
        generator=gen,
        show_progress=config.show_progress,
    )
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
    t0 = time.perf_counter()
    run = fit_subspace_run(split, config)
    return _single(run, run.trajectory.flat.flatten(), split, config, t0)


@register_method(
    "subspace_swa", task="regression", description="Heteroscedastic MLP, SWA mean", default=False
)
def fit_predict_swa(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """The SWA mean of the shared run."""
    t0 = time.perf_counter()
    run = fit_subspace_run(split, config)
    return _single(run, run.trajectory.swa_weights(), split, config, t0)


@register_method(
    "swag", task="regression", description="SWAG (diag + rank 20, scale 0.5), 30 samples"
)
def fit_predict_swag(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """SWAG over the shared trajectory."""
    t0 = time.perf_counter()
    run = fit_subspace_run(split, config)
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
    t0 = time.perf_counter()
    run = fit_subspace_run(split, config)
    gen = torch.Generator().manual_seed(config.seed)
    w = run.fa.sample(30, scale=1.0, generator=gen).to(config.dtype)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), _LIKELIHOOD
    )
    return _mixture(pred, {"seconds": run.train_seconds + time.perf_counter() - t0})


def _subspace_method(
    split: DatasetSplit, config: BenchConfig, subspace: str, inference: str
) -> Prediction:
    t0 = time.perf_counter()
    run = fit_subspace_run(split, config)
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
            num_steps=config.budget(1000, 2000),
            lr=1e-2,
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

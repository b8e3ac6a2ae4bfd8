"""Peers of gpext's weight-space methods on the small UCI sets (issue 22), for ``gpext bench``.

Registered regression methods (not run by default; ``benchmarks/subspace_uci.py`` runs them
beside the subspace methods on the same splits):

* ``map_laplace_kron``: laplace-torch's Kronecker-factored Laplace approximation over all
  weights of a MAP network, GLM (linearised) predictive.
* ``map_laplace_last_layer``: laplace-torch's full-covariance Laplace over the last layer.
* ``deep_ensemble``: :data:`ENSEMBLE_SIZE` homoscedastic MAP networks, an equal-weight mixture.
* ``multiswag``: :class:`gpext.subspace.MultiSWAG` over :data:`MULTISWAG_COMPONENTS`
  independent SGD runs of gpext's own heteroscedastic network and validated recipe (the run
  the subspace methods share is the first component).

The MAP network is a homoscedastic MLP with one hidden layer of 50 ReLU units (the network of
the drbayes protocol), trained by Adam (learning rate :data:`MAP_LR`, mini-batches of
:data:`MAP_BATCH` rows, or ``N / 50`` when that is larger, so that an epoch is at most
:data:`MAP_MAX_STEPS_PER_EPOCH` steps; weight decay :data:`MAP_WEIGHT_DECAY`) on the mean squared error of 90% of
the training rows, for at most :data:`MAP_EPOCHS` epochs with early stopping on the held-out
10% (patience :data:`MAP_PATIENCE` epochs, the best epoch's weights kept).  Each ensemble
member sets its noise variance to its own held-out mean squared error (the maximum-likelihood
noise on rows it was not trained on).  The Laplace arms fit the curvature on all training rows
and then tune the prior precision and the noise standard deviation jointly by maximising
laplace-torch's Laplace marginal likelihood (Adam on their logarithms,
:data:`MARGLIK_STEPS` steps), the post-hoc tuning laplace-torch documents; the predictive
variance is the GLM variance plus the tuned noise variance.  The first ensemble member is the
MAP network of the Laplace arms.

laplace-torch is an optional peer: install it without its torchvision dependency (a CUDA
torchvision wheel breaks ``import laplace`` next to the CPU torch), as
``benchmarks/subspace_uci.py`` documents.  Without it the Laplace arms fail with a
:class:`~gpext.errors.MissingExtraError` that the runner records.
"""

from __future__ import annotations

import copy
import math
import time

import torch
from torch import nn

from gpext.errors import MissingExtraError
from gpext.nn import MLP
from gpext.subspace import SWAG, MultiSWAG, predict_weight_samples
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "ENSEMBLE_SIZE",
    "MULTISWAG_COMPONENTS",
    "fit_predict_deep_ensemble",
    "fit_predict_laplace_kron",
    "fit_predict_laplace_last_layer",
    "fit_predict_multiswag",
    "map_holdout",
    "map_member",
    "component_runs",
    "member_seed",
    "train_map_network",
]

ENSEMBLE_SIZE = 5
MULTISWAG_COMPONENTS = 3
MULTISWAG_SAMPLES = 30  # in all, split evenly over the components
MAP_LR = 1e-3
MAP_BATCH = 32
MAP_MAX_STEPS_PER_EPOCH = 50  # larger batches beyond 50 * 32 rows (naval: about 190)
MAP_WEIGHT_DECAY = 1e-4
MAP_EPOCHS = 1000
MAP_PATIENCE = 100
MARGLIK_STEPS = 300
VALIDATION_FRACTION = 0.1

# the MAP networks of the last split: {member index: (net, noise variance, seconds)}
_MAP_CACHE: dict = {}
# the extra SGD runs of the last split (MultiSWAG's and the multi_* arms' components)
_RUN_CACHE: dict = {}


def member_seed(config: BenchConfig, split: DatasetSplit, member: int) -> int:
    """Seed of a MAP network (its hold-out, initial weights and mini-batch order)."""
    return 10007 * config.seed + 101 * split.split_index + member


def map_holdout(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The MAP network's rows: ``(fit, held_out)`` indices, 10% held out (``generator`` is
    advanced; seeded with a member's seed it gives that member's split of the rows)."""
    perm = torch.randperm(n, generator=generator)
    n_val = max(1, round(VALIDATION_FRACTION * n))
    return perm[n_val:], perm[:n_val]


def train_map_network(
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    epochs: int = MAP_EPOCHS,
    patience: int = MAP_PATIENCE,
) -> tuple[nn.Module, float, int]:
    """Train the homoscedastic MAP network with early stopping on a 10% hold-out.

    Args:
        x: Standardised inputs. # shape: (N, D)
        y: Standardised targets. # shape: (N,)
        seed: Seed of the hold-out, the initial weights and the mini-batch order.
        epochs: Most epochs.
        patience: Epochs without a better held-out error before stopping.

    Returns:
        ``(network, noise_variance, best_epoch)``: the network at its best held-out epoch, the
        held-out mean squared error at that epoch (the maximum-likelihood noise variance on
        rows it was not trained on), and that epoch.
    """
    gen = torch.Generator().manual_seed(seed)
    fit, val = map_holdout(x.shape[0], gen)
    xf, yf, xv, yv = x[fit], y[fit], x[val], y[val]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        net = MLP(x.shape[-1], [50], 1).to(x.dtype)
    batch = max(MAP_BATCH, math.ceil(xf.shape[0] / MAP_MAX_STEPS_PER_EPOCH))
    opt = torch.optim.Adam(net.parameters(), lr=MAP_LR, weight_decay=MAP_WEIGHT_DECAY)
    best, best_state, best_epoch, since = math.inf, copy.deepcopy(net.state_dict()), 0, 0
    for epoch in range(epochs):
        net.train()
        order = torch.randperm(xf.shape[0], generator=gen)
        for start in range(0, xf.shape[0], batch):
            idx = order[start : start + batch]
            opt.zero_grad()
            loss = (net(xf[idx]).squeeze(-1) - yf[idx]).pow(2).mean()
            loss.backward()
            opt.step()
        net.eval()
        with torch.no_grad():
            mse = float((net(xv).squeeze(-1) - yv).pow(2).mean())
        if mse < best:
            best, best_state, best_epoch, since = mse, copy.deepcopy(net.state_dict()), epoch, 0
        else:
            since += 1
            if since >= patience:
                break
    net.load_state_dict(best_state)
    net.eval()
    return net, best, best_epoch


def map_member(split: DatasetSplit, config: BenchConfig, member: int):
    """The ``member``-th MAP network of a split, trained once per split (cached):
    ``(network, held-out noise variance, best epoch, seconds)``."""
    key = (split.name, split.split_index, split.num_train, config.seed, config.quick)
    if _MAP_CACHE.get("key") != key:
        _MAP_CACHE.clear()
        _MAP_CACHE["key"] = key
    if member not in _MAP_CACHE:
        t0 = time.perf_counter()
        x = split.train_x.to(config.device, config.dtype)
        y = split.train_y.to(config.device, config.dtype)
        epochs = config.budget(MAP_EPOCHS // 10, MAP_EPOCHS)
        patience = config.budget(MAP_PATIENCE // 5, MAP_PATIENCE)
        net, noise, epoch = train_map_network(
            x, y, seed=member_seed(config, split, member), epochs=epochs, patience=patience
        )
        _MAP_CACHE[member] = (net, noise, epoch, time.perf_counter() - t0)
    return _MAP_CACHE[member]


def _laplace(split: DatasetSplit, config: BenchConfig, subset: str, structure: str) -> Prediction:
    try:
        from laplace import Laplace
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise MissingExtraError(
            "map_laplace_*: expected laplace-torch to be importable, got "
            f"{type(err).__name__}: {err}. Install it without torchvision: pip install "
            "-c constraints.txt --no-deps laplace-torch==0.3 asdfghjkl==0.1a4 "
            "backpack-for-pytorch curvlinops-for-pytorch einconv unfoldNd && pip install "
            "-c constraints.txt opt-einsum torchmetrics einops lightning-utilities"
        ) from err
    net, noise, epoch, map_seconds = map_member(split, config, 0)
    t0 = time.perf_counter()
    net = copy.deepcopy(net)
    x = split.train_x.to(config.device, config.dtype)
    y = split.train_y.to(config.device, config.dtype)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, y[:, None]), batch_size=256
    )
    la = Laplace(
        net,
        "regression",
        subset_of_weights=subset,
        hessian_structure=structure,
        sigma_noise=math.sqrt(noise),
    )
    la.fit(loader)
    log_prior = torch.zeros(1, dtype=config.dtype, requires_grad=True)
    log_sigma = torch.tensor([0.5 * math.log(noise)], dtype=config.dtype, requires_grad=True)
    opt = torch.optim.Adam([log_prior, log_sigma], lr=0.1)
    for _ in range(config.budget(MARGLIK_STEPS // 3, MARGLIK_STEPS)):
        opt.zero_grad()
        neg = -la.log_marginal_likelihood(log_prior.exp(), log_sigma.exp())
        neg.backward()
        opt.step()
    la.prior_precision = log_prior.detach().exp()
    la.sigma_noise = log_sigma.detach().exp()
    test_x = split.test_x.to(config.device, config.dtype)
    f_mu, f_var = la(test_x, pred_type="glm")
    sigma2 = float(la.sigma_noise) ** 2
    mean = f_mu.reshape(-1).detach()
    var = f_var.reshape(-1).detach() + sigma2
    info = {
        "seconds": map_seconds + time.perf_counter() - t0,
        "prior_precision": float(la.prior_precision),
        "noise_sd": math.sqrt(sigma2),
        "map_epoch": float(epoch),
    }
    return Prediction(mean=mean.double().cpu(), variance=var.double().cpu(), info=info)


@register_method(
    "map_laplace_kron",
    task="regression",
    description="laplace-torch KFAC Laplace, all weights, marglik-tuned prior and noise, GLM",
    default=False,
)
def fit_predict_laplace_kron(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Kronecker-factored Laplace over all weights of the MAP network."""
    return _laplace(split, config, "all", "kron")


@register_method(
    "map_laplace_last_layer",
    task="regression",
    description="laplace-torch full Laplace on the last layer, marglik-tuned prior and noise, GLM",
    default=False,
)
def fit_predict_laplace_last_layer(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Full-covariance Laplace over the last layer of the MAP network."""
    return _laplace(split, config, "last_layer", "full")


@register_method(
    "deep_ensemble",
    task="regression",
    description=f"{ENSEMBLE_SIZE} homoscedastic MAP networks, held-out noise, mixture",
    default=False,
)
def fit_predict_deep_ensemble(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """An equal-weight mixture of independently trained homoscedastic MAP networks."""
    test_x = split.test_x.to(config.device, config.dtype)
    means, variances, seconds = [], [], 0.0
    for member in range(ENSEMBLE_SIZE):
        net, noise, _, sec = map_member(split, config, member)
        with torch.no_grad():
            mean = net(test_x).squeeze(-1)
        means.append(mean)
        variances.append(torch.full_like(mean, noise))
        seconds += sec
    return Prediction(
        mixture_means=torch.stack(means).double().cpu(),
        mixture_variances=torch.stack(variances).double().cpu(),
        info={"seconds": seconds},
    )


def component_runs(split: DatasetSplit, config: BenchConfig) -> list:
    """The :data:`MULTISWAG_COMPONENTS` independent SGD runs of a split (cached per split).

    The first is the run the subspace methods share
    (:func:`gpext_bench.methods_subspace.fit_subspace_run`, recipe chosen on validation rows);
    the others train the same network with that recipe on all training rows from other seeds
    (:func:`member_seed` of members 1001, 1002, ...). MultiSWAG and the ``multi_*`` arms of
    ``gpext_bench/methods_multi.py`` share them, so each is trained once.
    """
    from gpext_bench import methods_subspace as ms

    run = ms.fit_subspace_run(split, config)
    key = (split.name, split.split_index, split.num_train, config.seed, config.quick, config.dtype)
    if _RUN_CACHE.get("key") != key:
        _RUN_CACHE.clear()
        _RUN_CACHE["key"] = key
        _RUN_CACHE["runs"] = []
    extras = _RUN_CACHE["runs"]
    x = split.train_x.to(config.device, config.dtype)
    y = split.train_y.to(config.device, config.dtype)
    for k in range(len(extras) + 1, MULTISWAG_COMPONENTS):
        extras.append(
            ms._train_run(  # the shared run's recipe, another seed
                (x, y, x[:0], y[:0]),
                run.recipe,
                run.rank,
                member_seed(config, split, 1000 + k),
                config,
            )  # fmt: skip
        )
    return [run, *extras]


@register_method(
    "multiswag",
    task="regression",
    description=f"MultiSWAG, {MULTISWAG_COMPONENTS} SGD runs of gpext's recipe, "
    f"{MULTISWAG_SAMPLES} samples",
    default=False,
)
def fit_predict_multiswag(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """MultiSWAG over independent runs of the subspace methods' network and recipe."""
    runs = component_runs(split, config)
    run = runs[0]
    t0 = time.perf_counter()
    swags = [SWAG.from_trajectory(r.trajectory) for r in runs]
    gen = torch.Generator().manual_seed(member_seed(config, split, 0))
    w = MultiSWAG(swags).sample(MULTISWAG_SAMPLES, scale=0.5, generator=gen)
    pred = predict_weight_samples(
        run.net, w, split.test_x.to(config.device, config.dtype), run.likelihood
    )
    seconds = (
        sum(r.train_seconds for r in runs) + run.selection_seconds(None) + time.perf_counter() - t0
    )
    return Prediction(
        mixture_means=pred["means"].detach().double().cpu(),
        mixture_variances=pred["variances"].detach().double().cpu(),
        info={"seconds": seconds},
    )

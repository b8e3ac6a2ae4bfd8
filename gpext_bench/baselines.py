"""Upstream GPyTorch baselines registered in ``gpext bench``.

* ``gpytorch_exact_gp``: exact GP regression (constant mean, scaled ARD RBF kernel, Gaussian
  likelihood), hyperparameters by Adam on the exact marginal likelihood.  Training sets larger
  than ``max_train`` (2000 quick / 6000 full) are replaced by a seeded random subset so that the
  O(N^3) cost stays bounded on a CPU; the row's ``info`` records this.
* ``gpytorch_svgp``: SVGP regression (Hensman et al. 2013) with learned inducing points,
  minibatch :class:`gpytorch.mlls.VariationalELBO`.
* ``gpytorch_svgp_softmax``: multiclass SVGP with one independent latent GP per class and
  :class:`gpytorch.likelihoods.SoftmaxLikelihood`; probabilities by Monte Carlo.
"""

from __future__ import annotations

import gpytorch
import torch

from gpext.utils import progress_bar
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "ExactGPRegressor",
    "SVGPModel",
    "fit_exact_gp",
    "fit_multilatent_svgp_classifier",
    "fit_svgp",
    "fit_svgp_regression",
    "fit_svgp_softmax",
    "select_inducing_points",
]


class ExactGPRegressor(gpytorch.models.ExactGP):
    """Exact GP with a constant mean and a scaled ARD RBF kernel."""

    def __init__(self, train_x, train_y, likelihood):
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=train_x.shape[-1])
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class SVGPModel(gpytorch.models.ApproximateGP):
    """SVGP with ``num_latents`` independent latent GPs (``num_latents=1``: a single output)."""

    def __init__(self, inducing_points: torch.Tensor, num_latents: int = 1):
        batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size([])
        if num_latents > 1:
            inducing_points = inducing_points.expand(num_latents, *inducing_points.shape).clone()
        dist = gpytorch.variational.CholeskyVariationalDistribution(
            inducing_points.shape[-2], batch_shape=batch
        )
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, dist, learn_inducing_locations=True
        )
        if num_latents > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                strategy, num_tasks=num_latents
            )
        super().__init__(strategy)
        d = inducing_points.shape[-1]
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch), batch_shape=batch
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def select_inducing_points(x: torch.Tensor, m: int, generator: torch.Generator) -> torch.Tensor:
    """A seeded random subset of ``m`` training inputs (all of them if ``m >= N``)."""
    n = x.shape[0]
    idx = torch.randperm(n, generator=generator)[: min(m, n)]
    return x[idx.to(x.device)].clone()


def _generator(config: BenchConfig) -> torch.Generator:
    return torch.Generator().manual_seed(config.seed)


def fit_svgp(
    model: gpytorch.models.ApproximateGP,
    likelihood: gpytorch.likelihoods.Likelihood,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    generator: torch.Generator,
    show_progress: bool | None = None,
    desc: str = "svgp",
    network: torch.nn.Module | None = None,
    network_lr: float | None = None,
    lr_schedule: str = "constant",
    min_batch_size: int = 1,
) -> None:
    """Minibatch Adam on the variational ELBO, data reshuffled each epoch.

    Args:
        lr: Learning rate of the GP (and, without ``network``, of every) parameter.
        network: A feature extractor inside ``model`` whose parameters get ``network_lr``.
        lr_schedule: ``"constant"`` or ``"cosine"`` (annealed to 0 over all steps).
        min_batch_size: Minibatches smaller than this (the last one of an epoch) are skipped.
    """
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    net = set() if network is None else {id(p) for p in network.parameters()}
    params = [*model.parameters(), *likelihood.parameters()]
    groups = [{"params": [p for p in params if id(p) not in net], "lr": lr}]
    if network is not None:
        groups.append({"params": list(network.parameters()), "lr": network_lr or lr})
    opt = torch.optim.Adam(groups)
    n = x.shape[0]
    sched = None
    if lr_schedule == "cosine":
        steps = epochs * sum(1 for s in range(0, n, batch_size) if n - s >= min_batch_size)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(steps, 1), eta_min=0.0)
    model.train()
    likelihood.train()
    for _ in progress_bar(range(epochs), desc=desc, show=show_progress):
        perm = torch.randperm(n, generator=generator).to(x.device)
        for start in range(0, n, batch_size):
            idx = perm[start : start + batch_size]
            if idx.numel() < min_batch_size:
                continue
            opt.zero_grad()
            loss = -mll(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
    model.eval()
    likelihood.eval()


@register_method(
    "gpytorch_exact_gp",
    task="regression",
    description="GPyTorch exact GP, ARD RBF, Adam on the marginal likelihood",
)
def fit_exact_gp(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Fit and predict with :class:`ExactGPRegressor`."""
    gen = _generator(config)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    max_train = config.budget(2000, 6000)
    info = {}
    if x.shape[0] > max_train:
        idx = torch.randperm(x.shape[0], generator=gen)[:max_train].to(x.device)
        x, y = x[idx], y[idx]
        info["subsampled_train"] = max_train
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(x)
    model = ExactGPRegressor(x, y, likelihood).to(x)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model.train()
    for _ in progress_bar(
        range(config.budget(50, 150)), desc="exact gp", show=config.show_progress
    ):
        opt.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        pred = likelihood(model(split.test_x.to(config.device)))
    return Prediction(mean=pred.mean.cpu(), variance=pred.variance.cpu(), info=info)


@register_method(
    "gpytorch_svgp",
    task="regression",
    description="GPyTorch SVGP, learned inducing points, minibatch ELBO",
)
def fit_svgp_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Fit and predict with a single-output :class:`SVGPModel`."""
    gen = _generator(config)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    z = select_inducing_points(x, config.budget(64, 256), gen)
    model = SVGPModel(z).to(x)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(x)
    n = x.shape[0]
    # roughly constant number of optimisation steps across dataset sizes
    batch_size = min(n, 256 if n < 20000 else 1024)
    steps = config.budget(300, 1500)
    epochs = max(1, steps * batch_size // n)
    fit_svgp(
        model, likelihood, x, y, epochs=epochs, batch_size=batch_size, lr=0.02,
        generator=gen, show_progress=config.show_progress, desc="svgp",
    )  # fmt: skip
    with torch.no_grad():
        pred = likelihood(model(split.test_x.to(config.device)))
    return Prediction(mean=pred.mean.cpu(), variance=pred.variance.cpu())


def fit_multilatent_svgp_classifier(
    split: DatasetSplit,
    config: BenchConfig,
    likelihood: gpytorch.likelihoods.Likelihood,
    *,
    desc: str = "svgp",
) -> Prediction:
    """Train a :class:`SVGPModel` with one latent GP per class under ``likelihood``.

    The budget (64 / 256 seeded random inducing points, about 300 / 1500 minibatch Adam steps,
    lr 0.02) is shared by every multi-latent SVGP classifier in the benchmarks, so likelihoods
    are compared on equal terms.  Probabilities come from ``likelihood(model(x))``: a
    ``Categorical`` whose ``probs`` may carry leading sample dimensions (Monte Carlo
    likelihoods), which are averaged.
    """
    gen = _generator(config)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    c = int(split.num_classes)
    z = select_inducing_points(x, config.budget(64, 256), gen)
    model = SVGPModel(z, num_latents=c).to(x)
    likelihood = likelihood.to(x)
    n = x.shape[0]
    batch_size = min(n, 256 if n < 20000 else 1024)
    steps = config.budget(300, 1500)
    epochs = max(1, steps * batch_size // n)
    fit_svgp(
        model, likelihood, x, y, epochs=epochs, batch_size=batch_size, lr=0.02,
        generator=gen, show_progress=config.show_progress, desc=desc,
    )  # fmt: skip
    probs = []
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(256):
        for xb in split.test_x.to(config.device).split(1024):
            p = likelihood(model(xb)).probs
            probs.append(p.reshape(-1, *p.shape[-2:]).mean(0))
    return Prediction(probs=torch.cat(probs).cpu())


@register_method(
    "gpytorch_svgp_softmax",
    task="classification",
    description="GPyTorch SVGP, one latent GP per class, SoftmaxLikelihood",
)
def fit_svgp_softmax(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Multi-latent SVGP with :class:`gpytorch.likelihoods.SoftmaxLikelihood`."""
    c = int(split.num_classes)
    likelihood = gpytorch.likelihoods.SoftmaxLikelihood(
        num_features=c, num_classes=c, mixing_weights=False
    )
    return fit_multilatent_svgp_classifier(split, config, likelihood, desc="svgp softmax")

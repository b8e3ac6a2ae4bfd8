"""Inducing GP networks (002) and the baselines they are compared with, for ``gpext bench``.

Registered methods:

* ``ign`` (regression): :class:`gpext.models.InducingGPNetwork` on an :class:`gpext.nn.MLP`;
  ``fit`` ends with the closed-form pseudo-label refit
  (:meth:`~gpext.models.InducingGPNetwork.refit_pseudo_labels`), its default for regression.
* ``dkl_svgp`` (regression): GPyTorch deep-kernel SVGP, the same MLP, inducing points learned
  on its features, minibatch ELBO.
* ``ign_ova`` / ``ign_dirichlet`` (classification): IGN with one-vs-all probit heads
  (Laplace) / with the Dirichlet transform; ``dkl_svgp_softmax``: deep-kernel SVGP with one
  latent GP per class and a softmax likelihood; ``nn_classifier``: the plain network with a
  linear softmax head (cross-entropy).  The embedding is :class:`gpext.nn.SmallCNN` for
  28 x 28 images and an MLP otherwise.

All methods of one task share one budget (:func:`ign_budget`: inducing points, epochs,
minibatch size, learning rate, network), so that comparisons are at equal epochs and
inducing-point counts; :func:`fit_predict_svgp` is GPyTorch's input-space SVGP on that budget.
"""

from __future__ import annotations

import gpytorch
import torch
from torch import nn

from gpext.bench.baselines import SVGPModel, fit_svgp, select_inducing_points
from gpext.bench.registry import BenchConfig, Prediction, register_method
from gpext.data import DatasetSplit
from gpext.models import InducingGPNetwork
from gpext.nn import MLP, SmallCNN
from gpext.utils import progress_bar

__all__ = [
    "DeepKernelSVGP",
    "fit_predict_dkl_svgp",
    "fit_predict_ign",
    "fit_predict_nn_classifier",
    "fit_predict_svgp",
    "fit_variational",
    "ign_budget",
    "make_embedding",
]


def ign_budget(split: DatasetSplit, config: BenchConfig) -> dict:
    """The shared budget of one fit.

    ``num_inducing``, ``epochs``, ``batch_size``; Adam with learning rate ``lr`` for network
    weights and ``gp_lr`` for everything else (inducing points, kernel and likelihood
    hyperparameters, variational parameters, pseudo-label function), both annealed to zero by
    a cosine schedule over all minibatch steps (``lr_schedule``).
    """
    if split.task == "classification":
        return {
            "num_inducing": config.budget(32, 64),
            "epochs": config.budget(3, 10),
            "batch_size": 128,
            "lr": 3e-3,
            "gp_lr": 0.01,
            "lr_schedule": "cosine",
        }
    n = split.num_train
    return {
        "num_inducing": config.budget(64, 128),
        "epochs": config.budget(2, 6) if n > 20000 else config.budget(4, 12),
        "batch_size": 256,
        "lr": 5e-3,
        "gp_lr": 0.02,
        "lr_schedule": "cosine",
    }


def fit_variational(
    model: nn.Module,
    likelihood: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    budget: dict,
    generator: torch.Generator,
    *,
    network: nn.Module | None = None,
    show_progress: bool | None = None,
    desc: str = "svgp",
) -> None:
    """Minibatch Adam on GPyTorch's ELBO with the budget's learning rates and schedule.

    Parameters of ``network`` get ``budget["lr"]``, all others ``budget["gp_lr"]``; the
    schedule is the one :meth:`gpext.models.InducingGPNetwork.fit` uses, so that the
    baselines are trained exactly like IGN.
    """
    fit_svgp(
        model, likelihood, x, y, epochs=budget["epochs"], batch_size=budget["batch_size"],
        lr=budget["gp_lr"], generator=generator, show_progress=show_progress, desc=desc,
        network=network, network_lr=budget["lr"],
        lr_schedule=budget.get("lr_schedule", "constant"), min_batch_size=2,
    )  # fmt: skip


def make_embedding(split: DatasetSplit, out_features: int | None = None) -> nn.Module:
    """SmallCNN for 28 x 28 images, else ``MLP(D, [64, 64], d)``; classification: ``d = 16`` with
    an output LayerNorm, regression: ``d = 8``."""
    if split.image_shape is not None and tuple(split.image_shape)[-2:] == (28, 28):
        return SmallCNN(out_features or 16, image_shape=split.image_shape, layer_norm=True)
    if split.task == "classification":
        return MLP(split.num_features, (64, 64), out_features or 16, layer_norm=True)
    return MLP(split.num_features, (64, 64), out_features or 8)


def _gen(config: BenchConfig) -> torch.Generator:
    torch.manual_seed(config.seed)
    return torch.Generator().manual_seed(config.seed)


def _xy(split: DatasetSplit, config: BenchConfig):
    dev, dt = config.device, config.dtype
    y = split.train_y.to(dev)
    if split.task == "regression":
        y = y.to(dt)
    return split.train_x.to(dev, dt), y, split.test_x.to(dev, dt)


def fit_predict_ign(
    split: DatasetSplit, config: BenchConfig, *, task: str | None = None, budget: dict | None = None
) -> Prediction:
    """Fit an :class:`InducingGPNetwork` (``task``: regression / one_vs_all / dirichlet)."""
    budget = budget or ign_budget(split, config)
    gen = _gen(config)
    x, y, xt = _xy(split, config)
    if task is None:
        task = "regression" if split.task == "regression" else "one_vs_all"
    if task == "one_vs_all" and split.num_classes == 2:
        task = "binary"
    kwargs = {} if task == "regression" else {"num_classes": int(split.num_classes)}
    model = InducingGPNetwork(
        make_embedding(split), num_inducing=budget["num_inducing"], task=task, **kwargs
    ).to(device=x.device, dtype=x.dtype)
    model.fit(
        x, y, epochs=budget["epochs"], batch_size=budget["batch_size"], lr=budget["lr"],
        gp_lr=budget["gp_lr"], lr_schedule=budget["lr_schedule"], generator=gen,
        show_progress=config.show_progress,
    )  # fmt: skip
    if task == "regression":
        mean, var = model.predict(xt)
        return Prediction(mean=mean.cpu(), variance=var.cpu(), info=dict(budget))
    return Prediction(probs=model.predict_proba(xt, generator=gen).cpu(), info=dict(budget))


class DeepKernelSVGP(gpytorch.models.ApproximateGP):
    """SVGP on the features of a network: inducing points learned in the feature space.

    Args:
        embedding: Feature network ``g``.
        inducing_points: Initial inducing points in feature space, ``(m, d)``.
        num_latents: Independent latent GPs (one per class for softmax classification).
    """

    def __init__(self, embedding: nn.Module, inducing_points: torch.Tensor, num_latents: int = 1):
        batch = torch.Size([num_latents]) if num_latents > 1 else torch.Size([])
        z = inducing_points.expand(*batch, *inducing_points.shape).clone()
        dist = gpytorch.variational.CholeskyVariationalDistribution(z.shape[-2], batch_shape=batch)
        strategy = gpytorch.variational.VariationalStrategy(
            self, z, dist, learn_inducing_locations=True
        )
        if num_latents > 1:
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                strategy, num_tasks=num_latents
            )
        super().__init__(strategy)
        d = z.shape[-1]
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch), batch_shape=batch
        )
        with torch.no_grad():  # lengthscale: median distance between the initial inducing points
            pd = torch.cdist(inducing_points, inducing_points)
            if bool((pd > 0).any()):
                self.covar_module.base_kernel.lengthscale = pd[pd > 0].median().clamp_min(1e-3)
        self.embedding = embedding

    def forward(self, feats: torch.Tensor) -> gpytorch.distributions.MultivariateNormal:
        """The GP prior on features ``(*, N, d)``."""
        return gpytorch.distributions.MultivariateNormal(
            self.mean_module(feats), self.covar_module(feats)
        )

    def __call__(self, x: torch.Tensor, **kwargs):
        """Embed ``x`` and evaluate the variational GP on the features."""
        return super().__call__(self.embedding(x), **kwargs)


def _init_inducing(embedding: nn.Module, x: torch.Tensor, m: int, gen: torch.Generator):
    with torch.no_grad():
        return embedding(select_inducing_points(x, m, gen)).detach()


def fit_predict_dkl_svgp(
    split: DatasetSplit, config: BenchConfig, *, budget: dict | None = None
) -> Prediction:
    """Deep-kernel SVGP (regression: Gaussian; classification: softmax) on the shared budget."""
    budget = budget or ign_budget(split, config)
    gen = _gen(config)
    x, y, xt = _xy(split, config)
    emb = make_embedding(split).to(x)
    c = 1 if split.task == "regression" else int(split.num_classes)
    model = DeepKernelSVGP(emb, _init_inducing(emb, x, budget["num_inducing"], gen), c).to(x)
    if c == 1:
        lik = gpytorch.likelihoods.GaussianLikelihood().to(x)
    else:
        lik = gpytorch.likelihoods.SoftmaxLikelihood(
            num_features=c, num_classes=c, mixing_weights=False
        ).to(x)
    fit_variational(
        model, lik, x, y, budget, gen, network=emb, show_progress=config.show_progress,
        desc="dkl svgp",
    )  # fmt: skip
    with torch.no_grad():
        if c == 1:
            means, variances = [], []
            for xb in xt.split(1024):
                p = lik(model(xb))
                means.append(p.mean)
                variances.append(p.variance)
            return Prediction(mean=torch.cat(means).cpu(), variance=torch.cat(variances).cpu())
        with gpytorch.settings.num_likelihood_samples(256):
            probs = [lik(model(xb)).probs.mean(0) for xb in xt.split(1024)]
    return Prediction(probs=torch.cat(probs).cpu())


def fit_predict_svgp(
    split: DatasetSplit, config: BenchConfig, *, budget: dict | None = None
) -> Prediction:
    """GPyTorch input-space SVGP regression (``SVGPModel``) on the shared budget."""
    budget = budget or ign_budget(split, config)
    gen = _gen(config)
    x, y, xt = _xy(split, config)
    model = SVGPModel(select_inducing_points(x, budget["num_inducing"], gen)).to(x)
    lik = gpytorch.likelihoods.GaussianLikelihood().to(x)
    fit_variational(model, lik, x, y, budget, gen, show_progress=config.show_progress)
    with torch.no_grad():
        preds = [lik(model(xb)) for xb in xt.split(1024)]
    return Prediction(
        mean=torch.cat([p.mean for p in preds]).cpu(),
        variance=torch.cat([p.variance for p in preds]).cpu(),
    )


def fit_predict_nn_classifier(
    split: DatasetSplit, config: BenchConfig, *, budget: dict | None = None
) -> Prediction:
    """The embedding network plus a linear softmax layer, Adam on cross-entropy."""
    budget = budget or ign_budget(split, config)
    gen = _gen(config)
    x, y, xt = _xy(split, config)
    emb = make_embedding(split)
    net = nn.Sequential(emb, nn.ReLU(), nn.Linear(emb.out_features, int(split.num_classes))).to(x)
    opt = torch.optim.Adam(net.parameters(), lr=budget["lr"])
    n, bs = x.shape[0], budget["batch_size"]
    steps = budget["epochs"] * sum(1 for s in range(0, n, bs) if n - s >= 2)
    sched = None
    if budget.get("lr_schedule", "constant") == "cosine":
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps, eta_min=0.0)
    net.train()
    for _ in progress_bar(range(budget["epochs"]), desc="nn", show=config.show_progress):
        perm = torch.randperm(n, generator=gen).to(x.device)
        for start in range(0, n, bs):
            idx = perm[start : start + bs]
            if idx.numel() < 2:
                continue
            opt.zero_grad()
            nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
            if sched is not None:
                sched.step()
    net.eval()
    with torch.no_grad():
        probs = torch.cat([torch.softmax(net(xb), -1) for xb in xt.split(1024)])
    return Prediction(probs=probs.cpu())


@register_method("ign", task="regression", description="Inducing GP network (002), MLP embedding")
def _ign_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_ign(split, config)


@register_method(
    "dkl_svgp", task="regression", description="GPyTorch deep-kernel SVGP, MLP", default=False
)
def _dkl_regression(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_dkl_svgp(split, config)


@register_method(
    "ign_ova",
    task="classification",
    description="IGN, one-vs-all probit heads, Laplace (002)",
    default=False,
)
def _ign_ova(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_ign(split, config, task="one_vs_all")


@register_method(
    "ign_dirichlet", task="classification", description="IGN with the Dirichlet transform"
)
def _ign_dirichlet(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_ign(split, config, task="dirichlet")


@register_method(
    "dkl_svgp_softmax",
    task="classification",
    description="GPyTorch deep-kernel SVGP, softmax",
    default=False,
)
def _dkl_softmax(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_dkl_svgp(split, config)


@register_method(
    "nn_classifier",
    task="classification",
    description="The embedding network + softmax layer",
    default=False,
)
def _nn_classifier(split: DatasetSplit, config: BenchConfig) -> Prediction:
    return fit_predict_nn_classifier(split, config)

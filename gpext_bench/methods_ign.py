"""Inducing GP networks (002) and the baselines they are compared with, for ``gpext bench``.

Registered methods:

* ``ign`` (regression): :class:`gpext.models.InducingGPNetwork` on an :class:`gpext.nn.MLP`,
  trained on 002 Eq. 5 with the full or the independent minibatch covariance, per data set
  (:data:`IGN_MINIBATCH_COVARIANCE`);
  fitted with the library's defaults for what follows training (its automatic hold-out with
  noise calibration and held-out checks, or below 200 rows a refit copy); the fit ends with
  the closed-form pseudo-label refit
  (:meth:`~gpext.models.InducingGPNetwork.refit_pseudo_labels`, ridge :data:`REFIT_RIDGE`).
* ``dkl_svgp`` (regression): GPyTorch deep-kernel SVGP, the same MLP, inducing points learned
  on its features, minibatch ELBO.
* ``ign_ova`` / ``ign_dirichlet`` (classification): IGN with one-vs-all probit heads
  (Laplace) / with the Dirichlet transform; ``dkl_svgp_softmax``: deep-kernel SVGP with one
  latent GP per class and a softmax likelihood; ``nn_classifier``: the plain network with a
  linear softmax head (cross-entropy).  The embedding is :class:`gpext.nn.SmallCNN` for
  28 x 28 images and an MLP otherwise.

All methods of one task share one budget (:func:`ign_budget`: inducing points, epochs,
minibatch size, learning rate, network), so that comparisons are at equal epochs and
inducing-point counts; the regression epochs per data set (:data:`REGRESSION_EPOCHS`) and
IGN's objective and refit ridge were chosen on validation parts of the training rows (see
their comments); :func:`fit_predict_svgp` is GPyTorch's input-space SVGP on that budget.
"""

from __future__ import annotations

import gpytorch
import torch
from torch import nn

from gpext.kernels import FeatureMapKernel
from gpext.models import InducingGPNetwork
from gpext.nn import MLP, SmallCNN
from gpext.utils import progress_bar
from gpext_bench.baselines import SVGPModel, fit_svgp, select_inducing_points
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "DeepKernelSVGP",
    "fit_predict_dkl_svgp",
    "fit_predict_ign",
    "fit_predict_nn_classifier",
    "fit_predict_svgp",
    "fit_variational",
    "ign_budget",
    "make_embedding",
    "IGN_MINIBATCH_COVARIANCE",
    "REFIT_RIDGE",
    "REGRESSION_EPOCHS",
]


#: Full-run epochs of the regression sets of ``benchmarks/ign.py`` (one budget per data set,
#: shared by IGN, the SVGP and the deep-kernel SVGP).  Chosen by the issue-7 validation study:
#: for each set the three methods were fitted at the session-3 budget (12 epochs, 6 for the
#: two sets with more than 20000 training rows) and at 2x and 4x (cosine schedule over the
#: whole budget), on a seeded 80/20 split of the TRAINING rows of folds 0 and 1 (no test row of
#: any fold); the number is the budget with the lowest mean validation RMSE of the deep-kernel
#: SVGP (ties to the shorter one), so the strongest baseline gets its best budget and IGN and
#: the SVGP get the same -- conservative for IGN.  Other data sets fall back to the old rule.
REGRESSION_EPOCHS: dict[str, int] = {
    "elevators": 12,
    "pol": 48,
    "keggdirected": 24,
    "protein": 24,
    "bike": 48,
}

#: IGN's training objective per regression set: ``"full"``, 002 Eq. 5 with the full minibatch
#: covariance :math:`K_{B|Z}`, or ``"independent"`` (the model's default, size-one minibatches;
#: also the fallback for other data sets).  Chosen per data set on IGN's own validation RMSE in
#: the same validation study, at the epochs of :data:`REGRESSION_EPOCHS` (mean over the two
#: validation parts, independent / full): elevators 0.08906 / 0.08823, pol 2.521 / 3.363,
#: keggdirected 0.1269 / 0.1277, protein 4.072 / 3.784, bike 0.0573 / 0.0024.  A first rule
#: (one choice for all sets, made at the session-3 budget to save time) had picked "full"
#: everywhere (lower on all 10 parts there), but at the chosen epochs the full objective drifts
#: on pol to the degenerate optimum described in :class:`~gpext.models.InducingGPNetwork`
#: (2.60 at 12 epochs, 3.36 at 48), so the choice was made per set at the epochs actually run.
IGN_MINIBATCH_COVARIANCE: dict[str, str] = {
    "elevators": "full",
    "pol": "independent",
    "keggdirected": "independent",
    "protein": "full",
    "bike": "full",
}

#: Ridge of IGN's closed-form pseudo-label refit after the last epoch
#: (:meth:`gpext.models.InducingGPNetwork.refit_pseudo_labels`; ``fit`` runs it by default only
#: for the independent objective, here it runs for both).  Chosen in the same study, after the
#: objective, from ``{1e-2, 1e-1, 1}`` and "no refit", keeping the current value (1) unless
#: another is clearly better: with the full objective, RMSE relative to ridge 1 was -2.5% /
#: -1.4% for 1e-2 / 1e-1 in the mean over the sets but lower on only 5 / 6 of 10 parts, all of
#: the gain on bike (RMSE about 0.008) and within +-0.15% on the other four sets, so 1 is
#: kept; without the refit bike's RMSE was 4 times larger.
REFIT_RIDGE: float = 1.0


def ign_budget(split: DatasetSplit, config: BenchConfig) -> dict:
    """The shared budget of one fit.

    ``num_inducing`` (at most the number of training rows), ``epochs``, ``batch_size``; Adam with learning rate ``lr`` for network
    weights and ``gp_lr`` for everything else (inducing points, kernel and likelihood
    hyperparameters, variational parameters, pseudo-label function), both annealed to zero by
    a cosine schedule over all minibatch steps (``lr_schedule``).  Regression: full-run epochs
    from :data:`REGRESSION_EPOCHS` by ``split.name`` (else 12, or 6 above 20000 training
    rows), and, used by IGN only, ``refit_ridge`` (:data:`REFIT_RIDGE`), the ridge of its
    pseudo-label refit, and ``minibatch_covariance`` (:data:`IGN_MINIBATCH_COVARIANCE` by
    ``split.name``, else ``"independent"``).
    """
    # at most one inducing point per training row (a small table has fewer rows than the
    # budget's count; InducingGPNetwork places Z at training features)
    n = split.num_train
    if split.task == "classification":
        return {
            "num_inducing": min(config.budget(32, 64), n),
            "epochs": config.budget(3, 10),
            "batch_size": 128,
            "lr": 3e-3,
            "gp_lr": 0.01,
            "lr_schedule": "cosine",
        }
    default = 6 if n > 20000 else 12
    return {
        "num_inducing": min(config.budget(64, 128), n),
        "epochs": config.budget(2 if n > 20000 else 4, REGRESSION_EPOCHS.get(split.name, default)),
        "batch_size": 256,
        "lr": 5e-3,
        "gp_lr": 0.02,
        "lr_schedule": "cosine",
        "refit_ridge": REFIT_RIDGE,
        "minibatch_covariance": IGN_MINIBATCH_COVARIANCE.get(split.name, "independent"),
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
    """Fit an :class:`InducingGPNetwork` (``task``: regression / one_vs_all / dirichlet).

    For regression the model uses the budget's ``minibatch_covariance`` (default
    ``"independent"``) and its pseudo-labels are refitted in closed form after the last epoch
    with the budget's ``refit_ridge`` (:meth:`InducingGPNetwork.refit_pseudo_labels`); a budget
    without that key uses ``fit``'s default (a refit with ridge 1 for the independent
    objective only).
    """
    budget = budget or ign_budget(split, config)
    gen = _gen(config)
    x, y, xt = _xy(split, config)
    if task is None:
        task = "regression" if split.task == "regression" else "one_vs_all"
    if task == "one_vs_all" and split.num_classes == 2:
        task = "binary"
    kwargs = {} if task == "regression" else {"num_classes": int(split.num_classes)}
    if task == "regression":
        kwargs["minibatch_covariance"] = budget.get("minibatch_covariance", "independent")
    model = InducingGPNetwork(
        make_embedding(split), num_inducing=budget["num_inducing"], task=task, **kwargs
    ).to(device=x.device, dtype=x.dtype)
    # the library's own defaults for what follows training: its automatic hold-out (noise
    # calibration and the held-out checks; below 200 rows a refit copy).  Earlier the harness
    # passed validation_fraction=0, which skipped both: on a 506-row table in raw units IGN
    # then covered 0.2 of the test targets with only a ConvergenceWarning.  The fit's own
    # pseudo-label refit uses ridge 1 (REFIT_RIDGE); another ridge is applied after the fit.
    ridge = budget.get("refit_ridge") if task == "regression" else None
    custom_ridge = ridge is not None and float(ridge) != 1.0
    # ridge 1: the fit's own refit (before its calibration and checks)
    inside = None if ridge is None else not custom_ridge
    model.fit(
        x, y, epochs=budget["epochs"], batch_size=budget["batch_size"], lr=budget["lr"],
        gp_lr=budget["gp_lr"], lr_schedule=budget["lr_schedule"], generator=gen,
        show_progress=config.show_progress, refit_pseudo_labels=inside,
    )  # fmt: skip
    if custom_ridge:
        model.refit_pseudo_labels(x, y, ridge=float(ridge))
        model.eval()
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

    @property
    def kernel(self) -> FeatureMapKernel:
        """The deep kernel on inputs, ``k(g(x), g(x'))``, as a :class:`~gpext.kernels.FeatureMapKernel`
        sharing this model's parameters (the variational strategy works on features, where the
        inducing points live)."""
        return FeatureMapKernel(self.embedding, self.covar_module)


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

"""Classification methods of ``gpext bench``: robust-max SVGP and Dirichlet GPs.

* ``gpext_robust_max_svgp``: the SVGP of ``gpytorch_svgp_softmax`` (same inducing points, budget
  and optimiser) with :class:`~gpext.likelihoods.RobustMaxLikelihood` instead of the softmax;
  the ELBO uses Gauss-Hermite quadrature and the predictions are quadrature probabilities.
* ``gpext_dirichlet_gp``: :class:`~gpext.models.DirichletGPClassifier`, exact when
  ``N <= 2000`` (hyperparameters fitted on a seeded subset of ``exact_hyper_subset`` points,
  posterior on all points), sparse otherwise (collapsed bound, learned inducing points,
  hyperparameters on a seeded subset, final posterior with more inducing points).
* ``gpytorch_dirichlet_exact``: GPyTorch's documented recipe: ``ExactGP`` with a batch of ``C``
  outputs, ``DirichletClassificationLikelihood(targets, learn_additional_noise=True)``, Adam with
  learning rate 0.1 for 50 steps; probabilities by Monte Carlo (256 draws, as GPyTorch has no
  class-probability method).  Refuses ``N > 3000`` training points.
"""

from __future__ import annotations

import gpytorch
import torch

from gpext.errors import InputDataError, expected_got
from gpext.likelihoods import RobustMaxLikelihood
from gpext.models.dirichlet_gp_classifier import DirichletGPClassifier
from gpext.utils import progress_bar
from gpext_bench.baselines import fit_multilatent_svgp_classifier
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "DIRICHLET_SETTINGS",
    "fit_dirichlet_gp",
    "fit_gpytorch_dirichlet",
    "fit_robust_max_svgp",
]

#: Budgets of ``gpext_dirichlet_gp``: (quick, full) values.
DIRICHLET_SETTINGS = {
    "exact_max_n": 2000,
    "exact_hyper_subset": (400, 600),
    "exact_max_iter": (15, 30),
    "sparse_num_inducing": (150, 300),
    "sparse_num_inducing_final": (400, 1000),
    "sparse_hyper_subset": (1500, 3000),
    "sparse_max_iter": (15, 30),
}


def _generator(config: BenchConfig) -> torch.Generator:
    return torch.Generator().manual_seed(config.seed)


@register_method(
    "gpext_robust_max_svgp",
    task="classification",
    description="SVGP, one latent GP per class, gpext RobustMaxLikelihood (quadrature)",
)
def fit_robust_max_svgp(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """The softmax SVGP baseline with the robust-max likelihood (same model and budget)."""
    likelihood = RobustMaxLikelihood(num_classes=int(split.num_classes))
    return fit_multilatent_svgp_classifier(split, config, likelihood, desc="svgp robust max")


@register_method(
    "gpext_dirichlet_gp",
    task="classification",
    description="gpext Dirichlet GP classifier: exact (N<=2000) or sparse collapsed bound",
)
def fit_dirichlet_gp(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Fit :class:`DirichletGPClassifier` with the budgets of :data:`DIRICHLET_SETTINGS`."""
    s = DIRICHLET_SETTINGS
    gen = _generator(config)
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    c = int(split.num_classes)
    n = x.shape[0]
    info: dict = {}
    if n <= s["exact_max_n"]:
        clf = DirichletGPClassifier(c, max_exact=s["exact_max_n"])
        clf.fit(
            x, y, max_iter=config.budget(*s["exact_max_iter"]),
            hyper_subset=config.budget(*s["exact_hyper_subset"]), generator=gen,
            show_progress=config.show_progress,
        )  # fmt: skip
        info["variant"] = "exact"
    else:
        clf = DirichletGPClassifier(
            c,
            num_inducing=config.budget(*s["sparse_num_inducing"]),
            num_inducing_final=config.budget(*s["sparse_num_inducing_final"]),
        )
        clf.fit(
            x, y, max_iter=config.budget(*s["sparse_max_iter"]),
            hyper_subset=config.budget(*s["sparse_hyper_subset"]), generator=gen,
            show_progress=config.show_progress,
        )  # fmt: skip
        info["variant"] = "sparse"
    probs = clf.predict_proba(
        split.test_x.to(config.device), method="mc", num_samples=1000, generator=gen
    )
    return Prediction(probs=probs.cpu(), info=info)


class _GPyTorchDirichletModel(gpytorch.models.ExactGP):
    """GPyTorch's documented Dirichlet classification model (batch of C outputs)."""

    def __init__(self, x, targets, likelihood, num_classes):
        super().__init__(x, targets, likelihood)
        batch = torch.Size((num_classes,))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = gpytorch.kernels.ScaleKernel(
            gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch
        )

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


@register_method(
    "gpytorch_dirichlet_exact",
    task="classification",
    description="GPyTorch DirichletClassificationLikelihood exact GP recipe (Adam 0.1, 50 steps)",
    default=False,
)
def fit_gpytorch_dirichlet(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """GPyTorch's exact Dirichlet recipe; at most 3000 training points."""
    x, y = split.train_x.to(config.device), split.train_y.to(config.device)
    if x.shape[0] > 3000:
        raise InputDataError(
            expected_got("gpytorch_dirichlet_exact", "at most 3000 training points", x.shape[0])
        )
    likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(
        y, learn_additional_noise=True, dtype=x.dtype
    ).to(x.device)
    model = _GPyTorchDirichletModel(
        x, likelihood.transformed_targets, likelihood, likelihood.num_classes
    )
    model = model.to(x)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model.train()
    likelihood.train()
    for _ in progress_bar(range(50), desc="gpytorch dirichlet", show=config.show_progress):
        opt.zero_grad()
        loss = -mll(model(x), likelihood.transformed_targets).sum()
        loss.backward()
        opt.step()
    model.eval()
    gen = _generator(config)
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        dist = model(split.test_x.to(config.device))
        mean, var = dist.mean, dist.variance  # shape: (C, M)
        z = torch.randn((256, *mean.shape), generator=gen, dtype=mean.dtype).to(mean.device)
        probs = torch.softmax(mean + var.sqrt() * z, dim=-2).mean(0).transpose(0, 1)
    return Prediction(probs=probs.cpu())

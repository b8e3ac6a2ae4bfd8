"""Tiny fitted gpext models and their BoTorch adapters, cached per dtype for the integration tests."""

from __future__ import annotations

import functools

import torch

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.integrations.botorch import (
    DirichletClassifierSurrogate,
    GWISurrogate,
    IGNSurrogate,
    VBootSurrogate,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.models import (
    DirichletGPClassifier,
    GWIClassificationModel,
    GWIRegressionModel,
    InducingGPNetwork,
)
from gpext.nn import MLP

D = 2
N = 24


def objective(x: torch.Tensor) -> torch.Tensor:
    """A smooth test function on [0, 1]^2. # shape: (..., 2) -> (..., 1)"""
    return (torch.sin(6.0 * x[..., :1]) + torch.cos(4.0 * x[..., 1:]) - x[..., :1]).to(x)


def feasible(x: torch.Tensor) -> torch.Tensor:
    """Feasible when ``x_0 + x_1 < 1``: labels ``(..., 1)`` (1 = feasible)."""
    return (x.sum(-1, keepdim=True) < 1.0).to(x)


@functools.cache
def data(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, D, generator=g, dtype=torch.float64).to(dtype)
    return x, objective(x), feasible(x)


@functools.cache
def ign(dtype: torch.dtype, task: str = "regression") -> IGNSurrogate:
    x, y, c = data(dtype)
    torch.manual_seed(1)
    kw = {"task": task}
    if task == "dirichlet":
        kw["num_classes"] = 2
    net = InducingGPNetwork(MLP(D, [8], 3), num_inducing=6, **kw).to(dtype)
    model = IGNSurrogate(net, train_X=x, train_Y=y if task == "regression" else c)
    return fit_gpext_surrogate(
        model, epochs=5, batch_size=12, generator=torch.Generator().manual_seed(0)
    )


@functools.cache
def dirichlet(dtype: torch.dtype, sparse: bool = False) -> DirichletClassifierSurrogate:
    x, _, c = data(dtype)
    clf = DirichletGPClassifier(2, num_inducing=8 if sparse else None)
    model = DirichletClassifierSurrogate(clf, train_X=x, train_Y=c)
    return fit_gpext_surrogate(model, max_iter=10, generator=torch.Generator().manual_seed(0))


@functools.cache
def gwi(dtype: torch.dtype, classification: bool = False) -> GWISurrogate:
    x, y, c = data(dtype)
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(2)
    if classification:
        m, lik = GWIClassificationModel.from_data(
            x, c.squeeze(-1).long(), 2, prior_steps=5, generator=g
        )
        model = GWISurrogate(m, lik, train_X=x, train_Y=c)
    else:
        m, lik = GWIRegressionModel.from_data(x, y.squeeze(-1), prior_steps=5, generator=g)
        model = GWISurrogate(m, lik, train_X=x, train_Y=y)
    return fit_gpext_surrogate(
        model, epochs=20 if classification else 3, batch_size=12, generator=g
    )


@functools.cache
def vboot_rff(dtype: torch.dtype, classification: bool = False) -> VBootSurrogate:
    x, y, c = data(dtype)
    if classification:
        vb = VBootRFF(
            num_features=40,
            num_particles=8,
            task="classification",
            num_classes=2,
            lengthscale=0.3,
            outputscale=1.0,
        )
        model = VBootSurrogate(vb, train_X=x, train_Y=c)
    else:
        vb = VBootRFF(
            num_features=40, num_particles=8, lengthscale=0.3, outputscale=1.0, noise=1e-2
        )
        model = VBootSurrogate(vb, train_X=x, train_Y=y)
    return fit_gpext_surrogate(model, generator=torch.Generator().manual_seed(0))


@functools.cache
def vboot_mlp(dtype: torch.dtype) -> VBootSurrogate:
    x, y, _ = data(dtype)
    vb = VBootMLP(4, hidden_sizes=(8,), noise=1e-2, dtype=dtype)
    model = VBootSurrogate(vb, train_X=x, train_Y=y)
    return fit_gpext_surrogate(model, num_epochs=3, batch_size=12)


@functools.cache
def weight_ensemble(dtype: torch.dtype, method: str = "swag", likelihood: str = "auto"):
    x, y, _ = data(dtype)
    return fit_weight_ensemble(
        x, y, method=method, likelihood=likelihood, num_samples=4, hidden_features=(8,), epochs=8, swa_epochs=4,
        rank=2, num_components=2, generator=torch.Generator().manual_seed(0),
        calibrate=False,  # the tests compare with the members; calibration: own tests
    )  # fmt: skip


def all_regression(dtype: torch.dtype) -> dict:
    """Every regression adapter, keyed by name."""
    return {
        "ign": ign(dtype),
        "gwi": gwi(dtype),
        "vboot_rff": vboot_rff(dtype),
        "vboot_mlp": vboot_mlp(dtype),
        "swag": weight_ensemble(dtype, "swag"),
        "multiswag": weight_ensemble(dtype, "multiswag"),
        "pca_ess": weight_ensemble(dtype, "pca_ess"),
        "pca_vi": weight_ensemble(dtype, "pca_vi"),
        "last_layer": weight_ensemble(dtype, "last_layer"),
    }


def all_classifiers(dtype: torch.dtype) -> dict:
    """Every classifier adapter, keyed by name."""
    return {
        "dirichlet": dirichlet(dtype),
        "dirichlet_sparse": dirichlet(dtype, sparse=True),
        "gwi_robust_max": gwi(dtype, classification=True),
        "ign_dirichlet": ign(dtype, "dirichlet"),
        "vboot_rff_clf": vboot_rff(dtype, classification=True),
    }

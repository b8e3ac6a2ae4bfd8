"""Ensembles of subspace posteriors over independent SGD runs, for ``gpext bench`` (issue 22).

Registered regression methods (not run by default; ``benchmarks/subspace_uci.py`` runs them):
``multi_pca_ess``, ``multi_pca_vi``, ``multi_inkpca_ess`` and ``multi_inkpca_vi``.

Each is the equal-weight mixture of the subspace posteriors of the
:data:`~gpext_bench.methods_peers.MULTISWAG_COMPONENTS` independent SGD runs that MultiSWAG
uses (:func:`gpext_bench.methods_peers.component_runs`: the run the subspace methods share and
the same network and recipe from other seeds), so the two differ only in the posterior of each
run: SWAG's Gaussian at scale 0.5 there, a PCA or InKPCA subspace with ESS or VI here. This is
Bayesian model averaging over the modes of independent runs (000 Sec. III-D's model averaging;
Wilson and Izmailov 2020 for MultiSWAG):

.. math::

    p(y \\mid x, \\mathcal{D}) \\approx \\frac{1}{K} \\sum_{k=1}^{K} \\frac{1}{S}
    \\sum_{s=1}^{S} p(y \\mid x, \\bar w_k + P_k \\theta_{ks}),
    \\qquad \\theta_{ks} \\sim q_k(\\theta),

with each run's :math:`S = 30` draws. Every run uses the temperature exponent its subspace
chose on the shared run's validation search (the component runs train on all rows and have no
validation rows of their own), so nothing is chosen on the test rows. The seconds include all
component runs, the validation search and each run's sampling.
"""

from __future__ import annotations

import time

import torch

from gpext_bench import methods_peers as peers
from gpext_bench import methods_subspace as ms
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "MULTI_METHODS",
    "fit_predict_multi_inkpca_ess",
    "fit_predict_multi_inkpca_vi",
    "fit_predict_multi_pca_ess",
    "fit_predict_multi_pca_vi",
    "multi_subspace_prediction",
]

MULTI_METHODS = ("multi_pca_ess", "multi_pca_vi", "multi_inkpca_ess", "multi_inkpca_vi")


def multi_subspace_prediction(
    split: DatasetSplit, config: BenchConfig, subspace: str, inference: str
) -> Prediction:
    """The mixture of one subspace posterior per component run (the module docstring).

    Args:
        split: The data split.
        config: Benchmark settings.
        subspace: ``"pca"`` or ``"inkpca"``.
        inference: ``"ess"`` or ``"vi"``.

    Returns:
        A mixture :class:`~gpext_bench.registry.Prediction` of ``30 K`` components, with the
        seconds, the temperature and its exponent in ``info``.
    """
    runs = peers.component_runs(split, config)
    t0 = time.perf_counter()
    exponent = runs[0].temperature_exponent(subspace, config)
    test_x = split.test_x.to(config.device, config.dtype)
    means, variances, temperature = [], [], None
    for k, run in enumerate(runs):
        gen = torch.Generator().manual_seed(config.seed + 7919 * k)
        pred, temperature, _ = ms.subspace_posterior_predict(
            run, subspace, inference, exponent, test_x, config, gen
        )
        means.append(pred["means"].detach())
        variances.append(pred["variances"].detach())
    seconds = (
        sum(r.train_seconds for r in runs)
        + runs[0].selection_seconds(subspace)
        + time.perf_counter()
        - t0
    )
    return Prediction(
        mixture_means=torch.cat(means).double().cpu(),
        mixture_variances=torch.cat(variances).double().cpu(),
        info={
            "seconds": seconds,
            "temperature": temperature,
            "temperature_exponent": exponent,
            "drbayes_recipe": float(runs[0].recipe_name == "drbayes"),
        },
    )


def _description(label: str) -> str:
    return f"{label} on each of {peers.MULTISWAG_COMPONENTS} SGD runs of gpext's recipe, mixture"


@register_method("multi_pca_ess", task="regression", description=_description("PCA + ESS"),
                 default=False)  # fmt: skip
def fit_predict_multi_pca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' PCA + ESS posteriors."""
    return multi_subspace_prediction(split, config, "pca", "ess")


@register_method("multi_pca_vi", task="regression", description=_description("PCA + VI"),
                 default=False)  # fmt: skip
def fit_predict_multi_pca_vi(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' PCA + VI posteriors."""
    return multi_subspace_prediction(split, config, "pca", "vi")


@register_method("multi_inkpca_ess", task="regression", description=_description("InKPCA + ESS"),
                 default=False)  # fmt: skip
def fit_predict_multi_inkpca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' InKPCA + ESS posteriors."""
    return multi_subspace_prediction(split, config, "inkpca", "ess")


@register_method("multi_inkpca_vi", task="regression", description=_description("InKPCA + VI"),
                 default=False)  # fmt: skip
def fit_predict_multi_inkpca_vi(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' InKPCA + VI posteriors."""
    return multi_subspace_prediction(split, config, "inkpca", "vi")

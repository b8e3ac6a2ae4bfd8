"""Likelihood chosen on validation rows, for ``gpext bench`` (issue 22, Build item 1).

Registered regression methods (not run by default; ``benchmarks/subspace_uci.py`` runs them):
``pca_ess_auto`` and ``swag_tuned_auto``. Per split both shared runs of
``gpext_bench/methods_subspace.py`` are trained, the heteroscedastic network and the network
with learned homoscedastic noise, each with its own recipe search on the same validation rows
(10% of the training rows, seeded by the split); the likelihood whose recipe search reached the
higher validation log-likelihood (the best 30-sample ESS model average over both subspaces and
the temperature grid) is used, and the method is then exactly ``pca_ess`` / ``swag_tuned`` or
``pca_ess_homo`` / ``swag_tuned_homo`` on it. Nothing is chosen on the test rows. The seconds
include both runs and both searches.
"""

from __future__ import annotations

import math

from gpext_bench import methods_subspace as ms
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = ["choose_likelihood", "fit_predict_pca_ess_auto", "fit_predict_swag_tuned_auto"]


def _score(run) -> float:
    if run.recipe_search is None:
        return -math.inf
    finite = [v for v in run.recipe_search.scores.values() if math.isfinite(v)]
    return max(finite, default=-math.inf)


def choose_likelihood(split: DatasetSplit, config: BenchConfig) -> tuple[str, float, dict]:
    """The likelihood with the better validation score of its recipe search.

    Returns:
        ``(likelihood, seconds of the other run and its search, {likelihood: score})``; the
        heteroscedastic network on ties or without a search.
    """
    runs = {
        lik: ms.fit_subspace_run(split, config, likelihood=lik)
        for lik in (ms.HETEROSCEDASTIC, ms.HOMOSCEDASTIC)
    }
    scores = {lik: _score(run) for lik, run in runs.items()}
    chosen = (
        ms.HOMOSCEDASTIC
        if scores[ms.HOMOSCEDASTIC] > scores[ms.HETEROSCEDASTIC]
        else (ms.HETEROSCEDASTIC)
    )
    other = runs[ms.HETEROSCEDASTIC if chosen == ms.HOMOSCEDASTIC else ms.HOMOSCEDASTIC]
    return chosen, other.train_seconds + other.selection_seconds(None), scores


def _auto(split, config, method) -> Prediction:
    chosen, extra_seconds, scores = choose_likelihood(split, config)
    pred = method(chosen)
    pred.info["seconds"] = pred.info.get("seconds", 0.0) + extra_seconds
    pred.info["homoscedastic"] = float(chosen == ms.HOMOSCEDASTIC)
    return pred


@register_method(
    "pca_ess_auto",
    task="regression",
    description="PCA + ESS on the likelihood (homo- or heteroscedastic) chosen on validation rows",
    default=False,
)
def fit_predict_pca_ess_auto(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """``pca_ess`` or ``pca_ess_homo``, whichever likelihood validated better."""
    return _auto(split, config, lambda lik: ms._subspace_method(split, config, "pca", "ess", lik))


@register_method(
    "swag_tuned_auto",
    task="regression",
    description="Tuned-scale SWAG on the likelihood chosen on validation rows",
    default=False,
)
def fit_predict_swag_tuned_auto(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """``swag_tuned`` or ``swag_tuned_homo``, whichever likelihood validated better."""
    return _auto(split, config, lambda lik: ms.fit_predict_swag_tuned(split, config, lik))

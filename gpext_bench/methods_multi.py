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

The ``*_mix_t`` arms (``multi_pca_ess_mix_t``, ...) choose the exponent for the mixture
instead, with :func:`gpext.subspace.select_mixture_temperature`: the component runs are
repeated on the fit rows of the shared run's validation search (the chosen recipe, the same
seeds; the first is that search's own run, :func:`selection_component_runs`), ESS draws 30
samples per run at every exponent of the grid, each candidate is scored at its own variance
scale (the factor on the pooled draws' predicted variances that maximises the validation
log-likelihood, the library's default for regression), and the exponent with the best score
is used by all the full-data runs, with that factor on their predicted variances. A
temperature chosen for one run ignores the spread between the runs' modes, which the mixture
adds (yacht: 95% coverage 0.995-0.997 for three of the four ``multi_*`` arms). Their seconds
add the two extra fit-rows runs and the mixture's ESS grid.
"""

from __future__ import annotations

import time

import torch

from gpext.subspace import select_mixture_temperature
from gpext.subspace.tuning import TEMPERATURE_EXPONENTS
from gpext_bench import methods_peers as peers
from gpext_bench import methods_subspace as ms
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = [
    "MIXTURE_T_METHODS",
    "MULTI_METHODS",
    "fit_predict_multi_inkpca_ess",
    "fit_predict_multi_inkpca_ess_mix_t",
    "fit_predict_multi_inkpca_vi",
    "fit_predict_multi_inkpca_vi_mix_t",
    "fit_predict_multi_pca_ess",
    "fit_predict_multi_pca_ess_mix_t",
    "fit_predict_multi_pca_vi",
    "fit_predict_multi_pca_vi_mix_t",
    "mixture_temperature_exponent",
    "multi_subspace_prediction",
    "selection_component_runs",
]

MULTI_METHODS = ("multi_pca_ess", "multi_pca_vi", "multi_inkpca_ess", "multi_inkpca_vi")
MIXTURE_T_METHODS = tuple(f"{name}_mix_t" for name in MULTI_METHODS)
_FIT_RUNS: dict = {}


def selection_component_runs(split: DatasetSplit, config: BenchConfig) -> list:
    """The component runs repeated on the fit rows of the shared run's validation search.

    The first is the search's own run of the chosen recipe (``run.selection_run``); the others
    train the same network and recipe on the same fit rows from the seeds of the full-data
    component runs (:func:`~gpext_bench.methods_peers.component_runs`), so each full-data run
    has a fit-rows counterpart, as the shared run has. Cached per split.

    Returns:
        :data:`~gpext_bench.methods_peers.MULTISWAG_COMPONENTS` runs with validation rows.
    """
    run = ms.fit_subspace_run(split, config)
    first = run.selection_run
    key = (split.name, split.split_index, split.num_train, config.seed, config.quick, config.dtype)
    if _FIT_RUNS.get("key") != key:
        _FIT_RUNS.clear()
        _FIT_RUNS.update(key=key, runs=[], exponents={})
    extras = _FIT_RUNS["runs"]
    data = (first.x, first.y, first.val_x, first.val_y)
    for k in range(len(extras) + 1, peers.MULTISWAG_COMPONENTS):
        seed = peers.member_seed(config, split, 1000 + k)
        extras.append(ms._train_run(data, run.recipe, run.rank, seed, config))
    return [first, *extras]


def mixture_temperature_exponent(
    split: DatasetSplit, config: BenchConfig, subspace: str
) -> tuple[float, float, float]:
    """The exponent and variance scale chosen for the mixture of ``subspace`` posteriors, and
    the seconds it took.

    :func:`gpext.subspace.select_mixture_temperature` on the runs of
    :func:`selection_component_runs` (ESS, 30 samples per run, burn-in and thinning as the
    single-run search, the exponents :data:`~gpext.subspace.tuning.TEMPERATURE_EXPONENTS`,
    variance calibration on). The seconds count the extra fit-rows runs and the grid (the
    search's own run is counted by ``selection_seconds``). Cached per split and subspace.
    """
    runs = selection_component_runs(split, config)
    cache = _FIT_RUNS["exponents"]
    if subspace not in cache:
        t0 = time.perf_counter()
        models = [ms._tempered_model(r, ms._projection(r, subspace, config), 1.0)[1] for r in runs]
        first = runs[0]
        sel = select_mixture_temperature(
            models,
            first.x,
            first.y,
            first.val_x,
            first.val_y,
            TEMPERATURE_EXPONENTS,
            num_samples=30,
            burn_in=config.budget(20, 50),
            thin=2,
            generator=torch.Generator().manual_seed(config.seed),
        )
        extra = sum(r.train_seconds for r in runs[1:])
        kappa = float(sel.details["variance_scale"])
        cache[subspace] = (float(sel.value), kappa, extra + time.perf_counter() - t0)
    return cache[subspace]


def multi_subspace_prediction(
    split: DatasetSplit,
    config: BenchConfig,
    subspace: str,
    inference: str,
    mixture_temperature: bool = False,
) -> Prediction:
    """The mixture of one subspace posterior per component run (the module docstring).

    Args:
        split: The data split.
        config: Benchmark settings.
        subspace: ``"pca"`` or ``"inkpca"``.
        inference: ``"ess"`` or ``"vi"``.
        mixture_temperature: Use the exponent and variance scale chosen for the mixture
            (:func:`mixture_temperature_exponent`) instead of the shared run's exponent.

    Returns:
        A mixture :class:`~gpext_bench.registry.Prediction` of ``30 K`` components, with the
        seconds, the temperature and its exponent in ``info``.
    """
    runs = peers.component_runs(split, config)
    t0 = time.perf_counter()
    exponent = runs[0].temperature_exponent(subspace, config)
    mixture_seconds, kappa = 0.0, 1.0
    if mixture_temperature:
        exponent, kappa, mixture_seconds = mixture_temperature_exponent(split, config, subspace)
    test_x = split.test_x.to(config.device, config.dtype)
    means, variances, temperature = [], [], None
    for k, run in enumerate(runs):
        gen = torch.Generator().manual_seed(config.seed + 7919 * k)
        pred, temperature, _ = ms.subspace_posterior_predict(
            run, subspace, inference, exponent, test_x, config, gen
        )
        means.append(pred["means"].detach())
        variances.append(pred["variances"].detach() * kappa)
    seconds = (
        sum(r.train_seconds for r in runs)
        + runs[0].selection_seconds(subspace)
        + mixture_seconds
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
            "variance_scale": kappa,
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


def _mix_t_description(label: str) -> str:
    return f"{_description(label)}, temperature chosen for the mixture"


@register_method("multi_pca_ess_mix_t", task="regression",
                 description=_mix_t_description("PCA + ESS"), default=False)  # fmt: skip
def fit_predict_multi_pca_ess_mix_t(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' PCA + ESS posteriors, temperature chosen for it."""
    return multi_subspace_prediction(split, config, "pca", "ess", mixture_temperature=True)


@register_method("multi_pca_vi_mix_t", task="regression",
                 description=_mix_t_description("PCA + VI"), default=False)  # fmt: skip
def fit_predict_multi_pca_vi_mix_t(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' PCA + VI posteriors, temperature chosen for it."""
    return multi_subspace_prediction(split, config, "pca", "vi", mixture_temperature=True)


@register_method("multi_inkpca_ess_mix_t", task="regression",
                 description=_mix_t_description("InKPCA + ESS"), default=False)  # fmt: skip
def fit_predict_multi_inkpca_ess_mix_t(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' InKPCA + ESS posteriors, temperature chosen for it."""
    return multi_subspace_prediction(split, config, "inkpca", "ess", mixture_temperature=True)


@register_method("multi_inkpca_vi_mix_t", task="regression",
                 description=_mix_t_description("InKPCA + VI"), default=False)  # fmt: skip
def fit_predict_multi_inkpca_vi_mix_t(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Mixture of the component runs' InKPCA + VI posteriors, temperature chosen for it."""
    return multi_subspace_prediction(split, config, "inkpca", "vi", mixture_temperature=True)

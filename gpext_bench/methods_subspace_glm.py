"""The linearised (GLM) predictive of the subspace posteriors, for ``gpext bench`` (issue 22).

Registered regression methods (not run by default; ``benchmarks/subspace_uci.py`` runs them
beside the Monte Carlo ones): ``pca_vi_glm``, ``inkpca_vi_glm``, ``pca_ess_glm`` and
``inkpca_ess_glm``. Each builds exactly the posterior of the method without ``_glm`` (the same
shared run, subspace, temperature, seeds and VI / ESS settings of
``gpext_bench/methods_subspace.py``) and predicts with
:func:`gpext.subspace.linearized_predictive` instead of the 30-sample mixture: the VI posterior
:math:`\\mathcal N(m, \\operatorname{diag}(s^2))` as it is, the ESS draws through their sample
mean and covariance (:func:`gpext.subspace.gaussian_from_samples`).
"""

from __future__ import annotations

import time

import torch

from gpext.subspace import gaussian_from_samples, linearized_predictive
from gpext_bench import methods_subspace as ms
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__: list[str] = []


def _glm_method(split: DatasetSplit, config: BenchConfig, subspace: str, inference: str):
    run = ms.fit_subspace_run(split, config)
    t0 = time.perf_counter()
    proj = ms._projection(run, subspace, config)
    exponent = run.temperature_exponent(subspace, config)
    temperature, model = ms._tempered_model(run, proj, exponent)
    gen = torch.Generator().manual_seed(config.seed)
    if inference == "ess":
        thetas = ms._ess_draws(model, run, config, gen)
        loc, cov = gaussian_from_samples(thetas)
    else:
        model.fit_vi(
            run.x,
            run.y,
            num_steps=config.budget(200, 400),
            lr=2e-2,
            batch_size=ms.VI_BATCH_SIZE,
            generator=gen,
            show_progress=config.show_progress,
        )
        q = model.variational
        loc, cov = q.loc.detach(), q.scale.detach() ** 2
    mean, var = linearized_predictive(model, split.test_x.to(config.device, config.dtype), loc, cov)
    info = {
        **ms._info(run, t0, subspace),
        "rank": int(proj.shape[0]),
        "temperature": temperature,
        "temperature_exponent": exponent,
    }
    return Prediction(mean=mean.double().cpu(), variance=var.double().cpu(), info=info)


def _register(subspace: str, inference: str) -> None:
    name = f"{subspace}_{inference}_glm"

    @register_method(
        name,
        task="regression",
        description=f"{subspace.upper()} subspace + {inference.upper()}, linearised predictive",
        default=False,
    )
    def fit_predict(split: DatasetSplit, config: BenchConfig) -> Prediction:
        return _glm_method(split, config, subspace, inference)

    fit_predict.__name__ = f"fit_predict_{name}"
    fit_predict.__doc__ = f"{subspace} subspace, {inference}, GLM predictive."


for _subspace in ("pca", "inkpca"):
    for _inference in ("vi", "ess"):
        _register(_subspace, _inference)

"""Post-hoc subspace inference from pretrained networks, for ``gpext bench`` (issue 22).

Registered regression methods (not run by default; ``benchmarks/subspace_uci.py`` runs them):

* ``posthoc_pca_ess``: gpext's documented post-hoc recipe applied to one pretrained network,
  the first MAP network of ``gpext_bench/methods_peers.py`` (the one laplace-torch's arms
  linearise): :func:`gpext.subspace.collect_from_pretrained` (a short constant-rate SGD phase
  from the network's weights, the rate chosen by its one-epoch rule, one collection per epoch,
  the homoscedastic noise learned), a rank-``RANK`` PCA subspace of the deviations, and a
  :class:`gpext.subspace.SubspaceModel` whose temperature is chosen on the network's own
  held-out rows by :func:`gpext.subspace.select_temperature` (ESS at each temperature of the
  grid, the predictive variance scale calibrated there); its ``NUM_SAMPLES`` draws predict.
* ``posthoc_ensemble_pca_ess``: the same for each of the ``ENSEMBLE_SIZE`` MAP networks of the
  deep-ensemble peer, and the equal-weight mixture of the members' subspace posteriors
  (Bayesian model averaging over the members, as MultiSWAG does over SWAG runs).

Every member uses only its own training rows: the SGD phase runs on the rows its MAP network
was fitted on, and the temperature is chosen on the 10% it was early-stopped on; nothing is
chosen on the test rows. The seconds include training the MAP networks (shared with the peers
in one process, but counted in full here).
"""

from __future__ import annotations

import copy
import math
import time

import torch

from gpext.subspace import (
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    collect_from_pretrained,
    select_temperature,
)
from gpext_bench import methods_peers as peers
from gpext_bench.data import DatasetSplit
from gpext_bench.registry import BenchConfig, Prediction, register_method

__all__ = ["fit_predict_posthoc_ensemble_pca_ess", "fit_predict_posthoc_pca_ess", "posthoc_member"]

RANK = 20
COLLECT_EPOCHS = 20  # one collection per epoch: RANK deviations
NUM_SAMPLES = 30


def posthoc_member(
    split: DatasetSplit, config: BenchConfig, member: int, test_x: torch.Tensor
) -> tuple[dict[str, torch.Tensor], dict]:
    """The post-hoc PCA + ESS posterior of one MAP network, and its test predictions.

    Returns:
        ``(prediction, info)``: ``predict``'s ``means`` / ``variances`` of the
        ``NUM_SAMPLES`` draws (shapes ``(S, M)``), and the chosen rate, temperature, variance
        scale and seconds (MAP training included).
    """
    net, _, _, map_seconds = peers.map_member(split, config, member)
    t0 = time.perf_counter()
    seed = peers.member_seed(config, split, member)
    x = split.train_x.to(config.device, config.dtype)
    y = split.train_y.to(config.device, config.dtype)
    fit, val = peers.map_holdout(x.shape[0], torch.Generator().manual_seed(seed))
    net = copy.deepcopy(net)  # collect_from_pretrained trains in place; the peers keep theirs
    likelihood = OutputLikelihood("homoscedastic_gaussian")
    gen = torch.Generator().manual_seed(seed)
    traj = collect_from_pretrained(
        net,
        x[fit],
        y[fit],
        likelihood,
        epochs=COLLECT_EPOCHS,  # the same in quick mode: RANK deviations are needed
        generator=gen,
        show_progress=config.show_progress,
    )
    proj = PCASubspace(RANK).fit(traj.deviations(), generator=gen).projection
    model = SubspaceModel(net, traj.swa_weights(), proj, likelihood, prior_std=1.0)
    sel = select_temperature(
        model,
        x[fit],
        y[fit],
        x[val],
        y[val],
        num_samples=NUM_SAMPLES,
        burn_in=config.budget(20, 50),
        generator=gen,
    )
    pred = model.predict(test_x, sel.samples)
    info = {
        "post_hoc_lr": traj.post_hoc_lr,
        "temperature": float(sel.value),
        # T = (N / rank)^e on select_temperature's grid
        "temperature_exponent": math.log(float(sel.value)) / math.log(fit.numel() / proj.shape[0]),
        "variance_scale": float(sel.details.get("variance_scale", 1.0)),
        "noise_variance": float(likelihood.noise_variance),
        "seconds": map_seconds + time.perf_counter() - t0,
    }
    return pred, info


def _prediction(preds: list[dict], infos: list[dict]) -> Prediction:
    means = torch.cat([p["means"].detach() for p in preds])
    variances = torch.cat([p["variances"].detach() for p in preds])
    info = {"seconds": sum(i["seconds"] for i in infos)}
    for key in ("post_hoc_lr", "temperature", "temperature_exponent", "variance_scale",
                "noise_variance"):  # fmt: skip
        info[key] = sum(i[key] for i in infos) / len(infos)  # mean over the members
    return Prediction(
        mixture_means=means.double().cpu(), mixture_variances=variances.double().cpu(), info=info
    )


@register_method(
    "posthoc_pca_ess",
    task="regression",
    description="gpext post-hoc recipe on one MAP network: SWA phase, PCA, ESS, T on hold-out",
    default=False,
)
def fit_predict_posthoc_pca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Post-hoc PCA + ESS around the first MAP network (the one the Laplace peers use)."""
    test_x = split.test_x.to(config.device, config.dtype)
    pred, info = posthoc_member(split, config, 0, test_x)
    return _prediction([pred], [info])


@register_method(
    "posthoc_ensemble_pca_ess",
    task="regression",
    description=f"gpext post-hoc PCA + ESS on each of the {peers.ENSEMBLE_SIZE} deep-ensemble "
    "networks, mixture",
    default=False,
)
def fit_predict_posthoc_ensemble_pca_ess(split: DatasetSplit, config: BenchConfig) -> Prediction:
    """Equal-weight mixture of the post-hoc subspace posteriors of the deep ensemble's networks."""
    test_x = split.test_x.to(config.device, config.dtype)
    preds, infos = [], []
    for member in range(peers.ENSEMBLE_SIZE):
        pred, info = posthoc_member(split, config, member, test_x)
        preds.append(pred)
        infos.append(info)
    return _prediction(preds, infos)

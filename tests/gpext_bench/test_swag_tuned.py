"""The benchmark's swag_tuned method: SWAG at the scale chosen on the validation rows."""

import math

import torch

import gpext_bench.methods_subspace as ms
from gpext.subspace import SWAG, select_swag_scale
from gpext_bench import BenchConfig, evaluate_prediction, get_method
from gpext_bench.data import load_dataset


def test_swag_tuned_uses_the_validation_scale():
    split = load_dataset("diabetes", 1)
    config = BenchConfig(quick=True, seed=3)
    run = ms.fit_subspace_run(split, config, epochs=24, rank=3)
    pred = get_method("swag_tuned").fit_predict(split, config)
    sel_run = run.selection_run
    scale = pred.info["swag_scale"]
    assert scale == sel_run.swag_selection.value == ms.swag_scale(run, config)  # cached
    ref = select_swag_scale(
        sel_run.net, SWAG.from_trajectory(sel_run.trajectory), sel_run.val_x, sel_run.val_y,
        ms._LIKELIHOOD, num_samples=30, generator=torch.Generator().manual_seed(config.seed),
    )  # fmt: skip
    assert math.isclose(ref.value, scale)
    assert pred.mixture_means.shape == (30, split.num_test)
    assert all(math.isfinite(v) for v in evaluate_prediction(split, pred).values())
    assert pred.info["seconds"] >= run.train_seconds + sel_run.train_seconds
    # without validation rows the customary 0.5
    ms._CACHE.clear()
    run0 = ms.fit_subspace_run(split, config, epochs=24, rank=3, validation_fraction=0.0)
    assert ms.swag_scale(run0, config) == 0.5
    ms._CACHE.clear()

"""The benchmark's swag_tuned method: SWAG at the scale chosen on the validation rows."""

import math

import pytest
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
        sel_run.likelihood, num_samples=30, generator=torch.Generator().manual_seed(config.seed),
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


def test_homoscedastic_runs_and_methods():
    from gpext.errors import InputDataError
    from gpext.nn import MLP

    split = load_dataset("diabetes", 2)
    config = BenchConfig(quick=True, seed=5)
    ms._CACHE.clear()
    het = ms.fit_subspace_run(split, config, epochs=24, rank=3)
    homo = ms.fit_subspace_run(split, config, epochs=24, rank=3, likelihood=ms.HOMOSCEDASTIC)
    assert het.likelihood.kind == "heteroscedastic_gaussian"
    assert homo.likelihood.kind == "homoscedastic_gaussian" and isinstance(homo.net, MLP)
    assert homo.selection_run.likelihood is not homo.likelihood  # one learned noise per run
    # the learned noise: the maximum-likelihood value at the SWA mean of the run (in the
    # targets' units: target_noise_variance; noise_variance is in standardised units)
    with torch.no_grad():
        out = homo.trajectory.flat.functional_call(homo.trajectory.swa_weights(), homo.x)
        mean = homo.likelihood.mean_variance(out)[0]
    assert math.isclose(homo.likelihood.target_noise_variance,
                        float(((homo.y - mean) ** 2).mean()), rel_tol=1e-5)  # fmt: skip
    # both runs of the split stay cached; the registered methods find them
    assert ms.fit_subspace_run(split, config) is het
    assert ms.fit_subspace_run(split, config, likelihood=ms.HOMOSCEDASTIC) is homo
    for name in ("subspace_swa_homo", "swag_tuned_homo", "pca_ess_homo"):
        pred = get_method(name).fit_predict(split, config)
        assert all(math.isfinite(v) for v in evaluate_prediction(split, pred).values()), name
        # a constant noise: every sample predicts the run's learned variance
        torch.testing.assert_close(
            pred.mixture_variances,
            torch.full_like(pred.mixture_variances, homo.likelihood.target_noise_variance),
        )
    with pytest.raises(InputDataError, match="likelihood"):
        ms.fit_subspace_run(split, config, likelihood="student_t")
    ms._CACHE.clear()

"""The peer arms of benchmarks/subspace_uci.py (issue 22): MAP network, Laplace, ensembles."""

import math
import sys
from pathlib import Path

import pytest
import torch

from gpext_bench.data import load_dataset
from gpext_bench.methods_peers import ENSEMBLE_SIZE, train_map_network
from gpext_bench.registry import BenchConfig, get_method


def test_map_network_noise_is_its_held_out_mse():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 2, dtype=torch.float64, generator=gen)
    y = x[:, 0].sin() + 0.3 * torch.randn(200, dtype=torch.float64, generator=gen)
    net, noise, epoch = train_map_network(x, y, seed=3, epochs=60, patience=10)
    # the same hold-out the function draws (first 10% of a seeded permutation)
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(3))
    val = perm[:20]
    with torch.no_grad():
        mse = float((net(x[val]).squeeze(-1) - y[val]).pow(2).mean())
    assert noise == pytest.approx(mse, rel=1e-12)
    assert 0 <= epoch < 60
    # it learned something: the held-out error is well below Var(y) (sin has variance ~0.4)
    assert noise < 0.5 * float(y.var())


def test_map_network_keeps_its_best_epoch_with_early_stopping():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(60, 3, dtype=torch.float64, generator=gen)
    y = torch.randn(60, dtype=torch.float64, generator=gen)  # pure noise: overfits quickly
    _, noise_short, epoch_short = train_map_network(x, y, seed=0, epochs=400, patience=5)
    assert epoch_short < 400 - 5  # stopped early
    assert math.isfinite(noise_short)


@pytest.mark.parametrize("method", ["deep_ensemble", "map_laplace_kron", "map_laplace_last_layer"])
def test_peer_arms_predict_finite_gaussians(method):
    if method.startswith("map_laplace"):
        pytest.importorskip("laplace")
    split = load_dataset("diabetes", 0)
    config = BenchConfig(quick=True, dtype=torch.float64)
    pred = get_method(method).fit_predict(split, config)
    m = split.num_test
    assert pred.mean.shape == (m,) and pred.variance.shape == (m,)
    assert torch.isfinite(pred.mean).all() and (pred.variance > 0).all()
    if method == "deep_ensemble":
        assert pred.mixture_means.shape == (ENSEMBLE_SIZE, m)
    else:
        assert pred.info["prior_precision"] > 0 and pred.info["noise_sd"] > 0
    # a sane regression fit on standardised diabetes targets (R^2 of a 1x50 net is ~0.4-0.5)
    r2 = 1 - float((pred.mean - split.test_y).pow(2).mean() / split.test_y.var())
    assert r2 > 0.2


def test_paired_differences_against_the_best_peer():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import subspace_uci as bench

    rows = []
    for s, (a, b, c) in enumerate([(-1.0, -1.2, -1.5), (-1.1, -1.0, -1.6), (-0.9, -1.3, -1.4)]):
        for method, ll in (("pca_ess", a), ("deep_ensemble", b), ("map_laplace_kron", c)):
            rows.append(
                {"dataset": "yacht", "method": method, "split": s, "test_ll": ll,
                 "rmse": 1.0, "coverage95": 0.95, "seconds": 1.0}
            )  # fmt: skip
    table, goals, _, _, paired = bench.summarise(rows, ["yacht"])
    p = paired["yacht"]
    assert (p["gpext"], p["peer"]) == ("pca_ess", "deep_ensemble")
    diffs = [0.2, -0.1, 0.4]
    assert p["mean_difference"] == pytest.approx(sum(diffs) / 3)
    sd = torch.tensor(diffs, dtype=torch.float64).std().item()
    assert p["difference_se"] == pytest.approx(sd / math.sqrt(3))
    assert p["splits_ahead"] == 2 and p["splits"] == 3
    assert goals["best_gpext_ahead_of_best_peer_on_4_of_5_and_within_1se_on_5th"] is True
    assert goals["best_gpext_beats_published_ll_on_5_of_5"] is False  # one data set only


def test_combine_accepts_parts_that_split_the_methods(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import subspace_uci as bench

    from gpext_bench import write_results

    def part(name, methods):
        rows = [
            {"dataset": "yacht", "method": m, "split": s, "test_ll": -1.0, "rmse": 1.0,
             "coverage95": 0.95, "seconds": 1.0}
            for s in range(2) for m in methods
        ]  # fmt: skip
        write_results(
            "subspace_uci", [], tmp_path / name, command=name,
            extra={"quick": False, "failures": [], "per_split_rows": rows},
        )  # fmt: skip
        return tmp_path / name

    a, b = part("a", ["pca_ess", "swag"]), part("b", ["deep_ensemble"])
    parts = bench.combine_parts([a, b])
    assert parts["splits"] == 2 and len(parts["rows"]) == 6
    with pytest.raises(bench.InputDataError, match="disjoint"):
        bench.combine_parts([a, part("c", ["swag"])])


def test_auto_likelihood_is_the_better_validated_run():
    from gpext_bench import methods_subspace as ms
    from gpext_bench.methods_subspace_auto import choose_likelihood

    split = load_dataset("diabetes", 0)
    config = BenchConfig(quick=True, dtype=torch.float64)
    chosen, extra, scores = choose_likelihood(split, config)
    assert set(scores) == {ms.HETEROSCEDASTIC, ms.HOMOSCEDASTIC}
    assert chosen == max(scores, key=scores.get) and extra > 0
    auto = get_method("pca_ess_auto").fit_predict(split, config)
    name = "pca_ess" if chosen == ms.HETEROSCEDASTIC else "pca_ess_homo"
    plain = get_method(name).fit_predict(split, config)
    torch.testing.assert_close(auto.mixture_means, plain.mixture_means)
    assert auto.info["homoscedastic"] == float(chosen == ms.HOMOSCEDASTIC)
    assert auto.info["seconds"] > plain.info["seconds"]


def test_map_holdout_is_the_networks_hold_out():
    from gpext_bench.methods_peers import map_holdout

    fit, val = map_holdout(200, torch.Generator().manual_seed(3))
    perm = torch.randperm(200, generator=torch.Generator().manual_seed(3))
    assert torch.equal(val, perm[:20]) and torch.equal(fit, perm[20:])


@pytest.mark.parametrize("method", ["posthoc_pca_ess", "posthoc_ensemble_pca_ess"])
def test_posthoc_arms_predict_mixtures_around_the_map_networks(method):
    import gpext_bench.methods_posthoc as mp
    from gpext_bench.methods_peers import map_member

    split = load_dataset("diabetes", 0)
    config = BenchConfig(quick=True, dtype=torch.float64)
    pred = get_method(method).fit_predict(split, config)
    m = split.num_test
    members = ENSEMBLE_SIZE if method == "posthoc_ensemble_pca_ess" else 1
    assert pred.mixture_means.shape == (members * mp.NUM_SAMPLES, m)
    assert torch.isfinite(pred.mixture_means).all() and (pred.mixture_variances > 0).all()
    assert pred.info["temperature"] > 0 and pred.info["noise_variance"] > 0
    # the draws stay near the pretrained network they start from (a post-hoc basin, not a
    # new fit): their mean is closer to the MAP network's predictions than to the targets
    net = map_member(split, config, 0)[0]
    with torch.no_grad():
        map_mean = net(split.test_x).squeeze(-1).double()
    first = pred.mixture_means[: mp.NUM_SAMPLES].mean(0)
    assert float((first - map_mean).pow(2).mean()) < float((map_mean - split.test_y).pow(2).mean())
    # the MAP networks are not changed by the post-hoc SGD phase (it runs on copies)
    with torch.no_grad():
        assert torch.equal(net(split.test_x).squeeze(-1).double(), map_mean)


def test_summary_skips_methods_whose_fits_failed():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import subspace_uci as bench

    rows = [
        {"dataset": "yacht", "method": "pca_ess", "split": 0, "test_ll": -1.0, "rmse": 1.0,
         "coverage95": 0.95, "seconds": 1.0},
        {"dataset": "yacht", "method": "deep_ensemble", "split": 0, "test_ll": -1.2,
         "rmse": 1.0, "coverage95": 0.95, "seconds": 1.0},
        {"dataset": "yacht", "method": "map_laplace_kron", "split": 0, "seconds": 0.1,
         "failure": "MissingExtraError: laplace-torch is not installed"},
    ]  # fmt: skip
    _, _, _, _, paired = bench.summarise(rows, ["yacht"])
    assert (paired["yacht"]["gpext"], paired["yacht"]["peer"]) == ("pca_ess", "deep_ensemble")


def test_multi_subspace_arms_mix_one_posterior_per_multiswag_run():
    import gpext_bench.methods_multi  # noqa: F401  (registers the arms)
    from gpext_bench import methods_subspace as ms
    from gpext_bench.methods_peers import MULTISWAG_COMPONENTS, component_runs

    split = load_dataset("diabetes", 0)
    config = BenchConfig(quick=True, dtype=torch.float64)
    pred = get_method("multi_inkpca_ess").fit_predict(split, config)
    runs = component_runs(split, config)
    assert len(runs) == MULTISWAG_COMPONENTS
    # trained once per split: MultiSWAG and every multi_* arm see the same run objects
    assert all(a is b for a, b in zip(runs, component_runs(split, config), strict=True))
    assert runs[0] is ms.fit_subspace_run(split, config)
    # independent runs: different seeds end at different SWA weights
    swa = [r.trajectory.swa_weights() for r in runs]
    assert not torch.allclose(swa[0], swa[1]) and not torch.allclose(swa[1], swa[2])
    m = split.num_test
    assert pred.mixture_means.shape == (30 * MULTISWAG_COMPONENTS, m)
    assert torch.isfinite(pred.mixture_means).all() and (pred.mixture_variances > 0).all()
    # each block of 30 draws is that run's own posterior at the shared run's temperature
    exponent = runs[0].temperature_exponent("inkpca", config)
    assert pred.info["temperature_exponent"] == exponent
    for k, run in enumerate(runs):
        block, _, _ = ms.subspace_posterior_predict(
            run, "inkpca", "ess", exponent, split.test_x.double(), config,
            torch.Generator().manual_seed(config.seed + 7919 * k),
        )  # fmt: skip
        torch.testing.assert_close(
            pred.mixture_means[30 * k : 30 * (k + 1)], block["means"].double()
        )
    # the seconds count every component's training
    assert pred.info["seconds"] >= sum(r.train_seconds for r in runs)


def test_mixture_temperature_arms_choose_one_exponent_for_the_mixture_on_fit_rows():
    import gpext_bench.methods_multi as mm
    from gpext_bench import methods_subspace as ms
    from gpext_bench.methods_peers import MULTISWAG_COMPONENTS, component_runs

    split = load_dataset("diabetes", 0)
    config = BenchConfig(quick=True, dtype=torch.float64)
    pred = get_method("multi_pca_ess_mix_t").fit_predict(split, config)
    shared = ms.fit_subspace_run(split, config)
    fit_runs = mm.selection_component_runs(split, config)
    assert len(fit_runs) == MULTISWAG_COMPONENTS and fit_runs[0] is shared.selection_run
    # the counterparts train on the fit rows only (never on the validation rows), same recipe
    for run in fit_runs:
        assert torch.equal(run.x, shared.selection_run.x) and run.val_x.shape[0] > 0
        assert run.recipe == shared.recipe
    full = component_runs(split, config)
    swa = [r.trajectory.swa_weights() for r in fit_runs]
    assert not torch.allclose(swa[1], swa[2]) and not torch.allclose(
        swa[1], full[1].trajectory.swa_weights()
    )
    exponent, kappa, seconds = mm.mixture_temperature_exponent(split, config, "pca")
    assert exponent in ms.TEMPERATURE_EXPONENTS and seconds >= fit_runs[1].train_seconds
    assert pred.info["temperature_exponent"] == exponent
    # each block of 30 draws is that full-data run's posterior at the mixture's exponent
    for k, run in enumerate(full):
        block, _, _ = ms.subspace_posterior_predict(
            run, "pca", "ess", exponent, split.test_x.double(), config,
            torch.Generator().manual_seed(config.seed + 7919 * k),
        )  # fmt: skip
        torch.testing.assert_close(
            pred.mixture_means[30 * k : 30 * (k + 1)], block["means"].double()
        )
        # with the mixture's variance scale on the predicted variances
        torch.testing.assert_close(
            pred.mixture_variances[30 * k : 30 * (k + 1)], block["variances"].double() * kappa
        )
    assert kappa > 0 and pred.info["variance_scale"] == kappa
    assert pred.info["seconds"] >= sum(r.train_seconds for r in full) + seconds

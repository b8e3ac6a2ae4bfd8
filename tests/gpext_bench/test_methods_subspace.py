"""The weight-space methods registered in gpext bench, on a small bundled data set."""

import math
import warnings

import pytest
import torch

import gpext_bench.methods_subspace as ms
from gpext.errors import InputDataError
from gpext.fit import validation_rows
from gpext_bench import BenchConfig, evaluate_prediction, get_method
from gpext_bench.data import load_dataset

METHODS = (
    "subspace_sgd",
    "subspace_swa",
    "swag",
    "fa_swag",
    "pca_ess",
    "pca_vi",
    "inkpca_ess",
    "inkpca_vi",
)


class TestSubspaceBenchMethods:
    def test_all_methods_predict_finite_mixtures(self):
        split = load_dataset("diabetes", 0)
        config = BenchConfig(quick=True, seed=0)
        run = ms.fit_subspace_run(split, config, epochs=24, rank=3)
        assert run.trajectory.num_collected == 12 and run.inkpca.subspace.num_points == 12
        assert run.fa.num_observations == 12 * 10
        # the shared run uses every training row; the temperature search ran on a separate run
        # whose fit and validation rows are disjoint and make up the split's training data
        torch.testing.assert_close(run.x, split.train_x)
        sel_run = run.selection_run
        # at least 50 rows or a quarter (gpext.fit.validation_rows), not a bare 10%
        n_val = validation_rows(split.num_train, ms.VALIDATION_FRACTION)
        assert sel_run.val_x.shape[0] == n_val and sel_run.x.shape[0] == split.num_train - n_val
        rows = [tuple(r.tolist()) for r in split.train_x]
        both = [tuple(r.tolist()) for r in torch.cat([sel_run.x, sel_run.val_x])]
        assert sorted(both) == sorted(rows)
        assert not {tuple(r.tolist()) for r in sel_run.x} & {
            tuple(r.tolist()) for r in sel_run.val_x
        }
        preds = {}
        for name in METHODS:
            pred = get_method(name).fit_predict(split, config)
            preds[name] = pred
            assert pred.mixture_means.shape[-1] == split.num_test
            assert pred.mixture_means.shape[0] == (1 if name.startswith("subspace_") else 30)
            metrics = evaluate_prediction(split, pred)
            assert all(math.isfinite(v) for v in metrics.values()), (name, metrics)
            # better than predicting the training mean (diabetes target sd is about 77)
            assert metrics["rmse"] < 0.95 * float(split.test_y_original.std()), (name, metrics)
        assert ms.fit_subspace_run(split, config) is run  # one shared run per split
        for sub in ("pca", "inkpca"):
            sel = sel_run.selections[sub]
            assert sorted(sel.validation_ll) == ms.temperature_grid(sel_run.x.shape[0], 3)
            assert sel.validation_ll[sel.temperature] == max(sel.validation_ll.values())
            assert sel.exponent in ms.TEMPERATURE_EXPONENTS
            # ESS and VI of the subspace use the chosen exponent with the full N
            t = (split.num_train / 3) ** sel.exponent
            for inference in ("ess", "vi"):
                info = preds[f"{sub}_{inference}"].info
                assert info["temperature_exponent"] == sel.exponent
                assert math.isclose(info["temperature"], t)
                assert info["seconds"] >= run.train_seconds + run.selection_seconds(sub)

    def test_selection_scores_are_validation_log_likelihoods(self):
        from gpext.subspace import regression_mixture_log_likelihood

        split = load_dataset("diabetes", 0)
        config = BenchConfig(quick=True, seed=1)
        run = ms.fit_subspace_run(split, config, epochs=10, rank=2).selection_run
        sel = ms.select_temperature(run, "pca", config)
        pred = sel.model.predict(run.val_x, sel.thetas)
        expected = regression_mixture_log_likelihood(pred["means"], pred["variances"], run.val_y)
        assert math.isclose(sel.validation_ll[sel.temperature], float(expected.mean()))
        assert ms.select_temperature(run, "pca", config) is sel  # cached per subspace
        with pytest.raises(InputDataError, match="subspace"):
            ms.select_temperature(run, "curve", config)

    def test_without_validation_uses_default_temperature(self):
        split = load_dataset("diabetes", 1)
        config = BenchConfig(quick=True, seed=0)
        run = ms.fit_subspace_run(split, config, epochs=10, rank=2, validation_fraction=0.0)
        assert run.selection_run is None and run.selection_seconds("pca") == 0.0
        assert run.x.shape[0] == split.num_train and run.val_x.shape[0] == 0
        assert run.temperature_exponent("pca", config) == 1.0
        pred = get_method("pca_ess").fit_predict(split, config)
        assert math.isclose(pred.info["temperature"], split.num_train / 2)
        with pytest.raises(InputDataError, match="validation_fraction"):
            ms.fit_subspace_run(split, BenchConfig(quick=True, seed=5), validation_fraction=0.7)

    def test_temperature_grid(self):
        assert ms.TEMPERATURE_EXPONENTS == (-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 2.5)
        grid = ms.temperature_grid(400, 20)
        assert len(grid) == 8 and math.isclose(grid[0], 1 / 20) and grid[2] == 1.0
        assert math.isclose(grid[1], 20**-0.5) and math.isclose(grid[4], 20.0)
        assert math.isclose(grid[-1], 20**2.5)
        ratios = [b / a for a, b in zip(grid, grid[1:])]
        assert all(math.isclose(r, ratios[0]) for r in ratios)
        assert ms.temperature_grid(400, 20, (1.0,)) == [20.0]
        assert ms.temperature_grid(20, 20) == [1.0]  # N / rank = 1: one distinct value
        with pytest.raises(InputDataError, match="exponents"):
            ms.temperature_grid(400, 20, ())
        with pytest.raises(InputDataError, match="exponents"):
            ms.temperature_grid(400, 20, (0.0, float("nan")))

    def test_delayed_rbf_inkpca(self):
        obs = ms.DelayedRBFInKPCA(rank=2, num_init=3)
        g = torch.Generator().manual_seed(0)
        devs = [torch.zeros(10, dtype=torch.float64)] + [
            torch.randn(10, generator=g, dtype=torch.float64) for _ in range(4)
        ]
        for d in devs[:3]:
            obs(None, d)
        assert obs.subspace.kpca.num_points == 0 and obs.subspace.num_points == 3  # buffered
        obs(None, devs[3])
        assert obs.subspace.num_points == 4
        obs(None, devs[4])
        torch.testing.assert_close(obs.subspace.kpca.points, torch.stack(devs))
        x = torch.stack(devs[1:4])
        dist = torch.cdist(x, x)
        assert math.isclose(
            float(obs.subspace.kpca.kernel.lengthscale.detach()),
            float(dist[dist > 0].median()),
            rel_tol=1e-5,
        )

    def test_delayed_rbf_inkpca_feeds_every_cth_collection_in_order(self):
        obs = ms.DelayedRBFInKPCA(rank=2, num_init=2, feed_every=3)
        g = torch.Generator().manual_seed(2)
        devs = [torch.zeros(6, dtype=torch.float64)] + [
            torch.randn(6, generator=g, dtype=torch.float64) for _ in range(10)
        ]
        for d in devs:
            obs(None, d)
        assert obs.num_seen == 11 and obs.subspace.num_points == 4  # collections 1, 4, 7, 10
        torch.testing.assert_close(obs.subspace.kpca.points, torch.stack(devs[::3]))
        x = torch.stack(devs[3::3][:2])
        assert math.isclose(
            float(obs.subspace.kpca.kernel.lengthscale.detach()),
            float(torch.cdist(x, x)[0, 1]),
            rel_tol=1e-5,
        )
        with pytest.raises(InputDataError, match="feed_every"):
            ms.DelayedRBFInKPCA(rank=2, feed_every=0)

    def test_batched_feed_equals_row_by_row(self):
        from gpext.subspace import OnlineFactorAnalysis

        x = torch.randn(30, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        direct = OnlineFactorAnalysis(6, 2, warmup=5, generator=torch.Generator().manual_seed(1))
        fed = OnlineFactorAnalysis(6, 2, warmup=5, generator=torch.Generator().manual_seed(1))
        feed = ms._BatchedFeed(fed.update)
        for i, row in enumerate(x):
            direct.update(row)
            feed(row)
            if i % 7 == 6:
                feed.flush(None, None)  # called as a collection observer
        feed.flush()
        assert fed.num_observations == direct.num_observations == 30
        torch.testing.assert_close(fed.loadings, direct.loadings)
        torch.testing.assert_close(fed.psi, direct.psi)


def test_calibrate_on_validation_scales_the_variances_and_reports_the_check():
    """The default subspace arms used to predict with the network's own variances: 10-50
    times too large on some small raw-unit tables (test z^2 0.02-0.1), without a warning."""
    from types import SimpleNamespace

    from gpext.errors import ReferenceGapWarning, UnderconfidenceWarning

    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
    sel = SimpleNamespace(x=x[:150], y=y[:150], val_x=x[150:], val_y=y[150:],
                          reference_nll=None, reference_done=False)  # fmt: skip
    centre = torch.sin(6 * x[150:, 0])
    means = centre + 0.02 * torch.randn(10, 50, generator=g, dtype=torch.float64)
    good = {"means": means, "variances": torch.full((10, 50), 0.01, dtype=torch.float64)}
    kappa = ms.calibrate_on_validation(sel, good, "toy")
    assert 0.5 < kappa < 2.0 and sel.reference_done and sel.reference_nll is not None
    # variances 25 times too large: the factor undoes it and the check (cross-fitted) is quiet
    wide = {"means": means, "variances": torch.full((10, 50), 0.25, dtype=torch.float64)}
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnderconfidenceWarning)
        assert 0.02 < ms.calibrate_on_validation(sel, wide, "toy") < 0.08
    # a mean that ignores the inputs loses to the exact GP by far more than 0.5 nats
    flat = {"means": torch.zeros(10, 50, dtype=torch.float64) + y[:150].mean(),
            "variances": torch.full((10, 50), 0.5, dtype=torch.float64)}  # fmt: skip
    with pytest.warns(ReferenceGapWarning):
        ms.calibrate_on_validation(sel, flat, "toy")

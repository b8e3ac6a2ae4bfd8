"""The weight-space methods registered in gpext bench, on a small bundled data set."""

import math

import torch

import gpext.bench.methods_subspace as ms
from gpext.bench import BenchConfig, evaluate_prediction, get_method
from gpext.data import load_dataset

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
        for name in METHODS:
            pred = get_method(name).fit_predict(split, config)
            assert pred.mixture_means.shape[-1] == split.num_test
            assert pred.mixture_means.shape[0] == (1 if name.startswith("subspace_") else 30)
            metrics = evaluate_prediction(split, pred)
            assert all(math.isfinite(v) for v in metrics.values()), (name, metrics)
            # better than predicting the training mean (diabetes target sd is about 77)
            assert metrics["rmse"] < 0.95 * float(split.test_y_original.std()), (name, metrics)
        assert ms.fit_subspace_run(split, config) is run  # one shared run per split

    def test_delayed_rbf_inkpca(self):
        obs = ms.DelayedRBFInKPCA(rank=2, num_init=3)
        g = torch.Generator().manual_seed(0)
        devs = [torch.zeros(10, dtype=torch.float64)] + [
            torch.randn(10, generator=g, dtype=torch.float64) for _ in range(4)
        ]
        for d in devs[:3]:
            obs(None, d)
        assert obs.subspace is None and len(obs.pending) == 3
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

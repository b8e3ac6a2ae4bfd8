"""Data loaders in weight-space inference give the results of the same data as tensors."""

import copy
import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.subspace import (
    OutputLikelihood,
    SubspaceModel,
    collect_from_pretrained,
    predict_weight_samples,
    refresh_batch_norm,
    train_sgd_trajectory,
)


def _loader(*tensors, batch_size=16, shuffle=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle, generator=g)


def _regression(dtype=torch.float64, n=60, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=dtype)
    y = torch.sin(x @ torch.tensor([1.0, -0.5, 0.3], dtype=dtype)) + 0.1 * torch.randn(
        n, generator=g, dtype=dtype
    )
    return x, y


def _mlp(dtype=torch.float64, batch_norm=False, seed=0):
    torch.manual_seed(seed)
    layers = [nn.Linear(3, 8)]
    if batch_norm:
        layers.append(nn.BatchNorm1d(8))
    layers += [nn.Tanh(), nn.Linear(8, 1)]
    return nn.Sequential(*layers).to(dtype)


def _model(dtype=torch.float64, batch_norm=False, kind="gaussian", rank=3, seed=0):
    net = _mlp(dtype, batch_norm, seed)
    g = torch.Generator().manual_seed(seed + 1)
    d = sum(p.numel() for p in net.parameters())
    center = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
    proj = 0.3 * torch.randn(rank, d, generator=g, dtype=dtype)
    lik = (
        OutputLikelihood("gaussian", noise_variance=0.05)
        if kind == "gaussian"
        else OutputLikelihood("categorical")
    )
    if kind == "categorical":
        net[-1] = nn.Linear(8, 3).to(dtype)
        d = sum(p.numel() for p in net.parameters())
        center = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        proj = 0.3 * torch.randn(rank, d, generator=g, dtype=dtype)
    return SubspaceModel(net, center, proj, lik, prior_std=1.0, temperature=1.0)


# ---------------------------------------------------------------------- train_sgd_trajectory
class TestTrainSGDTrajectory:
    @pytest.mark.parametrize("batch_norm", [False, True])
    @pytest.mark.parametrize("collect_every", [None, 3])
    def test_loader_matches_tensors(self, same_order_sampler, batch_norm, collect_every):
        # 61 rows, batches of 10: a last batch of one row (merged for batch norm)
        x, y = _regression(torch.float32, n=61)
        runs = []
        for use_loader in (False, True):
            net = _mlp(torch.float32, batch_norm)
            lik = OutputLikelihood("homoscedastic_gaussian")
            g = torch.Generator().manual_seed(3)
            kw = dict(epochs=6, swa_start=2, lr=1e-2, collect_every=collect_every,
                      max_deviations=10, show_progress=False)  # fmt: skip
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if use_loader:
                    dl = DataLoader(
                        TensorDataset(x, y), batch_sampler=same_order_sampler(61, 10, g)
                    )
                    traj = train_sgd_trajectory(net, dl, None, lik, **kw)
                else:
                    traj = train_sgd_trajectory(net, x, y, lik, batch_size=10, generator=g, **kw)
            runs.append((traj, lik, net))
        (t0, l0, n0), (t1, l1, n1) = runs
        assert t0.num_collected == t1.num_collected > 0
        assert torch.equal(t0.mean, t1.mean)
        assert torch.equal(t0.deviations(), t1.deviations())
        for p0, p1 in zip(n0.parameters(), n1.parameters()):
            assert torch.equal(p0, p1)
        # the final noise: one sum in float64 against a sum of per-batch sums
        assert math.isclose(l0.noise_variance, l1.noise_variance, rel_tol=1e-6)

    def test_shuffled_dataloader_runs_and_collects_per_epoch(self):
        x, y = _regression(torch.float32, n=50)
        net = _mlp(torch.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traj = train_sgd_trajectory(
                net, _loader(x, y, batch_size=8, shuffle=True), None,
                OutputLikelihood("gaussian", noise_variance=0.1),
                epochs=5, swa_start=2, show_progress=False,
            )  # fmt: skip
        assert traj.num_collected == 3  # once per collecting epoch

    def test_last_iterate_check_warns_streamed(self):
        from gpext.errors import VarianceCollapseWarning

        x, _ = _regression(torch.float32, n=40)
        y = torch.randn(40, generator=torch.Generator().manual_seed(9))
        net = _mlp(torch.float32)
        with pytest.warns(VarianceCollapseWarning):
            train_sgd_trajectory(
                net, _loader(x, y, batch_size=8), None,
                OutputLikelihood("gaussian", noise_variance=1.0),
                epochs=2, swa_start=1, lr=1e-5, show_progress=False,
            )  # fmt: skip

    def test_errors(self):
        x, y = _regression(torch.float32, n=20)
        lik = OutputLikelihood("gaussian", noise_variance=0.1)
        kw = dict(epochs=2, swa_start=1, show_progress=False)
        net = _mlp(torch.float32)
        with pytest.raises(InputDataError, match="y"):
            train_sgd_trajectory(net, _loader(x, y), y, lik, **kw)
        with pytest.raises(InputDataError, match="batch_size"):
            train_sgd_trajectory(net, _loader(x, y), None, lik, batch_size=4, **kw)
        with pytest.raises(InputTypeError, match="one-shot"):
            train_sgd_trajectory(net, iter(_loader(x, y)), None, lik, **kw)
        with pytest.raises(InputDataError, match="empty loader"):
            train_sgd_trajectory(net, _EmptyLoader(), None, lik, **kw)
        with pytest.raises(InputTypeError, match=r"\(x, y"):
            train_sgd_trajectory(net, _loader(x, batch_size=4), None, lik, **kw)
        with pytest.raises(ShapeError, match="equal numbers of rows"):
            train_sgd_trajectory(net, _ListLoader([(x[:4], y[:3])]), None, lik, **kw)
        bad = x.clone()
        bad[3, 1] = math.nan
        with pytest.raises(InputDataError, match="finite"):
            train_sgd_trajectory(net, _loader(bad, y), None, lik, **kw)
        with pytest.raises(InputDataError, match="network can evaluate"):
            train_sgd_trajectory(net, _loader(x[:, :2], y), None, lik, **kw)
        with pytest.raises(InputTypeError, match="loader"):
            train_sgd_trajectory(net, x, _loader(y), lik, **kw)
        with pytest.raises(ShapeError, match="at least 2 rows"):
            train_sgd_trajectory(_mlp(torch.float32, True), _loader(x[:1], y[:1]), None, lik,
                                 **kw)  # fmt: skip

    def test_post_hoc_loader_takes_no_targets(self):
        # collect_from_pretrained takes loaders (tests/subspace/test_loaders_post_hoc_tuning.py)
        # the way train_sgd_trajectory does: the loader as x and y=None
        x, y = _regression(torch.float32, n=20)
        with pytest.raises(InputDataError, match="None when x is a loader"):
            collect_from_pretrained(_mlp(torch.float32), _loader(x, y), y,
                                    OutputLikelihood("gaussian", noise_variance=0.1))  # fmt: skip


class _EmptyLoader:
    def __iter__(self):
        return iter(())


class _ListLoader:
    """A re-iterable loader over a fixed list of batches."""

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)


# ---------------------------------------------------------------------- refresh_batch_norm
class TestRefreshBatchNorm:
    @pytest.mark.parametrize("n", [513, 300])
    def test_loader_matches_tensor(self, n):
        x = torch.randn(n, 3, generator=torch.Generator().manual_seed(0))
        net = _mlp(torch.float32, batch_norm=True)
        a, b, c = copy.deepcopy(net), copy.deepcopy(net), copy.deepcopy(net)
        refresh_batch_norm(a, x)
        refresh_batch_norm(b, DataLoader(TensorDataset(x), batch_size=256))
        refresh_batch_norm(c, (x[i : i + 256] for i in range(0, n, 256)))  # one pass: generator
        for m in (b, c):
            assert torch.equal(a[1].running_mean, m[1].running_mean)
            assert torch.equal(a[1].running_var, m[1].running_var)
        assert net.training and a.training

    def test_errors(self):
        net = _mlp(torch.float32, batch_norm=True)
        with pytest.raises(InputDataError, match="empty loader"):
            refresh_batch_norm(net, _EmptyLoader())
        with pytest.raises(InputTypeError, match="tensor"):
            refresh_batch_norm(net, _ListLoader([("a", "b")]))
        with pytest.raises(InputDataError, match="finite"):
            refresh_batch_norm(net, _ListLoader([torch.full((4, 3), math.inf)]))


# ---------------------------------------------------------------------- SubspaceModel
class TestSubspaceModelLoaders:
    def test_log_likelihood_and_gradient(self):
        model = _model()
        x, y = _regression()
        theta = torch.randn(3, dtype=torch.float64, requires_grad=True)
        full = model.log_likelihood(theta, x, y)
        (g_full,) = torch.autograd.grad(full, theta)
        for dl in (_loader(x, y, batch_size=7), _loader(x, y, batch_size=16, shuffle=True)):
            streamed = model.log_likelihood(theta, dl)
            (g,) = torch.autograd.grad(streamed, theta)
            torch.testing.assert_close(streamed, full, rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(g, g_full, rtol=1e-10, atol=1e-10)

    @pytest.mark.parametrize("batch_norm", [False, True])
    def test_sample_ess_matches(self, batch_norm):
        x, y = _regression()
        draws = []
        for data in ((x, y), (_loader(x, y, batch_size=256), None),
                     (_loader(x, y, batch_size=256, shuffle=True), None)):  # fmt: skip
            model = _model(batch_norm=batch_norm)
            g = torch.Generator().manual_seed(5)
            draws.append(model.sample_ess(data[0], data[1], 20, burn_in=5, generator=g))
            if batch_norm:
                assert model.bn_buffers is not None
        torch.testing.assert_close(draws[1], draws[0], rtol=1e-8, atol=1e-8)
        torch.testing.assert_close(draws[2], draws[0], rtol=1e-8, atol=1e-8)

    def test_sample_ess_small_batches_shuffled(self):
        # order and batch size change only the summation order
        x, y = _regression()
        model = _model()
        a = model.sample_ess(x, y, 15, generator=torch.Generator().manual_seed(2))
        b = model.sample_ess(_loader(x, y, batch_size=9, shuffle=True), None, 15,
                             generator=torch.Generator().manual_seed(2))  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-8)

    def test_fit_vi_full_pass_matches(self):
        x, y = _regression()
        qs = []
        for data in ((x, y), (_loader(x, y, batch_size=13, shuffle=True), None)):
            model = _model()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.fit_vi(data[0], data[1], num_steps=60, check_samples=16,
                             generator=torch.Generator().manual_seed(4), show_progress=False)  # fmt: skip
            qs.append(model.variational)
        torch.testing.assert_close(qs[1].loc, qs[0].loc, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(qs[1].scale, qs[0].scale, rtol=1e-6, atol=1e-7)

    def test_fit_vi_minibatch_runs_close_to_full(self):
        x, y = _regression(n=120)
        full, mini = _model(), _model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            full.fit_vi(x, y, num_steps=300, generator=torch.Generator().manual_seed(0),
                        show_progress=False)  # fmt: skip
            res = mini.fit_vi(_loader(x, y, batch_size=30, shuffle=True), minibatch=True,
                              num_steps=300, check_samples=16,
                              generator=torch.Generator().manual_seed(0), show_progress=False)  # fmt: skip
        assert len(res.losses) == 75  # 300 steps of 4 batches: 75 epochs
        sd = full.variational.scale
        assert ((mini.variational.loc - full.variational.loc).abs() / sd).max() < 1.0

    def test_minibatch_elbo_unbiased(self):
        x, y = _regression(n=50)
        model = _model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit_vi(x, y, num_steps=50, check_samples=0, show_progress=False,
                         generator=torch.Generator().manual_seed(0))  # fmt: skip
        dl = _loader(x, y, batch_size=15, shuffle=True, seed=1)  # batches of 15, 15, 15, 5

        def seeded():
            return torch.Generator().manual_seed(7)  # the same theta draws every time

        exact = model.elbo(x, y, num_samples=8, generator=seeded())
        assert math.isclose(model.elbo(dl, num_samples=8, generator=seeded()), exact,
                            rel_tol=1e-10)  # fmt: skip
        draws = torch.tensor(
            [model.elbo(dl, num_samples=8, minibatch=True, generator=seeded()) for _ in range(800)]
        )
        se = float(draws.std()) / math.sqrt(draws.numel())
        assert float(draws.std()) > 0  # the estimate really is stochastic
        assert abs(float(draws.mean()) - exact) < 4 * se

    def test_predict_loader_matches(self):
        x, y = _regression()
        model = _model()
        thetas = 0.1 * torch.randn(4, 3, dtype=torch.float64)
        ref = model.predict(x, thetas)
        for dl in (_loader(x, batch_size=7), _loader(x, y, batch_size=11),
                   (x[i : i + 8] for i in range(0, 60, 8))):  # fmt: skip
            out = model.predict(dl, thetas)
            for k in ref:
                torch.testing.assert_close(out[k], ref[k], rtol=1e-12, atol=1e-12)

    def test_predict_weight_samples_bn_loader(self):
        x, _ = _regression()
        net = _mlp(batch_norm=True)
        w0 = torch.cat([p.detach().reshape(-1) for p in net.parameters()])
        weights = w0 + 0.05 * torch.randn(3, w0.numel(), dtype=torch.float64)
        lik = OutputLikelihood("gaussian", noise_variance=0.1)
        ref = predict_weight_samples(net, weights, x, lik, bn_inputs=x)
        out = predict_weight_samples(
            net, weights, _loader(x, batch_size=9), lik,
            bn_inputs=DataLoader(TensorDataset(x), batch_size=256),
        )  # fmt: skip
        torch.testing.assert_close(out["means"], ref["means"], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(out["variances"], ref["variances"])

    def test_calibrate_select_check_fit(self):
        x, y = _regression()
        xv, yv = _regression(n=30, seed=1)
        thetas = 0.1 * torch.randn(5, 3, dtype=torch.float64)
        a, b = _model(), _model()
        ka = a.calibrate_variance(xv, yv, thetas)
        kb = b.calibrate_variance(_loader(xv, yv, batch_size=8, shuffle=True), None, thetas)
        assert math.isclose(ka, kb, rel_tol=1e-6)  # shuffled: the search's tolerance
        assert a.check_fit(x, y, thetas) == b.check_fit(_loader(x, y, batch_size=8), None, thetas)
        a, b = _model(), _model()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sa = a.select_temperature(x, y, xv, yv, [0.5, 2.0], num_samples=6, burn_in=2,
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
            sb = b.select_temperature(_loader(x, y, batch_size=256), None,
                                      _loader(xv, yv, batch_size=7), None, [0.5, 2.0],
                                      num_samples=6, burn_in=2,
                                      generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert sa.temperature == sb.temperature
        for t in (0.5, 2.0):
            assert math.isclose(sa.scores[t], sb.scores[t], rel_tol=1e-8)
        assert math.isclose(a.variance_scale, b.variance_scale, rel_tol=1e-6)

    def test_classification_loader(self):
        x, _ = _regression()
        labels = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
        model = _model(kind="categorical")
        theta = torch.zeros(3, dtype=torch.float64)
        full = model.log_likelihood(theta, x, labels)
        streamed = model.log_likelihood(theta, _loader(x, labels, batch_size=9))
        torch.testing.assert_close(streamed, full)
        with pytest.raises(InputDataError, match="labels"):
            model.log_likelihood(theta, _loader(x, labels + 5, batch_size=9))

    def test_errors(self):
        x, y = _regression()
        model = _model()
        theta = torch.zeros(3, dtype=torch.float64)
        with pytest.raises(InputDataError, match="empty loader"):
            model.sample_ess(_EmptyLoader(), None, 3)
        with pytest.raises(InputDataError, match="None when x is a loader"):
            model.sample_ess(_loader(x, y), y, 3)
        with pytest.raises(InputTypeError, match="loader"):
            model.sample_ess(x, _loader(y), 3)
        with pytest.raises(InputTypeError, match="one-shot"):
            model.fit_vi(iter(_loader(x, y)))
        with pytest.raises(ShapeError):
            model.log_likelihood(theta, _ListLoader([(x[:5], y[:4])]))
        with pytest.raises(ShapeError, match="targets"):
            model.log_likelihood(theta, _ListLoader([(x[:5], y[:5, None].repeat(1, 2))]))
        bad = y.clone()
        bad[0] = math.inf
        with pytest.raises(InputDataError, match="finite"):
            model.sample_ess(_loader(x, bad), None, 3)
        with pytest.raises(InputDataError, match="network can evaluate"):
            model.sample_ess(_loader(x[:, :2], y), None, 3)
        with pytest.raises(InputTypeError, match="float64"):
            model.sample_ess(_loader(x.float(), y.float()), None, 3)
        with pytest.raises(InputTypeError, match=r"\(x, y"):
            model.fit_vi(_loader(x))
        with pytest.raises(InputDataError, match="batch_size"):
            model.fit_vi(_loader(x, y), batch_size=8)
        with pytest.raises(InputDataError, match="minibatch"):
            model.fit_vi(x, y, minibatch=True)
        with pytest.raises(InputDataError, match="empty loader"):
            model.predict(_EmptyLoader(), torch.zeros(2, 3, dtype=torch.float64))
        with pytest.raises(InputDataError, match="network can evaluate"):
            model.predict(_loader(x[:, :2]), torch.zeros(2, 3, dtype=torch.float64))

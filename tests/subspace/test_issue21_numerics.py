"""Numerics and batch norm in weight-space inference (issue 21).

Welford moments of the trajectory (float32 variance at large |w|), old checkpoints, SWAG built
from them; the SGD trainer with batch norm and a last minibatch of one row; batch-norm
statistics at the subspace centre for ESS and VI; the warning for batch-norm predictions without
refresh inputs.
"""

import warnings

import numpy as np
import pytest
import torch
from torch import nn

from gpext.errors import BatchNormWarning, InputDataError, ShapeError
from gpext.subspace import (
    SWAG,
    FlatParameters,
    OutputLikelihood,
    SubspaceModel,
    TrajectoryCollector,
    predict_weight_samples,
    refresh_batch_norm,
    train_sgd_trajectory,
)


def _bn_net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1))


def _collect_large_weights(dtype, n=200, seed=0):
    """Weights of magnitude about 5 with per-collection standard deviation 1e-3."""
    gen = torch.Generator().manual_seed(seed)
    net = nn.Linear(50, 20)  # D = 1020
    d = FlatParameters(net).num_parameters
    base = 5.0 * torch.sign(torch.randn(d, generator=gen, dtype=torch.float64))
    base += 0.5 * torch.rand(d, generator=gen, dtype=torch.float64)
    ws = (base + 1e-3 * torch.randn(n, d, generator=gen, dtype=torch.float64)).float()
    traj = TrajectoryCollector(net.to(dtype), max_deviations=5, dtype=dtype)
    for w in ws:
        traj.collect(w.to(dtype))
    ref = torch.from_numpy(np.var(ws.double().numpy(), axis=0))  # population variance, float64
    return traj, ref, ws.double().mean(0)


class TestWelfordMoments:
    def test_float32_variance_at_large_weights(self):
        # The textbook sq_mean - mean^2 in float32 had a relative error of 100% here.
        traj, ref, mean = _collect_large_weights(torch.float32)
        rel = ((traj.variance.double() - ref).abs() / ref).numpy()
        assert np.median(rel) < 1e-3 and rel.max() < 1e-2, (np.median(rel), rel.max())
        assert traj.variance.dtype == torch.float32
        # the mean to float32 rounding, far below the spread of 1e-3
        assert (traj.mean.double() - mean).abs().max() < 1e-5

    def test_swag_from_trajectory_keeps_the_variance(self):
        traj, ref, _ = _collect_large_weights(torch.float32)
        swag = SWAG.from_trajectory(traj)
        rel = ((swag.diagonal_variance().double() - ref).abs() / ref).numpy()
        assert np.median(rel) < 1e-3 and rel.max() < 1e-2

    def test_float64_moments(self):
        traj, ref, _ = _collect_large_weights(torch.float64)
        torch.testing.assert_close(traj.variance, ref, rtol=1e-9, atol=0)
        torch.testing.assert_close(traj.sq_mean, ref + traj.mean**2, rtol=1e-12, atol=0)

    def test_sq_mean_is_still_available(self):
        traj = TrajectoryCollector(nn.Linear(2, 1), dtype=torch.float64)
        assert torch.equal(traj.sq_mean, torch.zeros(3, dtype=torch.float64))
        ws = torch.randn(6, 3, dtype=torch.float64)
        for w in ws:
            traj.collect(w)
        torch.testing.assert_close(traj.sq_mean, (ws**2).mean(0))
        torch.testing.assert_close(traj.variance, ws.var(0, unbiased=False))

    def test_old_checkpoint_with_sq_mean_loads(self):
        net = nn.Linear(2, 1)
        traj = TrajectoryCollector(net, max_deviations=4, dtype=torch.float64)
        ws = torch.randn(7, 3, dtype=torch.float64)
        for w in ws:
            traj.collect(w)
        old = traj.state_dict()
        # the format before Welford's moments: a stored running second moment
        old["sq_mean"] = (ws**2).mean(0)
        del old["m2"]
        fresh = TrajectoryCollector(net, max_deviations=4, dtype=torch.float64)
        fresh.load_state_dict(old)  # strict
        torch.testing.assert_close(fresh.variance, ws.var(0, unbiased=False))
        torch.testing.assert_close(fresh.deviations(), traj.deviations())
        fresh.collect(ws[0])  # and it keeps collecting
        assert fresh.num_collected == 8
        # the current format round-trips
        again = TrajectoryCollector(net, max_deviations=4, dtype=torch.float64)
        again.load_state_dict(traj.state_dict())
        torch.testing.assert_close(again.m2, traj.m2)

    def test_swag_variance_argument(self):
        mean = torch.zeros(3, dtype=torch.float64)
        dev = torch.randn(3, 3, dtype=torch.float64)
        var = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
        a = SWAG(mean, None, dev, variance=var)
        b = SWAG(mean, var + mean**2, dev)
        torch.testing.assert_close(a.variance, b.variance)
        with pytest.raises(InputDataError, match="exactly one"):
            SWAG(mean, var, dev, variance=var)
        with pytest.raises(InputDataError, match="exactly one"):
            SWAG(mean, None, dev)
        with pytest.raises(InputDataError, match="non-negative"):
            SWAG(mean, None, dev, variance=-var)
        with pytest.raises(ShapeError):
            SWAG(mean, None, dev, variance=var[:2])


class TestTrainerBatchNorm:
    def test_last_minibatch_of_one_row(self):
        # N = 21, batch 10: the last minibatch has one row; batch norm raised a ValueError
        net = _bn_net()
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(21, 3, generator=gen)
        y = x.sum(-1) + 0.1 * torch.randn(21, generator=gen)
        traj = train_sgd_trajectory(
            net, x, y, OutputLikelihood("gaussian"), epochs=4, swa_start=2, batch_size=10,
            generator=gen, show_progress=False,
        )  # fmt: skip
        # two optimiser steps per epoch (10 + 11 rows), one collection per epoch
        assert int(traj.num_steps_) == 4 and traj.num_collected == 2

    def test_networks_without_batch_norm_keep_the_single_row_step(self):
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(21, 3, generator=gen)
        traj = train_sgd_trajectory(
            net, x, x.sum(-1), OutputLikelihood("gaussian"), epochs=3, swa_start=1,
            batch_size=10, generator=gen, show_progress=False,
        )  # fmt: skip
        assert int(traj.num_steps_) == 6 and traj.num_collected == 2

    def test_one_row_with_batch_norm_raises(self):
        with pytest.raises(ShapeError, match="batch norm"):
            train_sgd_trajectory(
                _bn_net(), torch.randn(1, 3), torch.randn(1), OutputLikelihood("gaussian"),
                epochs=2, swa_start=1, show_progress=False,
            )  # fmt: skip


def _stale_model(seed=0):
    """A SubspaceModel of a batch-norm network whose running statistics are stale."""
    net = _bn_net(seed)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, generator=gen)
    y = torch.tanh(x[:, 0]) + 0.1 * torch.randn(64, generator=gen)
    with torch.no_grad():
        net[1].running_mean.fill_(3.0)  # statistics of other weights
        net[1].running_var.fill_(0.01)
    flat = FlatParameters(net)
    center = flat.flatten() + 0.1 * torch.randn(flat.num_parameters, generator=gen)
    proj = 0.05 * torch.randn(2, flat.num_parameters, generator=gen)
    model = SubspaceModel(net, center, proj, OutputLikelihood("gaussian", noise_variance=0.1))
    return model, net, x, y


def _reference_log_likelihood(model, net, x, y):
    ref = _bn_net()
    ref.load_state_dict(net.state_dict())
    model.flat.assign(model.center, ref)
    refresh_batch_norm(ref, x)
    ref.eval()
    with torch.no_grad():
        return model.likelihood.log_prob(ref(x), y).sum(), ref


class TestBatchNormAtTheCentre:
    def test_ess_uses_statistics_at_the_centre(self):
        model, net, x, y = _stale_model()
        model.sample_ess(x, y, 2, generator=torch.Generator().manual_seed(0))
        ref_ll, ref = _reference_log_likelihood(model, net, x, y)
        with torch.no_grad():
            ll = model.log_likelihood(torch.zeros(2), x, y)
        torch.testing.assert_close(ll, ref_ll)
        torch.testing.assert_close(model.bn_buffers["1.running_mean"], ref[1].running_mean)
        # the network's own statistics and weights are left alone
        assert bool((net[1].running_mean == 3.0).all())
        assert not torch.equal(model.flat.flatten(), model.center)

    def test_vi_uses_statistics_at_the_centre(self):
        model, net, x, y = _stale_model(1)
        model.fit_vi(
            x, y, num_steps=3, map_init=False, check_samples=0, show_progress=False,
            generator=torch.Generator().manual_seed(0),
        )  # fmt: skip
        ref_ll, _ = _reference_log_likelihood(model, net, x, y)
        with torch.no_grad():
            ll = model.log_likelihood(torch.zeros(2), x, y)
        torch.testing.assert_close(ll, ref_ll)

    def test_without_batch_norm_nothing_changes(self):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 1))
        flat = FlatParameters(net)
        model = SubspaceModel(
            net, flat.flatten(), torch.randn(2, flat.num_parameters), OutputLikelihood("gaussian")
        )
        x, y = torch.randn(16, 3), torch.randn(16)
        model.sample_ess(x, y, 2, generator=torch.Generator().manual_seed(0))
        assert model.bn_buffers is None


class TestBatchNormWarning:
    def test_predict_weight_samples_warns_without_bn_inputs(self):
        net = _bn_net()
        w = FlatParameters(net).flatten()[None]
        x = torch.randn(32, 3)
        lik = OutputLikelihood("gaussian")
        with pytest.warns(BatchNormWarning, match="bn_inputs") as record:
            predict_weight_samples(net, w, x[:4], lik)
        assert record[0].filename == __file__
        with warnings.catch_warnings():
            warnings.simplefilter("error", BatchNormWarning)
            predict_weight_samples(net, w, x[:4], lik, bn_inputs=x)
            plain = nn.Linear(3, 1)
            predict_weight_samples(plain, FlatParameters(plain).flatten()[None], x, lik)

    def test_subspace_model_predict(self):
        model, net, x, y = _stale_model()
        thetas = torch.zeros(1, 2)
        with pytest.warns(BatchNormWarning) as record:
            model.predict(x[:4], thetas)  # no ESS / VI yet: stale statistics
        assert record[0].filename == __file__
        model.sample_ess(x, y, 2, generator=torch.Generator().manual_seed(0))
        with warnings.catch_warnings():
            warnings.simplefilter("error", BatchNormWarning)
            out = model.predict(x[:4], thetas)  # the statistics at the centre
            per_sample = model.predict(x[:4], thetas, bn_inputs=x)
        _, ref = _reference_log_likelihood(model, net, x, y)
        with torch.no_grad():
            expected = ref(x[:4])[:, 0]
        torch.testing.assert_close(out["means"][0], expected)
        # at theta = 0 the per-sample refresh is the refresh at the centre
        torch.testing.assert_close(per_sample["means"][0], expected)

"""Trajectory collection, flat parameters, batch-norm refresh and the SGD/SWA trainer."""

import numpy as np
import pytest
import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import (
    FlatParameters,
    OutputLikelihood,
    TrajectoryCollector,
    has_batch_norm,
    predict_weight_samples,
    refresh_batch_norm,
    train_sgd_trajectory,
)


class TestFlatParameters:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_round_trip_and_functional_call(self, dtype):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.Tanh(), nn.Linear(4, 2)).to(dtype)
        flat = FlatParameters(net)
        assert flat.num_parameters == sum(p.numel() for p in net.parameters())
        w = flat.flatten()
        x = torch.randn(5, 3, dtype=dtype)
        torch.testing.assert_close(flat.functional_call(w, x), net(x))
        w2 = w + 0.1
        out = flat.functional_call(w2, x)
        torch.testing.assert_close(flat.flatten(), w)  # the module is untouched
        flat.assign(w2)
        torch.testing.assert_close(net(x), out)

    def test_errors(self):
        flat = FlatParameters(nn.Linear(2, 1))
        with pytest.raises(ShapeError, match=r"\(3,\)"):
            flat.unflatten(torch.zeros(4))
        with pytest.raises(InputDataError, match="finite"):
            flat.assign(torch.tensor([0.0, float("inf"), 0.0]))
        with pytest.raises(InputTypeError):
            FlatParameters("net")
        with pytest.raises(InputTypeError, match="parameters"):
            FlatParameters(nn.ReLU())


class TestTrajectoryCollector:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_moments_and_ring_buffer(self, dtype):
        g = torch.Generator().manual_seed(0)
        net = nn.Linear(3, 2).to(dtype)
        traj = TrajectoryCollector(net, max_deviations=4)
        ws = torch.randn(7, traj.num_parameters, generator=g, dtype=dtype)
        devs = [traj.collect(w) for w in ws]
        wn = ws.double().numpy()
        np.testing.assert_allclose(traj.mean.double().numpy(), wn.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(traj.variance.double().numpy(), wn.var(0), rtol=1e-4, atol=1e-5)
        # deviation n is w_n minus the running mean after n collections
        for n in range(7):
            np.testing.assert_allclose(
                devs[n].double().numpy(), wn[n] - wn[: n + 1].mean(0), rtol=1e-5, atol=1e-5
            )
        assert traj.num_deviations == 4
        torch.testing.assert_close(traj.deviations(), torch.stack(devs[-4:]))
        assert traj.deviations().dtype == dtype

    def test_step_period_and_state_dict(self):
        net = nn.Linear(2, 1)
        traj = TrajectoryCollector(net, max_deviations=3, collect_every=2)
        outs = [traj.step() for _ in range(5)]
        assert [o is not None for o in outs] == [False, True, False, True, False]
        assert traj.num_collected == 2
        other = TrajectoryCollector(net, max_deviations=3, collect_every=2)
        other.load_state_dict(traj.state_dict())
        assert other.num_collected == 2
        torch.testing.assert_close(other.deviations(), traj.deviations())
        with pytest.raises(InputDataError, match="buffer"):
            TrajectoryCollector(net, max_deviations=5).load_state_dict(traj.state_dict())

    def test_errors(self):
        net = nn.Linear(2, 1)
        traj = TrajectoryCollector(net)
        with pytest.raises(NotFittedError, match="collect"):
            traj.deviations()
        with pytest.raises(NotFittedError):
            _ = traj.variance
        with pytest.raises(InputDataError, match="finite"):
            traj.collect(torch.tensor([1.0, float("nan"), 0.0]))
        assert traj.num_collected == 0
        with pytest.raises(ShapeError):
            traj.collect(torch.zeros(5))
        with pytest.raises(InputDataError):
            TrajectoryCollector(net, max_deviations=0)


class TestBatchNormRefresh:
    def test_refresh_recomputes_statistics(self):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))
        assert has_batch_norm(net) and not has_batch_norm(nn.Linear(2, 2))
        x = torch.randn(101, 3)
        net.eval()
        refresh_batch_norm(net, x, batch_size=101)
        h = net[0](x).detach()
        torch.testing.assert_close(net[1].running_mean, h.mean(0))
        torch.testing.assert_close(net[1].running_var, h.var(0))
        assert not net.training and net[1].momentum == 0.1
        refresh_batch_norm(net, x, batch_size=50)  # last batch of one point is merged
        with pytest.raises(ShapeError):
            refresh_batch_norm(net, x[:0])

    def test_predict_weight_samples_refreshes_per_sample(self):
        torch.manual_seed(1)
        net = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        x = torch.randn(64, 3)
        flat = FlatParameters(net)
        w = flat.flatten() * 3.0
        out = predict_weight_samples(net, w[None], x[:5], OutputLikelihood("gaussian"), bn_inputs=x)
        ref = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 1))
        flat.assign(w, ref)
        refresh_batch_norm(ref, x)
        ref.eval()
        torch.testing.assert_close(out["means"][0], ref(x[:5])[:, 0].detach())
        torch.testing.assert_close(flat.flatten(), w / 3.0)  # original module untouched


class TestTrainSGDTrajectory:
    def test_collects_and_notifies_observers(self):
        g = torch.Generator().manual_seed(0)
        torch.manual_seed(0)
        x = torch.randn(60, 2)
        y = x[:, 0] - x[:, 1] ** 2 + 0.1 * torch.randn(60)
        net = HeteroscedasticMLP(2, [16])
        seen, steps = [], []
        traj = train_sgd_trajectory(
            net,
            x,
            y,
            OutputLikelihood("heteroscedastic_gaussian"),
            epochs=12,
            swa_start=6,
            lr=0.05,
            max_deviations=4,
            observers=[lambda w, d: seen.append((w, d))],
            step_observers=[steps.append],
            generator=g,
        )
        assert traj.num_collected == 6 and len(seen) == 6 and traj.num_deviations == 4
        assert len(steps) == 6 * 10  # batch size ceil(N / 10): ten steps per epoch
        torch.testing.assert_close(steps[9], seen[0][0])
        torch.testing.assert_close(seen[-1][0], traj.flat.flatten())
        torch.testing.assert_close(seen[-1][1], traj.deviations()[-1])
        with pytest.raises(InputDataError, match="swa_start"):
            train_sgd_trajectory(net, x, y, OutputLikelihood("gaussian"), epochs=3, swa_start=3)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_gradient_clipping_bounds_each_step(self, dtype):
        torch.manual_seed(0)
        x = torch.randn(40, 2, dtype=dtype)
        y = 100 * x[:, 0]  # huge residuals: unclipped gradients are far above the bound
        lik = OutputLikelihood("heteroscedastic_gaussian")
        for clip in (1e-2, None):
            net = HeteroscedasticMLP(2, [8]).to(dtype)
            w0 = torch.cat([p.detach().flatten() for p in net.parameters()])
            steps = []
            train_sgd_trajectory(
                net,
                x,
                y,
                lik,
                epochs=2,
                swa_start=0,
                lr=0.1,
                swa_lr=0.1,
                momentum=0.0,
                batch_size=40,
                max_grad_norm=clip,
                step_observers=[steps.append],
            )
            jumps = torch.stack([steps[0] - w0, steps[1] - steps[0]]).norm(dim=-1)
            if clip is None:
                assert bool((jumps > 0.1 * 1e-2 * 10).all())
            else:
                assert bool((jumps <= 0.1 * clip * (1 + 1e-4)).all())
        with pytest.raises(InputDataError, match="max_grad_norm"):
            train_sgd_trajectory(net, x, y, lik, epochs=2, swa_start=1, max_grad_norm=0.0)


def test_sgd_trajectory_warns_when_the_network_ends_at_the_mean():
    """lr = 0 leaves an initial network that explains nothing: a warning, not silence."""
    from gpext.errors import VarianceCollapseWarning
    from gpext.nn import HeteroscedasticMLP
    from gpext.subspace import OutputLikelihood, train_sgd_trajectory

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(80, 2, generator=gen, dtype=torch.float64)
    y = 5.0 * torch.sin(2 * x[:, 0]) + 3.0
    torch.manual_seed(0)
    net = HeteroscedasticMLP(2, [8]).double()
    lik = OutputLikelihood("heteroscedastic_gaussian")
    with pytest.warns(VarianceCollapseWarning, match="train_sgd_trajectory"):
        train_sgd_trajectory(net, x, y, lik, epochs=3, swa_start=1, lr=0.0, generator=gen)

"""Data loaders in collect_from_pretrained and the held-out tuning functions (issue 21).

Every loader result is compared with the same rows as tensors.
"""

import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpext.errors import InputDataError, InputTypeError
from gpext.subspace import (
    SWAG,
    FlatParameters,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    collect_from_pretrained,
    mean_negative_log_likelihood,
    select_noise_variance,
    select_prior_std,
    select_swag_scale,
    select_temperature,
    train_sgd_trajectory,
)


def _loader(*tensors, batch_size=16, shuffle=False):
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(*tensors), batch_size=batch_size, shuffle=shuffle, generator=g)


def _data(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _pretrained(seed=0):
    x, y = _data()
    net = _mlp(seed)
    opt = torch.optim.Adam(net.parameters(), lr=1e-2)
    for _ in range(200):
        opt.zero_grad()
        ((net(x)[:, 0] - y) ** 2).mean().backward()
        opt.step()
    return net, x, y


def _collect(net, x, y, lik, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return collect_from_pretrained(net, x, y, lik, show_progress=False, **kw)


# ---------------------------------------------------------------- collect_from_pretrained
class TestCollectFromPretrainedLoaders:
    def test_loader_in_the_same_order_gives_the_tensor_trajectory(self, same_order_sampler):
        net, x, y = _pretrained()
        trajs = []
        for use_loader in (False, True):
            work = _mlp()
            work.load_state_dict(net.state_dict())
            lik = OutputLikelihood("gaussian", noise_variance=0.05)
            if use_loader:
                sampler = same_order_sampler(64, 10, torch.Generator().manual_seed(3))
                dl = DataLoader(TensorDataset(x, y), batch_sampler=sampler)
                trajs.append(_collect(work, dl, None, lik, epochs=4, lr=1e-2))
            else:
                trajs.append(_collect(work, x, y, lik, epochs=4, lr=1e-2, batch_size=10,
                                      generator=torch.Generator().manual_seed(3)))  # fmt: skip
        a, b = trajs
        assert a.num_collected == b.num_collected == 4
        torch.testing.assert_close(b.mean, a.mean)
        torch.testing.assert_close(b.variance, a.variance)
        torch.testing.assert_close(b.deviations(), a.deviations())

    def test_rate_rule_and_learned_noise_match_tensors(self):
        """Full batches: the rate rule, the starting noise and the trajectory are the tensors'."""
        net, x, y = _pretrained()
        out = {}
        for use_loader in (False, True):
            work = _mlp()
            work.load_state_dict(net.state_dict())
            lik = OutputLikelihood("homoscedastic_gaussian")
            data = (_loader(x, y, batch_size=64), None) if use_loader else (x, y)
            kw = {} if use_loader else {"batch_size": 64}
            traj = _collect(work, *data, lik, epochs=3, tolerance=0.05,
                            lr_candidates=(3.0, 1e-2, 1e-3),
                            generator=torch.Generator().manual_seed(0), **kw)  # fmt: skip
            out[use_loader] = (traj, lik)
        (ta, la), (tb, lb) = out[False], out[True]
        assert tb.post_hoc_lr == ta.post_hoc_lr < 3.0  # 3.0 leaves the basin in both
        torch.testing.assert_close(tb.mean, ta.mean)
        torch.testing.assert_close(tb.deviations(), ta.deviations())
        assert math.isclose(lb.noise_variance, la.noise_variance, rel_tol=1e-9)

    def test_mean_negative_log_likelihood_streamed(self):
        net, x, y = _pretrained()
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        full = mean_negative_log_likelihood(net, x, y, lik)
        for bs in (7, 64):
            streamed = mean_negative_log_likelihood(net, _loader(x, y, batch_size=bs), None, lik)
            assert math.isclose(streamed, full, rel_tol=1e-12)
        assert net.training  # mode restored

    def test_shuffled_loader_parameter_subset_and_errors(self):
        net, x, y = _pretrained()
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        traj = _collect(net, _loader(x, y, batch_size=8, shuffle=True), None, lik, epochs=3,
                        parameters="last_layer")  # fmt: skip
        assert traj.num_parameters == 9 and traj.num_collected == 3
        assert traj.post_hoc_lr > 0
        with pytest.raises(InputDataError, match="None when x is a loader"):
            _collect(net, _loader(x, y), y, lik, lr=1e-2)
        with pytest.raises(InputDataError, match="batch_size"):
            _collect(net, _loader(x, y), None, lik, lr=1e-2, batch_size=8)
        with pytest.raises(InputTypeError, match="one-shot"):
            _collect(net, iter(_loader(x, y)), None, lik, lr=1e-2)
        with pytest.raises(InputTypeError, match="loader"):
            _collect(net, x, _loader(y), lik, lr=1e-2)
        with pytest.raises(InputTypeError, match=r"\(x, y"):
            _collect(net, _loader(x), None, lik, lr=1e-2)
        with pytest.raises(InputDataError, match="None when x is a loader"):
            mean_negative_log_likelihood(net, _loader(x, y), y, lik)


# ------------------------------------------------------------------------------ tuning
def _swag_setup():
    x, y = _data()
    xv, yv = _data(n=37, seed=1)
    net = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traj = train_sgd_trajectory(
            net, x, y, OutputLikelihood("gaussian", noise_variance=0.05), epochs=12, swa_start=4,
            lr=5e-2, batch_size=16, max_deviations=5, generator=torch.Generator().manual_seed(1),
            show_progress=False,
        )  # fmt: skip
    return net, traj, x, y, xv, yv


class TestTuningLoaders:
    @pytest.mark.parametrize("num_weights", (1, 3))
    def test_noise_variance(self, num_weights):
        net, traj, _, _, xv, yv = _swag_setup()
        w = SWAG.from_trajectory(traj).sample(
            num_weights, generator=torch.Generator().manual_seed(0)
        )
        if num_weights == 1:
            w = traj.mean[None]
        values = []
        for data in ((xv, yv), (_loader(xv, yv, batch_size=10), None),
                     (iter(_loader(xv, yv, batch_size=5)), None)):  # fmt: skip
            lik = OutputLikelihood("gaussian", noise_variance=1.0)
            sel = select_noise_variance(net, w, *data, lik)
            assert lik.noise_variance == sel.value
            values.append((sel.value, list(sel.scores.values())[0]))
        for value, score in values[1:]:
            assert math.isclose(value, values[0][0], rel_tol=1e-9)
            assert math.isclose(score, values[0][1], rel_tol=1e-9)

    def test_swag_scale_with_noise(self):
        net, traj, _, _, xv, yv = _swag_setup()
        sels, liks = [], []
        for data in ((xv, yv), (_loader(xv, yv, batch_size=8), None)):
            swag = SWAG.from_trajectory(traj)
            lik = OutputLikelihood("homoscedastic_gaussian")
            sel = select_swag_scale(net, swag, *data, lik, num_samples=6,
                                    generator=torch.Generator().manual_seed(0))  # fmt: skip
            assert swag.scale == sel.value
            sels.append(sel)
            liks.append(lik)
        a, b = sels
        assert math.isclose(b.value, a.value, rel_tol=1e-9, abs_tol=1e-12)
        assert list(b.scores) == pytest.approx(list(a.scores), rel=1e-9)
        assert list(b.scores.values()) == pytest.approx(list(a.scores.values()), rel=1e-9)
        torch.testing.assert_close(b.samples, a.samples)
        assert math.isclose(liks[1].noise_variance, liks[0].noise_variance, rel_tol=1e-9)
        assert b.details["noise_variance"] == pytest.approx(a.details["noise_variance"], rel=1e-9)

    def _model(self):
        net, traj, x, y, xv, yv = _swag_setup()
        pca = PCASubspace(rank=2).fit(traj.deviations(), generator=torch.Generator().manual_seed(0))
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        return SubspaceModel(net, traj.mean, pca.projection, lik), x, y, xv, yv

    def test_prior_std(self):
        model, x, y, xv, yv = self._model()
        kw = {"prior_stds": (0.5, 2.0), "num_samples": 6, "burn_in": 4}
        base = select_prior_std(model, x, y, xv, yv, generator=torch.Generator().manual_seed(0),
                                **kw)  # fmt: skip
        val = select_prior_std(model, x, y, _loader(xv, yv, batch_size=9), None,
                               generator=torch.Generator().manual_seed(0), **kw)  # fmt: skip
        assert val.value == base.value and model.prior_std == base.value
        torch.testing.assert_close(val.samples, base.samples)
        assert list(val.scores.values()) == pytest.approx(list(base.scores.values()), rel=1e-9)
        # a training loader too: ESS streams the likelihood (equal up to summation rounding)
        both = select_prior_std(model, _loader(x, y, batch_size=16), None,
                                _loader(xv, yv, batch_size=9), None,
                                generator=torch.Generator().manual_seed(0), **kw)  # fmt: skip
        assert both.value == base.value
        torch.testing.assert_close(both.samples, base.samples, rtol=1e-6, atol=1e-8)

    def test_temperature(self):
        model, x, y, xv, yv = self._model()
        kw = {"exponents": (0.0, 1.0), "num_samples": 6, "burn_in": 4}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = select_temperature(model, x, y, xv, yv,
                                      generator=torch.Generator().manual_seed(0), **kw)  # fmt: skip
            streamed = select_temperature(model, _loader(x, y, batch_size=16), None,
                                          _loader(xv, yv, batch_size=9), None,
                                          generator=torch.Generator().manual_seed(0),
                                          **kw)  # fmt: skip
        assert list(streamed.scores) == pytest.approx(list(base.scores), rel=1e-12)
        assert streamed.value == base.value
        assert list(streamed.scores.values()) == pytest.approx(list(base.scores.values()), rel=1e-6)

    def test_errors(self):
        net, traj, x, y, xv, yv = _swag_setup()
        swag = SWAG.from_trajectory(traj)
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        w = traj.mean[None]
        with pytest.raises(InputDataError, match="None when x_val is a loader"):
            select_noise_variance(net, w, _loader(xv, yv), yv, lik)
        with pytest.raises(InputTypeError, match="loader"):
            select_noise_variance(net, w, xv, _loader(yv), lik)
        with pytest.raises(InputTypeError, match=r"\(x, y"):
            select_noise_variance(net, w, _loader(xv), None, lik)
        with pytest.raises(InputDataError, match="empty loader"):
            select_noise_variance(net, w, DataLoader(TensorDataset(xv[:0], yv[:0])), None, lik)
        with pytest.raises(InputTypeError, match="one-shot"):
            select_swag_scale(net, swag, iter(_loader(xv, yv)), None, lik, num_samples=2)
        with pytest.raises(InputDataError, match="None when x_val is a loader"):
            select_swag_scale(net, swag, _loader(xv, yv), yv, lik, num_samples=2)
        model = SubspaceModel(net, traj.mean, torch.eye(2, FlatParameters(net).num_parameters,
                                                        dtype=torch.float64), lik)  # fmt: skip
        with pytest.raises(InputDataError, match="y_val"):
            select_prior_std(model, x, y, _loader(xv, yv), yv, num_samples=2)
        with pytest.raises(InputTypeError, match="loader"):
            select_temperature(model, x, _loader(y), xv, yv)

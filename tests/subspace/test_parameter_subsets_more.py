"""Parameter selection in CurveSubspace, linearized_predictive and MultiSWAG (issue 21)."""

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.subspace import (
    SWAG,
    CurveSubspace,
    FlatParameters,
    MultiSWAG,
    OutputLikelihood,
    SubspaceModel,
    linearized_predictive,
    predict_weight_samples,
    select_swag_scale,
    train_sgd_trajectory,
    validation_log_likelihood,
)

LAST = ["2.weight", "2.bias"]


def _mlp(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _data(n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x, y


def _features(net, x):
    with torch.no_grad():
        return net[1](net[0](x))


def _head(net):
    head = nn.Linear(8, 1).double()
    head.load_state_dict(net[2].state_dict())
    return head


def _lik():
    return OutputLikelihood("gaussian", noise_variance=0.05)


# ----------------------------------------------------------------------------- curve
class TestCurveSubspaceSelection:
    def test_last_layer_curve_is_the_curve_of_the_head_on_fixed_features(self):
        x, y = _data()
        net = _mlp()
        before = copy.deepcopy(net.state_dict())
        w0 = FlatParameters(net, "last_layer").flatten()
        w1 = w0 + 0.3 * torch.randn(9, generator=torch.Generator().manual_seed(1), dtype=w0.dtype)
        kw = {"epochs": 4, "batch_size": 12, "show_progress": False}
        sub = CurveSubspace(**kw).fit(net, w0, w1, (x, y), _lik(),
                                      generator=torch.Generator().manual_seed(2),
                                      parameters="last_layer")  # fmt: skip
        ref = CurveSubspace(**kw).fit(_head(net), w0, w1, (_features(net, x), y), _lik(),
                                      generator=torch.Generator().manual_seed(2))  # fmt: skip
        torch.testing.assert_close(sub.control, ref.control)
        assert sub.losses == pytest.approx(ref.losses, rel=1e-12)
        assert sub.parameter_names == LAST and ref.parameter_names == ["weight", "bias"]
        # memory of the selection only; the module, its gradients and mode untouched
        assert sub.projection.shape == (2, 9) and sub.center.shape == (9,)
        for k, v in net.state_dict().items():
            assert torch.equal(v, before[k])
        assert all(p.grad is None for p in net.parameters())
        assert net.training
        # the subspace goes into a SubspaceModel over the same selection
        model = SubspaceModel(net, sub.center, sub.projection, _lik(),
                              parameters=sub.parameter_names)  # fmt: skip
        theta = sub.curve_coordinates(0.3)
        out = model.predict(x, theta[None])["means"][0]
        work = copy.deepcopy(net)
        FlatParameters(work, "last_layer").assign(sub.curve_point(0.3), work)
        torch.testing.assert_close(out, work(x).squeeze(-1))

    def test_loader_names_and_errors(self):
        x, y = _data()
        net = _mlp()
        w0 = FlatParameters(net, ["0.bias", "2.bias"]).flatten()
        dl = DataLoader(TensorDataset(x, y), batch_size=16)
        sub = CurveSubspace(epochs=2, show_progress=False).fit(
            net, w0, w0 + 0.1, dl, _lik(), parameters=["2.bias", "0.bias"]
        )
        assert sub.parameter_names == ["0.bias", "2.bias"] and sub.control.shape == (9,)
        full = FlatParameters(net).flatten()
        curve = CurveSubspace(epochs=1, show_progress=False)
        with pytest.raises(ShapeError, match=r"\(9,\)"):
            curve.fit(net, full, full + 0.1, (x, y), _lik(), parameters="last_layer")
        with pytest.raises(InputDataError, match="unknown names"):
            curve.fit(net, w0, w0 + 0.1, (x, y), _lik(), parameters=["3.weight"])
        with pytest.raises(InputTypeError, match="callable"):
            curve.fit(net, w0, w0 + 0.1, (x, y), _lik(), parameters=3)


# -------------------------------------------------------------- linearized predictive
class TestLinearizedPredictiveWeightSpace:
    def _posterior(self, d, seed=3):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(d, d, generator=g, dtype=torch.float64)
        return 0.1 * torch.randn(d, generator=g, dtype=torch.float64), 0.01 * a @ a.T

    def test_last_layer_is_exact_and_leaves_the_body(self):
        x, _ = _data(n=20)
        net = _mlp()
        lik = _lik()
        w = FlatParameters(net, "last_layer").flatten()
        shift, cov = self._posterior(9)
        loc = w + shift
        feat1 = torch.cat([_features(net, x), torch.ones(20, 1, dtype=torch.float64)], -1)
        exp_mean = feat1 @ loc
        for batch_size in (4, 64):  # D = 9 > 4 rows: reverse mode; 9 <= 20: forward mode
            for c in (cov, cov.diagonal()):
                mean, var = linearized_predictive(net, x, loc, c, likelihood=lik,
                                                  parameters="last_layer",
                                                  batch_size=batch_size)  # fmt: skip
                dense = c if c.dim() == 2 else torch.diag(c)
                torch.testing.assert_close(mean, exp_mean)
                torch.testing.assert_close(var, ((feat1 @ dense) * feat1).sum(-1) + 0.05)
        assert torch.equal(FlatParameters(net, "last_layer").flatten(), w)

    def test_swag_covariance_operator_and_subspace_model_agree(self):
        x, y = _data()
        net = _mlp()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traj = train_sgd_trajectory(
                net, x, y, _lik(), epochs=8, swa_start=2, lr=5e-2, batch_size=16,
                max_deviations=4, parameters="last_layer", show_progress=False,
                generator=torch.Generator().manual_seed(0),
            )  # fmt: skip
        swag = SWAG.from_trajectory(traj)
        lik = _lik()
        op = linearized_predictive(net, x, swag.mean, swag.covariance(), likelihood=lik,
                                   parameters="last_layer")  # fmt: skip
        dense = linearized_predictive(net, x, swag.mean, swag.covariance().to_dense(),
                                      likelihood=lik, parameters=LAST)  # fmt: skip
        torch.testing.assert_close(op, dense)
        # a subspace model over the same selection: theta -> w = c + P^T theta
        g = torch.Generator().manual_seed(4)
        proj = torch.randn(3, 9, generator=g, dtype=torch.float64)
        model = SubspaceModel(net, swag.mean, proj, lik, parameters="last_layer")
        theta = 0.1 * torch.randn(3, generator=g, dtype=torch.float64)
        a = torch.randn(3, 3, generator=g, dtype=torch.float64)
        c = 0.01 * a @ a.T
        sub = linearized_predictive(model, x, theta, c)
        same = linearized_predictive(model, x, theta, c, parameters=LAST)
        weights = linearized_predictive(net, x, model.weights(theta), proj.T @ c @ proj,
                                        likelihood=lik, parameters="last_layer")  # fmt: skip
        torch.testing.assert_close(sub, weights)
        torch.testing.assert_close(same, sub)

    def test_all_parameters_match_an_identity_subspace(self):
        x, _ = _data(n=10)
        net = _mlp()
        lik = _lik()
        flat = FlatParameters(net)
        d = flat.num_parameters
        shift, cov = self._posterior(d)
        model = SubspaceModel(net, flat.flatten(), torch.eye(d, dtype=torch.float64), lik)
        sub = linearized_predictive(model, x, shift, cov)
        weights = linearized_predictive(net, x, flat.flatten() + shift, cov, likelihood=lik)
        torch.testing.assert_close(sub, weights)

    def test_errors(self):
        x, _ = _data(n=10)
        net = _mlp()
        w = FlatParameters(net, "last_layer").flatten()
        lik = _lik()
        kw = {"parameters": "last_layer"}

        def ones(n):
            return torch.ones(n, dtype=torch.float64)

        with pytest.raises(InputTypeError, match="OutputLikelihood"):
            linearized_predictive(net, x, w, ones(9), **kw)
        with pytest.raises(InputDataError, match="regression"):
            linearized_predictive(net, x, w, ones(9), likelihood=OutputLikelihood(
                "categorical"), **kw)  # fmt: skip
        with pytest.raises(ShapeError, match=r"\(9,\)"):
            linearized_predictive(net, x, FlatParameters(net).flatten(), ones(9),
                                  likelihood=lik, **kw)  # fmt: skip
        with pytest.raises(InputDataError, match="positive semi-definite"):
            linearized_predictive(net, x, w, -torch.eye(9, dtype=torch.float64), likelihood=lik,
                                  **kw)  # fmt: skip
        with pytest.raises(InputDataError, match="unknown names"):
            linearized_predictive(net, x, w, ones(9), likelihood=lik, parameters=["x"])
        with pytest.raises(InputTypeError, match="SubspaceModel or a torch.nn.Module"):
            linearized_predictive("net", x, w, ones(9), likelihood=lik)
        model = SubspaceModel(net, w, torch.eye(2, 9, dtype=torch.float64), lik,
                              parameters="last_layer")  # fmt: skip
        with pytest.raises(InputDataError, match="selection"):
            linearized_predictive(model, x, ones(2), ones(2), parameters=["2.bias"])
        with pytest.raises(InputDataError, match="likelihood"):
            linearized_predictive(model, x, ones(2), ones(2), likelihood=lik)


# -------------------------------------------------------------------------- MultiSWAG
def _last_layer_runs(num=2):
    x, y = _data()
    runs = []
    for seed in range(num):
        net = _mlp(seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traj = train_sgd_trajectory(
                net, x, y, _lik(), epochs=8, swa_start=2, lr=5e-2, batch_size=16,
                max_deviations=4, parameters="last_layer", show_progress=False,
                generator=torch.Generator().manual_seed(seed),
            )  # fmt: skip
        runs.append((net, traj))
    return runs, x, y


class TestMultiSWAGSelection:
    def test_each_component_predicts_on_its_own_network(self):
        runs, x, _ = _last_layer_runs()
        multi = MultiSWAG.from_trajectories([t for _, t in runs])
        assert multi.num_parameters == 9 and multi.parameter_names == LAST
        state = multi.state_dict()
        assert all(v.shape[-1] == 9 for k, v in state.items() if k != "mixing_weights")
        assert multi.modules_per_component == [runs[0][0], runs[1][0]]
        w = multi.sample(6, generator=torch.Generator().manual_seed(0))
        out = multi.predict(w, x, _lik())["means"]
        assert out.shape == (6, 48)
        for s in range(6):
            work = copy.deepcopy(runs[s // 3][0])  # 3 draws per component, in order
            FlatParameters(work, "last_layer").assign(w[s], work)
            with torch.no_grad():
                torch.testing.assert_close(out[s], work(x).squeeze(-1))
        # a loader of test inputs read once per component gives the same predictions
        dl = DataLoader(TensorDataset(x), batch_size=10)
        torch.testing.assert_close(multi.predict(w, dl, _lik())["means"], out)
        shuffled = DataLoader(TensorDataset(x), batch_size=10, shuffle=True)
        with pytest.raises(InputDataError, match="same batches"):
            multi.predict(w, shuffled, _lik())

    def test_shared_module_equals_predict_weight_samples(self):
        runs, x, _ = _last_layer_runs()
        net = runs[0][0]
        comps = [SWAG.from_trajectory(t) for _, t in runs]
        multi = MultiSWAG(comps, modules=net, parameters="last_layer")
        w = multi.sample(4, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(
            multi.predict(w, x, _lik())["means"],
            predict_weight_samples(net, w, x, _lik(), parameters="last_layer")["means"],
        )
        plain = MultiSWAG(comps)  # a mixture over weight vectors, as before
        assert plain.parameter_names is None
        torch.testing.assert_close(plain.mean, multi.mean)

    def test_select_swag_scale_uses_the_components_networks(self):
        runs, _, _ = _last_layer_runs()
        xv, yv = _data(n=30, seed=5)
        multi = MultiSWAG.from_trajectories([t for _, t in runs])
        lik = OutputLikelihood("homoscedastic_gaussian")
        gen = torch.Generator().manual_seed(0)
        sel = select_swag_scale(None, multi, xv, yv, lik, num_samples=6, generator=gen)
        means = multi.sample(6, scale=0.0)  # the component means, 3 each
        noise = OutputLikelihood("gaussian", noise_variance=sel.details["noise_variance"])
        expected = validation_log_likelihood(multi.predict(means, xv, noise), yv)
        assert sel.scores[0.0] == pytest.approx(expected, rel=1e-10)
        assert multi.components[0].scale == multi.components[1].scale == sel.value
        # the same with a loader of held-out batches
        other = MultiSWAG.from_trajectories([t for _, t in runs])
        dl = DataLoader(TensorDataset(xv, yv), batch_size=7)
        lik2 = OutputLikelihood("homoscedastic_gaussian")
        sel2 = select_swag_scale(None, other, dl, None, lik2, num_samples=6,
                                 generator=torch.Generator().manual_seed(0))  # fmt: skip
        assert sel2.value == pytest.approx(sel.value, rel=1e-9, abs=1e-12)
        assert lik2.noise_variance == pytest.approx(lik.noise_variance, rel=1e-9)
        with pytest.raises(InputDataError, match="MultiSWAG's selection"):
            select_swag_scale(None, multi, xv, yv, lik, num_samples=2, parameters=["0.bias"])

    def test_errors(self):
        runs, x, _ = _last_layer_runs()
        comps = [SWAG.from_trajectory(t) for _, t in runs]
        nets = [n for n, _ in runs]
        with pytest.raises(InputDataError, match="modules="):
            MultiSWAG(comps, parameters="last_layer")
        with pytest.raises(InputDataError, match="one per component"):
            MultiSWAG(comps, modules=nets + nets[:1], parameters="last_layer")
        with pytest.raises(ShapeError, match="9 weights"):
            MultiSWAG(comps, modules=nets)  # every parameter: 41 weights
        with pytest.raises(InputTypeError, match="Module"):
            MultiSWAG(comps, modules=["net"], parameters="last_layer")
        with pytest.raises(InputDataError, match="modules="):
            MultiSWAG(comps).predict(torch.zeros(2, 9), x, _lik())
        with pytest.raises(ShapeError, match=r"\(S, 9\)"):
            MultiSWAG(comps, modules=nets, parameters="last_layer").predict(
                torch.zeros(2, 41), x, _lik()
            )
        # collectors of different selections of the same size are not mixed
        a = runs[0][1]
        from gpext.subspace import TrajectoryCollector

        b = TrajectoryCollector(runs[1][0], max_deviations=4, parameters=["0.bias", "2.bias"])
        for _ in range(3):
            b.collect()
        with pytest.raises(InputDataError, match="same parameters= selection"):
            MultiSWAG.from_trajectories([a, b])

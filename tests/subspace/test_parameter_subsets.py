"""Weight-space inference over a selection of a network's parameters (last layer, trainable, names)."""

import copy
import warnings

import pytest
import torch
from torch import nn

from gpext.errors import InputDataError, InputTypeError
from gpext.subspace import (
    SWAG,
    FlatParameters,
    OnlineFactorAnalysis,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    TrajectoryCollector,
    collect_from_pretrained,
    predict_weight_samples,
    train_sgd_trajectory,
)


def _mlp(dtype=torch.float64, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(3, 6), nn.Tanh(), nn.Linear(6, 4), nn.Tanh(), nn.Linear(4, 1)
    ).to(dtype)


def _data(dtype=torch.float64, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=dtype)
    y = torch.sin(x.sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    return x, y


def _train(net, x, y, parameters="all", observers=()):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return train_sgd_trajectory(
            net, x, y, OutputLikelihood("gaussian", noise_variance=0.05), epochs=12, swa_start=4,
            lr=5e-2, batch_size=16, max_deviations=5, generator=torch.Generator().manual_seed(1),
            parameters=parameters, observers=observers, show_progress=False,
        )  # fmt: skip


class TestFlatParametersSelection:
    def test_named_selections(self):
        net = _mlp()
        assert FlatParameters(net).names == [n for n, _ in net.named_parameters()]
        last = FlatParameters(net, "last_layer")
        assert last.names == ["4.weight", "4.bias"] and last.num_parameters == 5
        assert last.is_subset and not FlatParameters(net).is_subset
        net[0].requires_grad_(False)
        trainable = FlatParameters(net, "requires_grad")
        assert trainable.names == ["2.weight", "2.bias", "4.weight", "4.bias"]
        assert trainable.num_parameters == 6 * 4 + 4 + 5
        # names are put in module order, whatever order they are given in
        assert FlatParameters(net, ["4.bias", "0.bias"]).names == ["0.bias", "4.bias"]
        assert FlatParameters(net, lambda n: n.endswith("bias")).names == [
            "0.bias", "2.bias", "4.bias",
        ]  # fmt: skip

    def test_functional_call_keeps_other_parameters(self):
        net = _mlp()
        full, last = FlatParameters(net), FlatParameters(net, "last_layer")
        x = torch.randn(5, 3, dtype=torch.float64)
        w_last = last.flatten() + 0.3
        w_full = full.flatten()
        w_full[-5:] = w_last
        torch.testing.assert_close(last.functional_call(w_last, x), full.functional_call(w_full, x))
        before = full.flatten()
        work = copy.deepcopy(net)
        last.assign(w_last, work)
        after = full.flatten(work)
        assert torch.equal(after[:-5], before[:-5]) and torch.equal(after[-5:], w_last)
        assert torch.equal(full.flatten(), before)  # the wrapped module is untouched

    def test_errors(self):
        net = _mlp()
        with pytest.raises(InputDataError, match=r"0.weight.*unknown names \['5.weight'\]"):
            FlatParameters(net, ["4.weight", "5.weight"])
        with pytest.raises(InputDataError, match="last_layers"):
            FlatParameters(net, "last_layers")
        with pytest.raises(InputDataError, match="at least one parameter"):
            FlatParameters(net, lambda n: False)
        with pytest.raises(InputDataError, match="at least one parameter"):
            FlatParameters(net, [])
        net.requires_grad_(False)
        with pytest.raises(InputDataError, match="at least one parameter"):
            FlatParameters(net, "requires_grad")
        with pytest.raises(InputTypeError, match="callable"):
            FlatParameters(net, 3)

        class RootScaled(nn.Module):
            def __init__(self):
                super().__init__()
                self.body = nn.Linear(3, 1)
                self.scale = nn.Parameter(torch.ones(1))

            def forward(self, x):
                return self.scale * self.body(x)

        with pytest.raises(InputDataError, match="root module"):
            FlatParameters(RootScaled(), "last_layer")
        # a single layer is its own last layer
        assert FlatParameters(nn.Linear(3, 2), "last_layer").num_parameters == 8


class TestCollectionOfASubset:
    def test_last_layer_swag_equals_hand_computed(self):
        x, y = _data()
        snapshots = []
        traj = _train(_mlp(), x, y, "last_layer", observers=[lambda w, d: snapshots.append(w)])
        traj_all = _train(_mlp(), x, y, "all")
        w = torch.stack(snapshots)  # shape: (n, 5), the last layer at every collection
        n = w.shape[0]
        assert n == 8 and traj.num_parameters == 5
        # by hand: mean, population variance, the last K deviations from the running mean
        mean = w.mean(0)
        var = w.var(0, unbiased=False)
        running = torch.cumsum(w, 0) / torch.arange(1, n + 1, dtype=w.dtype)[:, None]
        devs = (w - running)[-5:]
        swag = SWAG.from_trajectory(traj, scale=0.5)
        torch.testing.assert_close(swag.mean, mean)
        torch.testing.assert_close(swag.variance, var)
        torch.testing.assert_close(swag.deviations, devs)
        cov = 0.5 * (torch.diag(var) + devs.T @ devs / (5 - 1))
        torch.testing.assert_close(swag.covariance().to_dense(), cov)
        # "optimise all, collect selected": the same trajectory as collecting every weight
        torch.testing.assert_close(traj.mean, traj_all.mean[-5:])
        torch.testing.assert_close(traj.deviations(), traj_all.deviations()[:, -5:])

    def test_collector_memory_is_of_the_selection(self):
        net = _mlp()
        traj = TrajectoryCollector(net, max_deviations=7, parameters="last_layer")
        assert traj._deviations.shape == (7, 5)
        assert traj.mean.shape == traj.m2.shape == (5,)
        sizes = {k: tuple(v.shape) for k, v in traj.state_dict().items()}
        assert max(max(s, default=0) for s in sizes.values()) == 7
        fa = OnlineFactorAnalysis(traj.num_parameters, 2)
        assert fa.dim == 5

    def test_requires_grad_respects_frozen(self):
        x, y = _data()
        net = _mlp()
        net[0].requires_grad_(False)
        frozen = [p.detach().clone() for p in net[0].parameters()]
        traj = _train(net, x, y, "requires_grad")
        assert traj.flat.names == ["2.weight", "2.bias", "4.weight", "4.bias"]
        assert traj.deviations().shape == (5, 6 * 4 + 4 + 5)
        for p, q in zip(net[0].parameters(), frozen):
            assert torch.equal(p, q)
        assert float(traj.variance.sum()) > 0

    def test_collect_from_pretrained_last_layer(self):
        x, y = _data()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            traj = collect_from_pretrained(
                _mlp(), x, y, OutputLikelihood("gaussian", noise_variance=0.05), epochs=3,
                lr=1e-2, parameters="last_layer", show_progress=False,
            )  # fmt: skip
        assert traj.num_parameters == 5 and traj.num_collected == 3


class TestSubspaceModelOnASubset:
    def _model(self, net, x, y):
        traj = _train(net, x, y, "last_layer")
        pca = PCASubspace(rank=2).fit(traj.deviations(), generator=torch.Generator().manual_seed(0))
        lik = OutputLikelihood("gaussian", noise_variance=0.05)
        return SubspaceModel(net, traj.mean, pca.projection, lik, parameters="last_layer")

    def test_ess_leaves_other_weights_unchanged(self):
        x, y = _data()
        net = _mlp()
        model = self._model(net, x, y)
        before = [p.detach().clone() for p in net.parameters()]
        thetas = model.sample_ess(x, y, 10, generator=torch.Generator().manual_seed(2))
        assert thetas.shape == (10, 2)
        for p, q in zip(net.parameters(), before):
            assert torch.equal(p, q)
        # every prediction uses the network's own first layers and the sampled last layer
        out = model.predict(x, thetas)
        for s in (0, 9):
            work = copy.deepcopy(net)
            FlatParameters(work, "last_layer").assign(model.weights(thetas[s]), work)
            torch.testing.assert_close(out["means"][s], work(x).squeeze(-1))
        weights = model.weights(thetas)
        direct = predict_weight_samples(net, weights, x, model.likelihood, parameters="last_layer")
        torch.testing.assert_close(direct["means"], out["means"])

    def test_state_dict_round_trip(self):
        x, y = _data()
        net = _mlp()
        model = self._model(net, x, y)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.fit_vi(x, y, num_steps=20, check_samples=0, show_progress=False)
        model.temperature = 3.0
        state = model.state_dict()
        other = SubspaceModel(_mlp(seed=5), torch.zeros(5, dtype=torch.float64),
                              torch.zeros(2, 5, dtype=torch.float64), model.likelihood,
                              parameters="last_layer")  # fmt: skip
        other.load_state_dict(state)
        assert other.temperature == 3.0
        thetas = model.sample_vi(4, generator=torch.Generator().manual_seed(0))
        torch.testing.assert_close(
            other.predict(x, thetas)["means"], model.predict(x, thetas)["means"]
        )
        torch.testing.assert_close(other.variational.loc, model.variational.loc)

        # a state of another selection of the same size (4 weights each) is refused
        def four(parameters):
            zeros = torch.zeros(2, 4, dtype=torch.float64)
            return SubspaceModel(_mlp(), zeros[0], zeros, model.likelihood, parameters=parameters)

        four(["2.bias"]).load_state_dict(four(lambda n: n == "2.bias").state_dict())
        with pytest.raises(InputDataError, match="same parameters= selection"):
            four(["4.weight"]).load_state_dict(four(["2.bias"]).state_dict())


def test_last_layer_swag_tuning_and_loader():
    """A last-layer SWAG tuned on held-out rows, its trajectory from a data loader."""
    from torch.utils.data import DataLoader, TensorDataset

    from gpext.subspace import select_swag_scale

    x, y = _data()
    xv, yv = _data(n=32, seed=1)
    net = _mlp()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traj = train_sgd_trajectory(
            net, DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True), None,
            OutputLikelihood("gaussian", noise_variance=0.05), epochs=8, swa_start=3, lr=5e-2,
            max_deviations=5, parameters="last_layer", show_progress=False,
        )  # fmt: skip
    swag = SWAG.from_trajectory(traj)
    sel = select_swag_scale(
        net, swag, xv, yv, OutputLikelihood("gaussian", noise_variance=0.05), num_samples=8,
        generator=torch.Generator().manual_seed(0), parameters="last_layer",
    )  # fmt: skip
    assert sel.samples.shape == (8, 5)

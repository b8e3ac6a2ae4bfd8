"""The data contract of the weight-space family (issue 38): inputs and regression targets are
standardised inside, so scaled copies of a table give the same predictions up to the scale."""

import copy
import io
import math
import warnings

import pytest
import torch
from torch import nn

from gpext.errors import DataWarning, InputDataError
from gpext.nn import (
    MLP,
    HeteroscedasticMLP,
    attach_input_standardization,
    has_input_standardization,
    input_standardization,
    remove_input_standardization,
    standardize_inputs,
)
from gpext.subspace import (
    SWAG,
    FlatParameters,
    MultiSWAG,
    OutputLikelihood,
    PCASubspace,
    SubspaceModel,
    TrainingRecipe,
    collect_from_pretrained,
    predict_weight_samples,
    select_noise_variance,
    train_sgd_trajectory,
)

DT = torch.float64
#: Scaled copies: (input factor, target factor, target offset).
COPIES = [(1e4, 1e6, 3e7), (1.0, 1e-6, 0.0), (1e-3, 1.0, -1e3)]


def _data(n=60, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=DT) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.5 * x[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=DT)
    x_test = torch.rand(25, d, generator=g, dtype=DT) * 4 - 2
    return x, y, x_test


def _net(kind, d=2, batch_norm=False):
    torch.manual_seed(11)
    if batch_norm:
        net = nn.Sequential(nn.Linear(d, 16), nn.BatchNorm1d(16), nn.Tanh(), nn.Linear(16, 2))
    elif kind == "heteroscedastic_gaussian":
        net = HeteroscedasticMLP(d, [16])
    else:
        net = MLP(d, [16], 1)
    return net.to(DT)


def _fit(x, y, kind="heteroscedastic_gaussian", standardize=True, batch_norm=False, seed=2):
    net, lik = _net(kind, x.shape[-1], batch_norm), OutputLikelihood(kind)
    traj = train_sgd_trajectory(
        net, x, y, lik, epochs=40, swa_start=25, lr=1e-2, max_deviations=8,
        generator=torch.Generator().manual_seed(seed), standardize=standardize,
        max_grad_norm=10.0,
    )  # fmt: skip
    return net, lik, traj


def _swag_prediction(net, lik, traj, x, x_test, bn=False):
    w = SWAG.from_trajectory(traj).sample(6, generator=torch.Generator().manual_seed(3))
    return predict_weight_samples(net, w, x_test, lik, bn_inputs=x if bn else None)


def _pca_ess_prediction(net, lik, traj, x, y, x_test):
    proj = PCASubspace(4).fit(traj.deviations(), generator=torch.Generator().manual_seed(4))
    model = SubspaceModel(net, traj.swa_weights(), proj.projection, lik, temperature=15.0)
    thetas = model.sample_ess(x, y, 6, burn_in=4, generator=torch.Generator().manual_seed(5))
    return model.predict(x_test, thetas), model


def _close_up_to_scale(pred, ref, a, b, rtol=1e-3):
    """``pred`` equals ``ref`` mapped by ``y -> a y + b`` (means) and ``v -> a^2 v``."""
    mean = (pred["means"] - b) / a
    span = float(ref["means"].abs().max())
    assert float((mean - ref["means"]).abs().max()) <= rtol * span
    torch.testing.assert_close(pred["variances"] / a**2, ref["variances"], rtol=rtol, atol=0)


@pytest.mark.parametrize("kind", ["heteroscedastic_gaussian", "homoscedastic_gaussian"])
@pytest.mark.parametrize("copy_", COPIES)
def test_scaled_copies_give_scaled_swag_and_pca_ess_predictions(kind, copy_):
    cx, a, b = copy_
    x, y, x_test = _data()
    ref = _fit(x, y, kind)
    ref_swag = _swag_prediction(*ref, x, x_test)
    ref_ess, _ = _pca_ess_prediction(*ref, x, y, x_test)
    net, lik, traj = _fit(x * cx, y * a + b, kind)
    _close_up_to_scale(_swag_prediction(net, lik, traj, x * cx, x_test * cx), ref_swag, a, b)
    pred, model = _pca_ess_prediction(net, lik, traj, x * cx, y * a + b, x_test * cx)
    _close_up_to_scale(pred, ref_ess, a, b)
    # the trajectories are the same: the flat weights do not see the units
    torch.testing.assert_close(traj.mean, ref[2].mean, rtol=1e-6, atol=1e-9)
    assert lik.has_target_transform and math.isclose(lik.target_scale, a * float(y.std()),
                                                     rel_tol=1e-9)  # fmt: skip
    if kind == "homoscedastic_gaussian":  # the learned noise is in standardised units
        assert math.isclose(lik.noise_variance, ref[1].noise_variance, rel_tol=1e-6)
        assert math.isclose(lik.target_noise_variance, a**2 * ref[1].target_noise_variance,
                            rel_tol=1e-6)  # fmt: skip
        # the held-out noise selection too, with its score in the targets' units
        w = traj.swa_weights()[None]
        s1 = select_noise_variance(net, w, x_test * cx, torch.zeros(25, dtype=DT) + b, lik)
        s0 = select_noise_variance(ref[0], ref[2].swa_weights()[None], x_test,
                                   torch.zeros(25, dtype=DT), ref[1])  # fmt: skip
        assert math.isclose(s1.value, s0.value, rel_tol=1e-6)
        assert math.isclose(s1.scores[s1.value], s0.scores[s0.value] - math.log(a),
                            rel_tol=1e-6, abs_tol=1e-6)  # fmt: skip


def test_raw_units_fit_well_by_default_and_not_without():
    """The failure of the issue: targets of sd ~1e6 (SWAG's RMSE 3e4 times too large)."""
    x, y, _ = _data(n=96)
    a, b = 1e6, 3e7
    net, lik, traj = _fit(x * 1e4, y * a + b, "heteroscedastic_gaussian")
    pred = _swag_prediction(net, lik, traj, x * 1e4, x * 1e4)
    rmse = float(((pred["means"].mean(0) - (y * a + b)) ** 2).mean().sqrt())
    assert rmse < 0.5 * a * float(y.std())
    # the opt-out trains on the raw units: far off, or a non-finite loss
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            net0, lik0, traj0 = _fit(x * 1e4, y * a + b, standardize=False)
            old = _swag_prediction(net0, lik0, traj0, x * 1e4, x * 1e4)
            rmse0 = float(((old["means"].mean(0) - (y * a + b)) ** 2).mean().sqrt())
            assert not rmse0 < 0.5 * a * float(y.std())
        except Exception as err:  # noqa: BLE001 - the old behaviour: e.g. NumericalError
            assert "non-finite" in str(err)


@pytest.mark.parametrize("kind", ["heteroscedastic_gaussian", "homoscedastic_gaussian"])
def test_opt_out_is_the_data_as_given(kind):
    x, y, x_test = _data()
    net, lik, traj = _fit(x, y, kind, standardize=False)
    assert not has_input_standardization(net) and not lik.has_target_transform
    assert "gpext_input_loc" not in net.state_dict()
    # the predictions are the raw outputs read by the likelihood without a transform
    pred = _swag_prediction(net, lik, traj, x, x_test)
    w = SWAG.from_trajectory(traj).sample(6, generator=torch.Generator().manual_seed(3))
    out = FlatParameters(net).functional_call(w[0], x_test)
    torch.testing.assert_close(pred["means"][0], out[:, 0], rtol=0, atol=0)
    # the same run as with an explicit identity transform and no input standardisation
    net1, lik1 = _net(kind), OutputLikelihood(kind, target_loc=0.0, target_scale=1.0)
    traj1 = train_sgd_trajectory(
        net1, x, y, lik1, epochs=40, swa_start=25, lr=1e-2, max_deviations=8,
        generator=torch.Generator().manual_seed(2), standardize="targets", max_grad_norm=10.0,
    )  # fmt: skip
    torch.testing.assert_close(traj1.mean, traj.mean, rtol=0, atol=0)
    assert lik1.noise_variance == lik.noise_variance


def test_partial_standardisation_and_bad_values():
    x, y, _ = _data()
    net, lik, _ = _fit(x * 1e4, y, standardize="inputs")
    assert input_standardization(net) is not None and not lik.has_target_transform
    net, lik, _ = _fit(x, y * 1e3, standardize="targets")
    assert not has_input_standardization(net) and lik.has_target_transform
    with pytest.raises(InputDataError, match="standardize"):
        _fit(x, y, standardize="yes")


@pytest.mark.filterwarnings("ignore::gpext.errors.VarianceCollapseWarning")  # 3 epochs
def test_existing_transforms_are_kept():
    """A likelihood with a target transform and a network with a fitted input
    standardisation keep them (a shared likelihood keeps the first training's)."""
    x, y, _ = _data()
    lik = OutputLikelihood("homoscedastic_gaussian", target_loc=5.0, target_scale=2.0)
    net = standardize_inputs(_net("homoscedastic_gaussian"), x[:10])
    loc = input_standardization(net)[0].clone()
    train_sgd_trajectory(net, x, y, lik, epochs=3, swa_start=1)
    assert (lik.target_loc, lik.target_scale) == (5.0, 2.0)
    torch.testing.assert_close(input_standardization(net)[0], loc)


def test_flat_weights_and_sequential_networks_unchanged():
    x, _, _ = _data()
    net = _net(None, batch_norm=True)
    names = [n for n, _ in net.named_parameters()]
    d = FlatParameters(net).num_parameters
    standardize_inputs(net, x * 1e4 + 7)
    assert [n for n, _ in net.named_parameters()] == names
    assert FlatParameters(net).num_parameters == d
    assert len(net) == 4  # no layer added to the Sequential
    loc, scale = input_standardization(net)
    torch.testing.assert_close(loc, (x * 1e4 + 7).mean(0))
    torch.testing.assert_close(scale, (x * 1e4 + 7).std(0))
    net.eval()
    z = (x * 1e4 + 7 - loc) / scale
    torch.testing.assert_close(
        net(x * 1e4 + 7), remove_input_standardization(copy.deepcopy(net))(z)
    )


def test_batch_norm_network_scaled_copy():
    x, y, x_test = _data()
    ref = _fit(x, y, batch_norm=True)
    ref_pred = _swag_prediction(*ref, x, x_test, bn=True)
    a, b = 1e6, 3e7
    net, lik, traj = _fit(x * 1e4, y * a + b, batch_norm=True)
    pred = _swag_prediction(net, lik, traj, x * 1e4, x_test * 1e4, bn=True)
    _close_up_to_scale(pred, ref_pred, a, b)
    # and the subspace model's refresh at the centre
    _, m0 = _pca_ess_prediction(*ref, x, y, x_test)
    _, m1 = _pca_ess_prediction(net, lik, traj, x * 1e4, y * a + b, x_test * 1e4)
    for key, value in m0.bn_buffers.items():
        if "running" in key:
            torch.testing.assert_close(m1.bn_buffers[key], value, rtol=1e-6, atol=1e-9)


def test_multiswag_scaled_copy():
    x, y, x_test = _data()
    a, b = 1e-6, 2.0

    def predict(xs, ys, xt):
        runs = [_fit(xs, ys, seed=s) for s in (2, 3)]
        post = MultiSWAG([SWAG.from_trajectory(r[2]) for r in runs])
        w = post.sample(6, generator=torch.Generator().manual_seed(3))
        return predict_weight_samples(runs[0][0], w, xt, runs[0][1])

    _close_up_to_scale(predict(x * 1e4, y * a + b, x_test * 1e4), predict(x, y, x_test), a, b)


def test_training_recipe_and_loader_fit_the_same_statistics():
    x, y, _ = _data()
    recipe = TrainingRecipe(4, 10, 1e-2, 1e-3, 2)
    net, lik = _net("heteroscedastic_gaussian"), OutputLikelihood("heteroscedastic_gaussian")
    recipe.train(net, x * 1e4, y * 1e6, lik)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x * 1e4, y * 1e6),
                                         batch_size=16)  # fmt: skip
    net2, lik2 = _net("heteroscedastic_gaussian"), OutputLikelihood("heteroscedastic_gaussian")
    train_sgd_trajectory(net2, loader, None, lik2, epochs=2, swa_start=1)
    torch.testing.assert_close(input_standardization(net2)[0], input_standardization(net)[0])
    torch.testing.assert_close(input_standardization(net2)[1], input_standardization(net)[1])
    assert math.isclose(lik2.target_loc, lik.target_loc) and lik2.target_scale == lik.target_scale
    net3, lik3 = _net("heteroscedastic_gaussian"), OutputLikelihood("heteroscedastic_gaussian")
    recipe.train(net3, x, y, lik3, standardize=False)
    assert not has_input_standardization(net3) and not lik3.has_target_transform


def test_categorical_inputs_standardised_labels_untouched():
    x, y, x_test = _data()
    labels = (y > 0).long()

    def probs(cx):
        torch.manual_seed(11)
        net = MLP(2, [16], 2).to(DT)
        lik = OutputLikelihood("categorical")
        traj = train_sgd_trajectory(net, x * cx, labels, lik, epochs=30, swa_start=20,
                                    generator=torch.Generator().manual_seed(2))  # fmt: skip
        assert not lik.has_target_transform
        w = SWAG.from_trajectory(traj).sample(4, generator=torch.Generator().manual_seed(3))
        return predict_weight_samples(net, w, x_test * cx, lik)["probs"]

    torch.testing.assert_close(probs(1e4), probs(1.0), rtol=1e-5, atol=1e-7)


def test_state_round_trips():
    x, y, x_test = _data()
    a, b = 1e6, 3e7
    net, lik, traj = _fit(x * 1e4, y * a + b, "homoscedastic_gaussian")
    pred, model = _pca_ess_prediction(net, lik, traj, x * 1e4, y * a + b, x_test * 1e4)
    thetas = torch.zeros(1, model.rank, dtype=DT)
    expected = model.predict(x_test * 1e4, thetas)
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    fresh_lik = OutputLikelihood("homoscedastic_gaussian")
    fresh = SubspaceModel(_net("homoscedastic_gaussian"), model.center, model.projection,
                          fresh_lik)  # fmt: skip
    fresh.load_state_dict(torch.load(buf, weights_only=False))
    got = fresh.predict(x_test * 1e4, thetas)
    torch.testing.assert_close(got["means"], expected["means"])
    torch.testing.assert_close(got["variances"], expected["variances"])
    assert (fresh_lik.target_loc, fresh_lik.target_scale) == (lik.target_loc, lik.target_scale)
    assert fresh_lik.noise_variance == lik.noise_variance
    # the network alone: a freshly built one takes the statistics after attaching
    net2 = attach_input_standardization(_net("homoscedastic_gaussian"))
    net2.load_state_dict(net.state_dict())
    net.eval(), net2.eval()
    torch.testing.assert_close(net2(x_test * 1e4), net(x_test * 1e4))
    # deep copies standardise with their own statistics
    net3 = copy.deepcopy(net)
    torch.testing.assert_close(net3(x_test * 1e4), net(x_test * 1e4))
    net3.load_state_dict(net2.state_dict())
    # the likelihood's own state
    lik2 = OutputLikelihood("homoscedastic_gaussian").load_state_dict(lik.state_dict())
    torch.testing.assert_close(lik2.mean_variance(torch.ones(3, 1, dtype=DT))[0],
                               lik.mean_variance(torch.ones(3, 1, dtype=DT))[0])  # fmt: skip
    with pytest.raises(InputDataError):
        OutputLikelihood("gaussian").load_state_dict(lik.state_dict())


def test_likelihood_target_transform_definitions():
    lik = OutputLikelihood("heteroscedastic_gaussian", target_loc=3.0, target_scale=2.0)
    out = torch.tensor([[0.5, 0.1], [-1.0, 2.0]], dtype=DT)
    m, v = lik.standardized_mean_variance(out)
    mean, var = lik.mean_variance(out)
    torch.testing.assert_close(mean, 3.0 + 2.0 * m)
    torch.testing.assert_close(var, 4.0 * v)
    y = torch.tensor([4.0, 0.0], dtype=DT)
    expected = torch.distributions.Normal(mean, var.sqrt()).log_prob(y)
    torch.testing.assert_close(lik.log_prob(out, y), expected)
    with pytest.raises(InputDataError):
        OutputLikelihood("gaussian", target_loc=1.0)
    with pytest.raises(InputDataError):
        OutputLikelihood("gaussian").set_target_transform(0.0, 0.0)
    with pytest.raises(InputDataError):
        OutputLikelihood("categorical").set_target_transform(0.0, 1.0)
    with pytest.warns(DataWarning, match="constant"):
        const = OutputLikelihood("gaussian").fit_target_transform(torch.full((5,), 7.0))
    assert (const.target_loc, const.target_scale) == (7.0, 1.0)


def test_collect_from_pretrained_keeps_the_units_it_was_trained_in():
    x, y, _ = _data()
    net, lik, _ = _fit(x * 1e4, y * 1e6, "homoscedastic_gaussian")
    state = (input_standardization(net)[0].clone(), lik.target_loc, lik.target_scale)
    traj = collect_from_pretrained(net, x * 1e4, y * 1e6, lik, epochs=3, lr=1e-3,
                                   generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert traj.num_collected == 3
    torch.testing.assert_close(input_standardization(net)[0], state[0])
    assert (lik.target_loc, lik.target_scale) == state[1:]
    # a network pretrained without gpext stays as it is by default
    plain, plik = _net("homoscedastic_gaussian"), OutputLikelihood("homoscedastic_gaussian")
    collect_from_pretrained(plain, x, y, plik, epochs=2, lr=1e-3)
    assert not has_input_standardization(plain) and not plik.has_target_transform


def test_fixed_noise_is_kept_in_the_targets_units():
    """A fixed noise (``"gaussian"``) is the user's, in the targets' units (as BoTorch's
    Standardize transforms a known noise); a learned one starts at 1 in standardised units."""
    x, y, x_test = _data()
    a = 1e3

    def run(ys, noise):
        torch.manual_seed(11)
        net, lik = MLP(2, [16], 1).to(DT), OutputLikelihood("gaussian", noise_variance=noise)
        traj = train_sgd_trajectory(net, x, ys, lik, epochs=30, swa_start=20, max_grad_norm=10.0,
                                    generator=torch.Generator().manual_seed(2))  # fmt: skip
        return lik, _swag_prediction(net, lik, traj, x, x_test)

    lik0, ref = run(y, 0.05)
    lik1, pred = run(y * a, 0.05 * a**2)
    assert math.isclose(lik1.target_noise_variance, 0.05 * a**2, rel_tol=1e-12)
    assert math.isclose(lik1.noise_variance, 0.05 / float(y.std()) ** 2, rel_tol=1e-9)
    _close_up_to_scale(pred, ref, a, 0.0)
    # the state round trip does not convert it twice
    again = OutputLikelihood("gaussian").load_state_dict(lik1.state_dict())
    assert math.isclose(again.target_noise_variance, lik1.target_noise_variance, rel_tol=1e-12)

"""``construct_inputs``, constructors Ax can call, adapters built from data, state-dict take-over.

BoTorch only; the Ax run itself is in ``test_ax_integration.py``.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch
from botorch.models.transforms.input import Normalize
from botorch.models.transforms.outcome import Standardize
from botorch.utils.datasets import SupervisedDataset

from gpext.bootstrap import VBootMLP, VBootRFF
from gpext.errors import DataWarning, InputDataError, InputTypeError, NotFittedError, ShapeError
from gpext.integrations.botorch import (
    DirichletClassifierSurrogate,
    GWISurrogate,
    IGNSurrogate,
    VBootSurrogate,
    WeightEnsembleSurrogate,
    fit_gpext_surrogate,
)
from gpext.integrations.botorch.ax_support import (
    ax_fit_defaults,
    fit_ax_surrogate,
    register_ax_fit_if_loaded,
)
from gpext.models import GWIRegressionModel, InducingGPNetwork
from gpext.nn import MLP, InputAugmentedEmbedding

REGRESSION = (IGNSurrogate, GWISurrogate, VBootSurrogate, WeightEnsembleSurrogate)
# small fits: the defaults are for real designs
FIT = {
    IGNSurrogate: {"epochs": 5, "batch_size": 8},
    GWISurrogate: {"epochs": 3, "from_data": {"prior_steps": 5}},
    VBootSurrogate: {},
    WeightEnsembleSurrogate: {"epochs": 12, "swa_epochs": 4, "num_samples": 4},
    DirichletClassifierSurrogate: {"max_iter": 5},
}
OPTIONS = {
    IGNSurrogate: {"hidden_features": (8,), "feature_dim": 3, "num_inducing": 6},
    VBootSurrogate: {"num_features": 32, "num_particles": 4, "hyper_iters": 5},
}


def dataset(n: int = 12, d: int = 2, m: int = 1, dtype=torch.float64, yvar: bool = False):
    g = torch.Generator().manual_seed(n)
    X = (torch.rand(n, d, generator=g, dtype=torch.float64) * 15.0 - 5.0).to(dtype)
    Y = torch.cat([torch.sin(X[:, :1] / 3.0) + j * X[:, 1:2] / 10 for j in range(m)], dim=-1)
    return SupervisedDataset(
        X,
        Y,
        Yvar=torch.full_like(Y, 0.01) if yvar else None,
        feature_names=[f"x{i}" for i in range(d)],
        outcome_names=[f"y{j}" for j in range(m)],
    )


def build(cls, data, **kwargs):
    torch.manual_seed(0)
    return cls(**cls.construct_inputs(data, **OPTIONS.get(cls, {})), **kwargs)


@pytest.mark.parametrize("cls", REGRESSION, ids=lambda c: c.__name__)
def test_ax_sees_transform_arguments(cls):
    # Ax checks `inspect.getfullargspec(cls).args` (keyword-only arguments are not in it)
    args = inspect.getfullargspec(cls).args
    assert "input_transform" in args and "outcome_transform" in args
    assert "input_transform" in inspect.getfullargspec(DirichletClassifierSurrogate).args


@pytest.mark.parametrize("cls", REGRESSION, ids=lambda c: c.__name__)
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
def test_construct_inputs_then_fit(cls, dtype):
    data = dataset(dtype=dtype)
    kwargs = cls.construct_inputs(data, **OPTIONS.get(cls, {}))
    assert kwargs["train_X"] is data.X and kwargs["train_Y"] is data.Y
    model = build(cls, data, input_transform=Normalize(2), outcome_transform=Standardize(1))
    model = fit_gpext_surrogate(model, generator=torch.Generator().manual_seed(0), **FIT[cls])
    post = model.posterior(data.X[:5].unsqueeze(-2))
    assert post.mean.shape == (5, 1, 1) and post.mean.dtype == dtype
    assert bool(torch.isfinite(post.mean).all()) and bool((post.variance > 0).all())


def test_ign_construct_inputs_defaults_and_options():
    data = dataset(n=10, d=3)
    model = IGNSurrogate.construct_inputs(data)["model"]
    assert isinstance(model, InducingGPNetwork) and model.task == "regression"
    assert isinstance(model.embedding, InputAugmentedEmbedding)
    assert model.embedding.in_features == 3 and model.gp.num_inducing == 10  # min(16, n)
    assert next(model.parameters()).dtype == torch.float64
    bare = IGNSurrogate.construct_inputs(data, input_augmented=False, num_inducing=4)["model"]
    assert isinstance(bare.embedding, MLP) and bare.gp.num_inducing == 4
    own = MLP(3, [4], 2)
    assert IGNSurrogate.construct_inputs(data, embedding=own)["model"].embedding is own


def test_vboot_construct_inputs_kinds():
    data = dataset()
    rff = VBootSurrogate.construct_inputs(data)["model"]
    assert isinstance(rff, VBootRFF) and rff.num_particles == 32
    mlp = VBootSurrogate.construct_inputs(data, ensemble="mlp", num_particles=3)["model"]
    assert isinstance(mlp, VBootMLP)
    with pytest.raises(InputDataError, match="'rff' or 'mlp'"):
        VBootSurrogate.construct_inputs(data, ensemble="gp")
    two = VBootSurrogate.construct_inputs(dataset(m=2), **OPTIONS[VBootSurrogate])
    assert VBootSurrogate(**two).num_outputs == 2


@pytest.mark.parametrize("cls", REGRESSION, ids=lambda c: c.__name__)
def test_construct_inputs_input_errors(cls):
    with pytest.raises(InputTypeError, match="SupervisedDataset"):
        cls.construct_inputs((torch.zeros(3, 2), torch.zeros(3, 1)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cls.construct_inputs(dataset(yvar=True), **OPTIONS.get(cls, {}))
    assert any(issubclass(w.category, DataWarning) for w in caught)
    if cls is not VBootSurrogate:
        with pytest.raises(ShapeError, match="one outcome"):
            cls.construct_inputs(dataset(m=2), **OPTIONS.get(cls, {}))


@pytest.mark.parametrize("cls", (GWISurrogate, WeightEnsembleSurrogate), ids=lambda c: c.__name__)
def test_adapters_built_at_fit_time(cls):
    data = dataset()
    with pytest.raises(InputDataError, match="at fit time"):
        cls.construct_inputs(data, epochs=3)
    model = cls(**cls.construct_inputs(data))
    with pytest.raises(NotFittedError):
        model.posterior(data.X[:2].unsqueeze(-2))
    with pytest.raises(InputDataError):
        cls()  # neither a model nor data
    with pytest.raises(ShapeError):
        cls(train_X=data.X, train_Y=torch.cat([data.Y, data.Y], -1))


def test_gwi_built_from_transformed_data():
    data = dataset()
    model = GWISurrogate(
        train_X=data.X,
        train_Y=data.Y,
        input_transform=Normalize(2),
        outcome_transform=Standardize(1),
    )
    fit_gpext_surrogate(model, generator=torch.Generator().manual_seed(0), **FIT[GWISurrogate])
    assert isinstance(model.model, GWIRegressionModel)
    z = model.model.variational_strategy.inducing_points  # a subset of the normalised inputs,
    z = model.model.standardizer.untransform_inputs(z)  # kept standardised inside the model
    assert float(z.min()) >= -1e-12 and float(z.max()) <= 1.0 + 1e-12
    with pytest.raises(InputDataError, match="from_data"):
        fit_gpext_surrogate(model, epochs=1, from_data={"prior_steps": 1}).posterior(data.X)
    gwi, lik = GWIRegressionModel.from_data(data.X, data.Y.squeeze(-1), prior_steps=2)
    with pytest.raises(InputDataError, match="train_X and train_Y and no likelihood"):
        GWISurrogate(None, lik, train_X=data.X, train_Y=data.Y)


def test_weight_ensemble_built_from_transformed_data():
    data = dataset()
    model = WeightEnsembleSurrogate(
        train_X=data.X,
        train_Y=data.Y,
        input_transform=Normalize(2),
        outcome_transform=Standardize(1),
    )
    fit_gpext_surrogate(
        model, generator=torch.Generator().manual_seed(0), **FIT[WeightEnsembleSurrogate]
    )
    assert model.num_members == 4 and model._input_dim == 2
    assert model.train_X is data.X and isinstance(model.input_transform, Normalize)
    mean = model.posterior(data.X.unsqueeze(-2)).mean.squeeze()  # in original units
    assert abs(float(mean.mean() - data.Y.mean())) < 3.0 * float(data.Y.std())
    with pytest.raises(InputDataError, match="input_transform"):
        fit_gpext_surrogate(model, input_transform=Normalize(2))
    with pytest.raises(InputDataError, match="module=None, weights=None"):
        WeightEnsembleSurrogate(model.model, model.sample_weights, train_X=data.X, train_Y=data.Y)


def test_dirichlet_construct_inputs():
    x = dataset().X
    labels = (x.sum(-1, keepdim=True) > 2.5).to(x) * 2.0  # classes 0 and 2
    data = SupervisedDataset(x, labels, feature_names=["a", "b"], outcome_names=["c"])
    kwargs = DirichletClassifierSurrogate.construct_inputs(data)
    assert kwargs["model"].num_classes == 3
    model = fit_gpext_surrogate(
        DirichletClassifierSurrogate(**kwargs), **FIT[DirichletClassifierSurrogate]
    )
    assert model.class_probabilities(x[:4].unsqueeze(-2)).shape == (4, 1, 3)
    assert (
        DirichletClassifierSurrogate.construct_inputs(data, num_classes=4)["model"].num_classes == 4
    )
    bad = SupervisedDataset(x, labels + 0.5, feature_names=["a", "b"], outcome_names=["c"])
    with pytest.raises(InputDataError, match="whole numbers"):
        DirichletClassifierSurrogate.construct_inputs(bad)


@pytest.mark.parametrize("cls", REGRESSION, ids=lambda c: c.__name__)
def test_state_dict_of_a_fitted_adapter_loads_into_one_built_from_other_data(cls):
    # Ax's cross-validation: an adapter built on a fold takes the fitted model's state
    full, fold = dataset(n=12), dataset(n=12)
    fold = SupervisedDataset(
        full.X[:7], full.Y[:7], feature_names=full.feature_names, outcome_names=full.outcome_names
    )
    fitted = fit_gpext_surrogate(
        build(cls, full), generator=torch.Generator().manual_seed(0), **FIT[cls]
    )
    other = build(cls, fold)
    other.load_state_dict(fitted.state_dict())
    assert other.train_X.shape == (7, 2) and other.model is not fitted.model
    Xq = full.X[8:].unsqueeze(-2)
    torch.testing.assert_close(other.posterior(Xq).mean, fitted.posterior(Xq).mean)
    torch.testing.assert_close(other.posterior(Xq).variance, fitted.posterior(Xq).variance)
    fitted.load_state_dict(fitted.state_dict())  # its own state: unchanged
    wrong = IGNSurrogate if cls is not IGNSurrogate else VBootSurrogate
    with pytest.raises(InputTypeError, match="state_dict"):
        build(wrong, fold).load_state_dict(fitted.state_dict())


def test_fit_ax_surrogate_defaults_and_options(monkeypatch):
    model = build(IGNSurrogate, dataset())
    assert ax_fit_defaults(model) == {"epochs": 100, "batch_size": 16, "lr": 1e-2}
    assert ax_fit_defaults(build(VBootSurrogate, dataset())) == {}
    # epochs are a lower bound of the step budget; min_steps=0 leaves only the epochs
    fit_ax_surrogate(model, None, {"epochs": 3, "min_steps": 0})
    assert len(model.model.fit_result_.losses) <= 3 * 2  # 3 epochs of at most 2 batches
    with pytest.raises(InputTypeError):
        fit_ax_surrogate(torch.nn.Linear(2, 1))
    with pytest.raises(InputTypeError):
        fit_ax_surrogate(model, None, [("epochs", 3)])
    # without Ax loaded, construct_inputs registers nothing and imports nothing
    monkeypatch.delitem(
        __import__("sys").modules, "ax.generators.torch.botorch_modular.utils", raising=False
    )
    assert register_ax_fit_if_loaded() is False


FIT_KW_RFF = {"num_features": 32, "num_particles": 4, "hyper_iters": 5}


def test_vboot_mlp_small_designs_get_a_small_network_and_calibration():
    from gpext.integrations.botorch.vboot_surrogate import SMALL_DESIGN_HIDDEN_SIZES

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, dtype=torch.float64, generator=gen)
    y = (6 * x).sin().sum(-1, keepdim=True)
    data = SupervisedDataset(x, y, feature_names=["a", "b"], outcome_names=["y"])
    inputs = VBootSurrogate.construct_inputs(data, ensemble="mlp", num_particles=3)
    assert isinstance(inputs["model"], VBootMLP)
    assert inputs["model"].hidden_sizes == SMALL_DESIGN_HIDDEN_SIZES
    xl = torch.rand(250, 2, dtype=torch.float64, generator=gen)
    large = SupervisedDataset(xl, xl.sum(-1, keepdim=True), feature_names=["a", "b"],
                              outcome_names=["y"])  # fmt: skip
    assert VBootSurrogate.construct_inputs(large, ensemble="mlp")["model"].hidden_sizes == (
        512,
        512,
    )
    model = fit_gpext_surrogate(VBootSurrogate(**inputs, outcome_transform=Standardize(1)),
                                num_epochs=50)  # fmt: skip
    cal = model.variance_calibration
    assert cal is not None and cal.num_folds == 5 and cal.scale >= 1.0
    assert model.epistemic_scale == cal.scale
    # the calibrated spread is the members' spread about their mean times sqrt(kappa)
    xq = torch.rand(7, 2, dtype=torch.float64, generator=gen)
    with torch.no_grad():
        members = model.model(model.transform_inputs(xq))[..., 0]  # (S, 7), standardised
        values = model.posterior(xq.unsqueeze(0)).values[0, :, :, 0]  # (S, 7), original units
    sd = model.outcome_transform.stdvs.squeeze()
    # then combined with the outcome's prior (PriorReversion, test_prior_reversion.py):
    # var' = v0 V / (v0 + V) with V = kappa * members' variance
    assert cal.prior_reversion and model.prior_reversion is not None
    V = cal.scale * members.var(0)
    v0 = model.prior_reversion.prior_sd.square()
    torch.testing.assert_close(values.var(0), v0 * V / (v0 + V) * sd**2, rtol=1e-6, atol=1e-9)
    plain = fit_gpext_surrogate(
        VBootSurrogate(**VBootSurrogate.construct_inputs(data, ensemble="mlp", num_particles=3)),
        num_epochs=50, calibrate=False,
    )  # fmt: skip
    assert plain.variance_calibration is None and plain.epistemic_scale == 1.0
    # calibration is available for the RFF ensemble too (it was an AttributeError)
    rff = VBootSurrogate(**VBootSurrogate.construct_inputs(data, **FIT_KW_RFF))
    rff = fit_gpext_surrogate(rff, calibrate=True)
    assert rff.variance_calibration.num_folds == 5

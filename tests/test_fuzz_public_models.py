"""Fuzz test of the input contract (issue 20 item 5): every public model, bad inputs, gpext errors.

Each public model class of ``gpext.models``, ``gpext.bootstrap``, ``gpext.subspace`` and
``gpext.operators`` is driven through its fit and predict entry points with bad inputs (NaN, Inf,
wrong ndim, empty, mismatched N, float16, labels out of range) and must raise a
:class:`gpext.errors.GpextError` subclass (never a bare torch/numpy error or an ``assert``); good
inputs given as numpy arrays, Python lists or integer tensors must work, and predicting before
fitting must raise :class:`~gpext.errors.NotFittedError`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import gpytorch
import numpy as np
import pytest
import torch
from torch import nn

from gpext.bootstrap import EnsembleMLP, VBootMLP, VBootRFF
from gpext.errors import (
    GpextError,
    GpextWarning,
    InputDataError,
    InputTypeError,
    NotFittedError,
    ShapeError,
)
from gpext.models import (
    DirichletGPClassifier,
    GWIClassificationModel,
    GWIRegressionModel,
    InducingGPNetwork,
)
from gpext.nn import MLP
from gpext.operators import IncrementalKPCA
from gpext.subspace import (
    SWAG,
    FlatParameters,
    MeanFieldGaussian,
    MultiSWAG,
    OnlineFactorAnalysis,
    OutputLikelihood,
    SubspaceModel,
)

N, D, C = 24, 2, 3


def _data(dtype=torch.float64, classification=False):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=dtype)
    if classification:
        y = torch.arange(N) % C
    else:
        y = torch.sin(x[:, 0]) + 0.1 * torch.randn(N, generator=g, dtype=dtype)
    return x, y


@dataclass
class Case:
    """How to build, fit and predict with one public model."""

    name: str
    make: Callable[[], object]
    fit: Callable[[object, object, object], object]
    predict: Callable[[object, object], object]
    dtype: torch.dtype = torch.float64
    classification: bool = False
    marks: list = field(default_factory=list)
    #: label -> expected error where it differs from the default (``None``: accepted)
    fit_overrides: dict = field(default_factory=dict)
    predict_overrides: dict = field(default_factory=dict)
    #: integer tensors are converted to the model's dtype (else passed on as they are)
    converts_integers: bool = True
    #: further entry points of a fitted model, called as ``f(model, x, y)``
    extra: dict = field(default_factory=dict)


def _gwi_reg_make():
    return {}


def _gwi_reg_fit(state, x, y):
    model, lik = GWIRegressionModel.from_data(x, y, num_inducing=8, prior_steps=2)
    model.fit(lik, x, y, epochs=1)
    state.update(model=model, lik=lik)


def _gwi_unfitted(cls, likelihood):
    z = torch.randn(8, D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    return cls(z, kernel), likelihood.double()


def _gwi_reg_predict(state, x):
    if "model" not in state:  # constructed, not fitted
        model, lik = _gwi_unfitted(GWIRegressionModel, gpytorch.likelihoods.GaussianLikelihood())
        return model.predict(lik, x)
    return state["model"].predict(state["lik"], x)[0]


def _gwi_clf_fit(state, x, y):
    model, lik = GWIClassificationModel.from_data(x, y, C, num_inducing=8, prior_steps=2)
    model.fit(lik, x, y, epochs=1)
    state.update(model=model, lik=lik)


def _gwi_clf_predict(state, x):
    if "model" not in state:
        from gpext.likelihoods import RobustMaxLikelihood

        model, lik = _gwi_unfitted(GWIClassificationModel, RobustMaxLikelihood(C))
        return model.predict_proba(lik, x)
    return state["model"].predict_proba(state["lik"], x)


def _gwi_select_temperature(state, x, y):
    return state["model"].select_temperature(state["lik"], x, y, temperatures=[0.5, 1.0])


def _thetas(model):
    return model.sample_vi(3, generator=torch.Generator().manual_seed(0))


def _subspace_make(dtype=torch.float64):
    net = nn.Linear(D, 1).to(dtype)
    flat = FlatParameters(net)
    g = torch.Generator().manual_seed(1)
    proj = torch.randn(2, flat.num_parameters, generator=g, dtype=dtype)
    return SubspaceModel(
        net, flat.flatten(), proj, OutputLikelihood("gaussian", noise_variance=0.1)
    )


def _subspace_predict(model, x):
    return model.predict(x, model.sample_vi(3, generator=torch.Generator().manual_seed(0)))["means"]


CASES = [
    Case(
        "DirichletGPClassifier",
        lambda: DirichletGPClassifier(num_classes=C),
        lambda m, x, y: m.fit(x, y, max_iter=2),
        lambda m, x: m.predict_proba(x, num_samples=8),
        classification=True,
        extra={"get_fantasy_model": lambda m, x, y: m.get_fantasy_model(x, y)},
    ),
    Case(
        "DirichletGPClassifier-sparse",
        lambda: DirichletGPClassifier(num_classes=C, num_inducing=6),
        lambda m, x, y: m.fit(x, y, max_iter=2),
        lambda m, x: m.predict_latent(x)[0],
        classification=True,
    ),
    Case(
        "GWIRegressionModel",
        _gwi_reg_make,
        _gwi_reg_fit,
        _gwi_reg_predict,
        extra={"select_temperature": _gwi_select_temperature},
    ),  # fmt: skip
    Case(
        "GWIClassificationModel",
        _gwi_reg_make,
        _gwi_clf_fit,
        _gwi_clf_predict,
        classification=True,
        extra={"select_temperature": _gwi_select_temperature},
    ),  # fmt: skip
    Case(
        "InducingGPNetwork",
        lambda: InducingGPNetwork(MLP(D, [8], 2), num_inducing=4),
        lambda m, x, y: m.fit(x, y, epochs=1),
        lambda m, x: m.predict(x)[0],
        dtype=torch.float32,
    ),
    Case(
        "VBootMLP",
        lambda: VBootMLP(num_particles=2, hidden_sizes=(8,), dtype=torch.float64),
        lambda m, x, y: m.fit(x, y, num_epochs=1),
        lambda m, x: m(x),
        fit_overrides={"x-float16": InputDataError},  # pinned by tests/bootstrap
        extra={"predict_mixture": lambda m, x, y: m.predict_mixture(x)},
    ),
    Case(
        "VBootMLP-classification",
        lambda: VBootMLP(2, (8,), task="classification", num_classes=C, dtype=torch.float64),
        lambda m, x, y: m.fit(x, y, num_epochs=1),
        lambda m, x: m.predict_proba(x),
        classification=True,
        fit_overrides={"x-float16": InputDataError},
    ),
    Case(
        "VBootRFF",
        lambda: VBootRFF(16, 2, lengthscale=1.0, outputscale=1.0, mean=0.0, noise=0.1),
        lambda m, x, y: m.fit(x, y, generator=torch.Generator().manual_seed(0)),
        lambda m, x: m(x),
        fit_overrides={"x-float16": InputDataError},
        extra={
            "features": lambda m, x, y: m.features(x),
            "predict_mixture": lambda m, x, y: m.predict_mixture(x),
        },
    ),
    Case(
        "VBootRFF-classification",
        lambda: VBootRFF(
            16, 2, task="classification", num_classes=C, lengthscale=1.0, outputscale=1.0
        ),
        lambda m, x, y: m.fit(x, y, generator=torch.Generator().manual_seed(0)),
        lambda m, x: m.predict_proba(x),
        classification=True,
        fit_overrides={"x-float16": InputDataError},
    ),
    Case(
        "SubspaceModel",
        _subspace_make,
        lambda m, x, y: m.fit_vi(x, y, num_steps=2, map_max_iter=2, check_samples=0),
        _subspace_predict,
        # any network: x is (N, ...), so a 1-D x is one the network cannot evaluate
        fit_overrides={"x-1d": InputDataError},
        predict_overrides={"x-1d": InputDataError, "x-wrong-d": InputDataError},
        converts_integers=False,  # integer inputs (e.g. token indices) go to the network as is
        extra={
            "sample_ess": lambda m, x, y: m.sample_ess(x, y, 2),
            "calibrate_variance": lambda m, x, y: m.calibrate_variance(x, y, _thetas(m)),
            "check_fit": lambda m, x, y: m.check_fit(x, y, _thetas(m)),
            "select_temperature": lambda m, x, y: m.select_temperature(
                *_data(), x, y, temperatures=[1.0], num_samples=2, burn_in=0
            ),
        },
    ),
    Case(
        "IncrementalKPCA",
        lambda: IncrementalKPCA(gpytorch.kernels.RBFKernel()),
        lambda m, x, y: m.fit(x),
        lambda m, x: m.transform(x),
        predict_overrides={"x-other-float": None},  # converted to the declared dtype
        extra={
            "update": lambda m, x, y: m.update(x),
            "nystrom": lambda m, x, y: m.nystrom(x),
        },
    ),
]


def _np(t):
    return t.numpy()


def _run_fit(case, x, y):
    model = case.make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpextWarning)
        case.fit(model, x, y)
    return model


def _fitted(case):
    x, y = _data(case.dtype, case.classification)
    return _run_fit(case, x, y)


def _bad_fit_inputs(case):
    """(label, x, y, expected error) for fit."""
    x, y = _data(case.dtype, case.classification)
    bad = []
    x_nan = x.clone()
    x_nan[3, 1] = float("nan")
    x_inf = x.clone()
    x_inf[0, 0] = float("inf")
    bad += [
        ("x-nan", x_nan, y, InputDataError),
        ("x-inf", x_inf, y, InputDataError),
        ("x-1d", x[:, 0], y, ShapeError),
        ("x-3d", x[None], y, ShapeError),
        ("empty", x[:0], y[:0], InputDataError),
        ("x-float16", x.to(torch.float16), y, InputTypeError),
        ("x-bool", x > 0, y, InputTypeError),
        ("x-string", "abc", y, GpextError),
    ]
    if case.name != "IncrementalKPCA":  # unsupervised: no targets
        bad.append(("mismatched-n", x, y[:-2], ShapeError))
        if case.classification:
            bad.append(("label-too-large", x, torch.where(y == 0, C, y), InputDataError))
            bad.append(("label-negative", x, torch.where(y == 0, -1, y), InputDataError))
            bad.append(("label-fractional", x, y.to(x.dtype) + 0.5, InputTypeError))
        else:
            y_nan = y.clone()
            y_nan[2] = float("nan")
            bad.append(("y-nan", x, y_nan, InputDataError))
    return bad


FIT_PARAMS = [
    pytest.param(
        case,
        label,
        x,
        y,
        case.fit_overrides.get(label, err),
        id=f"{case.name}-{label}",
        marks=case.marks,
    )  # fmt: skip
    for case in CASES
    for label, x, y, err in _bad_fit_inputs(case)
]


@pytest.mark.parametrize(("case", "label", "x", "y", "err"), FIT_PARAMS)
def test_fit_rejects_bad_inputs(case, label, x, y, err):
    with pytest.raises(err):
        _run_fit(case, x, y)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=c.marks) for c in CASES])
def test_fit_and_predict_accept_numpy_lists_and_integers(case):
    x, y = _data(case.dtype, case.classification)
    model = _run_fit(case, _np(x), _np(y))
    ref = case.predict(model, x[:5])
    for x_alt in (_np(x[:5]), x[:5].tolist(), np.asarray(x[:5], dtype=np.float32)):
        out = case.predict(model, x_alt)
        assert isinstance(out, torch.Tensor) and out.shape == ref.shape
    # integer inputs are converted to the model's dtype
    ints = torch.ones(2, D, dtype=torch.long)
    if case.converts_integers:
        assert torch.isfinite(case.predict(model, ints)).all()
    else:  # passed on to the network, which cannot take them here: still a gpext error
        with pytest.raises(GpextError):
            case.predict(model, ints)
    _run_fit(case, x.tolist(), y.tolist())


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name, marks=c.marks) for c in CASES])
def test_predict_before_fit_raises_not_fitted(case):
    x, _ = _data(case.dtype, case.classification)
    with pytest.raises(NotFittedError):
        case.predict(case.make(), x[:3])


def _bad_predict_inputs(case):
    x, _ = _data(case.dtype, case.classification)
    x_nan = x[:4].clone()
    x_nan[1, 0] = float("nan")
    x_inf = x[:4].clone()
    x_inf[1, 1] = -float("inf")
    other = torch.float32 if case.dtype == torch.float64 else torch.float64
    return [
        ("x-nan", x_nan, InputDataError),
        ("x-inf", x_inf, InputDataError),
        ("x-1d", x[:4, 0], ShapeError),
        ("x-3d", x[None, :4], ShapeError),
        ("x-wrong-d", torch.ones(4, D + 1, dtype=case.dtype), ShapeError),
        ("empty", x[:0], InputDataError),
        ("x-float16", x[:4].to(torch.float16), InputTypeError),
        ("x-other-float", x[:4].to(other), InputTypeError),
        ("x-bool", x[:4] > 0, InputTypeError),
    ]


PREDICT_PARAMS = [
    pytest.param(
        case,
        label,
        x,
        case.predict_overrides.get(label, err),
        id=f"{case.name}-{label}",
        marks=case.marks,
    )  # fmt: skip
    for case in CASES
    for label, x, err in _bad_predict_inputs(case)
]


@pytest.fixture(scope="module")
def fitted_models():
    return {}


@pytest.mark.parametrize(("case", "label", "x", "err"), PREDICT_PARAMS)
def test_predict_rejects_bad_inputs(case, label, x, err, fitted_models):
    if case.name not in fitted_models:
        fitted_models[case.name] = _fitted(case)
    if err is None:  # accepted (converted)
        assert torch.isfinite(case.predict(fitted_models[case.name], x)).all()
        return
    with pytest.raises(err):
        case.predict(fitted_models[case.name], x)


EXTRA_PARAMS = [
    pytest.param(
        case,
        method,
        label,
        x,
        case.predict_overrides.get(label, err),
        id=f"{case.name}.{method}-{label}",
        marks=case.marks,
    )  # fmt: skip
    for case in CASES
    for method in case.extra
    for label, x, err in _bad_predict_inputs(case)
]


@pytest.mark.parametrize(("case", "method", "label", "x", "err"), EXTRA_PARAMS)
def test_other_entry_points_reject_bad_inputs(case, method, label, x, err, fitted_models):
    """get_fantasy_model, select_temperature, sample_ess, update, ... under the same contract."""
    if case.name not in fitted_models:
        fitted_models[case.name] = _fitted(case)
    _, y = _data(case.dtype, case.classification)
    y = y[: x.shape[0]] if x.dim() == 2 else y[:4]
    call = case.extra[method]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpextWarning)
        if err is None:
            call(fitted_models[case.name], x, y)
            return
        with pytest.raises(err):
            call(fitted_models[case.name], x, y)


@pytest.mark.parametrize(
    ("case", "method"),
    [pytest.param(c, m, id=f"{c.name}.{m}", marks=c.marks) for c in CASES for m in c.extra],
)
def test_other_entry_points_accept_numpy_and_lists(case, method, fitted_models):
    if case.name not in fitted_models:
        fitted_models[case.name] = _fitted(case)
    x, y = _data(case.dtype, case.classification)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpextWarning)
        case.extra[method](fitted_models[case.name], _np(x[:6]), _np(y[:6]))
        case.extra[method](fitted_models[case.name], x[:6].tolist(), y[:6].tolist())


# ---------------------------------------------------------------- weight posteriors and blocks
def _swag():
    g = torch.Generator().manual_seed(0)
    return SWAG(torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64),
                torch.randn(3, 5, generator=g, dtype=torch.float64))  # fmt: skip


def _ofa():
    return OnlineFactorAnalysis(5, 2, warmup=0).update(torch.randn(6, 5, dtype=torch.float64))


def _mfg():
    q = MeanFieldGaussian(5, dtype=torch.float64)
    return q


POSTERIORS = {
    "SWAG": _swag,
    "OnlineFactorAnalysis": _ofa,
    "MultiSWAG": lambda: MultiSWAG([_swag(), _swag()]),
}


def _bad_weights():
    w = torch.zeros(3, 5, dtype=torch.float64)
    w_nan = w.clone()
    w_nan[0, 0] = float("nan")
    return [
        ("nan", w_nan, InputDataError),
        ("wrong-d", torch.zeros(3, 4, dtype=torch.float64), ShapeError),
        ("3d", torch.zeros(2, 3, 5, dtype=torch.float64), ShapeError),
        ("empty", torch.zeros(0, 5, dtype=torch.float64), InputDataError),
        ("float16", w.to(torch.float16), InputTypeError),
        ("string", "abc", GpextError),
    ]


@pytest.mark.parametrize("name", list(POSTERIORS))
@pytest.mark.parametrize(
    ("label", "w", "err"),
    [pytest.param(*b, id=b[0]) for b in _bad_weights() if b[0] != "3d"],  # 3-D: a valid batch
)
def test_weight_posterior_log_prob_rejects_bad_weights(name, label, w, err):
    with pytest.raises(err):
        POSTERIORS[name]().log_prob(w)


@pytest.mark.parametrize(("label", "w", "err"), _bad_weights(), ids=[b[0] for b in _bad_weights()])
def test_online_factor_analysis_update_rejects_bad_weights(label, w, err):
    with pytest.raises(err):
        OnlineFactorAnalysis(5, 2, warmup=0).update(w)


def test_online_factor_analysis_before_update_raises_not_fitted():
    ofa = OnlineFactorAnalysis(5, 2)
    with pytest.raises(NotFittedError):
        ofa.sample(2)
    with pytest.raises(NotFittedError):
        ofa.log_prob(torch.zeros(5, dtype=torch.float64))


@pytest.mark.parametrize(
    ("label", "args", "err"),
    [
        (
            "nan-mean",
            (torch.full((5,), float("nan")), torch.ones(5), torch.randn(3, 5)),
            InputDataError,
        ),
        ("mismatched-d", (torch.zeros(5), torch.ones(4), torch.randn(3, 5)), ShapeError),
        ("dev-wrong-d", (torch.zeros(5), torch.ones(5), torch.randn(3, 4)), ShapeError),
        ("empty", (torch.zeros(0), torch.ones(0), torch.randn(3, 0)), InputDataError),
        ("one-deviation", (torch.zeros(5), torch.ones(5), torch.randn(1, 5)), InputDataError),
        (
            "float16",
            (torch.zeros(5, dtype=torch.float16), torch.ones(5), torch.randn(3, 5)),
            InputTypeError,
        ),
        ("string", ("abc", torch.ones(5), torch.randn(3, 5)), GpextError),
    ],
)
def test_swag_constructor_rejects_bad_moments(label, args, err):
    with pytest.raises(err):
        SWAG(*args)


@pytest.mark.parametrize(
    ("label", "loc", "scale", "err"),
    [
        ("nan", torch.full((5,), float("nan")), torch.ones(5), InputDataError),
        ("wrong-d", torch.zeros(4), torch.ones(4), ShapeError),
        ("2d", torch.zeros(1, 5), torch.ones(1, 5), ShapeError),
        ("negative-scale", torch.zeros(5), -torch.ones(5), InputDataError),
        ("float16", torch.zeros(5, dtype=torch.float16), torch.ones(5), InputTypeError),
        ("string", "abc", torch.ones(5), GpextError),
    ],
)
def test_mean_field_gaussian_set_moments_rejects_bad_values(label, loc, scale, err):
    with pytest.raises(err):
        _mfg().set_moments(loc, scale)


@pytest.mark.parametrize(
    ("label", "x", "err"),
    [
        ("nan", torch.full((4, D), float("nan")), InputDataError),
        ("1d", torch.zeros(D), ShapeError),
        ("wrong-d", torch.zeros(4, D + 1), ShapeError),
        ("empty", torch.zeros(0, D), InputDataError),
        ("float16", torch.zeros(4, D, dtype=torch.float16), InputTypeError),
        ("other-float", torch.zeros(4, D, dtype=torch.float64), InputTypeError),
        ("string", "abc", GpextError),
    ],
)
def test_ensemble_mlp_forward_rejects_bad_inputs(label, x, err):
    net = EnsembleMLP(2, D, 1, [4], dtype=torch.float32)
    with pytest.raises(err):
        net(x)


def test_ensemble_mlp_forward_accepts_numpy_and_integers():
    net = EnsembleMLP(2, D, 1, [4], dtype=torch.float32)
    x = np.zeros((3, D))
    assert (
        net(x).shape
        == net(torch.zeros(3, D)).shape
        == net(torch.zeros(3, D, dtype=torch.long)).shape
    )
    assert net(x.tolist()).dtype == torch.float32


# ---------------------------------------------------------------- bootstrap fit functions
def _bad_matrices():
    x, _ = _data()
    x_nan = x.clone()
    x_nan[0, 1] = float("nan")
    return [
        ("nan", x_nan, InputDataError),
        ("1d", x[:, 0], ShapeError),
        ("3d", x[None], ShapeError),
        ("empty", x[:0], InputDataError),
        ("float16", x.half(), InputDataError),  # check_float_dtype, as VBootMLP/VBootRFF.fit
        ("bool", x > 0, InputTypeError),
        ("string", "abc", GpextError),
    ]


def _kernel_fit(x, y):
    from gpext.bootstrap import fit_kernel_hyperparameters

    return fit_kernel_hyperparameters(x, y, num_iters=2, fallback_iters=2)


def _perturbed_map(x, y):
    from gpext.bootstrap import solve_perturbed_map

    y = torch.as_tensor(np.asarray(y)).reshape(-1, 1)
    return solve_perturbed_map(x, y, torch.full(y.shape, 0.1), 1.0, 2)


@pytest.mark.parametrize("func", [_kernel_fit, _perturbed_map], ids=["kernel_fit", "perturbed_map"])
@pytest.mark.parametrize(
    ("label", "x", "err"), _bad_matrices(), ids=[b[0] for b in _bad_matrices()]
)
def test_bootstrap_functions_reject_bad_inputs(func, label, x, err):
    _, y = _data()
    with warnings.catch_warnings(), pytest.raises(err):
        warnings.simplefilter("ignore", GpextWarning)
        func(x, y[: x.shape[0]] if isinstance(x, torch.Tensor) and x.dim() == 2 else y)


@pytest.mark.parametrize("func", [_kernel_fit, _perturbed_map], ids=["kernel_fit", "perturbed_map"])
def test_bootstrap_functions_accept_numpy_and_lists(func):
    x, y = _data()
    with warnings.catch_warnings():  # AttributeError ('numpy.ndarray' has no 'dim') before
        warnings.simplefilter("ignore", GpextWarning)
        func(_np(x), _np(y))
        func(x.tolist(), y.tolist())


@pytest.mark.parametrize("name", list(POSTERIORS))
def test_weight_posterior_log_prob_converts_numpy_lists_and_integers(name):
    post = POSTERIORS[name]()
    w = torch.zeros(3, 5, dtype=torch.float64)
    expected = post.log_prob(w)
    torch.testing.assert_close(post.log_prob(w.numpy()), expected)
    torch.testing.assert_close(post.log_prob(w.tolist()), expected)
    torch.testing.assert_close(post.log_prob(w.long()).double(), expected, rtol=1e-6, atol=1e-6)


SUBSPACES = {
    "PCASubspace": lambda: __import__("gpext.subspace", fromlist=["x"]).PCASubspace(2),
    "RandomSubspace": lambda: __import__("gpext.subspace", fromlist=["x"]).RandomSubspace(2),
    "InKPCASubspace": lambda: __import__("gpext.subspace", fromlist=["x"]).InKPCASubspace(2),
}


@pytest.mark.parametrize("name", list(SUBSPACES))
def test_subspaces_input_contract(name):
    devs = torch.randn(6, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with pytest.raises(NotFittedError):
        _ = SUBSPACES[name]().projection
    fit = (lambda s, d: s.update(d)) if name == "InKPCASubspace" else (lambda s, d: s.fit(d))
    for bad, err in (
        (devs.half(), InputTypeError),
        (devs.bool(), InputTypeError),
        (devs[:0], InputDataError),
        (torch.full((6, 10), float("nan"), dtype=torch.float64), InputDataError),
        ("abc", InputTypeError),
    ):
        with pytest.raises(err):
            fit(SUBSPACES[name](), bad)
    for good in (devs.numpy(), devs.tolist()):
        assert fit(SUBSPACES[name](), good).projection.shape[-1] == 10

"""InducingGPNetwork's input contract: every entry point turns bad inputs into gpext errors."""

import warnings

import pytest
import torch

from gpext.errors import GpextWarning, InputDataError, InputTypeError, ShapeError
from gpext.models import InducingGPNetwork
from gpext.nn import MLP, SetEncoder

N, D = 24, 2


def _model(task="regression", num_classes=None, dtype=torch.float32):
    torch.manual_seed(0)
    return InducingGPNetwork(MLP(D, [8], 3), num_inducing=4, task=task, num_classes=num_classes).to(
        dtype
    )


def _data(task="regression", dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=g, dtype=dtype)
    if task == "regression":
        return x, torch.sin(x[:, 0])
    return x, torch.arange(N) % (2 if task == "binary" else 3)


def _fitted(task="regression", num_classes=None):
    model = _model(task, num_classes)
    x, y = _data(task)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GpextWarning)
        model.fit(x, y, epochs=1, batch_size=12, min_steps=0)  # the inputs matter here
    return model


ENTRY_POINTS = {
    "fit": lambda m, x, y: m.fit(x, y, epochs=1, batch_size=12),
    "loss": lambda m, x, y: m.loss(x, y),
    "initialize": lambda m, x, y: m.initialize(x, y),
    "refit_pseudo_labels": lambda m, x, y: m.refit_pseudo_labels(x, y),
    "calibrate_noise": lambda m, x, y: m.calibrate_noise(x, y),
    "check_fit": lambda m, x, y: m.check_fit(x, y),
    "predict": lambda m, x, y: m.predict(x),
    "forward": lambda m, x, y: m(x),
}


def _bad_xy():
    x, y = _data()
    x_nan, x_inf, y_nan = x.clone(), x.clone(), y.clone()
    x_nan[3, 1] = float("nan")
    x_inf[0, 0] = -float("inf")
    y_nan[2] = float("inf")
    return [
        ("empty", x[:0], y[:0], ShapeError),
        ("x-nan", x_nan, y, InputDataError),
        ("x-inf", x_inf, y, InputDataError),
        ("x-float16", x.half(), y, InputTypeError),
        ("x-float64", x.double(), y, InputTypeError),
        ("x-bool", x > 0, y, InputTypeError),
        ("x-scalar", x[0, 0], y, ShapeError),
        ("x-1d", x[:, 0], y, ShapeError),
        ("x-3d", x[None], y, ShapeError),
        ("x-wrong-d", torch.ones(N, D + 1), y, ShapeError),
        ("mismatched-n", x, y[:-2], ShapeError),
        ("y-2d", x, y[:, None], ShapeError),
        ("y-nan", x, y_nan, InputDataError),
    ]


@pytest.mark.parametrize("entry", list(ENTRY_POINTS))
@pytest.mark.parametrize(("label", "x", "y", "err"), [pytest.param(*c, id=c[0]) for c in _bad_xy()])
def test_regression_entry_points_reject_bad_inputs(entry, label, x, y, err):
    if entry in ("predict", "forward") and (label.startswith("y-") or label == "mismatched-n"):
        pytest.skip("no targets")
    if entry == "forward" and label == "x-3d":
        pytest.skip("model(x) takes batches of inputs")
    model = _fitted()
    with pytest.raises(err):
        ENTRY_POINTS[entry](model, x, y)


def test_forward_takes_batches_that_predict_rejects():
    model = _fitted()
    x, _ = _data()
    assert model(x[None, :5]).mean.shape == (1, 5)
    with pytest.raises(ShapeError, match="no batch dimensions"):
        model.predict(x[None, :5])


@pytest.mark.parametrize(
    ("task", "num_classes", "bad", "err"),
    [
        ("binary", None, 2, InputDataError),
        ("binary", None, -1, InputDataError),
        ("one_vs_all", 3, 3, InputDataError),
        ("dirichlet", 3, 5, InputDataError),
        ("dirichlet", 3, 0.5, InputTypeError),
        ("one_vs_all", 3, float("nan"), InputTypeError),
    ],
)
@pytest.mark.parametrize("entry", ["fit", "loss", "initialize", "refit_pseudo_labels"])
def test_classification_labels_are_checked(task, num_classes, bad, err, entry):
    model = _fitted(task, num_classes)
    x, y = _data(task)
    y = y.double()
    y[5] = bad
    if entry == "refit_pseudo_labels" and task != "dirichlet":
        err = InputDataError  # probit tasks have no closed form: rejected first
    with pytest.raises(err):
        ENTRY_POINTS[entry](model, x, y)


def test_a_float16_model_is_an_input_type_error():
    model = _model().half()
    x, y = _data(dtype=torch.float16)
    with pytest.raises(InputTypeError, match="model.float"):
        model.fit(x, y, epochs=1)
    with pytest.raises(InputTypeError, match="model.float"):
        model(x)


def test_set_inputs_keep_working():
    """3-D padded set inputs are (N, L, D): not a batch, the embedding maps them to (N, d)."""
    sets = [torch.randn(k, 1) for k in (2, 3, 4, 5, 2, 3)] * 4
    x = SetEncoder.pad(sets)
    y = torch.stack([s.mean() for s in sets])
    torch.manual_seed(0)
    model = InducingGPNetwork(SetEncoder(1, 4, hidden_features=8), num_inducing=4)
    model.fit(x, y, epochs=1, batch_size=12)
    assert model.predict(x[:5])[0].shape == (5,)
    x_bad = x.clone()
    x_bad[0] = float("nan")  # a set without elements: SetEncoder's own check
    with pytest.raises(InputDataError):
        model.predict(x_bad[:5])


def test_nan_inputs_are_named_in_the_message():
    model = _fitted()
    x, y = _data()
    x[2, 0] = float("nan")
    with pytest.raises(InputDataError, match=r"loss\(x\): expected finite values, got 1 NaN"):
        model.loss(x, y)
    with pytest.raises(InputDataError, match=r"predict\(x\): expected finite values, got 1 NaN"):
        model.predict(x)

"""One input contract: numpy arrays work, dtype mismatches and unfitted models are gpext errors."""

import numpy as np
import pytest
import torch

from gpext.errors import InputTypeError, NotFittedError
from gpext.models import GWIRegressionModel, InducingGPNetwork
from gpext.nn import MLP
from gpext.subspace import SWAG
from gpext.utils import as_model_input


def test_as_model_input():
    like = torch.zeros(2, dtype=torch.float64)
    out = as_model_input(np.ones((3, 2), dtype=np.float32), like, "x")
    assert out.dtype == torch.float64 and out.shape == (3, 2)
    assert as_model_input([[1, 2]], like, "x").dtype == torch.float64
    assert as_model_input(torch.ones(2, dtype=torch.long), like, "x").dtype == torch.float64
    with pytest.raises(InputTypeError, match="model.to"):
        as_model_input(torch.ones(2, dtype=torch.float32), like, "x")
    with pytest.raises(InputTypeError, match="real-valued"):
        as_model_input(torch.ones(2, dtype=torch.bool), like, "x")


def test_swag_accepts_numpy():  # AttributeError before
    rng = np.random.default_rng(0)
    swag = SWAG(np.zeros(4), np.ones(4), rng.normal(size=(3, 4)))
    assert swag.sample(2).shape == (2, 4)


def test_gwi_accepts_numpy_and_rejects_a_dtype_mismatch():  # AttributeError before
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 2))
    y = np.sin(x[:, 0])
    model, lik = GWIRegressionModel.from_data(x, y, prior_steps=2)
    model.fit(lik, x, y, epochs=2)
    assert model.predict(lik, x[:3])[0].shape == (3,)
    with pytest.raises(InputTypeError, match="float64"):
        model.predict(lik, torch.randn(3, 2))


def test_ign_contract():
    model = InducingGPNetwork(MLP(2, [8], 2), num_inducing=4)
    with pytest.raises(NotFittedError):  # returned the prior before
        model.predict(torch.randn(3, 2))
    x = np.random.default_rng(0).normal(size=(30, 2)).astype(np.float32)
    model.fit(x, np.sin(x[:, 0]), epochs=1)
    assert model.predict(x[:3])[0].shape == (3,)
    with pytest.raises(InputTypeError, match="float32"):  # a raw torch dtype error before
        model.predict(torch.randn(3, 2, dtype=torch.float64))


# ------------------------------------------------------------------ whole-model save/restore
def _round_trip(model, fresh, tmp_path):
    """``torch.save`` the state dict and load it into ``fresh`` (built the documented way)."""
    torch.save(model.state_dict(), tmp_path / "state.pt")
    fresh.load_state_dict(torch.load(tmp_path / "state.pt"))
    return fresh


def _xy(classification=False, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(30, 2, generator=g, dtype=dtype)
    y = torch.arange(30) % 3 if classification else torch.sin(x[:, 0])
    return x, y


def _gwi_fitted(cls, classification):
    x, y = _xy(classification)
    args = (3,) if classification else ()
    model, lik = cls.from_data(x, y, *args, num_inducing=6, prior_steps=2)
    model.fit(lik, x, y, epochs=2)
    return model, lik, x, y, args


@pytest.mark.parametrize("classification", [False, True])
def test_gwi_round_trip(classification, tmp_path):
    from gpext.models import GWIClassificationModel

    cls = GWIClassificationModel if classification else GWIRegressionModel
    model, lik, x, y, args = _gwi_fitted(cls, classification)
    # the documented construction: from_data on the same data, then the saved state
    fresh, fresh_lik = cls.from_data(x, y, *args, num_inducing=6, prior_steps=1)
    fresh = _round_trip(model, fresh, tmp_path)
    fresh_lik.load_state_dict(lik.state_dict())
    if classification:
        torch.testing.assert_close(
            fresh.predict_proba(fresh_lik, x[:5]), model.predict_proba(lik, x[:5]), rtol=0, atol=0
        )
    else:
        for a, b in zip(fresh.predict(fresh_lik, x[:5]), model.predict(lik, x[:5])):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_ign_round_trip(tmp_path):
    x, y = _xy(dtype=torch.float32)
    model = InducingGPNetwork(MLP(2, [8], 2), num_inducing=4)
    model.fit(x, y, epochs=2)
    fresh = _round_trip(model, InducingGPNetwork(MLP(2, [8], 2), num_inducing=4), tmp_path)
    for a, b in zip(fresh.predict(x[:5]), model.predict(x[:5])):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("classification", [False, True])
def test_vboot_round_trip(classification, tmp_path):
    from gpext.bootstrap import VBootMLP, VBootRFF

    x, y = _xy(classification)
    task = {"task": "classification", "num_classes": 3} if classification else {}
    for make, fit in (
        (lambda: VBootMLP(2, (8,), dtype=torch.float64, **task), {"num_epochs": 2}),
        (lambda: VBootRFF(16, 2, lengthscale=1.0, outputscale=1.0, **task), {}),
    ):
        model = make()
        model.fit(x, y, **fit)
        fresh = _round_trip(model, make(), tmp_path)
        torch.testing.assert_close(fresh(x[:5]), model(x[:5]), rtol=0, atol=0)


def test_ensemble_mlp_round_trip(tmp_path):
    from gpext.bootstrap import EnsembleMLP

    net = EnsembleMLP(3, 2, 1, [4], dtype=torch.float64)
    fresh = _round_trip(net, EnsembleMLP(3, 2, 1, [4], dtype=torch.float64), tmp_path)
    x, _ = _xy()
    torch.testing.assert_close(fresh(x), net(x), rtol=0, atol=0)


def test_incremental_kpca_round_trip(tmp_path):
    import gpytorch

    from gpext.operators import IncrementalKPCA

    x, _ = _xy()
    kpca = IncrementalKPCA(gpytorch.kernels.RBFKernel()).fit(x)
    fresh = _round_trip(kpca, IncrementalKPCA(gpytorch.kernels.RBFKernel()), tmp_path)
    torch.testing.assert_close(fresh.transform(x[:5]), kpca.transform(x[:5]), rtol=0, atol=0)


def test_weight_posteriors_round_trip(tmp_path):
    from gpext.subspace import MeanFieldGaussian, MultiSWAG, OnlineFactorAnalysis

    g = torch.Generator().manual_seed(0)
    w = torch.randn(12, 5, generator=g, dtype=torch.float64)
    swag = SWAG(w.mean(0), w.square().mean(0), w[:4] - w.mean(0))
    fresh_swag = SWAG(torch.zeros(5), torch.ones(5), torch.zeros(4, 5)).double()
    ofa = OnlineFactorAnalysis(5, 2, warmup=0).update(w)
    q = MeanFieldGaussian(5)
    q.set_moments(w[0], w[1].abs())
    multi = MultiSWAG([swag, SWAG(w.mean(0), w.square().mean(0), w[4:8] - w.mean(0))])
    for model, fresh in (
        (swag, fresh_swag),
        (ofa, OnlineFactorAnalysis(5, 2, warmup=0)),
        (q, MeanFieldGaussian(5)),
        (
            multi,
            MultiSWAG(
                [fresh_swag, SWAG(torch.zeros(5), torch.ones(5), torch.zeros(4, 5)).double()]
            ),
        ),
    ):
        fresh = _round_trip(model, fresh, tmp_path)
        if isinstance(model, MeanFieldGaussian):
            a = fresh.rsample(3, generator=torch.Generator().manual_seed(1))
            b = model.rsample(3, generator=torch.Generator().manual_seed(1))
        else:
            a, b = fresh.log_prob(w), model.log_prob(w)
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_package_is_typed():
    """PEP 561 marker, shipped as package data."""
    import pathlib

    import gpext

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

    assert (pathlib.Path(gpext.__file__).parent / "py.typed").is_file()
    root = pathlib.Path(gpext.__file__).parent.parent
    if (root / "pyproject.toml").is_file():
        config = tomllib.loads((root / "pyproject.toml").read_text())
        assert "py.typed" in config["tool"]["setuptools"]["package-data"]["gpext"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_follows_the_model():
    from gpext.models import DirichletGPClassifier

    x, y = _xy(classification=True)
    clf = DirichletGPClassifier(3)
    clf.fit(x.cuda(), y.cuda(), max_iter=2)
    assert clf.predict_latent(x[:3].numpy())[0].device.type == "cuda"  # numpy goes to the model
    with pytest.raises(InputTypeError, match="device"):
        clf.predict_latent(x[:3])
    model, lik = GWIRegressionModel.from_data(x.cuda(), torch.sin(x[:, 0]).cuda(), prior_steps=2)
    model.fit(lik, x.cuda(), torch.sin(x[:, 0]).cuda(), epochs=1)
    with pytest.raises(InputTypeError, match="device"):
        model.predict(lik, x[:3])
    assert model.predict(lik, x[:3].tolist())[0].device.type == "cuda"

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

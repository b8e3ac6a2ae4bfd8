"""InputAugmentedEmbedding: shapes, the distance lower bound, errors, state dict."""

import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.nn import MLP, InputAugmentedEmbedding


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_and_distance_lower_bound(dtype):
    torch.manual_seed(0)
    emb = InputAugmentedEmbedding(MLP(3, [16], 4), in_features=3, input_scale=0.5).to(dtype)
    x = torch.randn(2, 7, 3, dtype=dtype)
    out = emb(x)
    assert out.shape == (2, 7, 7) and out.dtype == dtype and emb.out_features == 7
    a, b = emb(x[0]), emb(x[1])
    assert bool(((a - b).norm(dim=-1) >= 0.5 * (x[0] - x[1]).norm(dim=-1) - 1e-6).all())
    assert torch.equal(out[..., 4:], 0.5 * x)


def test_state_dict_round_trip_and_errors():
    emb = InputAugmentedEmbedding(MLP(2, [8], 3), in_features=2)
    other = InputAugmentedEmbedding(MLP(2, [8], 3), in_features=2)
    other.load_state_dict(emb.state_dict())
    x = torch.randn(4, 2)
    assert torch.equal(emb(x), other(x))
    with pytest.raises(ShapeError):
        emb(torch.randn(4, 3))
    with pytest.raises(InputDataError):
        InputAugmentedEmbedding(MLP(2, [8], 3), in_features=2, input_scale=0.0)
    with pytest.raises(InputTypeError):
        InputAugmentedEmbedding("net", in_features=2)
    with pytest.raises(InputDataError, match="out_features"):
        InputAugmentedEmbedding(torch.nn.Sequential(torch.nn.Linear(2, 3)), in_features=2)

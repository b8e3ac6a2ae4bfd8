"""Tests for gpext.nn.MLP."""

import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.nn import MLP


class TestMLP:
    def setup_method(self):
        torch.manual_seed(0)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_shapes_and_batches(self, dtype):
        g = MLP(5, [16, 8], 3).to(dtype)
        assert g(torch.randn(7, 5, dtype=dtype)).shape == (7, 3)
        x = torch.randn(2, 4, 5, dtype=dtype)
        out = g(x)
        assert out.shape == (2, 4, 3) and out.dtype == dtype
        torch.testing.assert_close(out[1], g(x[1]))

    def test_matches_manual_forward(self):
        g = MLP(3, [4], 2, activation="tanh")
        x = torch.randn(6, 3)
        lin1, lin2 = g.net[0], g.net[2]
        ref = torch.tanh(x @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias
        torch.testing.assert_close(g(x), ref)

    def test_linear_and_layer_norm(self):
        g = MLP(3, [], 2, layer_norm=True)
        out = g(torch.randn(10, 3))
        torch.testing.assert_close(out.mean(-1), torch.zeros(10), atol=1e-5, rtol=0)

    def test_state_dict_round_trip(self):
        g, h = MLP(3, [8], 2), MLP(3, [8], 2)
        h.load_state_dict(g.state_dict())
        x = torch.randn(4, 3)
        torch.testing.assert_close(g(x), h(x))

    def test_errors(self):
        with pytest.raises(ShapeError, match="MLP.forward"):
            MLP(3, [4], 2)(torch.randn(5, 4))
        with pytest.raises(InputDataError, match="activation"):
            MLP(3, [4], 2, activation="gelu2")
        with pytest.raises(InputDataError, match="out_features"):
            MLP(3, [4], 0)
        with pytest.raises(InputTypeError, match="hidden_features"):
            MLP(3, [4.5], 2)

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

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_normalized_last_hidden_layer(self, dtype):
        """h / ||h|| before the output layer: matches the manual forward; batch dimensions kept;
        a Gaussian prior on the output weights gives every input the same prior variance
        (far-away inputs included), unlike the plain ReLU network's."""
        g = MLP(3, [16, 8], 1, normalize_last_hidden=True).to(dtype)
        x = torch.randn(2, 6, 3, dtype=dtype)
        lin1, lin2, lin3 = g.net[0], g.net[2], g.net[5]
        h = torch.relu(torch.relu(x @ lin1.weight.T + lin1.bias) @ lin2.weight.T + lin2.bias)
        ref = (h / h.norm(dim=-1, keepdim=True)) @ lin3.weight.T + lin3.bias
        torch.testing.assert_close(g(x), ref)
        assert g(x).shape == (2, 6, 1) and g(x).dtype == dtype
        # prior variance of f(x) = w^T [h/||h||, 1], w ~ N(0, I): ||[h/||h||, 1]||^2 = 2
        far = torch.cat([torch.randn(4, 3, dtype=dtype), 1e3 * torch.randn(4, 3, dtype=dtype)])
        from gpext.subspace import BayesianLastLayer

        feats = BayesianLastLayer(g).features(far)
        torch.testing.assert_close(feats.pow(2).sum(-1), torch.full((8,), 2.0, dtype=dtype))
        plain = BayesianLastLayer(MLP(3, [16, 8], 1).to(dtype)).features(far).pow(2).sum(-1)
        assert float(plain[4:].min()) > 100 * float(plain[:4].max())
        h = MLP(3, [16, 8], 1, normalize_last_hidden=True).to(dtype)
        h.load_state_dict(g.state_dict())
        torch.testing.assert_close(h(x), g(x))
        with pytest.raises(InputDataError, match="hidden layer"):
            MLP(3, [], 1, normalize_last_hidden=True)


def test_unit_norm_rows_and_zero_rows():
    from gpext.nn import UnitNorm

    h = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1e-20, 0.0]], dtype=torch.float64,
                     requires_grad=True)  # fmt: skip
    out = UnitNorm()(h)
    torch.testing.assert_close(out.detach(), torch.tensor([[0.6, 0.8], [0.0, 0.0], [0.0, 0.0]],
                                                          dtype=torch.float64))  # fmt: skip
    out.sum().backward()
    assert bool(torch.isfinite(h.grad).all())
    assert float(h.grad[1:].abs().max()) == 0.0  # no 1/eps gradients from vanishing rows
    torch.testing.assert_close(h.grad[0], torch.tensor([0.032, -0.024], dtype=torch.float64))

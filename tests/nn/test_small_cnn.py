"""Tests for gpext.nn.SmallCNN."""

import pytest
import torch

from gpext.errors import ShapeError
from gpext.nn import SmallCNN


class TestSmallCNN:
    def setup_method(self):
        torch.manual_seed(1)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_flat_and_image_inputs_agree(self, dtype):
        g = SmallCNN(6, channels=(4, 8), hidden_features=16).to(dtype)
        imgs = torch.rand(3, 1, 28, 28, dtype=dtype)
        out = g(imgs)
        assert out.shape == (3, 6) and out.dtype == dtype
        torch.testing.assert_close(g(imgs.reshape(3, 784)), out)
        assert g(imgs.reshape(1, 3, 784)).shape == (1, 3, 6)

    def test_layer_norm_output(self):
        out = SmallCNN(6, layer_norm=True)(torch.rand(4, 784))
        torch.testing.assert_close(out.mean(-1), torch.zeros(4), atol=1e-5, rtol=0)

    def test_other_image_shape(self):
        g = SmallCNN(4, image_shape=(3, 8, 12), channels=(2, 2), hidden_features=8)
        assert g(torch.rand(5, 3 * 8 * 12)).shape == (5, 4)

    def test_learns_to_separate_two_patterns(self):
        g = SmallCNN(2, image_shape=(1, 8, 8), channels=(4, 4), hidden_features=8)
        x = torch.zeros(40, 1, 8, 8)
        x[:20, :, :4] = 1.0
        x[20:, :, 4:] = 1.0
        y = torch.cat([torch.zeros(20), torch.ones(20)]).long()
        opt = torch.optim.Adam(g.parameters(), lr=1e-2)
        for _ in range(30):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(g(x), y).backward()
            opt.step()
        assert (g(x).argmax(-1) == y).all()

    def test_state_dict_round_trip(self):
        g, h = SmallCNN(3), SmallCNN(3)
        h.load_state_dict(g.state_dict())
        x = torch.rand(2, 784)
        torch.testing.assert_close(g(x), h(x))

    def test_errors(self):
        with pytest.raises(ShapeError, match="SmallCNN.forward"):
            SmallCNN(3)(torch.rand(2, 100))
        with pytest.raises(ShapeError, match="image_shape"):
            SmallCNN(3, image_shape=(1, 30, 30))

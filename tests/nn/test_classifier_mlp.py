"""ClassifierMLP."""

import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.nn import ClassifierMLP
from gpext.subspace import has_batch_norm


class TestClassifierMLP:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_logits_and_probabilities(self, dtype):
        torch.manual_seed(0)
        net = ClassifierMLP(4, [16, 8], 3).to(dtype)
        x = torch.randn(6, 4, dtype=dtype)
        logits = net(x)
        assert logits.shape == (6, 3) and logits.dtype == dtype
        torch.testing.assert_close(net.predict_proba(x), torch.softmax(logits, -1))

    def test_batch_norm_option_and_state_dict(self):
        a = ClassifierMLP(4, [8], 2, batch_norm=True)
        assert has_batch_norm(a) and not has_batch_norm(ClassifierMLP(4, [8], 2))
        a.train()
        a(torch.randn(10, 4))
        b = ClassifierMLP(4, [8], 2, batch_norm=True)
        b.load_state_dict(a.state_dict())
        a.eval()
        b.eval()
        x = torch.randn(3, 4)
        torch.testing.assert_close(a(x), b(x))

    def test_errors(self):
        with pytest.raises(InputDataError):
            ClassifierMLP(4, [8], 1)
        with pytest.raises(InputDataError, match="activation"):
            ClassifierMLP(4, [8], 2, activation="gelu2")
        with pytest.raises(InputTypeError):
            ClassifierMLP(4, [8.5], 2)
        with pytest.raises(ShapeError):
            ClassifierMLP(4, [8], 2)(torch.randn(3, 5))

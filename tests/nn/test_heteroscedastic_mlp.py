"""HeteroscedasticMLP."""

import pytest
import torch

from gpext.errors import InputDataError, ShapeError
from gpext.nn import HeteroscedasticMLP
from gpext.subspace import OutputLikelihood


class TestHeteroscedasticMLP:
    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    def test_output_and_consistency_with_likelihood(self, dtype):
        torch.manual_seed(0)
        net = HeteroscedasticMLP(3, [8, 8], min_variance=1e-3).to(dtype)
        out = net(torch.randn(5, 3, dtype=dtype))
        assert out.shape == (5, 2) and out.dtype == dtype
        mean, var = net.mean_variance(out)
        ref_mean, ref_var = OutputLikelihood(
            "heteroscedastic_gaussian", min_variance=1e-3
        ).mean_variance(out)
        torch.testing.assert_close(mean, ref_mean)
        torch.testing.assert_close(var, ref_var)
        assert bool((var >= 1e-3).all())

    def test_state_dict_and_errors(self):
        a, b = HeteroscedasticMLP(2, [4]), HeteroscedasticMLP(2, [4])
        b.load_state_dict(a.state_dict())
        x = torch.randn(3, 2)
        torch.testing.assert_close(a(x), b(x))
        with pytest.raises(ShapeError):
            a(torch.randn(3, 5))
        with pytest.raises(ShapeError):
            a.mean_variance(torch.randn(3, 3))
        with pytest.raises(InputDataError):
            HeteroscedasticMLP(2, [4], min_variance=-1.0)

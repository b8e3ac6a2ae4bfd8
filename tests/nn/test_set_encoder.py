"""Tests for gpext.nn.SetEncoder."""

import pytest
import torch

from gpext.errors import InputDataError, InputTypeError, ShapeError
from gpext.nn import SetEncoder


class TestSetEncoder:
    def setup_method(self):
        torch.manual_seed(2)

    @pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
    @pytest.mark.parametrize("pooling", ["mean", "sum", "max"])
    def test_permutation_invariance_and_padding(self, dtype, pooling):
        enc = SetEncoder(3, 5, hidden_features=8, pooling=pooling).to(dtype)
        sets = [torch.randn(n, 3, dtype=dtype) for n in (1, 4, 9)]
        padded = SetEncoder.pad(sets)
        assert padded.shape == (3, 9, 3)
        out = enc(padded)
        assert out.shape == (3, 5) and out.dtype == dtype
        for i, s in enumerate(sets):
            alone = enc(s[torch.randperm(s.shape[0])].unsqueeze(0))[0]
            torch.testing.assert_close(out[i], alone)
        # longer padding and an explicit mask give the same features
        wide = SetEncoder.pad(sets, max_size=12)
        mask = ~torch.isnan(wide).all(-1)
        torch.testing.assert_close(enc(torch.nan_to_num(wide), mask=mask), out)

    def test_sum_pooling_depends_on_size(self):
        enc = SetEncoder(1, 2, pooling="sum")
        one = torch.ones(1, 1, 1)
        two = torch.ones(1, 2, 1)
        assert not torch.allclose(enc(one), enc(two))

    def test_errors(self):
        enc = SetEncoder(2, 3)
        with pytest.raises(ShapeError, match="SetEncoder.forward"):
            enc(torch.randn(4, 2))
        with pytest.raises(InputDataError, match="at least one element"):
            enc(torch.full((1, 3, 2), float("nan")))
        with pytest.raises(InputDataError, match="NaN entries"):
            x = torch.randn(1, 3, 2)
            x[0, 0, 0] = float("nan")
            enc(x)
        with pytest.raises(InputTypeError, match="bool"):
            enc(torch.randn(1, 3, 2), mask=torch.ones(1, 3))
        with pytest.raises(ShapeError, match="mask"):
            enc(torch.randn(1, 3, 2), mask=torch.ones(1, 2, dtype=torch.bool))
        with pytest.raises(InputDataError, match="at least one set"):
            SetEncoder.pad([])
        with pytest.raises(ShapeError):
            SetEncoder.pad([torch.randn(2, 2), torch.randn(2, 3)])
        with pytest.raises(InputDataError, match="pooling"):
            SetEncoder(2, 3, pooling="median")

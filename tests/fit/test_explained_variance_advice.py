"""check_explained_variance: the advice fits the model (networks have no GP hyperparameters)."""

import pytest
import torch

from gpext.errors import VarianceCollapseWarning
from gpext.fit import check_explained_variance
from gpext.fit.diagnostics import NETWORK_FIT_ADVICE


def test_default_and_network_advice():
    y = torch.randn(50, generator=torch.Generator().manual_seed(0))
    flat = torch.zeros(50)
    with pytest.warns(VarianceCollapseWarning, match="GP hyperparameters"):
        assert not check_explained_variance(flat, y, name="SomeGP")
    with pytest.warns(VarianceCollapseWarning) as rec:
        assert not check_explained_variance(flat, y, name="Net", advice=NETWORK_FIT_ADVICE)
    text = str(rec[0].message)
    assert "GP" not in text and NETWORK_FIT_ADVICE in text
    assert check_explained_variance(y, y, name="Net", advice=NETWORK_FIT_ADVICE)

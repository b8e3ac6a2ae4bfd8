"""fit_weight_ensemble and the data contract (issue 38): scaled copies of a design give the same
posterior up to the scale; BoTorch transforms are not done twice."""

import pytest
import torch
from botorch.models.transforms import Normalize, Standardize

from gpext.errors import InputDataError
from gpext.integrations.botorch import (
    WeightEnsembleSurrogate,
    fit_gpext_surrogate,
    fit_weight_ensemble,
)
from gpext.nn import has_input_standardization, input_standardization

SMALL = {"hidden_features": (8,), "epochs": 12, "swa_epochs": 6, "num_samples": 4, "rank": 3}
DT = torch.float64


def _design(n=14, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=DT)
    y = torch.sin(6 * x[:, :1]) + x[:, 1:] + 0.05 * torch.randn(n, 1, generator=gen, dtype=DT)
    test = torch.rand(9, 1, 2, generator=gen, dtype=DT)
    return x, y, test


@pytest.mark.parametrize("method", ["swag", "pca_ess", "last_layer"])
def test_scaled_copies_give_the_same_posterior_up_to_the_scale(method):
    """Small-design defaults (conditional last layer, calibration, prior reversion) included."""
    x, y, test = _design()
    a, b, c = 1e6, 3e7, 1e4
    posts = []
    for xs, ys, ts in ((x, y, test), (x * c, y * a + b, test * c)):
        model = fit_weight_ensemble(xs, ys, method=method,
                                    generator=torch.Generator().manual_seed(0), **SMALL)  # fmt: skip
        with torch.no_grad():
            post = model.posterior(ts)
            posts.append((post.mean.reshape(-1), post.variance.reshape(-1), model))
    (m0, v0, ref), (m1, v1, scaled) = posts
    span = float(m0.abs().max())
    assert float(((m1 - b) / a - m0).abs().max()) <= 1e-3 * span
    torch.testing.assert_close(v1 / a**2, v0, rtol=1e-3, atol=0)
    assert scaled.likelihood.has_target_transform
    lo, scale = input_standardization(scaled.model)
    torch.testing.assert_close(lo, (x * c).min(0).values)  # the design's unit cube
    sel0, sel1 = ref.fit_selection, scaled.fit_selection
    assert abs(sel1["noise_variance"] / a**2 / sel0["noise_variance"] - 1) < 1e-3


def test_botorch_transforms_are_not_done_twice():
    x, y, test = _design()
    model = fit_weight_ensemble(x * 1e4, y * 1e6, input_transform=Normalize(2),
                                outcome_transform=Standardize(1),
                                generator=torch.Generator().manual_seed(0), **SMALL)  # fmt: skip
    assert not has_input_standardization(model.model)
    assert not model.likelihood.has_target_transform
    only_y = fit_weight_ensemble(x, y, outcome_transform=Standardize(1),
                                 generator=torch.Generator().manual_seed(0), **SMALL)  # fmt: skip
    assert input_standardization(only_y.model) is not None
    assert not only_y.likelihood.has_target_transform
    # built from data (the Ax path): the adapter's own transforms count
    adapter = WeightEnsembleSurrogate(train_X=x, train_Y=y, outcome_transform=Standardize(1))
    fit_gpext_surrogate(adapter, generator=torch.Generator().manual_seed(0), **SMALL)
    assert input_standardization(adapter.model) is not None
    assert not adapter.likelihood.has_target_transform
    # the opt-out: the data as given
    raw = fit_weight_ensemble(x, y, standardize=False,
                              generator=torch.Generator().manual_seed(0), **SMALL)  # fmt: skip
    assert not has_input_standardization(raw.model) and not raw.likelihood.has_target_transform
    with pytest.raises(InputDataError, match="standardize"):
        fit_weight_ensemble(x, y, standardize="both")

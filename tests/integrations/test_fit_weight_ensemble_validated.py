"""fit_weight_ensemble's validated recipe: likelihood, recipe and SWAG scale on a hold-out."""

import math

import pytest
import torch

from gpext.errors import InputDataError
from gpext.integrations.botorch import fit_weight_ensemble
from gpext.subspace import TrainingRecipe

SMALL = {"hidden_features": (8,), "epochs": 8, "swa_epochs": 4, "num_samples": 4}


def _data(n, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=dtype)
    y = torch.sin(6 * x[:, :1]) + 0.05 * torch.randn(n, 1, generator=gen, dtype=dtype)
    return x, y


@pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
def test_small_designs_keep_the_defaults(dtype):
    x, y = _data(20, dtype)
    model = fit_weight_ensemble(x, y, generator=torch.Generator().manual_seed(0), **SMALL)
    sel = model.fit_selection
    assert sel["likelihood"] == "heteroscedastic" and sel["swag_scale"] == 0.5
    assert sel["scores"] == {} and sel["recipe"] == "given"
    assert model.likelihood.kind == "heteroscedastic_gaussian"
    homo = fit_weight_ensemble(x, y, likelihood="homoscedastic",
                               generator=torch.Generator().manual_seed(0), **SMALL)  # fmt: skip
    assert homo.likelihood.kind == "homoscedastic_gaussian"
    assert homo.fit_selection["noise_variance"] == homo.likelihood.noise_variance > 0
    post = homo.posterior(torch.rand(5, 2, dtype=dtype))
    assert post.mean.shape == (5, 1) and post.mean.dtype == dtype
    assert bool(torch.isfinite(post.variance).all())


@pytest.mark.parametrize("method", ["swag", "multiswag", "pca_ess"])
def test_hold_out_chooses_likelihood_and_scale(method):
    x, y = _data(220, torch.float64)
    kw = {**SMALL, "num_components": 2, "rank": 3}
    model = fit_weight_ensemble(x, y, method=method, generator=torch.Generator().manual_seed(1),
                                **kw)  # fmt: skip
    sel = model.fit_selection
    assert set(sel["scores"]) == {("given", "homoscedastic"), ("given", "heteroscedastic")}
    best = max(sel["scores"], key=sel["scores"].get)
    assert sel["likelihood"] == best[1]
    assert 0.0 <= sel["swag_scale"] <= 4.0
    if method == "pca_ess":
        assert sel["temperature"] > 0
    if sel["likelihood"] == "homoscedastic":
        assert sel["noise_variance"] == model.likelihood.noise_variance
    fixed = fit_weight_ensemble(x, y, method=method, likelihood="heteroscedastic", swag_scale=0.3,
                                generator=torch.Generator().manual_seed(1), **kw)  # fmt: skip
    assert list(fixed.fit_selection["scores"]) == [("given", "heteroscedastic")]
    assert fixed.fit_selection["swag_scale"] == 0.3


def test_recipe_candidates_are_chosen_on_the_hold_out():
    x, y = _data(220, torch.float64, seed=2)
    good = TrainingRecipe(30, 32, 1e-2, 1e-3, 20)
    frozen = TrainingRecipe(30, 32, 1e-7, 1e-3, 20)
    model = fit_weight_ensemble(
        x, y, likelihood="homoscedastic", recipes={"frozen": frozen, "good": good},
        hidden_features=(16,), num_samples=4, generator=torch.Generator().manual_seed(0),
    )  # fmt: skip
    sel = model.fit_selection
    assert sel["recipe"] == "good"
    assert sel["scores"][("good", "homoscedastic")] > sel["scores"][("frozen", "homoscedastic")]
    assert math.isfinite(sel["scores"][("good", "homoscedastic")])


def test_errors():
    x, y = _data(20, torch.float64)
    with pytest.raises(InputDataError, match="likelihood"):
        fit_weight_ensemble(x, y, likelihood="student_t")
    with pytest.raises(InputDataError, match="swag_scale"):
        fit_weight_ensemble(x, y, swag_scale=-1.0)
    with pytest.raises(InputDataError, match="recipes"):
        fit_weight_ensemble(x, y, recipes={})

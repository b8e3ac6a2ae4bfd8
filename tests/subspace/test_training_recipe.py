"""Public training recipes and their held-out choice (gpext.subspace.training_recipe)."""

import math

import pytest
import torch

import gpext_bench.methods_subspace as ms
from gpext.errors import InputDataError
from gpext.nn import MLP
from gpext.subspace import (
    DRBAYES_RECIPES,
    GPEXT_RECIPE,
    OutputLikelihood,
    RecipeSelection,
    TrainingRecipe,
    recipe_candidates,
    select_recipe,
    train_sgd_trajectory,
    training_recipe,
)


class TestTrainingRecipe:
    def test_tables_and_lookup(self):
        assert DRBAYES_RECIPES["yacht"] == TrainingRecipe(1000, 30, 1e-3, 1e-1, 500)
        assert GPEXT_RECIPE == TrainingRecipe(200, None, 1e-2, 1e-3, 100, swa_lr=5e-3)
        assert training_recipe("energy") is DRBAYES_RECIPES["energy"]
        assert training_recipe("kin8nm") is GPEXT_RECIPE and training_recipe() is GPEXT_RECIPE
        assert list(recipe_candidates("boston")) == ["drbayes", "gpext"]
        assert list(recipe_candidates(None)) == ["gpext"]

    def test_the_benchmark_uses_the_library_recipes(self):
        assert ms.TrainingRecipe is TrainingRecipe and ms.RecipeSelection is RecipeSelection
        assert ms.FALLBACK_RECIPE is GPEXT_RECIPE
        for name in ("boston", "naval", "diabetes"):
            assert ms.training_recipe(name) == training_recipe(name)
            assert ms.training_recipe(name, quick=True) == training_recipe(name).shortened(10)

    def test_shortened(self):
        q = DRBAYES_RECIPES["naval"].shortened(10)
        assert (q.epochs, q.collect_from) == (100, 50)
        q = DRBAYES_RECIPES["boston"].shortened(10)
        assert (q.epochs, q.collect_from, q.num_collections) == (30, 10, 20)
        assert GPEXT_RECIPE.shortened(10).num_collections == 20
        with pytest.raises(InputDataError):
            GPEXT_RECIPE.shortened(0)

    def test_validation(self):
        for bad in (
            (10, 5, 1e-3, 0.0, 10),
            (10, 5, 0.0, 0.0, 5),
            (10, 5, 1e-3, -1.0, 5),
            (10, 0, 1e-3, 0.0, 5),
        ):
            with pytest.raises(InputDataError):
                TrainingRecipe(*bad)
        with pytest.raises(InputDataError):
            TrainingRecipe(10, 5, 1e-3, 0.0, 5, swa_lr=float("nan"))

    @pytest.mark.parametrize("dtype", (torch.float32, torch.float64))
    def test_train_is_train_sgd_trajectory(self, dtype):
        recipe = TrainingRecipe(6, 8, 1e-2, 1e-3, 3, swa_lr=5e-3)
        x = torch.randn(20, 2, dtype=dtype, generator=torch.Generator().manual_seed(0))
        y = x.sum(-1)
        torch.manual_seed(0)
        a = MLP(2, [4], 1).to(dtype)
        b = MLP(2, [4], 1).to(dtype)
        b.load_state_dict(a.state_dict())
        lik = OutputLikelihood("gaussian", noise_variance=0.1)
        ta = recipe.train(
            a, x, y, lik, max_deviations=5, generator=torch.Generator().manual_seed(1)
        )
        tb = train_sgd_trajectory(
            b, x, y, lik, epochs=6, swa_start=3, lr=1e-2, swa_lr=5e-3, weight_decay=1e-3,
            batch_size=8, max_grad_norm=10.0, max_deviations=5,
            generator=torch.Generator().manual_seed(1),
        )  # fmt: skip
        assert ta.num_collected == 3
        torch.testing.assert_close(ta.swa_weights(), tb.swa_weights())


class TestSelectRecipe:
    def test_best_and_failures(self):
        from gpext.errors import NumericalError

        cands = recipe_candidates("yacht")

        def score(name, recipe):
            if name == "drbayes":
                raise NumericalError("diverged")
            return -recipe.weight_decay, f"run-{name}"

        sel = select_recipe(cands, score)
        assert sel.name == "gpext" and sel.scores["drbayes"] == -math.inf
        assert sel.results["gpext"] == "run-gpext" and sel.seconds >= 0
        name, scores, seconds, results = sel  # a NamedTuple
        sel = select_recipe([GPEXT_RECIPE, DRBAYES_RECIPES["yacht"]], lambda n, r: r.epochs)
        assert sel.name == "1" and sel.results == {"0": None, "1": None}
        with pytest.raises(InputDataError, match="every candidate"):
            select_recipe(cands, lambda n, r: float("nan"))
        with pytest.raises(InputDataError):
            select_recipe({}, lambda n, r: 0.0)
        with pytest.raises(InputDataError):
            select_recipe({"a": "not a recipe"}, lambda n, r: 0.0)

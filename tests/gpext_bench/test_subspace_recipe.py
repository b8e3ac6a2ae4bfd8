"""The training recipe of the subspace UCI benchmark and the bookkeeping of ``--combine``."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

import gpext_bench.methods_subspace as ms
from gpext.errors import InputDataError
from gpext_bench import BenchConfig, write_results
from gpext_bench.data import load_dataset

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_sub_bench", BENCH / "subspace_uci.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(BENCH))
    return module


class TestTrainingRecipe:
    def test_drbayes_table(self):
        expected = {  # epochs, batch, lr, weight decay, collect from (drbayes run_ucismall.sh)
            "boston": (300, 30, 1e-3, 1e-1, 200),
            "concrete": (1000, 100, 1e-3, 1e-2, 500),
            "energy": (1000, 100, 1e-3, 1e-1, 500),
            "naval": (1000, 100, 5e-4, 1e-4, 500),
            "yacht": (1000, 30, 1e-3, 1e-1, 500),
        }
        for name, (epochs, batch, lr, wd, start) in expected.items():
            r = ms.training_recipe(name)
            assert (r.epochs, r.batch_size, r.lr, r.weight_decay, r.collect_from) == (
                epochs,
                batch,
                lr,
                wd,
                start,
            )
            assert r.swa_lr is None  # constant learning rate
            assert r.num_collections == epochs - start
        fallback = ms.training_recipe("diabetes")
        assert fallback == ms.TrainingRecipe(200, None, 1e-2, 1e-3, 100, swa_lr=5e-3)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fallback.epochs = 3

    def test_quick_scaling_keeps_the_collecting_fraction(self):
        q = {n: ms.training_recipe(n, quick=True) for n in ("boston", "naval", "diabetes")}
        # boston: 300 / 10 epochs, collection moved from epoch 20 to 10 for 20 collections
        assert (q["boston"].epochs, q["boston"].collect_from) == (30, 10)
        assert (q["naval"].epochs, q["naval"].collect_from) == (100, 50)
        assert (q["diabetes"].epochs, q["diabetes"].collect_from) == (20, 0)  # at least 20
        assert all(r.num_collections >= ms.QUICK_MIN_COLLECTIONS == 20 for r in q.values())
        full = ms.training_recipe("naval")
        assert (q["naval"].lr, q["naval"].batch_size, q["naval"].weight_decay) == (
            full.lr,
            full.batch_size,
            full.weight_decay,
        )
        assert ms.training_recipe("boston").with_epochs(1).collect_from == 0
        assert ms.training_recipe("yacht").with_epochs(3).collect_from == 2  # < epochs

    def test_invalid_recipes(self):
        with pytest.raises(InputDataError, match="collect_from"):
            ms.TrainingRecipe(10, 5, 1e-3, 0.0, 10)
        with pytest.raises(InputDataError, match="collect_from"):
            ms.TrainingRecipe(10, 5, 1e-3, 0.0, -1)
        with pytest.raises(InputDataError, match="lr"):
            ms.TrainingRecipe(10, 5, 0.0, 0.0, 5)
        with pytest.raises(InputDataError, match="weight_decay"):
            ms.TrainingRecipe(10, 5, 1e-3, -1.0, 5)
        with pytest.raises(InputDataError, match="batch_size"):
            ms.TrainingRecipe(10, 0, 1e-3, 0.0, 5)
        with pytest.raises(InputDataError, match="epochs"):
            ms.training_recipe("boston").with_epochs(0)

    def test_inkpca_feed_every(self):
        assert [ms.inkpca_feed_every(c) for c in (1, 10, 100, 149, 151, 500)] == [1, 1, 1, 1, 2, 5]
        assert ms.inkpca_feed_every(500, target=50) == 10
        with pytest.raises(InputDataError, match="num_collections"):
            ms.inkpca_feed_every(0)

    def test_the_run_follows_the_recipe(self, monkeypatch):
        calls = []
        original = ms.train_sgd_trajectory

        def spy(*args, **kwargs):
            calls.append(kwargs)
            return original(*args, **kwargs)

        monkeypatch.setattr(ms, "train_sgd_trajectory", spy)
        split = load_dataset("diabetes", 2)
        recipe = ms.TrainingRecipe(310, 400, 2e-3, 1e-2, 10)  # 300 collections, 1 step an epoch
        config = BenchConfig(quick=True, seed=3)
        run = ms.fit_subspace_run(split, config, recipe=recipe, validation_fraction=0.0)
        (kw,) = calls
        assert (kw["epochs"], kw["swa_start"], kw["batch_size"]) == (310, 10, 400)
        assert kw["lr"] == kw["swa_lr"] == 2e-3 and kw["weight_decay"] == 1e-2
        assert kw["max_grad_norm"] == ms.MAX_GRAD_NORM
        assert run.recipe == recipe and run.trajectory.num_collected == 300
        assert run.fa.num_observations == 300  # every iterate of the collection phase
        assert run.inkpca.feed_every == 3 and run.inkpca.subspace.num_points == 100
        assert ms.fit_subspace_run(split, config, recipe=recipe) is run  # cached
        # without a recipe: the data set's full recipe (here the fallback) over `epochs`
        config = BenchConfig(quick=True, seed=4)  # a new cache key
        ms.fit_subspace_run(split, config, epochs=12, validation_fraction=0.0)
        assert calls[-1]["epochs"] == 12 and calls[-1]["swa_start"] == 6
        # neither: the quick-scaled recipe of the data set
        ms.fit_subspace_run(split, BenchConfig(quick=True, seed=5), validation_fraction=0.0)
        assert (calls[-1]["epochs"], calls[-1]["swa_start"]) == (20, 0)
        assert calls[-1]["lr"] == 1e-2 and calls[-1]["swa_lr"] == 5e-3
        assert calls[-1]["batch_size"] is None


def _part(tmp_path, name, datasets, splits=2, quick=False, failures=(), first=0):
    g = torch.Generator().manual_seed(len(name) + first)
    rows = []
    for ds in datasets:
        for split in range(first, first + splits):
            for method in ("swag", "pca_ess", "pca_vi", "inkpca_ess", "subspace_swa"):
                row = {"dataset": ds, "method": method, "split": split}
                row.update(
                    rmse=float(torch.rand((), generator=g)),
                    coverage95=0.9 + 0.05 * float(torch.rand((), generator=g)),
                    seconds=float(torch.rand((), generator=g)),
                    test_ll=-float(torch.rand((), generator=g)) + (8 if ds == "naval" else 0),
                )
                if method.startswith(("pca", "inkpca")):
                    row["temperature"] = 3.0
                    row["temperature_exponent"] = (0.5, -1.0)[split % 2]
                rows.append(row)
    out = tmp_path / name
    write_results(
        "subspace_uci",
        [],
        out,
        command=f"python benchmarks/subspace_uci.py --datasets {' '.join(datasets)} --out {name}",
        extra={
            "splits": splits,
            "quick": quick,
            "failures": list(failures),
            "per_split_rows": rows,
        },
    )
    return out, rows


class TestCombine:
    def test_combined_equals_one_run(self, bench, tmp_path, monkeypatch):
        a, rows_a = _part(tmp_path, "a", ["naval"])
        b, rows_b = _part(tmp_path, "b", ["boston", "yacht"])
        parts = bench.combine_parts([a, b])
        assert [r["dataset"] for r in parts["rows"]][:1] == ["boston"]  # DATASETS order
        assert parts["rows"] == rows_b + rows_a
        out = tmp_path / "combined"
        monkeypatch.setattr(sys, "argv", ["subspace_uci.py", "--combine", str(a), str(b)])
        monkeypatch.setattr(bench, "RESULTS", out)
        bench.main()
        payload = json.loads((out / "subspace_uci.json").read_text())
        table, goals, temps, *_ = bench.summarise(rows_b + rows_a, ["boston", "yacht", "naval"])
        assert payload["rows"] == json.loads(json.dumps(table))
        assert payload["goals"] == goals and payload["splits"] == 2 and not payload["quick"]
        # naval beats the published 6.708, boston and yacht do not: 1 of 3
        assert goals["best_subspace_method_beats_published_ll_on_3_of_5"] is False
        assert payload["chosen_temperature_exponents"] == temps
        assert temps["naval"] == {
            "pca": {"e=0.5": 1, "e=-1.0": 1},
            "inkpca": {"e=0.5": 1, "e=-1.0": 1},
        }
        assert payload["command"] == (
            "python benchmarks/subspace_uci.py --datasets naval --out a; "
            "python benchmarks/subspace_uci.py --datasets boston yacht --out b"
        )
        assert payload["per_split_rows"] == json.loads(json.dumps(rows_b + rows_a))
        assert payload["protocol"] == bench.PROTOCOL
        md = (out / "subspace_uci.md").read_text()
        assert "| naval | pca_ess |" in md and "per_split_rows**: in `subspace_uci.json`" in md
        assert all(not k.startswith("temperature") for r in payload["rows"] for k in r)
        n = {(r["dataset"], r["method"]): r["n"] for r in payload["rows"]}
        assert set(n.values()) == {2} and len(n) == 15
        ll = [r["test_ll"] for r in rows_a if r["method"] == "swag"]
        row = next(r for r in payload["rows"] if r["method"] == "swag" and r["dataset"] == "naval")
        assert math.isclose(row["test_ll"], sum(ll) / 2)

    def test_splits_of_one_data_set_across_parts(self, bench, tmp_path):
        a, rows_a = _part(tmp_path, "a", ["naval"], splits=3)
        b, rows_b = _part(tmp_path, "b", ["naval", "yacht"], splits=2, first=3)
        c, rows_c = _part(tmp_path, "c", ["yacht"], splits=3)
        parts = bench.combine_parts([b, c, a])
        assert parts["splits"] == 5 and parts["quick"] is False
        key = [(r["dataset"], r["split"]) for r in parts["rows"]]
        assert key == sorted(key, key=lambda k: (bench.DATASETS.index(k[0]), k[1]))
        yacht_b = [r for r in rows_b if r["dataset"] == "yacht"]
        naval_b = [r for r in rows_b if r["dataset"] == "naval"]
        assert parts["rows"] == rows_c + yacht_b + rows_a + naval_b
        assert len(parts["commands"]) == 3 and parts["commands"][0].endswith("--out b")

    def test_combine_errors(self, bench, tmp_path, monkeypatch):
        a, _ = _part(tmp_path, "a", ["naval"])
        b, _ = _part(tmp_path, "b", ["naval", "yacht"], first=1)
        c, _ = _part(tmp_path, "c", ["boston"], splits=3)
        d, _ = _part(tmp_path, "d", ["energy"], quick=True)
        with pytest.raises(InputDataError, match=r"disjoint.*'naval', 1"):
            bench.combine_parts([a, b])
        with pytest.raises(InputDataError, match="same splits for every data set"):
            bench.combine_parts([a, c])
        with pytest.raises(InputDataError, match="quick"):
            bench.combine_parts([a, d])
        with pytest.raises(InputDataError, match="subspace_uci.json"):
            bench.combine_parts([tmp_path / "missing"])
        with pytest.raises(InputDataError, match="one or more"):
            bench.combine_parts([])
        other = tmp_path / "other"
        write_results("subspace_uci", [], other, command="x")  # no per-split rows
        with pytest.raises(InputDataError, match="per_split_rows"):
            bench.combine_parts([other])
        flags = (["--datasets", "naval"], ["--splits", "2"], ["--quick"], ["--first-split", "3"])
        for extra in flags:
            monkeypatch.setattr(sys, "argv", ["subspace_uci.py", "--combine", str(a), *extra])
            with pytest.raises(SystemExit):
                bench.main()
        monkeypatch.setattr(sys, "argv", ["subspace_uci.py", "--combine", str(a), str(b)])
        with pytest.raises(SystemExit):  # the CLI reports the InputDataError as a usage error
            bench.main()
        for extra in (["--first-split", "-1"], ["--first-split", "20"]):
            monkeypatch.setattr(sys, "argv", ["subspace_uci.py", "--datasets", "yacht", *extra])
            with pytest.raises(SystemExit):  # no split index to run
                bench.main()


class TestRecipeSelection:
    def test_candidates(self):
        assert list(ms.recipe_candidates("yacht")) == ["drbayes", "gpext"]
        assert ms.recipe_candidates("yacht")["drbayes"] == ms.training_recipe("yacht")
        assert ms.recipe_candidates("yacht")["gpext"] == ms.FALLBACK_RECIPE
        assert list(ms.recipe_candidates("kin8nm")) == ["gpext"]
        quick = ms.recipe_candidates("naval", quick=True)
        assert quick["drbayes"] == ms.training_recipe("naval", quick=True)
        assert quick["gpext"].epochs == 20 and quick["gpext"].num_collections == 20

    @pytest.mark.parametrize("bad", ["gpext", "drbayes"])
    def test_validation_picks_the_recipe_that_trains(self, monkeypatch, bad):
        # one candidate barely moves from its initialisation (learning rate 1e-7): the search
        # must pick the other one on the validation rows, whichever name it has
        good = ms.TrainingRecipe(40, 64, 1e-2, 1e-3, 20)
        frozen = ms.TrainingRecipe(40, 64, 1e-7, 1e-3, 20)
        cands = {"drbayes": good, "gpext": good}
        cands[bad] = frozen
        monkeypatch.setattr(ms, "recipe_candidates", lambda name, quick=False: dict(cands))
        split = load_dataset("diabetes", 3)
        config = BenchConfig(quick=True, seed=11 + len(bad))
        run = ms.fit_subspace_run(split, config, rank=3)
        search = run.recipe_search
        chosen = "gpext" if bad == "drbayes" else "drbayes"
        assert run.recipe_name == search.name == chosen and run.recipe == good
        assert run.selection_run.recipe == good
        assert search.scores[chosen] > search.scores[bad]
        # the score is the best validation log-likelihood over both subspaces and the grid
        best = max(
            v for sel in run.selection_run.selections.values() for v in sel.validation_ll.values()
        )
        assert math.isclose(search.scores[chosen], best)
        # every method pays for the whole search, and says which recipe it used
        from gpext_bench.registry import get_method

        for name in ("swag", "subspace_swa", "pca_ess"):
            info = get_method(name).fit_predict(split, config).info
            assert info["seconds"] >= run.train_seconds + search.seconds
            assert info["drbayes_recipe"] == float(chosen == "drbayes")
        assert run.selection_seconds() == run.selection_seconds("pca") == search.seconds

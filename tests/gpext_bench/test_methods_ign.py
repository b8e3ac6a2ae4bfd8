"""Tests of the shared IGN benchmark budget (``gpext_bench.methods_ign``) and its refit option."""

from __future__ import annotations

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gpext.models import InducingGPNetwork
from gpext_bench import methods_ign as M
from gpext_bench.data import load_dataset
from gpext_bench.registry import BenchConfig

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def diabetes():
    return load_dataset("diabetes", dtype=torch.float32)


def _renamed(split, name, n=None):
    if n is None:
        return dataclasses.replace(split, name=name)
    x = split.train_x[:1].expand(n, -1)
    return dataclasses.replace(split, name=name, train_x=x, train_y=split.train_y[:1].expand(n))


class TestBudgetTable:
    def test_table_covers_the_benchmark_sets_with_multiples_of_the_old_budget(self):
        bench_sets = {"elevators", "pol", "keggdirected", "protein", "bike"}
        assert set(M.REGRESSION_EPOCHS) == bench_sets
        for name, epochs in M.REGRESSION_EPOCHS.items():
            old = 6 if name in ("keggdirected", "protein") else 12  # > 20000 training rows
            assert epochs in (old, 2 * old, 4 * old), name
        assert M.REFIT_RIDGE in (0.01, 0.1, 1.0)
        assert set(M.IGN_MINIBATCH_COVARIANCE) == bench_sets
        assert set(M.IGN_MINIBATCH_COVARIANCE.values()) <= {"full", "independent"}

    @pytest.mark.parametrize("name", ["elevators", "pol", "keggdirected", "protein", "bike"])
    def test_full_budget_uses_the_table(self, diabetes, name):
        budget = M.ign_budget(_renamed(diabetes, name), BenchConfig(quick=False))
        assert budget["epochs"] == M.REGRESSION_EPOCHS[name]
        assert budget["refit_ridge"] == M.REFIT_RIDGE
        assert budget["minibatch_covariance"] == M.IGN_MINIBATCH_COVARIANCE[name]
        assert budget["num_inducing"] == 128 and budget["lr_schedule"] == "cosine"

    def test_quick_budget_and_fallback_rule(self, diabetes):
        quick = M.ign_budget(_renamed(diabetes, "pol"), BenchConfig(quick=True))
        assert (quick["epochs"], quick["num_inducing"]) == (4, 64)
        assert M.ign_budget(diabetes, BenchConfig(quick=False))["epochs"] == 12
        fallback = M.ign_budget(diabetes, BenchConfig(quick=False))["minibatch_covariance"]
        assert fallback == "independent"
        big = _renamed(diabetes, "other", n=20001)
        assert M.ign_budget(big, BenchConfig(quick=False))["epochs"] == 6
        assert M.ign_budget(big, BenchConfig(quick=True))["epochs"] == 2

    def test_classification_budget_has_no_ridge(self):
        budget = M.ign_budget(load_dataset("digits"), BenchConfig(quick=False))
        assert "refit_ridge" not in budget and budget["epochs"] == 10


class TestRefitRidge:
    BUDGET = {"num_inducing": 16, "epochs": 2, "batch_size": 64, "lr": 5e-3, "gp_lr": 0.02,
              "lr_schedule": "cosine"}  # fmt: skip

    def _manual(self, split, config, ridge, covariance="independent"):
        """The model ``fit_predict_ign`` should build, written out with the model's own API."""
        torch.manual_seed(config.seed)
        gen = torch.Generator().manual_seed(config.seed)
        model = InducingGPNetwork(
            M.make_embedding(split), num_inducing=16, minibatch_covariance=covariance
        )
        b = self.BUDGET
        # ridge 1 (or None): the fit's own pseudo-label refit; another ridge: refit after
        model.fit(
            split.train_x, split.train_y, epochs=b["epochs"], batch_size=b["batch_size"],
            lr=b["lr"], gp_lr=b["gp_lr"], lr_schedule=b["lr_schedule"], generator=gen,
            refit_pseudo_labels=ridge in (None, 1.0), show_progress=False,
        )  # fmt: skip
        if ridge not in (None, 1.0):
            model.refit_pseudo_labels(split.train_x, split.train_y, ridge=ridge)
        return model.predict(split.test_x)

    def test_ridge_one_equals_fit_default_refit(self, diabetes):
        config = BenchConfig(quick=True, seed=3, dtype=torch.float32, show_progress=False)
        pred = M.fit_predict_ign(diabetes, config, budget={**self.BUDGET, "refit_ridge": 1.0})
        mean, var = self._manual(diabetes, config, None)
        torch.testing.assert_close(pred.mean, mean)
        torch.testing.assert_close(pred.variance, var)
        assert pred.info["refit_ridge"] == 1.0

    def test_small_ridge_is_applied(self, diabetes):
        config = BenchConfig(quick=True, seed=3, dtype=torch.float32, show_progress=False)
        small = M.fit_predict_ign(diabetes, config, budget={**self.BUDGET, "refit_ridge": 0.01})
        mean, _ = self._manual(diabetes, config, 0.01)
        torch.testing.assert_close(small.mean, mean)
        default = M.fit_predict_ign(diabetes, config, budget=dict(self.BUDGET))
        assert not torch.allclose(small.mean, default.mean)

    def test_full_covariance_option_with_refit(self, diabetes):
        config = BenchConfig(quick=True, seed=5, dtype=torch.float32, show_progress=False)
        budget = {**self.BUDGET, "refit_ridge": 1.0, "minibatch_covariance": "full"}
        pred = M.fit_predict_ign(diabetes, config, budget=budget)
        mean, var = self._manual(diabetes, config, 1.0, covariance="full")
        torch.testing.assert_close(pred.mean, mean)
        torch.testing.assert_close(pred.variance, var)
        indep = M.fit_predict_ign(
            diabetes, config, budget={**budget, "minibatch_covariance": "independent"}
        )
        assert not torch.allclose(pred.mean, indep.mean)


def test_benchmark_protocol_states_the_selection():
    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("_ign_bench", BENCH / "ign.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(BENCH))
    info = bench.protocol_info(False, 5, {"pol": {"epochs": 1}}, True)
    assert info["regression_folds"] == [0, 1, 2, 3, 4]
    assert "TRAINING rows" in info["budget_selection"]
    assert f"ridge={M.REFIT_RIDGE:g}" in info["ign_pseudo_labels"]

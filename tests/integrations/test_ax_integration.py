"""Ax's modular BoTorch interface runs gpext adapters with no user subclassing (issue 17, item 3).

A short Ax optimisation of Branin (5 Sobol trials, then BoTorch trials) with
``ModelConfig(botorch_model_class=<gpext adapter>)``: Ax builds the adapter with its
``construct_inputs`` and constructor and fits it through the routine gpext registers with Ax's
``fit_botorch_model`` dispatcher.  Skipped where ``ax-platform`` is not installed.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("ax")

import ax.generators.torch.botorch_modular.utils as ax_utils  # noqa: E402
from ax.adapter.registry import Generators  # noqa: E402
from ax.api.client import Client  # noqa: E402
from ax.api.configs import RangeParameterConfig  # noqa: E402
from ax.core.trial_status import TrialStatus  # noqa: E402
from ax.generation_strategy.generation_node import GenerationStep  # noqa: E402
from ax.generation_strategy.generation_strategy import GenerationStrategy  # noqa: E402
from ax.generators.torch.botorch_modular.surrogate import SurrogateSpec  # noqa: E402
from ax.generators.torch.botorch_modular.utils import ModelConfig  # noqa: E402
from botorch.utils.datasets import SupervisedDataset  # noqa: E402
from botorch.utils.dispatcher import Dispatcher, type_bypassing_encoder  # noqa: E402

from gpext.integrations.botorch import (  # noqa: E402
    GWISurrogate,
    IGNSurrogate,
    LatentGPSurrogate,
    SampleEnsembleSurrogate,
    VBootSurrogate,
    WeightEnsembleSurrogate,
)
from gpext.integrations.botorch.ax_support import fit_ax_surrogate, register_ax_fit  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::gpext.errors.FitWarning")

BOUNDS = {"x1": (-5.0, 10.0), "x2": (0.0, 15.0)}
NUM_SOBOL, NUM_BO = 5, 2


def branin(x1: float, x2: float) -> float:
    b, c, t = 5.1 / (4 * math.pi**2), 5 / math.pi, 1 / (8 * math.pi)
    return (x2 - b * x1**2 + c * x1 - 6) ** 2 + 10 * (1 - t) * math.cos(x1) + 10


def run_ax(model_class, model_options=None, mll_options=None) -> Client:
    """Minimise Branin with Ax: NUM_SOBOL Sobol trials, then NUM_BO trials of the adapter."""
    torch.manual_seed(0)  # the networks' initial weights
    client = Client(random_seed=0)
    client.configure_experiment(
        parameters=[
            RangeParameterConfig(name=name, parameter_type="float", bounds=bounds)
            for name, bounds in BOUNDS.items()
        ]
    )
    client.configure_optimization(objective="-branin")
    config = ModelConfig(
        botorch_model_class=model_class,
        model_options=model_options or {},
        mll_options=mll_options or {},
    )
    small_optimizer = {"optimizer_kwargs": {"num_restarts": 2, "raw_samples": 64}}
    client.set_generation_strategy(
        GenerationStrategy(
            nodes=[
                GenerationStep(generator=Generators.SOBOL, num_trials=NUM_SOBOL),
                GenerationStep(
                    generator=Generators.BOTORCH_MODULAR,
                    num_trials=-1,
                    generator_kwargs={"surrogate_spec": SurrogateSpec(model_configs=[config])},
                    generator_gen_kwargs={"model_gen_options": small_optimizer},
                ),
            ]
        )
    )
    for _ in range(NUM_SOBOL + NUM_BO):
        for index, params in client.get_next_trials(max_trials=1).items():
            client.complete_trial(index, raw_data={"branin": branin(params["x1"], params["x2"])})
    return client


def in_bounds(params: dict) -> bool:
    return all(lo <= params[name] <= hi for name, (lo, hi) in BOUNDS.items())


# (model class, model_options -> construct_inputs, mll_options -> the fit), kept small
CASES = {
    "ign": (IGNSurrogate, {"hidden_features": (16,), "num_inducing": 8}, {"epochs": 30}),
    "weight_ensemble": (
        WeightEnsembleSurrogate,
        None,
        {"epochs": 40, "swa_epochs": 10, "num_samples": 8},
    ),
    "vboot_rff": (
        VBootSurrogate,
        {"num_features": 128, "num_particles": 16, "hyper_iters": 20},
        None,
    ),
    "gwi": (GWISurrogate, None, {"epochs": 20, "from_data": {"prior_steps": 10}}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_short_ax_optimisation(case):
    model_class, model_options, mll_options = CASES[case]
    client = run_ax(model_class, model_options, mll_options)
    trials = client._experiment.trials
    assert len(trials) == NUM_SOBOL + NUM_BO
    assert all(t.status == TrialStatus.COMPLETED for t in trials.values())
    for index in range(NUM_SOBOL, NUM_SOBOL + NUM_BO):
        trial = trials[index]
        assert "BoTorch" in str(trial.generator_run._generation_node_name)
        assert in_bounds(trial.arm.parameters)
    # the model Ax used is the gpext adapter, fitted on every observation
    surrogate = client._generation_strategy.adapter.generator.surrogate
    model = surrogate.model
    assert type(model) is model_class
    assert model.train_X.shape == (NUM_SOBOL + NUM_BO - 1, 2)
    posterior = model.posterior(torch.rand(3, 1, 2, dtype=model.train_X.dtype))
    assert bool(torch.isfinite(posterior.mean).all())
    # the best point by model predictions (Ax cross-validates the adapter first)
    best_params, _, best_index, _ = client.get_best_parameterization()
    assert in_bounds(best_params) and best_index in trials


def test_construct_inputs_registers_the_fit_routine(monkeypatch):
    # a fresh dispatcher in place of Ax's: construct_inputs alone must register gpext's routine
    fresh = Dispatcher(name="fit_botorch_model", encoder=type_bypassing_encoder)
    monkeypatch.setattr(ax_utils, "fit_botorch_model", fresh)
    data = SupervisedDataset(
        torch.rand(4, 2, dtype=torch.float64),
        torch.rand(4, 1, dtype=torch.float64),
        feature_names=["x1", "x2"],
        outcome_names=["y"],
    )
    IGNSurrogate.construct_inputs(data)
    for cls in (IGNSurrogate, GWISurrogate, VBootSurrogate, WeightEnsembleSurrogate):
        assert fresh.dispatch(cls) is fit_ax_surrogate
    assert fresh.funcs[(LatentGPSurrogate,)] is fit_ax_surrogate
    assert fresh.funcs[(SampleEnsembleSurrogate,)] is fit_ax_surrogate
    assert register_ax_fit() is False  # already registered: idempotent
    monkeypatch.undo()
    register_ax_fit()
    assert ax_utils.fit_botorch_model.dispatch(VBootSurrogate) is fit_ax_surrogate

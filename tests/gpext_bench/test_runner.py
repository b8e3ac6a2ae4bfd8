import pytest
import torch

from gpext.errors import InputDataError
from gpext_bench import BenchConfig, Prediction, evaluate_prediction, run_benchmark
from gpext_bench.data import load_dataset


def test_evaluate_regression_in_original_units():
    split = load_dataset("diabetes")
    s = float(split.y_scaler.std)
    perfect = Prediction(mean=split.test_y.clone(), variance=torch.full_like(split.test_y, 0.01))
    scores = evaluate_prediction(split, perfect)
    assert scores["rmse"] == pytest.approx(0.0, abs=1e-8)
    # N(0; 0, 0.01 s^2) in original units
    expected_nll = 0.5 * torch.log(torch.tensor(2 * torch.pi * 0.01 * s**2, dtype=torch.float64))
    assert scores["nll"] == pytest.approx(float(expected_nll), rel=1e-9)
    assert scores["coverage95"] == 1.0
    with pytest.raises(InputDataError):
        evaluate_prediction(split, Prediction(probs=torch.ones(split.num_test, 2) / 2))


def test_evaluate_classification():
    split = load_dataset("wine")
    probs = torch.nn.functional.one_hot(split.test_y, split.num_classes).double()
    scores = evaluate_prediction(split, Prediction(probs=probs))
    assert scores["error"] == 0.0 and scores["ece"] == pytest.approx(0.0, abs=1e-12)
    uniform = torch.full((split.num_test, split.num_classes), 1.0 / split.num_classes)
    scores = evaluate_prediction(split, Prediction(probs=uniform))
    assert scores["mnll"] == pytest.approx(float(torch.log(torch.tensor(3.0))), rel=1e-6)


@pytest.mark.slow
def test_run_benchmark_quick_baselines_beat_trivial_predictors():
    cfg = BenchConfig(quick=True, seed=0)
    run = run_benchmark(
        ["diabetes", "wine"],
        ["gpytorch_exact_gp", "gpytorch_svgp_softmax"],
        config=cfg,
        raise_errors=True,
    )
    rows = {(r["dataset"], r["method"]): r for r in run.rows}
    assert set(rows) == {("diabetes", "gpytorch_exact_gp"), ("wine", "gpytorch_svgp_softmax")}
    split = load_dataset("diabetes")
    # predicting the training mean gives RMSE ~ std of the test targets; the GP must do better
    trivial = float(((split.test_y_original - split.y_scaler.mean) ** 2).mean().sqrt())
    assert rows[("diabetes", "gpytorch_exact_gp")]["rmse"] < 0.9 * trivial
    assert rows[("wine", "gpytorch_svgp_softmax")]["error"] < 0.15
    assert all(r["seconds"] > 0 for r in run.rows)

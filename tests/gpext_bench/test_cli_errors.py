"""Bad arguments, failing methods, seeds, progress lines and result files of ``gpext bench``."""

import json

import pytest
import torch

from gpext.errors import InputDataError
from gpext_bench import BenchConfig, Prediction, aggregate_rows, registry, run_benchmark
from gpext_bench.cli import main
from gpext_bench.runner import split_seeds


def _trivial(split, config):
    """Predict the training mean with unit variance (instant)."""
    m = split.test_y.shape[0]
    return Prediction(mean=split.test_y.new_zeros(m), variance=split.test_y.new_ones(m))


@pytest.fixture
def fake_methods(monkeypatch):
    """Register fast fake regression methods: ``ok``, ``boom`` (raises) and ``timed``."""
    registry.list_methods()  # load the built-ins first
    seen = []

    def ok(split, config):
        seen.append((split.split_index, config.seed, split.test_indices.clone()))
        return _trivial(split, config)

    def boom(split, config):
        raise RuntimeError("index out of range in self")

    def timed(split, config):
        pred = _trivial(split, config)
        pred.info["seconds"] = 123.0
        return pred

    for name, fn in (("fake_ok", ok), ("fake_boom", boom), ("fake_timed", timed)):
        method = registry.BenchMethod(name, "regression", fn, "test", __name__, False)
        monkeypatch.setitem(registry._REGISTRY, name, method)
    return seen


def _bench(tmp_path, *extra):
    return main(["bench", "--quick", "--dataset", "diabetes", "--out", str(tmp_path / "o"),
                 "--no-plot", *extra])  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--methods", "fake_ok", "--splits", "0"], "splits: expected an integer >= 1, got 0"),
        (["--methods", "fake_ok", "--splits", "-1"], "splits: expected an integer >= 1, got -1"),
        (["--methods", "gpytorch_svgp_softmax"], "is a classification method"),
        (["--methods", "no_such_method"], "gpext bench --list"),
        (["--methods", "fake_ok", "--seed", "-3"], "seed: expected an integer in [0, "),
        (["--methods", "fake_ok", "--device", "nonsense"], "device: expected"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, fake_methods, extra, needle):
    assert _bench(tmp_path, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpext: error:") and needle in err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_is_a_clean_error(tmp_path, capsys, fake_methods):
    assert _bench(tmp_path, "--methods", "fake_ok", "--device", "cuda") == 2
    err = capsys.readouterr().err
    assert err.startswith("gpext: error: device:") and "--device cpu" in err


def test_a_failing_method_is_recorded_and_the_run_goes_on(tmp_path, capsys, fake_methods):
    code = _bench(tmp_path, "--methods", "fake_boom", "fake_ok", "--splits", "2")
    assert code == 1
    captured = capsys.readouterr()
    assert "FAILED diabetes split 0 / fake_boom: RuntimeError: index out of range" in captured.err
    payload = json.loads((tmp_path / "o" / "gpext_bench.json").read_text())
    per_split = payload["per_split"]
    failed = [r for r in per_split if r["method"] == "fake_boom"]
    assert len(failed) == 2 and all("RuntimeError" in r["failure"] for r in failed)
    assert all("rmse" not in r for r in failed)
    assert len([r for r in per_split if r["method"] == "fake_ok" and "rmse" in r]) == 2
    rows = {r["method"]: r for r in payload["rows"]}
    assert rows["fake_boom"]["failed"] == 2 and rows["fake_boom"]["n"] == 0
    assert rows["fake_ok"]["n"] == 2 and "failed" not in rows["fake_ok"]


def test_run_benchmark_raise_errors_reraises_any_exception(fake_methods):
    with pytest.raises(RuntimeError):
        run_benchmark(["diabetes"], ["fake_boom"], config=BenchConfig(quick=True),
                      raise_errors=True)  # fmt: skip


def test_aggregate_rows_skips_failed_rows_even_when_first():
    rows = [
        {"dataset": "d", "method": "m", "split": 0, "seconds": 1.0, "failure": "X: y"},
        {"dataset": "d", "method": "m", "split": 1, "rmse": 2.0, "seconds": 3.0},
    ]
    (agg,) = aggregate_rows(rows)
    assert agg["rmse"] == 2.0 and agg["seconds"] == 3.0 and agg["n"] == 1 and agg["failed"] == 1


def test_seeds_are_disjoint_across_base_seeds(fake_methods):
    data = {split_seeds(k, s)[0] + s for k in range(20) for s in range(20)}
    fit = {split_seeds(k, s)[1] for k in range(20) for s in range(20)}
    assert len(data) == 400 and len(fit) == 400
    assert split_seeds(0, 3) == (0, 3000)  # seed 0 keeps the earlier splits and fit seeds
    cfg0, cfg1 = BenchConfig(quick=True, seed=0), BenchConfig(quick=True, seed=1)
    run_benchmark(["diabetes"], ["fake_ok"], config=cfg0, splits=[1])
    run_benchmark(["diabetes"], ["fake_ok"], config=cfg1, splits=[0])
    (s1, seed_a, test_a), (s0, seed_b, test_b) = fake_methods
    assert (s1, s0) == (1, 0)
    assert seed_a != seed_b
    assert not torch.equal(test_a, test_b)


def test_progress_lines_when_not_a_terminal(tmp_path, capsys, fake_methods):
    assert _bench(tmp_path, "--methods", "fake_ok", "fake_timed", "--splits", "2") == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("gpext bench [")]
    assert len(lines) == 4
    assert lines[0].startswith("gpext bench [1/4] diabetes split 0 fake_ok:")
    assert lines[-1].startswith("gpext bench [4/4] diabetes split 1 fake_timed: 123.00 s")


def test_seconds_come_from_prediction_info(fake_methods):
    run = run_benchmark(["diabetes"], ["fake_timed", "fake_ok"], config=BenchConfig(quick=True))
    seconds = {r["method"]: r["seconds"] for r in run.rows}
    assert seconds["fake_timed"] == 123.0 and seconds["fake_ok"] < 123.0


def test_markdown_keeps_per_split_rows_out(tmp_path, fake_methods):
    assert _bench(tmp_path, "--methods", "fake_ok", "--splits", "2") == 0
    md = (tmp_path / "o" / "gpext_bench.md").read_text()
    assert '"split": 1' not in md and "**per_split**: in `gpext_bench.json`" in md
    payload = json.loads((tmp_path / "o" / "gpext_bench.json").read_text())
    assert len(payload["per_split"]) == 2


def test_empty_method_list_is_an_error():
    with pytest.raises(InputDataError, match="at least one method"):
        run_benchmark(["diabetes"], [], config=BenchConfig(quick=True))


def test_metric_figure_has_one_panel_per_metric(tmp_path):
    pytest.importorskip("matplotlib")
    from gpext_bench.plots import plot_metrics

    rows = [
        {"dataset": "d", "method": m, "rmse": 1.0 + k, "rmse_se": 0.1, "nll": 0.5, "seconds": 2.0}
        for k, m in enumerate(("a", "b", "c"))
    ]
    path = plot_metrics(rows, tmp_path / "f.png")
    assert path is not None and path.stat().st_size > 0
    import matplotlib.image

    height, width = matplotlib.image.imread(path).shape[:2]
    assert width > 2.5 * height  # three panels side by side

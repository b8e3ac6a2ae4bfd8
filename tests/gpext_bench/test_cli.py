import json
import subprocess
import sys

from gpext_bench.cli import build_parser, main


def test_parser_accepts_documented_flags():
    args = build_parser().parse_args(
        [
            "bench",
            "--quick",
            "--data-dir",
            "d",
            "--dataset",
            "a",
            "b",
            "--methods",
            "m",
            "--out",
            "o",
        ]
    )
    assert args.quick and args.data_dir == "d" and args.datasets == ["a", "b"]
    assert args.methods == ["m"] and args.out == "o"


def test_bench_list(capsys):
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    assert "gpytorch_svgp" in out and "classification" in out


def test_unknown_dataset_is_a_clean_error(capsys, monkeypatch):
    monkeypatch.delenv("GPEXT_DATA_DIR", raising=False)
    assert main(["bench", "--quick", "--dataset", "no_such_set"]) == 2
    err = capsys.readouterr().err
    assert "gpext: error:" in err and "diabetes" in err


def test_module_entry_point_runs_bench_end_to_end(tmp_path):
    out = tmp_path / "res"
    proc = subprocess.run(
        [sys.executable, "-m", "gpext_bench", "bench", "--quick", "--dataset", "diabetes",
         "--methods", "gpytorch_svgp", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "| diabetes | gpytorch_svgp |" in proc.stdout
    payload = json.loads((out / "gpext_bench.json").read_text())
    assert payload["benchmark"] == "gpext_bench"
    assert payload["rows"][0]["method"] == "gpytorch_svgp"
    assert (out / "gpext_bench.md").exists() and (out / "gpext_bench.png").exists()


def test_missing_scikit_learn_names_the_extra():
    code = (
        "import sys\n"
        "sys.modules['sklearn'] = None  # as if scikit-learn were not installed\n"
        "from gpext.errors import MissingExtraError\n"
        "try:\n"
        "    import gpext_bench.cli\n"
        "except MissingExtraError as err:\n"
        "    print(err)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert "pip install gpext[bench]" in proc.stdout

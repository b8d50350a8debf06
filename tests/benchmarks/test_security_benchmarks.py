"""The security benchmarks run end to end on tiny settings and print what their docstrings promise."""

import importlib.util
import json
import os


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_robust_benchmark_table_and_json(tmp_path, capsys):
    out = tmp_path / "robust.json"
    assert (
        _load("robust").main(["--seeds", "0", "--bad", "1", "--clients", "4", "--rounds", "2", "--out", str(out)]) == 0
    )
    table = capsys.readouterr().out
    assert "| 1 of 4 |" in table and "median" in table
    saved = json.loads(out.read_text())
    assert {r["config"] for r in saved["rows"] if r["bad"] == 1} == {"mean", "median", "trimmed_mean(0.3)"}
    assert saved["git_commit"] and saved["command"].startswith("python benchmarks/robust.py")


def test_secure_round_benchmark_sums_equal_plain(tmp_path, capsys):
    out = tmp_path / "secure_round.json"
    assert _load("secure_round").main(["--clients", "6", "--rounds", "2", "--out", str(out)]) == 0
    assert "| 6 | sparse |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert {r["config"] for r in rows} == {"plain", "sparse", "all-pairs"}
    assert max(r["max_param_diff"] for r in rows) < 1e-6  # masking changes only the fixed-point round-off

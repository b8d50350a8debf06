"""Errors fast and whole (issue 33): usage and data errors are one line, exit 2, name every problem at once, and
come before TensorFlow is imported; options a command would ignore are refused; a dataset a command does not take
is refused with the reason; a missing optional package names the extra to install."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpflow_fed.cli import main

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = r"""
import contextlib, io, json, sys
from gpflow_fed.cli import main
out = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out.append([code, err.getvalue(), "tensorflow" in sys.modules])
print(json.dumps(out))
"""


def _csv(path: Path, empty_row: int = 0, parties: str = "ab", los: str = "{:.2f}") -> Path:
    rows = ["hospital,age,los"]
    for k in range(12):
        value = "" if k + 1 == empty_row else los.format(5 + 0.1 * k)
        rows.append(f"{parties[k % len(parties)]},{20 + 3 * k},{value}")
    path.write_text("\n".join(rows) + "\n")
    return path


CASES = [
    (["fsgp", "--csv", "{missing}", "--party-column", "h", "--target", "y"], ["CSV file", "missing.csv not found"]),
    (["fsgp", "--csv", "{csv}"], ["--csv needs --party-column COL and --target COL"]),
    (
        ["pvi", "--csv", "{csv}", "--target", "los", "--clients", "3", "--max-points", "9"],
        ["--csv needs --party-column COL", "--clients, --max-points would be ignored"],
    ),
    (
        [
            "fsgp",
            "--csv",
            "{csv}",
            "--party-column",
            "hospital",
            "--target",
            "los",
            "--clients",
            "3",
            "--partition",
            "iid",
        ],
        ["--clients, --partition would be ignored", "every party of --party-column is one client"],
    ),  # fmt: skip
    (
        ["fsgp", "--csv", "{empty}", "--party-column", "hospital", "--target", "los"],
        ["column 'los': missing value in data row 5; impute or drop it"],
    ),
    (
        ["recycle", "--csv", "{csv}", "--party-column", "hospital", "--target", "stay"],
        ["target 'stay' is not a column of the table (columns: hospital, age, los)"],
    ),
    (["pvi", "--dataset", "synthetic1"], ["--dataset synthetic1 does not suit pvi", "use gpflow-fed fsgp"]),
    (["recycle", "--dataset", "co2"], ["--dataset co2 does not suit recycle", "for a real table use --csv"]),
    (["fsgp", "--dataset", "synthetic2", "--test-fraction", "0.3"], ["--test-fraction would be ignored"]),
    (["fedbnr", "--alpha", "2"], ["--alpha would be ignored", "--aggregation kd"]),
    (["fsgp", "--target", "los", "--features", "age"], ["--target, --features only apply to --csv FILE"]),
    (["fsgp", "--rounds", "0"], ["argument --rounds: must be a positive integer, got 0"]),
    (["recycle", "ensemble", "{missing_npz}"], ["No such file", "missing.npz"]),
    (
        ["flower", "app", "app_dir", "--algorithm", "pkg.mod:fn", "--clients", "0", "--superlink", "nohost"],
        ["--clients must be at least 1, got 0", "--superlink must be HOST:PORT"],
    ),
    (["datasets", "--write-example", "{csv}"], ["File exists"]),
    # issue 45: too few parties for secure aggregation, named, with the option that changes it
    (
        ["fsgp", "--csv", "{one}", "--party-column", "hospital", "--target", "los"],
        ["1 party ('a') from --party-column hospital", "needs at least 2", "--party-column hospital must give 2"],
    ),
    (["recycle", "--csv", "{one}", "--party-column", "hospital", "--target", "los"], ["1 party ('a')"]),
    (["pvi", "--csv", "{one}", "--party-column", "hospital", "--target", "los"], ["1 party ('a')"]),
    (["fedbnr", "--clients", "1"], ["1 client ('client_0') from --clients", "--clients must give 2 or more"]),
    (
        ["fsgp", "--clients", "3", "--client-fraction", "0.3"],
        ["--client-fraction 0.3 asks 1 of the 3 clients", "raise --client-fraction to 0.67 or more"],
    ),
    (["fsgp", "--csv", "{csv}", "--party-column", "hospital", "--target", "los", "-M", "12"], ["lower --inducing"]),
    (
        ["flower", "server", "--clients", "1", "--save", "{model}"],
        ["--clients 1 is below --min-cohort 2", "start 2 parties or more (--clients 2)"],
    ),
    # a target with nothing to learn
    (
        ["fsgp", "--csv", "{constant}", "--party-column", "hospital", "--target", "los"],
        ["the target 'los' has the same value in every row", "pick another --target"],
    ),
    (
        ["pvi", "--csv", "{flat}", "--party-column", "hospital", "--target", "los"],
        ["the target 'los' varies by", "of its mean", "subtract a known offset"],
    ),
    # table errors name the command's options, not Python's parameters
    (
        ["fsgp", "--csv", "{csv}", "--party-column", "hospital", "--target", "los", "--features", "age", "age"],
        ["--features names a column twice"],
    ),  # fmt: skip
]


def test_errors_come_before_tensorflow_in_one_line(tmp_path):
    files = {
        "csv": str(_csv(tmp_path / "h.csv")),
        "empty": str(_csv(tmp_path / "e.csv", empty_row=5)),
        "one": str(_csv(tmp_path / "one.csv", parties="a")),
        "constant": str(_csv(tmp_path / "c.csv", los="7")),
        "flat": str(_csv(tmp_path / "f.csv", los="10000{:.2f}")),  # 100005.00 … 100006.10: σ/μ ≈ 3.5e-6
        "missing": str(tmp_path / "missing.csv"),
        "missing_npz": str(tmp_path / "missing.npz"),
        "model": str(tmp_path / "model.npz"),
    }
    argvs = [[a.format(**files) for a in argv] for argv, _ in CASES]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, json.dumps(argvs)], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for (argv, expected), (code, err, tensorflow) in zip(CASES, json.loads(done.stdout)):
        assert code == 2, (argv, err)
        assert not tensorflow, f"{argv} imported TensorFlow before reporting: {err}"
        lines = [line for line in err.splitlines() if line.strip()]
        assert lines[-1].startswith("gpflow-fed ") and "Traceback" not in err, err
        assert all(text in err for text in expected), (argv, err)
        if "usage:" not in err:
            assert len(lines) == 1, err


def test_missing_data_extra_is_one_line_naming_it(monkeypatch, capsys):
    """Without the 'data' extra (statsmodels absent) the default dataset is refused with how to install it."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name, *args):
        return None if name.split(".")[0] == "statsmodels" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["fsgp", "--quick"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "--dataset co2 needs the package 'statsmodels'" in err and 'pip install "gpflow-fed[data]"' in err


def test_dataset_registry_matches_the_library():
    from gpflow_fed.cli.datasets import ACCEPTS, PACKAGES, REAL_DATASETS
    from gpflow_fed.data import real

    assert PACKAGES == {name: package for name, (_, package) in real._LOADERS.items()}
    for command in ("fsgp", "fedbnr", "pvi"):
        assert set(REAL_DATASETS) <= set(ACCEPTS[command][0])  # every real dataset suits every regression command


@pytest.mark.parametrize("command", [["fsgp"], ["pvi"], ["fedbnr"], ["recycle"]])
def test_every_table_command_names_all_missing_options(command, capsys, tmp_path):
    assert main([*command, "--csv", str(_csv(tmp_path / "h.csv"))]) == 2
    assert "--csv needs --party-column COL and --target COL" in capsys.readouterr().err

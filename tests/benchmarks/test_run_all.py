"""``benchmarks/run_all.py`` (``make bench`` / ``make bench-full``): every script has a profile, runs are logged."""

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def run_all(load_benchmark):
    return load_benchmark("run_all")


def test_every_script_is_profiled_or_excluded_with_a_reason(run_all):
    scripts = {p.stem for p in BENCHMARKS.glob("*.py") if "__main__" in p.read_text()}
    assert scripts == set(run_all.PROFILES) | set(run_all.NOT_PROFILED)
    assert not set(run_all.PROFILES) & set(run_all.NOT_PROFILED)
    for name, profiles in run_all.PROFILES.items():
        assert set(profiles) == {"quick", "full"} and profiles["quick"] and profiles["full"], name


def test_full_profile_reproduces_the_saved_runs_it_names(run_all):
    """A ``--json``/``--out``/``--save`` target of the full profile in ``benchmarks/results/`` is a saved run whose
    command is that line (a ``--summarize`` line only reads its ``--out``; a target elsewhere is a fresh run's)."""
    for command in run_all.invocations("full", None):
        if "--summarize" in command:
            read = [path for path in command if path.startswith("benchmarks/results/")]  # every file it reads
            assert read and all((BENCHMARKS.parent / path).exists() for path in read), command
            continue
        for flag in ("--json", "--out", "--save"):
            if flag in command and command[command.index(flag) + 1].startswith("benchmarks/results/"):
                target = BENCHMARKS.parent / command[command.index(flag) + 1]
                recorded = json.loads(target.read_text()).get("command")
                assert recorded in (None, " ".join(["python", *command])), (command, recorded)


def test_unknown_script_is_refused(run_all):
    with pytest.raises(SystemExit, match="unknown benchmark"):
        run_all.invocations("quick", ["nope"])


def test_a_run_writes_its_log_and_a_summary_with_provenance(run_all, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["benchmarks/run_all.py", "--only", "secure_aggregation"])
    assert run_all.main(["--only", "secure_aggregation", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "quick" / "summary.json").read_text())
    assert summary["git_commit"] and summary["command"].startswith("python benchmarks/run_all.py")
    (record,) = summary["runs"]
    assert record["exit_code"] == 0 and record["seconds"] > 0
    assert record["command"].startswith("python benchmarks/secure_aggregation.py --clients")
    assert "× plain" in (tmp_path / "quick" / "secure_aggregation-0.log").read_text()

"""The README's and the quickstart guide's own-data commands, run as written (issue 33).

Default suite: every ``gpflow-fed …`` line of their bash blocks runs verbatim in one folder, in order (the first
writes ``hospitals.csv``, later ones read it), through the command's ``main`` in this process; the Python blocks
run as written with the FSGP rounds of :data:`gpflow_fed.fitting.DEFAULTS` reduced. Slow suite: the same blocks
through ``bash`` with the documented ``source .venv/bin/activate`` (a ``.venv`` whose ``gpflow-fed`` runs this
checkout), the Python blocks at their full settings, and ``make run``'s command.
"""

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.cli import main

# One pytest-xdist worker (setup.cfg's --dist loadgroup): the lines run in order in one folder, as a reader runs them.
pytestmark = pytest.mark.xdist_group("test_readme_commands")

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
QUICKSTART = (ROOT / "docs" / "guides" / "quickstart.md").read_text(encoding="utf-8")
ACTIVATE = "source .venv/bin/activate"


def _section(text: str, title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, f"no '## {title}' section"
    return match.group(1)


def _blocks(text: str, title: str, language: str) -> list:
    return re.findall(rf"```{language}\n(.*?)```", _section(text, title), flags=re.S)


def _commands(block: str) -> list:
    """The block's command lines, comments dropped (``#`` outside quotes)."""
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    return [words for words in lines if words]


README_BASH = _blocks(README, "Your own data", "bash")
GUIDE_BASH = _blocks(QUICKSTART, "Your own data", "bash")
COMMANDS = [words for block in README_BASH + GUIDE_BASH for words in _commands(block)]


def test_the_blocks_are_what_a_newcomer_reads():
    assert len(README_BASH) == 1 and len(GUIDE_BASH) == 1
    readme = _commands(README_BASH[0])
    assert readme[0] == shlex.split(ACTIVATE) and readme[1][:2] == ["gpflow-fed", "datasets"]
    assert "--write-example" in readme[1] and readme[1][-1] == "hospitals.csv"  # the table the others read
    assert ".venv/bin/gpflow-fed" in README and ".venv/bin/tensorboard" in README  # how to reach the commands
    assert "docs/guides/quickstart.md" in README  # the guide is linked
    assert all(words[0] == "gpflow-fed" for words in COMMANDS[1:]), COMMANDS


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("words", COMMANDS[1:], ids=[" ".join(w[1:4]) for w in COMMANDS[1:]])
def test_command_runs_as_written(words, folder, monkeypatch, capsys):
    """Each line in order, in one folder: exit 0, and a training command reports in the target's units."""
    from gpflow_fed.data import write_example_csv

    monkeypatch.chdir(folder)
    argv = list(words[1:])
    if argv[0] == "datasets" and (folder / "hospitals.csv").exists():  # both documents write the same table
        argv[-1] = "second.csv"
    if argv[0] != "datasets" and not (folder / "hospitals.csv").exists():  # pytest-xdist ran the first line elsewhere
        write_example_csv(folder / "hospitals.csv")
    if argv[:2] == ["recycle", "ensemble"] and not (folder / argv[2]).exists():  # and the `recycle locals` line
        (locals_line,) = [w for w in COMMANDS if w[1:3] == ["recycle", "locals"] and argv[2] in w]
        assert main(locals_line[1:] + ["--no-progress"]) == 0
    if argv[0] != "datasets":
        argv.append("--no-progress")
    assert main(argv) == 0
    out = capsys.readouterr().out
    if "--csv" in argv and not {"locals", "ensemble"} & set(argv):
        assert "the units of los" in out, out


def _run_python(block: str, namespace: dict) -> dict:
    exec(compile(block, "docs", "exec"), namespace)
    return namespace


def test_python_blocks_run_as_written(folder, monkeypatch):
    """README's and the guide's Python for the table, with FSGP's default rounds reduced to 5."""
    from gpflow_fed import fitting
    from gpflow_fed.data import write_example_csv

    monkeypatch.chdir(folder)
    if not (folder / "hospitals.csv").exists():
        write_example_csv(folder / "hospitals.csv")
    monkeypatch.setitem(fitting.DEFAULTS, "fsgp", {**fitting.DEFAULTS["fsgp"], "rounds": 5})
    (readme,) = _blocks(README, "Your own data", "python")
    ns = _run_python(readme, {})
    assert ns["result"].metrics["test_rmse"] < ns["result"].metrics["baseline_rmse"]
    assert 2 < float(ns["mean"][0, 0]) < 10 and (folder / "los.npz").is_file()  # days
    (guide,) = _blocks(QUICKSTART, "Your own data", "python")
    ns = _run_python(guide.replace("rounds=20", "rounds=5"), {})
    for a, b in zip(ns["reloaded"].predict_y(np.array([[45.0, 0.5]])), (ns["mean"], ns["var"])):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)


def _venv(folder: Path) -> dict:
    """A ``.venv`` in ``folder`` whose ``activate`` puts a ``gpflow-fed`` running this checkout on PATH."""
    bin_dir = folder / ".venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
    script = bin_dir / "gpflow-fed"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m gpflow_fed.cli "$@"\n')
    script.chmod(0o755)
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.mark.slow
def test_blocks_through_bash_and_make_run(tmp_path):
    """The bash blocks verbatim in bash (the documented activation included), the Python blocks at full
    settings, and the command ``make run`` runs (the Makefile's, full size)."""
    env = _venv(tmp_path)
    for block in (README_BASH[0], GUIDE_BASH[0].replace("gpflow-fed datasets --write-example hospitals.csv", "")):
        script = block if ACTIVATE in block else f"{ACTIVATE}\n{block}"
        done = subprocess.run(
            ["bash", "-e", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800
        )
        assert done.returncode == 0, done.stderr[-3000:]
    code = "\n".join(
        [f"import os; os.chdir({str(tmp_path)!r})", *_blocks(README, "Your own data", "python"),
         *_blocks(QUICKSTART, "Your own data", "python")]
    )  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    make_run = re.search(r"^run: .*\n\t\$\(VENV\)/bin/(.*)$", (ROOT / "Makefile").read_text(), flags=re.M).group(1)
    done = subprocess.run(
        ["bash", "-e", "-c", f"{ACTIVATE}\n{make_run} --no-progress"], cwd=tmp_path, env=env, capture_output=True,
        text=True, timeout=3600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "| predict the mean |" in done.stdout and (tmp_path / "runs" / "fsgp" / "model.npz").is_file()

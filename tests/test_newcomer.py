"""A newcomer's first hour, scripted: three hospitals' data in one CSV through the CLI (fsgp, pvi, recycle,
privacy) with defaults plus ``--quick``, the one-call Python helper on a DataFrame, ``--help`` everywhere, and no
warning line from our code anywhere in the output.

The CLI walkthrough runs in one fresh interpreter (as a user's shell would, TensorFlow imported once), the
commands one after another; each must print its table (or JSON), and write TensorBoard events and a PNG.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.cli import SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
NOISE = re.compile(r"warning|retracing|traceback|deprecat", re.IGNORECASE)


def _hospitals_csv(path: Path) -> Path:
    """Three hospitals, each over its own age range (non-iid), length of stay a smooth function of age."""
    rng = np.random.default_rng(0)
    lines = ["hospital,age,los"]
    for name, low, high in (("north", 20, 50), ("south", 40, 70), ("east", 60, 90)):
        age = rng.uniform(low, high, 40)
        los = 5 + 3 * np.sin(age / 10) + 0.3 * rng.normal(size=age.size)
        lines += [f"{name},{a:.2f},{y:.3f}" for a, y in zip(age, los)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _commands(csv: Path, out: Path):
    own = ["--csv", str(csv), "--party-column", "hospital", "--target", "los"]
    return {
        "fsgp": ["fsgp", *own, "--quick", "--logdir", str(out / "fsgp")],
        "pvi": ["pvi", *own, "--quick", "--logdir", str(out / "pvi"), "--json"],
        "locals": [
            "recycle",
            "locals",
            *own,
            "--quick",
            "--out",
            str(out / "rec" / "models"),
            "--logdir",
            str(out / "rec"),
        ],
        "ensemble": [
            "recycle",
            "ensemble",
            str(out / "rec" / "models.npz"),
            *own,
            "--quick",
            "--json",
            "--logdir",
            str(out / "rec"),
        ],
        "privacy": [
            "privacy",
            str(csv),
            "--x",
            "age",
            "--y",
            "los",
            "--sensitive",
            "45",
            "--alpha",
            "0.5",
            "--quick",
            "--out",
            str(out / "release"),
            "--logdir",
            str(out / "privacy"),
        ],
    }


_SCRIPT = """
import sys
from gpflow_fed.cli import main
for name, argv in {commands!r}.items():
    print("=== " + name, flush=True)
    print("=== " + name, file=sys.stderr, flush=True)
    code = main(argv)
    assert code == 0, (name, code)
"""


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory):
    out = tmp_path_factory.mktemp("newcomer")
    csv = _hospitals_csv(out / "hospitals.csv")
    commands = _commands(csv, out)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the CLI must silence TensorFlow itself
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT.format(commands=commands)],
        env=env,
        cwd=out,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def sections(text):
        parts = re.split(r"^=== (\w+)\n", text, flags=re.M)[1:]
        return dict(zip(parts[::2], parts[1::2]))

    return out, sections(done.stdout), sections(done.stderr), done.stdout + done.stderr


def _events(folder: Path) -> list:
    return list(folder.rglob("events.out.tfevents.*"))


def test_no_warning_lines_anywhere(walkthrough):
    *_, everything = walkthrough
    noisy = [line for line in everything.splitlines() if NOISE.search(line)]
    assert not noisy, noisy
    assert "absl::InitializeLog" not in everything and "cuda" not in everything.lower()


def test_fsgp_table_events_and_plot(walkthrough):
    out, stdout, _, _ = walkthrough
    text = stdout["fsgp"]
    assert "| FSGP (fedavg) |" in text and "| centralized SGPR |" in text and "K=3" in text
    assert (out / "fsgp" / "fsgp.png").stat().st_size > 10_000 and _events(out / "fsgp")


def test_pvi_json_events_and_plot(walkthrough):
    out, stdout, _, _ = walkthrough
    payload = json.loads(stdout["pvi"])
    assert np.isfinite(payload["test_rmse"]) and np.isfinite(payload["test_nlpd"]) and payload["dataset"] == "hospitals"
    assert Path(payload["plot"]).is_file() and _events(out / "pvi")


def test_recycle_locals_then_ensemble(walkthrough):
    out, stdout, _, _ = walkthrough
    assert json.loads(stdout["locals"])["saved"] == str(out / "rec" / "models.npz")  # .npz appended, folder created
    ensemble = json.loads(stdout["ensemble"])
    assert ensemble["models"] == 3 and ensemble["test_rmse"] < 1.0  # standardised units: better than the mean
    assert Path(ensemble["plot"]).is_file() and (out / "rec" / "recycle-locals.png").is_file()
    assert _events(out / "rec")


def test_privacy_release(walkthrough):
    out, stdout, _, _ = walkthrough
    assert "released 120 points, 1 sensitive" in stdout["privacy"]
    assert {p.name for p in (out / "release").iterdir()} == {"released.csv", "model.npz", "privacy.png"}
    assert (out / "privacy" / "privacy-raw-vs-released.png").is_file() and _events(out / "privacy")


def test_every_subcommand_has_help():
    code = (
        "from gpflow_fed.cli import main\n"
        f"for argv in {[[n] for n in SUBCOMMANDS] + [['recycle', 'locals'], ['recycle', 'ensemble']]!r}:\n"
        "    try:\n        main(argv + ['--help'])\n    except SystemExit as e:\n        assert e.code == 0\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and done.stdout.count("usage: gpflow-fed") == len(SUBCOMMANDS) + 2
    assert not done.stderr


def test_one_call_fit_on_a_dataframe(tmp_path):
    pd = pytest.importorskip("pandas")
    import gpflow_fed

    frame = pd.read_csv(_hospitals_csv(tmp_path / "h.csv"))
    result = gpflow_fed.fit(frame, party_column="hospital", target="los", rounds=10)
    assert result.metrics["test_rmse"] < float(frame["los"].std())  # data units, better than predicting the mean
    assert repr(result).startswith("FederatedResult(model=AggregatedSGPR")

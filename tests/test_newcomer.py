"""A newcomer's first hour, scripted: three hospitals' data in one CSV through the CLI (fsgp, pvi, recycle,
privacy) with defaults plus ``--quick``, the one-call Python helper on a DataFrame, ``--help`` everywhere, and no
warning line in the output but the ones listed in :data:`EXPECTED_WARNINGS` (a too-short PVI run is
over-confident, and says so).

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

# One pytest-xdist worker (setup.cfg's --dist loadgroup): the walkthrough fixture is built once.
pytestmark = pytest.mark.xdist_group("test_newcomer")

ROOT = Path(__file__).resolve().parents[1]
NOISE = re.compile(r"warning|retracing|traceback|deprecat", re.IGNORECASE)
#: a line of TensorFlow's C++ log (absl), wherever it starts (after a progress bar, too):
#: ``E0000 00:00:1796293443.046392   20130 util.cc:131] …``
TENSORFLOW_LOG = re.compile(r"\b[IWEF]\d{4} \d\d:\d\d:[\d.]+ +\d+ [\w.]+:\d+\] ")


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
        "pvi_short": ["pvi", *own, "--rounds", "2", "--local-steps", "5", "-M", "5", "--logdir", str(out / "pvi2")],
        "locals": [
            "recycle",
            "locals",
            *own,
            "--quick",
            "--out",
            str(out / "rec" / "models"),
            "--logdir",
            str(out / "rec"),
            "--json",
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
            "--csv",
            str(csv),
            "--features",
            "age",
            "--target",
            "los",
            "--sensitive",
            "45",
            "--alpha",
            "0.5",
            # public design hyperparameters (in years and days): a release fits nothing on the raw outputs
            "--lengthscale",
            "10",
            "--variance",
            "4",
            "--noise-variance",
            "1",
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


#: section -> the warning lines (regular expressions) the newcomer sees there; nothing else may warn.
EXPECTED_WARNINGS = {
    "pvi_short": [
        r"^warning: PVI \(dpo\) is over-confident: its 90 % predictive interval covers \d+% of the 24 held-out "
        r"points \(expected about 90 %, warning below 70%\)"
    ],
}


def test_warnings_are_exactly_the_expected_ones(walkthrough):
    _, stdout, stderr, everything = walkthrough
    for section in stdout:
        lines = (stdout[section] + stderr.get(section, "")).splitlines()
        noisy = [line for line in lines if NOISE.search(line) and not line.strip().startswith('"warnings": ')]
        expected = EXPECTED_WARNINGS.get(section, [])
        assert len(noisy) == len(expected), (section, noisy)
        for line, pattern in zip(noisy, expected):
            assert re.search(pattern, line), (section, line)
    assert "absl::InitializeLog" not in everything and "cuda" not in everything.lower()
    # no line of TensorFlow's C++ log either (issue 45: PVI's int32 ops drew oneDNN's ERROR-level fallback notice)
    tensorflow_logs = [line for line in everything.splitlines() if TENSORFLOW_LOG.search(line)]
    assert tensorflow_logs == [], tensorflow_logs


def test_fsgp_table_events_and_plot(walkthrough):
    out, stdout, _, _ = walkthrough
    text = stdout["fsgp"]
    assert "| FSGP (fedavg) |" in text and "| centralized SGPR |" in text and "| predict the mean |" in text
    assert "sizes={east: 32, north: 32, south: 32}" in text and "metrics in the units of los" in text
    assert (out / "fsgp" / "fsgp.png").stat().st_size > 10_000 and _events(out / "fsgp")


def test_pvi_json_events_and_plot(walkthrough):
    out, stdout, _, _ = walkthrough
    payload = json.loads(stdout["pvi"])
    model, baseline = payload["results"]
    assert np.isfinite(model["test_rmse"]) and np.isfinite(model["test_nlpd"])
    assert payload["dataset"]["name"] == "hospitals" and model["test_rmse"] < baseline["test_rmse"]
    assert Path(payload["outputs"]["plot"]).is_file() and _events(out / "pvi")


def test_recycle_locals_then_ensemble(walkthrough):
    out, stdout, _, _ = walkthrough
    saved = json.loads(stdout["locals"])["outputs"]["local_models"]
    assert saved == str(out / "rec" / "models.npz")  # .npz appended, folder created
    ensemble = json.loads(stdout["ensemble"])
    model, baseline = ensemble["results"]
    assert ensemble["settings"]["models"] == 3 and model["test_rmse"] < baseline["test_rmse"]
    assert Path(ensemble["outputs"]["plot"]).is_file() and (out / "rec" / "recycle-locals.png").is_file()
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
    assert result.metrics["test_rmse"] < result.metrics["baseline_rmse"]  # data units, better than the mean
    assert repr(result).startswith("FederatedResult(model=StandardizedModel")
    mean, _ = result.model.predict_y(np.array([[30.0], [80.0]]))  # raw ages in, days out
    assert np.all(np.abs(mean.numpy() - frame["los"].mean()) < 4)

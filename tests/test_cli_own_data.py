"""``--csv/--party-column/--target/--features`` across subcommands: fedbnr end to end, and the option checks."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.cli import main


def _csv(path: Path) -> Path:
    rng = np.random.default_rng(2)
    rows = ["site,x,z,y"]
    for site in ("a", "b", "c"):
        x = rng.uniform(-2, 2, 25)
        rows += [f"{site},{v:.3f},{w:.3f},{np.sin(2 * v) + 0.1 * w:.3f}" for v, w in zip(x, rng.normal(size=25))]
    path.write_text("\n".join(rows) + "\n")
    return path


def test_fedbnr_on_a_csv_json_events_and_plot(tmp_path, capsys):
    csv = _csv(tmp_path / "sites.csv")
    argv = [
        "fedbnr",
        "--csv",
        str(csv),
        "--party-column",
        "site",
        "--target",
        "y",
        "--features",
        "x",
        "--quick",
        "--json",
        "--logdir",
        str(tmp_path / "runs"),
    ]
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["dataset"] == "sites" and {"test_rmse", "test_nlpd", "test_ece", "test_mce"} <= set(payload)
    assert Path(payload["plot"]).is_file() and list((tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert main(argv[:-4] + ["--aggregation", "kd"]) == 2
    assert "needs server-side distillation data" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--target", "y"], "--target only apply to --csv FILE"),
        (["--csv", "{csv}", "--target", "y"], "--csv needs --party-column COL"),
        (
            ["--csv", "{csv}", "--party-column", "site", "--target", "w"],
            "target 'w' is not a column of the table (columns: site, x, z, y)",
        ),
    ],
)
@pytest.mark.parametrize("command", [["fsgp"], ["pvi"], ["fedbnr"], ["recycle", "locals", "--out", "m.npz"]])
def test_option_errors_are_one_line_and_name_the_fix(tmp_path, capsys, command, extra, message):
    csv = str(_csv(tmp_path / "sites.csv"))
    argv = [*command, *[a.replace("{csv}", csv) for a in extra], "--logdir", str(tmp_path / "runs")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1

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
    assert payload["dataset"]["name"] == "sites" and payload["dataset"]["parties"] == ["a", "b", "c"]
    model, baseline = payload["results"]
    assert {"test_rmse", "test_nlpd", "test_ece", "test_mce", "test_coverage_90"} <= set(model)
    assert baseline["method"] == "predict the mean"
    assert Path(payload["outputs"]["plot"]).is_file() and list((tmp_path / "runs").rglob("events.out.tfevents.*"))
    assert main(argv[:-4] + ["--aggregation", "kd"]) == 2
    assert "needs server-side distillation data" in capsys.readouterr().err


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_fsgp_on_a_csv_is_what_fit_returns(tmp_path, capsys):
    """One set of defaults and one code path: the CLI's headline row is fit's model on the same table and seed."""
    import gpflow_fed
    from gpflow_fed.models import load_model

    csv = _csv(tmp_path / "sites.csv")
    argv = ["fsgp", "--csv", str(csv), "--party-column", "site", "--target", "y", "--rounds", "3", "-M", "6",
            "--seed", "2", "--json", "--no-progress", "--logdir", str(tmp_path / "runs")]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["dataset"]["party_sizes"] == {"a": 20, "b": 20, "c": 20}  # 25 rows each, 5 held out
    assert payload["dataset"]["features"] == ["x", "z"] and payload["dataset"]["units"] == "the units of y"
    headline = payload["results"][0]
    result = gpflow_fed.fit(csv, party_column="site", target="y", rounds=3, num_inducing=6, seed=2)
    for key in ("test_rmse", "test_nlpd", "test_coverage_90", "test_nlpd_standardized"):
        np.testing.assert_allclose(headline[key], result.metrics[key], rtol=1e-9)
    np.testing.assert_allclose(payload["results"][-1]["test_rmse"], result.metrics["baseline_rmse"], rtol=1e-12)
    X = np.array([[0.5, 0.0], [-1.0, 1.0]])
    saved = load_model(payload["outputs"]["model"])
    np.testing.assert_allclose(saved.predict_y(X)[0].numpy(), result.model.predict_y(X)[0].numpy(), rtol=1e-9)


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
@pytest.mark.parametrize(
    "command", [["fsgp"], ["pvi"], ["fedbnr"], ["recycle"], ["recycle", "locals", "--out", "m.npz"]]
)
def test_option_errors_are_one_line_and_name_the_fix(tmp_path, capsys, command, extra, message):
    csv = str(_csv(tmp_path / "sites.csv"))
    argv = [*command, *[a.replace("{csv}", csv) for a in extra], "--logdir", str(tmp_path / "runs")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1

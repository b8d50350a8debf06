"""The ``gpflow-fed fsgp`` command, in process: a tiny end-to-end run with ``--json``, and bad arguments."""

import json
from pathlib import Path

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.cli import SUBCOMMANDS, build_parser, main
from gpflow_fed.cli.fsgp import MethodResult, build_dataset, format_table, make_kernel, resolve_settings
from gpflow_fed.data.standardize import Standardizer

METHODS = [
    "FSGP (fedavg)",
    "exact federated SGPR",
    "centralized SGPR",
    "local-only SGPR (mean of 2)",
    "FGP (rBCM)",
    "predict the mean",
]


def test_fsgp_is_registered() -> None:
    assert "fsgp" in SUBCOMMANDS
    args = build_parser().parse_args(["fsgp"])
    settings = resolve_settings(args)
    assert (settings["dataset"], settings["partition"], settings["mode"]) == ("co2", "random_sizes", "fedavg")
    assert args.logdir == "runs/fsgp"
    from gpflow_fed.fitting import DEFAULTS

    fsgp = DEFAULTS["fsgp"]  # the CLI's defaults are fit's
    assert (settings["rounds"], settings["local_steps"], settings["learning_rate"], settings["inducing"]) == (
        fsgp["rounds"], fsgp["local_steps"], fsgp["learning_rate"], fsgp["num_inducing"]
    )  # fmt: skip


def test_fsgp_json_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    logdir = tmp_path / "runs"
    argv = [
        "fsgp", "--quick", "--dataset", "synthetic1", "--partition", "iid", "--clients", "2", "--rounds", "2",
        "--local-steps", "2", "-M", "5", "--learning-rate", "0.05", "--seed", "3", "--logdir", str(logdir), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["schema_version"] == 1 and payload["command"] == "fsgp"
    settings = payload["settings"]
    assert (settings["clients"], settings["rounds"], settings["local_steps"], settings["inducing"]) == (2, 2, 2, 5)
    assert payload["dataset"]["parties"] == ["client_0", "client_1"]
    assert sum(payload["dataset"]["party_sizes"].values()) == 300  # --quick keeps 300 training rows
    rows = {r["method"]: r for r in payload["results"]}
    assert list(rows) == METHODS
    for row in rows.values():
        assert np.isfinite(row["test_rmse"]) and row["test_rmse"] > 0 and np.isfinite(row["test_nlpd"])
        assert 0 <= row["test_coverage_90"] <= 1 and np.isfinite(row["test_nlpd_standardized"])
    # synthetic1's y = 3 sin(2πx/20) + N(0, 0.5²): predicting the mean scores about its standard deviation (≈ 2.2)
    assert 1.5 < rows["predict the mean"]["test_rmse"] < 3
    # exact federated SGPR is centralized SGPR trained by the same Adam steps, computed from client sums
    for key in ("test_rmse", "test_nlpd"):
        np.testing.assert_allclose(rows["exact federated SGPR"][key], rows["centralized SGPR"][key], rtol=1e-6)
    # centralized "sends" the raw training data: 300 rows of (x, y) in float64
    assert rows["centralized SGPR"]["bytes_sent"] == 300 * 2 * 8
    assert rows["local-only SGPR (mean of 2)"]["bytes_sent"] == 0
    assert rows["FSGP (fedavg)"]["bytes_sent"] > 0

    outputs = payload["outputs"]
    plot = Path(outputs["plot"])
    assert plot == logdir / "fsgp.png" and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from gpflow_fed.models import load_model

    model = load_model(outputs["model"])  # the headline model, in the data's units
    assert outputs["model"] == str(logdir / "model.npz") and model.input_dim == 1
    event_dirs = {p.parent.name for p in logdir.rglob("events.out.tfevents.*")}
    assert event_dirs == {"fsgp-fedavg", "fsgp-exact", "comparison"}
    tags = set()
    for path in (logdir / "comparison").glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tags.add(value.tag)
                if value.tag == "FSGP (fedavg)/test_rmse":
                    np.testing.assert_allclose(
                        float(tf.make_ndarray(value.tensor)), rows["FSGP (fedavg)"]["test_rmse"], rtol=1e-6
                    )
    assert {f"{m}/{k}" for m in METHODS for k in ("test_rmse", "test_nlpd", "seconds", "bytes_sent")} == tags


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--clients", "0"], "argument --clients: must be a positive integer, got 0"),
        (["--rounds", "0"], "argument --rounds: must be a positive integer, got 0"),
        (["--seed", "-1"], "argument --seed: must be a non-negative integer, got -1"),
        (["--learning-rate", "-0.1"], "argument --learning-rate: must be a positive finite number, got -0.1"),
        (["--learning-rate", "inf"], "argument --learning-rate: must be a positive finite number, got inf"),
        (["--test-fraction", "1"], "argument --test-fraction: must be a number in (0, 1), got 1"),
        (
            ["--client-fraction", "1.5"],
            "argument --client-fraction: must be a number in (0, 1] (the fraction ρ of clients per round), got 1.5",
        ),
        (["-M", "many"], "argument --inducing/-M: expected a positive integer, got 'many'"),
        (["--mode", "sgd"], "argument --mode: invalid choice: 'sgd'"),
        (["--dataset", "kin40k"], "argument --dataset: invalid choice: 'kin40k'"),
        (["--client-fraction", "0"], "argument --client-fraction: must be a number in (0, 1]"),
    ],
)
def test_bad_arguments_exit_2(argv: list, message: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fsgp", *argv])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_value_errors_exit_2_before_training(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # 400 inducing points cannot be drawn from 300 training rows: a clear error, no training, exit 2
    code = main(["fsgp", "--quick", "--dataset", "synthetic1", "-M", "400", "--logdir", str(tmp_path), "--json"])
    err = capsys.readouterr().err
    assert code == 2
    assert "gpflow-fed fsgp: error:" in err and "400 inducing points (--inducing)" in err and "300" in err
    assert not list(tmp_path.rglob("events.out.tfevents.*"))


@pytest.mark.usefixtures("nearest_rounding")  # runs compared to the last digits: rounding to nearest
def test_build_dataset_standardizes_with_pooled_statistics() -> None:
    # the CLI uses FederatedDataset.standardized(): pooled mean/std from client summaries, test set mapped alike
    settings = dict(dataset="synthetic1", partition="random_sizes", clients=3, test_fraction=0.2, seed=0, quick=True)
    out, scaler = build_dataset(settings)
    X, Y = out.pooled()
    assert out.num_clients == 3 and out.num_data <= 300
    np.testing.assert_allclose(X.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X.std(0), 1.0, rtol=1e-12)
    np.testing.assert_allclose(Y.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(Y.std(0), 1.0, rtol=1e-12)
    X_raw = scaler.X_mean + scaler.X_std * X
    np.testing.assert_allclose((X_raw - X_raw.mean(0)) / X_raw.std(0), X, atol=1e-12)
    assert out.test is not None and out.test[0].shape[1] == X.shape[1]


def test_kernels() -> None:
    scaler = Standardizer(np.array([1980.0]), np.array([12.5]), np.array([340.0]), np.array([17.0]))
    seasonal = make_kernel("co2", scaler)
    assert isinstance(seasonal, gpflow.kernels.Sum)
    smooth, periodic = seasonal.kernels
    assert isinstance(smooth, gpflow.kernels.SquaredExponential) and isinstance(periodic, gpflow.kernels.Periodic)
    np.testing.assert_allclose(periodic.period.numpy(), 1.0 / 12.5)  # one year in standardized units
    assert not periodic.period.trainable
    ard = make_kernel("synthetic2", Standardizer(np.zeros(2), np.ones(2), np.zeros(1), np.ones(1)))
    assert isinstance(ard, gpflow.kernels.SquaredExponential)
    np.testing.assert_array_equal(ard.lengthscales.numpy(), [1.0, 1.0])


def test_format_table() -> None:
    rows = [MethodResult("FSGP (fedavg)", 0.12345, -0.5, 1.234, 1234567), MethodResult("local", 1.0, 2.0, 0.5, 0)]
    assert format_table(rows).splitlines() == [
        "| method | test RMSE | test NLPD | time (s) | bytes sent |",
        "|---|---:|---:|---:|---:|",
        "| FSGP (fedavg) | 0.1235 | -0.5000 | 1.23 | 1,234,567 |",
        "| local | 1 | 2.0000 | 0.50 | 0 |",
    ]


def test_missing_or_unreadable_files_are_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    missing = tmp_path / "missing.npz"
    assert main(["recycle", "ensemble", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpflow-fed recycle: error:") and "missing.npz" in err
    assert "Traceback" not in err
    assert main(["recycle", "ensemble", str(tmp_path)]) == 2  # a directory, not a file
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpflow-fed recycle: error:")


def test_user_error_message_is_one_line() -> None:
    from gpflow_fed.cli import user_error_message

    assert (
        user_error_message(FileNotFoundError(2, "No such file or directory", "a.npz"))
        == "No such file or directory: a.npz"
    )
    assert user_error_message(ValueError("first line\n  second line")) == "first line second line"
    assert user_error_message(ValueError()) == "ValueError"

"""``benchmarks/fedbnr.py``'s studies: the thesis schedule's per-round scores and early stopping, and the
kernel-only distillation diagnostic."""

import argparse

import numpy as np
import pytest

from gpflow_fed.data import fedbnr_real_task
from gpflow_fed.federated import run

RNG = np.random.default_rng(3)
X = RNG.normal(size=(200, 3))
Y = np.sin(X[:, :1]) + 0.5 * X[:, 1:2] + 0.1 * RNG.normal(size=(200, 1))
TASK = fedbnr_real_task(X, Y, 2, seed=0, name="toy")


def config(**overrides):
    values = dict(rounds=2, local_steps=3, kd_steps=2, num_samples=5, hidden=4, lr=0.05, eager=True, patience=10)
    return argparse.Namespace(**{**values, **overrides})


@pytest.fixture(scope="module")
def fedbnr(load_benchmark):
    return load_benchmark("fedbnr")


def test_per_round_scores_are_phase_two(fedbnr) -> None:
    cfg = config()
    row = fedbnr.thesis_schedule(TASK, "fedbnr", cfg, 0, 1.0)
    assert row["rounds_run"] == 2 and len(row["per_round"]) == 2
    # the last round's score is the global model FedBNR returns after the same rounds (phase 2 = pooled BLR)
    model = run(fedbnr.fedbnr_algorithm(TASK, "fedbnr", cfg, 0, 1.0), TASK.dataset, seed=0).model
    expected = fedbnr.calibration_scores(model, TASK.dataset.test)
    for key, value in expected.items():
        assert row["per_round"][-1][key] == pytest.approx(value, rel=1e-8, abs=1e-10)
    assert row["min_test_rmse"] <= row["selected_test_rmse"]
    best = int(np.argmin([r["val_rmse"] for r in row["per_round"]]))
    assert row["best_val_round"] == best + 1 and row["selected_test_rmse"] == row["per_round"][best]["rmse"]


def test_early_stopping(fedbnr) -> None:
    row = fedbnr.thesis_schedule(TASK, "fedbnr-kd", config(rounds=30, patience=1, lr=0.5), 0, 2.0)
    val = [r["val_rmse"] for r in row["per_round"]]
    assert row["rounds_run"] < 30  # stopped: the last round did not improve on the one before
    assert val[-1] >= min(val[:-1]) and row["best_val_round"] == row["rounds_run"] - 1


def test_kernel_only_distillation_keeps_fedavg_variances(fedbnr) -> None:
    cfg = config(rounds=1)
    fedavg = run(fedbnr.fedbnr_algorithm(TASK, "fedbnr", cfg, 0, 1.0), TASK.dataset, seed=0).model
    kd = run(fedbnr.fedbnr_algorithm(TASK, "fedbnr-kd", cfg, 0, 1.0), TASK.dataset, seed=0).model
    theta = run(fedbnr.fedbnr_algorithm(TASK, "kd-theta", cfg, 0, 1.0), TASK.dataset, seed=0).model
    for name in ("likelihood.variance", "prior_variance"):
        get = lambda m: float(eval(f"m.{name}").numpy())  # noqa: E731
        assert get(theta) == pytest.approx(get(fedavg), rel=1e-10)  # σ², λ² stay at the FedAvg mean
        assert get(kd) != pytest.approx(get(fedavg), rel=1e-6)  # the thesis' KD moves them
    assert not np.allclose(theta.kernel.K(X[:5]).numpy(), fedavg.kernel.K(X[:5]).numpy())  # θ is distilled


def test_methods_table_is_saved_every_seed_and_reprinted_from_json(fedbnr, tmp_path, capsys) -> None:
    """``--out`` keeps every seed's scores with provenance; ``--from-json`` prints the same table from them."""
    out = tmp_path / "methods.json"
    common = ["--no-gemm", "--datasets", "diabetes", "--clients", "2", "--methods", "fedbnr,fedavg"]
    small = ["--rounds", "1", "--local-steps", "2", "--num-samples", "5", "--hidden", "4", "--seeds", "2"]
    assert fedbnr.main([*common, *small, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    saved = __import__("json").loads(out.read_text())
    assert saved["command"].startswith("python benchmarks/fedbnr.py") and saved["git_commit"]
    assert [(r["dataset"], r["K"], r["seed"]) for r in saved["records"]] == [("diabetes", 2, 0), ("diabetes", 2, 1)]
    assert set(saved["records"][0]["methods"]) == {"fedbnr", "fedavg"}
    assert fedbnr.main(["--from-json", str(out), "--methods", "fedbnr,fedavg"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| fed")]
    assert len(table) == 2 and all(line in printed for line in table)


def test_central_trace_ends_at_the_methods_tables_central_model(fedbnr, tmp_path) -> None:
    """``--study central-trace`` scores the methods table's ``central`` model along its training: its last test
    RMSE is the table's, and its first is the untrained model's (a different number)."""
    out = tmp_path / "central.json"
    small = ["--datasets", "diabetes", "--clients", "2", "--seeds", "1", "--rounds", "2", "--local-steps", "3"]
    small += ["--num-samples", "5", "--hidden", "4"]
    assert fedbnr.main(["--study", "central-trace", *small, "--out", str(out)]) == 0
    row = __import__("json").loads(out.read_text())["records"][0]["methods"]["central"]
    assert [r["step"] for r in row["per_step"]] == [0, 3, 6]
    table = tmp_path / "methods.json"
    assert fedbnr.main(["--no-gemm", *small, "--methods", "central", "--out", str(table)]) == 0
    central = __import__("json").loads(table.read_text())["records"][0]["methods"]["central"]
    assert row["test_rmse_end"] == pytest.approx(central["rmse"], rel=1e-12)
    assert row["test_rmse_start"] != pytest.approx(row["test_rmse_end"], rel=1e-6)
    assert row["min_test_rmse"] == min(r["test_rmse"] for r in row["per_step"])

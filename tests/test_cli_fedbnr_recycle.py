"""Fast default-suite tests of ``gpflow-fed fedbnr`` (against the pooled BLR it must equal with no phase-1
rounds) and ``gpflow-fed recycle`` (locals → file → ensemble, and a corrupt file's one-line error)."""

import json
import re

import numpy as np

from gpflow_fed.cli import main


def _table(out):
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| ([^|]+?) \| ([^|]+?) \|$", out, flags=re.M)}


def test_fedbnr_without_rounds_equals_pooled_blr(capsys):
    from gpflow_fed import metrics
    from gpflow_fed.data import fedbnr_real_task, load_dataset
    from gpflow_fed.kernels import deep_urk
    from gpflow_fed.models import BayesianLinearRegression

    argv = [
        "fedbnr",
        "--dataset",
        "diabetes",
        "--clients",
        "3",
        "--rounds",
        "0",
        "--num-samples",
        "5",
        "--hidden",
        "4",
        "--seed",
        "1",
    ]
    assert main(argv) == 0
    rows = _table(capsys.readouterr().out)
    # oracle: phase 2 alone is Bayesian linear regression on the pooled data with the initial kernel
    real = load_dataset("diabetes")
    task = fedbnr_real_task(real.X, real.Y, 3, seed=1, name="diabetes")
    kernel = deep_urk(real.X.shape[1], hidden=(4,), num_samples=5, seed=1)
    pooled = BayesianLinearRegression(task.dataset.pooled(), kernel, noise_variance=0.5, prior_variance=1.0)
    X_test, Y_test = task.dataset.test
    mean, var = (t.numpy() for t in pooled.predict_y(X_test))
    assert float(rows["test_rmse"]) == round(metrics.rmse(Y_test, mean), 4)
    assert float(rows["test_nlpd"]) == round(metrics.nlpd(Y_test, mean, var), 4)
    # phase 2 sends Σ φᵀφ [L, L], Σ φᵀy [L, 1] and two scalars per client, L = 2m = 10, whatever N_k
    total, shapes = re.fullmatch(r"(\d+) \(shapes (.*)\)", rows["bytes up, phase scatter"]).groups()
    assert shapes == "((10, 10), (10, 1), (1,), ())" and int(total) % 3 == 0


def test_recycle_locals_then_ensemble_then_corrupt_file(tmp_path, capsys):
    path = tmp_path / "models.npz"
    assert (
        main(
            [
                "recycle",
                "locals",
                "--dataset",
                "toy",
                "--points",
                "30",
                "--inducing",
                "4",
                "--maxiter",
                "3",
                "--out",
                str(path),
            ]
        )
        == 0
    )
    saved = json.loads(capsys.readouterr().out)
    assert saved["saved"] == str(path) and saved["inducing_per_model"] == 4 and path.exists()
    assert (
        main(
            [
                "recycle",
                "ensemble",
                str(path),
                "--inducing",
                "6",
                "--maxiter",
                "3",
                "--evaluate",
                "toy",
                "--out",
                str(tmp_path / "ensemble.npz"),
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["models"] == saved["models"] and np.isfinite([out["elbo"], out["test_nlpd"], out["test_rmse"]]).all()
    from gpflow_fed.models import load_recyclable

    assert list(load_recyclable(tmp_path / "ensemble.npz")) == ["ensemble"]
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["recycle", "ensemble", str(corrupt), "--maxiter", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(corrupt) in err and "not a readable recyclable-model file" in err

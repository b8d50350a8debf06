"""Fast default-suite tests of ``gpflow-fed fedbnr`` (against the pooled BLR it must equal with no phase-1
rounds) and ``gpflow-fed recycle`` (locals → file → ensemble, one step on a CSV, and a corrupt file's one-line
error)."""

import json

import numpy as np

from gpflow_fed.cli import main


def test_fedbnr_without_rounds_equals_pooled_blr(capsys):
    from gpflow_fed import metrics
    from gpflow_fed.data import fedbnr_real_task, load_dataset
    from gpflow_fed.kernels import deep_urk
    from gpflow_fed.models import BayesianLinearRegression

    argv = ["fedbnr", "--dataset", "diabetes", "--clients", "3", "--rounds", "0", "--num-samples", "5", "--hidden",
            "4", "--seed", "1", "--json"]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    row = payload["results"][0]
    # oracle: phase 2 alone is Bayesian linear regression on the pooled data with the initial kernel
    real = load_dataset("diabetes")
    task = fedbnr_real_task(real.X, real.Y, 3, seed=1, name="diabetes")
    kernel = deep_urk(real.X.shape[1], hidden=(4,), num_samples=5, seed=1)
    pooled = BayesianLinearRegression(task.dataset.pooled(), kernel, noise_variance=0.5, prior_variance=1.0)
    X_test, Y_test = task.dataset.test
    mean, var = task.standardizer.inverse_transform(*(t.numpy() for t in pooled.predict_y(X_test)))
    Y_raw = task.standardizer.inverse_transform(Y_test)
    np.testing.assert_allclose(row["test_rmse"], metrics.rmse(Y_raw, mean), rtol=1e-9)  # disease progression units
    np.testing.assert_allclose(row["test_nlpd"], metrics.nlpd(Y_raw, mean, var), rtol=1e-9)
    assert 40 < row["test_rmse"] < payload["results"][1]["test_rmse"]  # beats predicting the mean (σ_Y ≈ 77)
    # phase 2 sends Σ φᵀφ [L, L], Σ φᵀy [L, 1] and two scalars per client, L = 2m = 10, whatever N_k: under the
    # default secure aggregation as one masked vector (those L² + L + 2 codes, the weight's and the count of entries
    # the client saturated to its fixed-point range) with its 32-byte tag
    assert row["shapes_by_phase"]["scatter"] == [[10 * 10 + 10 + 2 + 1 + 1], [32]]
    assert row["bytes_up_by_phase"]["scatter"] % 3 == 0


def test_recycle_locals_then_ensemble_then_corrupt_file(tmp_path, capsys):
    path = tmp_path / "models.npz"
    argv = ["recycle", "locals", "--dataset", "toy", "--points", "30", "--inducing", "4", "--maxiter", "3",
            "--out", str(path), "--json", "--logdir", str(tmp_path / "runs")]  # fmt: skip
    assert main(argv) == 0
    saved = json.loads(capsys.readouterr().out)
    assert saved["outputs"]["local_models"] == str(path) and saved["settings"]["inducing_per_model"] == 4
    assert [r["method"] for r in saved["results"]] == [f"task_{k}" for k in range(len(saved["results"]))]
    # what each party sends: q_mu [4, 1], q_sqrt [4, 4], Z [4, 1] in float64 (issue 45: recycle's time and bytes)
    assert all(r["bytes_sent"] == (4 + 16 + 4) * 8 and r["seconds"] > 0 for r in saved["results"])
    argv = ["recycle", "ensemble", str(path), "--inducing", "6", "--maxiter", "3", "--evaluate", "toy", "--out",
            str(tmp_path / "ensemble.npz"), "--json", "--logdir", str(tmp_path / "runs")]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    row = out["results"][0]
    assert out["settings"]["models"] == len(saved["results"])
    assert np.isfinite([row["elbo"], row["test_nlpd"], row["test_rmse"]]).all()
    assert row["bytes_sent"] == 192 * len(saved["results"]) and row["seconds"] > 0
    assert main(argv[:-3] + ["--logdir", str(tmp_path / "runs")]) == 0  # the table, as the other commands print it
    text = capsys.readouterr().out.splitlines()
    assert "| time (s) | bytes sent |" in text[1] and f"model: {out['outputs']['model']}" in text[-1]
    from gpflow_fed.models import load_model, load_recyclable

    assert list(load_recyclable(tmp_path / "ensemble.npz")) == ["ensemble"]
    assert type(load_model(out["outputs"]["model"])).__name__ == "EnsembleSVGP"  # toy data: its own units
    corrupt = tmp_path / "corrupt.npz"
    corrupt.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    assert main(["recycle", "ensemble", str(corrupt), "--maxiter", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(corrupt) in err and "not a readable recyclable-model file" in err


def test_recycle_in_one_step_on_a_csv(tmp_path, capsys):
    """`recycle --csv` fits the parties' local models and their ensemble at once; the ensemble is saved in the
    target's units and the local models are named by party."""
    from gpflow_fed.data import write_example_csv
    from gpflow_fed.models import StandardizedModel

    csv = write_example_csv(tmp_path / "hospitals.csv")
    argv = ["recycle", "--csv", str(csv), "--party-column", "hospital", "--target", "los", "--quick", "--json",
            "--out", str(tmp_path / "locals.npz"), "--logdir", str(tmp_path / "runs")]  # fmt: skip
    assert main(argv) == 0
    payload = json.loads(capsys.readouterr().out)
    ensemble, baseline = payload["results"]
    assert set(ensemble["local_elbo_per_point"]) == {f"{h}/elbo_per_point" for h in ("east", "north", "south", "west")}
    assert ensemble["test_rmse"] < baseline["test_rmse"] and payload["dataset"]["target"] == "los"
    model = StandardizedModel.load(payload["outputs"]["model"])
    mean = model.predict_y(np.array([[40.0, 0.5]]))[0].numpy()
    assert 3 < mean[0, 0] < 8  # days: the example's los(40, 0.5) = 3 + 0.06·40 + 1.5 sin(40/9) + 2·0.5 ≈ 5.0
    from gpflow_fed.models import load_recyclable

    assert sorted(load_recyclable(tmp_path / "locals.npz")) == ["east", "north", "south", "west"]

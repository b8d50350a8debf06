"""``gpflow-fed privacy`` on a tiny CSV."""

import csv

import numpy as np

from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR


def test_privacy_cli_tiny_csv(tmp_path, capsys):
    x = np.linspace(0, 1, 15)
    path = tmp_path / "data.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t", "y"])
        writer.writerows(zip(x, np.sin(6 * x)))
    out = tmp_path / "out"
    rc = main(["privacy", str(path), "--interval", "0.4:0.6", "--density", "10", "--alpha", "0.5",
               "--noise-variance", "1e-4", "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"released.csv", "model.pkl", "privacy.png"}
    model = PrivacyAwareGPR.load(out / "model.pkl")
    released = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(released[:, 1:], model.data[1].numpy())
    prior = float(model.kernel.variance.numpy())
    _, var = model.predict_f(np.array([[0.4], [0.5], [0.6]]))
    assert np.all(var.numpy() >= 0.5 * prior - 1e-8)
    assert "tr Σ" in capsys.readouterr().out
    assert main(["privacy", str(path), "--sensitive", "0.5", "--out", str(out)]) == 2
    assert "exactly one of --tolerance" in capsys.readouterr().err

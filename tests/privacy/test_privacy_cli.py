"""``gpflow-fed privacy`` on a tiny CSV."""

import csv

import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.privacy import ProportionalKernel, synthetic_noise_covariance


def test_privacy_cli_tiny_csv(tmp_path, capsys):
    x = np.linspace(0, 1, 15)
    path = tmp_path / "data.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t", "y"])
        writer.writerows(zip(x, np.sin(6 * x)))
    out = tmp_path / "out"
    # 41 grid points on [0.4, 0.6]: K_SS − H_SS is numerically singular, so the region path (pivoted factor,
    # eq. 12–13) is what makes this work; the finite-set closed form rejects the same grid (checked below).
    rc = main(["privacy", str(path), "--interval", "0.4:0.6", "--density", "200", "--alpha", "0.5",
               "--noise-variance", "1e-4", "--out", str(out)])
    assert rc == 0
    assert {p.name for p in out.iterdir()} == {"released.csv", "model.npz", "privacy.png"}
    model = PrivacyAwareGPR.load(out / "model.npz")
    released = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(released[:, 1:], model.data[1].numpy())
    prior = float(model.kernel.variance.numpy())
    _, var = model.predict_f(np.linspace(0.4, 0.6, 21)[:, None])
    assert np.all(var.numpy() >= 0.5 * prior * (1 - 1e-6))
    assert "tr Σ" in capsys.readouterr().out
    with pytest.raises(ValueError, match="K_SS − Ξ is not positive definite"):
        synthetic_noise_covariance(model.kernel, x[:, None], np.linspace(0.4, 0.6, 41)[:, None],
                                   ProportionalKernel(model.kernel, 0.5), noise_variance=1e-4)
    assert main(["privacy", str(path), "--sensitive", "0.5", "--out", str(out)]) == 2
    assert "exactly one of --tolerance" in capsys.readouterr().err
    assert main(["privacy", str(path), "--interval", "0.4:0.6", "--tolerance", "0.1", "--out", str(out)]) == 2
    assert "needs a kernel tolerance: use --alpha" in capsys.readouterr().err

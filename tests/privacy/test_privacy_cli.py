"""``gpflow-fed privacy`` on a tiny CSV."""

import csv

import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.release import ProportionalKernel, synthetic_noise_covariance


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
    rc = main(
        [
            "privacy",
            str(path),
            "--interval",
            "0.4:0.6",
            "--density",
            "200",
            "--alpha",
            "0.5",
            "--noise-variance",
            "1e-4",
            "--out",
            str(out),
        ]
    )
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
        synthetic_noise_covariance(
            model.kernel,
            x[:, None],
            np.linspace(0.4, 0.6, 41)[:, None],
            ProportionalKernel(model.kernel, 0.5),
            noise_variance=1e-4,
        )
    assert main(["privacy", str(path), "--sensitive", "0.5", "--out", str(out)]) == 2
    assert "exactly one of --tolerance" in capsys.readouterr().err
    assert main(["privacy", str(path), "--interval", "0.4:0.6", "--tolerance", "0.1", "--out", str(out)]) == 2
    assert "needs a kernel tolerance: use --alpha" in capsys.readouterr().err


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return path


def test_privacy_cli_csv_without_header_keeps_its_first_row(tmp_path, capsys):
    x = np.linspace(0, 1, 12)
    rows = [[f"{a!r}", f"{b!r}"] for a, b in zip(x, np.sin(6 * x))]
    path = _write(tmp_path / "plain.csv", rows)
    out = tmp_path / "out"
    assert (
        main(
            [
                "privacy",
                str(path),
                "--sensitive",
                "0.5",
                "--alpha",
                "0.5",
                "--noise-variance",
                "1e-4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "released 12 points" in capsys.readouterr().out  # not 11: the first row is data
    released = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(released[:, 0], x)
    # headerless columns are numbered from 1
    assert main(["privacy", str(path), "--y", "y", "--sensitive", "0.5", "--alpha", "0.5", "--out", str(out)]) == 2
    assert "no header row, so columns are numbered from 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cell, problem",
    [("inf", "is not finite"), ("nan", "is not finite"), ("abc", "is not a number"), ("", "is not a number")],
)
def test_privacy_cli_bad_cell_is_one_line_and_exit_2(tmp_path, capsys, cell, problem):
    x = np.linspace(0, 1, 6)
    rows = [["t", "y"], *[[a, b] for a, b in zip(x, np.sin(x))]]
    rows[4][1] = cell
    path = _write(tmp_path / "bad.csv", rows)
    assert main(["privacy", str(path), "--sensitive", "0.5", "--alpha", "0.5", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpflow-fed privacy: error:")
    assert f"line 5, column 'y': {cell!r} {problem}" in err
    assert not (tmp_path / "o").exists()


def test_privacy_cli_line_numbers_count_blank_lines(tmp_path, capsys):
    path = tmp_path / "blank.csv"
    path.write_text("t,y\n0,1\n\n0.5,2\n1,inf\n")
    assert main(["privacy", str(path), "--sensitive", "0.5", "--alpha", "0.5", "--out", str(tmp_path / "o")]) == 2
    assert "line 5, column 'y': 'inf' is not finite" in capsys.readouterr().err


def test_privacy_cli_never_overwrites_a_release(tmp_path, capsys):
    x = np.linspace(0, 1, 10)
    path = _write(tmp_path / "d.csv", [["t", "y"], *[[a, b] for a, b in zip(x, np.sin(6 * x))]])
    out = tmp_path / "out"
    argv = ["privacy", str(path), "--sensitive", "0.5", "--alpha", "0.5", "--noise-variance", "1e-4", "--out", str(out)]
    assert main(argv) == 0
    first = (out / "released.csv").read_bytes()
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already holds a release (released.csv, model.npz, privacy.png)" in err
    assert (out / "released.csv").read_bytes() == first


def test_privacy_cli_ragged_row_and_existing_out_file(tmp_path, capsys):
    x = np.linspace(0, 1, 6)
    good = _write(tmp_path / "good.csv", [["t", "y"], *[[a, b] for a, b in zip(x, np.sin(x))]])
    ragged = _write(tmp_path / "ragged.csv", [["t", "y"], [0.0, 1.0], [0.5], [1.0, 2.0]])
    assert main(["privacy", str(ragged), "--sensitive", "0.5", "--alpha", "0.5", "--out", str(tmp_path / "o")]) == 2
    assert "line 3: 1 cells, expected 2" in capsys.readouterr().err
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    assert main(["privacy", str(good), "--sensitive", "0.5", "--alpha", "0.5", "--out", str(existing)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "exists and is not a directory" in err
    assert existing.read_text() == "keep me"
    assert main(["privacy", str(tmp_path / "missing.csv"), "--sensitive", "0.5", "--alpha", "0.5"]) == 2
    assert "missing.csv not found" in capsys.readouterr().err


def test_privacy_cli_quick_progress_and_maxiter(tmp_path, capsys):
    x = np.linspace(0, 1, 15)
    path = tmp_path / "data.csv"
    _write(path, [["t", "y"], *zip(x, np.sin(6 * x))])
    rc = main(["privacy", str(path), "--sensitive", "0.5", "--alpha", "0.5", "--quick", "--out", str(tmp_path / "q")])
    assert rc == 0
    err = capsys.readouterr().err
    assert "privacy: 100%" in err and "3/3" in err  # one tick per stage: release, write, plots
    rc = main(
        [
            "privacy",
            str(path),
            "--sensitive",
            "0.5",
            "--alpha",
            "0.5",
            "--maxiter",
            "3",
            "--no-progress",
            "--out",
            str(tmp_path / "m"),
        ]
    )
    assert rc == 0 and "privacy:" not in capsys.readouterr().err
    assert (
        main(
            [
                "privacy",
                str(path),
                "--sensitive",
                "0.5",
                "--alpha",
                "0.5",
                "--maxiter",
                "0",
                "--out",
                str(tmp_path / "z"),
            ]
        )
        == 2
    )
    assert "--maxiter must be at least 1" in capsys.readouterr().err

"""``gpflow-fed privacy`` on tiny CSVs: options, validation before TensorFlow, refusals, removed forms."""

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.release import ProportionalKernel, synthetic_noise_covariance

ROOT = Path(__file__).resolve().parents[2]
#: public design hyperparameters
DESIGN = ["--lengthscale", "0.2", "--variance", "1", "--noise-variance", "1e-4"]


def _write(path, rows):
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)
    return path


def _table(path, n=15, names=("t", "y")):
    x = np.linspace(0, 1, n)
    return _write(path, [list(names), *zip(x, np.sin(6 * x))])


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpflow-fed privacy: error:"), err
    return err


def test_privacy_cli_tiny_csv(tmp_path, capsys):
    path = _table(tmp_path / "data.csv")
    x = np.linspace(0, 1, 15)
    out = tmp_path / "out"
    # 41 grid points on [0.4, 0.6]: K_SS − H_SS is numerically singular, so the region path (pivoted factor,
    # eq. 12–13) is what makes this work; the finite-set closed form rejects the same grid (checked below).
    argv = ["privacy", "--csv", str(path), "--target", "y", "--interval", "0.4:0.6", "--density", "200"]
    assert main([*argv, "--alpha", "0.5", *DESIGN, "--out", str(out)]) == 0
    assert {p.name for p in out.iterdir()} == {"released.csv", "model.npz", "privacy.png"}
    model = PrivacyAwareGPR.load(out / "model.npz")
    released = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)
    np.testing.assert_allclose(released[:, 1:], model.data[1].numpy())
    assert float(model.kernel.lengthscales.numpy()) == 0.2 and float(model.kernel.variance.numpy()) == 1.0
    _, var = model.predict_f(np.linspace(0.4, 0.6, 21)[:, None])
    assert np.all(var.numpy() >= 0.5 * (1 - 1e-6))
    assert "tr Σ" in capsys.readouterr().out
    with pytest.raises(ValueError, match="K_SS − Ξ is not positive definite"):
        synthetic_noise_covariance(
            model.kernel,
            x[:, None],
            np.linspace(0.4, 0.6, 41)[:, None],
            ProportionalKernel(model.kernel, 0.5),
            noise_variance=1e-4,
        )
    base = ["privacy", "--csv", str(path), "--target", "y", *DESIGN, "--out", str(tmp_path / "o")]
    assert main([*base, "--sensitive", "0.5"]) == 2
    assert "missing required options: --tolerance XI or --alpha A" in _one_error_line(capsys)
    assert main([*base, "--interval", "0.4:0.6", "--tolerance", "0.1"]) == 2
    assert "needs a kernel tolerance: use --alpha" in _one_error_line(capsys)
    assert main([*base, "--sensitive", "0.5", "--alpha", "0.5", "--density", "10"]) == 2
    assert "--density applies to --interval only" in _one_error_line(capsys)


def test_every_missing_option_at_once_and_before_tensorflow(tmp_path):
    """Usage errors are one line, exit 2, name every missing option, and come before TensorFlow is imported."""
    path = _table(tmp_path / "data.csv")
    calls = [
        ["privacy"],
        ["privacy", "--csv", str(tmp_path / "missing.csv"), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5"]
        + DESIGN,
        ["privacy", "--csv", str(path), "--features", "y", "--target", "y", "--sensitive", "0.5", "--alpha", "0.5"]
        + DESIGN,
        [
            "privacy",
            "--csv",
            str(path),
            "--target",
            "y",
            "--sensitive",
            "0.5",
            "--alpha",
            "0.5",
            "--noise-variance",
            "-1",
        ]
        + DESIGN[:4],
    ]
    code = (
        "import sys\nfrom gpflow_fed.cli import main\n"
        f"for argv in {calls!r}:\n"
        "    print(main(argv), 'tensorflow' in sys.modules, flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.stdout.split("\n")[:4] == ["2 False"] * 4, (done.stdout, done.stderr)
    errors = done.stderr.strip().split("\n")
    assert len(errors) == 4 and all(e.startswith("gpflow-fed privacy: error:") for e in errors)
    for option in ("--csv FILE", "--target COL", "--sensitive", "--interval", "--tolerance XI or --alpha A"):
        assert option in errors[0]
    assert "--lengthscale --variance --noise-variance (public hyperparameters) or --public-csv FILE" in errors[0]
    assert "missing.csv not found" in errors[1]
    assert "the target 'y' is also a feature" in errors[2]
    assert "--noise-variance must be a finite number ≥ 0, got -1.0" in errors[3]
    assert not (tmp_path / "privacy_release").exists()


def test_a_target_that_is_also_a_feature_is_refused(tmp_path, capsys):
    """A target among the features used to publish the raw target as a released input column."""
    path = _table(tmp_path / "data.csv")
    out = tmp_path / "out"
    common = ["--sensitive", "0.5", "--alpha", "0.5", *DESIGN, "--out", str(out)]
    assert main(["privacy", "--csv", str(path), "--features", "t", "y", "--target", "y", *common]) == 2
    assert "is also a feature; features are released verbatim" in _one_error_line(capsys)
    assert not out.exists()


@pytest.mark.parametrize("name", ["=HYPERLINK(1)", "+cmd", "-2+3", "@SUM(A1)", " =1+1"])
def test_a_formula_header_is_refused(tmp_path, capsys, name):
    """``released.csv`` repeats the header: a name a spreadsheet would evaluate is never copied into it."""
    path = _table(tmp_path / "data.csv", names=(name, "y"))
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "which spreadsheets run as a formula" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_duplicate_headers_are_refused_by_name(tmp_path, capsys):
    path = _write(tmp_path / "dup.csv", [["t", "y", "y"], [0, 1, 2], [0.5, 1, 2], [1, 1, 2]])
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "duplicate column names ['y']" in _one_error_line(capsys)


def test_the_removed_positional_csv_and_x_y_forms_are_refused(tmp_path, capsys):
    """The positional CSV, ``--x a,b`` and ``--y COL`` are gone: a usage error naming them, nothing written."""
    path = _table(tmp_path / "data.csv")
    argv = ["privacy", str(path), "--x", "t", "--y", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and f"unrecognized arguments: {path} --x t --y y" in err, err
    assert not (tmp_path / "out").exists()


def test_releases_take_no_standardisation(tmp_path, capsys):
    path = _table(tmp_path / "data.csv")
    with pytest.raises(SystemExit) as exc:
        main(["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", "--standardize"])
    assert exc.value.code == 2 and "unrecognized arguments: --standardize" in capsys.readouterr().err


def test_noise_variance_zero_is_one_line_not_a_traceback(tmp_path, capsys):
    """On main, ``--noise-variance 0`` ended in a TensorFlow traceback (the owner's raw-vs-released plot built a
    GPflow GPR, which refuses σ² = 0). Now σ² = 0 is a valid public design; a covariance that is singular (repeated
    inputs) is one line and exit status 2."""
    path = _table(tmp_path / "data.csv")
    x = np.repeat(np.linspace(0, 1, 8), 2)
    repeated = _write(tmp_path / "rep.csv", [["t", "y"], *zip(x, np.cos(6 * x))])
    zero = ["--lengthscale", "0.2", "--variance", "1", "--noise-variance", "0", "--no-progress"]
    common = ["--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *zero]
    for method in ("strong", "weak"):
        out = tmp_path / method
        assert main(["privacy", "--csv", str(path), *common, "--method", method, "--out", str(out)]) == 0
        assert (out.parent / f"{method}_owner" / "privacy-raw-vs-released.png").is_file()
    capsys.readouterr()
    other = ["--ledger", str(tmp_path / "other")]  # another table at some of the same inputs
    assert main(["privacy", "--csv", str(repeated), *common, *other, "--out", str(tmp_path / "b")]) == 2
    assert "numerically singular" in _one_error_line(capsys)


def test_public_csv_designs_sigma_and_refuses_the_released_rows(tmp_path, capsys):
    path = _table(tmp_path / "data.csv")
    xp = np.linspace(0.02, 0.98, 20)
    public = _write(tmp_path / "public.csv", [["t", "y"], *zip(xp, np.sin(6 * xp))])
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", "--quick"]
    assert main([*argv, "--public-csv", str(public), "--json", "--out", str(tmp_path / "a")]) == 0
    assert '"min_sensitive_variance"' in capsys.readouterr().out
    assert main([*argv, "--public-csv", str(path), "--out", str(tmp_path / "b")]) == 2
    assert "input(s) on inputs of --csv" in _one_error_line(capsys)
    assert main([*argv, "--public-csv", str(public), "--lengthscale", "0.2", "--out", str(tmp_path / "c")]) == 2
    assert "--public-csv fits the kernel; drop --lengthscale/--variance" in _one_error_line(capsys)


def test_privacy_cli_csv_without_header_keeps_its_first_row(tmp_path, capsys):
    x = np.linspace(0, 1, 12)
    rows = [[f"{a!r}", f"{b!r}"] for a, b in zip(x, np.sin(6 * x))]
    path = _write(tmp_path / "plain.csv", rows)
    out = tmp_path / "out"
    argv = ["privacy", "--csv", str(path), "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--target", "2", "--out", str(out)]) == 0
    assert "released 12 points" in capsys.readouterr().out  # not 11: the first row is data
    released = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)
    np.testing.assert_array_equal(released[:, 0], x)
    # headerless columns are numbered from 1
    assert main([*argv, "--target", "y", "--out", str(tmp_path / "o2")]) == 2
    assert "no header row, so columns are numbered from 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "cell, problem",
    [("inf", "is not finite"), ("nan", "is not finite"), ("abc", "is not a number"), ("", "is not a number")],
)
def test_privacy_cli_bad_cell_is_one_line_and_exit_2(tmp_path, capsys, cell, problem):
    """A bad feature cell is quoted; a bad target cell is not (the target is what the release protects)."""
    x = np.linspace(0, 1, 6)
    argv = ["--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN, "--out", str(tmp_path / "o")]
    for column, shown in ((0, f"{cell!r}"), (1, "the target's cell")):
        rows = [["t", "y"], *[[a, b] for a, b in zip(x, np.sin(x))]]
        rows[4][column] = cell
        path = _write(tmp_path / "bad.csv", rows)
        assert main(["privacy", "--csv", str(path), *argv]) == 2
        assert f"line 5, column '{'ty'[column]}': {shown} {problem}" in _one_error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_privacy_cli_line_numbers_count_blank_lines(tmp_path, capsys):
    path = tmp_path / "blank.csv"
    path.write_text("t,y\n0,1\n\n0.5,2\n1,inf\n")
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert "line 5, column 'y': the target's cell is not finite" in capsys.readouterr().err


def test_privacy_cli_never_overwrites_a_release(tmp_path, capsys):
    path = _table(tmp_path / "d.csv", n=10)
    out = tmp_path / "out"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--out", str(out)]) == 0
    first = (out / "released.csv").read_bytes()
    capsys.readouterr()
    assert main([*argv, "--out", str(out)]) == 2
    assert "already holds a release (released.csv, model.npz, privacy.png)" in _one_error_line(capsys)
    assert (out / "released.csv").read_bytes() == first


def test_privacy_cli_ragged_row_and_existing_out_file(tmp_path, capsys):
    good = _table(tmp_path / "good.csv", n=6)
    ragged = _write(tmp_path / "ragged.csv", [["t", "y"], [0.0, 1.0], [0.5], [1.0, 2.0]])
    argv = ["privacy", "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--csv", str(ragged), "--out", str(tmp_path / "o")]) == 2
    assert "line 3: 1 cells, expected 2" in capsys.readouterr().err
    existing = tmp_path / "existing"
    existing.write_text("keep me")
    assert main([*argv, "--csv", str(good), "--out", str(existing)]) == 2
    assert "exists and is not a directory" in _one_error_line(capsys)
    assert existing.read_text() == "keep me"


def test_privacy_cli_refit_quick_progress_and_maxiter(tmp_path, capsys):
    path = _table(tmp_path / "data.csv")
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--refit", "--quick", "--out", str(tmp_path / "q")]) == 0
    err = capsys.readouterr().err
    assert "privacy: 100%" in err and "3/3" in err  # one tick per stage: release, write, plots
    model = PrivacyAwareGPR.load(tmp_path / "q" / "model.npz")
    # 0.5 is the 8th training input: its record Y is protected, under the refitted (published) θ
    var = model.protected_covariance(np.array([[0.5]]), np.array([7])).numpy()
    assert float(var[0, 0]) >= 0.5 * (1 - 1e-6)
    refit = ["--refit", "--maxiter", "3", "--no-progress", "--design-theta-only"]
    assert main([*argv, *refit, "--out", str(tmp_path / "m")]) == 0
    err = capsys.readouterr().err
    # no bar; stderr holds at most the refit's one-line note (the refit retreats only where the floor fails under
    # the refitted θ, which the θ range and the check under the θ refitted on W now mostly prevent)
    assert "%|" not in err and err.count("\n") == err.count("warning: refit=True") <= 1
    assert main([*argv, "--refit", "--maxiter", "0", "--out", str(tmp_path / "z")]) == 2
    assert "--maxiter must be a finite number at least 1" in _one_error_line(capsys)
    assert main([*argv, "--quick", "--out", str(tmp_path / "z")]) == 2  # nothing to fit: refused, not ignored
    assert "--maxiter and --quick apply to a fit" in _one_error_line(capsys)


def _entries(ledger: Path) -> "list[str]":
    """The release entries of a ledger folder (its key, created on first use, is not an entry)."""
    return sorted(p.name for p in ledger.iterdir() if p.name.startswith("release-")) if ledger.exists() else []


def test_privacy_cli_refuses_timestamps_before_writing_anything(tmp_path, capsys):
    # issue 44: Unix timestamps 40 s apart with a 300 s lengthscale (‖x/ℓ‖ = 5.7e6) used to write released.csv,
    # model.npz, privacy.png and a ledger entry, then refuse in the owner's plot (a non-finite predicted mean, exit 2):
    # the release was on disk and counted. Now it is refused before anything is written, naming the column
    t = 1_700_000_000 + 40.0 * np.arange(40)
    y = np.sin((t - t[0]) / 300.0)
    path = _write(tmp_path / "ts.csv", [["t", "y"], *([repr(a), f"{b:.6f}"] for a, b in zip(t, y))])
    out, ledger = tmp_path / "release", tmp_path / "ledger"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", repr(t[20]), "--alpha", "0.5"]
    design = ["--lengthscale", "300", "--variance", "1", "--noise-variance", "0.01"]
    assert main([*argv, *design, "--out", str(out), "--ledger", str(ledger), "--no-progress"]) == 2
    err = _one_error_line(capsys)
    # at ℓ = 150 s, the smallest lengthscale of the default θ range (×½ … ×2): 1.7e9 / 150 = 1.13e7
    assert "'t' (SquaredExponential): inputs up to 1.13e+07 lengthscales from zero (ℓ = 150)" in err
    assert "subtract a reference value from the column" in err
    assert not out.exists() and not (tmp_path / "release_owner").exists() and _entries(ledger) == []
    centred = _write(tmp_path / "centred.csv", [["t", "y"], *([repr(a - t[0]), f"{b:.6f}"] for a, b in zip(t, y))])
    argv = ["privacy", "--csv", str(centred), "--target", "y", "--sensitive", repr(t[20] - t[0]), "--alpha", "0.5"]
    assert main([*argv, *design, "--out", str(out), "--ledger", str(ledger), "--no-progress"]) == 0  # the remedy
    assert len(_entries(ledger)) == 1


def test_privacy_cli_a_refusal_after_the_release_writes_nothing(tmp_path, capsys, monkeypatch):
    # a refusal of the plots' predictions (after release() returned) used to leave released.csv, model.npz and the
    # ledger entry behind; now the release is recorded and written only once everything that can refuse is done
    path = _table(tmp_path / "d.csv", n=10)
    ledger = tmp_path / "ledger"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    argv += ["--ledger", str(ledger), "--no-progress"]

    def refuse(self, Xnew, full_cov=False, full_output_cov=False):
        raise ValueError("the model predicts a negative variance at the inputs given (test)")

    with monkeypatch.context() as patch:
        patch.setattr(PrivacyAwareGPR, "predict_f", refuse)
        assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    assert "negative variance" in _one_error_line(capsys)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out_owner").exists()
    assert _entries(ledger) == []
    assert main([*argv, "--out", str(tmp_path / "again")]) == 0  # the same release then goes through, recorded once
    assert {p.name for p in (tmp_path / "again").iterdir()} == {"released.csv", "model.npz", "privacy.png"}
    assert len(_entries(ledger)) == 1
    assert (tmp_path / "again_owner" / "privacy-raw-vs-released.png").stat().st_size > 0


def test_privacy_cli_a_folder_that_cannot_be_made_is_refused_before_the_release(tmp_path, capsys):
    # issue 44 (attack44n, cli/partial_write.sh): --out below a regular file passed _check_out, the ledger entry was
    # committed and then mkdir failed; --logdir an existing file failed after released.csv, model.npz, privacy.png and
    # the ledger entry were written. Both folders are now made first: one line, exit 2, nothing written (no ledger key)
    path = _table(tmp_path / "d.csv", n=10)
    (tmp_path / "blocker").touch()
    (tmp_path / "logfile").touch()
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    argv += ["--no-progress"]
    ledger_a, ledger_b = tmp_path / "ledA", tmp_path / "ledB"
    assert main([*argv, "--ledger", str(ledger_a), "--out", str(tmp_path / "blocker" / "rel")]) == 2
    assert "Not a directory" in _one_error_line(capsys)
    assert not ledger_a.exists()
    out = tmp_path / "outB"
    assert main([*argv, "--ledger", str(ledger_b), "--out", str(out), "--logdir", str(tmp_path / "logfile")]) == 2
    assert "File exists" in _one_error_line(capsys)
    assert not ledger_b.exists() and not out.exists()
    assert (tmp_path / "logfile").stat().st_size == 0


def test_privacy_cli_out_dot_writes_the_owner_folder_beside_it(tmp_path, capsys, monkeypatch):
    # issue 44 (attack44n, cli/out_dot.sh): --out . wrote and recorded the release, then the default --logdir
    # (out.with_name(out.name + "_owner")) failed on Path('.'), exit 2. --out is made absolute first: the owner's
    # folder is the sibling <folder>_owner
    path = _table(tmp_path / "d.csv", n=10)
    here = tmp_path / "dot"
    here.mkdir()
    monkeypatch.chdir(here)
    ledger = tmp_path / "ledger"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    assert main([*argv, "--ledger", str(ledger), "--no-progress", "--out", "."]) == 0
    assert {p.name for p in here.iterdir()} == {"released.csv", "model.npz", "privacy.png"}
    assert (tmp_path / "dot_owner" / "privacy-raw-vs-released.png").stat().st_size > 0
    assert len(_entries(ledger)) == 1
    capsys.readouterr()


@pytest.mark.parametrize("where", ["logdir = out", "logdir inside out", "ledger inside out", "ledger = out"])
def test_privacy_cli_owner_folders_inside_out_are_refused_before_anything_is_written(tmp_path, capsys, where):
    # issue 44 (attack44p, cli1/): --logdir equal to --out wrote privacy-raw-vs-released.png (the raw data) into the
    # folder the CLI calls safe to publish; --ledger inside --out would publish the owner's record. One line, exit 2,
    # nothing written (on the code before: exit 0, the plot in --out)
    path = _table(tmp_path / "d.csv", n=10)
    out = tmp_path / "rel"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    argv += ["--no-progress", "--out", str(out)]
    logdir, ledger = {
        "logdir = out": (out, tmp_path / "led"),
        "logdir inside out": (out / "owner", tmp_path / "led"),
        "ledger inside out": (tmp_path / "owner", out / "led"),
        "ledger = out": (tmp_path / "owner", out),
    }[where]
    assert main([*argv, "--logdir", str(logdir), "--ledger", str(ledger)]) == 2
    option = "--logdir" if where.startswith("logdir") else "--ledger"
    assert f"{option} {logdir if option == '--logdir' else ledger} is --out" in _one_error_line(capsys)
    assert not out.exists() and not (tmp_path / "led").exists() and not (tmp_path / "owner").exists()


def test_privacy_cli_refuses_a_default_ledger_folder_inside_out(tmp_path, capsys, monkeypatch):
    # issue 44: only an explicit --ledger was checked against --out; $GPFLOW_FED_PRIVACY_LEDGER naming a folder inside
    # --out put the owner's record of releases (its key, W and factors) in the folder the CLI calls safe to publish
    path = _table(tmp_path / "d.csv", n=10)
    out = tmp_path / "rel"
    monkeypatch.setenv("GPFLOW_FED_PRIVACY_LEDGER", str(out / "ledger"))
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", "0.5", *DESIGN]
    argv += ["--no-progress", "--out", str(out), "--logdir", str(tmp_path / "owner")]
    assert main(argv) == 2
    assert f"the default ledger folder {out / 'ledger'} is --out" in _one_error_line(capsys)
    assert not out.exists() and not (tmp_path / "owner").exists()

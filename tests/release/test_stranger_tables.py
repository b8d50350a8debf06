"""Issue 44, a fresh attacker's loader and CLI findings (2026-12-03): a region far wider than the lengthscale, the
privacy CLI's header check, inputs without columns.

Each test fails on the code before its fix: the region tried to allocate its grid (and then a 298 GiB kernel
matrix: a traceback, exit 1), the header check called ``header.count`` per name (63 s at 60,000 columns), and X with
0 columns was taken.
"""

import csv

import gpflow
import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.cli.privacy import _check_header
from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.release import Box, Interval, RegionUnion
from gpflow_fed.release.linalg import as_inputs
from gpflow_fed.release.lowrank import LowRankCovariance
from gpflow_fed.release.regions import MAX_GRID_POINTS, MAX_REGION_POINTS, check_region_size

DESIGN = ["--lengthscale", "0.2", "--variance", "1", "--noise-variance", "1e-4"]


def _table(path, n=15):
    x = np.linspace(0, 1, n)
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([["t", "y"], *zip(x, np.sin(6 * x))])
    return path


class _CountedHeader(list):
    """A header whose per-name scans (``count``, ``index``, ``in``) fail: each is O(columns), so one per name made
    the check quadratic."""

    def count(self, value):  # type: ignore[override]
        raise AssertionError("header.count per name: quadratic in the number of columns")

    def __contains__(self, value):  # type: ignore[override]
        raise AssertionError("a membership scan of the header per name: quadratic in the number of columns")


def test_the_header_check_is_linear_in_the_columns_and_still_names_duplicates_and_missing_columns(tmp_path, capsys):
    names = [f"c{j}" for j in range(60_000)]
    _check_header(tmp_path / "wide.csv", _CountedHeader(names))  # no scan per name (the old check: 63 s here)
    with pytest.raises(ValueError, match=r"duplicate column names \['c7', 'c9'\]"):
        _check_header(tmp_path / "wide.csv", _CountedHeader([*names, "c9", "c7", "c9"]))
    # the same through the CLI on a wide file: a duplicate, then a missing name, each one line with exit 2
    names = names[:5_000]
    path = tmp_path / "wide.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([[*names, "c42", "y"], *([*np.arange(5_001.0), 1.0] for _ in range(3))])
    argv = ["privacy", "--csv", str(path), "--features", "c1", "--target", "y", "--sensitive", "0.5", "--alpha", "0.5"]
    assert main([*argv, *DESIGN, "--out", str(tmp_path / "a")]) == 2
    assert "duplicate column names ['c42']" in capsys.readouterr().err
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([[*names, "y"], *([*np.arange(5_000.0), 1.0] for _ in range(3))])
    argv[argv.index("c1")] = "nope"
    assert main([*argv, *DESIGN, "--out", str(tmp_path / "b")]) == 2
    assert "column 'nope' not in" in capsys.readouterr().err


def test_a_region_far_wider_than_the_lengthscale_is_refused_before_its_grid_is_built():
    # 2e13 points at 20 per unit: the grid's size is computed first, nothing is allocated (it was a MemoryError)
    for region in (Interval(0.0, 1e12), RegionUnion(Interval(0.0, 1.0), Interval(2.0, 1e12)), Box([0, 0], [1e6, 1e6])):
        assert region.grid_size(20.0) > MAX_GRID_POINTS
        with pytest.raises(ValueError, match="narrow the region"):
            region.discretise(20.0)
    assert Interval(0.3, 0.5).grid_size(20.0) == Interval(0.3, 0.5).discretise(20.0).shape[0] == 5
    check_region_size(MAX_REGION_POINTS, 20.0)
    with pytest.raises(ValueError, match=f"{MAX_REGION_POINTS + 1:,} points"):
        check_region_size(MAX_REGION_POINTS + 1, 20.0)


@pytest.mark.parametrize("interval", ["0:1e4", "0:1e8"])
def test_the_cli_refuses_a_region_too_wide_to_design_in_one_line_with_exit_2(tmp_path, capsys, interval):
    # 0:1e4 at the default density (20 per unit for ℓ = 0.2): 200,001 grid points, above the design's cap (it tried
    # to allocate a 298 GiB kernel matrix: a traceback, exit 1); 0:1e8 is above any grid's cap
    path = _table(tmp_path / "data.csv")
    argv = [
        "privacy",
        "--csv",
        str(path),
        "--target",
        "y",
        f"--interval={interval}",
        "--alpha",
        "0.5",
        "--no-progress",
        *DESIGN,
    ]
    assert main([*argv, "--ledger", str(tmp_path / "ledger"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpflow-fed privacy: error:") and "narrow the region" in err
    assert not (tmp_path / "out" / "model.npz").exists()


def test_inputs_without_columns_are_refused():
    with pytest.raises(ValueError, match="has no columns"):
        as_inputs(np.zeros((10, 0)), "X")  # it was taken, and failed at the first prediction
    assert as_inputs(np.zeros((10, 1)), "X").shape == (10, 1)  # control


# --- model.npz from a stranger: every value the loader's one ValueError (issue 44) ---
def _saved(tmp_path, **changes):
    N = 10
    X = np.linspace(0, 1, N)[:, None]
    k = gpflow.kernels.SquaredExponential(lengthscales=0.2)
    m = PrivacyAwareGPR(
        (X, np.sin(6 * X)),
        k,
        LowRankCovariance(np.ones(1), np.ones((N, 1)) * 0.3),
        gpflow.mean_functions.Constant(0.1),
        0.01,
    )
    good = m.save(tmp_path / "good.npz")
    arrays = dict(np.load(good))
    arrays.update(changes)
    np.savez(tmp_path / "bad.npz", **arrays)
    return tmp_path / "bad.npz"


def test_a_float128_value_beyond_float64_is_the_loaders_value_error(tmp_path):
    path = _saved(tmp_path, **{"param.mean_function.c": np.array([np.longdouble("1e4000")])})
    with pytest.raises(ValueError, match="corrupt Constant mean"):
        PrivacyAwareGPR.load(path)


def test_a_mean_name_with_terminal_escapes_is_quoted(tmp_path):
    spec = (
        '{"kernel": {"class": "SquaredExponential", "variance": 1, "lengthscales": [0.2]}, '
        '"mean_function": "\\u001b[31mEVIL"}'
    )
    with pytest.raises(ValueError) as info:
        PrivacyAwareGPR.load(_saved(tmp_path, spec=np.array(spec)))
    assert "\x1b" not in str(info.value) and "\\x1b[31mEVIL" in str(info.value)


def test_x_without_columns_is_refused_at_load(tmp_path):
    with pytest.raises(ValueError, match="no columns"):
        PrivacyAwareGPR.load(_saved(tmp_path, X=np.zeros((10, 0))))


def test_x_without_rows_is_refused_at_load(tmp_path):
    """A file with no rows would load and predict the prior (a fresh attacker's X_empty.npz)."""
    with pytest.raises(ValueError, match="no rows"):
        PrivacyAwareGPR.load(_saved(tmp_path, X=np.zeros((0, 1)), W=np.zeros((0, 1))))


def test_a_target_beyond_the_magnitude_a_release_computes_with_is_one_value_error():
    """A thirteenth fresh attacker: |Y| ≥ 1e154 made np.std overflow and the CLI end in an OverflowError traceback."""
    from gpflow_fed.release.resolution import MAX_MAGNITUDE, recording_resolution

    Y = np.sin(np.linspace(0, 6, 30)) * 1e155
    with pytest.raises(ValueError, match="rescale the target"):
        recording_resolution(Y)
    assert recording_resolution(Y * MAX_MAGNITUDE / 1e156) > 0  # just inside: computed


def test_the_refusal_of_an_astronomical_grid_states_its_size_without_overflowing():
    """The cap's own message squared the count as a float (an OverflowError past ~1e154 points)."""
    for count, text in ((10**400, "about 1e400 points"), (10**5000, "about 1e5000 points"), (20_001, "20,001 points")):
        with pytest.raises(ValueError, match=text):
            check_region_size(count, 20.0)

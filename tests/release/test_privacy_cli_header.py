"""The privacy command's header choice (issue 44, finding 8b): a headerless CSV's first record was taken for column
names, echoed in errors and repeated in ``released.csv``'s header. Now ``--header auto|yes|no`` decides, and a header
cell that is (or reads as) a number is never taken for a name, nor echoed."""

import csv

import numpy as np
import pytest

from gpflow_fed.cli import main

DESIGN = ["--lengthscale", "0.2", "--variance", "1", "--noise-variance", "1e-4"]
#: a first record whose target is written with a Unicode minus (U+2212): ``float`` refuses it, a reader sees -0.731
FIRST = ["0.125", "\u22120.731"]


def _write(path, rows):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows(rows)
    return path


def _headerless(path, first=FIRST):
    x = np.linspace(0.2, 1, 11)
    return _write(path, [first, *([f"{a!r}", f"{b!r}"] for a, b in zip(x, np.sin(6 * x)))])


def _run(tmp_path, capsys, csv_path, *extra):
    argv = ["privacy", "--csv", str(csv_path), "--sensitive", "0.5", "--alpha", "0.5", *DESIGN, *extra]
    code = main([*argv, "--out", str(tmp_path / "out")])
    return code, capsys.readouterr().err


def test_a_first_record_is_never_taken_for_names_nor_echoed(tmp_path, capsys):
    code, err = _run(tmp_path, capsys, _headerless(tmp_path / "plain.csv"), "--target", "2")
    assert code == 2 and err.count("\n") == 1
    # auto reads a row of (what read as) numbers as data: the bad target cell is named by place; it used to become
    # the header "0.125, −0.731", echoed as the list of columns
    assert "line 1, column '2': the target's cell is not a number" in err
    assert "0.125" not in err and "0.731" not in err  # the record's values are not echoed
    assert not (tmp_path / "out" / "released.csv").exists()


def test_a_first_row_mixing_numbers_and_text_is_refused_under_auto(tmp_path, capsys):
    code, err = _run(tmp_path, capsys, _headerless(tmp_path / "plain.csv", first=["t", "0.731"]), "--target", "2")
    assert code == 2 and "mixes numbers (columns [2]) and text" in err and "--header yes" in err
    assert "0.731" not in err


def test_header_yes_refuses_numeric_names_without_echoing_them(tmp_path, capsys):
    path = _headerless(tmp_path / "plain.csv", first=["t", "2020"])
    code, err = _run(tmp_path, capsys, path, "--target", "t", "--header", "yes")
    assert code == 2 and "the header's columns [2] are numbers" in err and "2020" not in err


def test_header_no_reads_the_first_row_as_data(tmp_path, capsys):
    """Control: with --header no the first record is data, and its bad target cell is named by place, not value."""
    code, err = _run(tmp_path, capsys, _headerless(tmp_path / "plain.csv"), "--target", "2", "--header", "no")
    assert code == 2 and "line 1, column '2': the target's cell is not a number" in err and "0.731" not in err


@pytest.mark.parametrize("choice", ["auto", "yes"])
def test_a_text_header_still_names_the_columns(tmp_path, capsys, choice):
    """Control: a header of names (no digits only) is read under auto and yes; its name reaches released.csv."""
    x = np.linspace(0, 1, 12)
    path = _write(tmp_path / "named.csv", [["time", "y"], *([f"{a!r}", f"{b!r}"] for a, b in zip(x, np.sin(6 * x)))])
    code, err = _run(tmp_path, capsys, path, "--target", "y", "--header", choice)
    assert code == 0, err
    with open(tmp_path / "out" / "released.csv") as fh:
        assert next(csv.reader(fh)) == ["time", "y"]

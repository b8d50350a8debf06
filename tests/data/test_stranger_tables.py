"""Tables a stranger made (issue 44, finding 8b): huge finite values, look-alike and control-character party names,
and the cost of splitting parties. Each attack has its control (the honest table still works)."""

import time

import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.data import FederatedDataset
from gpflow_fed.data.tabular import split_table
from gpflow_fed.validation import party_key, party_name, party_names


def _csv(path, parties=("a", "b"), cell="5.0", rows=12):
    lines = ["hospital,age,los"]
    for k in range(rows):
        lines.append(f"{parties[k % len(parties)]},{20 + 3 * k},{cell if k == 3 else 5 + 0.1 * k}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_a_huge_finite_cell_is_a_one_line_error_with_exit_2(tmp_path, capsys):
    """A cell of 1e300 ended ``gpflow-fed fsgp --csv`` with a traceback (exit 1)."""
    csv = _csv(tmp_path / "huge.csv", cell="1e300")
    argv = ["fsgp", "--csv", str(csv), "--party-column", "hospital", "--target", "los"]
    assert main([*argv, "--logdir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "column 'los': the value in data row 4 exceeds 1e+150" in err and err.count("\n") == 1
    assert "1e300" not in err and "1e+300" not in err  # the value itself is never echoed
    # control: the same table with an ordinary value is read
    split = split_table(_csv(tmp_path / "ok.csv", cell="1e100"), party_column="hospital", target="los")
    assert split.parties == ("a", "b")


def test_a_non_numeric_cell_is_named_by_row_not_echoed(tmp_path):
    with pytest.raises(ValueError, match="data row 4 is not a number") as info:
        split_table(_csv(tmp_path / "t.csv", cell="secret-value"), party_column="hospital", target="los")
    assert "secret-value" not in str(info.value)


@pytest.mark.parametrize(
    "parties, match",
    [
        (("A", "A "), "differ only in case, width, surrounding spaces"),  # used to merge silently
        (("A", "\uff21"), "differ only in case, width"),  # a fullwidth look-alike used to be its own party
        (("alice", "Alice"), "equal after Unicode NFKC normalisation and case folding"),
        (("a\x1b[31mb", "c"), "control or invisible character U\\+001B"),  # ANSI sequences used to print raw
        (("a\u202eb", "c"), "U\\+202E"),  # a bidirectional override
    ],
)
def test_party_names_are_normalised_and_look_alikes_refused(tmp_path, parties, match):
    csv = _csv(tmp_path / "t.csv", parties=parties)
    with pytest.raises(ValueError, match=match) as info:
        split_table(csv, party_column="hospital", target="los")
    assert "\x1b" not in str(info.value) and "\u202e" not in str(info.value)


def test_consistent_spelling_is_accepted_and_normalised(tmp_path):
    """Control: one spelling per party (leading spaces as a CSV writer leaves them, fullwidth used throughout)."""
    csv = _csv(tmp_path / "t.csv", parties=(" north", "\uff33outh"))
    assert split_table(csv, party_column="hospital", target="los").parties == ("South", "north")
    assert party_name(" \uff21 ") == "A" and party_key("Straße") == party_key("STRASSE")
    names, codes = party_names(np.array(["b", "a", "b", 3]))
    assert names == ["3", "a", "b"] and codes == [2, 1, 2, 0]


def test_dataset_client_names_go_through_the_same_function():
    clients = [(np.zeros((2, 1)), np.zeros((2, 1)))] * 2
    assert FederatedDataset(clients, client_names=["\uff41", "b"]).client_names == ("a", "b")
    with pytest.raises(ValueError, match="U\\+001B"):
        FederatedDataset(clients, client_names=["a\x1b[2J", "b"])
    with pytest.raises(ValueError, match="differ only in case"):
        FederatedDataset(clients, client_names=["Bob", "bob"])


def test_splitting_parties_is_linear_in_the_rows():
    """Splitting used one full scan of the party column per party: O(K·N), ≈ 4 h for 10⁶ parties. Doubling the
    parties (and rows) must now roughly double the time, not quadruple it."""

    def seconds(K):
        table = {
            "party": np.array([f"p{k}" for k in range(K) for _ in range(2)]),
            "x": np.arange(2.0 * K),
            "y": np.arange(2.0 * K) % 5,  # not constant: a constant target is refused (issue 45)
        }
        start = time.perf_counter()
        split = split_table(table, party_column="party", target="y", test_fraction=0.0)
        assert len(split.parties) == K
        return time.perf_counter() - start

    small = min(seconds(4000) for _ in range(2))
    large = min(seconds(16000) for _ in range(2))
    assert large < 8 * small, (small, large)  # quadratic would be 16×; linear is 4×


def test_a_field_beyond_the_csv_modules_limit_is_one_line_with_exit_2(tmp_path, capsys):
    """A field over 131,072 characters ended ``gpflow-fed privacy`` (and ``fsgp --csv``) with a ``_csv.Error``
    traceback (found by a fresh attacker); now one line, exit 2, and no cell echoed."""
    big = _csv(tmp_path / "big.csv", cell="7" * 200_000)
    argv = ["fsgp", "--csv", str(big), "--party-column", "hospital", "--target", "los"]
    assert main([*argv, "--logdir", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err
    assert "not a readable CSV" in err and err.count("\n") == 1 and "7777" not in err
    privacy = ["privacy", "--csv", str(big), "--target", "los", "--sensitive", "30", "--alpha", "0.5"]
    privacy += ["--lengthscale", "5", "--variance", "1", "--noise-variance", "0.01"]
    assert main([*privacy, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "not a CSV this command reads" in err and err.count("\n") == 1 and "7777" not in err


def test_a_header_with_an_ansi_sequence_is_refused_without_echo(tmp_path, capsys):
    """A column name holding an ANSI control sequence was echoed raw in the privacy command's errors (found by a
    fresh attacker): now refused naming its column number, exit 2, the sequence not printed. Control: the same
    table with a plain name gets past the header."""
    rows = ["age,\x1b[2Jlos", *(f"{i},{i % 7}" for i in range(12))]
    bad = tmp_path / "ansi.csv"
    bad.write_text("\n".join(rows) + "\n")
    privacy = ["privacy", "--csv", str(bad), "--sensitive", "3", "--alpha", "0.5", "--header", "yes"]
    privacy += ["--lengthscale", "5", "--variance", "1", "--noise-variance", "0.01", "--out", str(tmp_path / "o")]
    assert main([*privacy, "--target", "1"]) == 2
    err = capsys.readouterr().err
    assert "columns [2]" in err and "control or format characters" in err and "\x1b" not in err
    plain = tmp_path / "plain.csv"
    plain.write_text(bad.read_text().replace("\x1b[2J", ""))
    main([*[str(plain) if a == str(bad) else a for a in privacy], "--target", "nope"])
    err = capsys.readouterr().err
    assert "control" not in err and "'nope' not in" in err


def test_a_utf8_byte_order_mark_is_read_and_other_encodings_are_one_line(tmp_path, capsys):
    """A spreadsheet's UTF-8 export starts with a byte-order mark, which became a format character of the first
    column's name (refused as one, found by a fresh attacker); UTF-16 gave an error without the file's name."""
    rows = ["los,age", *(f"{i % 7},{i}" for i in range(12))]
    marked = tmp_path / "bom.csv"
    marked.write_bytes("\ufeff".encode() + "\n".join(rows).encode() + b"\n")
    privacy = ["privacy", "--sensitive", "3", "--alpha", "0.5", "--target", "los", "--header", "yes"]
    privacy += ["--lengthscale", "5", "--variance", "1", "--noise-variance", "0.01", "--out", str(tmp_path / "o")]
    main([*privacy, "--csv", str(marked), "--features", "nope"])
    err = capsys.readouterr().err
    assert "'nope' not in" in err and "control" not in err  # the header was read: los and age
    wide = tmp_path / "utf16.csv"
    wide.write_bytes("\n".join(rows).encode("utf-16"))
    assert main([*privacy, "--csv", str(wide)]) == 2
    err = capsys.readouterr().err
    assert f"{wide} is not UTF-8 text" in err and err.count("\n") == 1


def test_tables_read_a_byte_order_mark_and_name_a_non_utf8_file(tmp_path):
    from gpflow_fed.data.tabular import read_table

    marked = tmp_path / "bom.csv"
    marked.write_bytes("\ufeffhospital,los\nA,1\nB,2\n".encode())
    assert sorted(read_table(str(marked))) == ["hospital", "los"]
    wide = tmp_path / "utf16.csv"
    wide.write_bytes("hospital,los\nA,1\n".encode("utf-16"))
    with pytest.raises(ValueError, match=f"{wide} is not UTF-8 text"):
        read_table(str(wide))

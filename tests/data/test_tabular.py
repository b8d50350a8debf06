"""federated_from_table: one client per party, validated columns, per-party held-out rows."""

from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.data import federated_from_table


def _table():
    rng = np.random.default_rng(0)
    party = np.repeat(["north", "south", "east"], [10, 12, 8])
    age = rng.uniform(20, 90, party.size)
    return {
        "hospital": party,
        "age": age,
        "dose": rng.uniform(0, 1, party.size),
        "los": 0.1 * age + rng.normal(size=party.size),
    }


def _write_csv(path: Path, table) -> Path:
    names = list(table)
    rows = zip(*(table[n] for n in names))
    path.write_text(",".join(names) + "\n" + "\n".join(",".join(str(v) for v in r) for r in rows) + "\n")
    return path


def test_dict_and_csv_give_the_same_parties(tmp_path):
    table = _table()
    from_dict = federated_from_table(table, party_column="hospital", target="los", test_fraction=0.25)
    from_csv = federated_from_table(
        _write_csv(tmp_path / "h.csv", table), party_column="hospital", target="los", test_fraction=0.25
    )
    assert from_dict.num_clients == 3 and from_csv.name == "h"
    assert from_dict.client_sizes == (6, 8, 9)  # east 8, north 10, south 12 (sorted), a quarter held out each
    assert from_dict.test[0].shape == (7, 2) and from_dict.input_dim == 2
    for (Xa, Ya), (Xb, Yb) in zip(from_dict.clients, from_csv.clients):
        np.testing.assert_allclose(Xa, Xb)
        np.testing.assert_allclose(Ya, Yb)
    east = table["age"][table["hospital"] == "east"]
    assert set(from_dict.clients[0][0][:, 0]) <= set(east)  # first client = "east", only its own rows


def test_features_select_columns_and_zero_test_fraction():
    data = federated_from_table(_table(), party_column="hospital", target="los", features=["age"], test_fraction=0)
    assert data.input_dim == 1 and data.test is None and data.num_data == 30


def test_pandas_dataframe():
    pd = pytest.importorskip("pandas")
    data = federated_from_table(pd.DataFrame(_table()), party_column="hospital", target="los")
    assert data.num_clients == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            dict(party_column="clinic", target="los"),
            r"party column 'clinic' is not a column .*hospital, age, dose, los",
        ),
        (dict(party_column="hospital", target="stay"), "target 'stay' is not a column"),
        (dict(party_column="hospital", target="los", features=["weight"]), "feature 'weight'"),
        (dict(party_column="hospital", target="los", features=["hospital"]), "must not include"),
        (dict(party_column="hospital", target="los", test_fraction=1.0), r"test_fraction must be in \[0, 1\)"),
    ],
)
def test_clear_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        federated_from_table(_table(), **kwargs)


def test_non_numeric_missing_and_tiny_party():
    table = _table()
    bad = dict(table, age=table["age"].astype(object))
    bad["age"][3] = "old"
    with pytest.raises(ValueError, match="column 'age' must be numeric; data row 4 is not a number"):
        federated_from_table(bad, party_column="hospital", target="los")
    bad["age"][3] = "n/a"  # a marker of a missing value, not a non-number
    with pytest.raises(ValueError, match="column 'age': missing value in data row 4"):
        federated_from_table(bad, party_column="hospital", target="los")
    missing = dict(table, los=table["los"].copy())
    missing["los"][5] = np.nan
    with pytest.raises(ValueError, match="column 'los': missing value in data row 6; impute or drop it"):
        federated_from_table(missing, party_column="hospital", target="los")
    tiny = {k: v[:11] for k, v in table.items()}  # south has one row
    with pytest.raises(ValueError, match="party 'south' has 1 row"):
        federated_from_table(tiny, party_column="hospital", target="los")
    with pytest.raises(TypeError, match="CSV path, a pandas DataFrame or a dict"):
        federated_from_table(42, party_column="hospital", target="los")


def test_a_missing_value_reads_the_same_from_a_csv_and_a_dataframe(tmp_path):
    """An empty CSV cell, "NA" (R's export) and a DataFrame's NaN give one message (issue 33)."""
    pd = pytest.importorskip("pandas")
    table = _table()
    message = "column 'los': missing value in data row 5; impute or drop it"
    for cell in ("", "NA"):
        text = _write_csv(tmp_path / "h.csv", table).read_text().splitlines()
        cells = text[5].split(",")
        cells[3] = cell
        text[5] = ",".join(cells)
        (tmp_path / "h.csv").write_text("\n".join(text) + "\n")
        with pytest.raises(ValueError, match=message):
            federated_from_table(tmp_path / "h.csv", party_column="hospital", target="los")
    frame = pd.read_csv(tmp_path / "h.csv")
    assert np.isnan(frame["los"][4])
    with pytest.raises(ValueError, match=message):
        federated_from_table(frame, party_column="hospital", target="los")


def test_party_names_travel_with_the_clients():
    data = federated_from_table(_table(), party_column="hospital", target="los")
    assert data.client_names == ("east", "north", "south") == data.names
    assert "sizes={east: 6, north: 8, south: 10}" in repr(data)
    standardized, _ = data.standardized()
    assert standardized.client_names == data.client_names


def test_repeated_or_empty_headers_are_refused(tmp_path):
    (tmp_path / "dup.csv").write_text("hospital,age,age,los\na,1,2,3\nb,4,5,6\n")
    with pytest.raises(ValueError, match=r"column names \['age'\] appear more than once"):
        federated_from_table(tmp_path / "dup.csv", party_column="hospital", target="los")
    (tmp_path / "blank.csv").write_text("hospital,,los\na,1,3\nb,4,6\n")
    with pytest.raises(ValueError, match="column 2 has no name"):
        federated_from_table(tmp_path / "blank.csv", party_column="hospital", target="los")


def test_reading_a_table_imports_no_tensorflow():
    import subprocess
    import sys

    code = (
        "import sys\nfrom gpflow_fed.data import split_table, example_table\n"
        "split = split_table(example_table(), party_column='hospital', target='los')\n"
        "assert split.parties == ('east', 'north', 'south', 'west'), split.parties\n"
        "assert 'tensorflow' not in sys.modules"
    )
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

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
    bad["age"][3] = "n/a"
    with pytest.raises(ValueError, match="column 'age' must be numeric; it holds 'n/a'"):
        federated_from_table(bad, party_column="hospital", target="los")
    missing = dict(table, los=table["los"].copy())
    missing["los"][5] = np.nan
    with pytest.raises(ValueError, match="'los' has a missing or non-finite value in data row 6"):
        federated_from_table(missing, party_column="hospital", target="los")
    tiny = {k: v[:11] for k, v in table.items()}  # south has one row
    with pytest.raises(ValueError, match="party 'south' has 1 row"):
        federated_from_table(tiny, party_column="hospital", target="los")
    with pytest.raises(TypeError, match="CSV path, a pandas DataFrame or a dict"):
        federated_from_table(42, party_column="hospital", target="los")


def test_duplicate_column_names_are_refused_not_overwritten(tmp_path):
    """A CSV header ``age,age`` used to keep the last column silently."""
    path = tmp_path / "dup.csv"
    path.write_text("hospital,age,age,los\na,1,2,3\na,2,3,4\nb,3,4,5\nb,4,5,6\n")
    with pytest.raises(ValueError, match=r"dup.csv has duplicate column names \['age'\]"):
        federated_from_table(path, party_column="hospital", target="los")

"""Your own data as a :class:`~gpflow_fed.data.FederatedDataset`: one table (a CSV file or a DataFrame) with a
column naming each row's party.

>>> dataset = federated_from_table("hospitals.csv", party_column="hospital", target="los")  # doctest: +SKIP

In a deployment each party loads only its own rows; the table is the simulation's (and the tutorial's) way of
holding all of them. Every party keeps ``1 - test_fraction`` of its rows for training; the held-out rows of
all parties form the shared test set. The clients keep the party names (``dataset.client_names``).

Reading and checking the table (:func:`split_table`) needs numpy only, so the command line and
:func:`gpflow_fed.fit` report a bad file, column or target before they import TensorFlow; only
:func:`federated_from_table` builds the (TensorFlow-typed) dataset. Error messages name the arguments as the caller
spells them (:data:`PARAMETERS`: Python's keywords, ``features=``; the command line passes its options,
``--features``).
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ..validation import party_names

__all__ = [
    "MIN_RELATIVE_STD",
    "PARAMETERS",
    "PartyTable",
    "TableSplit",
    "check_target_spread",
    "federated_from_table",
    "read_party_table",
    "read_table",
    "split_table",
]

Table = Union[str, "os.PathLike[str]", Any]
Arrays = Tuple[np.ndarray, np.ndarray]

#: how an error message names each argument of :func:`split_table` by default: as the Python parameter. The command
#: line passes its own spelling (``{"features": "--features", …}``), so that its errors speak of options.
PARAMETERS: Dict[str, str] = {name: name for name in ("party_column", "target", "features", "test_fraction")}

#: the smallest relative standard deviation σ/|μ| of a target the package trains on. The parties agree on the
#: target's mean and scale from masked fixed-point sums (:class:`~gpflow_fed.federated.algorithms.Moments`: values
#: scaled into [½, 1), ``SecureAggregation``'s 2⁻³² resolution per party and sum), which fixes σ² up to a relative
#: error of about 12·(K/N)·2⁻³²/(σ/|μ|)²: at σ/|μ| = 10⁻⁴ that is below 1.4 % with every party holding 2 rows (the
#: worst case), and it grows a hundredfold per decade below. A target whose spread is that small against its level
#: is a constant up to recording noise, or needs a known offset subtracted first.
MIN_RELATIVE_STD = 1e-4


def read_table(source: Table, keep_spaces: Sequence[str] = ()) -> Dict[str, np.ndarray]:
    """Columns of a CSV file (with a header row) or of a DataFrame-like object (``df.columns``, ``df[name]``;
    a ``dict`` of columns works too), as ``{name: 1-D array}`` (CSV cells stay strings until converted).

    :param keep_spaces: columns whose CSV cells keep their surrounding spaces (the party column: ``"A "`` and
        ``"A"`` must be seen as two spellings, see :func:`~gpflow_fed.validation.party_names`); other cells are
        stripped.

    :raises ValueError: a missing file, a header with a repeated or empty name, or a row with another number of
        cells than the header.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"CSV file {path} not found")
        try:
            # UTF-8, with or without the byte-order mark spreadsheets write
            with open(path, newline="", encoding="utf-8-sig") as fh:
                reader = csv.reader(fh)
                rows = [row for row in reader if any(cell.strip() for cell in row)]
        except csv.Error as exc:  # e.g. a field beyond the csv module's limit: no value of the file in the message
            raise ValueError(f"{path} is not a readable CSV ({exc})") from None
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text: save the CSV as UTF-8") from None
        if len(rows) < 2:
            raise ValueError(f"{path} needs a header row and at least one data row")
        header = [h.strip() for h in rows[0]]
        _check_header(header, str(path))
        for line, row in enumerate(rows[1:], start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}, data row {line - 1}: {len(row)} cells, expected {len(header)} ({header})")
        keep = set(keep_spaces)
        return {
            name: np.array([row[j] if name in keep else row[j].strip() for row in rows[1:]])
            for j, name in enumerate(header)
        }
    columns = getattr(source, "columns", None)
    names = list(columns) if columns is not None else list(source.keys()) if isinstance(source, dict) else None
    if names is None:
        raise TypeError(f"expected a CSV path, a pandas DataFrame or a dict of columns, got {type(source).__name__}")
    _check_header([str(n) for n in names], "the table")
    return {str(name): np.asarray(source[name]) for name in names}


def _check_header(header: List[str], where: str) -> None:
    if any(not name for name in header):
        raise ValueError(f"{where}: column {header.index('') + 1} has no name; name every column in the header")
    repeated = sorted({name for name in header if header.count(name) > 1})
    if repeated:
        raise ValueError(f"{where}: column names {repeated} appear more than once; rename them")


def _missing(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("", "na", "nan", "n/a", "null", "none")
    try:
        return value is None or not np.isfinite(float(value))
    except (TypeError, ValueError):
        return False


#: the largest magnitude a table's number may have: squares and sums of squares of up to 10⁸ such values stay finite
#: in float64 (standardising, kernel matrices), so a cell of 1e300 is an error here, not an overflow later
MAX_ABS_VALUE = 1e150


def _numeric(name: str, values: np.ndarray, spelling: Mapping[str, str] = PARAMETERS) -> np.ndarray:
    """The column as floats; the same message for a missing value whether the table is a CSV or a DataFrame.

    Errors name the column and the data row, never the cell's value (a table's values are private), and the
    arguments as ``spelling`` spells them (:data:`PARAMETERS`).
    """
    missing = np.flatnonzero([_missing(v) for v in values])
    if missing.size:
        raise ValueError(f"column {name!r}: missing value in data row {missing[0] + 1}; impute or drop it")
    try:
        numbers = values.astype(float)
    except (TypeError, ValueError):
        row = next(i for i, v in enumerate(values) if not _is_number(v))
        raise ValueError(
            f"column {name!r} must be numeric; data row {row + 1} is not a number (convert or drop it, or leave "
            f"the column out of {spelling['features']})"
        ) from None
    huge = np.flatnonzero(np.abs(numbers) > MAX_ABS_VALUE)
    if huge.size:
        raise ValueError(
            f"column {name!r}: the value in data row {huge[0] + 1} exceeds {MAX_ABS_VALUE:g} in magnitude (its "
            "squares would overflow); rescale the column"
        )
    return numbers


def check_target_spread(Y: np.ndarray, target: str, spelling: Mapping[str, str] = PARAMETERS) -> None:
    """Refuse a target with nothing to learn: the same value in every row, or a relative standard deviation
    ``σ/|μ|`` below :data:`MIN_RELATIVE_STD` (whose docstring says why). Neither message shows a value of the table.

    :param Y: the target's values (every party's rows).
    :param target: the column's name; :param spelling: how the message names the arguments (:data:`PARAMETERS`).
    :raises ValueError: one line naming the column and ``spelling["target"]``.
    """
    values = np.asarray(Y, dtype=float).ravel()
    std, level = float(np.std(values)), abs(float(np.mean(values)))
    if std == 0.0:
        raise ValueError(
            f"the target {target!r} has the same value in every row: there is nothing to learn (every model would "
            f"score RMSE 0); pick another {spelling['target']}"
        )
    if level > 0.0 and std / level < MIN_RELATIVE_STD:
        raise ValueError(
            f"the target {target!r} varies by {std / level:.1e} of its mean (relative standard deviation; the "
            f"parties need at least {MIN_RELATIVE_STD:g} to agree its scale): subtract a known offset from the "
            f"column first, or pick another {spelling['target']}"
        )


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class TableSplit:
    """A checked table split by party, as numpy arrays (no TensorFlow): what :func:`federated_from_table` builds
    the dataset from.

    :param clients: one ``(X_k, Y_k)`` training pair per party, in ``parties`` order.
    :param test: the held-out rows of every party, or ``None``.
    :param parties: the party names (the ``party_column`` values through
        :func:`~gpflow_fed.validation.party_names`: NFKC, surrounding spaces removed; sorted).
    :param features: the input column names; :param target: the output column name; :param name: the label.
    """

    clients: Tuple[Arrays, ...]
    test: Optional[Arrays]
    parties: Tuple[str, ...]
    features: Tuple[str, ...]
    target: str
    name: str


def split_table(
    source: Table,
    *,
    party_column: str,
    target: str,
    features: Optional[Sequence[str]] = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    name: Optional[str] = None,
    spelling: Mapping[str, str] = PARAMETERS,
) -> TableSplit:
    """Check the table and split it by party (see :func:`federated_from_table` for the arguments and errors).

    :param spelling: how error messages name the arguments (:data:`PARAMETERS`; the command line passes its
        options).
    """
    if not 0 <= test_fraction < 1:
        raise ValueError(f"{spelling['test_fraction']} must be in [0, 1), got {test_fraction!r}")
    columns = read_table(source, keep_spaces=[party_column])
    available = ", ".join(columns)
    chosen = [party_column, target, *(features or [])]
    for column, role in zip(chosen, ["party column", "target", *["feature"] * len(features or [])]):
        if column not in columns:
            raise ValueError(f"{role} {column!r} is not a column of the table (columns: {available})")
    if party_column == target:
        raise ValueError("the party column and the target must be different columns")
    inputs: List[str] = list(features) if features else [c for c in columns if c not in (party_column, target)]
    if not inputs:
        raise ValueError(f"no feature columns left besides {party_column!r} and {target!r} (columns: {available})")
    if party_column in inputs or target in inputs:
        raise ValueError(f"{spelling['features']} must not include the party column or the target")
    if len(set(inputs)) != len(inputs):
        raise ValueError(f"{spelling['features']} names a column twice: {inputs}")
    X = np.stack([_numeric(c, columns[c], spelling) for c in inputs], axis=1)
    Y = _numeric(target, columns[target], spelling)[:, None]
    check_target_spread(Y, target, spelling)
    party_values = columns[party_column]
    empty = [i for i, v in enumerate(party_values) if _missing(v)]
    if empty:
        raise ValueError(f"column {party_column!r}: missing value in data row {empty[0] + 1}; impute or drop it")
    names, codes = party_names(party_values, f"column {party_column!r}")
    # rows grouped by party in O(N): a stable sort of the party codes keeps each party's rows in table order
    order = np.argsort(np.asarray(codes, dtype=np.int64), kind="stable")
    counts = np.bincount(np.asarray(codes, dtype=np.int64), minlength=len(names))
    rng = np.random.default_rng(seed)
    clients, test_rows = [], []
    for party, rows in zip(names, np.split(order, np.cumsum(counts)[:-1])):
        if rows.size < 2:
            raise ValueError(f"party {party!r} has {rows.size} row; every party needs at least 2")
        n_test = min(int(round(test_fraction * rows.size)), rows.size - 2)
        shuffled = rng.permutation(rows)
        test_rows.append(shuffled[:n_test])
        train = np.sort(shuffled[n_test:])
        clients.append((X[train], Y[train]))
    held_out = np.sort(np.concatenate(test_rows))
    test = (X[held_out], Y[held_out]) if held_out.size else None
    label = name or (Path(source).stem if isinstance(source, (str, os.PathLike)) else "table")
    return TableSplit(tuple(clients), test, tuple(names), tuple(inputs), target, label)


@dataclass(frozen=True)
class PartyTable:
    """One party's own table, checked, as numpy arrays (no TensorFlow): what a Flower party trains on.

    :param X: ``[N, D]`` inputs; :param Y: ``[N, 1]`` the target.
    :param features: the input column names, in the order of ``X``'s columns; :param target: the output column.
    """

    X: np.ndarray
    Y: np.ndarray
    features: Tuple[str, ...]
    target: str


def read_party_table(
    source: Table, *, target: str, features: Optional[Sequence[str]] = None, spelling: Mapping[str, str] = PARAMETERS
) -> PartyTable:
    """One party's table (a CSV path or a DataFrame) with no party column: every row is this party's.

    :param target: the output column.
    :param features: the input columns (default: every column but ``target``, in the table's order).
    :param spelling: how error messages name the arguments (:data:`PARAMETERS`; the command line passes its
        options).
    :raises ValueError: as :func:`split_table`: a column that does not exist (naming those that do), a repeated
        column, a non-numeric or missing value, or fewer than 2 rows.
    """
    columns = read_table(source)
    available = ", ".join(columns)
    missing = [c for c in [target, *(features or [])] if c not in columns]
    if missing:
        raise ValueError(f"{', '.join(map(repr, missing))} not among the table's columns (columns: {available})")
    inputs: List[str] = list(features) if features else [c for c in columns if c != target]
    if not inputs:
        raise ValueError(f"no feature columns besides the target {target!r} (columns: {available})")
    if target in inputs:
        raise ValueError(f"{spelling['features']} must not include the target")
    if len(set(inputs)) != len(inputs):
        raise ValueError(f"{spelling['features']} names a column twice: {inputs}")
    X = np.stack([_numeric(c, columns[c], spelling) for c in inputs], axis=1)
    if X.shape[0] < 2:
        raise ValueError(f"the table has {X.shape[0]} data row; a party needs at least 2")
    return PartyTable(X, _numeric(target, columns[target], spelling)[:, None], tuple(inputs), target)


def federated_from_table(
    source: Table,
    *,
    party_column: str,
    target: str,
    features: Optional[Sequence[str]] = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    name: Optional[str] = None,
) -> Any:
    """One client per distinct value of ``party_column``, regressing ``target`` on ``features``.

    :param source: a CSV path (header row required) or a DataFrame (or a ``dict`` of equal-length columns).
    :param party_column: the column naming each row's party (any values: names or numbers), normalised by
        :func:`~gpflow_fed.validation.party_name` (NFKC, surrounding spaces removed); a name with a control or
        invisible character, and two spellings of one name (``"A"`` / ``"A "`` / ``"Ａ"`` / ``"a"``), are refused.
    :param target: the output column.
    :param features: the input columns (default: every column but ``party_column`` and ``target``).
    :param test_fraction: the fraction of each party's rows held out for the shared test set, in ``[0, 1)``
        (0: no test set); each party keeps at least 2 training rows.
    :param seed: seed of the held-out draw (a simulation choice, not privacy noise).
    :param name: the dataset's label (default: the file name, or ``"table"``).
    :return: the :class:`FederatedDataset`, clients ordered by sorted party value and named by it
        (``client_names``).
    :raises ValueError: a column that does not exist (the message lists those that do), a repeated column name,
        a non-numeric feature/target value, a missing value (``column 'los': missing value in data row 5;
        impute or drop it``, from a CSV or a DataFrame alike), a value above ``1e150`` in magnitude, a refused party
        name or two look-alike ones, a party with fewer than 2 rows, a target with the same value in every row or
        a relative standard deviation below :data:`MIN_RELATIVE_STD`, or ``test_fraction`` outside ``[0, 1)``.
    """
    split = split_table(
        source, party_column=party_column, target=target, features=features, test_fraction=test_fraction,
        seed=seed, name=name,
    )  # fmt: skip
    return dataset_from_split(split)


def dataset_from_split(split: TableSplit) -> Any:
    """The :class:`~gpflow_fed.data.FederatedDataset` of a :class:`TableSplit` (imports TensorFlow)."""
    from .dataset import FederatedDataset

    return FederatedDataset(list(split.clients), test=split.test, name=split.name, client_names=split.parties)

"""Your own data as a :class:`~gpflow_fed.data.FederatedDataset`: one table (a CSV file or a DataFrame) with a
column naming each row's party.

>>> dataset = federated_from_table("hospitals.csv", party_column="hospital", target="los")  # doctest: +SKIP

In a deployment each party loads only its own rows; the table is the simulation's (and the tutorial's) way of
holding all of them. Every party keeps ``1 - test_fraction`` of its rows for training; the held-out rows of
all parties form the shared test set.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from .dataset import FederatedDataset

__all__ = ["federated_from_table", "read_table"]

Table = Union[str, "os.PathLike[str]", Any]


def read_table(source: Table) -> Dict[str, np.ndarray]:
    """Columns of a CSV file (with a header row) or of a DataFrame-like object (``df.columns``, ``df[name]``;
    a ``dict`` of columns works too), as ``{name: 1-D array}`` (CSV cells stay strings until converted)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"CSV file {path} not found")
        with open(path, newline="") as fh:
            reader = csv.reader(fh)
            rows = [row for row in reader if any(cell.strip() for cell in row)]
        if len(rows) < 2:
            raise ValueError(f"{path} needs a header row and at least one data row")
        header = [h.strip() for h in rows[0]]
        _unique(header, path)
        for line, row in enumerate(rows[1:], start=2):
            if len(row) != len(header):
                raise ValueError(f"{path}, data row {line - 1}: {len(row)} cells, expected {len(header)} ({header})")
        return {name: np.array([row[j].strip() for row in rows[1:]]) for j, name in enumerate(header)}
    columns = getattr(source, "columns", None)
    names = list(columns) if columns is not None else list(source.keys()) if isinstance(source, dict) else None
    if names is None:
        raise TypeError(f"expected a CSV path, a pandas DataFrame or a dict of columns, got {type(source).__name__}")
    _unique([str(name) for name in names], "the table")
    return {str(name): np.asarray(source[name]) for name in names}


def _unique(names: List[str], source: object) -> None:
    """Refuse duplicate column names: a dict of columns would silently keep only the last of them."""
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ValueError(f"{source} has duplicate column names {duplicates}; rename them so that each is unique")


def _numeric(name: str, values: np.ndarray) -> np.ndarray:
    try:
        out = values.astype(float)
    except ValueError:
        bad = next(v for v in values if not _is_number(v))
        raise ValueError(
            f"column {name!r} must be numeric; it holds {bad!r} (convert or drop it, or leave it out of --features)"
        ) from None
    if not np.all(np.isfinite(out)):
        row = int(np.flatnonzero(~np.isfinite(out))[0])
        raise ValueError(f"column {name!r} has a missing or non-finite value in data row {row + 1}; impute or drop it")
    return out


def _is_number(value: Any) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def federated_from_table(
    source: Table,
    *,
    party_column: str,
    target: str,
    features: Optional[Sequence[str]] = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    name: Optional[str] = None,
) -> FederatedDataset:
    """One client per distinct value of ``party_column``, regressing ``target`` on ``features``.

    :param source: a CSV path (header row required) or a DataFrame (or a ``dict`` of equal-length columns).
    :param party_column: the column naming each row's party (any values: names or numbers).
    :param target: the output column.
    :param features: the input columns (default: every column but ``party_column`` and ``target``).
    :param test_fraction: the fraction of each party's rows held out for the shared test set, in ``[0, 1)``
        (0: no test set); each party keeps at least 2 training rows.
    :param seed: seed of the held-out draw (a simulation choice, not privacy noise).
    :param name: the dataset's label (default: the file name, or ``"table"``).
    :return: the :class:`FederatedDataset`, clients ordered by sorted party value.
    :raises ValueError: a column that does not exist (the message lists those that do), a non-numeric or
        missing feature/target value, a party with fewer than 2 rows, or ``test_fraction`` outside ``[0, 1)``.
    """
    if not 0 <= test_fraction < 1:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction!r}")
    columns = read_table(source)
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
        raise ValueError("--features must not include the party column or the target")
    X = np.stack([_numeric(c, columns[c]) for c in inputs], axis=1)
    Y = _numeric(target, columns[target])[:, None]
    parties = columns[party_column].astype(str)
    rng = np.random.default_rng(seed)
    clients, test_rows = [], []
    for party in sorted(set(parties.tolist())):
        rows = np.flatnonzero(parties == party)
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
    return FederatedDataset(clients, test=test, name=label)

"""A small generated table to try the own-data commands on: four hospitals, each with its own patients.

``gpflow-fed datasets --write-example hospitals.csv`` writes it; nothing in it is real. Each hospital sees its
own age range (the parties are not identically distributed), and the length of stay is a smooth function of
age and dose plus noise:

    los = 3 + 0.06·age + 1.5·sin(age/9) + 2·dose + ε,   ε ~ N(0, 0.5²)   (days)

Numpy only: the command writes it before (and without) TensorFlow.
"""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import Dict, List, Union

import numpy as np

__all__ = ["HOSPITALS", "example_table", "write_example_csv", "write_party_examples"]

#: hospital -> (rows, youngest, oldest patient)
HOSPITALS = {"north": (70, 20, 55), "south": (60, 35, 70), "east": (50, 50, 85), "west": (40, 25, 90)}


def example_table(seed: int = 0) -> Dict[str, np.ndarray]:
    """The columns ``hospital``, ``age`` (years), ``dose`` (mg/kg, 0–1) and ``los`` (days) of the module docstring."""
    rng = np.random.default_rng(seed)
    parts: Dict[str, List[np.ndarray]] = {"hospital": [], "age": [], "dose": []}
    for name, (rows, low, high) in HOSPITALS.items():
        parts["hospital"].append(np.full(rows, name))
        parts["age"].append(rng.uniform(low, high, rows))
        parts["dose"].append(rng.uniform(0.0, 1.0, rows))
    table = {k: np.concatenate(v) for k, v in parts.items()}
    age, dose = table["age"], table["dose"]
    table["los"] = 3 + 0.06 * age + 1.5 * np.sin(age / 9) + 2 * dose + 0.5 * rng.standard_normal(age.size)
    return table


def write_example_csv(path: Union[str, "os.PathLike[str]"], seed: int = 0) -> Path:
    """Write :func:`example_table` as a CSV with a header row (folders created); returns the path.

    :raises FileExistsError: ``path`` exists (the command never overwrites a file).
    """
    out = Path(path)
    if out.exists():
        raise FileExistsError(17, "File exists; choose another name or remove it", str(out))
    out.parent.mkdir(parents=True, exist_ok=True)
    table = example_table(seed)
    _write(out, table, ["hospital", "age", "dose", "los"], np.ones(table["los"].size, bool))
    return out


def write_party_examples(folder: Union[str, "os.PathLike[str]"], seed: int = 0) -> List[Path]:
    """Write each hospital's own rows of :func:`example_table` as ``<folder>/<hospital>.csv`` (columns ``age``,
    ``dose``, ``los``: no party column, as a party holds only its own table); returns the paths in
    :data:`HOSPITALS` order. For trying one command per party (``gpflow-fed flower party``).

    :raises FileExistsError: one of the files exists (nothing is written then).
    """
    out = Path(folder)
    paths = [out / f"{name}.csv" for name in HOSPITALS]
    for path in paths:
        if path.exists():
            raise FileExistsError(17, "File exists; choose another folder or remove it", str(path))
    out.mkdir(parents=True, exist_ok=True)
    table = example_table(seed)
    for name, path in zip(HOSPITALS, paths):
        _write(path, table, ["age", "dose", "los"], table["hospital"] == name)
    return paths


def _write(path: Path, table: Dict[str, np.ndarray], columns: List[str], rows: np.ndarray) -> None:
    formats = {"hospital": "{}", "age": "{:.1f}", "dose": "{:.3f}", "los": "{:.2f}"}
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(columns)
        for i in np.flatnonzero(rows):
            writer.writerow([formats[c].format(table[c][i]) for c in columns])

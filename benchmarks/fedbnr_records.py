"""The saved FedBNR methods tables (``fedbnr.py --out``), pooled over files: one record per dataset, K and seed.

A record that ran fewer methods than another for the same dataset, K and seed is a *rerun* of those methods (e.g.
``--methods local+local,local+global`` after a fix to the ablations): its scores replace the fuller record's,
method by method, whatever the order of the files. Records with the same methods are pooled in file order (a
later file's seed replaces an earlier one's).
"""

from __future__ import annotations

import json
from typing import Dict, Iterable, List, Tuple

__all__ = ["pool_method_records"]

Scores = Dict[str, Dict[str, float]]


def pool_method_records(paths: Iterable[str]) -> Dict[Tuple[str, int], Dict[int, Scores]]:
    """``{(dataset, K): {seed: {method: scores}}}`` from the files ``fedbnr.py --out`` wrote, reruns applied last
    (module docstring)."""
    records: List[dict] = []
    for path in paths:
        with open(path) as f:
            records.extend(json.load(f)["records"])
    pooled: Dict[Tuple[str, int], Dict[int, Scores]] = {}
    for record in sorted(records, key=lambda r: -len(r["methods"])):  # stable: file order among equals
        by_seed = pooled.setdefault((record["dataset"], record["K"]), {})
        by_seed.setdefault(record["seed"], {}).update(record["methods"])
    return pooled

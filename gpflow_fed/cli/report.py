"""One output layout for every command: the JSON object of ``--json`` and the text table without it.

Every command prints (``--json``) one object with the same keys (docs page "Command output")::

    {"schema_version": 1, "command": "fsgp", "dataset": {...} | null, "settings": {...},
     "results": [{"method": ..., "test_rmse": ..., ...}, ...], "warnings": [...], "outputs": {...}}

``dataset`` names the parties (the party column's values with ``--csv``) with their training sizes, the
features, the target and its units; every metric in ``results`` is in the target's units, with the standardised
forms beside them and a ``predict the mean`` row; ``outputs`` lists the files written (TensorBoard folder,
plot, saved model). :data:`SCHEMA_VERSION` changes when a key changes meaning or disappears.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = ["SCHEMA_VERSION", "dataset_info", "emit", "format_table", "method_row", "payload", "score_rows"]

SCHEMA_VERSION = 1
BASELINE = "predict the mean"
#: the metric columns of the text table: (key, header, format)
COLUMNS = (
    ("test_rmse", "test RMSE", "{:.4g}"),
    ("test_nlpd", "test NLPD", "{:.4f}"),
    ("test_coverage_90", "90 % cover", "{:.2f}"),
    ("test_rmse_standardized", "RMSE (std.)", "{:.4f}"),
    ("test_nlpd_standardized", "NLPD (std.)", "{:.4f}"),
    ("seconds", "time (s)", "{:.2f}"),
    ("bytes_sent", "bytes sent", "{:,}"),
)


def dataset_info(dataset: Any, *, features: Optional[Sequence[str]] = None, target: Optional[str] = None) -> Dict:
    """The ``dataset`` object: name, parties and their training sizes, test size, dimensions, columns."""
    names = list(dataset.names)
    return {
        "name": dataset.name,
        "parties": names,
        "party_sizes": dict(zip(names, (int(n) for n in dataset.client_sizes))),
        "num_test": 0 if dataset.test is None else int(dataset.test[0].shape[0]),
        "input_dim": int(dataset.input_dim),
        "features": None if features is None else list(features),
        "target": target,
        "units": f"the units of {target}" if target else "the data's units",
    }


def method_row(method: str, scores: Dict[str, float], **extra: Any) -> Dict[str, Any]:
    """One ``results`` entry: the method's label, its metrics and e.g. ``seconds``, ``bytes_sent``."""
    return {"method": method, **{k: float(v) for k, v in scores.items()}, **extra}


def score_rows(
    model: Any, label: str, raw_test: Any, standardizer: Any, num_test: int, **extra: Any
) -> Tuple[List[Dict[str, Any]], Optional[str]]:
    """``[the model's row, the predict-the-mean row]`` and its over-confidence warning (or ``None``)."""
    from ..evaluation import calibration_message, held_out_metrics, mean_baseline

    scores = held_out_metrics(model, raw_test, standardizer)
    warning = calibration_message(scores, num_test, label)
    rows = [method_row(label, scores, **extra), method_row(BASELINE, mean_baseline(raw_test, standardizer))]
    return rows, warning


def payload(
    command: str,
    dataset: Optional[Dict[str, Any]],
    settings: Dict[str, Any],
    results: List[Dict[str, Any]],
    warnings: Sequence[str] = (),
    outputs: Optional[Dict[str, Any]] = None,
) -> Dict[str, Any]:
    """The object every command prints with ``--json`` (module docstring)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "dataset": dataset,
        "settings": settings,
        "results": results,
        "warnings": list(warnings),
        "outputs": outputs or {},
    }


def format_table(rows: Sequence[Dict[str, Any]]) -> str:
    """A Markdown table of ``results`` rows (the columns any row has)."""
    columns = [c for c in COLUMNS if any(row.get(c[0]) is not None for row in rows)]
    lines = [
        "| method | " + " | ".join(header for _, header, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for row in rows:
        cells = [fmt.format(row[key]) if row.get(key) is not None else "–" for key, _, fmt in columns]
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def emit(as_json: bool, report: Dict[str, Any], header: str = "", footer: str = "") -> None:
    """Print ``report``: as JSON, or as ``header``, the results table and ``footer``; warnings go to stderr
    as ``warning: …`` lines either way."""
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if header:
        print(header)
    if report["results"]:
        print(format_table(report["results"]))
    if footer:
        print(footer)

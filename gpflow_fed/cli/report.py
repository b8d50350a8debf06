"""One output layout for every command: the JSON object of ``--json`` and the text table without it.

Every command prints (``--json``) one object with the same keys (docs page "Command output")::

    {"schema_version": 1, "command": "fsgp", "dataset": {...} | null, "settings": {...},
     "results": [{"method": ..., "test_rmse": ..., ...}, ...], "warnings": [...], "outputs": {...}}

``dataset`` names the parties (the party column's values with ``--csv``) with their training sizes, the
features, the target and its units (``unit``: the short form the table's headers carry); every metric in
``results`` is in the target's units, with the standardised forms beside them and a ``predict the mean`` row;
``outputs`` lists the files written (TensorBoard folder, plot, saved model). :data:`SCHEMA_VERSION` changes when a
key changes meaning or disappears.

A row whose held-out 90 % interval covers clearly fewer rows than 90 % is marked (``coverage_below_nominal``, and
:data:`BELOW_NOMINAL` beside its coverage in the table, explained under it): "clearly" is a one-sided binomial test
at the held-out count n, ``P[Binomial(n, 0.9) ≤ covered] <`` :data:`COVERAGE_TEST_LEVEL`, so that a calibrated
model's row is marked by chance at most once in a hundred, while a shortfall of a few rows on a small test set is not
(docs page "Command output").
"""

from __future__ import annotations

import json
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

__all__ = [
    "COVERAGE_TEST_LEVEL",
    "SCHEMA_VERSION",
    "below_nominal",
    "dataset_info",
    "emit",
    "format_table",
    "method_row",
    "payload",
    "score_rows",
]

SCHEMA_VERSION = 1
BASELINE = "predict the mean"
#: the nominal coverage of the reported interval (``test_coverage_90``)
NOMINAL_COVERAGE = 0.9
#: the significance of the one-sided binomial test behind ``coverage_below_nominal`` (module docstring)
COVERAGE_TEST_LEVEL = 0.01
#: the mark beside a coverage the test finds below nominal
BELOW_NOMINAL = "↓"
#: the metric columns of the text table: (key, header, format); the RMSE's header carries the target's unit
COLUMNS = (
    ("test_rmse", "test RMSE", "{:.4g}"),
    ("test_nlpd", "test NLPD", "{:.4f}"),
    ("test_coverage_90", "90 % cover", "{:.2f}"),
    ("test_rmse_standardized", "RMSE (std.)", "{:.4f}"),
    ("test_nlpd_standardized", "NLPD (std.)", "{:.4f}"),
    ("elbo_per_point", "ELBO / N", "{:.4f}"),
    ("seconds", "time (s)", "{:.2f}"),
    ("bytes_sent", "bytes sent", "{:,}"),
)


def dataset_info(
    dataset: Any,
    *,
    features: Optional[Sequence[str]] = None,
    target: Optional[str] = None,
    unit: Optional[str] = None,
) -> Dict:
    """The ``dataset`` object: name, parties and their training sizes, test size, dimensions, columns, units.

    :param target: the output column of a user's table (its unit is unknown: "the units of <target>").
    :param unit: the target's unit when it is known (a built-in dataset's, :func:`dataset_unit`); neither: generated
        data, without a unit.
    """
    names = list(dataset.names)
    if unit is not None:
        units, short = unit, unit
    elif target:
        units, short = f"the units of {target}", target
    else:
        units, short = "the data's units (generated: no unit)", None
    return {
        "name": dataset.name,
        "parties": names,
        "party_sizes": dict(zip(names, (int(n) for n in dataset.client_sizes))),
        "num_test": 0 if dataset.test is None else int(dataset.test[0].shape[0]),
        "input_dim": int(dataset.input_dim),
        "features": None if features is None else list(features),
        "target": target,
        "units": units,
        "unit": short,
    }


def dataset_unit(name: str) -> Optional[str]:
    """The target's unit of a built-in dataset (:data:`gpflow_fed.data.real.TARGET_UNITS`), None for generated
    data."""
    from ..data.real import TARGET_UNITS

    return TARGET_UNITS.get(name)


def below_nominal(coverage: float, num_test: int) -> bool:
    """Whether ``coverage`` of ``num_test`` held-out rows is clearly below :data:`NOMINAL_COVERAGE`: the one-sided
    binomial test of the module docstring, ``P[Binomial(n, 0.9) ≤ round(coverage · n)] <`` :data:`COVERAGE_TEST_LEVEL`.
    """
    if num_test < 1:
        return False
    from scipy.stats import binom

    covered = int(round(coverage * num_test))
    return bool(binom.cdf(covered, num_test, NOMINAL_COVERAGE) < COVERAGE_TEST_LEVEL)


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
    """The object every command prints with ``--json`` (module docstring); each result with a held-out coverage gets
    ``coverage_below_nominal`` (:func:`below_nominal` at the dataset's ``num_test``)."""
    num_test = int((dataset or {}).get("num_test") or 0)
    if num_test:
        results = [
            {**row, "coverage_below_nominal": below_nominal(float(row["test_coverage_90"]), num_test)}
            if row.get("test_coverage_90") is not None
            else row
            for row in results
        ]
    return {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "dataset": dataset,
        "settings": settings,
        "results": results,
        "warnings": list(warnings),
        "outputs": outputs or {},
    }


def format_table(rows: Sequence[Dict[str, Any]], unit: Optional[str] = None, num_test: int = 0) -> str:
    """A Markdown table of ``results`` rows (the columns any row has): the RMSE's header names ``unit`` (``test RMSE
    [ppm]``), a coverage clearly below nominal is marked :data:`BELOW_NOMINAL` and explained under the table (at
    ``num_test`` held-out rows)."""
    columns = [c for c in COLUMNS if any(row.get(c[0]) is not None for row in rows)]
    headers = [f"{header} [{unit}]" if key == "test_rmse" and unit else header for key, header, _ in columns]
    lines = ["| method | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(columns)]
    keys, marked = [key for key, _, _ in columns], False
    for row in rows:
        cells = [fmt.format(row[key]) if row.get(key) is not None else "–" for key, _, fmt in columns]
        if row.get("coverage_below_nominal") and "test_coverage_90" in keys:
            cells[keys.index("test_coverage_90")] += f" {BELOW_NOMINAL}"
            marked = True
        lines.append(f"| {row['method']} | " + " | ".join(cells) + " |")
    if marked:
        lines.append(
            f"{BELOW_NOMINAL} 90 % interval covers clearly fewer than 90 % of the {num_test} held-out rows (one-sided "
            f"binomial test, p < {COVERAGE_TEST_LEVEL:g}): its error bars are too narrow"
        )
    return "\n".join(lines)


def emit(as_json: bool, report: Dict[str, Any], header: str = "", footer: str = "") -> None:
    """Print ``report``: as JSON, or as ``header``, the results table (in the dataset's ``unit``) and ``footer``;
    warnings go to stderr as ``warning: …`` lines either way."""
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    if as_json:
        print(json.dumps(report, indent=2))
        return
    if header:
        print(header)
    if report["results"]:
        dataset = report.get("dataset") or {}
        print(format_table(report["results"], dataset.get("unit"), int(dataset.get("num_test") or 0)))
    if footer:
        print(footer)

"""``benchmarks/fit_defaults.py``: the defaults fit and the CLI share are the ones the saved measurement chose."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.fitting import DEFAULTS

SAVED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "fit_defaults.json"


def test_defaults_are_the_measured_choice(load_benchmark):
    record = json.loads(SAVED.read_text())
    assert record["command"] == "python benchmarks/fit_defaults.py --out benchmarks/results/fit_defaults.json"
    assert not record["quick"] and record["datasets"] == ["diabetes", "concrete"] and record["seeds"] == [0, 1, 2]
    for method, chosen in record["chosen"].items():
        settings = {k: v for k, v in chosen.items() if k != "candidate"}
        assert {k: DEFAULTS[method][k] for k in settings} == settings, method
        # the choice is the candidate with the lowest mean standardised NLPD over every run of the method
        runs = [r for r in record["runs"] if r["method"] == method]
        means = {c: np.mean([r["test_nlpd_standardized"] for r in runs if r["candidate"] == c]) for c in
                 {r["candidate"] for r in runs}}  # fmt: skip
        assert chosen["candidate"] == min(means, key=means.get)
        assert len(runs) == len(means) * 2 * 3  # every candidate on both datasets and three seeds
    fit_defaults = load_benchmark("fit_defaults")
    assert fit_defaults.summarize(record["runs"])["chosen"] == record["chosen"]


@pytest.mark.slow  # six fits: about a minute on 2 cores
def test_quick_run_records_every_candidate(load_benchmark, tmp_path):
    fit_defaults = load_benchmark("fit_defaults")
    out = tmp_path / "fit_defaults.json"
    assert fit_defaults.main(["--quick", "--methods", "fsgp", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert {r["candidate"] for r in record["runs"]} == set(fit_defaults.CANDIDATES["fsgp"])
    assert {r["dataset"] for r in record["runs"]} == {"diabetes", "concrete"}
    assert all(np.isfinite(r["test_rmse"]) and r["test_rmse"] > 1 for r in record["runs"])  # target units

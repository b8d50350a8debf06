"""The commands' tables (issue 45): the target's unit in the header, a held-out coverage clearly below its nominal
90 % marked and explained (one-sided binomial test), recycle's rows with time and bytes, and a unit for every
built-in dataset."""

import numpy as np
import pytest
from scipy.stats import binom

from gpflow_fed.cli.report import (
    BELOW_NOMINAL,
    COVERAGE_TEST_LEVEL,
    below_nominal,
    dataset_info,
    emit,
    format_table,
    payload,
)


class _Data:
    name, names, client_sizes, input_dim = "co2", ("client_0", "client_1"), (150, 150), 1
    test = (np.zeros((300, 1)), np.zeros((300, 1)))


def _row(method, coverage):
    return {"method": method, "test_rmse": 0.8, "test_nlpd": 2.4, "test_coverage_90": coverage, "seconds": 1.5,
            "bytes_sent": 12270}  # fmt: skip


def test_the_binomial_rule():
    # at 300 held-out rows: 0.81 of them is far below 90 % (p ≈ 2e-6), 0.87 is within chance (p ≈ 0.05)
    assert below_nominal(0.81, 300) and not below_nominal(0.87, 300) and not below_nominal(0.95, 300)
    # at 10 rows even 8 covered (0.8) is not evidence: P[Bin(10, 0.9) ≤ 8] ≈ 0.26
    assert not below_nominal(0.8, 10) and below_nominal(0.5, 10)
    for n in (10, 44, 300, 2000):  # the rule is the test's level, whatever n
        k = int(binom.ppf(COVERAGE_TEST_LEVEL, n, 0.9))
        covered = [c for c in range(n + 1) if below_nominal(c / n, n)]
        assert covered == list(range(max(covered) + 1)) and binom.cdf(max(covered), n, 0.9) < COVERAGE_TEST_LEVEL
        assert max(covered) in (k - 1, k)


def test_table_names_the_unit_and_marks_low_coverage(capsys):
    info = dataset_info(_Data(), unit="ppm")
    assert (info["units"], info["unit"]) == ("ppm", "ppm")
    report = payload("fsgp", info, {}, [_row("FSGP (fedavg)", 0.81), _row("centralized SGPR", 0.9)])
    assert [r["coverage_below_nominal"] for r in report["results"]] == [True, False]
    emit(False, report, f"metrics in {info['units']}")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "metrics in ppm" and out[1].startswith("| method | test RMSE [ppm] | test NLPD | 90 % cover |")
    assert f"| 0.81 {BELOW_NOMINAL} |" in out[3] and "| 0.90 |" in out[4]
    assert out[5].startswith(f"{BELOW_NOMINAL} 90 % interval covers clearly fewer than 90 % of the 300 held-out rows")
    assert "warning" not in "\n".join(out).lower()  # the table says it; stderr keeps the 70 % warning for worse
    own = dataset_info(_Data(), target="los")
    assert (own["units"], own["unit"]) == ("the units of los", "los")
    generated = dataset_info(_Data())
    assert generated["unit"] is None and format_table([_row("m", 0.9)]).startswith("| method | test RMSE | ")


def test_recycle_rows_have_time_and_bytes():
    rows = [{"method": "east", "elbo_per_point": -1.25, "seconds": 0.5, "bytes_sent": 2048}]
    assert format_table(rows).splitlines()[:3] == [
        "| method | ELBO / N | time (s) | bytes sent |",
        "|---|---:|---:|---:|",
        "| east | -1.2500 | 0.50 | 2,048 |",
    ]


def test_every_built_in_dataset_has_a_target_unit():
    from gpflow_fed.cli.datasets import REAL_DATASETS
    from gpflow_fed.cli.report import dataset_unit
    from gpflow_fed.data import real

    assert set(real.TARGET_UNITS) == set(real._LOADERS) == set(REAL_DATASETS)
    assert dataset_unit("co2") == "ppm" and dataset_unit("synthetic1") is None
    assert real.load_co2().units == "ppm"


def test_quick_help_states_what_it_costs():
    from gpflow_fed.cli import build_parser

    for command in ("fsgp", "pvi", "fedbnr", "recycle"):
        parser = build_parser()._subparsers._group_actions[0].choices[command]
        (quick,) = [a for a in parser._actions if "--quick" in a.option_strings]
        assert "(seconds)" not in quick.help and "CPU" in quick.help, (command, quick.help)


@pytest.mark.parametrize("coverage, marked", [(0.5, True), (0.95, False)])
def test_json_carries_the_flag(coverage, marked):
    report = payload("pvi", dataset_info(_Data(), target="y"), {}, [_row("PVI (dpo)", coverage)])
    assert report["results"][0]["coverage_below_nominal"] is marked

"""The verdict rule of BENCHMARKS.md (``benchmarks/figures.py``: ``verdict``) on evidence made up to decide each
word: the test, its sides, Holm across a paper's claims, the minimum number of pairs, and the kinds of claim."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rule():
    spec = importlib.util.spec_from_file_location("figures_rule", ROOT / "benchmarks" / "figures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _claim(cid, quantifier="all", kind="paired", **extra):
    return {"id": cid, "paper": "P", "kind": kind, "quantifier": quantifier, **extra}


def _ups(n, sign=1.0):
    return [sign * (0.1 + 0.01 * i) for i in range(n)]


def test_the_test_is_exact_one_sided_wilcoxon(rule):
    up, down = rule.exact_wilcoxon(_ups(5))
    assert up == pytest.approx(1 / 32) and down == 1.0  # 5 pairs: the smallest p is 2⁻⁵
    assert rule.exact_wilcoxon([0.0, 0.0]) == (1.0, 1.0)  # zero differences are dropped
    assert rule.exact_wilcoxon(_ups(10, -1.0))[1] == pytest.approx(1 / 1024)


def test_holm_and_the_minimum_number_of_pairs(rule):
    assert rule.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert [rule.minimum_pairs(m) for m in (1, 4, 6, 7)] == [5, 7, 7, 8]
    assert 2.0 ** -rule.minimum_pairs(7) <= 0.05 / 7 < 2.0 ** -(rule.minimum_pairs(7) - 1)


def test_each_word(rule):
    S = rule.Setting
    claims = [_claim("yes"), _claim("no"), _claim("half"), _claim("tie")]
    evidence = {
        "yes": [S("a", _ups(10)), S("b", _ups(10))],
        "no": [S("a", _ups(10, -1.0)), S("b", _ups(10, -1.0))],
        "half": [S("a", _ups(10)), S("b", [0.1, -0.2, 0.3, -0.4, 0.05, -0.06, 0.07, -0.08, 0.09, -0.1])],
        "tie": [S("a", [0.1, -0.2, 0.3, -0.4, 0.05, -0.06, 0.07, -0.08, 0.09, -0.1])],
    }
    words = {cid: v["verdict"] for cid, v in rule.verdict(claims, evidence).items()}
    assert words == {"yes": "reproduced", "no": "contradicted", "half": "partial", "tie": "inconclusive"}


def test_below_the_minimum_a_unanimous_result_is_inconclusive(rule):
    """5 seeds in 4 claims: 1/32 > 0.05 / 4, so a setting with 5 pairs cannot decide, and its cost is given."""
    S = rule.Setting
    claims = [_claim(f"c{i}") for i in range(4)]
    evidence = {f"c{i}": [S("a", _ups(5), seconds_per_pair=60.0)] for i in range(4)}
    out = rule.verdict(claims, evidence)
    assert {v["verdict"] for v in out.values()} == {"inconclusive"}
    assert out["c0"]["n_min"] == 7 and out["c0"]["seconds_to_n_min"] == pytest.approx(120.0)
    evidence = {f"c{i}": [S("a", _ups(7))] for i in range(4)}
    assert {v["verdict"] for v in rule.verdict(claims, evidence).values()} == {"reproduced"}


def test_most_needs_a_majority_and_all_needs_every_setting(rule):
    S = rule.Setting
    settings = [
        S("a", _ups(10)),
        S("b", _ups(10)),
        S("c", [0.1, -0.2, 0.3, -0.4, 0.05, -0.06, 0.07, -0.08, 0.09, -0.1]),
    ]
    out = rule.verdict([_claim("most", "most"), _claim("all")], {"most": settings, "all": settings})
    assert out["most"]["verdict"] == "reproduced" and out["all"]["verdict"] == "partial"


def test_single_runs_inadmissible_stand_ins_exact_checks_and_not_run(rule):
    S = rule.Setting
    claims = [
        _claim("one", kind="single"),
        _claim("bad", inadmissible="a constant predicts the label"),
        _claim("exact_yes", kind="exact"),
        _claim("exact_no", kind="exact"),
        _claim("later", kind="not run"),
    ]
    evidence = {"one": [S("a", [0.5])], "bad": [S("a", _ups(10, -1.0))], "exact_yes": True, "exact_no": False}
    words = {cid: v["verdict"] for cid, v in rule.verdict(claims, evidence).items()}
    assert words == {"one": "inconclusive", "bad": "inconclusive", "exact_yes": "reproduced",
                     "exact_no": "contradicted", "later": "not run"}  # fmt: skip


def test_a_margin_turns_comparable_into_a_one_sided_claim(rule):
    """The evidence builders add the margin: within it the claim holds, beyond it it fails."""
    S = rule.Setting
    gap = np.full(10, -0.02) + np.linspace(0, 0.001, 10)
    out = rule.verdict([_claim("near"), _claim("far")],
                       {"near": [S("a", gap + 0.05)], "far": [S("a", gap * 5 + 0.05)]})  # fmt: skip
    assert out["near"]["verdict"] == "reproduced" and out["far"]["verdict"] == "contradicted"

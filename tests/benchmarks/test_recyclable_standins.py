"""benchmarks/recyclable_standins.py: the digits' tasks, the Ames loader, the pairing, one tiny trial of each."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rs(load_benchmark):
    return load_benchmark("recyclable_standins")


def test_a_zero_is_learnt_by_corners_and_a_one_by_halves(rs):
    axis = np.linspace(-1.0, 1.0, 8)
    X = np.stack(np.meshgrid(axis, axis), -1).reshape(-1, 2)
    Y = np.arange(64.0)[:, None]
    corners, halves = rs.digit_tasks(0, X, Y), rs.digit_tasks(1, X, Y)
    assert [len(y) for _, y in corners] == [16] * 4 and [len(y) for _, y in halves] == [32, 32]
    assert sorted(np.concatenate([y for _, y in halves])[:, 0]) == list(range(64))
    assert np.all(halves[0][0][:, 1] > 0) and np.all(halves[1][0][:, 1] < 0)
    with pytest.raises(ValueError, match="digits 0 and 1"):
        rs.digit_tasks(8, X, Y)
    with pytest.raises(ValueError, match="no training pixel"):
        rs.digit_tasks(1, X[X[:, 1] > 0], Y[X[:, 1] > 0])


def test_the_ames_sales_load_with_a_binary_output(rs):
    X, log_price, air = rs.load_ames()
    assert X.shape == (2930, 2) and log_price.shape == air.shape == (2930, 1)
    assert set(np.unique(air)) == {0.0, 1.0} and 0.9 < air.mean() < 0.95  # 2,734 of 2,930 have central air
    assert np.all((-94 < X[:, 0]) & (X[:, 0] < -93) & (41.9 < X[:, 1]) & (X[:, 1] < 42.1))  # Ames, Iowa


def test_summary_pairs_the_trials_per_experiment(rs):
    rows = [
        {"experiment": "digits", "digit": 0, "seed": s, "method": m, "nlpd": v, "error": 0.1}
        for s, values in enumerate(((0.5, 0.6), (0.4, 0.3)))
        for m, v in zip(rs.DIGIT_METHODS, values)
    ]
    rows += [  # a third trial whose ensemble failed: left out of the means and the pairs, counted as failed
        {"experiment": "digits", "digit": 0, "seed": 2, "method": m, "nlpd": v, "error": v, "failed": f}
        for m, v, f in zip(rs.DIGIT_METHODS, (float("nan"), 0.9), ("raised", None))
    ]
    rows += [
        {"experiment": "ames", "seed": 0, "method": m, "nlpd": v, "error": 0.0}
        for m, v in zip(rs.AMES_METHODS, (0.2, 0.1, 0.05, 0.3))
    ]
    summary = rs.summarise(rows)
    assert set(summary) == {"digit 0", "ames"}  # no row of the one
    zero = summary["digit 0"]["paired_nlpd"]
    np.testing.assert_allclose(zero["per_trial"], [-0.1, 0.1])
    assert zero["a_better"] == 1 and zero["trials"] == 2 and zero["a"] == rs.ENSEMBLE
    zero_methods = summary["digit 0"]["methods"]
    assert zero_methods[rs.ENSEMBLE]["failed"] == 1 and zero_methods[rs.ENSEMBLE]["nlpd"]["n"] == 2
    assert zero_methods[rs.SINGLE]["nlpd"]["mean"] == pytest.approx(0.6) and zero_methods[rs.SINGLE]["failed"] == 0
    ames = summary["ames"]["paired_nlpd"]
    assert ames["per_trial"] == [pytest.approx(0.1)] and ames["a_better"] == 0 and ames["b"] == rs.CLASSIFIERS
    assert summary["ames"]["methods"][rs.BASE_RATE]["nlpd"] == {"mean": 0.3, "sd": 0.0, "n": 1}


def test_one_tiny_trial_of_each_writes_json_with_provenance(rs, tmp_path):
    out = tmp_path / "standins.json"
    argv = ["--trials", "1", "--maxiter", "0", "--out", str(out)]
    rs.main(argv)
    saved = json.loads(out.read_text())
    assert saved["git_commit"] and saved["command"] == "python benchmarks/recyclable_standins.py " + " ".join(argv)
    rows = saved["rows"]
    assert [(r["experiment"], r["method"]) for r in rows] == [("digits", m) for m in rs.DIGIT_METHODS] * 2 + [
        ("ames", m) for m in rs.AMES_METHODS
    ]
    for r in rows[:4]:  # no iteration: every classifier keeps its prior, p(ink) = 1/2, so NLPD = log 2
        assert r["nlpd"] == pytest.approx(np.log(2.0)) and r["seed"] == 0
    assert sum(rows[0]["tasks"]) == 48 and len(rows[0]["tasks"]) == 4 and len(rows[2]["tasks"]) == 2
    assert [r["digit"] for r in rows[:4]] == [0, 0, 1, 1] and rows[0]["image"] == 0 and rows[2]["image"] == 1
    hetero, classifiers, q1, base = rows[4:]
    assert classifiers["nlpd"] == pytest.approx(np.log(2.0)) and q1["nlpd"] == pytest.approx(np.log(2.0))
    assert hetero["nlpd"] != pytest.approx(np.log(2.0))  # Q1's Gaussian model has its q fitted in closed form
    share = base["air_test_q1"]
    assert 0 < share <= 1 and base["num_train"] == 2344 and sum(base["quadrant_sizes"]) == 2344
    assert base["error"] == pytest.approx(1 - share)  # the base rate says "central air" everywhere
    assert 0 < base["nlpd"] < np.log(2.0) and base["num_test_q1"] == hetero["num_test_q1"] > 0
    assert saved["summary"]["ames"]["paired_nlpd"]["trials"] == 1 and saved["trials_done"] == 1

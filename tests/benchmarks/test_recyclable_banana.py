"""benchmarks/recyclable_banana.py: the vendored banana data, its loader's checks, the split, one tiny trial."""

import json

import numpy as np
import pytest
import scipy.io


@pytest.fixture(scope="module")
def rb(load_benchmark):
    return load_benchmark("recyclable_banana")


def test_the_vendored_file_is_the_banana_set(rb):
    X, Y = rb.load_banana()
    assert X.shape == (5300, 2) and Y.shape == (5300, 1) and X.dtype == Y.dtype == np.float64
    assert set(np.unique(Y)) == {0.0, 1.0} and int(Y.sum()) == 2376
    np.testing.assert_allclose(X.std(axis=0), 1.0, atol=1e-3)


def _write(path, X, Y, x_key="banana_X"):
    scipy.io.savemat(path, {x_key: X, "banana_Y": Y})
    return str(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda X, Y: (X, Y, "X"), "expected the keys"),
        (lambda X, Y: (X[:-1], Y[:-1], "banana_X"), r"expected banana_X \[5300, 2\]"),
        (lambda X, Y: (np.where(np.arange(5300)[:, None] == 7, np.nan, X), Y, "banana_X"), "NaN or inf"),
        (lambda X, Y: (X, 2 * Y - 1, "banana_X"), r"labels must be coded \{0, 1\}, found \[-1.0, 1.0\]"),
        (lambda X, Y: (X, 1 - Y, "banana_X"), r"expected \(2924, 2376\) zeros/ones"),
    ],
)
def test_the_loader_refuses_anything_else(rb, tmp_path, change, message):
    X, Y = rb.load_banana()
    X, Y, key = change(X, Y)
    with pytest.raises(ValueError, match=message):
        rb.load_banana(_write(tmp_path / "bad.mat", X, Y, key))


def test_split_sizes_and_training_standardisation(rb):
    X, Y = rb.load_banana()
    X_tr, Y_tr, X_te, Y_te = rb.split(X, Y, seed=3)
    assert (len(X_tr), len(X_te)) == (3551, 1749) and len(Y_tr) == 3551 and len(Y_te) == 1749
    np.testing.assert_allclose(X_tr.mean(axis=0), 0.0, atol=1e-12)
    np.testing.assert_allclose(X_tr.std(axis=0), 1.0, atol=1e-12)
    assert not np.allclose(X_te.mean(axis=0), 0.0, atol=1e-6)  # test rows use the training statistics
    np.testing.assert_array_equal(rb.split(X, Y, seed=3)[2], X_te)
    assert not np.array_equal(rb.split(X, Y, seed=4)[2], X_te)


def test_summary_pairs_the_trials(rb):
    rows = [
        {"seed": s, "method": m, "nlpd": v, "error": 0.1, "fit_s": 1.0}
        for s, values in enumerate(((0.20, 0.25, 0.19), (0.30, 0.28, 0.27)))
        for m, v in zip(rb.METHODS, values)
    ]
    rows += [  # a third trial whose ensemble fit failed: left out of its mean and of the pairs
        {"seed": 2, "method": m, "nlpd": v, "error": v, "fit_s": 1.0, "failed": "raised" if v != v else None}
        for m, v in zip(rb.METHODS, (float("nan"), 0.5, 0.5))
    ]
    summary = rb.summarise(rows)
    paired = summary["paired_nlpd_ensemble_minus_single"]
    np.testing.assert_allclose(paired["per_trial"], [-0.05, 0.02])
    assert paired["ensemble_better"] == 1 and paired["trials"] == 2
    np.testing.assert_allclose([paired["mean"], paired["sd"]], [-0.015, np.std([-0.05, 0.02], ddof=1)])
    ensemble, single = summary["methods"][rb.ENSEMBLE], summary["methods"][rb.SINGLE]
    assert ensemble["trials"] == 3 and ensemble["failed"] == 1 and ensemble["nlpd"]["n"] == 2
    assert ensemble["nlpd"]["mean"] == pytest.approx(0.25) and single["failed"] == 0
    assert single["nlpd"]["mean"] == pytest.approx((0.25 + 0.28 + 0.5) / 3) and single["nlpd"]["n"] == 3


def test_one_tiny_trial_writes_json_with_provenance(rb, tmp_path, monkeypatch):
    X, Y = rb.load_banana()
    keep = np.random.default_rng(0).choice(len(X), 300, replace=False)
    monkeypatch.setattr(rb, "load_banana", lambda: (X[keep], Y[keep]))
    out = tmp_path / "banana.json"
    argv = ["--trials", "1", "--maxiter", "0", "--out", str(out)]
    rb.main(argv)
    saved = json.loads(out.read_text())
    assert saved["git_commit"] and saved["command"] == "python benchmarks/recyclable_banana.py " + " ".join(argv)
    assert saved["trials_done"] == 1 and [r["method"] for r in saved["rows"]] == list(rb.METHODS)
    for r in saved["rows"]:  # no iterations: every model keeps its prior, p(y* = 1) = 1/2, so NLPD = log 2
        assert r["num_train"] == 201 and r["num_test"] == 99 and r["fit_s"] > 0
        assert r["nlpd"] == pytest.approx(np.log(2.0)) and 0 <= r["error"] <= 1
    ensemble = saved["rows"][0]
    assert sum(m["num_data"] for m in ensemble["local"]) == 201 and len(ensemble["local"]) == 4
    assert all(m["variance"] == 2.0 and m["lengthscale"] == 0.7 for m in ensemble["local"])  # at their start
    assert np.isfinite(ensemble["bound"])
    assert saved["summary"]["paired_nlpd_ensemble_minus_single"]["trials"] == 1


@pytest.mark.slow  # ≈ 15 s: four L-BFGS loops traced
def test_a_few_iterations_learn_the_classes(rb):
    X, Y = rb.load_banana()
    keep = np.random.default_rng(1).choice(len(X), 400, replace=False)
    rows = rb.run_trial(X[keep], Y[keep], seed=0, maxiter=5)
    assert [r["method"] for r in rows] == list(rb.METHODS)
    for r in rows:
        assert r["nlpd"] < 0.6 and r["error"] < 0.3, r  # chance: NLPD log 2 ≈ 0.69, error ≈ 0.45

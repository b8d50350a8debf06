"""benchmarks/recyclable.py: the trial path of the distributed settings at tiny size, and the saved one-seed rows."""

import argparse
import os

import numpy as np

from gpflow_fed.data import distributed_segments, smooth_function


def test_distributed_trial_rows_and_summary(load_benchmark):
    rec = load_benchmark("recyclable")
    cfg = dict(rec._distributed_cfg("10k"), local_maxiter=5, maxiter=5, M=6)
    rows = []
    for seed in (0, 1):
        d = distributed_segments(num_segments=3, num_per_segment=20, seed=seed)
        test = (d.test[0], d.test[1], smooth_function(d.test[0]))
        new_rows, recs = rec.run_setting("10k", list(d.clients), test, cfg)
        assert len(recs) == 3
        rows += [dict(r, seed=seed) for r in new_rows]
    methods = [r["method"] for r in rows[: len(rows) // 2]]
    assert methods[0].startswith("Recyclable ensemble (ours), default") and "plain" in methods[1]
    assert sum("committee" in m or "experts" in m for m in methods) == 8  # 4 rules × (default, plain) experts
    summary = rec.summarise(rows)
    assert len(summary) == len(methods) and all(s["trials"] == 2 for s in summary)
    nlpd = [r["nlpd"] for r in rows if r["method"] == methods[0]]
    assert summary[0]["nlpd"]["mean"] == np.mean(nlpd)
    assert summary[0]["nlpd"]["sd"] == np.std(nlpd, ddof=1)
    assert "refitted" in summary[0] and "speed_ratio" not in summary[0]
    X_test = d.test[0]  # the last seed's test set: [−0.5, 0.8]
    inside = (X_test[:, 0] >= cfg["lo"]) & (X_test[:, 0] <= cfg["hi"])
    assert 0 < inside.sum() < len(inside)
    r = rows[-1]  # the pooled SVGP of the last seed: its overall RMSE splits into the two ranges
    pieces = inside.sum() * r["rmse_in_range"] ** 2 + (~inside).sum() * r["rmse_outside"] ** 2
    np.testing.assert_allclose(pieces / len(inside), r["rmse"] ** 2, rtol=1e-10)
    assert {"rmse_in_range", "rmse_outside"} <= set(summary[0])


def test_peer_rows_name_the_noise_rule_not_its_value_so_trials_pool(load_benchmark, monkeypatch):
    """The authors'-code rows of two trials with different noise variances summarise as one method each."""
    import argparse
    import json

    rec = load_benchmark("recyclable")
    test = (np.zeros((3, 1)), np.ones((3, 1)), np.zeros((3, 1)))
    peer_output = {"sigma": 1.0, "local_iters": 15, "local_seconds": 7.0, "own": None, "ours": None}

    def fake_peer(command, check):  # stands in for the authors' code: writes its JSON reply
        reply = {"mean": [0.0, 0.5, 1.0], "var": [0.1, 0.2, 0.3], "ensemble_seconds": 4.0, "bound": 9.0}
        with open(command[5], "w") as f:
            json.dump(dict(peer_output, own=reply, ours=reply), f)

    monkeypatch.setattr(rec.subprocess, "run", fake_peer)
    monkeypatch.setattr(rec, "_ensemble", lambda recs, cfg: (None, 2.0))
    args = argparse.Namespace(peer_python="python", peer_driver="driver.py", peer_src="src", peer_local_iters=15)
    rows = []
    for seed, noise in ((0, 3.86), (1, 4.06)):
        ours = {"noise": noise, "fit_s": 1.0, "bound": 0.0}
        new = rec.run_peer(args, "10k", [], test, {"lo": 0.0, "hi": 5.0}, [], ours)
        rows += [dict(r, seed=seed) for r in new]
    assert all(str(noise) not in r["method"] for r in rows for noise in (3.86, 4.06))
    assert sorted({r["noise_variance"] for r in rows if r["method"].endswith("σ² as ours")}) == [3.86, 4.06]
    summary = rec.summarise(rows)
    assert len(summary) == 4 and all(s["trials"] == 2 for s in summary)
    assert all(s["speed_ratio"]["mean"] == 2.0 for s in summary)  # 4 s against the slower of our fits, 2 s


def test_one_seed_settings_are_saved_with_their_seed(load_benchmark, monkeypatch):
    """toy, pyramid and sunspots rows land in ``benchmarks/results/recyclable_<name>.json`` through provenance."""
    rec = load_benchmark("recyclable")
    saved = {}
    monkeypatch.setattr(rec, "save", lambda path, payload, script: saved.update(path=path, payload=payload))
    rec._save_single(argparse.Namespace(seed=3), "pyramid_r5", [{"method": "flat", "nlpd": 1.0}])
    assert saved["path"].endswith(os.path.join("benchmarks", "results", "recyclable_pyramid_r5.json"))
    assert saved["payload"] == {
        "setting": "pyramid_r5",
        "seed": 3,
        "rows": [{"method": "flat", "nlpd": 1.0, "seed": 3}],
    }

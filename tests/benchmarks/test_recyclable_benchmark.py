"""benchmarks/recyclable.py: the trial path of the distributed settings at tiny size."""

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

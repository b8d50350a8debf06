"""benchmarks/recyclable_refit_tuning.py: the decision rule fixed before the run, the seeds it refuses, its JSON."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def rt(load_benchmark):
    return load_benchmark("recyclable_refit_tuning")


def _rows(rt, offsets, seeds=range(10, 20)):
    """Rows where candidate ``name`` scores the default's NLPD plus ``offsets[name][i]`` on seed i."""
    rows = []
    for i, seed in enumerate(seeds):
        base = 2.2 + 0.01 * i
        rows.append({"seed": seed, "candidate": rt.DEFAULT, "nlpd": base})
        rows += [{"seed": seed, "candidate": name, "nlpd": base + off[i]} for name, off in offsets.items()]
    return rows


def test_the_default_stays_when_no_candidate_clears_the_margin_on_enough_seeds(rt):
    small = [-0.009] * 10  # lower on every seed, but by less than the margin
    few = [-0.05] * 6 + [0.001] * 4  # lower by more than the margin on average, but on only 6 of 10 seeds
    summary = rt.decide(_rows(rt, {"plain": small, "ratio 3": few}))
    assert summary["decision"] == rt.DEFAULT and summary["seeds"] == list(range(10, 20))
    plain = summary["paired_nlpd_minus_default"]["plain"]
    assert plain["lower_on"] == 10 and plain["mean"] == pytest.approx(-0.009)
    assert summary["paired_nlpd_minus_default"]["ratio 3"]["lower_on"] == 6
    assert "≥ 7 of 10" in summary["rule"]


def test_the_best_candidate_that_clears_the_rule_replaces_the_default(rt):
    summary = rt.decide(_rows(rt, {"plain": [-0.02] * 10, "ratio 30": [-0.04] * 7 + [0.01] * 3}))
    assert summary["decision"] == "ratio 30"  # mean −0.025 against −0.02, lower on 7 of 10
    np.testing.assert_allclose(summary["mean_nlpd"]["plain"], summary["mean_nlpd"][rt.DEFAULT] - 0.02)


def test_evaluation_seeds_are_refused_and_a_run_saves_with_provenance(rt, tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        rt.main(["--seeds", "9", "10"])
    calls = []

    def fake_trial(seed, candidates, cfg):
        calls.append((seed, list(candidates), cfg["local_maxiter"]))
        return [{"seed": seed, "candidate": c, "nlpd": 2.0, "rmse_in_range": 0.1, "refitted": 0} for c in candidates]

    monkeypatch.setattr(rt, "trial", fake_trial)
    out = tmp_path / "tuning.json"
    rt.main(["--seeds", "11", "12", "--out", str(out)])
    assert calls == [(11, list(rt.CANDIDATES), 200), (12, list(rt.CANDIDATES), 200)]
    saved = json.loads(out.read_text())
    assert saved["git_commit"] and saved["command"].endswith(f"--seeds 11 12 --out {out}")
    assert saved["trials_done"] == 2 and saved["summary"]["decision"] == rt.DEFAULT  # ties keep the default
    assert saved["candidates"][rt.DEFAULT] == {"collapse_snr": 1e-3, "max_lengthscale_ratio": 10.0}


def test_the_default_candidate_is_the_library_default(rt):
    from gpflow_fed.models import LocalSVGPTrainer

    trainer = LocalSVGPTrainer()
    assert rt.CANDIDATES[rt.DEFAULT] == {
        "collapse_snr": trainer.collapse_snr,
        "max_lengthscale_ratio": trainer.max_lengthscale_ratio,
    }

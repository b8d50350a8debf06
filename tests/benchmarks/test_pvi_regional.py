"""``benchmarks/pvi_regional.py``: the rule written before the regional runs, and a tiny run's diagnostics."""

import json

import numpy as np
import pytest


@pytest.fixture(scope="module")
def regional(load_benchmark):
    return load_benchmark("pvi_regional")


REFERENCE = {("dpo", s): -0.33 for s in range(4)} | {("global", s): -0.20 for s in range(4)}


@pytest.mark.parametrize(
    "runs, expected",
    [
        ({0: -0.30, 1: -0.31}, "not enough runs"),
        ({0: -0.22, 1: -0.24, 2: -0.25}, "closes the gap"),
        ({0: -0.27, 1: -0.28, 2: -0.26}, "narrows the gap"),
        ({0: -0.40, 1: -0.45, 2: -0.39}, "widens the gap"),
        ({0: -0.31, 1: -0.35, 2: -0.32}, "no effect found"),  # |mean d| < 0.05
        ({0: -0.20, 1: -0.45, 2: -0.25}, "no effect found"),  # signs differ
    ],
)
def test_the_preregistered_rule(regional, runs, expected):
    assert regional.verdict(runs, REFERENCE)["verdict"] == expected


def test_the_rule_reads_the_saved_default_and_global_runs(regional):
    reference = regional.saved_reference(10)
    assert {s for (m, s) in reference if m == "dpo"} == {0, 1, 2, 3, 4}
    assert reference[("dpo", 0)] == pytest.approx(-0.291, abs=5e-4) and reference[("global", 0)] < -0.1
    assert {s for (m, s) in regional.saved_reference(32) if m == "dpo"} == {0, 1, 4, 5, 6}


@pytest.mark.slow  # two PVI runs traced: 11 min at load 8 on the shared 2 cores
def test_a_tiny_run_saves_its_diagnostics(regional, tmp_path, capsys):
    out = tmp_path / "regional.json"
    tiny = ["--rounds", "10", "--local-steps", "5", "--inducing", "6", "--predict-samples", "2"]
    assert regional.main([*tiny, "--variants", "uniform_z,damped", "--splits", "0", "--out", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["command"].startswith("python benchmarks/pvi_regional.py") and saved["git_commit"]
    for variant in ("uniform_z", "damped"):
        record = saved["runs"][f"ozone|{variant}|0"]
        assert record["finished"] and np.isfinite(record["ll"]) and len(record["curve"]) == 1  # K = 10 = rounds
        assert len(record["updates"]) == 10 and len(record["rounds"]) == 10
        update = record["updates"][3]
        assert update["client"] == 3 and 1 <= update["steps"] <= 5 and update["jitter"] >= 1e-6
        assert len(update["beta"]) == 5 and update["qZ_std"] > 0
        assert 0 <= update["own_region_means_after"] <= 6 and 1 <= record["rounds"][-1]["regions"] <= 10
    assert regional.main(["--summarize", "--out", str(out)]) == 0
    assert "not enough runs" in capsys.readouterr().out


def test_uniform_inducing_means_lie_in_the_public_box(regional):
    import argparse

    a = argparse.Namespace(local_steps=5, patience=5, max_pseudo=500, predict_samples=2, rounds=2, inducing=50, split=0)
    fed, scaler = regional.split_with_scaler(0, 10, 4000)
    Z = regional.build("uniform_z", fed, scaler, a, None).Z0 * scaler.X_std.ravel() + scaler.X_mean.ravel()
    low, high = (np.array(b) for b in zip(*regional.PUBLIC_BOX))
    assert np.all(Z >= low - 1e-9) and np.all(Z <= high + 1e-9)
    assert np.all(Z.max(0) - Z.min(0) > 0.8 * (high - low))  # spread over the box, not a N(0, I) cloud


def test_progress_digests_a_partial_run_against_the_saved_default(regional, capsys):
    update = dict(client=0, steps=300.0, cavity_clipped=0.0, jitter=1e-6, qZ_std=0.1, beta=[1.0] * 5)
    updates = [
        dict(update, own_region_means_before=2, own_region_means_after=5),
        dict(update, steps=900.0, cavity_clipped=3.0, jitter=1e-4, own_region_means_before=5, own_region_means_after=1),
    ]
    saved = {"runs": {"ozone|damped|0": {"updates": updates, "rounds": [{"qZ_std": 0.3, "regions": 7}] * 12,
                                         "curve": [-0.9], "seconds": 50.0}}}  # fmt: skip
    (row,) = regional.progress(saved, 10)
    assert row["communications"] == 12 and row["default_curve"] == [pytest.approx(-0.501, abs=5e-4)]
    assert (row["steps_median"], row["steps_max"], row["clipped_updates"]) == (600.0, 900.0, 1)
    assert row["max_jitter"] == 1e-4 and row["pulled_own_region"] == 1 and row["regions_end"] == 7
    assert "| ozone damped 0 | 12 | -0.900 (-0.501) |" in capsys.readouterr().out


def test_summarize_joins_runs_saved_by_separate_processes(regional, tmp_path, capsys):
    update = dict(client=0, steps=300.0, cavity_clipped=0.0, jitter=1e-6, qZ_std=0.1, beta=[1.0] * 5)
    update |= dict(own_region_means_before=2, own_region_means_after=2)

    def record(ll):
        rounds = [{"qZ_std": 0.3, "regions": 7}] * 100
        return {"finished": True, "ll": ll, "updates": [update], "rounds": rounds, "curve": [ll], "seconds": 1.0}

    first, second = tmp_path / "s01.json", tmp_path / "s2.json"
    unfinished = dict(record(-0.1), finished=False)  # split 2 started here too, and stopped: the other file's counts
    runs = {f"ozone|damped|{s}": record(-0.9) for s in (0, 1)} | {"ozone|damped|2": unfinished}
    first.write_text(json.dumps({"runs": runs}))
    second.write_text(json.dumps({"runs": {"ozone|damped|2": record(-0.9)}}))
    assert regional.main(["--summarize", "--out", str(first)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| damped |")]
    assert "[0, 1]" in row and row.endswith("| not enough runs |")  # two splits alone
    assert regional.main(["--summarize", "--out", str(first), "--also", str(second)]) == 0
    (row,) = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| damped |")]
    assert "[0, 1, 2]" in row and row.endswith("| widens the gap |")  # −0.9 against the default's ≈ −0.3
    with pytest.raises(SystemExit, match="repeats finished runs"):
        regional.main(["--summarize", "--out", str(first), "--also", str(first)])


def test_hyperparameters_reads_q_beta_after_the_first_pass_and_at_the_end(regional, capsys):
    updates = [dict(client=k % 3, beta=[1.0 + k, 2.0, 0.5, 1.0, 0.1]) for k in range(7)]
    saved = {"runs": {"ozone|damped|0": {"updates": updates}, "ozone|damped|1": {"updates": updates[:2]}}}
    first, last = regional.hyperparameters(saved, 3)  # split 1 has not finished its first pass: no row
    assert (first["after"], first["latitude lengthscale"]) == ("3 updates", 3.0)
    assert (last["after"], last["latitude lengthscale"], last["noise variance"]) == ("7 updates", 7.0, 0.1)
    assert "| ozone damped 0 | 7 updates | 7 | 2 | 0.5 | 1 | 0.1 |" in capsys.readouterr().out

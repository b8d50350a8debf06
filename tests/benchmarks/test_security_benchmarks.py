"""The security benchmarks run end to end on tiny settings and print what their docstrings promise."""

import json


def test_robust_benchmark_table_and_json(load_benchmark, tmp_path, capsys):
    out = tmp_path / "robust.json"
    assert (
        load_benchmark("robust").main(
            ["--seeds", "0", "--bad", "1", "--clients", "4", "--rounds", "2", "--out", str(out)]
        )
        == 0
    )
    table = capsys.readouterr().out
    assert "| 1 of 4 |" in table and "median" in table
    saved = json.loads(out.read_text())
    assert {r["config"] for r in saved["rows"] if r["bad"] == 1} == {"mean", "median", "trimmed_mean(0.3)"}
    assert saved["git_commit"] and saved["command"].startswith("python benchmarks/robust.py")


def test_secure_round_benchmark_sums_equal_plain(load_benchmark, tmp_path, capsys):
    out = tmp_path / "secure_round.json"
    # K = 10: a cohort that loses one client an exchange keeps a quorum in the consistency round (at K = 6 the
    # cohort fell to 4, whose quorum is all 4), and all pairs (degree 9) is above default_degree(10) = 8, so the
    # share-holder graph must follow the configured degree (each client refuses a sparser one)
    argv = ["--clients", "10", "--rounds", "2", "--inducing", "8", "--out", str(out)]
    assert load_benchmark("secure_round").main(argv) == 0
    assert "| 10 | sparse |" in capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert {r["config"] for r in rows} == {"plain", "sparse", "dropouts", "all-pairs"}
    pairs = next(r for r in rows if r["config"] == "all-pairs")
    assert pairs["degree"] == 9 and pairs["clients_last_round"] == 10
    # masking changes only the fixed-point round-off (drop-outs change the cohort, so that row differs)
    assert max(r["max_param_diff"] for r in rows if r["config"] != "dropouts") < 1e-6

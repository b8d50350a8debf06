"""``benchmarks/dp_distributed_utility.py`` runs end to end on tiny settings and saves what it prints."""

import json

import pytest


def test_distributed_vs_central_utility_benchmark(load_benchmark, tmp_path, capsys):
    out = tmp_path / "ddp.json"
    argv = ["--clients", "6", "--dimensions", "20", "--honest", "1", "0.5", "--releases", "2", "--trials", "2"]
    assert load_benchmark("dp_distributed_utility").main(argv + ["--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| 6 | 20 | 2 | central (PLD) |" in table and "| 6 | 20 | 2 | distributed, t = 3 |" in table
    saved = json.loads(out.read_text())
    assert saved["git_commit"] and saved["command"].startswith("python benchmarks/dp_distributed_utility.py")
    rows = {r["mechanism"]: r for r in saved["rows"]}
    assert set(rows) == {"central (PLD)", "central (zCDP)", "distributed, t = 6", "distributed, t = 3"}
    assert all(r["epsilon_spent"] <= 3.0 for r in rows.values())
    # the same zCDP accounting gives (almost) the same z; the rounding and τ cost < 0.1 %
    assert rows["distributed, t = 6"]["z"] == pytest.approx(rows["central (zCDP)"]["z"], rel=1e-3)
    # shares sized for t = K/2: twice the variance in the release
    ratio = rows["distributed, t = 3"]["mse_analytic"] / rows["distributed, t = 6"]["mse_analytic"]
    assert ratio == pytest.approx(2.0, rel=1e-3)
    assert rows["central (PLD)"]["mse_ratio_to_central_pld"] == 1.0
    assert rows["central (zCDP)"]["mse_ratio_to_central_pld"] > 1.0  # the PLD accountant is tighter

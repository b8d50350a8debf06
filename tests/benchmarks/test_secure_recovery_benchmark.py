"""``benchmarks/secure_recovery.py`` runs on a tiny cohort, checks its sums and writes the JSON it promises."""

import json


def test_secure_recovery_benchmark_rows_and_json(load_benchmark, tmp_path, capsys):
    module = load_benchmark("secure_recovery")
    out = tmp_path / "secure_recovery.json"
    module.main(["--clients", "20", "--codes", "8", "--repeats", "1", "--json", str(out)])
    assert "secagg 10% + late" in capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["git_commit"] and saved["command"].startswith("python benchmarks/secure_recovery.py --clients 20")
    rows = {r["config"]: r for r in saved["rows"]}
    assert set(rows) == {"setup", "plain", "masking", "secagg 0%", "secagg 10%", "secagg 10% + late"}
    assert rows["setup"]["degree"] == 10 and rows["setup"]["threshold"] == 6 and rows["setup"]["bytes_to_clients"] > 0
    assert rows["secagg 10%"]["dropped"] == 2 and rows["secagg 10% + late"]["recovered"] == 1
    assert rows["secagg 0%"]["bytes_from_clients"] >= 20 * 8 * 8  # the masked codes at least

"""``benchmarks/secure_aggregation.py``: runs on tiny cohorts, writes the JSON it promises, sums correctly."""

import json

import pytest


@pytest.fixture(scope="module")
def benchmark(load_benchmark):
    return load_benchmark("secure_aggregation")


def test_benchmark_times_every_configuration_and_saves_json(benchmark, tmp_path, capsys):
    out = tmp_path / "result.json"
    result = benchmark.main(["--clients", "3,12", "--inducing", "3", "--repeats", "2", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["rows"] == json.loads(json.dumps(result["rows"]))
    assert saved["command"].startswith("python ") and saved["git_commit"]
    rows = {(r["clients"], r["config"]): r for r in saved["rows"]}
    assert sorted(rows) == sorted((K, c) for K in (3, 12) for c in ("plain", "secure, all pairs", "secure, sparse"))
    assert rows[(12, "secure, all pairs")]["degree"] == 11
    assert rows[(12, "secure, sparse")]["degree"] == 8  # 2 ⌈log₂ 12⌉
    assert rows[(3, "secure, sparse")]["degree"] == 2  # all pairs for a small cohort
    for row in saved["rows"]:
        assert row["payload_floats"] == 6 + 9 + 3 + 1
        assert row["seconds"] > 0 and len(row["all_seconds"]) == 2
        assert row["max_abs_error"] < row["clients"] * 2.0**-32  # decoded sums equal the plain sums
    assert "× plain" in capsys.readouterr().out


def test_benchmark_refuses_a_cohort_of_one(benchmark):
    with pytest.raises(SystemExit):
        benchmark.main(["--clients", "1", "--json", ""])

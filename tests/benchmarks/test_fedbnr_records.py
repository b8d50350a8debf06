"""``benchmarks/fedbnr_records.py``: pooling the saved methods tables, reruns of some methods applied last."""

import json

import pytest


@pytest.fixture(scope="module")
def pool(load_benchmark):
    return load_benchmark("fedbnr_records").pool_method_records


def _write(path, records) -> str:
    path.write_text(json.dumps({"study": "methods", "records": records}))
    return str(path)


def _record(seed: int, **rmse: float) -> dict:
    return {"dataset": "diabetes", "K": 10, "seed": seed, "methods": {m: {"rmse": v} for m, v in rmse.items()}}


@pytest.mark.parametrize("rerun_first", [False, True])
def test_a_rerun_replaces_its_methods_whatever_the_file_order(pool, tmp_path, rerun_first: bool) -> None:
    full = _write(tmp_path / "full.json", [_record(0, fedbnr=1.0, local=2.0), _record(1, fedbnr=1.5, local=2.5)])
    rerun = _write(tmp_path / "rerun.json", [_record(1, local=3.0)])
    pooled = pool([rerun, full] if rerun_first else [full, rerun])
    assert pooled == {
        ("diabetes", 10): {
            0: {"fedbnr": {"rmse": 1.0}, "local": {"rmse": 2.0}},
            1: {"fedbnr": {"rmse": 1.5}, "local": {"rmse": 3.0}},
        }
    }
    assert list(pooled[("diabetes", 10)][1]) == ["fedbnr", "local"]  # the full record's method order


def test_records_with_the_same_methods_pool_in_file_order(pool, tmp_path) -> None:
    first = _write(tmp_path / "a.json", [_record(0, fedbnr=1.0), _record(1, fedbnr=1.1)])
    second = _write(tmp_path / "b.json", [_record(1, fedbnr=9.0), _record(2, fedbnr=1.2)])
    by_seed = pool([first, second])[("diabetes", 10)]
    assert {s: m["fedbnr"]["rmse"] for s, m in by_seed.items()} == {0: 1.0, 1: 9.0, 2: 1.2}

"""benchmarks/fsgp.py at tiny size: the paper's initial σ² = 0.1², the per-seed runs, the merge and the summary;
FGP's per-client records and their size-weighted score."""

import json

import numpy as np
import pytest

from gpflow_fed.federated import Plateau


def test_initial_noise_is_the_papers_sigma_squared(load_benchmark):
    fsgp = load_benchmark("fsgp")
    assert fsgp.INITIAL_NOISE_STD == 0.1 and np.isclose(fsgp.INITIAL_NOISE_VARIANCE, 0.01)  # σ = 0.1, not σ² = 0.1


def test_datasets_have_the_papers_sizes_and_imbalance(load_benchmark):
    fsgp = load_benchmark("fsgp")
    for name, (N, K, spread) in {"synthetic1": (500, 5, 59), "synthetic2": (4900, 10, 634)}.items():
        data = fsgp.make_dataset(name, seed=3)
        assert data.num_data == N and data.num_clients == K
        assert max(data.client_sizes) - min(data.client_sizes) == spread


def test_tiny_sweep_writes_runs_and_summary(load_benchmark, tmp_path, monkeypatch):
    fsgp = load_benchmark("fsgp")
    out = tmp_path / "sweep.json"
    argv = [
        "--datasets",
        "synthetic1",
        "--ms",
        "5",
        "--seeds",
        "0",
        "--rounds",
        "4",
        "--window",
        "2",
        "--out",
        str(out),
    ]
    assert fsgp.main(argv) == 0
    record = json.loads(out.read_text())
    methods = {r["method"] for r in record["runs"]}
    assert methods == {"fgp_rbcm", "fgp_poe", "fgp_local", "fgp_local_weighted", "gpr_exact", "fsgp", "sgpr"}
    assert record["settings"]["initial_noise_variance"] == fsgp.INITIAL_NOISE_VARIANCE
    pairs = {"fsgp_minus_fgp", "fsgp_minus_fgp_local", "fsgp_minus_fgp_local_weighted", "sgpr_minus_fgp",
             "fsgp_minus_sgpr"}  # fmt: skip
    assert {r["method"] for r in record["summary"]} == methods | pairs
    assert all(r["rounds"] <= 4 for r in record["runs"] if "rounds" in r)
    # a second run with another M merges into the file
    assert fsgp.main(["--no-fgp", *argv[:2], "--ms", "6", *argv[4:]]) == 0
    record = json.loads(out.read_text())
    assert {r.get("M") for r in record["runs"]} == {None, 5, 6}


def test_sparse_runs_use_the_same_stopping_rule(load_benchmark):
    fsgp = load_benchmark("fsgp")
    data = fsgp.make_dataset("synthetic1", seed=0)
    runs = fsgp.sparse_runs(data, 0.4, 5, 50, Plateau(window=2, tolerance=10.0), seed=0)
    assert runs[0]["rounds"] == 4 and runs[1]["steps"] == 12  # two windows of rounds / of P·window steps


def test_merge_joins_seeds_run_in_parallel_and_refuses_other_settings(load_benchmark, tmp_path):
    fsgp = load_benchmark("fsgp")
    tiny = ["--datasets", "synthetic1", "--ms", "5", "--rounds", "4", "--window", "2", "--no-fgp"]
    for seed in (0, 1):
        assert fsgp.main([*tiny, "--seeds", str(seed), "--out", str(tmp_path / f"s{seed}.json")]) == 0
    out = tmp_path / "sweep.json"
    parts = [str(tmp_path / "s0.json"), str(tmp_path / "s1.json")]
    assert fsgp.main(["--rounds", "4", "--window", "2", "--out", str(out), "--merge", *parts]) == 0
    record = json.loads(out.read_text())
    runs = sorted((r["seed"], r["method"]) for r in record["runs"])
    assert runs == [(0, "fsgp"), (0, "sgpr"), (1, "fsgp"), (1, "sgpr")]
    assert {r["command"].split("--seeds ")[1][0] for r in record["runs"]} == {"0", "1"}  # each run keeps its command
    assert {r["method"]: r["n"] for r in record["summary"]}["fsgp"] == 2
    with pytest.raises(SystemExit, match="s0.json: settings"):  # made with another stopping window
        fsgp.main(["--rounds", "4", "--window", "3", "--out", str(tmp_path / "new.json"), "--merge", parts[0]])
    with pytest.raises(SystemExit, match="sweep.json: settings"):  # the file merged into counts too
        fsgp.main(["--rounds", "5", "--window", "2", "--out", str(out), "--merge", parts[0]])


def test_every_client_holds_two_points_or_more(load_benchmark):
    """FSGP refuses a one-point client; without the floor, deliveries' seed 4 gave two of them."""
    fsgp = load_benchmark("fsgp")
    assert min(fsgp.make_dataset("deliveries", 4).client_sizes) == 2


def test_fgp_from_pairs_the_table_with_another_files_fgp_runs_and_changes_no_file(load_benchmark, tmp_path, capsys):
    fsgp = load_benchmark("fsgp")
    timing = {"c_mn_bytes": 400, "seconds_per_round": 0.1, "rounds": 4}  # what the cost table reads
    runs = [{"dataset": "synthetic1", "seed": s, "M": 5, "method": "fsgp", "rmse": 0.5 + s, **timing} for s in (0, 1)]
    out, other = tmp_path / "long.json", tmp_path / "sweep.json"
    out.write_text(json.dumps({"runs": runs}))
    fgp = [{"dataset": "synthetic1", "seed": s, "method": "fgp_rbcm", "rmse": 0.4 + s} for s in (0, 1)]
    fgp += [{"dataset": "synthetic1", "seed": s, "method": "fgp_local", "rmse": 0.7 + 2 * s} for s in (0, 1)]
    other.write_text(json.dumps({"runs": fgp + [dict(r, rmse=9.0) for r in runs]}))  # its FSGP runs are not used
    before = out.read_text()
    assert fsgp.main(["--summarize", "--datasets", "synthetic1", "--out", str(out), "--fgp-from", str(other)]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| synthetic1 | 5 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[3] == "1.0000 ± 0.7071" and cells[5] == "0.9000 ± 0.7071"  # fsgp from --out, fgp_rbcm from the other
    assert cells[3 + fsgp.COLUMNS.index("fsgp_minus_fgp")] == "0.1000 ± 0.0000"
    assert cells[3 + fsgp.COLUMNS.index("fsgp_minus_fgp_local")] == "-0.7000 ± 0.7071"  # the per-client predictor
    assert out.read_text() == before
    with pytest.raises(SystemExit):
        fsgp.main(["--summarize", "--out", str(out), "--fgp-from", str(tmp_path / "missing.json")])
    with pytest.raises(SystemExit):  # a file without FGP runs would silently pair with nothing
        fsgp.main(["--summarize", "--out", str(out), "--fgp-from", str(out)])


def _client(n_train: int, n_test: int, rmse: float, nlpd: float = 0.0) -> dict:
    return {"n_train": n_train, "n_test": n_test, "sse": n_test * rmse**2, "rmse": rmse, "nlpd": nlpd}


def test_size_weighted_rmse_weights_each_clients_squared_error_by_its_size(load_benchmark):
    fsgp = load_benchmark("fsgp")
    # a 2-point client with RMSE 1 and a 98-point one with RMSE 0.5, both on the same 4 test rows:
    # √((2·1² + 98·0.5²) / 100) = √0.265, where the unweighted mean of the RMSEs is 0.75
    clients = [_client(2, 4, 1.0, nlpd=3.0), _client(98, 4, 0.5, nlpd=1.0)]
    scores = fsgp.size_weighted_rmse(clients)
    assert scores["rmse"] == pytest.approx(np.sqrt(0.265), rel=1e-12)
    assert scores["nlpd"] == pytest.approx((2 * 3.0 + 98 * 1.0) / 100, rel=1e-12)
    # equal sizes: the root of the mean MSE (not the mean RMSE)
    equal = fsgp.size_weighted_rmse([_client(5, 4, 1.0), _client(5, 4, 0.5)])["rmse"]
    assert equal == pytest.approx(np.sqrt((1.0 + 0.25) / 2), rel=1e-12)


def test_size_weighted_rmse_is_the_pooled_rmse_when_test_rows_follow_client_sizes(load_benchmark):
    fsgp = load_benchmark("fsgp")
    rng = np.random.default_rng(0)
    sizes = [2, 7, 40, 151]
    residuals = [rng.normal(scale=rng.uniform(0.2, 2.0), size=3 * n) for n in sizes]  # client k answers 3·N_k rows
    clients = [{"n_train": n, "n_test": len(r), "sse": float(np.sum(r**2)), "rmse": float(np.sqrt(np.mean(r**2))),
                "nlpd": 0.0} for n, r in zip(sizes, residuals)]  # fmt: skip
    pooled = np.sqrt(np.mean(np.concatenate(residuals) ** 2))  # FSGP eq. 20 over every client's test rows
    assert fsgp.size_weighted_rmse(clients)["rmse"] == pytest.approx(pooled, rel=1e-12)
    with pytest.raises(ValueError, match="positive training size"):
        fsgp.size_weighted_rmse([_client(0, 4, 1.0)])
    with pytest.raises(ValueError, match="no clients"):
        fsgp.size_weighted_rmse([])


def test_methods_fgp_runs_fgp_alone_and_saves_its_per_client_records(load_benchmark, tmp_path):
    fsgp = load_benchmark("fsgp")
    out = tmp_path / "fgp.json"
    argv = ["--datasets", "synthetic1", "--seeds", "1", "--rounds", "2", "--window", "1", "--methods", "fgp"]
    assert fsgp.main([*argv, "--out", str(out)]) == 0
    runs = {r["method"]: r for r in json.loads(out.read_text())["runs"]}
    assert set(runs) == {"fgp_rbcm", "fgp_poe", "fgp_local", "fgp_local_weighted"}  # no exact GPR, FSGP or SGPR
    clients = runs["fgp_local"]["clients"]
    data = fsgp.make_dataset("synthetic1", seed=1)
    assert sorted(c["n_train"] for c in clients) == sorted(data.client_sizes)  # each expert's own rows
    assert all(c["n_test"] == 300 and c["sse"] == pytest.approx(300 * c["rmse"] ** 2) for c in clients)
    assert runs["fgp_local"]["rmse"] == pytest.approx(np.mean([c["rmse"] for c in clients]))
    assert runs["fgp_local_weighted"]["rmse"] == pytest.approx(fsgp.size_weighted_rmse(clients)["rmse"])
    assert runs["fgp_local_weighted"]["clients"] == clients and runs["fgp_rbcm"]["cpu_seconds"] > 0

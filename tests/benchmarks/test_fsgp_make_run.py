"""benchmarks/fsgp_make_run.py at the CLI's --quick size: every method of ``make run``'s table, paired by seed."""

import json

import pytest


@pytest.mark.usefixtures("nearest_rounding")  # exact federated SGPR against SGPR to 1e-4: rounding to nearest
def test_quick_run_saves_every_method_and_the_paired_gaps(load_benchmark, tmp_path):
    make_run = load_benchmark("fsgp_make_run")
    out = tmp_path / "make_run.json"
    assert make_run.main(["--quick", "--seeds", "0", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python benchmarks/fsgp_make_run.py --quick")
    rmse = {r["method"]: r["rmse"] for r in record["runs"]}
    assert set(rmse) == {"fsgp", "fsgp_exact", "sgpr", "sgpr_local", "fgp"}
    # exact federated SGPR is centralized SGPR (same steps), up to secure aggregation's fixed-point sums (rounded to
    # nearest here, 2⁻³² per client and entry; by default each party's Gaussian of 4 codes) carried through the steps
    assert abs(rmse["fsgp_exact"] - rmse["sgpr"]) < 1e-4
    gaps = {r["method"]: r for r in record["summary"] if "_minus_" in r["method"]}
    assert set(gaps) == {"fsgp_minus_fgp", "sgpr_minus_fgp", "fsgp_minus_sgpr"}
    assert abs(gaps["fsgp_minus_fgp"]["rmse_mean"] - (rmse["fsgp"] - rmse["fgp"])) < 1e-12
    assert gaps["fsgp_minus_fgp"]["negative"] == int(rmse["fsgp"] < rmse["fgp"])
    assert record["settings"]["quick"] and record["settings"]["clients"] == 3  # the CLI's --quick K

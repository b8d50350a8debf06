"""``benchmarks/pvi_diagnostics.py``, the script behind the "Regional clients" and "CPO floor" numbers in
BENCHMARKS.md and the PVI guide: each mode runs on a tiny split and prints what its docstring promises."""

import json

import numpy as np
import pytest

TINY = [
    "--dataset",
    "boston",
    "--clients",
    "3",
    "--max-points",
    "120",
    "--inducing",
    "4",
    "--rounds",
    "3",
    "--local-steps",
    "5",
    "--patience",
    "5",
    "--predict-samples",
    "2",
]


@pytest.fixture(scope="module")
def diagnostics(load_benchmark):
    return load_benchmark("pvi_diagnostics")


def _lines(capsys):
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


@pytest.mark.parametrize("method, every", [("dpo", 3), ("global", 1)])
def test_trace_prints_one_line_per_communication(diagnostics, capsys, tmp_path, method, every):
    out = tmp_path / "trace.json"
    assert diagnostics.main(["trace", "--method", method, *TINY, "--out", str(out)]) == 0
    lines = _lines(capsys)
    saved = json.loads(out.read_text())
    assert saved["trace"] == lines and saved["arguments"]["method"] == method
    assert saved["command"].startswith("python benchmarks/pvi_diagnostics.py trace") and "git_commit" in saved
    assert [entry["round"] for entry in lines] == [0, 1, 2]
    for entry in lines:
        assert sum(entry["inducing_per_client"]) == 4 and len(entry["inducing_per_client"]) == 3
        assert len(entry["beta"]) == 13 + 2 and entry["qZ_std"] > 0  # 13 lengthscales, σ_f², σ_n²
        assert ("test_ll" in entry) == ((entry["round"] + 1) % every == 0)
    assert np.isfinite(lines[-1]["test_ll"])


def test_cpo_factors_stay_below_the_floor_and_the_server_sum_is_exact(diagnostics, capsys):
    from gpflow_fed.inducing_variables import S_FLOOR

    assert diagnostics.main(["cpo-factors", *TINY]) == 0
    for entry in _lines(capsys):
        assert 0 < entry["smallest_factor_eigenvalue"] <= entry["largest_factor_precision"] <= 1 / S_FLOOR
        assert entry["server_sum_error"] < 1e-9


@pytest.mark.slow  # ~100 s on 2 cores: a diagnostic of a benchmark script, not a library capability
def test_first_client_reports_both_free_energies(diagnostics, capsys):
    assert diagnostics.main(["first-client", "--refit-steps", "3", *TINY]) == 0
    own, held = capsys.readouterr().out.strip().splitlines()
    assert own.startswith("first client, its own fit (5 Adam steps): q(Z) std")
    assert held.startswith("same client, q(Z) std held at 0.1, 3 Adam steps: free energy")

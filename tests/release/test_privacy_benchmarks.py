"""The scripts behind BENCHMARKS.md's weak-solution and paper sections run on tiny cases and report the truth."""

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_weak_benchmark_scale_row(tmp_path, capsys):
    bench = _load(ROOT / "privacy_aware.py", "privacy_aware_bench")
    out = tmp_path / "weak.json"
    bench.weak_main(["--no-oracle", "--scale", "200:3", "--json", str(out)])
    record = json.loads(out.read_text())
    (row,) = record["scale"]
    assert row["N"] == 200 and row["gamma"] == 3 and row["theorem2"]
    assert row["gap"] <= 1e-6 and row["oracle_margin"] >= -1e-9 and row["lower_bound"] <= row["trace"]
    assert record["commit"] and "| 200 | 3 |" in capsys.readouterr().out


def test_paper_examples_1_and_2():
    paper = _load(ROOT / "privacy_paper.py", "privacy_paper_bench")
    out: dict = {}
    paper.example_1(out)
    paper.example_2(out)
    assert out["example_1"]["trace"] == pytest.approx(3.545614, abs=1e-6)
    assert out["example_1"]["diagonal_sdp_trace"] == pytest.approx(20.0729, rel=1e-5)
    assert out["example_2"]["weak_trace_krylov"] == pytest.approx(5.32992, rel=1e-5)
    assert all(r["theorem2"] for r in out["example_2"]["strong"])
    by_c = {r["c"]: r["strong_trace"] for r in out["example_2"]["strong"]}
    assert by_c[0.45] == pytest.approx(5.5883, abs=1e-4) and by_c[0.5] == pytest.approx(6.1367, abs=1e-4)


def test_satellite_states_are_an_orbit():
    import numpy as np

    paper = _load(ROOT / "privacy_paper.py", "privacy_paper_bench2")
    states = paper.satellite_states(np.linspace(0.0, 1.0, 21))
    r, theta = states[:, 0], states[:, 2]
    assert np.all(np.abs(r - r[0]) < 1e-2 * r[0])  # near-circular at 340 km (J2 perturbs it slightly)
    assert theta[-1] == pytest.approx(2 * np.pi, rel=2e-2)  # one orbit per unit time


def test_peer_harness_against_a_stand_in_checkout(tmp_path, capsys, monkeypatch):
    """The harness imports ``experiments/example.py`` of the checkout it is given. A stand-in ``SDP`` with
    privacygp's call signature returns the feasible but non-optimal ``X = Σᵢ (ssᵢ)⁺`` (each term ⪰ ssᵢ and ⪰ 0):
    the harness must report it feasible and no better than ours."""
    experiments = tmp_path / "peer" / "experiments"
    experiments.mkdir(parents=True)
    (experiments / "example.py").write_text(
        textwrap.dedent("""
        import numpy as np

        class SDP:
            def solve_sdp(self, ss_matrices, is_diagonal=False):
                X = 0
                for ss in ss_matrices:
                    lam, vecs = np.linalg.eigh(ss)
                    X = X + (vecs * np.clip(lam, 0, None)) @ vecs.T
                return {"optimal_value": float(np.trace(X)), "optimal_solution": X}
    """)
    )
    harness = _load(ROOT / "peer" / "privacygp_weak.py", "privacygp_weak_harness")
    with pytest.raises(SystemExit, match="not a privacygp checkout"):
        harness.load_peer(tmp_path)
    out = tmp_path / "peer.json"
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "privacygp_weak.py",
            str(tmp_path / "peer"),
            "--sizes",
            "40",
            "--gamma",
            "2",
            "--json",
            str(out),
            "--peer-commit",
            "stand-in",
        ],
    )
    try:
        harness.main()
    finally:
        sys.modules.pop("example", None)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["peer_margin"] >= -1e-9 and row["ours_margin"] >= -1e-9
    assert row["peer_trace"] >= row["ours_trace"] * (1 - 1e-6)
    assert "| 40 | 2 |" in capsys.readouterr().out


def test_strong_peer_harness_our_side(tmp_path):
    """The strong harness's problem, our side and its comparison, without torch: a peer Σ equal to ours agrees
    to round-off and keeps the guarantee; Σ = 0 (no noise) breaks it; paths outside the repository are not
    recorded."""
    import numpy as np

    harness = _load(ROOT / "peer" / "privacygp_strong.py", "privacygp_strong_harness")
    with pytest.raises(SystemExit, match="not a privacygp checkout"):
        harness.main([str(tmp_path)])
    assert harness.parse_case("0.5:40,60") == (0.5, [40, 60])
    idx = harness.sensitive_indices(40, 4)
    assert idx.tolist() == [0, 13, 26, 39]
    sys.path.insert(0, str(ROOT / "peer"))
    try:
        from privacygp_weak import training_data
    finally:
        sys.path.pop(0)
    X, Y = training_data(40)
    assert np.all(np.diff(X[:, 0]) >= 0) and X.min() >= 0 and X.max() <= 10
    from gpflow_fed.release import ProportionalKernel, synthetic_noise_covariance

    import gpflow

    k = gpflow.kernels.SquaredExponential(lengthscales=0.5)
    Sigma = synthetic_noise_covariance(k, X, X[idx], ProportionalKernel(k, 0.5), noise_variance=0.01)
    lam, vecs = np.linalg.eigh(np.asarray(Sigma))
    root = vecs[:, lam > 1e-12] * np.sqrt(lam[lam > 1e-12])
    same = harness.compare(X, Y, idx, 0.5, 1, 1.0, root)
    assert same["rel_frobenius"] < 1e-10 and same["peer_trace"] == pytest.approx(same["ours_trace"], rel=1e-10)
    assert same["ours_margin"] >= -1e-8 and same["peer_margin"] >= -1e-8 and same["peer_rank"] == same["ours_rank"]
    none = harness.compare(X, Y, idx, 0.5, 1, 1.0, np.zeros((40, 1)))
    assert none["peer_margin"] < -0.1 and none["rel_frobenius"] == pytest.approx(1.0)
    rows = [dict(same, seed=0), dict(none, seed=1)]
    assert "| 40 | 0 |" in harness.table_row(rows[0])
    (case,) = harness.summarise(rows)
    assert case["seeds"] == 2 and case["min_peer_margin"] == none["peer_margin"]
    assert case["max_rel_frobenius"] == pytest.approx(1.0) and case["peer_rank"] == (1, same["peer_rank"])
    assert harness.summary_row(case).startswith("| 0.5 | 40 | 2 |")
    argv = ["/tmp/x", "--peer-python", "/tmp/py", "--quick"]
    assert harness.recorded_argv(argv) == ["PEER", "--peer-python", "PEER_PYTHON", "--quick"]

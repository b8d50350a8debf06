"""``benchmarks/pvi.py``'s protocol (``run_method``): the convergence curve is the final metric's quantity."""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset


@pytest.fixture(scope="module")
def benchmark(load_benchmark):
    return load_benchmark("pvi")


def _linear_task(D=2, K=3, n=15, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((K * n + 100, D))
    Y = (X @ rng.standard_normal(D) / np.sqrt(D))[:, None] + 0.1 * rng.standard_normal((len(X), 1))
    return FederatedDataset(
        [(X[i : K * n : K], Y[i : K * n : K]) for i in range(K)], test=(X[K * n :], Y[K * n :])
    ).standardized()[0]


def test_run_method_curve_is_the_mixture_log_likelihood_after_each_sweep(benchmark):
    data = _linear_task()
    out = benchmark.run_method("cpo", data, 6, 4, 0, local_steps=20, patience=5, num_predict_samples=5)
    assert out["every"] == 3 and len(out["curve"]) == 2
    assert out["curve"][-1] == out["ll"] and np.isfinite(out["curve"][0])
    glob = benchmark.run_method("global", data, 2, 4, 0, local_steps=20, patience=5, num_predict_samples=5)
    assert glob["every"] == 2 and glob["curve"] == [glob["ll"]]


def test_fixed_z_with_dpo_factors_and_split_initial_factors_run(benchmark):
    data = _linear_task()
    for method in ("fixed_dpo", "dpo"):
        out = benchmark.run_method(
            method, data, 3, 4, 0, local_steps=20, patience=5, num_predict_samples=5, initial_factors="split"
        )
        assert np.isfinite(out["ll"]) and out["curve"] == [out["ll"]]


def test_json_is_saved_with_provenance_and_read_back(benchmark, tmp_path, capsys):
    import json

    path = str(tmp_path / "pvi.json")
    argv = ["--datasets", "diabetes", "--methods", "fixed_dpo", "--splits", "1", "--clients", "3", "--inducing", "4"]
    argv += ["--rounds", "3", "--local-steps", "10", "--patience", "5", "--predict-samples", "3", "--max-points", "90"]
    assert benchmark.main(argv + ["--json", path, "--plot-prefix", str(tmp_path / "p")]) == 0
    saved = json.load(open(path))
    assert set(saved) >= {"git_commit", "command", "machine", "runs"} and list(saved["runs"]) == [
        "diabetes|fixed_dpo|0"
    ]
    capsys.readouterr()
    assert benchmark.main(["--from-json", path, "--methods", "fixed_dpo", "--plot-prefix", str(tmp_path / "p")]) == 0
    assert "| diabetes | fixed_dpo | 1 |" in capsys.readouterr().out


def test_max_pseudo_reaches_every_pvi_the_benchmark_builds(benchmark, tmp_path, monkeypatch):
    from gpflow_fed.federated.algorithms.pvi import methods as pvi_methods

    built = []

    def recording_make_pvi(*args, **options):
        alg = make_pvi(*args, **options)
        built.append(alg)
        return alg

    make_pvi = pvi_methods.make_pvi
    monkeypatch.setattr(pvi_methods, "make_pvi", recording_make_pvi)
    argv = ["--datasets", "ozone", "--methods", "dpo,global", "--splits", "1", "--clients", "4", "--inducing", "4"]
    argv += ["--rounds", "4", "--local-steps", "5", "--patience", "2", "--predict-samples", "2", "--max-points", "60"]
    assert (
        benchmark.main(argv + ["--global-rounds", "1", "--max-pseudo", "3", "--plot-prefix", str(tmp_path / "p")]) == 0
    )
    assert len(built) == 2 and all(alg.max_pseudo == 3 for alg in built)


def test_the_last_curve_column_is_labelled_with_the_last_communication(benchmark, capsys):
    curves = {("ozone", "dpo", 0): {"curve": [-0.9, -0.8, -0.7], "every": 32}, ("ozone", "global", 0): {"ll": -0.2}}
    benchmark.print_curves(curves, ["ozone"], ["dpo", "global"], rounds=70)
    assert "| run | 32 | 64 | 70 | global VI |" in capsys.readouterr().out


def test_the_plot_puts_the_last_value_at_the_last_communication(benchmark):
    assert benchmark.evaluation_points(32, 7, rounds=200) == [32, 64, 96, 128, 160, 192, 200]
    assert benchmark.evaluation_points(10, 3, rounds=30) == [10, 20, 30]


def test_comms_to_within_005_counts_the_last_evaluation_at_the_last_communication(benchmark, tmp_path, capsys):
    dpo = {"ll": -0.21, "rmse": 0.3, "seconds": 1.0, "every": 32}
    curves = {
        ("ozone", "dpo", 0): {**dpo, "curve": [-0.9, -0.3, -0.21]},  # within 0.05 only after all 70
        ("ozone", "dpo", 1): {**dpo, "curve": [-0.9, -0.22, -0.21]},
        ("ozone", "dpo", 2): {**dpo, "curve": [-0.9, -0.8, -0.7]},
        **{
            ("ozone", "global", s): {"ll": -0.2, "rmse": 0.3, "seconds": 1.0, "curve": [-0.2], "every": 20}
            for s in (0, 1, 2)
        },
    }
    benchmark.report(curves, ["ozone"], ["dpo", "global"], 70, str(tmp_path / "p"))
    assert "| 70,64,never |" in capsys.readouterr().out

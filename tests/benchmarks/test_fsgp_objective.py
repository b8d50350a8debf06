"""benchmarks/fsgp_objective.py at tiny size: the two bounds share w, each run raises its own bound, pairing."""

import json

import numpy as np
import pytest

import gpflow


@pytest.fixture
def objective(load_benchmark):
    return load_benchmark("fsgp_objective")


def test_client_sum_is_the_sum_of_the_clients_own_bounds_at_the_shared_w(objective):
    dataset = objective.make_dataset("synthetic1", seed=1)
    Z = dataset.pooled()[0][:4]
    pooled, clients = objective.shared_sgpr_models(dataset, Z)
    pooled.kernel.variance.assign(2.0)  # one assignment moves every model: w is shared
    pooled.likelihood.variance.assign(0.3)
    separate = [
        gpflow.models.SGPR(data, gpflow.kernels.SquaredExponential(2.0, [1.0]), Z, noise_variance=0.3).elbo()
        for data in dataset.clients
    ]
    np.testing.assert_allclose(objective.client_sum_bound(clients).numpy(), np.sum(separate), rtol=1e-12)
    assert abs(objective.client_sum_bound(clients).numpy() - pooled.elbo().numpy()) > 1.0  # cross terms dropped


def test_each_run_raises_its_own_bound_and_runs_pair_with_the_sweep(objective):
    dataset = objective.make_dataset("synthetic1", seed=0)
    Z = objective.initial_inducing_inputs(dataset.pooled()[0], 4, seed=0)  # the start objective_runs uses
    pooled, clients = objective.shared_sgpr_models(dataset, Z)
    start = {"pooled_lbfgs": pooled.elbo().numpy(), "client_sum_lbfgs": objective.client_sum_bound(clients).numpy()}
    rows = objective.objective_runs(dataset, M=4, seed=0, maxiter=30)
    by = {r["method"]: r for r in rows}
    assert set(by) == {"pooled_lbfgs", "client_sum_lbfgs"}
    N = dataset.num_data  # each run raised the bound it maximises (the optima themselves may be local)
    assert by["pooled_lbfgs"]["pooled_bound_per_point"] > start["pooled_lbfgs"] / N + 0.1
    assert by["client_sum_lbfgs"]["client_sum_bound_per_point"] > start["client_sum_lbfgs"] / N + 0.1
    assert all(r["iterations"] <= 30 and r["M"] == 4 for r in rows)
    runs = [dict(r, dataset="synthetic1", seed=s, rmse=r["rmse"] + s) for s in (0, 1) for r in rows]
    sweep = [{"dataset": "synthetic1", "seed": s, "M": 4, "method": m, "rmse": v + s}
             for s in (0, 1) for m, v in (("fsgp", 0.6), ("sgpr", 0.5))]  # fmt: skip
    summary = {r["column"]: r for r in objective.paired(runs, sweep)}
    assert summary["fsgp_minus_sgpr"]["mean"] == pytest.approx(0.1) and summary["fsgp_minus_sgpr"]["n"] == 2
    expected = 0.6 - by["client_sum_lbfgs"]["rmse"]
    assert summary["fsgp_minus_client_sum"]["mean"] == pytest.approx(expected)
    assert "| synthetic1 | 4 | 2 |" in objective.table(objective.paired(runs, sweep))
    assert objective.paired(runs, []) and "fsgp" not in {r["column"] for r in objective.paired(runs, [])}


def test_pooled_adam_repeats_the_sweeps_centralized_sgpr_and_client_sum_adam_raises_its_bound(objective):
    from gpflow_fed.baselines import centralized_sgpr

    dataset = objective.make_dataset("synthetic1", seed=0)
    rows = {r["method"]: r for r in objective.objective_runs(dataset, M=4, seed=0, maxiter=0, optimizer="adam")}
    assert set(rows) == {"pooled_adam", "client_sum_adam"}
    Z = objective.initial_inducing_inputs(dataset.pooled()[0], 4, seed=0)
    steps = objective.Plateau(objective.LOCAL_STEPS * objective.WINDOW, objective.TOLERANCE)
    sweep_sgpr = centralized_sgpr(  # fsgp.sparse_runs' centralized SGPR at its defaults
        dataset, objective._kernel(1), Z, objective.INITIAL_NOISE_VARIANCE,
        objective.LOCAL_STEPS * objective.ROUNDS, objective.LEARNING_RATE, steps,
    )  # fmt: skip
    assert rows["pooled_adam"]["iterations"] == sweep_sgpr.steps
    assert rows["pooled_adam"]["rmse"] == pytest.approx(sweep_sgpr.metrics["test_rmse"], rel=1e-9)
    _, clients = objective.shared_sgpr_models(dataset, Z)
    start = objective.client_sum_bound(clients).numpy() / dataset.num_data
    assert rows["client_sum_adam"]["client_sum_bound_per_point"] > start + 0.1


def test_fgp_optimum_raises_fgps_own_objective_and_pairs_at_every_M(objective):
    dataset = objective.make_dataset("synthetic1", seed=0)
    kernel = objective._kernel(dataset.input_dim)
    start = sum(  # FGP's objective at the sweep's start: every client's exact GP at θ = 1, σ² = 0.01
        gpflow.models.GPR(data, kernel, noise_variance=objective.INITIAL_NOISE_VARIANCE).log_marginal_likelihood()
        for data in dataset.clients
    ).numpy()
    row = objective.fgp_optimum_run(dataset, maxiter=30)
    assert row["method"] == objective.FGP_OPTIMUM and "M" not in row and row["iterations"] <= 30
    assert row["fgp_objective_per_point"] > start / dataset.num_data + 0.1
    assert row["noise_variance"] != pytest.approx(objective.INITIAL_NOISE_VARIANCE)
    runs = [dict(row, dataset="synthetic1", seed=s, rmse=0.5 + s) for s in (0, 1)]
    runs += [{"dataset": "synthetic1", "seed": s, "M": 4, "method": "client_sum_adam", "rmse": 0.7 + s} for s in (0, 1)]
    sweep = [{"dataset": "synthetic1", "seed": s, "method": "fgp_rbcm", "rmse": 0.6 + s} for s in (0, 1)]
    summary = {(r["M"], r["column"]): r for r in objective.paired(runs, sweep, optimizer="adam")}
    assert summary[None, "fgp_minus_fgp_optimum"]["mean"] == pytest.approx(0.1)
    assert summary[4, "client_sum_minus_fgp_optimum"]["mean"] == pytest.approx(0.2)  # FGP's run pairs at M = 4
    assert (None, "client_sum_minus_fgp_optimum") not in summary
    assert "| synthetic1 | – | 2 |" in objective.table(list(summary.values()))


def test_pair_with_must_name_saved_runs(objective, tmp_path):
    with pytest.raises(SystemExit):
        objective.main(["--quick", "--pair-with", str(tmp_path / "missing.json"), "--out", str(tmp_path / "o.json")])
    assert not (tmp_path / "o.json").exists()


def test_summarize_pairs_saved_runs_of_several_files_and_runs_nothing(objective, tmp_path, capsys):
    files = []
    for seed in (0, 1):
        runs = [{"dataset": "synthetic1", "seed": seed, "M": 4, "method": m, "rmse": v + seed}
                for m, v in (("client_sum_adam", 0.7), ("pooled_adam", 0.5))]  # fmt: skip
        files.append(tmp_path / f"s{seed}.json")
        files[-1].write_text(json.dumps({"runs": runs}))
    assert objective.main(["--summarize", "--optimizer", "adam", "--pair-with", *map(str, files)]) == 0
    assert "| synthetic1 | 4 | 2 | 1.2000 ± 0.7071 | 1.0000 ± 0.7071 | 0.2000 ± 0.0000 |" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s0.json", "s1.json"]
    with pytest.raises(SystemExit):  # nothing to summarize
        objective.main(["--summarize"])

"""PVI as the paper's methods (``pvi_methods.make_pvi``): a regression test for the "all-noise" start.

With σ_n² initialised at 1 (the whole variance of standardised targets, the spec's literal log β = 0) the first
DPO client update on a few points in many dimensions settles at σ_f² → 0 and m ≈ 0, and sequential PVI never
leaves it: on this task one sweep gives test log-lik −0.81 / RMSE 0.49, against −0.16 / 0.21 with the default
σ_n² = 0.1 (and Boston, K = 10: −1.26 against −0.37). The test fails for the old start.
"""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms.pvi.methods import INIT_NOISE, make_pvi


def _linear_task(D=8, K=5, n=40, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((K * n + 100, D))
    Y = (X @ rng.standard_normal(D) / np.sqrt(D))[:, None] + 0.1 * rng.standard_normal((len(X), 1))
    return FederatedDataset(
        [(X[i : K * n : K], Y[i : K * n : K]) for i in range(K)], test=(X[K * n :], Y[K * n :])
    ).standardized()[0]


def test_default_dpo_start_learns_the_signal_in_one_sweep():
    data = _linear_task()
    result = run(make_pvi("dpo", 8, data.num_clients, 10, 0, local_steps=300, num_predict_samples=10), data)
    Xt, Yt = data.test
    ll = float(np.mean(result.model.predict_log_density((Xt, Yt))))
    rmse = float(np.sqrt(np.mean((result.model.predict_y(Xt)[0].numpy() - Yt) ** 2)))
    assert INIT_NOISE < 1.0
    assert ll > -0.4 and rmse < 0.3, (ll, rmse)


def test_make_pvi_rejects_bad_input():
    with pytest.raises(ValueError, match="init_noise"):
        make_pvi("dpo", 2, 1, 3, 0, init_noise=0.0)
    with pytest.raises(ValueError, match="method"):
        make_pvi("svgp", 2, 1, 3, 0)


def test_cli_runs_pvi_on_a_real_subset(capsys, tmp_path):
    from gpflow_fed.cli import main

    argv = [
        "pvi",
        "--dataset",
        "boston",
        "--method",
        "cpo",
        "--clients",
        "3",
        "--rounds",
        "3",
        "--inducing",
        "4",
        "--local-steps",
        "5",
        "--max-points",
        "90",
        "--logdir",
        str(tmp_path),
        "--no-progress",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("FederatedDataset(name='boston'") and "| PVI (cpo) |" in out
    with pytest.raises(SystemExit) as exc:
        main(["pvi", "--max-points", "-1"])
    assert exc.value.code == 2 and "--max-points" in capsys.readouterr().err

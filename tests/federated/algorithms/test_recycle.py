"""Recycle: one message per client holding only the recyclable model; the server's ensemble equals one
fitted centrally from the same models; the ledger shows sizes independent of N_k."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset, toy_concatenation
from gpflow_fed.federated import LocalRuntime, RunOptions, run
from gpflow_fed.federated.algorithms import Recycle
from gpflow_fed.models import EnsembleSVGP, RecyclableModel


def _algorithm(**kw):
    kw = {"num_local_inducing": 6, "local_maxiter": 20, "maxiter": 20, **kw}
    return Recycle(gpflow.kernels.SquaredExponential(lengthscales=0.3), np.linspace(0, 5.5, 20)[:, None], **kw)


def test_recycle_messages_and_ensemble():
    data = toy_concatenation(num_tasks=3, num_per_task=60, seed=0)
    local_kernel = gpflow.kernels.SquaredExponential(variance=5.0, lengthscales=0.3)
    result = run(
        _algorithm(local_kernel=local_kernel),
        data,
        runtime=LocalRuntime(options=RunOptions(keep_payloads=True)),
        seed=0,
    )
    up = [e for e in result.ledger.entries if e.direction == "up"]
    assert len(up) == 3
    messages = [m for m in result.ledger.messages if m.sender != "server"]
    for m in messages:
        assert set(m.arrays) == {"q_mu", "q_sqrt", "Z", "spec"}
        assert m.arrays["q_sqrt"].shape == (6, 6)
        X_k, Y_k = data.clients[int(m.sender.split("_")[1])]
        assert not np.any(np.isin(Y_k, m.arrays["q_mu"]))  # no raw output is sent
    # the server's ensemble is the one fitted from the sent models alone
    models = [RecyclableModel.from_arrays(m.arrays) for m in messages]
    central = EnsembleSVGP(
        models, gpflow.kernels.SquaredExponential(lengthscales=0.3), np.linspace(0, 5.5, 20)[:, None]
    )
    central.fit(maxiter=20)
    np.testing.assert_allclose(result.model.elbo().numpy(), central.elbo().numpy(), rtol=1e-8)
    assert result.metrics["test_rmse"] < np.std(data.test[1])  # better than predicting the mean


def test_recycle_bad_input():
    with pytest.raises(ValueError, match="num_local_inducing"):
        _algorithm(num_local_inducing=0)
    with pytest.raises(ValueError, match="method"):
        _algorithm(method="sgd")
    with pytest.raises(ValueError, match="local_maxiter"):
        _algorithm(local_maxiter=-5)
    data = FederatedDataset([(np.zeros((3, 2)), np.zeros((3, 1)))])
    with pytest.raises(ValueError, match="D = 1 but the clients' inputs have D = 2"):
        run(_algorithm(), data)


@pytest.mark.slow
def test_cli_locals_then_ensemble_from_file(tmp_path, capsys):
    from gpflow_fed.cli import main

    path = tmp_path / "models.npz"
    assert (
        main(
            [
                "recycle",
                "locals",
                "--dataset",
                "toy",
                "--points",
                "40",
                "--inducing",
                "4",
                "--maxiter",
                "5",
                "--out",
                str(path),
                "--json",
                "--logdir",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "recycle",
                "ensemble",
                str(path),
                "--inducing",
                "8",
                "--maxiter",
                "5",
                "--out",
                str(tmp_path / "ens.npz"),
                "--evaluate",
                "toy",
                "--json",
                "--logdir",
                str(tmp_path),
            ]
        )
        == 0
    )
    import json

    decoder, text, lines = json.JSONDecoder(), capsys.readouterr().out, []
    while text.strip():
        value, end = decoder.raw_decode(text.strip())
        lines.append(value)
        text = text.strip()[end:]
    assert len(lines[0]["results"]) == 5 and lines[1]["settings"]["models"] == 5
    assert np.isfinite(lines[1]["results"][0]["test_nlpd"])
    (tmp_path / "bad.npz").write_bytes(b"junk")
    assert main(["recycle", "ensemble", str(tmp_path / "bad.npz")]) == 2

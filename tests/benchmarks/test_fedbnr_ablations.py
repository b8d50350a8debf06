"""``benchmarks/fedbnr_ablations.py``: FedBNR's ablations (kernel learning × last layer) against exact oracles."""

import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms import FedBNR
from gpflow_fed.kernels import URK
from gpflow_fed.models import BayesianLinearRegression

RNG = np.random.default_rng(5)
X = RNG.uniform(-3, 3, size=(60, 1))
Y = np.sin(2 * X) + 0.2 * RNG.normal(size=X.shape)
CLIENTS = [(X[:25], Y[:25]), (X[25:], Y[25:])]


@pytest.fixture(scope="module")
def fedbnr_ablation(load_benchmark):
    return load_benchmark("fedbnr_ablations").fedbnr_ablation


def test_ablations(fedbnr_ablation) -> None:
    dataset = FederatedDataset(CLIENTS)
    options = dict(kernel=URK(1, num_samples=10, seed=0), rounds=1, local_steps=3, learning_rate=0.05, compile=False)
    local_local = fedbnr_ablation("local+local", dataset, **options)
    assert len(local_local) == 2
    for model, data in zip(local_local, CLIENTS):
        oracle = BayesianLinearRegression(
            data, model.kernel, model.likelihood.variance.numpy(), model.prior_variance.numpy()
        )
        np.testing.assert_allclose(model.predict_f(X)[0].numpy(), oracle.predict_f(X)[0].numpy(), atol=1e-10)
    avg_global = fedbnr_ablation("avg+global", dataset, **options)
    fedbnr = run(FedBNR(**options), dataset).model
    np.testing.assert_allclose(avg_global[0].predict_f(X)[0].numpy(), fedbnr.predict_f(X)[0].numpy(), atol=1e-8)
    local_global = fedbnr_ablation("local+global", dataset, **options)
    for model in local_global:  # each client's kernel with the exact pooled last layer
        oracle = BayesianLinearRegression(
            dataset.pooled(), model.kernel, model.likelihood.variance.numpy(), model.prior_variance.numpy()
        )
        np.testing.assert_allclose(model.predict_f(X)[0].numpy(), oracle.predict_f(X)[0].numpy(), atol=1e-8)
    with pytest.raises(ValueError, match="unknown ablation"):
        fedbnr_ablation("global+global", dataset, **options)

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


def test_repeated_runs_trace_once_and_equal_separate_runs(load_benchmark) -> None:
    """The ablations' one-run-per-client loop shares one bound FedBNR: its compiled loop is traced once for every
    run, and each run's model is the one a fresh FedBNR gives, to the last bit."""
    ablations = load_benchmark("fedbnr_ablations")
    dataset = FederatedDataset(CLIENTS)
    options = dict(kernel=URK(1, num_samples=10, seed=0), rounds=2, local_steps=3, learning_rate=0.05)
    local = ablations.learn_kernels("local", dataset, **options)
    for model, client in zip(local, CLIENTS):
        alone = run(FedBNR(**options), FederatedDataset([client]), runtime=ablations.plain_runtime()).model
        np.testing.assert_array_equal(model.predict_f(X)[0].numpy(), alone.predict_f(X)[0].numpy())
    repeated = ablations.RepeatedFedBNR(**options)
    for client in CLIENTS:
        run(repeated, FederatedDataset([client]), runtime=ablations.plain_runtime())
    assert repeated._bound._worker.get().trainer.tracing_count() == 1
    assert repeated._bound is repeated.bind(None)  # every run used the first run's bound copy


def test_repeated_start_from_reaches_the_bound_copy(load_benchmark) -> None:
    """``local+global`` restarts one repeated FedBNR from each client's kernel: each run must start from the
    kernel given last, not from the first run's."""
    ablations = load_benchmark("fedbnr_ablations")
    dataset = FederatedDataset(CLIENTS)
    options = dict(kernel=URK(1, num_samples=10, seed=0), rounds=1, local_steps=5, learning_rate=0.1)
    kernels = ablations.learn_kernels("local", dataset, **options)
    models = ablations.last_layers("global", kernels, dataset)
    for model, trained in zip(models, kernels):
        np.testing.assert_array_equal(model.kernel.features(X).numpy(), trained.kernel.features(X).numpy())
    assert not np.array_equal(models[0].predict_f(X)[0].numpy(), models[1].predict_f(X)[0].numpy())

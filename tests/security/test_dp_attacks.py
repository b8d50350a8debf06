"""Attacks on differential privacy by someone who has the code, its defaults and the run seed."""

import hashlib

import gpflow
import numpy as np
import pytest

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Algorithm, DifferentialPrivacy, LocalRuntime, run
from gpflow_fed.federated import Protection
from gpflow_fed.federated.protection.reduction import ExchangeContext, Reducer
from gpflow_fed.federated.protocol.messages import Message


class ReleaseSum(Algorithm):
    """Releases the DP-noised sum of each client's Y once per round; the state keeps every release."""

    name = "release-sum"

    def initial_state(self, info):
        return {"releases": [], "asked": []}

    def aggregation(self, phase):
        return "sum"

    def broadcast(self, state, round, phase):
        return {}

    def client_update(self, client, broadcast):
        return self.reply(client, broadcast, {"sum_y": np.sum(client.data[1], axis=0)})

    def server_update(self, state, aggregate):
        return {
            "releases": state["releases"] + [np.array(aggregate["sum_y"])],
            "asked": state["asked"] + [aggregate.senders],
        }

    def result(self, state):
        return gpflow.models.GPR((np.zeros((1, 1)), np.zeros((1, 1))), gpflow.kernels.Constant())


def pair_seed(seed, context, a, b):
    """How noise was derived from the run seed before it came from the OS (the attacker knows the old code)."""
    text = "\x1f".join([str(int(seed)), *(str(c) for c in context), *sorted((a, b))])
    return np.random.SeedSequence([int(w) for w in np.frombuffer(hashlib.sha256(text.encode()).digest(), np.uint32)])


def _dataset(num_clients=6):
    rng = np.random.default_rng(0)
    return FederatedDataset([(rng.normal(size=(5, 1)), rng.normal(size=(5, 1))) for _ in range(num_clients)])


def _exact_sum(dataset, senders):
    return sum(np.sum(dataset.clients[int(c.split("_")[1])][1], axis=0) for c in senders)


def test_dp_noise_cannot_be_regenerated_from_the_run_seed():
    """The attacker knows the code, the default seed 0 (and tries 0…199) and how noise used to be derived."""
    dataset = _dataset()
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=100.0)
    result = run(ReleaseSum(1), dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp)), seed=0)
    released = result.state["releases"][0]
    true_sum = _exact_sum(dataset, result.state["asked"][0])
    std = dp.noise_std("sum")
    assert abs(released - true_sum).max() > 1e-6  # it is noised at all
    cohort = result.state["asked"][0]
    for seed in range(200):
        for guess_seed in (seed, pair_seed(seed, ("dp-noise", "train", 0, "train"), "server", "server")):
            guess = np.random.default_rng(guess_seed).normal(0.0, std, size=released.shape)
            assert np.abs(released - guess - true_sum).max() > 1e-6, f"noise regenerated from seed {seed}"
        context = ExchangeContext(bytes(16), "train", 0, "train", "sum", tuple(cohort))
        guess = Reducer(Protection(differential_privacy=dp)).noise_rng(context).normal(0.0, std, size=released.shape)
        assert np.abs(released - guess - true_sum).max() > 1e-6


def test_same_seed_gives_different_noise_and_different_dp_samples():
    dataset = _dataset(10)
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=100.0)
    runs = [
        # central DP (the server adds the noise): masking is not needed, and a sampled sum of a fixed broadcast is
        # answered for one cohort only under masking
        run(
            ReleaseSum(6, client_fraction=0.3),
            dataset,
            runtime=LocalRuntime(protection=Protection(differential_privacy=dp, secure_aggregation=False)),
            seed=0,
        )
        for _ in range(2)
    ]
    assert not np.allclose(runs[0].state["releases"][0], runs[1].state["releases"][0])
    assert runs[0].state["asked"] != runs[1].state["asked"]  # DP sampling is not a function of the seed
    unprotected = Protection(secure_aggregation=False)  # a sampled sum of a fixed broadcast: see test_core's PLAIN
    plain = [
        run(ReleaseSum(6, client_fraction=0.3), dataset, seed=0, protection=unprotected).state["asked"]
        for _ in range(2)
    ]
    assert plain[0] == plain[1]  # without DP the public seed still governs sampling


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_insecure_noise_seed_is_explicit_and_reproducible():
    dataset = _dataset()
    dp = DifferentialPrivacy(noise_multiplier=1.0, clip_norm=100.0, insecure_noise_seed=3)
    a, b = (
        run(ReleaseSum(1), dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp)), seed=0)
        for _ in range(2)
    )
    np.testing.assert_array_equal(a.state["releases"][0], b.state["releases"][0])
    assert DifferentialPrivacy(1.0, 1.0).insecure_noise_seed is None
    with pytest.raises(ValueError, match="insecure_noise_seed"):
        DifferentialPrivacy(1.0, 1.0, insecure_noise_seed=-1)


def test_replayed_message_is_refused():
    aggregator = Reducer(Protection(differential_privacy=DifferentialPrivacy(1.0, 1.0)))
    context = ExchangeContext(bytes(16), "train", 3, "p", "sum", ("client_0", "client_1"))
    fresh = Message("client_0", 3, "p", {"a": np.ones(2)})
    replayed = Message("client_1", 2, "p", {"a": np.ones(2)})
    with pytest.raises(ValueError, match="replayed or stale"):
        aggregator.reduce([fresh, replayed], context)
    with pytest.raises(ValueError, match="replayed or stale"):
        Reducer(Protection()).reduce([fresh, replayed], context)


@pytest.mark.parametrize("protocol", ["statistics", "two_step"])
def test_noised_scatter_is_post_processed_not_blamed_on_a_client(protocol):
    """FedBNR phase 2 under DP: the noised ΦᵀΦ may be indefinite; the server projects it (post-processing)."""
    from gpflow_fed.federated.algorithms import FedBNR
    from gpflow_fed.kernels import URK

    rng = np.random.default_rng(0)
    X = rng.uniform(-3, 3, (60, 1))
    dataset = FederatedDataset([(X[i::3], np.sin(X[i::3])) for i in range(3)], test=(X, np.sin(X)))
    dp = DifferentialPrivacy(noise_multiplier=5.0, clip_norm=1.0, phases=("scatter",), insecure_noise_seed=1)
    algorithm = FedBNR(URK(1, num_samples=12, seed=0), rounds=0, protocol=protocol)
    result = run(algorithm, dataset, runtime=LocalRuntime(protection=Protection(differential_privacy=dp)), seed=0)
    phi = result.state.statistics["phi_t_phi"]
    assert np.linalg.eigvalsh(phi).min() >= -1e-10 * max(1.0, np.abs(phi).max())
    mean, var = result.model.predict_f(X[:5])
    assert np.all(np.isfinite(mean.numpy())) and np.all(var.numpy() > 0)

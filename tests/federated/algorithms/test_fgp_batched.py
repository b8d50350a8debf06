"""FGP's batched client updates (``LocalRuntime`` trains a cohort in one call) equal the per-client ones.

Twenty clients of unequal sizes (4 … 27 points: seven size buckets, 13 clients padded), D = 2, ARD lengthscales.
"""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import ClientPolicy, FaultPolicy, LocalRuntime, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FGP
from gpflow_fed.federated.algorithms.fgp_batched import BatchedGPRWorker, masked_gpr_log_marginal_likelihood
from gpflow_fed.federated.protocol.algorithm import FederationInfo
from gpflow_fed.federated.protocol.client import Client
from gpflow_fed.federated.protocol.messages import Message
from gpflow_fed.training.adam import CompiledAdam
from gpflow_fed.training.batched import size_buckets
from gpflow_fed.training.stopping import Plateau

SIZES = (4, 27, 5, 9, 12, 6, 20, 15, 8, 11, 25, 7, 13, 18, 10, 16, 22, 14, 19, 9)
PLAIN = Protection(secure_aggregation=False)
#: every cohort batched, however small (the default asks cohorts under 32 clients one by one)
BATCHED = dict(batched=True, min_batch=1)
#: never reached in these runs: it only makes every reply carry its log likelihood, compared between the paths
NEVER = Plateau(window=100, tolerance=1e-12)
#: a whole run, batched against per client. One local step agrees to ≤ 1e-12 relative (the test below; measured
#: ≤ 1e-13 there). A run adds the round-off of each of its R·P = 9 steps: FedAvg's weighted mean does not amplify it,
#: and Adam's step m̂ / (√v̂ + ε) changes relatively by at most about the gradient's relative change, so a value's
#: relative difference after the run is at most ≈ 9 × 1e-12 (measured 3e-16); 1e-10 leaves a margin of ten over
#: that bound. 1e-12 absolute for values near zero (a step moves a value by at most lr = 0.1).
RUN_RTOL, RUN_ATOL = 1e-10, 1e-12
#: secure aggregation decodes the weighted sum on a fixed-point grid of 2⁻³² ≈ 2.3e-10 (``SecureAggregation``'s
#: default f = 32): a round-off difference between the paths can move one client's code by one step, so the two runs'
#: means may differ by a few grid steps over ΣN_k, carried on by the later rounds; 1e-9 absolute is a few such steps
#: (measured: equal)
SECURE_ATOL = 1e-9


def _clients(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(SIZES):
        X = rng.uniform(-3, 3, (n, 2))
        out.append((X, (1 + 0.1 * k) * np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(n, 1))))
    return out


def _dataset():
    clients = _clients()
    return FederatedDataset(clients, test=clients[-1])


def _kernel():
    return gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2])


def _fgp(**kwargs):
    args = dict(rounds=3, local_steps=3, learning_rate=0.1)
    args.update(kwargs)
    return FGP(_kernel(), 0.1, **args)


def test_buckets_of_the_test_cohort_pad_most_clients():
    buckets = size_buckets(SIZES)
    assert [b.length for b in buckets] == [5, 7, 10, 13, 16, 22, 27]
    assert sum(b.length != SIZES[k] for b in buckets for k in b.members) == 13  # clients with padded rows


def test_masked_likelihood_and_its_gradient_ignore_padded_rows_exactly():
    """Padded rows (mask 0) after the real ones change nothing: the masked likelihood and its gradient are GPR's on
    the real rows, whatever the padded rows hold (rows that would change every term if they counted)."""
    X, Y = _clients()[3]
    model = gpflow.models.GPR((X, Y), _kernel(), noise_variance=0.1)
    padded_X = np.concatenate([X, np.full((5, 2), 2.5)])
    padded_Y = np.concatenate([Y, np.full((5, 1), 30.0)])
    mask = np.array([1.0] * len(X) + [0.0] * 5)
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        ours = masked_gpr_log_marginal_likelihood(model, padded_X, padded_Y, mask)
    with tf.GradientTape() as ref_tape:
        ref = model.log_marginal_likelihood()
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-13)
    for a, b in zip(tape.gradient(ours, variables), ref_tape.gradient(ref, variables)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    # without the mask the padded rows would count: the test's padding is not harmless by accident
    unmasked = masked_gpr_log_marginal_likelihood(model, padded_X, padded_Y, np.ones(len(padded_X)))
    assert abs(unmasked.numpy() - ref.numpy()) > 1.0


def _set_up(algorithm):
    """The algorithm bound to the test's clients, as a run binds it: its initial state and the clients."""
    data = _clients()
    ids = tuple(f"client_{k}" for k in range(len(data)))
    info = FederationInfo(ids, {c: len(d[1]) for c, d in zip(ids, data)}, 2, 1, seed=0)
    state = algorithm.initial_state(info)
    clients = [Client(c, d, seed=k) for k, (c, d) in enumerate(zip(ids, data))]
    for client in clients:
        algorithm.setup_client(client, info)
    return state, clients


def test_one_local_step_batched_equals_per_client_to_1e_12():
    """One Adam step of every client (each at its own step count: client 2 takes a second step after a first), its
    reply, log likelihood and new Adam state: batched over the twenty clients (seven buckets; then chunks of one
    client) = per client, 1e-12 relative; one trace serves every bucket, length and chunk."""
    algorithm = _fgp(local_steps=1, stopping=NEVER)
    state, clients = _set_up(algorithm)
    broadcast = Message("server", 0, "train", algorithm.broadcast(state, 0, "train"))
    algorithm.client_update(clients[2], broadcast)  # client 2 at t = 1
    before = [c.state["adam"] for c in clients]
    expected = [algorithm.client_update(c, broadcast) for c in clients]
    after = [c.state["adam"] for c in clients]
    assert algorithm.batched("train") and not algorithm.batched("experts")
    for budget in (2**30, 1):
        for client, adam in zip(clients, before):
            client.state["adam"] = adam
        got = algorithm.client_updates(clients, broadcast, budget)
        for client, ours, ref, adam in zip(clients, got, expected, after):
            assert isinstance(ours, Message) and ours.sender == ref.sender and ours.weight == ref.weight
            assert list(ours.arrays) == list(ref.arrays)  # wire order
            for key in ref.arrays:
                np.testing.assert_allclose(ours.arrays[key], ref.arrays[key], rtol=1e-12, atol=0, err_msg=key)
            assert ours.metrics["log_likelihood"] == pytest.approx(ref.metrics["log_likelihood"], rel=1e-12)
            new = client.state["adam"]
            assert int(new.iterations) == int(adam.iterations)
            for m1, m2 in zip(new.moments, adam.moments):
                np.testing.assert_allclose(m1, m2, rtol=1e-12, atol=0)
    assert [int(c.state["adam"].iterations) for c in clients] == [2 if k == 2 else 1 for k in range(len(clients))]
    assert algorithm.tracing_counts() == {"train": 1, "batched": 1}


def test_bad_broadcasts_and_adam_states_fail_as_per_client():
    algorithm = _fgp(local_steps=1)
    state, clients = _set_up(algorithm)
    extra = Message("server", 0, "train", {**algorithm.broadcast(state, 0, "train"), "spy": np.zeros(3)})
    assert all("other than the shared ones" in str(e) for e in algorithm.client_updates(clients, extra, 2**30))
    params = dict(algorithm.broadcast(state, 0, "train"))
    params["kernel.lengthscales"] = np.zeros(3)
    wrong = Message("server", 0, "train", params)
    assert all("kernel.lengthscales" in str(e) for e in algorithm.client_updates(clients, wrong, 2**30))
    clients[4].state["adam"] = "not a state"
    good = Message("server", 0, "train", algorithm.broadcast(state, 0, "train"))
    out = algorithm.client_updates(clients, good, 2**30)
    assert isinstance(out[4], TypeError) and sum(isinstance(o, Message) for o in out) == len(clients) - 1


def _both(algorithm_kwargs, runtime=(), **run_kwargs):
    """The same run batched and per client: ``(batched, per client)``."""
    results = {}
    for batched in (True, False):
        local = LocalRuntime(**(BATCHED if batched else dict(batched=False)), **dict(runtime))
        results[batched] = run(_fgp(**algorithm_kwargs), _dataset(), runtime=local, seed=2, **run_kwargs)
    return results[True], results[False]


def test_a_whole_run_batched_equals_per_client():
    """Three rounds of 12 sampled clients (so clients at different Adam steps share a batch) and the final experts:
    parameters, the rounds' log likelihoods and the committee's predictions to RUN_RTOL (module constant: the
    tolerance and why); the ledger is the same, entry by entry. The batched training served every round; the
    per-client run never traced it."""
    batched, single = _both(dict(client_fraction=0.6, stopping=NEVER), protection=PLAIN)
    for key, value in single.state.params.items():
        np.testing.assert_allclose(batched.state.params[key], value, rtol=RUN_RTOL, atol=RUN_ATOL, err_msg=key)
    likelihoods = [h["local_log_likelihood"] for h in batched.history]
    assert likelihoods == pytest.approx([h["local_log_likelihood"] for h in single.history], rel=RUN_RTOL)
    Xs = np.random.default_rng(3).uniform(-3, 3, (5, 2))
    for a, b in zip(batched.model.predict_f(Xs), single.model.predict_f(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RUN_RTOL, atol=RUN_ATOL)
    assert batched.ledger.entries == single.ledger.entries
    assert [h["clients"] for h in batched.history] == [12, 12, 12]
    assert batched.algorithm.tracing_counts() == {"train": 0, "batched": 1}
    assert single.algorithm.tracing_counts() == {"train": 1, "batched": 0}


def test_secure_aggregation_still_works_with_batching():
    """Secure aggregation (LocalRuntime's default protection) with batched updates: the same masked run as per client
    (two rounds and the final experts) to SECURE_ATOL, every train reply masked, the same ledger."""
    batched, single = _both(dict(rounds=2), runtime=dict(client_policy=ClientPolicy()))
    for key, value in single.state.params.items():
        np.testing.assert_allclose(batched.state.params[key], value, rtol=RUN_RTOL, atol=SECURE_ATOL, err_msg=key)
    assert batched.ledger.entries == single.ledger.entries
    phases = {e.phase for e in batched.ledger.entries}
    assert {"train/secagg/masked_input", "train/secagg/unmask"} <= phases
    assert not [e for e in batched.ledger.entries if e.phase == "train" and e.direction == "up"]
    assert batched.algorithm.tracing_counts()["batched"] == 1


class KeepClients(FGP):
    """FGP that keeps its clients, to read their Adam states after the run (its update is FGP's: batched)."""

    def setup_client(self, client, info):
        super().setup_client(client, info)
        self.clients = {**getattr(self, "clients", {}), client.id: client}


def test_a_failed_update_in_a_batch_fails_only_its_client(monkeypatch):
    """One client's non-finite hyperparameters in the batch, and on its own too (client 1, the only one of 27
    points): that client alone is excluded, its Adam state untouched; the others answer and keep their new states."""
    original, original_fit = BatchedGPRWorker.train, CompiledAdam.fit

    def poisoned(self, data, values, states, budget):
        out = original(self, data, values, states, budget)
        for k, (X, _) in enumerate(data):
            if len(X) == SIZES[1]:
                out[k] = ([np.full_like(v, np.nan) for v in out[k][0]], out[k][1], out[k][2])
        return out

    def poisoned_fit(self, num_steps, state, X, Y):
        out = original_fit(self, num_steps, state, X, Y)
        if X.shape[0] == SIZES[1]:
            for variable in self.variables:
                variable.assign(tf.fill(variable.shape, tf.constant(np.nan, variable.dtype)))
        return out

    monkeypatch.setattr(BatchedGPRWorker, "train", poisoned)
    monkeypatch.setattr(CompiledAdam, "fit", poisoned_fit)
    algorithm = KeepClients(_kernel(), 0.1, rounds=1)
    runtime = LocalRuntime(**BATCHED, protection=PLAIN, options=RunOptions(faults=FaultPolicy(on_error="exclude")))
    result = run(algorithm, _dataset(), runtime=runtime, seed=2)
    assert set(result.history[0]["excluded"]) == {"client_1"}
    assert "non-finite after 3 steps" in result.history[0]["excluded"]["client_1"]
    assert result.history[0]["clients"] == len(SIZES) - 1
    steps = {cid: int(c.state["adam"].iterations) for cid, c in result.algorithm.clients.items()}
    assert steps == {f"client_{k}": 0 if k == 1 else 3 for k in range(len(SIZES))}


def test_a_non_finite_batched_result_is_recomputed_per_client():
    """A kernel variance above log(float64 max) ≈ 709.8 (unconstrained): the batched gradient is NaN there
    (``tf.vectorized_map`` drops TensorFlow Probability's custom softplus gradient, ``FGP.client_updates``), but the
    per-client step is finite; each such client is recomputed on its own, so every reply is the per-client one."""
    algorithm = _fgp(local_steps=1)
    state, clients = _set_up(algorithm)
    params = dict(algorithm.broadcast(state, 0, "train"))
    params["kernel.variance"] = np.array(720.0)
    broadcast = Message("server", 0, "train", params)
    worker = algorithm._worker.get()
    raw = worker.batched.train([c.data for c in clients], np.concatenate([np.ravel(params[k]) for k in worker.keys]),
                               [c.state["adam"] for c in clients], 2**30)  # fmt: skip
    assert not any(np.all(np.isfinite(np.concatenate([np.ravel(v) for v in r[0]]))) for r in raw)  # the batch fails
    before = [c.state["adam"] for c in clients]
    expected = [algorithm.client_update(c, broadcast) for c in clients]
    for client, adam in zip(clients, before):
        client.state["adam"] = adam
    got = algorithm.client_updates(clients, broadcast, 2**30)
    for ours, ref in zip(got, expected):
        assert isinstance(ours, Message) and np.isfinite(ours.arrays["kernel.variance"])
        for key in ref.arrays:
            np.testing.assert_array_equal(ours.arrays[key], ref.arrays[key], err_msg=key)


def test_per_client_path_stays_available_and_a_replaced_update_is_asked_per_client():
    """``LocalRuntime(batched=False)``, a cohort under ``min_batch`` and a subclass with its own update: per client."""
    for runtime in (LocalRuntime(batched=False, protection=PLAIN), LocalRuntime(min_batch=21, protection=PLAIN)):
        result = run(_fgp(rounds=1), _dataset(), runtime=runtime)
        assert result.algorithm.tracing_counts() == {"train": 1, "batched": 0}

    class Replaced(FGP):
        def client_update(self, client, broadcast):
            return super().client_update(client, broadcast)

    result = run(Replaced(_kernel(), 0.1, rounds=1), _dataset(), runtime=LocalRuntime(**BATCHED, protection=PLAIN))
    assert not result.algorithm.batched("train")
    assert result.algorithm.tracing_counts() == {"train": 1, "batched": 0}


def test_memory_rule_chunks_a_bucket_by_the_padded_length_squared():
    """``bytes_per_client`` grows as L² (the covariance and its Cholesky factor); a budget of two clients' working
    sets at L = 27 splits the bucket of L = 22 (four clients) in two chunks, never refusing a client."""
    algorithm = _fgp()
    _set_up(algorithm)
    worker = algorithm._worker.get().batched
    # |w| = 4 (two lengthscales, the kernel variance, σ²), |m| + |v| = 8, D + P = 3
    assert worker.bytes_per_client(100) * (10**2 + 30 + 12) == worker.bytes_per_client(10) * (100**2 + 300 + 12)
    budget = 2 * worker.bytes_per_client(27)
    chunks = worker.chunks(SIZES, budget)
    assert all(len(c.members) * worker.bytes_per_client(c.length) <= budget for c in chunks)
    assert [len(c.members) for c in chunks if c.length == 22] == [2, 2]  # 2 × 22² < 2 × 27² < 3 × 22²
    assert sorted(k for c in chunks for k in c.members) == list(range(len(SIZES)))

"""FSGP's batched client updates (``LocalRuntime`` computes a cohort in one call) equal the per-client ones.

Seven clients of unequal sizes (3 … 20 points, so three size buckets with padding), M = 4, D = 2.
"""

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import ClientPolicy, FaultPolicy, LocalRuntime, Protection, RunOptions, run
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.algorithms.fsgp.batched import BatchedSGPRWorker, masked_sgpr_elbo, masked_sgpr_statistics
from gpflow_fed.federated.algorithms.fsgp.statistics import sgpr_statistics
from gpflow_fed.federated.algorithms.fsgp.worker import SGPRClientWorker
from gpflow_fed.training.batched import size_buckets

SIZES = (3, 4, 5, 7, 9, 12, 20)
PATHS = ["inducing_variable.Z", "kernel.lengthscales", "kernel.variance", "likelihood.variance"]
PLAIN = Protection(secure_aggregation=False)
#: every cohort batched, however small (the default asks cohorts under 32 clients one by one)
BATCHED = dict(batched=True, min_batch=1)
#: a whole run, batched against per client: one local step agrees to ≤ 1e-12 relative (measured ≤ 2e-13, below); a
#: run adds at most the round-off of each of its R·P = 9 steps (FedAvg's weighted means and exact mode's sums do not
#: amplify it, and Adam's normalised step m / (√v + ε) changes by at most the gradient's relative change), so 1e-10
#: relative leaves a margin of ten over 9 × 1e-12; 1e-12 absolute for values near zero (a step moves a value by at
#: most lr = 0.1, so its round-off is below 1e-13)
RUN_RTOL, RUN_ATOL = 1e-10, 1e-12


def _clients(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(SIZES):
        X = rng.uniform(-3, 3, (n, 2))
        out.append((X, (1 + k) * np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(n, 1))))
    return out


def _dataset():
    clients = _clients()
    return FederatedDataset(clients, test=clients[-1])


def _Z():
    return np.random.default_rng(5).uniform(-3, 3, (4, 2))


def _fsgp(**kwargs):
    args = dict(rounds=3, local_steps=3, learning_rate=0.1)
    args.update(kwargs)
    return FSGP(gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2]), _Z(), 0.1, **args)


def _worker(local_steps=1, whiten=False):
    iv = gpflow.inducing_variables.InducingPoints(_Z())
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2])
    return SGPRClientWorker(kernel, iv, 0.1, 1, PATHS, 0.1, local_steps, whiten)


def test_buckets_of_the_test_cohort_pad_some_clients():
    assert [b.members for b in size_buckets(SIZES)] == [(0,), (1, 2), (3,), (4,), (5,), (6,)]
    assert [b.length for b in size_buckets(SIZES)] == [3, 5, 7, 9, 12, 20]  # client 1 (4 points) has a padded row


def test_masked_bound_and_statistics_ignore_padded_rows_exactly():
    """A padded row (its mask 0) contributes nothing: the bound and statistics of the padded data are SGPR's of the
    real rows, whatever the padded rows hold."""
    X, Y = _clients()[3]
    model = gpflow.models.SGPR(
        (X, Y), gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2]), _Z(), noise_variance=0.1
    )
    padded_X = np.concatenate([X, np.full((4, 2), 2.5)])  # rows that would change every term if they counted
    padded_Y = np.concatenate([Y, np.full((4, 1), 30.0)])
    mask = np.array([1.0] * len(X) + [0.0] * 4)
    np.testing.assert_allclose(masked_sgpr_elbo(model, padded_X, padded_Y, mask), model.elbo(), rtol=1e-13)
    for whiten in (False, True):
        ours = masked_sgpr_statistics(model.kernel, model.inducing_variable, padded_X, padded_Y, mask, whiten)
        ref = sgpr_statistics(model.kernel, model.inducing_variable, tf.constant(X), tf.constant(Y), whiten)
        for a, b in zip(ours, ref):
            np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_one_local_step_and_the_statistics_batched_equal_per_client_to_1e_12():
    """One Adam step of every client (each at its own step count: a second step after a first), its Adam state and
    bound; the (whitened, as exact mode sends them) statistics and exact mode's products: batched over the seven
    clients = per client, 1e-12 relative. (The unwhitened statistics of FedAvg's final phase: the whole-run test.)"""
    worker = _worker(local_steps=1, whiten=True)
    clients = _clients()
    values = [v.numpy() for v in worker.shared]
    states = [worker.initial_adam_state() for _ in clients]
    states[2] = worker.train(tf.constant(clients[2][0]), tf.constant(clients[2][1]), values, states[2])[1]  # t = 1
    expected = [worker.train(tf.constant(X), tf.constant(Y), values, s) for (X, Y), s in zip(clients, states)]
    # a budget of one client per chunk for the second call: chunks give the same answers
    for budget in (2**30, 1):
        got = worker.batched.train(clients, worker.pack(values), states, budget)
        for (v1, a1, b1), (v2, a2, b2) in zip(expected, got):
            for x, y in zip(v1 + list(a1.moments), v2 + list(a2.moments)):
                np.testing.assert_allclose(y, x, rtol=1e-12, atol=0)
            assert int(a1.iterations) == int(a2.iterations)
            assert b2 == pytest.approx(b1, rel=1e-12)
    assert [int(s.iterations) for _, s, _ in got] == [2 if k == 2 else 1 for k in range(len(clients))]

    stats = [worker.statistics(tf.constant(X), tf.constant(Y), values) for X, Y in clients]
    adjoints = {"kuf_kfu": np.eye(4) + 0.1, "kuf_y": np.ones((4, 1)), "trace_kff": np.array(-0.5)}
    products = [worker.vjp(tf.constant(X), tf.constant(Y), values, adjoints) for X, Y in clients]
    for ours, ref in zip(worker.batched.statistics(clients, worker.pack(values), 2**30), stats):
        for name in ref:  # norm-wise: an entry near zero carries the round-off of the larger ones
            assert np.linalg.norm(ours[name] - ref[name]) <= 1e-12 * np.linalg.norm(ref[name]), name
    for ours, ref in zip(worker.batched.vjp(clients, worker.pack(values), adjoints, 2**30), products):
        for a, b in zip(ours, ref):
            assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b)
    # one trace for three buckets of different lengths, and for chunks of one client
    assert worker.batched.tracing_counts() == {"train": 1, "statistics": 1, "gradient": 1}


def _both(algorithm_kwargs, runtime=(), **run_kwargs):
    """The same run batched and per client: ``(batched, per client)``."""
    results = {}
    for batched in (True, False):
        local = LocalRuntime(**(BATCHED if batched else dict(batched=False)), **dict(runtime))
        results[batched] = run(_fsgp(**algorithm_kwargs), _dataset(), runtime=local, seed=2, **run_kwargs)
    return results[True], results[False]


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_a_whole_run_batched_equals_per_client(mode):
    """Three rounds (sampled clients in fedavg, so clients at different Adam steps share a batch) and the final
    statistics: parameters, bounds and the returned model to RUN_RTOL (module constant: the tolerance and why); the
    ledger is the same, entry by entry, so its totals are equal. Each client's own policy applies to its slice of the
    batch: with the small-cohort rule on, clients 0 and 1 (3 and 4 points ≤ M = 4) refuse the plain statistics on
    both paths."""
    fraction = 0.6 if mode == "fedavg" else 1.0
    policy = ClientPolicy(secure_aggregation=False, protect_small_cohorts=True)
    batched, single = _both(
        dict(mode=mode, client_fraction=fraction),
        runtime=dict(client_policy=policy),
        protection=PLAIN,
        options=RunOptions(faults=FaultPolicy(on_error="exclude")),
    )
    for key, value in single.state.params.items():
        np.testing.assert_allclose(batched.state.params[key], value, rtol=RUN_RTOL, atol=RUN_ATOL, err_msg=key)
    metric = "local_bound" if mode == "fedavg" else "bound"
    assert [h[metric] for h in batched.history] == pytest.approx([h[metric] for h in single.history], rel=RUN_RTOL)
    Xs = np.random.default_rng(3).uniform(-3, 3, (5, 2))
    for a, b in zip(batched.model.predict_f(Xs), single.model.predict_f(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RUN_RTOL, atol=RUN_ATOL)
    assert batched.ledger.entries == single.ledger.entries
    for direction in ("up", "down"):
        assert batched.ledger.total_bytes(direction=direction) == single.ledger.total_bytes(direction=direction)
    refused = [{k: v for k, v in h.items() if k.endswith("excluded")} for h in batched.history]
    assert refused == [{k: v for k, v in h.items() if k.endswith("excluded")} for h in single.history]
    assert set(batched.history[-1]["final_excluded"]) == {"client_0", "client_1"}
    counts = batched.algorithm.worker.tracing_counts()  # the batched functions served every phase: per-client none
    assert counts == ({"train": 1, "statistics": 1, "gradient": 0} if mode == "fedavg" else
                      {"train": 0, "statistics": 1, "gradient": 1})  # fmt: skip
    assert batched.algorithm.worker.batched.tracing_counts()["statistics"] == 1


def test_secure_aggregation_still_works_with_batching():
    """Secure aggregation (the default) with batched updates: the same masked run as per client (one round and the
    final statistics), every reply masked, the same ledger."""
    batched, single = _both(dict(rounds=1), runtime=dict(client_policy=ClientPolicy()))
    for key, value in single.state.params.items():
        np.testing.assert_allclose(batched.state.params[key], value, rtol=RUN_RTOL, atol=1e-9, err_msg=key)
    assert batched.ledger.entries == single.ledger.entries
    phases = {e.phase for e in batched.ledger.entries}
    assert {"train/secagg/masked_input", "predict/secagg/masked_input", "train/secagg/unmask"} <= phases
    assert not [e for e in batched.ledger.entries if e.phase in ("train", "predict") and e.direction == "up"]


class KeepClients(FSGP):
    """FSGP that keeps its clients, to read their Adam states after the run (its update is FSGP's: batched)."""

    def setup_client(self, client, info):
        super().setup_client(client, info)
        self.clients = {**getattr(self, "clients", {}), client.id: client}


def test_a_failed_update_in_a_batch_fails_only_its_client(monkeypatch):
    """One client's non-finite bound in the batch, and on its own (the batch recomputes a non-finite client on the
    per-client path): that client is excluded and its Adam state is untouched; the others answer and keep their new
    states."""
    original = BatchedSGPRWorker.train

    def poisoned(self, data, values, states, budget):
        out = original(self, data, values, states, budget)
        out[3] = (out[3][0], out[3][1], float("nan"))  # client 3's local bound
        return out

    def failing(self, X, Y, values, adam):  # only client 3 reaches the per-client path
        new_values, _, _ = original_single(self, X, Y, values, adam)
        return new_values, adam, float("nan")

    original_single = SGPRClientWorker.train
    monkeypatch.setattr(BatchedSGPRWorker, "train", poisoned)
    monkeypatch.setattr(SGPRClientWorker, "train", failing)
    algorithm = KeepClients(gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2]), _Z(), 0.1, rounds=1)
    runtime = LocalRuntime(**BATCHED, protection=PLAIN, options=RunOptions(faults=FaultPolicy(on_error="exclude")))
    result = run(algorithm, _dataset(), runtime=runtime, seed=2)
    assert set(result.history[0]["excluded"]) == {"client_3"}
    assert "local bound became nan" in result.history[0]["excluded"]["client_3"]
    assert result.history[0]["clients"] == len(SIZES) - 1
    steps = {cid: int(c.state["adam"].iterations) for cid, c in result.algorithm.clients.items()}
    assert steps == {f"client_{k}": 0 if k == 3 else 3 for k in range(len(SIZES))}


def test_runtime_option_is_validated_and_a_replaced_update_is_asked_per_client():
    with pytest.raises(TypeError, match="batched must be True or False"):
        LocalRuntime(batched="yes")
    with pytest.raises(ValueError, match="batch_memory"):
        LocalRuntime(batch_memory=0)
    with pytest.raises(ValueError, match="min_batch"):
        LocalRuntime(min_batch=0)

    class Replaced(FSGP):
        def client_update(self, client, broadcast):
            return super().client_update(client, broadcast)

    algorithm = Replaced(gpflow.kernels.SquaredExponential(), _Z(), 0.1, rounds=1)
    result = run(algorithm, _dataset(), runtime=LocalRuntime(**BATCHED, protection=PLAIN))
    assert not result.algorithm.batched("train")  # its own update: asked client by client
    assert result.algorithm.worker.batched.tracing_counts() == {"train": 0, "statistics": 0, "gradient": 0}


@pytest.mark.parametrize("mode", ["fedavg", "exact"])
def test_a_kernel_variance_above_exp_overflow_is_answered_as_per_client(mode):
    """A kernel variance of 720 (unconstrained above log(float64 max) ≈ 709.8): ``tf.vectorized_map`` drops TensorFlow
    Probability's custom softplus gradient, so the batched train step (fedavg) and gradient (exact) are NaN there;
    each such client is recomputed on its own, and the run equals the per-client one (it once ended in NaN)."""
    results = {}
    for batched in (True, False):
        kernel = gpflow.kernels.SquaredExponential(variance=720.0, lengthscales=[1.0, 1.2])
        algorithm = FSGP(kernel, _Z(), 0.1, rounds=1, local_steps=1, learning_rate=0.1, mode=mode)
        local = LocalRuntime(**(BATCHED if batched else dict(batched=False)))
        results[batched] = run(algorithm, _dataset(), runtime=local, protection=PLAIN, seed=2)
    for key, value in results[False].state.params.items():
        assert np.all(np.isfinite(value)), key
        np.testing.assert_allclose(results[True].state.params[key], value, rtol=RUN_RTOL, atol=RUN_ATOL, err_msg=key)

"""FedBNR's batched phase 1 (``LocalRuntime`` trains a ``"kernel"`` cohort in one call) equals the per-client one.

Twenty clients of unequal sizes (4 … 27 points), D = 2, ARD lengthscales, a URK of m = 6 Fourier samples (L = 12
features): nine clients have N_c < L (the dual form), eleven N_c ≥ L (the primal form); most are padded.
"""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import ClientPolicy, LocalRuntime, Protection, run
from gpflow_fed.federated.algorithms import FedBNR
from gpflow_fed.federated.algorithms.fedbnr import negative_log_marginal_likelihood_per_point
from gpflow_fed.federated.algorithms.fedbnr_batched import masked_negative_log_marginal_likelihood_per_point
from gpflow_fed.federated.protocol.algorithm import FederationInfo
from gpflow_fed.federated.protocol.client import Client
from gpflow_fed.federated.protocol.messages import Message
from gpflow_fed.kernels import URK
from gpflow_fed.models import BayesianLinearRegression

SIZES = (4, 27, 5, 9, 12, 6, 20, 15, 8, 11, 25, 7, 13, 18, 10, 16, 22, 14, 19, 9)
NUM_FEATURES = 12
PLAIN = Protection(secure_aggregation=False)
#: every cohort batched, however small (the default asks cohorts under 32 clients one by one)
BATCHED = dict(batched=True, min_batch=1)
#: a whole run, batched against per client. One local step agrees to ≤ 1e-12 relative (the test below). A run adds the
#: round-off of each of its R·P = 6 steps: FedAvg's weighted mean does not amplify it, and Adam's step
#: λ m̂ / (√v̂ + ε) changes relatively by at most about the gradient's relative change, so a value's relative difference
#: after the run is at most ≈ 6 × 1e-12; 1e-10 leaves a margin of over ten. 1e-12 absolute for values near zero (a step
#: moves a value by at most λ = 0.05, so 6e-12 relative of a step is far below it).
RUN_RTOL, RUN_ATOL = 1e-10, 1e-12
#: secure aggregation decodes the weighted sum on a fixed-point grid of 2⁻³² ≈ 2.3e-10 (``SecureAggregation``'s
#: default f = 32): a round-off difference between the paths can move one client's code by one step, so the two runs'
#: means may differ by a few grid steps over ΣN_c, carried on by the later rounds; 1e-9 absolute is a few such steps
SECURE_ATOL = 1e-9


def _clients(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(SIZES):
        X = rng.uniform(-3, 3, (n, 2))
        out.append((X, (1 + 0.1 * k) * np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(n, 1))))
    return out


def _dataset(members=None):
    clients = _clients()
    if members is not None:
        clients = [clients[k] for k in members]
    return FederatedDataset(clients, test=clients[-1])


def _kernel():
    return URK(2, num_samples=NUM_FEATURES // 2, seed=3, feature_map_options={"lengthscales": [1.0, 1.2]})


def _fedbnr(**kwargs):
    args = dict(rounds=2, local_steps=3, learning_rate=0.05)
    args.update(kwargs)
    return FedBNR(_kernel(), 0.3, 1.5, **args)


def _normwise(ours, reference):
    """``‖ours − reference‖ / ‖reference‖`` over a client's arrays laid end to end. Adam's moments are compared so, not
    entry by entry: a gradient entry much smaller than the gradient is a difference of larger terms, so its round-off
    is relative to the gradient's size (measured: 3e-14 normwise where such an entry differs by 5e-12 of itself)."""
    a, b = (np.concatenate([np.ravel(x) for x in arrays]) for arrays in (ours, reference))
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


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


@pytest.fixture(scope="module")
def one_step():
    """``(algorithm, state, clients)``: one set-up FedBNR of one local step, shared by the tests that call its updates
    directly (its per-client and batched training are traced once for them all); each starts from fresh Adam states."""
    algorithm = _fedbnr(local_steps=1)
    return (algorithm, *_set_up(algorithm))


def _fresh(algorithm, clients):
    """Every client at step 0 of its Adam."""
    for client in clients:
        client.state["adam"] = algorithm._worker.get().trainer.initial_state()


@pytest.mark.parametrize("num_data", [5, 15])
def test_masked_objective_and_its_gradient_ignore_padded_rows_exactly(num_data):
    """Padded rows (mask 0) after the real ones change nothing, in the dual (N_c = 5 < L) and the primal (15 ≥ L):
    the masked objective and its gradient are the per-client objective's on the real rows, whatever the padded rows
    hold (rows that would change every term if they counted)."""
    X, Y = _clients()[1]
    X, Y = X[:num_data], Y[:num_data]
    model = BayesianLinearRegression((X, Y), _kernel(), 0.3, 1.5)
    padded_X = np.concatenate([X, np.full((6, 2), 2.5)])
    padded_Y = np.concatenate([Y, np.full((6, 1), 30.0)])
    mask = np.array([1.0] * num_data + [0.0] * 6)
    dual = num_data < NUM_FEATURES
    variables = model.trainable_variables
    with tf.GradientTape() as tape:
        ours = masked_negative_log_marginal_likelihood_per_point(model, padded_X, padded_Y, mask, dual)
    with tf.GradientTape() as ref_tape:
        ref = negative_log_marginal_likelihood_per_point(model, tf.constant(X), tf.constant(Y))
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-13)
    for a, b in zip(tape.gradient(ours, variables), ref_tape.gradient(ref, variables)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-12)
    # without the mask the padded rows would count: the test's padding is not harmless by accident
    unmasked = masked_negative_log_marginal_likelihood_per_point(model, padded_X, padded_Y, np.ones(len(mask)), dual)
    assert abs(unmasked.numpy() - ref.numpy()) > 1.0


def test_one_local_step_batched_equals_per_client_to_1e_12(one_step):
    """One Adam step of every client (each at its own step count: client 2 takes a second step after a first), its
    reply, loss and new Adam state: batched over the twenty clients (both forms, several buckets; then chunks of one
    client) = per client, 1e-12 relative; one trace per form serves every bucket, length and chunk."""
    algorithm, state, clients = one_step
    _fresh(algorithm, clients)
    broadcast = Message("server", 0, "kernel", algorithm.broadcast(state, 0, "kernel"))
    algorithm.client_update(clients[2], broadcast)  # client 2 at t = 1
    before = [c.state["adam"] for c in clients]
    expected = [algorithm.client_update(c, broadcast) for c in clients]
    after = [c.state["adam"] for c in clients]
    assert algorithm.batched("kernel") and not algorithm.batched("scatter")
    for budget in (2**30, 1):
        for client, adam in zip(clients, before):
            client.state["adam"] = adam
        got = algorithm.client_updates(clients, broadcast, budget)
        for client, ours, ref, adam in zip(clients, got, expected, after):
            assert isinstance(ours, Message) and ours.sender == ref.sender and ours.weight == ref.weight
            assert list(ours.arrays) == list(ref.arrays)  # wire order
            for key in ref.arrays:
                np.testing.assert_allclose(ours.arrays[key], ref.arrays[key], rtol=1e-12, atol=0, err_msg=key)
            name = "neg_log_marginal_likelihood_per_point"
            assert ours.metrics[name] == pytest.approx(ref.metrics[name], rel=1e-12)
            new = client.state["adam"]
            assert int(new.iterations) == int(adam.iterations)
            for moment in (0, 1):  # m, then v: normwise over the client's variables (see _normwise)
                assert _normwise(new.moments[moment::2], adam.moments[moment::2]) <= 1e-12
    assert [int(c.state["adam"].iterations) for c in clients] == [2 if k == 2 else 1 for k in range(len(clients))]
    assert algorithm.tracing_counts() == {"kernel": 1, "batched": 2}  # the primal and the dual form


def test_forms_buckets_and_memory_chunks():
    """Clients split by form on their own N_c (dual below L = 12), then by size; a budget of two clients' working sets
    at the largest dual length splits that bucket, never refusing a client."""
    algorithm = _fedbnr()
    _set_up(algorithm)
    worker = algorithm._worker.get().batched
    chunks = worker.chunks(SIZES, 1, 2**30)
    assert all(SIZES[k] < NUM_FEATURES for c, dual in chunks if dual for k in c.members)
    assert all(SIZES[k] >= NUM_FEATURES for c, dual in chunks if not dual for k in c.members)
    assert all(c.length >= SIZES[k] and c.length <= 1.25 * SIZES[k] for c, _ in chunks for k in c.members)
    assert worker.bytes_per_client(20, 1, True) - worker.bytes_per_client(10, 1, True) > 0  # L_p² in the dual
    assert worker.bytes_per_client(20, 1, False) - worker.bytes_per_client(10, 1, False) == (
        worker.bytes_per_client(30, 1, False) - worker.bytes_per_client(20, 1, False)
    )  # linear in L_p in the primal (L² is fixed)
    budget = 2 * worker.bytes_per_client(11, 1, True)
    small = worker.chunks(SIZES, 1, budget)
    assert all(
        len(c.members) * worker.bytes_per_client(c.length, 1, d) <= budget or len(c.members) == 1 for c, d in small
    )
    assert max(len(c.members) for c, _ in small) < max(len(c.members) for c, _ in chunks)
    assert sorted(k for c, _ in small for k in c.members) == list(range(len(SIZES)))


def test_bad_broadcasts_and_adam_states_fail_as_per_client(one_step):
    """A broadcast the per-client update refuses (an extra key, a wrong shape) fails every client of the batch with
    the same error; a client's broken Adam state fails that client only."""
    algorithm, state, clients = one_step
    _fresh(algorithm, clients)
    values = dict(algorithm.broadcast(state, 0, "kernel"))
    for bad in ({**values, "spy": np.zeros(3)}, {**values, "kernel.feature_map.lengthscales": np.zeros(3)}):
        message = Message("server", 0, "kernel", bad)
        with pytest.raises((KeyError, ValueError)) as per_client:
            algorithm.client_update(clients[0], message)
        out = algorithm.client_updates(clients, message, 2**30)
        assert all(type(e) is per_client.type and str(e) == str(per_client.value) for e in out)
    clients[4].state["adam"] = "not a state"
    out = algorithm.client_updates(clients, Message("server", 0, "kernel", values), 2**30)
    assert isinstance(out[4], TypeError) and sum(isinstance(o, Message) for o in out) == len(clients) - 1


def test_a_non_finite_batched_result_is_recomputed_per_client(one_step):
    """A kernel variance above log(float64 max) ≈ 709.8 (unconstrained): the batched gradient is NaN there
    (``tf.vectorized_map`` drops TensorFlow Probability's custom softplus gradient), the per-client step is finite;
    each such client is recomputed on its own, so every reply is the per-client one."""
    algorithm, state, clients = one_step
    _fresh(algorithm, clients)
    values = dict(algorithm.broadcast(state, 0, "kernel"))
    values["kernel.variance"] = np.array(720.0)
    broadcast = Message("server", 0, "kernel", values)
    worker = algorithm._worker.get()
    algorithm.shared.assign(worker.model, values)
    flat = np.concatenate([np.ravel(v.numpy()) for v in worker.trainer.variables])
    raw = worker.batched.train([c.data for c in clients], flat, [c.state["adam"] for c in clients], 2**30)
    assert not any(all(np.all(np.isfinite(v)) for v in r[0].values()) for r in raw)  # the batch fails
    before = [c.state["adam"] for c in clients]
    expected = [algorithm.client_update(c, broadcast) for c in clients]
    for client, adam in zip(clients, before):
        client.state["adam"] = adam
    got = algorithm.client_updates(clients, broadcast, 2**30)
    for ours, ref in zip(got, expected):
        assert isinstance(ours, Message) and np.isfinite(ours.arrays["kernel.variance"])
        for key in ref.arrays:
            np.testing.assert_array_equal(ours.arrays[key], ref.arrays[key], err_msg=key)


def _both(algorithm_kwargs, runtime=(), members=None, **run_kwargs):
    """The same run batched and per client (of the clients ``members``, default all): ``(batched, per client)``."""
    results = {}
    for batched in (True, False):
        local = LocalRuntime(**(BATCHED if batched else dict(batched=False)), **dict(runtime))
        results[batched] = run(_fedbnr(**algorithm_kwargs), _dataset(members), runtime=local, seed=2, **run_kwargs)
    return results[True], results[False]


def test_a_whole_run_batched_equals_per_client():
    """Two rounds of 12 sampled clients (so clients at different Adam steps share a batch) and phase 2: the global
    values, the rounds' losses and the returned BLR's predictions to RUN_RTOL (module constant: the tolerance and why);
    the ledger is the same, entry by entry. The batched training served every round; the per-client run never traced
    it."""
    batched, single = _both(dict(client_fraction=0.6), protection=PLAIN)
    for key, value in single.state.values.items():
        np.testing.assert_allclose(batched.state.values[key], value, rtol=RUN_RTOL, atol=RUN_ATOL, err_msg=key)
    name = "neg_log_marginal_likelihood_per_point"
    assert [h[name] for h in batched.history] == pytest.approx([h[name] for h in single.history], rel=RUN_RTOL)
    Xs = np.random.default_rng(3).uniform(-3, 3, (5, 2))
    for a, b in zip(batched.model.predict_f(Xs), single.model.predict_f(Xs)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=RUN_RTOL, atol=RUN_ATOL)
    assert batched.ledger.entries == single.ledger.entries
    assert [h["clients"] for h in batched.history] == [12, 12]
    assert batched.algorithm.tracing_counts() == {"kernel": 0, "batched": 2}
    assert single.algorithm.tracing_counts() == {"kernel": 1, "batched": 0}


def test_secure_aggregation_still_works_with_batching():
    """Secure aggregation (LocalRuntime's default protection) with batched updates: the same masked run as per client
    to SECURE_ATOL, every kernel reply masked, the same ledger (the clients of the dual form: one batched trace)."""
    dual = [k for k, n in enumerate(SIZES) if n < NUM_FEATURES]
    batched, single = _both(dict(rounds=1), runtime=dict(client_policy=ClientPolicy()), members=dual)
    for key, value in single.state.values.items():
        np.testing.assert_allclose(batched.state.values[key], value, rtol=RUN_RTOL, atol=SECURE_ATOL, err_msg=key)
    assert batched.ledger.entries == single.ledger.entries
    phases = {e.phase for e in batched.ledger.entries}
    assert {"kernel/secagg/masked_input", "kernel/secagg/unmask"} <= phases
    assert not [e for e in batched.ledger.entries if e.phase == "kernel" and e.direction == "up"]
    assert batched.algorithm.tracing_counts() == {"kernel": 0, "batched": 1}


def test_per_client_path_stays_available_where_asked_or_unbatchable():
    """``LocalRuntime(batched=False)``, a subclass with its own update, ``compile=False`` and a kernel with a
    ``tf_keras`` network (its weights are not GPflow Parameters): per client."""
    result = run(_fedbnr(rounds=1), _dataset(), runtime=LocalRuntime(batched=False, protection=PLAIN))
    assert result.algorithm.tracing_counts() == {"kernel": 1, "batched": 0}

    class Replaced(FedBNR):
        def client_update(self, client, broadcast):
            return super().client_update(client, broadcast)

    replaced = Replaced(_kernel(), 0.3, 1.5, rounds=1, local_steps=1)
    _set_up(replaced)
    assert replaced._worker.get().batched is not None and not replaced.batched("kernel")
    eager = _fedbnr(compile=False)
    _set_up(eager)
    assert not eager.batched("kernel")
    net = tf_keras.Sequential([tf_keras.layers.Dense(2, dtype=gpflow.default_float())])
    deep = FedBNR(URK(2, num_samples=4, feature_extractor=net), rounds=1, local_steps=1)
    _set_up(deep)
    assert deep._worker.get().batched is None and not deep.batched("kernel")

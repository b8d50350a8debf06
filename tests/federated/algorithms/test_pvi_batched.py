"""PVI's batched local steps (``LocalRuntime`` fits a synchronous cohort in one computation) equal the per-client ones.

Eight clients of unequal sizes (6 … 18 points: four size buckets, four clients padded), D = 1, M = 4, DPO factors
with q(Z) and q(log β) learned. The one-step test caps M_k at 5 (own pseudo-sets of 4 and 5 points in one bucket,
cavities of different sizes); the whole run under the default protection caps it at 8 (pseudo-sets of 4, 5, 7 and 8
points: replies of four shapes, none of them a strict majority, which ``PVI.reply_spec`` expects); the other runs cap
it at 4.
"""

import copy

import gpflow
import numpy as np
import pytest
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import ClientPolicy, LocalRuntime, Protection, run
from gpflow_fed.federated.algorithms import PVI
from gpflow_fed.federated.algorithms.pvi.batched import masked_local_terms
from gpflow_fed.federated.protocol.algorithm import Aggregate, FederationInfo
from gpflow_fed.federated.protocol.client import Client
from gpflow_fed.federated.protocol.messages import Message
from gpflow_fed.inducing_variables import PseudoObservations
from gpflow_fed.models.dpo_svgp import dpo_free_energy_terms
from gpflow_fed.training.batched import size_buckets

SIZES = (6, 18, 7, 10, 6, 15, 9, 12)
PLAIN = Protection(secure_aggregation=False)
#: every cohort batched, however small (the default asks cohorts under 32 clients one by one)
BATCHED = dict(batched=True, min_batch=1)
Z0 = np.linspace(-2.0, 2.0, 4)[:, None]


def _clients(seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for k, n in enumerate(SIZES):
        X = rng.uniform(-2, 2, (n, 1))
        out.append((X, np.sin(3 * X) + 0.1 * k + 0.1 * rng.standard_normal((n, 1))))
    return out


def _dataset():
    clients = _clients()
    return FederatedDataset(clients, test=clients[0])


def _pvi(**kwargs):
    args = dict(rounds=2, local_steps=40, patience=5, damping=0.5, max_pseudo=4, num_predict_samples=4)
    args.update(kwargs)
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.7), gpflow.likelihoods.Gaussian(0.1)
    return PVI(kernel, Z0, lik, "dpo", "synchronous", **args)


def test_the_test_cohort_pads_rows_and_pseudo_points():
    buckets = size_buckets(SIZES)
    assert [b.length for b in buckets] == [7, 10, 15, 18]
    assert sum(b.length != SIZES[k] for b in buckets for k in b.members) == 4


def test_masked_terms_and_their_gradient_ignore_padded_rows_and_pseudo_points_exactly():
    """Padded data rows, own and cavity pseudo-points (mask 0) change neither the ELL and u-KL of one sample nor their
    gradient: they equal ``dpo_free_energy_terms`` on the real entries, whatever the padded entries hold."""
    rng = np.random.default_rng(1)
    X, Y = _clients()[3]
    kernel, lik = gpflow.kernels.SquaredExponential(lengthscales=0.7), gpflow.likelihoods.Gaussian(0.1)
    Z = tf.constant(Z0 + 0.1)
    V, m, s = rng.uniform(-2, 2, (5, 1)), rng.standard_normal((5, 1)), rng.uniform(0.1, 1.0, 5)
    cV, cm, cs = rng.uniform(-2, 2, (6, 1)), rng.standard_normal((6, 1)), rng.uniform(0.1, 1.0, 6)

    def pad(a, rows, value):
        return np.concatenate([a, np.full((rows,) + a.shape[1:], value)])

    own_vars = [tf.Variable(pad(V, 3, 1.5)), tf.Variable(pad(m, 3, 9.0)), tf.Variable(pad(s, 3, 0.01))]
    rows, own_mask, cav_mask = (np.r_[np.ones(n), np.zeros(k)] for n, k in ((len(X), 4), (5, 3), (6, 2)))
    cavity = (pad(cV, 2, -1.0), pad(cm, 2, 7.0), pad(cs, 2, 0.05))
    padded_X, padded_Y = pad(X, 4, 2.5), pad(Y, 4, 30.0)

    def ours(row_mask, own_m, cav_m):
        with tf.GradientTape() as tape:
            ell, kl = masked_local_terms(kernel, lik, None, padded_X, padded_Y, row_mask, Z,
                                         (*own_vars, own_m), (*cavity, cav_m), 1e-6)  # fmt: skip
            bound = ell - kl
        return ell, kl, tape.gradient(bound, own_vars)

    ell, kl, grads = ours(rows, own_mask, cav_mask)
    ref_vars = [tf.Variable(V), tf.Variable(m), tf.Variable(s)]
    with tf.GradientTape() as tape:
        own = PseudoObservations(V, m, s)
        own.V, own.m = ref_vars[0], ref_vars[1]  # read through the tape's variables
        own.S_diag = ref_vars[2]
        ref_ell, ref_kl = dpo_free_energy_terms(
            kernel, lik, None, X, Y, Z, [own], [PseudoObservations(cV, cm, cs)], 1e-6
        )
        ref_bound = ref_ell - ref_kl
    ref_grads = tape.gradient(ref_bound, ref_vars)
    np.testing.assert_allclose(ell.numpy(), ref_ell.numpy(), rtol=1e-13)
    np.testing.assert_allclose(kl.numpy(), ref_kl.numpy(), rtol=1e-12)
    for g, ref in zip(grads, ref_grads):
        n = ref.shape[0]
        np.testing.assert_allclose(g.numpy()[:n], ref.numpy(), rtol=1e-11, atol=1e-14)
        assert np.all(g.numpy()[n:] == 0.0)  # padded pseudo-points get an exact zero gradient
    # without the masks the padded entries would count: the test's padding is not harmless by accident
    for masks in ((np.ones(len(rows)), own_mask, cav_mask), (rows, np.ones(8), cav_mask), (rows, own_mask, np.ones(8))):
        e, k, _ = ours(*masks)
        assert abs((e - k).numpy() - (ref_ell - ref_kl).numpy()) > 1e-3


def _set_up(algorithm):
    """The algorithm bound to the test's clients as a run binds it: its initial state and the clients."""
    data = _clients()
    ids = tuple(f"client_{k}" for k in range(len(data)))
    info = FederationInfo(ids, {c: len(d[1]) for c, d in zip(ids, data)}, 1, 1, seed=0)
    state = algorithm.initial_state(info)
    clients = [Client(c, d, seed=k) for k, (c, d) in enumerate(zip(ids, data))]
    for client in clients:
        algorithm.setup_client(client, info)
    return state, clients


def _copy(clients):
    out = []
    for client in clients:
        twin = Client(client.id, client.data, client.seed)
        twin.state, twin.rng = copy.deepcopy(client.state), copy.deepcopy(client.rng)
        out.append(twin)
    return out


def _assert_close(ours, ref, rtol, name):
    """``max |ours − ref| ≤ rtol · max |ref|`` over the array (relative to its scale: a value that a step moved by a
    gradient that nearly cancelled, e.g. a pseudo-target at 1e-6 among others at 2e-2 after Adam's first step, carries
    the round-off of the larger terms it came from)."""
    ours, ref = np.asarray(ours), np.asarray(ref)
    assert ours.shape == ref.shape, name
    assert np.max(np.abs(ours - ref), initial=0.0) <= rtol * np.max(np.abs(ref), initial=0.0), name


def _assert_same_replies(got, expected, rtol):
    for ours, ref in zip(got, expected):
        assert isinstance(ours, Message) and ours.sender == ref.sender and ours.weight == ref.weight
        assert list(ours.arrays) == list(ref.arrays)
        for key in ref.arrays:
            _assert_close(ours.arrays[key], ref.arrays[key], rtol, key)
        assert ours.metrics["local_steps"] == ref.metrics["local_steps"]
        assert ours.metrics["free_energy"] == pytest.approx(ref.metrics["free_energy"], rel=rtol)


@pytest.mark.parametrize(
    "options",
    [
        {},
        pytest.param(dict(learn_inducing="fixed"), marks=pytest.mark.slow, id="fixed-Z"),
        pytest.param(dict(learn_hyperparameters=False), marks=pytest.mark.slow, id="fixed-beta"),
    ],
)
def test_one_local_step_batched_equals_per_client_to_1e_12_and_failures_are_recomputed_alone(options):
    """One Adam step of every client in round 0 (empty cavities, q at its start) and in round 1 (each client's cavity
    holds the other seven pseudo-sets, its own accepted factors applied): the replies, the clients' new factors and
    random-stream positions, batched over the eight clients (four buckets; then chunks of one client) = per client,
    1e-12 relative (of each array's scale: ``_assert_close``). A batched call that fails (here: every call raises)
    leaves each client to the per-client path. In the slow suite: a point Z (``"fixed"``) and a fixed β too."""
    algorithm = _pvi(local_steps=1, max_pseudo=5, **options)
    state, clients = _set_up(algorithm)
    assert sorted({c.state["num_pseudo"] for c in clients}) == [4, 5]
    assert algorithm.batched("train")
    for round in (0, 1):
        broadcast = Message("server", round, "train", algorithm.broadcast(state, round, "train"))
        before = _copy(clients)
        expected = [algorithm.client_update(c, broadcast) for c in clients]
        for budget in (2**30, 1):
            twins = _copy(before)
            _assert_same_replies(algorithm.client_updates(twins, broadcast, budget), expected, 1e-12)
            for twin, client in zip(twins, clients):
                assert twin.state["counter"] == client.state["counter"] == (round + 1)
                for key, value in client.state["factor"].items():
                    _assert_close(twin.state["factor"][key], value, 1e-12, key)
        aggregate = Aggregate(
            round, "train", {}, float(sum(SIZES)), tuple(c.id for c in clients), messages=tuple(expected)
        )
        state = algorithm.server_update(state, aggregate)
    assert algorithm._batched.tracing_count() == 1
    assert min(np.sum(state.versions == 2), len(state.sets)) == len(SIZES)  # every client sent twice, all sets held

    def failing(*args):
        raise tf.errors.InvalidArgumentError(None, None, "Cholesky decomposition was not successful")

    algorithm._batched.function = failing
    broadcast = Message("server", 2, "train", algorithm.broadcast(state, 2, "train"))
    twins = _copy(clients)
    expected = [algorithm.client_update(c, broadcast) for c in clients]
    got = algorithm.client_updates(twins, broadcast, 2**30)
    _assert_same_replies(got, expected, 0.0)


def _both(algorithm_kwargs, runtime=(), **run_kwargs):
    """The same run batched and per client: ``(batched, per client)``."""
    results = {}
    for batched in (True, False):
        local = LocalRuntime(**(BATCHED if batched else dict(batched=False)), **dict(runtime))
        results[batched] = run(_pvi(**algorithm_kwargs), _dataset(), runtime=local, seed=2, **run_kwargs)
    return results[True], results[False]


#: a whole run, batched against per client: one local step agrees to ≤ 1e-12 relative (the test above). A run of R = 2
#: rounds of at most P = 40 steps adds the round-off of each step: Adam's normalised step m / (√v + ε) changes
#: relatively by at most about the gradient's relative change, so after R·P = 80 steps a client's q and factor differ
#: by at most ≈ 80 × 1e-12 relative, and the server's sums of natural parameters do not amplify it; 1e-9 relative
#: leaves a margin of twelve (measured: 1.3e-14). Early stopping compares smoothed free energies, which a 1e-10
#: perturbation flips only at an exact tie: the steps taken must be equal.
RUN_RTOL = 1e-9


def _assert_same_state(batched, single, rtol, atol=0.0):
    for name in ("qZ", "qrho"):
        a, b = getattr(batched.state, name), getattr(single.state, name)
        np.testing.assert_allclose(a.nu, b.nu, rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_allclose(a.lam, b.lam, rtol=rtol, atol=atol, err_msg=name)
    assert sorted(batched.state.sets) == sorted(single.state.sets)
    for cid, pseudo in single.state.sets.items():
        for key, value in pseudo.items():
            np.testing.assert_allclose(batched.state.sets[cid][key], value, rtol=rtol, atol=atol, err_msg=key)
    assert np.array_equal(batched.state.versions, single.state.versions)
    assert [h["local_steps"] for h in batched.history] == [h["local_steps"] for h in single.history]


def test_a_whole_run_with_secure_aggregation_on_batched_equals_per_client():
    """Two synchronous rounds of the eight clients with early stopping under LocalRuntime's default protection
    (secure aggregation on, which leaves PVI's "collect" exchange plain) and every client's own policy: the server's
    q(Z), q(log β) and every pseudo-set to RUN_RTOL (the tolerance and why: the module constant), the same steps taken,
    and the same ledger, entry by entry. The batched step served every round; the per-client run never built it.
    The clients' pseudo-sets differ in size (M_k = 4, 5, 7, 8: no layout of the replies is a strict majority)."""
    batched, single = _both(dict(max_pseudo=8), runtime=dict(client_policy=ClientPolicy()))
    assert sorted(len(s["m"]) for s in batched.state.sets.values()) == [4, 4, 5, 7, 8, 8, 8, 8]
    _assert_same_state(batched, single, RUN_RTOL)
    assert batched.ledger.entries == single.ledger.entries
    assert not [e for e in batched.ledger.entries if "secagg" in e.phase]  # a "collect" exchange stays plain
    assert [h["clients"] for h in batched.history] == [len(SIZES)] * 2
    assert batched.algorithm._batched.tracing_count() == 1
    assert single.algorithm._batched is None


@pytest.mark.slow
def test_a_plain_whole_run_batched_equals_per_client():
    """The same run without any protection: equal as above."""
    batched, single = _both({}, protection=PLAIN)
    _assert_same_state(batched, single, RUN_RTOL)
    assert batched.ledger.entries == single.ledger.entries


def test_the_per_client_path_stays_where_batching_does_not_apply():
    """CPO factors, FedAvg-Z, a diagnostics hook and a replaced update are not batched (``LocalRuntime(batched=False)``
    keeps one update a client: the runs above)."""
    assert not _pvi(learn_inducing="fedavg").batched("train")
    assert not PVI(gpflow.kernels.SquaredExponential(), Z0, gpflow.likelihoods.Gaussian(), "cpo").batched("train")
    assert not _pvi(on_client_update=lambda update: None).batched("train")

    class Replaced(PVI):
        def client_update(self, client, broadcast):
            return super().client_update(client, broadcast)

    replaced = Replaced(gpflow.kernels.SquaredExponential(), Z0, gpflow.likelihoods.Gaussian(), schedule="synchronous")
    assert not replaced.batched("train") and _pvi().batched("train") and _pvi(learn_inducing="fixed").batched("train")

"""The per-client Python of a batched round (issue 46): what is the same for every client of a cohort is done once.

* the ledger measures a broadcast once however many clients it goes to, and its entries and totals stay exact;
* FSGP's batched training splits each chunk's outputs once (every client's arrays are views of its own row of one
  copy), with the values, Adam states and bounds of the per-client split, bit for bit.
"""

import pickle

import gpflow
import numpy as np

from gpflow_fed.federated.algorithms.fsgp.batched import _split_rows, _stack_states
from gpflow_fed.federated.algorithms.fsgp.worker import SGPRClientWorker
from gpflow_fed.federated.protocol.ledger import CommunicationLedger, LedgerEntry
from gpflow_fed.federated.protocol.messages import SERVER, Message
from gpflow_fed.training.adam import AdamState
from gpflow_fed.training.batched import flat_offsets, split_flat, stack_adam_states, stack_padded

from .algorithms.test_fsgp_batched import PATHS, _clients, _Z


def _counting_nbytes(monkeypatch):
    """Count the evaluations of ``Message.nbytes`` (the ledger's measurement of a message's size)."""
    counts = {"down": 0, "up": 0}
    original = Message.nbytes

    def nbytes(message):
        counts["down" if message.sender == SERVER else "up"] += 1
        return original.fget(message)

    monkeypatch.setattr(Message, "nbytes", property(nbytes))
    return counts


def test_a_broadcast_is_measured_once_per_cohort_and_the_entries_stay_exact(monkeypatch):
    """K clients: the broadcast's size is measured once (not K times), each reply once; the entries are every message
    in the order sent, with its own receiver, and the totals (running and filtered) are their exact sums."""
    K = 50
    down = Message(SERVER, 3, "train", {"w": np.zeros((2, 3)), "s": np.ones(())}, weight=0.0)
    replies = [
        Message(f"c{k}", 3, "train", {"w": np.full((2, 3), float(k))}, weight=k + 1, metrics={"b": 1.0})
        for k in range(K)
    ]
    counts = _counting_nbytes(monkeypatch)
    ledger = CommunicationLedger(keep_payloads=True)
    for k, reply in enumerate(replies):  # as the phase owner records them: the broadcast to a client, then its reply
        ledger.record(down, f"c{k}", "train")
        ledger.record(reply, SERVER, "train")
    assert counts == {"down": 1, "up": K}
    monkeypatch.undo()

    expected = []
    for k in range(K):
        expected.append(
            LedgerEntry(3, "train", "train", SERVER, f"c{k}", ("w", "s"), ((2, 3), ()), ("float64",) * 2, 64)
        )
        expected.append(LedgerEntry(3, "train", "train", f"c{k}", SERVER, ("w",), ((2, 3),), ("float64",), 64))
    assert ledger.entries == tuple(expected) and list(ledger) == expected and len(ledger) == 2 * K
    assert ledger.total_bytes(direction="down") == ledger.total_bytes(direction="up") == 64 * K
    assert ledger.total_bytes() == 128 * K
    assert ledger.select(sender="c7") == [expected[15]]
    assert ledger.select(direction="down", round=3, phase="train", purpose="train") == expected[0::2]
    assert ledger.select(round=2) == [] and ledger.total_bytes(purpose="evaluate") == 0
    assert len(ledger.messages) == 2 * K
    resumed = CommunicationLedger()
    resumed.extend(ledger.entries)
    assert resumed.entries == ledger.entries and resumed.total_bytes(direction="up") == 64 * K


def test_a_broadcast_object_reused_for_another_purpose_or_message_is_measured_anew(monkeypatch):
    """The cache is keyed by the message object and the purpose: the same broadcast under two purposes gives two
    entries of their own, and a new broadcast (another round) is measured again, whatever Python's ``id`` reuses; the
    ledger still pickles."""
    counts = _counting_nbytes(monkeypatch)
    ledger = CommunicationLedger()
    first = Message(SERVER, 0, "train", {"w": np.zeros(2)}, weight=0.0)
    for receiver in ("a", "b"):
        ledger.record(first, receiver, "train")
        ledger.record(first, receiver, "evaluate")
    del first
    for r in range(1, 40):  # new broadcasts, some of which may get the freed object's id
        ledger.record(Message(SERVER, r, "train", {"w": np.zeros(r + 2)}, weight=0.0), "a", "train")
    assert counts["down"] == 2 + 39
    monkeypatch.undo()
    assert [e.purpose for e in ledger.entries[:4]] == ["train", "evaluate"] * 2
    assert [(e.round, e.shapes, e.nbytes) for e in ledger.entries[4:]] == [
        (r, ((r + 2,),), 8 * (r + 2) + 8) for r in range(1, 40)
    ]
    assert ledger.total_bytes(direction="down") == sum(e.nbytes for e in ledger.entries)
    copied = pickle.loads(pickle.dumps(ledger))  # the cache of broadcasts (messages) is not part of a copy
    assert copied.entries == ledger.entries and copied.total_bytes() == ledger.total_bytes()


def _worker():
    iv = gpflow.inducing_variables.InducingPoints(_Z())
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.2])
    return SGPRClientWorker(kernel, iv, 0.1, 1, PATHS, 0.1, 2, False)


def test_batched_training_splits_each_chunk_once_with_the_per_client_split_bit_for_bit():
    """Two steps of every client (seven, in six size buckets, one chunk each): the compiled call's outputs split per
    client as ``StackedTraining.train`` splits them (``split_flat`` of each row, a copy of each), bit for bit; every
    client's arrays are views of one copy of its chunk's outputs, one row each (a client's state can change without
    touching another's)."""
    worker, budget = _worker(), 2**30
    batched, clients = worker.batched, _clients()
    values = worker.pack([v.numpy() for v in worker.shared])
    states = [worker.initial_adam_state() for _ in clients]
    states[2] = batched.train([clients[2]], values, [states[2]], budget)[0][1]  # a client at another step count
    got = batched.train(clients, values, states, budget)

    training, reference = batched.training, [None] * len(clients)
    for chunk in batched._chunks([len(Y) for _, Y in clients], budget):
        iterations, moments = stack_adam_states([states[k] for k in chunk.members], len(training.moment_shapes))
        X, mask = stack_padded([clients[k][0] for k in chunk.members], chunk.length)
        Y, _ = stack_padded([clients[k][1] for k in chunk.members], chunk.length)
        outputs = [t.numpy() for t in batched.functions["train"](X, Y, mask, values, iterations, moments)]
        for i, k in enumerate(chunk.members):
            moments_k = tuple(split_flat(outputs[1][i].copy(), training.moment_offsets))
            state = AdamState(outputs[2][i].copy(), moments_k)
            reference[k] = (split_flat(outputs[0][i].copy(), training.value_offsets), state, float(outputs[3][i]))
    for (v1, s1, b1), (v2, s2, b2) in zip(reference, got):
        assert (
            b1 == b2 and s1.iterations.shape == s2.iterations.shape == () and int(s1.iterations) == int(s2.iterations)
        )
        for x, y in zip(v1 + list(s1.moments), v2 + list(s2.moments)):
            assert type(x) is type(y) and x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y)
    assert [int(s.iterations) for _, s, _ in got] == [4 if k == 2 else 2 for k in range(len(clients))]

    shared = [k for b in batched._chunks([len(Y) for _, Y in clients], budget) if len(b.members) > 1 for k in b.members]
    assert shared == [1, 2]  # clients 1 and 2 share a bucket: their arrays are rows of one block
    for a, b in [(got[1][1].moments[0], got[2][1].moments[0]), (got[1][0][0], got[2][0][0])]:
        assert a.base is not None and a.base is b.base  # one block (the chunk's copy of its outputs)
    before = got[2][1].moments[0].copy()
    got[1][1].moments[0][...] = 7.0  # rows never overlap: client 2's state is its own
    np.testing.assert_array_equal(got[2][1].moments[0], before)
    assert not any(np.shares_memory(got[k][1].moments[0], states[k].moments[0]) for k in range(len(clients)))


def test_stacking_and_splitting_rows_match_the_per_client_helpers():
    """``_stack_states`` = ``stack_adam_states`` and ``_split_rows`` = ``split_flat`` of each row (scalars as 0-d
    arrays), on states of mixed shapes."""
    shapes = [(4, 2), (4, 2), (), (), (3,), (3,)]
    offsets = flat_offsets(shapes)
    rng = np.random.default_rng(0)
    states = [AdamState(np.array(k, np.int64), tuple(rng.normal(size=s) for s in shapes)) for k in range(5)]
    iterations, moments = _stack_states(states, offsets)
    expected = stack_adam_states(states, len(shapes))
    np.testing.assert_array_equal(iterations, expected[0])
    np.testing.assert_array_equal(moments, expected[1])
    assert moments.dtype == expected[1].dtype and iterations.dtype == np.int64
    for row, parts in zip(moments, _split_rows(moments, offsets)):
        for x, y in zip(split_flat(row, offsets), parts):
            assert type(x) is type(y) and x.shape == y.shape and np.array_equal(x, y)

"""One answer per what the answer depends on (issue 43, item 4): a broadcast moved only in an array the phase does
not read is the same question. FSGP's statistics do not read the noise variance; a server that moved it by 1e-9 was
answered again over a larger cohort ({A, B} then {A, B, C}) and differenced C's statistics out."""

import gpflow
import numpy as np

from gpflow_fed.federated import Client, ClientPolicy, FederationInfo, Message, Protection
from gpflow_fed.federated.algorithms import FSGP
from gpflow_fed.federated.engine.endpoint import ClientEndpoint
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protocol.messages import SERVER
from gpflow_fed.federated.protocol.transport import UPDATE, Request

SECURE = Protection()


def _party():
    rng = np.random.default_rng(0)
    info = FederationInfo(("A", "B", "C"), {"A": 20, "B": 20, "C": 20}, 1, 1, 0)
    algorithm = FSGP(gpflow.kernels.SquaredExponential(), np.linspace(-1, 1, 4)[:, None], rounds=3, mode="exact")
    bound = algorithm.bind(info)
    state = bound.initial_state(info)
    X = rng.uniform(-1, 1, (20, 1))
    client = Client("A", (X, np.sin(X)), 1)
    endpoint = ClientEndpoint(bound, client, info, ClientEncoder("A", ClientPolicy(), dict(info.client_sizes)))
    return endpoint, dict(bound.broadcast(state, 0, "statistics"))


def _ask(endpoint, arrays, round_, cohort_size):
    down = Message(SERVER, round_, "statistics", arrays, weight=0.0)
    config = {"aggregation": "sum", "cohort_size": cohort_size, "protection": SECURE.to_config()}
    return endpoint.handle(Request(UPDATE, down, "train", config))


def test_a_broadcast_moved_only_in_an_unread_array_is_not_asked_again_over_another_cohort():
    endpoint, arrays = _party()
    assert _ask(endpoint, arrays, 0, 2).fault is None  # {A, B}
    moved = {**arrays, "likelihood.variance": arrays["likelihood.variance"] + 1e-9}
    refused = _ask(endpoint, moved, 1, 3)  # {A, B, C}, a later round, the noise variance moved by 1e-9
    assert refused.layout is None and "under another request" in refused.fault


def test_control_a_broadcast_moved_in_an_array_the_phase_reads_is_a_new_question():
    endpoint, arrays = _party()
    assert _ask(endpoint, arrays, 0, 2).fault is None
    moved = {**arrays, "kernel.variance": arrays["kernel.variance"] + 1e-9}
    assert _ask(endpoint, moved, 1, 3).fault is None


def test_the_update_receives_only_what_its_phase_reads():
    endpoint, arrays = _party()
    read = endpoint.algorithm.read_broadcast(Message(SERVER, 0, "statistics", arrays, weight=0.0))
    assert set(read.arrays) == set(arrays) - {"likelihood.variance"}
    assert endpoint.algorithm.ignores("gradient") == ()  # the gradient reads every value (and its adjoints)
    # the statistics do not depend on the value they ignore: the same answer whatever it is (so one answer is right)
    first, second = _party()[0], _party()[0]
    a = _ask(first, arrays, 0, 3)
    b = _ask(second, {**arrays, "likelihood.variance": arrays["likelihood.variance"] * 3}, 0, 3)
    assert a.fault is None and b.fault is None
    kept_a = next(iter(first.encoder._prepared.values()))[0].arrays
    kept_b = next(iter(second.encoder._prepared.values()))[0].arrays
    assert all(np.array_equal(kept_a[k], kept_b[k]) for k in kept_a)

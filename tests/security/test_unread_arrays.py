"""One answer per what the answer depends on (issue 43, item 4): a broadcast moved only in an array the phase does
not read is the same question. FSGP's statistics do not read the noise variance; a server that moved it by 1e-9 was
answered again over a larger cohort ({A, B} then {A, B, C}) and differenced C's statistics out. FedBNR's ``scatter``
statistics (ΦᵀΦ, Φᵀy, yᵀy, N) read the kernel only: a later fresh attacker moved σ² by 1e-9 and had one client's
statistics to 1e-10 (issue 43, eighth round)."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.federated import Client, ClientPolicy, FederationInfo, Message, Protection
from gpflow_fed.federated.algorithms import FSGP, FedBNR
from gpflow_fed.federated.engine.endpoint import ClientEndpoint
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protocol.messages import SERVER
from gpflow_fed.federated.protocol.algorithm import BroadcastRefused
from gpflow_fed.federated.protection.wire import broadcast_digest
from gpflow_fed.federated.protocol.transport import UPDATE, Request
from gpflow_fed.kernels import URK

SECURE = Protection()


PHASES = {"fsgp": "statistics", "fedbnr": "scatter"}
#: the purpose and two rounds at which each asks that phase (FedBNR's scatter evaluates in rounds before its last)
ASKED = {"fsgp": ("train", 0, 1), "fedbnr": ("evaluate", 1, 2)}
#: per algorithm, the values its statistics phase does not read, and one it reads
UNREAD = {"fsgp": ("likelihood.variance",), "fedbnr": ("likelihood.variance", "prior_variance")}
READ = {"fsgp": "kernel.variance", "fedbnr": "kernel.variance"}


def _party(kind="fsgp"):
    """Party A of three, and the broadcast of its statistics phase: FSGP's ``"statistics"`` (exact mode) or FedBNR's
    ``"scatter"``."""
    rng = np.random.default_rng(0)
    info = FederationInfo(("A", "B", "C"), {"A": 20, "B": 20, "C": 20}, 1, 1, 0)
    if kind == "fsgp":
        algorithm = FSGP(gpflow.kernels.SquaredExponential(), np.linspace(-1, 1, 4)[:, None], rounds=3, mode="exact")
    else:
        algorithm = FedBNR(URK(1, num_samples=8, seed=0), rounds=4)
    bound = algorithm.bind(info)
    state = bound.initial_state(info)
    X = rng.uniform(-1, 1, (20, 1))
    client = Client("A", (X, np.sin(X)), 1)
    endpoint = ClientEndpoint(bound, client, info, ClientEncoder("A", ClientPolicy(), dict(info.client_sizes)))
    return endpoint, dict(bound.broadcast(state, 0, PHASES[kind]))


def _ask(endpoint, arrays, which, cohort_size, kind="fsgp"):
    """Ask ``kind``'s statistics phase at its first (``which`` 0) or second round of :data:`ASKED`."""
    purpose, *rounds = ASKED[kind]
    down = Message(SERVER, rounds[which], PHASES[kind], arrays, weight=0.0)
    config = {"aggregation": "sum", "cohort_size": cohort_size, "protection": SECURE.to_config()}
    return endpoint.handle(Request(UPDATE, down, purpose, config))


@pytest.mark.parametrize("kind, unread", [(k, name) for k, names in UNREAD.items() for name in names])
def test_a_broadcast_moved_only_in_an_unread_array_is_not_asked_again_over_another_cohort(kind, unread):
    endpoint, arrays = _party(kind)
    assert _ask(endpoint, arrays, 0, 2, kind).fault is None  # {A, B}
    moved = {**arrays, unread: arrays[unread] + 1e-9}
    refused = _ask(endpoint, moved, 1, 3, kind)  # {A, B, C}, a later round, an unread value moved by 1e-9
    assert refused.layout is None and "under another request" in refused.fault


@pytest.mark.parametrize("kind", list(PHASES))
def test_control_a_broadcast_moved_in_an_array_the_phase_reads_is_a_new_question(kind):
    endpoint, arrays = _party(kind)
    assert _ask(endpoint, arrays, 0, 2, kind).fault is None
    moved = {**arrays, READ[kind]: arrays[READ[kind]] + 1e-9}
    assert _ask(endpoint, moved, 1, 3, kind).fault is None


@pytest.mark.parametrize("kind", list(PHASES))
def test_the_update_receives_only_what_its_phase_reads(kind):
    endpoint, arrays = _party(kind)
    phase = PHASES[kind]
    read = endpoint.algorithm.read_broadcast(Message(SERVER, 0, phase, arrays, weight=0.0))
    assert set(read.arrays) == set(arrays) - set(UNREAD[kind])
    # the statistics do not depend on the values they ignore: the same answer whatever they are (one answer is right)
    first, second = _party(kind)[0], _party(kind)[0]
    a = _ask(first, arrays, 0, 3, kind)
    b = _ask(second, {**arrays, **{name: arrays[name] * 3 for name in UNREAD[kind]}}, 0, 3, kind)
    assert a.fault is None and b.fault is None


def test_the_other_phases_read_every_value():
    fsgp = _party("fsgp")[0].algorithm
    assert fsgp.ignores("train") == ()
    fedbnr = _party("fedbnr")[0].algorithm
    assert fedbnr.ignores("kernel") == fedbnr.ignores("weights") == ()


def test_fsgp_gradient_ignores_the_noise_variance():
    """FSGP's ``gradient`` is the statistics' vector–Jacobian product: its σ² entry is 0 whatever σ² is, so a
    broadcast moved in σ² alone is the same question (a tenth fresh attacker moved it by 1e-9 and had one client's
    gradient to 9.7e-11 from two sums; issue 43): read without σ², keyed without it."""
    endpoint, arrays = _party("fsgp")
    algorithm = endpoint.algorithm
    assert algorithm.ignores("gradient") == ("likelihood.variance",)
    adjoints = {"adjoint/a": np.ones((2, 2))}
    moved = {**arrays, "likelihood.variance": arrays["likelihood.variance"] + 1e-9}
    read = [
        algorithm.read_broadcast(Message(SERVER, 0, "gradient", {**a, **adjoints}, weight=0.0)) for a in (arrays, moved)
    ]
    assert "likelihood.variance" not in read[0].arrays
    assert broadcast_digest(read[0]) == broadcast_digest(read[1])


def test_a_fedbnr_update_given_an_unread_array_refuses_it():
    """Called with the whole broadcast (not through the endpoint, which strips what the phase ignores), FedBNR's
    ``scatter`` refuses it: an array it would ignore would make a "new" question for free."""
    endpoint, arrays = _party("fedbnr")
    assert _ask(endpoint, arrays, 0, 2, "fedbnr").fault is None  # sets the client up
    with pytest.raises(BroadcastRefused, match="'scatter' broadcast carries arrays other than the kernel's"):
        endpoint.algorithm.client_update(endpoint.client, Message(SERVER, 0, "scatter", arrays, weight=0.0))

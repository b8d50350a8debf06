"""Issue 43 (the clip leak) for FGP's and FedAvgNN's FedAvg ``"train"``: a reply its algorithm bounds from public
numbers is never clipped.

A FedAvg reply is P Adam steps from the broadcast, so ``|value| ≤ max |broadcast value| + δ`` (δ the Adam displacement
bound of the round), whatever the data (``gpflow_fed.federated.algorithms.bounds``). Without that bound a server that
sweeps a broadcast value across the fixed-point range reads where each party's weighted reply ``N_k (b + Δ_k)``
saturates, i.e. each party's data-dependent move ``Δ_k``. With it, the parties refuse a broadcast whose bound passes the
range, before any value is read, and never clip.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Tuple

import gpflow
import numpy as np
import pytest
from gpflow.keras import tf_keras

from gpflow_fed.data.dataset import FederatedDataset
from gpflow_fed.federated.algorithms import FGP, FedAvgNN
from gpflow_fed.federated.algorithms.fedavg_nn import NOISE_PHASE
from gpflow_fed.federated.algorithms.fgp import EXPERTS_PHASE
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.reduction import FixedPointSaturationWarning
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.wire import FixedPoint
from gpflow_fed.federated.protocol.domain import DataDomain
from gpflow_fed.federated.protocol.messages import SERVER, Message
from gpflow_fed.federated.runtimes.base import federation_info, make_clients
from gpflow_fed.training.stopping import Plateau
from tests.security.test_eleventh_attack_round import K, N, _federation
from tests.security.test_payload_bounds import SWEEP, sweep

#: the broadcasts of the ratio test: unconstrained offsets from the initial values, per round (adversarial included)
OFFSETS: List[Dict[str, float]] = [
    {},  # honest
    {"kernel.variance": 30.0},  # σ_f² ≈ 30.7
    {"likelihood.variance": -25.0},  # σ² at its lower bound 1e-6
    {"kernel.lengthscales": -8.0, "kernel.variance": 6.0},  # short lengthscale, large variance: large |log p| / N
    {"kernel.lengthscales": 40.0},  # a flat kernel
    {"likelihood.variance": 12.0},  # large noise
]


def _fgp(rounds: int = 5, **kwargs: Any) -> FGP:
    return FGP(gpflow.kernels.SquaredExponential(), rounds=rounds, stopping=Plateau(window=2), **kwargs)


def _clients(algorithm: Any, seed: int, sizes=(7, 12, 20)) -> Tuple[Any, List[Any]]:
    rng = np.random.default_rng(seed)
    dataset = FederatedDataset([(rng.uniform(-3, 3, (n, 1)), 2.5 * rng.normal(size=(n, 1))) for n in sizes])
    clients, _ = make_clients(dataset, seed)
    info = federation_info(clients, dataset, seed)
    state = algorithm.initial_state(info)
    for client in clients:
        algorithm.setup_client(client, info)
    return state, clients


def _ratios(algorithm: Any, broadcast: Message, replies: List[Any], clients: List[Any]) -> Dict[str, float]:
    """The largest ``|value| / bound`` per reply name over the clients' replies (each against its own domain)."""
    worst: Dict[str, float] = {}
    for client, reply in zip(clients, replies):
        assert isinstance(reply, Message), reply
        bound = algorithm.payload_bound(broadcast, DataDomain.of(*client.data))
        assert bound is not None and set(reply.arrays) | set(reply.metrics) <= set(bound)
        values = {**reply.arrays, **{k: np.asarray(v) for k, v in reply.metrics.items()}}
        for name, value in values.items():
            ratio = float(np.max(np.abs(value))) / bound[name]
            worst[name] = max(worst.get(name, 0.0), ratio)
    return worst


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("batched", [False, True])
def test_fgp_train_replies_and_their_log_likelihood_are_within_the_public_bound(seed, batched):
    """Real updates (per client and batched), round after round (each client's Adam state carried on), under honest
    and adversarial broadcasts (huge and tiny variances, long and short lengthscales): every value and the metric
    within its bound."""
    algorithm = _fgp(rounds=len(OFFSETS), local_steps=4, learning_rate=0.3)
    state, clients = _clients(algorithm, seed)
    worst: Dict[str, float] = {}
    for r, offsets in enumerate(OFFSETS):
        params = {k: np.asarray(v) + offsets.get(k, 0.0) for k, v in state.params.items()}
        broadcast = Message(SERVER, r, "train", params, weight=0.0)
        if batched:
            assert algorithm.batched("train")
            replies = algorithm.client_updates(clients, broadcast, 1 << 30)
        else:
            replies = [algorithm.client_update(c, broadcast) for c in clients]
        for name, ratio in _ratios(algorithm, broadcast, replies, clients).items():
            worst[name] = max(worst.get(name, 0.0), ratio)
    assert set(worst) == set(state.params) | {"log_likelihood"}
    assert max(worst.values()) <= 1.0, worst


def test_fgp_bound_at_a_later_round_and_the_experts_reply():
    """A round number the server chooses: a later round's bound is larger (more Adam steps taken), a negative one is no
    bound (the party refuses); the empty ``"experts"`` reply's bound is empty; no bound before the worker exists."""
    algorithm = _fgp()
    domain = DataDomain(10, (4.0,), (2.0,))
    assert algorithm.payload_bound(Message(SERVER, 0, "train", {"kernel.variance": np.array(0.5)}), domain) is None
    state, _ = _clients(algorithm, 0)
    bounds = [algorithm.payload_bound(Message(SERVER, r, "train", state.params), domain) for r in (0, 50, 10**6, -1)]
    key = "kernel.variance"
    assert bounds[0][key] < bounds[1][key] < bounds[2][key] < np.inf and bounds[3][key] == np.inf
    assert algorithm.payload_bound(Message(SERVER, 0, EXPERTS_PHASE, state.params), domain) == {}
    without = FGP(gpflow.kernels.SquaredExponential())  # no stopping rule: no metric, so no metric bound
    _clients(without, 0)
    assert set(without.payload_bound(Message(SERVER, 0, "train", state.params), domain)) == set(state.params)


def test_fgp_train_under_a_swept_lengthscale_is_refused_past_the_range_never_clipped():
    """Every party answers while its public bound (times its weight N_k) is within the range of the K members it
    masks over and refuses beyond (the refused lengthscales are the ones the public numbers give), and no answered sum
    holds a clipped entry."""
    algorithm, owner, runtime, ids = _federation(_fgp(rounds=len(SWEEP)), Protection())
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointSaturationWarning)
        refused, answered = sweep(algorithm, owner, ids, "kernel.lengthscales", SWEEP, "train")
    assert not owner.reducer.saturated
    domains = [endpoint.domain for endpoint in runtime.endpoints.values()]
    assert all(d.rows == N for d in domains) and len(domains) == K
    limit = FixedPoint(ClientPolicy().fractional_bits, K).range
    expected = []
    for r, lengthscale in enumerate(SWEEP):
        params = dict(algorithm.initial_state(owner.info).params)
        params["kernel.lengthscales"] = np.asarray(gpflow.utilities.positive().inverse(np.float64(lengthscale)))
        bound = algorithm.payload_bound(Message(SERVER, r, "train", params), domains[0])
        if max(bound.values()) * N > limit:
            expected.append(float(lengthscale))
    assert refused == expected and 0 < len(refused) < len(SWEEP)
    for lengthscale, aggregate in answered.items():  # the mean of the answered: the broadcast plus small moves
        assert abs(float(aggregate["kernel.lengthscales"]) - lengthscale) < 2.0


def test_control_without_the_bound_the_same_sweep_is_clipped(monkeypatch):
    """The test can fail: with no bound (the code before), the parties answer lengthscales past the range and their
    replies are clipped and counted (the attacker's slope changes)."""
    monkeypatch.setattr(FGP, "payload_bound", lambda self, broadcast, domain: None)
    algorithm, owner, _, ids = _federation(_fgp(rounds=len(SWEEP)), Protection())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FixedPointSaturationWarning)
        refused, _ = sweep(algorithm, owner, ids, "kernel.lengthscales", SWEEP, "train")
    assert owner.reducer.saturated and len(refused) < len(SWEEP)


# --- FedAvgNN -------------------------------------------------------------------------------------------------------
def _network(dtype: str):
    def build() -> tf_keras.Model:
        init = tf_keras.initializers.GlorotUniform(seed=3)
        return tf_keras.Sequential(
            [
                tf_keras.layers.Dense(8, activation="tanh", kernel_initializer=init, dtype=dtype),
                tf_keras.layers.Dense(1, kernel_initializer=init, dtype=dtype),
            ]
        )

    return build


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mu", [0.0, 10.0])
def test_fedavg_nn_train_replies_are_within_the_public_bound(dtype, mu):
    """FedAvg and FedProx (μ > 0), float64 and float32 networks, honest and scaled-up broadcasts, round after round:
    every weight within its bound (the loss metric has none: it is not sent under secure aggregation)."""
    algorithm = FedAvgNN(_network(dtype), rounds=6, local_steps=5, learning_rate=0.05, proximal_mu=mu)
    state, clients = _clients(algorithm, 4)
    worst = 0.0
    for r, scale in enumerate([1.0, 1.0, 1e3, 1e-3, 1.0, 30.0]):
        params = {k: np.asarray(v) * scale for k, v in state.values.items()}
        broadcast = Message(SERVER, r, "train", params, weight=0.0)
        for client in clients:
            reply = algorithm.client_update(client, broadcast)
            bound = algorithm.payload_bound(broadcast, DataDomain.of(*client.data))
            assert bound is not None and set(reply.arrays) == set(bound)
            worst = max(worst, *(float(np.max(np.abs(v))) / bound[k] for k, v in reply.arrays.items()))
    assert worst <= 1.0
    assert algorithm.payload_bound(Message(SERVER, 6, NOISE_PHASE, state.values), DataDomain(5, (4.0,), (4.0,))) is None


def test_fedavg_nn_bound_moves_with_the_round_and_the_float():
    """The bound is ``max |b| + δ(round)``, widened by the network float's round-off (more for float32)."""
    domain = DataDomain(5, (4.0,), (4.0,))
    bounds, values = {}, None
    for dtype in ("float64", "float32"):
        algorithm = FedAvgNN(_network(dtype), local_steps=5, learning_rate=0.05)
        state, _ = _clients(algorithm, 0)
        values = state.values if values is None else values  # one broadcast for both networks
        bounds[dtype] = algorithm.payload_bound(Message(SERVER, 0, "train", values), domain)
        later = algorithm.payload_bound(Message(SERVER, 40, "train", values), domain)
        assert set(later) == set(values) and all(later[k] > bounds[dtype][k] for k in later)
        for k, v in values.items():
            assert bounds[dtype][k] >= float(np.max(np.abs(v))) + 0.05  # at least the first step's lr
    assert all(bounds["float32"][k] > bounds["float64"][k] for k in values)

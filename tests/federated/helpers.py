"""Shared test doubles of the federated tests: toy algorithms, a crash-simulating monitor, the Flower factory.

Test modules import these from here, never from each other; fixtures are in ``conftest.py``.
"""

import time
from typing import Any, Mapping, Tuple

import gpflow
import numpy as np
import tensorflow as tf

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import Aggregate, Algorithm, register_algorithm_factory
from gpflow_fed.federated.algorithms import FSGP

#: the Flower factory every party (ServerApp, ClientApps) builds the algorithm from: registered on import, and
#: SuperNode processes import this module through ``GPFLOW_FED_ALGORITHM_MODULES=tests.federated.helpers``
FACTORY = "tests.federated.helpers:fsgp"


class ConstantGP(gpflow.models.GPModel):
    """A GP whose latent function is a known constant ± a fixed variance: enough to test the core."""

    def __init__(self, mean: float, variance: float) -> None:
        super().__init__(gpflow.kernels.Constant(), gpflow.likelihoods.Gaussian(1e-2), num_latent_gps=1)
        self.mean, self.variance = mean, variance

    def predict_f(self, Xnew, full_cov=False, full_output_cov=False):
        n = tf.shape(Xnew)[0]
        return (
            tf.fill([n, 1], tf.constant(self.mean, gpflow.default_float())),
            tf.fill([n, 1], tf.constant(self.variance, gpflow.default_float())),
        )

    def maximum_log_likelihood_objective(self, *args: Any, **kwargs: Any) -> tf.Tensor:
        return tf.constant(0.0, gpflow.default_float())


class FederatedMean(Algorithm):
    """Estimates the global mean of Y from sums; the per-round state records the running estimate."""

    name = "mean"

    def __init__(self, rounds: int, client_fraction: float = 1.0, fail_client: str = "") -> None:
        super().__init__(rounds, client_fraction)
        self.fail_client = fail_client

    def initial_state(self, info):
        return {"mean": 0.0, "seen": ()}

    def aggregation(self, phase):
        return "sum"

    def broadcast(self, state, round, phase):
        return {"mean": np.array(state["mean"])}

    def client_update(self, client, broadcast):
        if client.id == self.fail_client:
            raise RuntimeError("disk on fire")
        X, Y = client.data
        return self.reply(
            client,
            broadcast,
            {"sum_y": Y.sum(0), "n": np.array([len(Y)], float)},
            weight=len(Y),
            metrics={"local_mean": float(Y.mean())},
        )

    def server_update(self, state, aggregate: Aggregate):
        return {"mean": float(aggregate["sum_y"][0] / aggregate["n"][0]), "seen": state["seen"] + (aggregate.senders,)}

    def result(self, state):
        return ConstantGP(state["mean"], 1.0)

    def copy_state(self, state):
        return dict(state)


class Faulty(FederatedMean):
    """Client ``bad`` misbehaves in the way named by ``kind``."""

    def __init__(self, rounds, kind, bad=("client_1",), **kwargs):
        super().__init__(rounds, **kwargs)
        self.kind, self.bad = kind, bad

    def client_update(self, client, broadcast):
        reply = super().client_update(client, broadcast)
        if client.id not in self.bad:
            return reply
        if self.kind == "raise":
            raise RuntimeError("out of memory")
        if self.kind == "nan":
            return self.reply(client, broadcast, {"sum_y": np.array([np.nan]), "n": np.array([1.0])})
        if self.kind == "shape":
            return self.reply(client, broadcast, {"sum_y": np.zeros(3), "n": np.array([1.0])})
        if self.kind == "slow":
            time.sleep(0.3)
            return reply
        if self.kind == "not-a-message":
            return {"sum_y": 1.0}
        raise AssertionError(self.kind)


class WeightedMean(FederatedMean):
    """The same estimate through a 'mean' phase: Σ_k N_k ȳ_k / Σ_k N_k."""

    def aggregation(self, phase):
        return "mean"

    def client_update(self, client, broadcast):
        X, Y = client.data
        return self.reply(
            client, broadcast, {"mean_y": Y.mean(0)}, weight=len(Y), metrics={"local_mean": float(Y.mean())}
        )

    def server_update(self, state, aggregate):
        return {"mean": float(aggregate["mean_y"][0]), "seen": state["seen"] + (aggregate.senders,)}


class Stop(Exception):
    """Simulates a crash after a round (the checkpoint of that round is already written)."""


def stop_after(round_):
    def monitor(r, **kwargs):
        if r == round_:
            raise Stop

    return monitor


def flower_dataset(sizes: Tuple[int, ...] = (30, 45), seed: int = 0) -> FederatedDataset:
    """Two small parties with ``y = sin(x₁) cos(x₂) + noise`` and a held-out test set."""
    rng = np.random.default_rng(seed)
    N = sum(sizes)
    X = rng.uniform(-3, 3, (N + 15, 2))
    Y = np.sin(X[:, :1]) * np.cos(X[:, 1:]) + 0.1 * rng.normal(size=(N + 15, 1))
    cuts = np.cumsum((0,) + tuple(sizes))
    return FederatedDataset([(X[a:b], Y[a:b]) for a, b in zip(cuts, cuts[1:])], test=(X[N:], Y[N:]))


@register_algorithm_factory
def fsgp(run_config: Mapping[str, Any]) -> FSGP:
    """FSGP (fedavg) with ``rounds`` (default 2) and ``local-steps`` (default 5) from the run config."""
    Z = np.random.default_rng(1).uniform(-3, 3, (6, 2))
    kernel = gpflow.kernels.SquaredExponential(variance=1.0, lengthscales=[1.0, 1.0])
    return FSGP(
        kernel,
        Z,
        0.1,
        rounds=int(run_config.get("rounds", 2)),
        local_steps=int(run_config.get("local-steps", 5)),
        learning_rate=0.05,
        client_fraction=float(run_config.get("client-fraction", 1.0)),
    )


def secure_exchange(messages, protection, purpose="train", aggregation="sum"):
    """One secure exchange of ``messages`` (one per client, in cohort order) with every client's encoder and the
    protocol's server in this process: each encoder prepares its message, the server sets up and runs
    :meth:`SecAggServer.secure_sum`. Returns ``(masked vectors {client: uint64 [P]}, the secure sum, context)``."""
    from gpflow_fed.federated.protection.encoder import ClientEncoder
    from gpflow_fed.federated.protection.policy import ClientPolicy
    from gpflow_fed.randomness import new_run_id
    from gpflow_fed.federated.protection.reduction import ExchangeContext
    from gpflow_fed.federated.protection.secagg import SecAggServer

    from .protection.secagg_helpers import drive

    cohort = tuple(m.sender for m in messages)
    run_id = new_run_id()
    encoders = {c: ClientEncoder(c, ClientPolicy.matching(protection)) for c in cohort}
    prepared = [encoders[m.sender].prepare(m, protection, aggregation, len(cohort), purpose) for m in messages]
    size = sum(a.size for a in prepared[0].arrays.values())
    masked = {}

    def send(stage, requests):
        answers = {c: encoders[c].respond(stage, r) for c, r in requests.items()}
        if stage == "masked_input":
            masked.update({c: a["masked"] for c, a in answers.items()})
        return answers

    server = SecAggServer(run_id)
    drive(server.setup_stages(cohort), send)
    context = ExchangeContext(run_id, purpose, messages[0].round, messages[0].phase, aggregation, cohort)
    return masked, drive(server.secure_sum_stages(context.exchange, size), send), context

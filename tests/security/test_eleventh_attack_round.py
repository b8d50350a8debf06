"""Issue 43 (eleventh round): one question asked twice under two names, and an answer linear in the server's matrix.

* **FSGP statistics as predict**: exact mode's ``"statistics"`` (training) and ``"predict"`` (final, evaluation)
  phases compute the same statistics of the same parameters, but the broadcast digest a client answers once under
  masking hashed the phase's *name*. A server asked the same θ as ``"statistics"`` over all 8 clients and as
  ``"predict"`` over the 7 others, and had the eighth client's statistics to 1e-10 from the difference. The digest now
  hashes ``Algorithm.computation(phase)`` (FSGP: ``"predict"`` computes ``"statistics"``), so the second request is
  the same broadcast over another cohort: refused. An honest run never asks it: a mid-training evaluation in exact
  mode asks nothing (``Algorithm.evaluation_phases() == ()``) and reports the model from the statistics round r summed
  at θ_r.
* **FedBNR two-step weights**: ``w_c = A⁻¹Φ_cᵀy_c`` (σ⁻² is the server's) is exactly linear in the server's
  ``A⁻¹``; ``I`` over all 8 clients and ``2I`` over the 7 others gave the eighth client's ``Φ_cᵀy_c`` to 1e-10. A
  client now answers ``"weights"`` once per state of its features (the kernel values of its last ``"scatter"``
  answer), recorded in its own ``client.state`` (saved by checkpoints and a Flower party's state):
  another ``A⁻¹`` for the same features is refused, the same again is a retry.

The honest parties are the package's :class:`ClientEndpoint` and :class:`ClientEncoder` under the default policy
(``ClientPolicy.matching`` of the default :class:`Protection`, secure aggregation), driven through ``LocalRuntime``;
the malicious server drives the package's :class:`PhaseOwner` itself.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, List, Tuple

import gpflow
import numpy as np
import pytest

from gpflow_fed.data.dataset import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms import FSGP, FedBNR
from gpflow_fed.federated.algorithms.fedbnr import SCATTER_VALUES, WEIGHTS_ANSWERED
from gpflow_fed.federated.engine.endpoint import ClientEndpoint
from gpflow_fed.federated.engine.exchange import PhaseOwner
from gpflow_fed.federated.engine.loop import set_up_run
from gpflow_fed.federated.engine.options import RunOptions
from gpflow_fed.federated.protection.distributed_dp import DistributedDP
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protection.identity import PartyIdentity
from gpflow_fed.federated.protection.policy import ClientPolicy
from gpflow_fed.federated.protection.request import Protection
from gpflow_fed.federated.protection.wire import broadcast_digest
from gpflow_fed.federated.protocol.faults import ClientUpdateError, RoundFailedError
from gpflow_fed.federated.protocol.ledger import Channel, CommunicationLedger
from gpflow_fed.federated.protocol.messages import SERVER, Message
from gpflow_fed.federated.runtimes.base import federation_info, make_clients
from gpflow_fed.federated.runtimes.local import LocalRuntime
from gpflow_fed.kernels.urk import URK

K, N = 8, 12
REFUSED = (ClientUpdateError, RoundFailedError)


def _dataset(seed: int = 1, test: bool = False) -> FederatedDataset:
    rng = np.random.default_rng(seed)
    parts = [(rng.uniform(-2, 2, (N, 1)), rng.normal(size=(N, 1))) for _ in range(K)]
    if not test:
        return FederatedDataset(parts)
    X = np.linspace(-2, 2, 25)[:, None]
    return FederatedDataset(parts, test=(X, np.sin(X)))


def _fsgp(rounds: int = 5) -> FSGP:
    Z = np.linspace(-2, 2, 5)[:, None]
    return FSGP(
        gpflow.kernels.SquaredExponential(), gpflow.inducing_variables.InducingPoints(Z), mode="exact", rounds=rounds
    )


def _federation(algorithm: Any, protection: Protection) -> Tuple[Any, PhaseOwner, LocalRuntime, List[str]]:
    """The run's bound algorithm, the malicious server's phase owner, the runtime holding the honest parties (each
    its own ClientEndpoint and ClientEncoder under the policy ``execute`` gives it), and the client ids."""
    dataset = _dataset()
    runtime = LocalRuntime(protection=protection)
    clients, _ = make_clients(dataset, 0)
    info = federation_info(clients, dataset, 0)
    setup = set_up_run(algorithm, info, dataset, RunOptions(), protection)
    policy = ClientPolicy.matching(protection)
    identities = PartyIdentity.federation([c.id for c in clients])
    runtime.endpoints = {
        c.id: ClientEndpoint(setup.algorithm, c, info, ClientEncoder(c.id, policy, identity=identities[c.id]))
        for c in clients
    }
    runtime.prepare(setup.algorithm, dataset, setup.reducer)
    owner = PhaseOwner(
        setup.algorithm, runtime, setup.reducer, Channel(CommunicationLedger()), RunOptions().faults, info
    )
    return setup.algorithm, owner, runtime, list(info.client_ids)


# --- FSGP: "statistics" asked again as "predict" ----------------------------------------------------------------------
def test_fsgp_statistics_asked_again_as_predict_over_the_others_is_refused():
    """The attack of ``/tmp/attack43h/fsgp_stats_vs_predict.py``: statistics at θ_0 over all 8, then predict at the
    same θ_0 over the 7 others. Before the fix the second sum was answered and its difference was the victim's
    statistics to 1e-10; now every party refuses it (the same computation over another cohort)."""
    algorithm, owner, _, ids = _federation(_fsgp(), Protection())
    state = algorithm.initial_state(owner.info)
    owner.run(state, 0, "statistics", ids, "train")
    with pytest.raises(REFUSED, match="refused"):
        owner.run(state, 0, "predict", ids[:-1], "evaluate")


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_control_fsgp_predict_and_statistics_are_one_question():
    """The control: the same θ asked as ``"predict"`` over the *same* cohort is answered (a retry of one question,
    nothing new), and its sum is the statistics' sum; the digest both sides bind is the computation's, not the
    phase's (before the fix the two digests differed, so the smaller cohort was a new question)."""
    algorithm, owner, _, ids = _federation(_fsgp(), Protection())
    state = algorithm.initial_state(owner.info)
    _, statistics, _ = owner.run(state, 0, "statistics", ids, "train")
    _, predict, excluded = owner.run(state, 0, "predict", ids, "evaluate")
    assert not excluded and len(predict.senders) == K
    for name in statistics.arrays:
        np.testing.assert_allclose(predict[name], statistics[name], rtol=0, atol=1e-9)
    down = {
        p: algorithm.read_broadcast(Message(SERVER, 0, p, algorithm.broadcast(state, 0, p)))
        for p in ("statistics", "predict")
    }
    digests = {p: broadcast_digest(m, computation=algorithm.computation(p)) for p, m in down.items()}
    assert digests["statistics"] == digests["predict"]
    assert broadcast_digest(down["statistics"]) != broadcast_digest(down["predict"])  # the phase names differ
    assert algorithm.computation("gradient") == "gradient" and algorithm.computation("predict") == "statistics"


@pytest.mark.parametrize(
    "protection",
    [
        Protection(),
        Protection(differential_privacy=DistributedDP(noise_multiplier=0.01, clip_norm=100.0, honest_clients=4)),
    ],
    ids=["secure-aggregation", "distributed-dp"],
)
def test_an_honest_fsgp_exact_run_with_evaluation_every_round_completes(protection):
    """``eval_every=1``: before, the evaluation after round r asked ``"predict"`` at θ_{r+1} and round r+1's
    ``"statistics"`` asked θ_{r+1} again, which the computation-keyed digest refuses (another masking graph; always
    under distributed DP). Exact mode now evaluates from the statistics it holds: no evaluation exchange at all, the
    final ``"predict"`` once, and every round has its test metrics."""
    with warnings.catch_warnings():  # DP's utility warnings on a run this small
        warnings.simplefilter("ignore")
        result = run(
            _fsgp(rounds=3),
            _dataset(test=True),
            runtime=LocalRuntime(options=RunOptions(eval_every=1)),
            protection=protection,
        )
    assert not result.ledger.select(purpose="evaluate")
    assert {e.phase.split("/")[0] for e in result.ledger.select(purpose="final", direction="up")} == {"predict"}
    assert len(result.history) == 3 and all(np.isfinite(h["test_rmse"]) for h in result.history)
    assert not any("excluded" in key for h in result.history for key in h)


def test_a_mid_training_evaluation_in_exact_mode_reports_the_model_at_theta_r():
    """The evaluation after round r is the model at θ_r (round r's statistics, one server step behind): the same as
    the final model of a run of r rounds (its final ``"predict"`` at θ_r), up to the fixed-point sums."""
    dataset = _dataset(test=True)
    evaluated = run(_fsgp(rounds=3), dataset, runtime=LocalRuntime(options=RunOptions(eval_every=1)))
    for r in (0, 1):  # round 2's evaluation is the final exchange, at θ_3
        shorter = run(_fsgp(rounds=r), dataset)
        assert evaluated.history[r]["test_rmse"] == pytest.approx(shorter.metrics["test_rmse"], rel=1e-6)
    assert evaluated.history[-1]["test_rmse"] == pytest.approx(evaluated.metrics["test_rmse"], rel=1e-12)


# --- FedBNR: "weights" linear in A⁻¹ -------------------------------------------------------------------------------
def _fedbnr(rounds: int = 2) -> FedBNR:
    return FedBNR(URK(1, num_samples=6, seed=3), rounds=rounds, protocol="two_step")


def test_fedbnr_weights_asked_with_a_scaled_a_inverse_over_the_others_is_refused():
    """The attack of ``/tmp/attack43h/fedbnr_weights_linear.py``: an honest scatter, then ``A⁻¹ = I`` over all 8 and
    ``2I`` over the 7 others. Before the fix both were answered and ``w(I) − w(2I)/2`` was the victim's ``Φᵀy/σ²``
    to 1e-10; now every party refuses the second (the same features, another ``A⁻¹``)."""
    algorithm, owner, _, ids = _federation(_fedbnr(), Protection())
    state, _, _ = owner.run(algorithm.initial_state(owner.info), 0, "scatter", ids, "evaluate")
    M = state.a_inverse.shape[0]
    owner.run(dataclasses.replace(state, a_inverse=np.eye(M)), 0, "weights", ids, "evaluate")
    with pytest.raises(REFUSED, match="answered 'weights' here already"):
        owner.run(dataclasses.replace(state, a_inverse=2 * np.eye(M)), 1, "weights", ids[:-1], "evaluate")


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_fedbnr_weights_do_not_read_the_partys_noise_variance():
    """σ² is the server's, applied to the sum by the server: a server that steered the parties' σ² (a ``"kernel"``
    broadcast sets the worker's copy, which the scatter answer keeps) to 2σ² and asked ``2I`` would, were the answer
    ``A⁻¹Φᵀy/σ²``, get the answer to ``I`` again, now over the 7 others. The same ``A⁻¹`` after the steering is
    answered with the same sum, and ``2I`` is refused."""
    algorithm, owner, runtime, ids = _federation(_fedbnr(), Protection())
    state, _, _ = owner.run(algorithm.initial_state(owner.info), 0, "scatter", ids, "evaluate")
    M = state.a_inverse.shape[0]
    _, first, _ = owner.run(dataclasses.replace(state, a_inverse=np.eye(M)), 0, "weights", ids, "evaluate")
    model = algorithm._worker.get().model  # the parties' shared worker in this process
    for endpoint in runtime.endpoints.values():  # what a kernel round with the server's 2σ² leaves on each party
        algorithm.shared.assign(model, dict(endpoint.client.state[SCATTER_VALUES]))
        model.likelihood.variance.assign(2 * model.likelihood.variance.numpy())
        endpoint.client.state[SCATTER_VALUES] = algorithm.shared.read(model)
    _, again, _ = owner.run(dataclasses.replace(state, a_inverse=np.eye(M)), 1, "weights", ids, "evaluate")
    np.testing.assert_allclose(again["w_mean"], first["w_mean"], rtol=0, atol=1e-9)
    with pytest.raises(REFUSED, match="answered 'weights' here already"):
        owner.run(dataclasses.replace(state, a_inverse=2 * np.eye(M)), 2, "weights", ids[:-1], "evaluate")


def test_fedbnr_two_step_gives_the_one_step_protocols_model_after_training():
    """The two protocols sum the same statistics (eqs. 3.5–3.6): after phase 1's rounds, whose local training leaves
    each party's σ² its own, the two-step model predicts as the one-step one. Before σ⁻² moved to the server each
    party divided by its own σ² and the server multiplied by the global one (a predicted mean 0.043 apart)."""
    dataset = _dataset(test=True)
    plain = LocalRuntime(protection=Protection(secure_aggregation=False))
    one = run(FedBNR(URK(1, num_samples=6, seed=3), rounds=2, protocol="statistics"), dataset, runtime=plain)
    plain = LocalRuntime(protection=Protection(secure_aggregation=False))
    two = run(_fedbnr(rounds=2), dataset, runtime=plain)
    Xs = np.linspace(-2, 2, 7)[:, None]
    for a, b in zip(one.model.predict_f(Xs), two.model.predict_f(Xs)):
        np.testing.assert_allclose(b.numpy(), a.numpy(), rtol=1e-9, atol=1e-9)


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_control_fedbnr_weights_asked_again_with_the_same_a_inverse_is_answered():
    """The control: the same ``A⁻¹`` again (a retry, over the same cohort) is answered, with the same sum."""
    algorithm, owner, _, ids = _federation(_fedbnr(), Protection())
    state, _, _ = owner.run(algorithm.initial_state(owner.info), 0, "scatter", ids, "evaluate")
    _, first, _ = owner.run(state, 0, "weights", ids, "evaluate")
    _, again, excluded = owner.run(state, 1, "weights", ids, "evaluate")
    assert not excluded
    np.testing.assert_allclose(again["w_mean"], first["w_mean"], rtol=0, atol=1e-9)


def test_fedbnr_weights_record_survives_a_flower_party_restart(tmp_path):
    """A Flower party that answers one message and exits saves its ``client.state`` and restores it for the next:
    the record of the ``A⁻¹`` it answered survives, so the restarted party still refuses another one."""
    pytest.importorskip("flwr")
    from gpflow_fed.federated.runtimes.flower.client_app import _restore_client, _save_client

    algorithm, owner, runtime, ids = _federation(_fedbnr(), Protection())
    state, _, _ = owner.run(algorithm.initial_state(owner.info), 0, "scatter", ids, "evaluate")
    M = state.a_inverse.shape[0]
    owner.run(dataclasses.replace(state, a_inverse=np.eye(M)), 0, "weights", ids, "evaluate")
    for cid, endpoint in runtime.endpoints.items():
        old = endpoint.client
        _save_client(str(tmp_path / cid), old)
        fresh = type(old)(old.id, old.data, 0)
        algorithm.setup_client(fresh, owner.info)
        assert _restore_client(str(tmp_path / cid), fresh)
        assert fresh.state[WEIGHTS_ANSWERED] == old.state[WEIGHTS_ANSWERED]
        endpoint.client = fresh
    with pytest.raises(REFUSED, match="answered 'weights' here already"):
        owner.run(dataclasses.replace(state, a_inverse=2 * np.eye(M)), 1, "weights", ids[:-1], "evaluate")


def test_an_honest_fedbnr_two_step_run_with_evaluation_every_round_completes():
    """Each evaluation asks ``"weights"`` for the kernel of its round (a new state of the features), so the record
    never refuses an honest run: one answer per evaluation and one final, all recorded."""
    runtime = LocalRuntime(options=RunOptions(eval_every=1))
    result = run(_fedbnr(rounds=3), _dataset(test=True), runtime=runtime)
    assert len(result.history) == 3 and all(np.isfinite(h["test_rmse"]) for h in result.history)
    masked = "weights/secagg/masked_input"  # one masked input per party and exchange
    assert len(result.ledger.select(purpose="evaluate", phase=masked, direction="up")) == 2 * K
    assert len(result.ledger.select(purpose="final", phase=masked, direction="up")) == K
    assert not any("excluded" in key for h in result.history for key in h)
    answered = [len(e.client.state[WEIGHTS_ANSWERED]) for e in runtime.endpoints.values()]
    assert answered == [3] * K

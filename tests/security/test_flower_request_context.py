"""A deviating Flower server against parties' deployment ClientApps: what a request carries beside its update.

A fifth fresh-context attack sent one broadcast under one protection request to every party, but other "agreed
moments" in the job record: identity to the victim, a scale of 1e300 to everyone else, whose standardised rows then
encode to zero, so the unmasked total was the victim's own sums. Each party now binds the request's context (the
federation and the job record, ``records.request_context``) into its request view, as the server binds what it sent.
"""

import numpy as np
import pytest

pytest.importorskip("flwr")

from gpflow_fed.data import FederatedDataset  # noqa: E402
from gpflow_fed.data.standardize import Standardizer  # noqa: E402
from gpflow_fed.federated import Protection  # noqa: E402
from gpflow_fed.federated.algorithms import Moments  # noqa: E402
from gpflow_fed.federated.algorithms.moments import MOMENTS_PHASE  # noqa: E402
from flwr.app import MessageType  # noqa: E402
from gpflow_fed.federated.runtimes.flower import runtime as flower_runtime  # noqa: E402
from gpflow_fed.federated.runtimes.flower import server_app  # noqa: E402
from gpflow_fed.federated.runtimes.flower import transport as flower_transport  # noqa: E402
from gpflow_fed.federated.protocol.messages import SERVER, Message  # noqa: E402
from gpflow_fed.federated.runtimes.flower.records import (  # noqa: E402
    JOB,
    job_to_config,
    request_context,
    request_to_recorddict,
)
from gpflow_fed.federated.protocol.transport import Request  # noqa: E402

VICTIM = (np.array([[1971.25], [1999.5]]), np.array([[12.5], [88.0]]))


def _scaled(scale: float) -> Standardizer:
    return Standardizer(X_mean=np.zeros(1), X_std=np.array([scale]), Y_mean=np.zeros(1), Y_std=np.array([scale]))


def _run_with_moments_per_party(monkeypatch, moments_of, server_moments, prime_of=None):
    """Moments over the victim and two parties (in-process Flower: each party's endpoint lives between messages),
    each party shown ``moments_of(client id)`` in its job record; the server's transport binds ``server_moments``.
    ``prime_of``: first send each party one message of an unknown stage with ``prime_of(client id)`` as its moments.
    Returns the masked sums of the moments phase, or None when the run stopped before them."""

    class Deviating(server_app.GridTransport):
        primed = prime_of is None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.context = request_context(self.info, self.job, server_moments)

        def send(self, requests):
            if not Deviating.primed:
                Deviating.primed = True
                primes = []
                for cid, node in self.node_of.items():
                    content = request_to_recorddict(
                        Request("prime", Message(SERVER, 0, "none", {}), "train", {}), self.info
                    )
                    content[JOB] = job_to_config("train", prime_of(cid))
                    primes.append(flower_transport.instruction(content, MessageType.TRAIN, node, "prime"))
                self.grid.send_and_receive(primes)
            create = flower_transport.instruction  # how the server's transport makes each party's message
            client_of = {node: cid for cid, node in self.node_of.items()}

            def per_party(content, message_type, node, group, *rest):
                content[JOB] = job_to_config("train", moments_of(client_of[node]))
                return create(content, message_type, node, group, *rest)

            flower_transport.instruction = per_party
            try:
                return super().send(requests)
            finally:
                flower_transport.instruction = create

    sums = {}

    def capture(self, state, aggregate):
        sums.setdefault(aggregate.phase, (dict(aggregate.arrays), np.asarray(state.scale)))
        return None

    monkeypatch.setattr(server_app, "GridTransport", Deviating)
    monkeypatch.setattr(Moments, "check_sum", capture)
    rng = np.random.default_rng(5)
    parties = [VICTIM] + [(rng.uniform(1900, 2020, (3, 1)), rng.normal(50, 10, (3, 1))) for _ in range(2)]
    runtime = flower_runtime.FlowerRuntime(protection=Protection())
    try:
        runtime.execute(Moments(), FederatedDataset(parties), protection=Protection())
    except Exception:  # noqa: BLE001 - the attack may end the run; what matters is what the server unmasked
        pass
    return sums.get(MOMENTS_PHASE)


def _victims_rows(sums):
    arrays, scale = sums
    total = np.asarray(arrays["sum"]) / scale
    squares = np.asarray(arrays["sum_squares"]) / scale**2
    spread = np.sqrt(np.maximum(squares / 2 - (total / 2) ** 2, 0.0))
    return np.stack([total / 2 - spread, total / 2 + spread])


def test_parties_shown_other_moments_than_the_others_unmask_noise(monkeypatch):
    identity, huge = _scaled(1.0), _scaled(1e300)
    sums = _run_with_moments_per_party(monkeypatch, lambda cid: identity if cid == "client_0" else huge, identity)
    if sums is not None:
        assert not np.allclose(_victims_rows(sums), np.concatenate(VICTIM, 1), rtol=1e-3)


def test_a_first_message_with_other_moments_does_not_standardise_later_answers(monkeypatch):
    """The sixth attack: a priming message (an unknown stage) built each party's live endpoint on per-party moments,
    then the run carried one honest job record, so every view matched while the others' rows encoded to zero. Each
    party answers a job under the context it was first shown; the honest run that follows is refused."""
    identity, huge = _scaled(1.0), _scaled(1e300)
    sums = _run_with_moments_per_party(
        monkeypatch, lambda cid: None, None, prime_of=lambda cid: identity if cid == "client_0" else huge
    )
    if sums is not None:
        assert not np.allclose(_victims_rows(sums), np.concatenate(VICTIM, 1), rtol=1e-3)


@pytest.mark.usefixtures("nearest_rounding")  # sums compared exactly: rounding to nearest
def test_control_the_same_moments_for_every_party_sum_exactly(monkeypatch):
    identity = _scaled(1.0)
    sums = _run_with_moments_per_party(monkeypatch, lambda cid: identity, identity)
    arrays, scale = sums
    assert float(np.asarray(arrays["count"])[0]) == 8.0  # every party's rows, as registered


def test_the_moments_job_refuses_moments():
    from flwr.app import RecordDict

    from gpflow_fed.federated.protocol.algorithm import FederationInfo
    from gpflow_fed.federated.runtimes.flower.records import MOMENTS_JOB, recorddict_to_job

    info = FederationInfo(("client_0", "client_1"), {"client_0": 2, "client_1": 3}, 1, 1, 0)
    content = RecordDict({JOB: job_to_config(MOMENTS_JOB, _scaled(1.0))})
    with pytest.raises(ValueError, match="carries no moments"):
        recorddict_to_job(content, info)


def test_a_deployed_party_answers_a_job_under_the_moments_it_was_first_shown(tmp_path):
    """A deployment's ClientApp (rebuilt for every message) keeps the first context per job in ``Context.state``: a
    request of the same job under other moments is refused before anything is computed; the same one is not."""
    from gpflow_fed.federated.runtimes.flower.client_app import make_client_app
    from gpflow_fed.federated.runtimes.flower.records import MOMENTS_JOB, TRAIN_JOB
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
    from gpflow_fed.federated.protocol.algorithm import FederationInfo

    np.savez(tmp_path / "c0.npz", X=VICTIM[0], Y=VICTIM[1])
    node = {
        "data": str(tmp_path / "c0.npz"),
        "client-index": 0,
        "state-dir": str(tmp_path / "state"),
        "no-roster": True,
    }
    run_config = {"algorithm": "context-pin"}
    grid = LoopbackGrid(make_client_app(job_algorithm=lambda job, config: Moments()), [node], run_config, run_id=5)
    info = FederationInfo(("client_0", "client_1"), {"client_0": 2, "client_1": 3}, 1, 1, 0)

    def fault(job, moments):
        content = request_to_recorddict(Request("unknown", Message(SERVER, 0, "none", {}), "train", {}), info)
        content[JOB] = job_to_config(job, moments)
        (reply,) = grid.send_and_receive([flower_transport.instruction(content, MessageType.TRAIN, 1001, "g")])
        return str(reply.content["response"]["fault"])

    assert "unknown stage" in fault(TRAIN_JOB, _scaled(1.0))
    assert "first shown" in fault(TRAIN_JOB, _scaled(2.0))
    assert "unknown stage" in fault(TRAIN_JOB, _scaled(1.0))
    assert "unknown stage" in fault(MOMENTS_JOB, None)  # another job has its own context


def test_a_live_partys_jobs_share_one_encoder(tmp_path):
    """In process (parties live between messages) the moments job and the training job of one party use one encoder,
    so one data-dependent refusal stops the party for the whole run, not per job (the seventh attack's note)."""
    from gpflow_fed.federated.protocol.algorithm import FederationInfo
    from gpflow_fed.federated.runtimes.flower.client_app import ClientHost
    from gpflow_fed.federated.runtimes.flower.records import MOMENTS_JOB, TRAIN_JOB
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid

    np.savez(tmp_path / "c0.npz", X=VICTIM[0], Y=VICTIM[1])
    node = {
        "data": str(tmp_path / "c0.npz"),
        "client-index": 0,
        "state-dir": str(tmp_path / "state"),
        "no-roster": True,
    }
    host = ClientHost(keep_alive=True, job_algorithm=lambda job, config: Moments())
    grid = LoopbackGrid(host.app(), [node], {"algorithm": "shared-encoder"}, run_id=6)
    info = FederationInfo(("client_0", "client_1"), {"client_0": 2, "client_1": 3}, 1, 1, 0)
    for job in (MOMENTS_JOB, TRAIN_JOB):
        content = request_to_recorddict(Request("unknown", Message(SERVER, 0, "none", {}), "train", {}), info)
        content[JOB] = job_to_config(job, None)
        grid.send_and_receive([flower_transport.instruction(content, MessageType.TRAIN, 1001, "g")])
    moments, train = host.live[(6, 1001, MOMENTS_JOB)], host.live[(6, 1001, TRAIN_JOB)]
    assert moments is not train and moments.encoder is train.encoder

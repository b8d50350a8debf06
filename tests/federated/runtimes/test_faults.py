"""Client faults under LocalRuntime: raise by default, exclude with a logged reason, or fail the round."""

import logging
import time

import pytest

from gpflow_fed.federated import (
    ClientUpdateError,
    FaultPolicy,
    LocalRuntime,
    Protection,
    RoundFailedError,
    RunOptions,
    run,
)

from tests.federated.helpers import FederatedMean, Faulty

#: runs and runtimes compared bit for bit: the fixed point rounds to nearest (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("nearest_rounding")


def _expected_mean(ds, bad):
    keep = [k for k in range(ds.num_clients) if f"client_{k}" not in bad]
    return sum(ds.clients[k][1].sum() for k in keep) / sum(ds.client_sizes[k] for k in keep)


@pytest.mark.parametrize(
    "kind, reason",
    [
        # on a protected phase (the default) an error may depend on the data: one generic refusal, then none
        # (tests/security/test_client_schedule.py); a NaN is encoded and counted there
        # (tests/security/test_fixed_point_range.py), so it is the server's to exclude in plain
        ("raise", "answers no protected exchange again in this run"),
        ("nan", "has NaN or inf values"),
        ("shape", "payload shapes differ"),
        ("not-a-message", "not a Message"),
    ],
)
def test_faulty_client_is_excluded_with_its_reason(dataset, kind, reason, caplog):  # noqa: F811
    plain = Protection(secure_aggregation=False) if kind == "nan" else None
    runtime = LocalRuntime(options=RunOptions(faults=FaultPolicy(on_error="exclude", timeout=0.2)), protection=plain)
    with caplog.at_level(logging.WARNING, logger="gpflow_fed.federated"):
        result = run(Faulty(2, kind), dataset, runtime=runtime)
    assert result.state["mean"] == pytest.approx(_expected_mean(dataset, ("client_1",)), rel=1e-12)
    for entry in result.history:
        assert entry["clients"] == 3 and reason in entry["excluded"]["client_1"]
    assert any("client_1" in r.getMessage() and reason in r.getMessage() for r in caplog.records)


def test_timeout_spares_the_first_update_and_excludes_later_slow_answers(dataset):  # noqa: F811
    """A first update (set-up, one-off tracing) is not timed; a client slow in later rounds is excluded."""

    class SlowStart(FederatedMean):
        def setup_client(self, client, state):
            time.sleep(0.3)  # longer than the timeout, and not part of any update

        def client_update(self, client, broadcast):
            if client.id == "client_1" and (broadcast.round == 0 or client.id in self.bad):
                time.sleep(0.3)
            return super().client_update(client, broadcast)

    healthy = SlowStart(3)
    healthy.bad = ()
    runtime = LocalRuntime(options=RunOptions(faults=FaultPolicy(on_error="exclude", timeout=0.2)))
    assert all("excluded" not in entry for entry in run(healthy, dataset, runtime=runtime).history)
    slow = SlowStart(3)
    slow.bad = ("client_1",)
    history = run(slow, dataset, runtime=runtime).history
    assert "excluded" not in history[0]
    assert all("timed out" in entry["excluded"]["client_1"] for entry in history[1:])


@pytest.mark.parametrize("kind", ["raise", "nan", "shape"])
def test_default_policy_raises_naming_the_client(dataset, kind):  # noqa: F811
    with pytest.raises(ClientUpdateError, match="client_1"):
        run(Faulty(1, kind), dataset)


def test_too_few_good_clients_fails_the_round(dataset):  # noqa: F811
    runtime = LocalRuntime(options=RunOptions(faults=FaultPolicy(on_error="exclude", min_clients=3)))
    with pytest.raises(RoundFailedError, match="2 of 4 clients.*min_clients=3"):
        run(Faulty(1, "raise", bad=("client_0", "client_3")), dataset, runtime=runtime)


def test_excluded_client_is_dropped_from_later_phases(dataset):  # noqa: F811
    class TwoPhase(Faulty):
        def phases(self, round):
            return ("first", "second")

        def client_update(self, client, broadcast):
            if broadcast.phase == "second":
                return FederatedMean.client_update(self, client, broadcast)
            return super().client_update(client, broadcast)

    runtime = LocalRuntime(options=RunOptions(faults=FaultPolicy(on_error="exclude"), keep_payloads=True))
    result = run(TwoPhase(1, "raise"), dataset, runtime=runtime)
    # under the secure default the clients' part in a phase is its secure-aggregation stages ("second/secagg/…")
    second = {e.sender for e in result.ledger.entries if e.phase.startswith("second/") and e.sender != "server"}
    assert second == {"client_0", "client_2", "client_3"}


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"on_error": "ignore"}, "on_error"),
        ({"min_clients": 0}, "min_clients"),
        ({"timeout": -1.0}, "timeout"),
    ],
)
def test_fault_policy_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FaultPolicy(**kwargs)

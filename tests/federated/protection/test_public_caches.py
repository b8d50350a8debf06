"""Per-process caches of public values (issue 43): the survivors' groups of an unmask request and the members digest
of a cohort are computed once for the K in-process clients of a simulation, equal the uncached computation, and never
serve another cohort or drop-out set; every client still checks and refuses what it did."""

from typing import Any, Dict

import pytest

from gpflow_fed.federated.protection import secagg
import hashlib

from gpflow_fed.federated.protection import identity
from gpflow_fed.federated.protection.identity import members_digest
from gpflow_fed.federated.protection.masking import masking_graph
from gpflow_fed.federated.protection.secagg import (
    SecAggRefused,
    _survivor_components,
    components,
    default_degree,
    members_bitmap,
)
from tests.federated.protection.secagg_helpers import Net

K = 16


def _request(net: Net, cohort: Any, dropped: Any) -> Dict[str, Any]:
    """An unmask-shaped request over ``cohort`` with ``dropped`` named as drop-outs."""
    exchange = net.exchange(0, cohort=list(cohort))
    return {**net.fields(exchange), "dropped": members_bitmap(net.ids, dropped)}


def _uncached(net: Net, cohort: Any, dropped: Any) -> set:
    exchange = net.exchange(0, cohort=list(cohort))
    graph = masking_graph(exchange, default_degree(len(exchange.cohort)))
    return set(components(graph, exchange.members - set(dropped)))


def test_survivor_groups_equal_the_uncached_components_and_are_computed_once_for_all_clients(monkeypatch):
    net = Net(K)
    net.setup()
    cohort, dropped = net.ids, net.ids[:5]
    expected = _uncached(net, cohort, dropped)
    assert len(expected) >= 1 and frozenset().union(*expected) == set(cohort) - set(dropped)
    calls = []
    original = secagg.components
    monkeypatch.setattr(secagg, "components", lambda *a: calls.append(1) or original(*a))
    _survivor_components.cache_clear()
    request = _request(net, cohort, dropped)
    for client in net.clients.values():  # each of the K clients asks: one computation between them
        assert set(client.survivor_groups(request)) == expected
    assert len(calls) == 1
    groups = net.clients[net.ids[0]].survivor_groups(request)
    groups.clear()  # a caller's list is its own: the cached value is untouched
    assert set(net.clients[net.ids[1]].survivor_groups(request)) == expected


def test_another_cohort_or_drop_out_set_is_not_served_from_a_stale_entry():
    net = Net(K)
    net.setup()
    client = net.clients[net.ids[0]]
    _survivor_components.cache_clear()
    first = _request(net, net.ids, net.ids[1:4])
    assert set(client.survivor_groups(first)) == _uncached(net, net.ids, net.ids[1:4])
    other_dropped = _request(net, net.ids, net.ids[1:8])
    assert set(client.survivor_groups(other_dropped)) == _uncached(net, net.ids, net.ids[1:8])
    smaller = net.ids[:12]
    other_cohort = _request(net, smaller, net.ids[1:4])
    assert set(client.survivor_groups(other_cohort)) == _uncached(net, smaller, net.ids[1:4])
    assert frozenset().union(*client.survivor_groups(other_cohort)) == set(smaller) - set(net.ids[1:4])


def test_a_client_still_refuses_after_the_public_value_is_cached():
    net = Net(K)
    net.setup()
    client = net.clients[net.ids[0]]
    good = _request(net, net.ids, net.ids[1:3])
    client.survivor_groups(good)  # cached now
    with pytest.raises(SecAggRefused, match="malformed request"):
        client.survivor_groups({**good, "dropped": good["dropped"] + b"\x00"})
    with pytest.raises(SecAggRefused, match="another run"):
        client.survivor_groups({**good, "run_id": bytes(len(net.run_id))})


def test_the_cached_members_digest_equals_the_uncached_one_per_set():
    """The digest, computed once per set and process, is the documented SHA-256 of the sorted, length-prefixed ids:
    the same for any iterable of the same ids, another for another set."""
    from gpflow_fed.federated.protection.masking import length_prefixed

    def uncached(ids):
        parts = [length_prefixed(identity._MEMBERS_DOMAIN), *(length_prefixed(c.encode()) for c in sorted(ids))]
        return hashlib.sha256(b"".join(parts)).digest()

    identity._members_digest.cache_clear()
    a, b = frozenset(f"client_{k:02d}" for k in range(10)), frozenset(f"client_{k:02d}" for k in range(9))
    for _ in range(3):
        assert members_digest(a) == members_digest(list(a)) == uncached(a) != members_digest(b) == uncached(b)
    assert members_digest(set()) == uncached(())
    assert identity._members_digest.cache_info().misses == 3  # a, b and the empty set: each computed once

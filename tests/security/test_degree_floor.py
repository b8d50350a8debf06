"""The protocol's shape from the client (issue 43, attack 3): a server that asks for a sparser masking graph (degree 2
for a cohort of 16, where the protocol's degree is 8) could grind cohorts until its colluders are a victim's only
neighbours; each client computes its own floor from the cohort it verified and refuses a request below it."""

import pytest

from gpflow_fed.federated import ClientPolicy
from gpflow_fed.federated.protection.secagg import SecAggAborted, SecAggClient, default_degree
from tests.federated.protection.secagg_helpers import Net


def test_a_masking_degree_below_the_clients_floor_is_refused():
    net = Net(16)
    net.setup()
    exchange = net.exchange(0)
    assert default_degree(16) == 8
    with pytest.raises(SecAggAborted):
        net.secure_sum(exchange, degree=2)
    assert net.refusals and all("below its floor 8" in why for why in net.refusals.values())
    # control: the next exchange at the protocol's degree, or a denser one, sums exactly
    for round_, degree in ((1, None), (2, 12)):
        fresh = net.exchange(round_)
        assert (net.secure_sum(fresh, degree=degree).total == net.plain(fresh.cohort)).all()


def test_a_share_holder_graph_below_the_floor_is_refused():
    net = Net(16, degree=2)
    shares = net.server.setup_stages(net.ids)
    stage, requests = next(shares)  # advertise
    stage, requests = shares.send(net.send(stage, requests))
    assert stage == "share"
    net.send(stage, requests)
    assert len(net.refusals) == 16
    assert all(
        "share-holder graph of degree 2 over 16 members is below its floor 8" in why for why in net.refusals.values()
    )
    # and so nobody is eligible: the server sums nothing with a sparser graph than the parties accept
    assert Net(16, degree=2).setup().eligible == ()
    assert Net(16, degree=8).setup().eligible == tuple(net.ids)  # control: the protocol's own degree


def test_the_floor_is_the_partys_own_policy():
    """A party may accept a sparser graph by its own configuration (never by the request's)."""
    assert ClientPolicy.from_node_config({"masking-degree": "4"}).masking_degree == 4
    assert ClientPolicy.from_node_config({}).masking_degree is None
    client = SecAggClient("a", min_degree=4)
    assert client.degree_floor(16) == 4 and client.degree_floor(3) == 2
    assert SecAggClient("a").degree_floor(16) == 8
    restored = SecAggClient.from_state(client.to_state())
    assert restored.min_degree == 4

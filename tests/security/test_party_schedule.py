"""A party's schedule is its own (issue 43, attack 7's third gap): a Flower party builds its algorithm from the run
config the server writes (``rounds = 100000`` was accepted: 100,000 releases); its policy caps the rounds it answers,
from its own node config."""

import numpy as np
import pytest

from gpflow_fed.federated import Client, ClientPolicy, FederationInfo, Message, Protection
from gpflow_fed.federated.engine.endpoint import ClientEndpoint
from gpflow_fed.federated.protection.encoder import ClientEncoder
from gpflow_fed.federated.protection.policy import DEFAULT_MAX_ROUNDS
from gpflow_fed.federated.protocol.messages import SERVER
from gpflow_fed.federated.protocol.transport import UPDATE, Request
from tests.federated.helpers import FederatedMean

PLAIN = Protection(secure_aggregation=False)


def _party(policy):
    info = FederationInfo(("client_0", "client_1"), {"client_0": 4, "client_1": 4}, 1, 1, 0)
    client = Client("client_0", (np.zeros((4, 1)), np.arange(4.0)[:, None]), 1)
    algorithm = FederatedMean(100_000).bind(info)  # the rounds the server's run config asked for
    return ClientEndpoint(algorithm, client, info, ClientEncoder("client_0", policy))


def _ask(endpoint, round_):
    down = Message(SERVER, round_, "train", {"mean": np.array(0.0)}, weight=0.0)
    config = {"aggregation": "sum", "cohort_size": 2, "protection": PLAIN.to_config()}
    return endpoint.handle(Request(UPDATE, down, "train", config))


def test_a_party_answers_no_round_beyond_its_own_cap():
    endpoint = _party(ClientPolicy.from_node_config({"secure-aggregation": False, "max-rounds": "3"}))
    assert _ask(endpoint, 2).fault is None  # control: inside its schedule
    refused = _ask(endpoint, 3)
    assert refused.message is None and "at most 3 by its own policy" in refused.fault


def test_a_flower_party_without_a_cap_in_its_node_config_has_the_default_one():
    policy = ClientPolicy.from_node_config({"secure-aggregation": False})
    assert policy.max_rounds == DEFAULT_MAX_ROUNDS
    endpoint = _party(policy)
    assert _ask(endpoint, DEFAULT_MAX_ROUNDS - 1).fault is None
    assert "at most 1000" in _ask(endpoint, DEFAULT_MAX_ROUNDS).fault


def test_an_in_process_party_follows_its_algorithm():
    assert ClientPolicy(secure_aggregation=False).max_rounds is None
    assert _ask(_party(ClientPolicy(secure_aggregation=False)), 50_000).fault is None


@pytest.mark.parametrize("value", ["0", "-1", "lots", "2.5"])
def test_a_malformed_cap_is_an_error_naming_its_key(value):
    with pytest.raises(ValueError, match="max-rounds"):
        ClientPolicy.from_node_config({"max-rounds": value})

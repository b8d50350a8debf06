"""A party's schedule is its own (issue 43, attack 7's third gap): a Flower party builds its algorithm from the run
config the server writes (``rounds = 100000`` was accepted: 100,000 releases); its policy caps the rounds it answers,
from its own node config."""

import ast
import pathlib

import numpy as np
import pytest

import gpflow_fed
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


def _request(round_, aggregation="sum"):
    down = Message(SERVER, round_, "train", {"mean": np.array(0.0)}, weight=0.0)
    return Request(
        UPDATE, down, "train", {"aggregation": aggregation, "cohort_size": 2, "protection": PLAIN.to_config()}
    )


def _ask(endpoint, round_):
    return endpoint.handle(_request(round_))


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


def test_the_encoder_decides_the_schedule_and_the_policy():
    """One owner per side (issue 43, step 1): the party's encoder, which holds its policy, decides whether an update
    request is in its schedule and allowed by its policy; its endpoint asks it and sends its words."""
    endpoint = _party(ClientPolicy(secure_aggregation=False, max_rounds=3))
    own = (endpoint.algorithm, _request(3))
    refusal = endpoint.encoder.refusal(PLAIN, "train", "sum", own)
    assert "at most 3 by its own policy" in refusal and endpoint.handle(own[1]).fault == refusal
    relabelled = (endpoint.algorithm, _request(2, "collect"))
    assert "aggregates it as 'sum'" in endpoint.encoder.refusal(PLAIN, "train", "sum", relabelled)
    secure = _party(ClientPolicy(max_rounds=3))  # its policy requires secure aggregation
    assert "requires secure aggregation" in secure.encoder.refusal(
        PLAIN, "train", "sum", (secure.algorithm, _request(2))
    )
    assert endpoint.encoder.refusal(PLAIN, "train", "sum", (endpoint.algorithm, _request(2))) == ""  # control


def test_the_policys_refusal_is_asked_in_one_place():
    """``ClientPolicy.refusal`` has one caller in the package: the encoder (the endpoint asks the encoder)."""
    root = pathlib.Path(gpflow_fed.__file__).parent
    callers = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "refusal":
                owner = node.func.value
                if (owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")) == "policy":
                    callers.append(path.relative_to(root).as_posix())
    assert callers == ["federated/protection/encoder.py"]

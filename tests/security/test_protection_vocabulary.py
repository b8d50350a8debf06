"""One vocabulary for protection (issues 42 and 43): a request and a party's policy read from a config mean what they
say, with the defaults of the Python values, and a value that is not exactly a boolean is an error, never a silent
``False`` that switches a protection off."""

import pytest

from gpflow_fed.federated import ClientPolicy, DifferentialPrivacy, DistributedDP, Protection, RobustAggregation
from gpflow_fed.federated.protection.masking import SecureAggregation
from gpflow_fed.federated.protection.policy import DEFAULT_MAX_ROUNDS

REQUESTS = [
    Protection(),
    Protection(secure_aggregation=False),
    Protection(secure_aggregation=SecureAggregation(20, min_cohort=3, degree=4)),
    Protection(differential_privacy=DifferentialPrivacy(0.8, 1.0, accountant="pld")),
    Protection(
        secure_aggregation=False,
        differential_privacy=DifferentialPrivacy(1.5, 2.0, delta=1e-6, weight_bound=3.0, phases=("predict",)),
    ),
    Protection(differential_privacy=DistributedDP(noise_multiplier=1.0, clip_norm=2.0, honest_clients=3)),
    Protection(
        differential_privacy=DistributedDP(
            noise_multiplier=0.7, clip_norm=1.0, honest_clients=5, delta=1e-6, granularity=2.0**-12, beta=0.5
        )
    ),
    Protection(secure_aggregation=False, robust=RobustAggregation("trimmed_mean", 0.2, 3.0)),
    Protection(secure_aggregation=False, robust=RobustAggregation("median")),
]


@pytest.mark.parametrize("protection", REQUESTS, ids=repr)
def test_a_request_round_trips_through_its_config(protection):
    config = protection.to_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in config.values())
    assert Protection.from_config(config) == protection
    # Flower may hand every value back as a string (a node config written by hand): the same request
    as_text = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in config.items()}
    assert Protection.from_config(as_text) == protection


def test_a_missing_key_means_the_python_default():
    assert Protection.from_config({}) == Protection()
    assert Protection.from_config({}).secure is not None  # private by default, as Protection() is
    # a deployed party's schedule cap is its own (issue 43); an in-process party follows its algorithm
    assert ClientPolicy.from_node_config({}) == ClientPolicy(max_rounds=DEFAULT_MAX_ROUNDS)


@pytest.mark.parametrize("text", ["yes", "1", "on", "True ", "enabled", "True", "", "no", "0", "off"])
@pytest.mark.parametrize("key", ["secure-aggregation", "protect-small-cohorts"])
def test_a_policy_value_that_is_not_true_or_false_is_refused(key, text):
    """Attack 7 of issue 43: ``protect-small-cohorts = "yes"`` silently turned the rule off."""
    with pytest.raises(ValueError, match=key):
        ClientPolicy.from_node_config({key: text})
    if key == "secure-aggregation":
        with pytest.raises(ValueError, match=key):
            Protection.from_config({key: text})


def test_the_control_strings_and_bools_are_read_as_written():
    assert ClientPolicy.from_node_config({"protect-small-cohorts": "false"}).protect_small_cohorts is False
    assert ClientPolicy.from_node_config({"protect-small-cohorts": True}).protect_small_cohorts is True
    assert ClientPolicy.from_node_config({"secure-aggregation": "false"}).secure_aggregation is False
    assert Protection.from_config({"secure-aggregation": "false"}).secure is None
    assert ClientPolicy.from_node_config({"min-cohort": "3"}).min_cohort == 3


@pytest.mark.parametrize(
    "config, key",
    [
        ({"min-cohort": "2.5"}, "min-cohort"),
        ({"fractional-bits": "lots"}, "fractional-bits"),
        ({"dp-noise-multiplier": "one", "dp-clip-norm": 1.0}, "dp-noise-multiplier"),
        ({"ddp-noise-multiplier": 1.0, "ddp-clip-norm": 1.0, "ddp-honest-clients": True}, "ddp-honest-clients"),
    ],
)
def test_a_malformed_number_names_its_key(config, key):
    with pytest.raises(ValueError, match=key):
        Protection.from_config(config)


def test_the_node_policy_numbers_are_strict_too():
    with pytest.raises(ValueError, match="min-cohort"):
        ClientPolicy.from_node_config({"min-cohort": "two"})

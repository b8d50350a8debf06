"""One vocabulary for protection (issues 42 and 43): a request and a party's policy read from a config mean what they
say, with the defaults of the Python values, and a value that is not exactly a boolean is an error, never a silent
``False`` that switches a protection off."""

import ast
import pathlib
import re
import shlex

import pytest

import gpflow_fed
from gpflow_fed.federated import ClientPolicy, DifferentialPrivacy, DistributedDP, Protection, RobustAggregation
from gpflow_fed.federated.protection.masking import SecureAggregation
from gpflow_fed.federated.protection.identity import node_identity
from gpflow_fed.federated.protection.policy import DEFAULT_MAX_ROUNDS

#: the Flower ClientApp's source, read without importing Flower
CLIENT_APP = pathlib.Path(gpflow_fed.__file__).parent / "federated" / "runtimes" / "flower" / "client_app.py"
#: the Flower commands module's source (its docstring lists the policy's node keys)
COMMANDS = CLIENT_APP.parent / "commands.py"

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


# --- a party's node config: every key strict, every policy written back -------------------------------------------
INT_KEYS = ["min-cohort", "fractional-bits", "masking-degree", "honest-clients", "max-rounds", "max-colluders"]
BOOL_KEYS = ["secure-aggregation", "protect-small-cohorts"]


@pytest.mark.parametrize(
    "key, value",
    [(k, v) for k in INT_KEYS for v in ("abc", "1.5", "yes", "", 1.5, True)]
    + [(k, v) for k in BOOL_KEYS for v in ("abc", "1.5", "yes", 1, "1")],
)
def test_a_malformed_node_config_value_is_a_value_error_naming_its_key_and_value(key, value):
    with pytest.raises(ValueError) as error:
        ClientPolicy.from_node_config({key: value})
    assert f"node config {key} " in str(error.value) and repr(value) in str(error.value)


@pytest.mark.parametrize(
    "key, value", [("min-cohort", "1"), ("masking-degree", "-2"), ("honest-clients", "-1"), ("max-colluders", "-1")]
)
def test_a_node_config_int_below_its_range_names_its_key(key, value):
    with pytest.raises(ValueError, match=f"node config {key} must be"):
        ClientPolicy.from_node_config({key: value})


def test_a_partys_collusion_bound_comes_from_its_node_config():
    assert ClientPolicy.from_node_config({}).max_colluders is None  # the protocol's default c
    assert ClientPolicy.from_node_config({"max-colluders": "6"}).max_colluders == 6
    assert ClientPolicy.from_node_config({"max-colluders": 0}).max_colluders == 0  # a bound: it assumes none
    for bad in (-1, True, 2.0, "3"):
        with pytest.raises(ValueError, match="max_colluders"):
            ClientPolicy(max_colluders=bad)


POLICIES = [
    ClientPolicy(max_rounds=DEFAULT_MAX_ROUNDS),
    ClientPolicy(max_rounds=50, max_colluders=0),
    ClientPolicy(
        secure_aggregation=False,
        min_cohort=5,
        fractional_bits=20,
        protect_small_cohorts=False,
        masking_degree=6,
        min_noise_multiplier=0.8,
        honest_clients=4,
        max_rounds=7,
        max_colluders=12,
    ),
    ClientPolicy(max_rounds=3, budget=(1.5, 1e-5), ledger="/srv/party/ledger", max_colluders=3),
]


@pytest.mark.parametrize("policy", POLICIES, ids=repr)
def test_a_policy_round_trips_through_its_node_config(policy):
    config = policy.to_node_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in config.values())
    assert ClientPolicy.from_node_config(config) == policy
    as_text = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in config.items()}
    assert ClientPolicy.from_node_config(as_text) == policy  # a node config written by hand


def test_what_a_node_config_cannot_spell():
    # an in-process party's cap is its algorithm's own count: a Flower party reading the config caps at the default
    assert "max-rounds" not in ClientPolicy().to_node_config()
    assert ClientPolicy.from_node_config(ClientPolicy().to_node_config()) == ClientPolicy(max_rounds=DEFAULT_MAX_ROUNDS)
    with pytest.raises(ValueError, match="needs a ledger"):  # a Flower party keeps its spend in its ledger file
        ClientPolicy(budget=(1.0, 1e-5)).to_node_config()


class Recording(dict):
    """A node config that records every key read from it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.read = set()

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)


def _literal_reads(source, pattern):
    return set(re.findall(pattern, source))


def test_the_client_apps_docstring_lists_every_node_config_key_it_reads():
    """Every key the ClientApp reads (its own, its identity's and its policy's) has its line in the module docstring
    of ``client_app`` (read without importing Flower)."""

    policy_config, identity_config = Recording(), Recording()
    ClientPolicy.from_node_config(policy_config)
    with pytest.raises(ValueError, match="refuses to start"):
        node_identity(identity_config, "client_0")
    source = CLIENT_APP.read_text(encoding="utf-8")
    own = _literal_reads(source, r'_node_setting\(context, "([a-z-]+)"\)')
    own |= _literal_reads(source, r'node_config\.get\("([a-z-]+)"\)')
    own |= {"features", "target"}  # read in a loop: ``for key in ("features", "target")``
    assert 'for key in ("features", "target")' in source
    keys = policy_config.read | identity_config.read | own
    assert {"max-colluders", "dp-ledger", "no-roster", "data", "state-dir"} <= keys
    doc = ast.get_docstring(ast.parse(source))
    missing = sorted(k for k in keys if f"``{k}``" not in doc)
    assert not missing, f"client_app's docstring lacks the node-config keys {missing}"
    listed = re.findall(r"^\* ``([a-z-]+)``", doc, flags=re.M)
    assert len(listed) == len(set(listed))  # one line each


def test_the_flower_commands_docstring_lists_exactly_the_policy_keys():
    """The module docstring of the Flower commands lists, one line each, exactly the node-config keys
    ``ClientPolicy.from_node_config`` reads: none missing, none it does not read."""
    read = Recording()
    ClientPolicy.from_node_config(read)
    assert {"max-colluders", "dp-budget-delta", "fractional-bits"} <= read.read
    doc = ast.get_docstring(ast.parse(COMMANDS.read_text(encoding="utf-8")))
    listed = re.findall(r"^\* ``([a-z-]+)``", doc, flags=re.M)
    assert len(listed) == len(set(listed)) and set(listed) == read.read


def test_flower_party_writes_its_own_collusion_bound(tmp_path):
    """``gpflow-fed flower party --max-colluders N`` writes the node key ``max-colluders`` its ClientApp's policy reads;
    without the option the key is absent (the protocol's default c)."""
    from gpflow_fed.cli import build_parser
    from gpflow_fed.cli.flower import party_command
    from gpflow_fed.data.tabular import read_party_table

    table = tmp_path / "mine.csv"
    table.write_text("age,dose,los\n40,1.0,3\n41,2.0,4\n")
    base = ["flower", "party", "--csv", str(table), "--target", "los", "--client-index", "0"]
    base += ["--superlink", "127.0.0.1:9100", "--no-roster", "--state-dir", str(tmp_path / "state")]
    configs = []
    for extra in (["--max-colluders", "3"], []):
        args = build_parser().parse_args([*base, *extra])
        args.table = read_party_table(str(table), target="los")
        command, _ = party_command(args)
        pairs = (entry.split("=", 1) for entry in shlex.split(command[command.index("--node-config") + 1]))
        configs.append(dict(pairs))  # Flower's key=value pairs (each value TOML: a bare int here)
    assert configs[0]["max-colluders"] == "3" and "max-colluders" not in configs[1]
    assert [ClientPolicy.from_node_config(c).max_colluders for c in configs] == [3, None]
    with pytest.raises(SystemExit):  # a negative bound is argparse's error
        build_parser().parse_args([*base, "--max-colluders", "-1"])

"""``RunOptions`` and ``FaultPolicy`` as a config (issue 42, one vocabulary): every field has one ``-``-spelt key,
``from_config(o.to_config()) == o``, values are TOML's, and parsing is strict."""

import dataclasses
import itertools
import json
import tomllib

import numpy as np
import pytest

from gpflow_fed.federated.engine.options import RunOptions
from gpflow_fed.federated.protocol.faults import FaultPolicy
from gpflow_fed.validation import (
    ArgumentTypeError,
    config_fields,
    config_key,
    dataclass_from_config,
    parse_boolean,
    parse_integer,
    parse_number,
)

#: several values of every field (of RunOptions and of its FaultPolicy): a new field fails
#: test_every_field_has_values until it has its values here, and then goes through every round trip below
VALUES = {
    "progress": [False, True],
    "keep_payloads": [False, True],
    "eval_every": [0, 1, 7],
    "on_error": ["raise", "exclude"],
    "min_clients": [1, 2, 50],
    "timeout": [None, 0.25, 30.0, 3600],
    "checkpoint_dir": [None, "/tmp/checkpoints", "runs/ckpt dir", "ünïcode/'quoted\""],
    "checkpoint_every": [1, 3],
    "resume": [False, True],
}


def _attributes():
    """Every field of RunOptions, FaultPolicy's in place of ``faults``, read with ``dataclasses.fields``."""
    names = []
    for field in dataclasses.fields(RunOptions):
        if field.name == "faults":
            names += [f.name for f in dataclasses.fields(FaultPolicy)]
        else:
            names.append(field.name)
    return names


def _options(**values):
    faults = {k: values.pop(k) for k in [f.name for f in dataclasses.fields(FaultPolicy)] if k in values}
    if values.get("resume") and values.get("checkpoint_dir") is None:
        values["checkpoint_dir"] = "/tmp/resume-needs-a-folder"
    return RunOptions(faults=FaultPolicy(**faults), **values)


def _toml(config):
    """``config`` as a TOML table's lines (what ``flwr run --run-config`` and an app's pyproject hold)."""
    lines = []
    for key, value in config.items():
        assert type(value) in (str, int, float, bool), (key, value)  # TOML values only
        text = ("true" if value else "false") if isinstance(value, bool) else json.dumps(value)
        lines.append(f'"{key}" = {text}')
    return tomllib.loads("\n".join(lines))


def test_every_field_has_values_and_one_key():
    assert set(VALUES) == set(_attributes())
    keys = [f.key for f in config_fields(RunOptions)]
    assert keys == [config_key(name) for name in _attributes()]  # field order, the faults' keys inlined
    assert list(RunOptions().to_config()) == keys and len(set(keys)) == len(keys)
    assert list(FaultPolicy().to_config()) == ["on-error", "min-clients", "timeout"]


def test_defaults():
    assert RunOptions.from_config({}) == RunOptions()
    assert FaultPolicy.from_config({}) == FaultPolicy()
    assert RunOptions().to_config() == {
        "progress": False,
        "keep-payloads": False,
        "eval-every": 0,
        "on-error": "raise",
        "min-clients": 1,
        "timeout": 0.0,  # None
        "checkpoint-dir": "",  # None
        "checkpoint-every": 1,
        "resume": False,
    }
    for field in config_fields(RunOptions):  # the CLI's defaults come from here: the dataclasses' own
        owner_default = getattr(field.owner(), field.attribute)
        assert field.default == owner_default, field.key


@pytest.mark.parametrize("name", list(VALUES))
def test_round_trip_of_each_value_of_each_field(name):
    for value in VALUES[name]:
        options = _options(**{name: value})
        config = options.to_config()
        assert RunOptions.from_config(config) == options, (name, value)
        assert RunOptions.from_config(_toml(config)) == options, (name, value)  # through TOML
        assert FaultPolicy.from_config(config) == options.faults


def test_round_trip_of_combinations():
    rng = np.random.default_rng(0)
    for _ in range(40):
        values = {name: choices[rng.integers(len(choices))] for name, choices in VALUES.items()}
        options = _options(**values)
        assert RunOptions.from_config(_toml(options.to_config())) == options, values
    for resume, directory in itertools.product([False, True], VALUES["checkpoint_dir"][1:]):
        options = RunOptions(checkpoint_dir=directory, resume=resume)
        assert RunOptions.from_config(options.to_config()) == options


def test_words_and_other_keys():
    config = {"resume": "true", "progress": "false", "checkpoint-dir": "/x", "min-clients": "3", "timeout": "2.5"}
    options = RunOptions.from_config(config)
    assert (options.resume, options.progress, options.faults.min_clients, options.faults.timeout) == (
        True,
        False,
        3,
        2.5,
    )
    assert RunOptions.from_config({"timeout": 0}).faults.timeout is None  # 0: no limit, as the Flower key always was
    assert RunOptions.from_config({"eval-every": np.int64(2), "resume": np.bool_(False)}).eval_every == 2
    # a run config also holds the algorithm's, the server's and the protection's keys: ignored here
    others = {"rounds": 3, "seed": 1, "wait": 10.0, "secure-aggregation": False, "algorithm": "a:b"}
    assert RunOptions.from_config(others) == RunOptions()


@pytest.mark.parametrize(
    "key, value",
    [
        ("resume", "yes"),
        ("resume", "True"),
        ("resume", 1),
        ("progress", 0),
        ("progress", ""),
        ("keep-payloads", None),
        ("keep-payloads", "on"),
        ("min-clients", 1.5),
        ("min-clients", 2.0),
        ("min-clients", "two"),
        ("min-clients", True),
        ("min-clients", 0),
        ("eval-every", -1),
        ("eval-every", "1e3"),
        ("checkpoint-every", 0),
        ("timeout", -1.0),
        ("timeout", "soon"),
        ("timeout", True),
        ("timeout", float("inf")),
        ("timeout", float("nan")),
        ("on-error", "drop"),
        ("on-error", 1),
        ("checkpoint-dir", 5),
        ("checkpoint-dir", False),
    ],
)
def test_strict_parsing_names_the_key(key, value):
    config = {key: value}
    if key != "checkpoint-dir":
        config["checkpoint-dir"] = "/tmp/x"
    with pytest.raises(ValueError, match=key):
        RunOptions.from_config(config)


def test_refusals():
    with pytest.raises(ValueError, match="'min_clients' \\(write 'min-clients'\\)"):
        RunOptions.from_config({"min_clients": 2})
    with pytest.raises(ValueError, match="'eval_every'"):
        RunOptions.from_config({"eval_every": 2})
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        RunOptions.from_config({"resume": True})
    with pytest.raises(ValueError, match="resume=True needs checkpoint_dir"):
        RunOptions.from_config({"resume": True, "checkpoint-dir": ""})  # "" is None

    @dataclasses.dataclass(frozen=True)
    class Unlabelled:
        flag: bool = False

    with pytest.raises(TypeError, match="Unlabelled.flag has no config_option metadata"):
        dataclass_from_config(Unlabelled, {})


def test_the_validation_helpers():
    assert parse_boolean(True, "b") is True and parse_boolean("false", "b") is False
    assert parse_boolean(np.bool_(True), "b") is True
    for bad in ("TRUE", "1", 1, 0, None, "", np.array([True])):
        with pytest.raises(ArgumentTypeError, match="b must be true or false"):
            parse_boolean(bad, "b")
    assert parse_integer("12", "n") == 12 and parse_integer(np.int32(3), "n", minimum=1) == 3
    for bad in ("1.0", 1.0, "x", False):
        with pytest.raises(ArgumentTypeError, match="n must be"):
            parse_integer(bad, "n")
    with pytest.raises(ValueError, match="n must be a positive integer"):
        parse_integer("0", "n", minimum=1)
    assert parse_number("2.5", "x") == 2.5 and parse_number(3, "x") == 3.0
    for bad in ("inf", float("nan"), True, "two"):
        with pytest.raises(ValueError, match="x must be"):
            parse_number(bad, "x")


def test_flower_reads_the_same_keys():
    pytest.importorskip("flwr")
    from gpflow_fed.federated.runtimes.flower.app_config import run_config_defaults
    from gpflow_fed.federated.runtimes.flower.server_app import options_from_config

    defaults = run_config_defaults()
    assert {k: defaults[k] for k in RunOptions().to_config()} == RunOptions().to_config()
    assert options_from_config(defaults) == RunOptions()
    options = _options(on_error="exclude", min_clients=2, timeout=5.0, eval_every=2, checkpoint_dir="/c", resume=True)
    assert options_from_config({**defaults, **options.to_config()}) == options
    with pytest.raises(ValueError, match="resume"):
        options_from_config({**defaults, "resume": "yes"})

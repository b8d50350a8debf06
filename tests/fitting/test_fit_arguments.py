"""``gpflow_fed.fit``'s argument errors (issue 45): an unknown setting, a value of the wrong kind and a count below 1
(``rounds=0`` trained nothing and returned a model) are each one ``TypeError``/``ValueError`` naming the parameter and
what it takes, raised before TensorFlow is imported; the settings' names agree with the algorithms' constructors."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.fitting.checks import CHOICES, check_settings
from gpflow_fed.fitting.defaults import DEFAULTS, METHODS, SETTINGS

ROOT = Path(__file__).resolve().parents[2]

# Each case in one fresh interpreter: the error's class and text, and whether TensorFlow had been imported.
_SCRIPT = r"""
import json, sys
import numpy as np
import gpflow_fed

n = 60  # 48 training rows: more than FSGP's default M = 30
x = np.arange(n, dtype=float)
table = {"hospital": np.array(["abc"[k % 3] for k in range(n)]), "age": x, "los": 5 + 0.1 * x ** 2 + np.sin(x)}
out = {}
for name, kwargs in json.loads(sys.argv[1]).items():
    try:
        gpflow_fed.fit(table, party_column="hospital", target="los", **kwargs)
        out[name] = [None, None, "tensorflow" in sys.modules]
    except Exception as exc:  # a TypeError or ValueError is asked for; anything else is reported, not a crash
        out[name] = [[c.__name__ for c in type(exc).__mro__], str(exc), "tensorflow" in sys.modules]
print(json.dumps(out))
"""

# name: (fit's keywords, the exception class it must be, text the message holds)
CASES = {
    "unknown setting": ({"inducing": 500}, TypeError, "unknown keyword 'inducing' (did you mean num_inducing=?)"),
    "another method's": ({"variant": "dpo"}, TypeError, "variant is a setting of method 'pvi', not of 'fsgp'"),
    "zero rounds": ({"rounds": 0}, ValueError, "rounds must be a positive integer (at least 1), got 0"),
    "zero rounds pvi": ({"method": "pvi", "rounds": 0}, ValueError, "rounds must be a positive integer"),
    "negative rounds fedbnr": ({"method": "fedbnr", "rounds": -1}, ValueError, "rounds must be a non-negative"),
    "zero local_steps": ({"local_steps": 0}, ValueError, "local_steps must be a positive integer"),
    "zero num_inducing": ({"method": "pvi", "num_inducing": 0}, ValueError, "num_inducing must be a positive integer"),
    "zero hidden": ({"method": "fedbnr", "hidden": 0}, ValueError, "hidden must be a positive integer"),
    "rounds a string": ({"rounds": "10"}, TypeError, "rounds must be a positive integer (at least 1), got '10' (str)"),
    "fractional M": ({"num_inducing": 2.5}, TypeError, "num_inducing must be a positive integer (at least 1) or"),
    "zero learning_rate": ({"learning_rate": 0}, ValueError, "learning_rate must be positive and finite, got 0"),
    "zero client_fraction": ({"client_fraction": 0}, ValueError, "client_fraction must lie in (0, 1], got 0"),
    "unknown mode": ({"mode": "exactt"}, ValueError, "mode must be one of ('fedavg', 'exact')"),
    "one feature": ({"features": "age"}, TypeError, "features must be a list of column names, got the string 'age'"),
    "test_fraction a string": ({"test_fraction": "0.2"}, TypeError, "test_fraction must be a number in [0, 1)"),
    "seed a string": ({"seed": "x"}, TypeError, "seed must be a non-negative integer, got 'x' (str)"),
    "negative seed": ({"seed": -1}, ValueError, "seed must be a non-negative integer, got -1"),
    "protection a bool": ({"protection": True}, TypeError, "protection must be None (secure aggregation) or a"),
    "runtime a string": ({"runtime": "local"}, TypeError, "runtime must be None (LocalRuntime) or a"),
    "kernel a string": ({"kernel": "rbf"}, TypeError, "kernel must be None or a gpflow.kernels.Kernel"),
    "kernel for pvi": ({"method": "pvi", "kernel": "rbf"}, ValueError, "drop kernel="),
    "monitor not callable": ({"monitor": 1}, TypeError, "monitor must be None or callable"),
}


def test_fit_argument_errors_name_the_parameter_before_importing_tensorflow():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    kwargs = json.dumps({name: case[0] for name, case in CASES.items()})
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, kwargs], env=env, capture_output=True, text=True, timeout=600
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    for name, (classes, message, tensorflow) in json.loads(done.stdout).items():
        _, kind, text = CASES[name]
        assert classes is not None, f"{name}: fit did not refuse"
        assert kind.__name__ in classes, (name, classes, message)
        assert not tensorflow, f"{name}: TensorFlow was imported before: {message}"
        assert text in message, (name, message)
        assert message.startswith("fit: ") and "--" not in message and "\n" not in message, message


def test_settings_are_the_constructors_keywords():
    from gpflow_fed.federated.algorithms import FSGP, FedBNR
    from gpflow_fed.federated.algorithms.fedbnr import AGGREGATIONS, PROTOCOLS
    from gpflow_fed.federated.algorithms.fsgp.algorithm import MODES
    from gpflow_fed.federated.algorithms.pvi.algorithm import PVI
    from gpflow_fed.federated.algorithms.pvi.methods import METHODS as PVI_METHODS
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    def keywords(function, *given):
        return set(inspect.signature(function).parameters) - {"self", "options", *given}

    fsgp = keywords(FSGP.__init__, "kernel", "inducing_variable") | {"num_inducing"}
    fixed_by_make_pvi = ("kernel", "inducing_variable", "likelihood", "parameterisation", "schedule", "learn_inducing")
    pvi = keywords(PVI.__init__, *fixed_by_make_pvi) | keywords(make_pvi, "method", "input_dim", "M", "seed")
    pvi = pvi | {"num_inducing", "variant"}
    fedbnr = keywords(FedBNR.__init__, "kernel") | {"hidden", "num_samples"}
    assert {"fsgp": fsgp, "pvi": pvi, "fedbnr": fedbnr} == {m: set(SETTINGS[m]) for m in METHODS}
    assert all(set(DEFAULTS[m]) <= set(SETTINGS[m]) for m in METHODS)
    choices = {"fsgp": {"mode": MODES}, "pvi": {"variant": PVI_METHODS}}
    choices["fedbnr"] = {"aggregation": AGGREGATIONS, "protocol": PROTOCOLS}
    assert {m: {k: tuple(v) for k, v in c.items()} for m, c in CHOICES.items()} == choices


def test_check_settings_passes_what_the_algorithms_take():
    check_settings("fsgp", {"rounds": np.int64(5), "num_inducing": np.zeros((5, 2)), "learning_rate": 1})
    check_settings("fedbnr", {"rounds": 0})  # FedBNR's phase 2 alone (the pooled BLR), as its --rounds 0
    check_settings("pvi", {"variant": "global", "num_inducing": np.int32(4), "on_client_update": print})


def test_algorithm_and_a_flower_run_config_refuse_the_same():
    from gpflow_fed.fitting import algorithm
    from gpflow_fed.fitting.flower import FitMethod

    with pytest.raises(TypeError, match=r"unknown keyword 'inducing' \(did you mean num_inducing=\?\)"):
        algorithm("fsgp", 2, inducing=5)
    with pytest.raises(ValueError, match=r"^fsgp: rounds must be a positive integer \(at least 1\), got 0$"):
        FitMethod("fsgp", rounds=0)  # a Flower table run's config: trained nothing before

"""``gpflow_fed.fit`` refuses what cannot train before it imports TensorFlow (issue 45): a table's missing value, a
constant or nearly constant target, too few parties for the protection asked (in all or per round), FSGP's M not below
the rows; each a one-line ``ValueError`` naming the parameter (``features``, ``party_column``, ``client_fraction``),
never a command-line option."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpflow_fed.data.tabular import MIN_RELATIVE_STD, check_target_spread, split_table
from gpflow_fed.fitting.checks import DEFAULT_MIN_COHORT, check_parties, required_cohort

ROOT = Path(__file__).resolve().parents[1]

# Each case in one fresh interpreter: the error's text and whether TensorFlow had been imported when it was raised.
_SCRIPT = r"""
import json, sys
import numpy as np
import gpflow_fed

def table(parties="abc", y=None, missing=False):
    n = 12
    x = np.arange(n, dtype=float)
    los = (5 + 0.1 * x ** 2) if y is None else y
    los = np.array(los, dtype=float)
    if missing:
        los[4] = np.nan
    return {"hospital": np.array([parties[k % len(parties)] for k in range(n)]), "age": x, "dose": x % 3, "los": los}

cases = {
    "missing": (table(missing=True), {}),
    "one party": (table(parties="n"), {}),
    "constant": (table(y=np.full(12, 4.0)), {}),
    "flat": (table(y=1e6 + 1e-3 * np.arange(12)), {}),
    "features twice": (table(), {"features": ["age", "age"]}),
    "not numeric": ({**table(), "dose": np.array(["x"] * 12)}, {}),
    "per round": (table(), {"client_fraction": 0.3}),
    "inducing": (table(), {"num_inducing": 30}),
}
out = {}
for name, (data, kwargs) in cases.items():
    try:
        gpflow_fed.fit(data, party_column="hospital", target="los", **kwargs)
        out[name] = [None, "tensorflow" in sys.modules]
    except ValueError as exc:
        out[name] = [str(exc), "tensorflow" in sys.modules]
print(json.dumps(out))
"""

EXPECTED = {
    "missing": "column 'los': missing value in data row 5",
    "one party": "1 party ('n') from party_column='hospital': secure aggregation (on by default) sums no fewer than 2",
    "constant": "the target 'los' has the same value in every row",
    "flat": "the target 'los' varies by 3.",
    "features twice": "features names a column twice",
    "not numeric": "leave the column out of features)",
    "per round": "client_fraction 0.3 asks 1 of the 3 parties ('a', 'b', 'c') per round",
    "inducing": "30 inducing points (num_inducing)",
}


def test_fit_refuses_before_importing_tensorflow_and_names_parameters():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    done = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for name, (message, tensorflow) in json.loads(done.stdout).items():
        assert message is not None, f"{name}: fit did not refuse"
        assert not tensorflow, f"{name}: TensorFlow was imported before: {message}"
        assert EXPECTED[name] in message, (name, message)
        assert message.startswith("fit: ") and "--" not in message and "\n" not in message, message


def test_a_federated_dataset_too_small_for_its_protection_is_refused_before_training():
    from gpflow_fed import fit
    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import DistributedDP, Protection

    rng = np.random.default_rng(0)
    one = FederatedDataset([(rng.normal(size=(8, 1)), rng.normal(size=(8, 1)))], client_names=["north"])
    with pytest.raises(ValueError, match=r"1 party \('north'\) from the FederatedDataset's clients.*protection="):
        fit(one)
    three = FederatedDataset([(rng.normal(size=(8, 1)), rng.normal(size=(8, 1))) for _ in range(3)])
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=4)
    with pytest.raises(ValueError, match=r"distributed DP \(honest_clients=4\) sums no fewer than 4"):
        fit(three, protection=Protection(differential_privacy=ddp))
    flat = FederatedDataset([(rng.normal(size=(8, 1)), np.full((8, 1), 2.0)) for _ in range(2)])
    with pytest.raises(ValueError, match="the target 'Y' has the same value in every row"):
        fit(flat)


def test_required_cohort_follows_the_protection():
    from gpflow_fed.federated import DistributedDP, Protection, SecureAggregation

    assert DEFAULT_MIN_COHORT == SecureAggregation().min_cohort == required_cohort(None)[0]
    assert required_cohort(Protection(secure_aggregation=False))[0] == 1
    assert required_cohort(Protection(secure_aggregation=SecureAggregation(min_cohort=3)))[0] == 3
    ddp = DistributedDP(noise_multiplier=1.0, clip_norm=1.0, honest_clients=5)
    assert required_cohort(Protection(differential_privacy=ddp)) == (5, "distributed DP (honest_clients=5)")


def test_check_parties_per_round_and_spelling():
    check_parties(["a", "b"], 2, "secure aggregation", client_fraction=1.0)
    check_parties(["a"], 1, "no secure aggregation", client_fraction=0.5)  # plain: one party may run
    cli = {"parties": "--clients", "party": "client", "client_fraction": "--client-fraction", "protection": ""}
    with pytest.raises(ValueError, match=r"--client-fraction 0.2 asks 2 of the 10 clients .* sums no fewer than 3; "
                       r"raise --client-fraction to 0.3 or more$"):  # fmt: skip
        check_parties([f"c{k}" for k in range(10)], 3, "secure aggregation", client_fraction=0.2, spelling=cli)


def test_target_spread_threshold():
    rng = np.random.default_rng(1)
    check_target_spread(100 * (1 + 10 * MIN_RELATIVE_STD * rng.normal(size=50)), "y")  # above: trains
    check_target_spread(rng.normal(size=50) - np.mean(rng.normal(size=50)), "y")  # mean ≈ 0: a spread, no level
    with pytest.raises(ValueError, match=r"varies by 1\.\de-05 of its mean"):
        check_target_spread(100 * (1 + 0.1 * MIN_RELATIVE_STD * rng.normal(size=50)), "y")


def test_table_errors_use_the_callers_spelling():
    table = {"h": np.array(list("abab")), "x": np.arange(4.0), "y": np.arange(4.0) ** 2}
    with pytest.raises(ValueError, match="^features names a column twice"):
        split_table(table, party_column="h", target="y", features=["x", "x"])
    options = {name: f"--{name.replace('_', '-')}" for name in ("party_column", "target", "features", "test_fraction")}
    with pytest.raises(ValueError, match="^--features names a column twice"):
        split_table(table, party_column="h", target="y", features=["x", "x"], spelling=options)
    with pytest.raises(ValueError, match=r"^--test-fraction must be in \[0, 1\)"):
        split_table(table, party_column="h", target="y", test_fraction=1.5, spelling=options)

"""Party names outside Flower (issue 45): ``FederatedResult.party_names`` is ``{protocol id: name}`` of the parties a
run used, by the rules the Flower server applies to the names its parties claim (``party_labels``): a named
:class:`FederatedDataset` (a table's party column) gives its names, an unnamed one the ``client_k`` ids."""

import gpflow
import numpy as np

from gpflow_fed.data import FederatedDataset
from gpflow_fed.federated import run
from gpflow_fed.federated.algorithms.moments import Moments
from gpflow_fed.federated.engine.result import FederatedResult, party_labels
from gpflow_fed.federated.protocol.ledger import CommunicationLedger


def _parts(K=3):
    rng = np.random.default_rng(0)
    return [(rng.normal(size=(6, 1)), rng.normal(size=(6, 1))) for _ in range(K)]


def test_an_in_process_run_names_its_parties():
    result = run(Moments(), FederatedDataset(_parts(), client_names=["north", "south", "east"]))
    assert result.party_names == {"client_0": "north", "client_1": "south", "client_2": "east"}


def test_an_in_process_run_labels_its_parties_by_the_flower_servers_rules():
    """Normalised as a Flower server normalises a claimed name (NFKC, surrounding space); a name that is another
    party's id is not told apart from it, so that party is shown by its id (look-alikes the dataset refuses itself)."""
    names = [" Ｎorth", "south", "client_0"]
    result = run(Moments(), FederatedDataset(_parts(), client_names=names))
    assert result.party_names == {"client_0": "North", "client_1": "south", "client_2": "client_2"}
    assert result.party_names == party_labels(dict(zip(result.party_names, names)))[0]


def test_unnamed_parties_keep_their_ids_and_the_default_result_has_none():
    assert run(Moments(), FederatedDataset(_parts())).party_names == {f"client_{k}": f"client_{k}" for k in range(3)}
    model = gpflow.models.GPR((np.zeros((2, 1)), np.zeros((2, 1))), gpflow.kernels.SquaredExponential())
    plain = FederatedResult(model=model, history=[], ledger=CommunicationLedger(), state=None)
    assert plain.party_names == {}  # the runtime did not say
    assert "party_names" not in repr(plain)  # the one-line repr is unchanged

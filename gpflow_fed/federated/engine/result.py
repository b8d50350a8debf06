"""FederatedResult: what a run returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import gpflow

from ...validation import party_key, party_name
from ..protocol.ledger import CommunicationLedger


def party_labels(claimed: Mapping[str, Any]) -> Tuple[Dict[str, str], str]:
    """The parties' names, from what their ``describe`` replies claim: ``{protocol id: name}`` for every party, and
    one log line on the names it could not use (``""`` when none).

    A name is only a label for logs and results: protocol ids (``client_k``) stay what rosters, secure aggregation and
    identities use. A node's message is never trusted, so each claimed name goes through
    :func:`~gpflow_fed.validation.party_name` again; a party is shown by its protocol id when it claims none (None),
    claims something that is not text or that ``party_name`` refuses, claims the name (or a look-alike,
    :func:`~gpflow_fed.validation.party_key`) another party also claims (every such party: neither is told apart), or
    claims another party's protocol id.

    :param claimed: ``{protocol id: the name its reply carried, or None}``, in the parties' order.
    """
    names = {client: client for client in claimed}
    problems: List[str] = []
    valid: Dict[str, str] = {}
    for client, raw in claimed.items():
        if raw is None:
            continue
        if not isinstance(raw, str):
            problems.append(f"{client}'s party-name is not text ({type(raw).__name__})")
            continue
        try:
            valid[client] = party_name(raw, f"{client}'s party-name")
        except ValueError as exc:  # names the code point of a refused character, never prints it
            problems.append(str(exc))
    holders: Dict[str, List[str]] = {}
    for client, name in valid.items():
        holders.setdefault(party_key(name), []).append(client)
    ids = {party_key(client): client for client in claimed}
    for key, clients in holders.items():
        name = valid[clients[0]]
        if len(clients) > 1:
            problems.append(f"{' and '.join(clients)} claim the same name {name!r} (or look-alikes)")
        elif ids.get(key, clients[0]) != clients[0]:
            problems.append(f"{clients[0]} claims the name {name!r}, another party's id")
        else:
            names[clients[0]] = name
    if not problems:
        return names, ""
    return names, "party names refused, those parties shown by their protocol ids: " + "; ".join(problems)


@dataclass
class FederatedResult:
    """The outcome of :func:`gpflow_fed.federated.run`.

    :param model: a GPflow model built from the server state alone, ready for ``predict_f``/``predict_y``.
    :param history: one dict per round (``round``, ``clients``, ``bytes_up``, ``bytes_down``, ``seconds``,
        the algorithm's metrics, and ``test_rmse``/``test_nlpd`` where evaluated).
    :param ledger: every message that crossed the channel.
    :param state: the server's final state.
    :param metrics: test metrics of ``model`` when the dataset has a test set.
    :param seconds: wall time of the whole run.
    :param privacy: with differential privacy, the spent ``epsilon`` at ``delta`` and the mechanism's
        settings (see :class:`gpflow_fed.federated.DifferentialPrivacy`); None otherwise.
    :param algorithm: the run's own bound copy of the algorithm (``Algorithm.bind``), with whatever it kept.
    :param accountant: with differential privacy, the run's accountant (its releases compose with another run's on
        the same data: :func:`gpflow_fed.fit` reports the moments' and the training's together); None otherwise.
    :param standardizer: set by :func:`gpflow_fed.fit`: the :class:`~gpflow_fed.data.Standardizer` between the
        data's units and the model's (None from ``run``).
    :param party_names: ``{protocol id: name}`` of the parties the run used (:func:`party_labels`), as a Flower
        server's ``result.json`` has them: the names of a :class:`~gpflow_fed.data.FederatedDataset`'s
        ``client_names`` (a table's party column), ``client_k`` where a party has none; empty when the runtime did not
        say.
    """

    model: gpflow.models.GPModel
    history: List[Dict[str, Any]]
    ledger: CommunicationLedger
    state: Any
    metrics: Dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    privacy: Optional[Dict[str, Any]] = None
    algorithm: Optional[Any] = None
    standardizer: Optional[Any] = None
    accountant: Optional[Any] = field(default=None, repr=False)
    party_names: Dict[str, str] = field(default_factory=dict)

    def __repr__(self) -> str:
        """One line: model, rounds, seconds, bytes, test metrics and privacy (the history is not printed)."""
        parts = [
            f"model={type(self.model).__name__}",
            f"rounds={len(self.history)}",
            f"seconds={self.seconds:.2f}",
            f"bytes={self.ledger.total_bytes():,}",
        ]
        parts += [f"{k}={v:.4g}" for k, v in self.metrics.items()]
        if self.privacy:
            parts += [f"{k}={self.privacy[k]:.4g}" for k in ("epsilon", "delta") if k in self.privacy]
        return f"FederatedResult({', '.join(parts)})"

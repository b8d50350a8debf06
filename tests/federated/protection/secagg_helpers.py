"""An in-process network for the secure-aggregation protocol: clients that go offline at chosen stages, restart
between messages on request, and a record of everything the server receives (its view)."""

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

import numpy as np

from gpflow_fed.federated.protection.identity import PartyIdentity
from gpflow_fed.federated.protection.masking import Exchange
from gpflow_fed.federated.protection.secagg import (
    SecAggClient,
    SecAggRefused,
    SecAggServer,
    SecureSum,
    Stages,
    default_degree,
    members_bitmap,
)
from gpflow_fed.randomness import new_run_id


def drive(stages: Stages, send: Callable[[str, Dict[str, Dict[str, Any]]], Mapping[str, Any]]) -> Any:
    """Run a secure-aggregation protocol generator with ``send`` answering each stage (as the phase owner does
    through its transport); the generator's return value."""
    try:
        stage, requests = next(stages)
        while True:
            stage, requests = stages.send(send(stage, requests))
    except StopIteration as done:
        return done.value


def random_codes(rng: np.random.Generator, size: int) -> np.ndarray:
    """Uniform uint64 codes over the whole range, so that sums wrap modulo 2^64."""
    return rng.integers(0, np.iinfo(np.uint64).max, size, dtype=np.uint64, endpoint=True)


class Net:
    """K clients in this process and the server's transport (the ``send`` of :class:`SecAggServer`).

    ``offline[stage]``: clients that do not answer at that stage. ``restart``: every client is rebuilt from
    ``to_state()`` before each message (a Flower ClientApp that restarts). ``view``: ``(stage, client,
    response)`` for every response the server receives; ``refusals``: ``client -> reason`` of the last refusal.
    ``authenticated``: every client has a signing key and holds the roster of all K (``identities``); otherwise
    the unauthenticated mode.
    """

    def __init__(
        self,
        K: int,
        *,
        min_cohort: int = 2,
        size: int = 24,
        seed: int = 0,
        authenticated: bool = False,
        **server: Any,
    ) -> None:
        self.ids = [f"client_{k:02d}" for k in range(K)]
        self.identities = PartyIdentity.federation(self.ids) if authenticated else {}
        self.clients = {c: SecAggClient(c, min_cohort=min_cohort, **self.credentials(c)) for c in self.ids}
        self.run_id = new_run_id()
        self.server = SecAggServer(self.run_id, **server)
        self.size = size
        self.rng = np.random.default_rng(seed)
        self.codes: Dict[str, np.ndarray] = {}
        self.offline: Dict[str, Set[str]] = {}
        self.restart = False
        self.view: List[Tuple[str, str, Any]] = []
        self.refusals: Dict[str, str] = {}

    def credentials(self, client: str) -> Dict[str, Any]:
        """``identity`` and ``roster`` of ``client`` (empty in the unauthenticated mode)."""
        party = self.identities.get(client)
        return {} if party is None else {"identity": party.signing_key, "roster": party.roster}

    def send(self, stage: str, requests: Dict[str, Dict[str, Any]]) -> Dict[str, Optional[Dict[str, Any]]]:
        answers: Dict[str, Optional[Dict[str, Any]]] = {}
        for c, request in requests.items():
            answers[c] = None
            if c in self.offline.get(stage, ()):
                continue
            if self.restart:
                self.clients[c] = SecAggClient.from_state(self.clients[c].to_state(), **self.credentials(c))
            try:
                answers[c] = self.clients[c].respond(stage, request, self.codes.get(c))
            except SecAggRefused as error:
                self.refusals[c] = str(error)
            if answers[c] is not None:
                self.view.append((stage, c, answers[c]))
        return answers

    def setup(self):
        return drive(self.server.setup_stages(self.ids), self.send)

    def exchange(self, round: int = 0, cohort: Optional[Sequence[str]] = None, phase: str = "stats") -> Exchange:
        return Exchange(
            self.run_id, "train", round, phase, tuple(cohort if cohort is not None else self.server.eligible)
        )

    def fields(self, exchange: Exchange) -> Dict[str, Any]:
        """The fields every request of ``exchange`` carries (run, purpose, round, phase, cohort bitmap, degree)."""
        return {
            "run_id": self.run_id,
            "purpose": exchange.purpose,
            "round": exchange.round,
            "phase": exchange.phase,
            "cohort": members_bitmap(self.ids, exchange.cohort),
            "degree": default_degree(len(exchange.cohort)),
        }

    def draw(self, exchange: Exchange) -> None:
        self.codes = {c: random_codes(self.rng, self.size) for c in exchange.cohort}

    def plain(self, members: Sequence[str]) -> np.ndarray:
        total = np.zeros(self.size, dtype=np.uint64)
        for c in members:
            total += self.codes[c]
        return total

    def secure_sum(self, exchange: Exchange, **kwargs: Any) -> SecureSum:
        self.draw(exchange)
        return drive(self.server.secure_sum_stages(exchange, self.size, **kwargs), self.send)

    def received(self, stage: str, exchange: Exchange) -> Dict[str, List[Dict[str, Any]]]:
        """What the server received at ``stage`` for ``exchange``: ``client -> [responses]``."""
        out: Dict[str, List[Dict[str, Any]]] = {}
        for s, c, answer in self.view:
            if s == stage and answer.get("tag") == exchange.digest:
                out.setdefault(c, []).append(answer)
        return out

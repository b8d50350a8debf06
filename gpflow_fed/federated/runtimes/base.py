"""What every runtime shares: the Runtime interface, the in-process parties, and client seeds.

A runtime is where the parties run and how messages reach them (a
:class:`~gpflow_fed.federated.protocol.transport.Transport`); the run itself — set-up, phases, protection, rounds — is
:func:`~gpflow_fed.federated.engine.loop.set_up_run` and :func:`~gpflow_fed.federated.engine.loop.run_rounds`, the same
for every runtime. A run's options and protection are values (:class:`~gpflow_fed.federated.RunOptions`,
:class:`~gpflow_fed.federated.Protection`) given to :func:`~gpflow_fed.federated.run`; a runtime may hold defaults for
them (its ``options=`` and ``protection=``).
"""

from __future__ import annotations

import abc
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

from ...data.dataset import FederatedDataset
from ...metrics import evaluate_model  # noqa: F401  (re-exported: the runtimes' evaluation)
from ...validation import integer
from ..protocol.algorithm import Algorithm, FederationInfo
from ..protocol.client import Client
from ..engine.endpoint import ClientEndpoint
from ..engine.loop import run_rounds, set_up_run
from ..engine.options import RunOptions
from ..protection.encoder import ClientEncoder
from ..protection.identity import PartyIdentity
from ..protection.policy import ClientPolicy
from ..protection.reduction import Reducer
from ..protection.request import Protection
from ..engine.result import FederatedResult, party_labels
from ..protocol.transport import Request, Response, Transport

__all__ = ["InProcessRuntime", "Runtime", "client_seed", "make_clients", "sampling_rng"]


def client_seed(seed: int, index: int, num_clients: int) -> int:
    """Client ``index``'s seed: the state of ``SeedSequence(seed, spawn_key=(index + 1,))``, which is child
    ``index + 1`` of ``SeedSequence(seed).spawn(K + 1)``, computed in O(1).

    :raises ValueError: ``index`` outside ``[0, K)``.
    """
    if not 0 <= index < num_clients:
        raise ValueError(f"client index {index} is outside [0, {num_clients}); number the parties 0 … K-1")
    return int(np.random.SeedSequence(int(seed), spawn_key=(index + 1,)).generate_state(1)[0])


def sampling_rng(seed: int, num_clients: int = 0) -> np.random.Generator:
    """The server's client-sampling RNG: child 0 of ``SeedSequence(seed)`` (``num_clients`` is not needed)."""
    return np.random.default_rng(np.random.SeedSequence(int(seed), spawn_key=(0,)))


def make_clients(dataset: FederatedDataset, seed: int) -> Tuple[List[Client], np.random.Generator]:
    """Build ``Client("client_k")`` objects with seeds derived from ``seed``, and the server's sampling RNG.

    The same seed gives the same run on every runtime (a Flower party derives its own seed the same way).
    """
    integer(seed, "seed", minimum=0)
    K = dataset.num_clients
    clients = [Client(f"client_{k}", data, client_seed(seed, k, K)) for k, data in enumerate(dataset.clients)]
    return clients, sampling_rng(seed)


def federation_info(clients: List[Client], dataset: FederatedDataset, seed: int) -> FederationInfo:
    """What the server knows of an in-process federation: ids, sizes, D, P and the seed."""
    return FederationInfo(
        client_ids=tuple(c.id for c in clients),
        client_sizes={c.id: c.num_data for c in clients},
        input_dim=dataset.input_dim,
        output_dim=dataset.output_dim,
        seed=int(seed),
    )


class Runtime(abc.ABC):
    """Executes an :class:`~gpflow_fed.federated.Algorithm` over a :class:`FederatedDataset`.

    :param options: default :class:`RunOptions` of the runs this runtime executes (``run(options=...)`` wins).
    :param protection: default :class:`Protection` request (``run(protection=...)`` wins).
    :param client_policy: the policy of every party the runtime hosts (default: matching the run's protection).
    """

    def __init__(
        self,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        client_policy: Optional[ClientPolicy] = None,
    ) -> None:
        if options is not None and not isinstance(options, RunOptions):
            raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
        if protection is not None and not isinstance(protection, Protection):
            raise TypeError(f"protection must be a Protection, got {type(protection).__name__}")
        if client_policy is not None and not isinstance(client_policy, ClientPolicy):
            raise TypeError(f"client_policy must be a ClientPolicy, got {type(client_policy).__name__}")
        self.options = RunOptions() if options is None else options
        self.protection = Protection() if protection is None else protection
        self.client_policy = client_policy

    @property
    def faults(self) -> Any:
        """The default runs' fault policy (``options.faults``)."""
        return self.options.faults

    @abc.abstractmethod
    def execute(
        self,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        monitor: Optional[Any] = None,
        seed: int = 0,
    ) -> FederatedResult:
        """Run every round and return the result."""


class InProcessRuntime(Runtime, Transport):
    """Base of the runtimes whose parties live in this process; each is its own run's transport.

    It builds one :class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint` per client of the dataset (its data, its
    seed, the run's bound algorithm, an encoder with ``client_policy`` — by default
    :meth:`ClientPolicy.matching` the run's protection: every party is in this process, so the policy is for parity
    with a deployment, not protection), and a subclass implements :meth:`send` over :attr:`endpoints`.

    :param options: default :class:`RunOptions` of its runs.
    :param protection: default :class:`Protection` request of its runs.
    :param client_policy: the policy of every in-process client (default: matching the run's protection).
    """

    def __init__(
        self,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        client_policy: Optional[ClientPolicy] = None,
    ) -> None:
        super().__init__(options=options, protection=protection, client_policy=client_policy)
        self.endpoints: Dict[str, ClientEndpoint] = {}

    def prepare(self, algorithm: Algorithm, dataset: FederatedDataset, reducer: Reducer) -> None:
        """Checks and set-up before any client work (subclasses add theirs); raise ``ValueError``/``TypeError``."""

    def options_for(self, options: RunOptions) -> RunOptions:
        """The options this runtime runs with (a subclass may place checkpoints per worker)."""
        return options

    def execute(
        self,
        algorithm: Algorithm,
        dataset: FederatedDataset,
        *,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        monitor: Optional[Any] = None,
        seed: int = 0,
    ) -> FederatedResult:
        import time

        start = time.perf_counter()
        options = self.options_for(options or self.options)
        protection = protection or self.protection
        clients, seeded = make_clients(dataset, seed)
        info = federation_info(clients, dataset, seed)
        setup = set_up_run(algorithm, info, dataset, options, protection)
        policy = self.client_policy or ClientPolicy.matching(protection)
        # every party in this process: a fresh signing key each and the roster of them all (parity with a deployment,
        # where each party holds its own key and the roster agreed out of band)
        identities = PartyIdentity.federation([c.id for c in clients])
        self.endpoints = {
            c.id: ClientEndpoint(setup.algorithm, c, info, ClientEncoder(c.id, policy, identity=identities[c.id]))
            for c in clients
        }
        self.prepare(setup.algorithm, dataset, setup.reducer)
        result = run_rounds(
            setup,
            self,
            seeded_sampling=seeded,
            endpoints=self.endpoints,
            test=dataset.test,
            monitor=monitor,
            start=start,
        )
        # the names a deployment's server would show (the same rules): a table's party column, or the ids
        result.party_names = party_labels({c: str(n) for c, n in zip(info.client_ids, dataset.names)})[0]
        return result

    def send(self, requests: Mapping[str, Request]) -> Dict[str, Response]:  # pragma: no cover - abstract
        raise NotImplementedError

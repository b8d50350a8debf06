"""The Algorithm protocol: configure a round, update on clients, aggregate a weighted sum, return a model.

A round is one or more *phases* (exchanges). In each phase the server broadcasts named arrays to the
round's clients, each client answers with a :class:`Message`, the aggregator
(:mod:`gpflow_fed.federated.protection.reduction`) reduces the answers, and the server updates its state from the
reduction. Reductions are always weighted sums:

* ``"sum"``: ``Σ_k a_k`` (sufficient statistics);
* ``"mean"``: ``Σ_k w_k a_k / Σ_k w_k`` with ``w_k`` the message weight (FedAvg);
* ``"collect"``: the messages themselves, for algorithms whose server step needs each client's message
  (these cannot use secure aggregation).

This mirrors Flower's strategy (configure → client work → aggregate), so runtimes are thin adapters.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Final, Generic, List, Mapping, Optional, Sequence, Tuple, TypeVar, Union

import numpy as np

from ...validation import integer
from .client import Client
from .domain import DataDomain
from .fingerprint import values_digest
from .messages import Message
from .sampling import sample_clients, validate_client_fraction

if TYPE_CHECKING:  # the protocol imports no TensorFlow or GPflow at import time: an engine may run without them
    import gpflow

AGGREGATIONS = ("sum", "mean", "collect")

#: The phase of an algorithm that exchanges once per round (the default :meth:`Algorithm.phases`).
TRAIN_PHASE: Final[str] = "train"

#: What the server expects of one phase's replies: array name -> shape, ``None`` for a free dimension.
ReplySpec = Mapping[str, Tuple[Optional[int], ...]]


@dataclass(frozen=True)
class FederationInfo:
    """What the server knows about the federation before training: no data, only its shape."""

    client_ids: Tuple[str, ...]
    client_sizes: Mapping[str, int]
    input_dim: int
    output_dim: int
    seed: int

    @property
    def num_clients(self) -> int:
        return len(self.client_ids)

    @property
    def num_data(self) -> int:
        return int(sum(self.client_sizes.values()))


@dataclass(frozen=True)
class Aggregate:
    """The server's view of one phase: the reduced arrays, never the individual payloads (unless collected).

    :param arrays: the reduction per array name (a sum or a weighted mean, per the phase's aggregation).
    :param total_weight: ``Σ_k w_k``.
    :param senders: the clients that answered.
    :param metrics: weight-averaged scalar metrics of the messages.
    :param messages: the messages themselves, only for ``"collect"`` phases.
    :param noised: differential privacy added noise to ``arrays`` (the server step must expect, e.g., a
        Gram sum that is no longer PSD, and may post-process it).
    :param noise_std: the standard deviation of that noise on every entry of ``arrays`` (0 when not noised).
        It is public (``z·C``, divided by the total weight for a ``"mean"``), so a server step may use it in
        post-processing, e.g. a ridge of the noise's size.
    """

    round: int
    phase: str
    arrays: Mapping[str, np.ndarray]
    total_weight: float
    senders: Tuple[str, ...]
    metrics: Mapping[str, float] = field(default_factory=dict)
    messages: Optional[Tuple[Message, ...]] = None
    noised: bool = False
    noise_std: float = 0.0

    def __getitem__(self, name: str) -> np.ndarray:
        return self.arrays[name]


class BroadcastRefused(ValueError):
    """Raised by ``Algorithm.client_update`` for a broadcast whose *form* it refuses (names or shapes it does not read),
    before it reads the client's data: the client sends this reason as it is. Any other exception an update raises on a
    protected phase may depend on the data, so the client sends only that it failed, and stops answering protected
    exchanges for the run (:class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint`)."""


def answer_once_per(
    client: Client, record: str, fixed: Mapping[str, Any], linear: Mapping[str, Any], what: str
) -> None:
    """Refuse a second answer of a client's update that is exactly linear in arrays the server chooses (``linear``)
    while everything else it depends on (``fixed``) is unchanged: asked with ``a`` over a cohort and ``2a`` over the
    cohort without one client, the two sums give that client's answer (issue 43: FedBNR's ``"weights"`` in ``A⁻¹``,
    FSGP's ``"gradient"`` in its adjoints). The client records, in its own ``client.state[record]`` (kept by
    checkpoints and a Flower party's saved state), the digest of ``linear`` per digest of ``fixed``
    (:func:`~.fingerprint.values_digest`); the same ``linear`` again is a retry, answered. The refusal depends only on
    what the server asked before, never on the data.

    :raises BroadcastRefused: other ``linear`` values for ``fixed`` answered before (``what`` names them).
    """
    answered = client.state.setdefault(record, {})
    asked = values_digest(linear)
    if answered.setdefault(values_digest(fixed), asked) != asked:
        raise BroadcastRefused(
            f"this client answered {what} already with other values (the answer is linear in them: one answer per "
            "state of everything else it reads); refused"
        )


#: the server state of an algorithm (e.g. :class:`~gpflow_fed.federated.algorithms.FSGPState`)
StateT = TypeVar("StateT")


class Algorithm(abc.ABC, Generic[StateT]):
    """A federated algorithm as a strategy: the runtime owns the loop, the algorithm owns the maths.

    Generic in its server state ``StateT`` (``class FSGP(Algorithm[FSGPState])``): :meth:`initial_state` makes one,
    :meth:`server_update` returns the next, and the methods that read the state take one.

    Subclasses implement :meth:`initial_state`, :meth:`broadcast`, :meth:`client_update`,
    :meth:`server_update` and :meth:`result`; they may override :meth:`phases`, :meth:`final_phases`,
    :meth:`aggregation`, :meth:`select_clients`, :meth:`setup_client` and :meth:`validate`.

    Contract: :meth:`client_update` is the only method that sees a client's data, and what it returns is
    all that leaves the client. :meth:`server_update` returns the new state and must leave the old state
    untouched if it raises.

    :param rounds: number of communication rounds R (≥ 0).
    :param client_fraction: ρ ∈ (0, 1]; each round asks ``max(⌈Kρ⌉, 1)`` clients.
    """

    name: str = "algorithm"

    def __init__(self, rounds: int, client_fraction: float = 1.0) -> None:
        self.rounds = integer(rounds, "rounds", minimum=0)
        validate_client_fraction(client_fraction)
        self.client_fraction = float(client_fraction)

    # --- configuration -------------------------------------------------------------------------------
    def bind(self, info: FederationInfo) -> "Algorithm[StateT]":
        """The instance one run uses: a deep copy of this configuration (``gpflow.utilities.deepcopy``).

        The object a user builds is configuration only: the run validates, traces and trains its own copy, so the
        same object can start several runs, a checkpoint's settings are read from it unchanged, and every party of
        a deployment binds its own. Callables the algorithm holds (callbacks, factories) are shared, not copied.
        Subclasses that keep per-run state override this to reset it (calling ``super().bind(info)``).

        :param info: the federation the run is for.
        """
        import gpflow
        import tensorflow as tf

        shared = {id(v): v for v in vars(self).values() if callable(v) and not isinstance(v, tf.Module)}
        return gpflow.utilities.deepcopy(self, memo=shared)

    def validate(self, dataset: Any) -> None:
        """Raise ``ValueError``/``TypeError`` for data this algorithm cannot use, before any training."""

    def phases(self, round: int) -> Tuple[str, ...]:
        """The exchanges of one training round, in order."""
        return (TRAIN_PHASE,)

    def final_phases(self) -> Tuple[str, ...]:
        """Exchanges with every client after the last round, to build the returned model."""
        return ()

    def evaluation_phases(self) -> Tuple[str, ...]:
        """Exchanges with every client for a mid-training evaluation (``RunOptions.eval_every``, purpose
        ``"evaluate"``), run on a copy of the state before :meth:`result` builds the model to evaluate; default
        :meth:`final_phases`.

        An algorithm whose final phases compute what a training phase of the next round asks again (the same
        :meth:`computation` at the same parameters) returns fewer, and evaluates from what its state already holds:
        an honest server never asks one computation twice (a client masks an answer to one broadcast over one
        cohort, and under distributed DP only once). FSGP's exact mode returns ``()``.
        """
        return self.final_phases()

    def stop_early(self, history: Sequence[Mapping[str, Any]]) -> bool:
        """Whether to end training after the rounds of ``history`` (their entries, oldest first), before
        ``rounds``; the final phases still run. Default: never (algorithms with a stopping rule override it)."""
        return False

    def aggregation(self, phase: str) -> str:
        """How the runtime reduces the messages of ``phase``: ``"sum"``, ``"mean"`` or ``"collect"``."""
        return "mean"

    def select_clients(self, round: int, client_ids: Sequence[str], rng: np.random.Generator) -> List[str]:
        """The clients asked in ``round`` (the same for all its phases); default ``max(⌈Kρ⌉, 1)``."""
        return sample_clients(client_ids, self.client_fraction, rng)

    def setup_client(self, client: Client, info: FederationInfo) -> None:
        """Called once per client before its first update (create its model copy and optimizer here).

        :param info: the federation as the server announced it (no server state: a remote party has none).
        """

    def reply_spec(self, state: StateT, round: int, phase: str) -> Optional[ReplySpec]:
        """The array names and shapes the server expects in every reply of ``phase`` (``None``: a free size).

        The runtime excludes a reply that differs, whatever the other clients sent: a malicious or broken
        client cannot outvote an honest one. ``None`` (the default, for algorithms that do not declare it)
        falls back to a strict majority of the replies; a tie fails the phase instead of guessing.
        """
        return None

    def expected_weight(self, phase: str, num_data: int) -> Optional[float]:
        """The weight a client registered with ``num_data`` points must put on its reply of ``phase``.

        The runtime excludes a reply whose weight differs. ``None`` (the default) only bounds it:
        a weight above the client's registered ``N_k`` is always refused, so no client can claim more data
        than it registered to dominate a ``"mean"``.
        """
        return None

    def check_reply(self, state: StateT, phase: str, message: Message, num_data: int) -> Optional[str]:
        """Why the server refuses one client's readable reply of ``phase`` (impossible for any data of the client's
        registered ``num_data`` points), or None. The runtime excludes the client with this reason; it must name
        the check, never a value of the reply. Default: nothing beyond the generic checks."""
        return None

    def check_replies(
        self, state: StateT, phase: str, messages: Sequence[Message], sizes: Sequence[int]
    ) -> List[Optional[str]]:
        """:meth:`check_reply` of each of a cohort's readable replies of ``phase`` (``sizes``: each sender's
        registered ``num_data``), in order; the runtime asks this once a phase. Default: one :meth:`check_reply` a
        reply. An override checks them together (a large cohort's per-reply Python made small) and must give every
        reply exactly :meth:`check_reply`'s verdict."""
        return [self.check_reply(state, phase, message, size) for message, size in zip(messages, sizes)]

    def check_sum(self, state: StateT, aggregate: Aggregate) -> Optional[str]:
        """Why the server refuses the (un-noised) sum of a masked ``"sum"`` phase, or None: the same checks as
        :meth:`check_reply` on the total, when the server cannot see each client's reply."""
        return None

    def ignores(self, phase: str) -> Tuple[str, ...]:
        """The broadcast arrays ``phase``'s :meth:`client_update` does not read (default: none).

        A client's update never receives them (:meth:`read_broadcast`), and what it answers once is keyed by the rest
        only: a broadcast moved only in an array the phase ignores is the same question, not a new one (FSGP's
        statistics do not read the noise variance, so a server that moved it would otherwise be answered again over
        another cohort and difference the two sums). Any other array reaches the update, which refuses what it does
        not expect.
        """
        return ()

    def computation(self, phase: str) -> str:
        """The name of what ``phase``'s :meth:`client_update` computes from the arrays it reads (default: ``phase``).

        Two phases that compute the same function of the broadcast they read share a name: what a client answers
        once under masking is keyed by it, not by the phase (``protection.wire.broadcast_digest``), so a server
        cannot ask one question under two phase names, over a cohort and over the cohort without one client, and
        difference the two sums (FSGP's ``"predict"`` computes its ``"statistics"``; issue 43, eleventh round).
        """
        return phase

    def read_broadcast(self, broadcast: Message) -> Message:
        """``broadcast`` without the arrays its phase :meth:`ignores` (itself when it ignores none)."""
        ignored = set(self.ignores(broadcast.phase)) & set(broadcast.arrays)
        if not ignored:
            return broadcast
        arrays = {name: value for name, value in broadcast.arrays.items() if name not in ignored}
        return Message(broadcast.sender, broadcast.round, broadcast.phase, arrays, weight=broadcast.weight)

    def min_cohort_data(self, phase: str) -> Optional[int]:
        """The least total data a cohort's sum of ``phase`` must hold for it not to determine the cohort's rows (a
        client's policy refuses smaller groups, plain or masked); None: no such bound. FSGP: ``M + 1``."""
        return None

    def payload_bound(self, broadcast: Message, domain: DataDomain) -> Optional[Mapping[str, float]]:
        """Per name of a reply to ``broadcast`` (its arrays and metrics), the largest ``|value|`` it can hold for a
        client whose data lie in ``domain``, from public numbers only: the broadcast and the domain (a refusal it
        decides may reveal the domain's powers of two, nothing else of the data). Before weighting: a ``"mean"``
        reply's bounds are multiplied by its weight. A metric without a bound is not sent under secure aggregation.

        Under secure aggregation without DP a client encodes a phase with a bound only if every bound is within its
        fixed-point range (else it refuses, on these numbers alone) and sends no value beyond it (a non-finite value
        or one beyond its bound stops its protected answers, like an update that raised), so no value is ever
        clipped. ``None`` (the default): no such bound, and a value beyond the range is clipped and counted, which
        a server that scales the payload can read (docs/guides/threat-model.md: the clip leak).
        """
        return None

    # --- the round -----------------------------------------------------------------------------------
    @abc.abstractmethod
    def initial_state(self, info: FederationInfo) -> StateT:
        """The server's state before round 0."""

    @abc.abstractmethod
    def broadcast(self, state: StateT, round: int, phase: str) -> Mapping[str, np.ndarray]:
        """The arrays the server sends to every client of this phase."""

    @abc.abstractmethod
    def client_update(self, client: Client, broadcast: Message) -> Message:
        """The client's work for one phase; returns the only thing that leaves the client."""

    def batched(self, phase: str) -> bool:
        """Whether :meth:`client_updates` computes ``phase``'s updates of a cohort together (default: False).

        A runtime that simulates many clients in one process (``LocalRuntime``) then asks for the cohort's updates in
        one call instead of one :meth:`client_update` per client; each client's answer still goes through its own
        policy, encoding and ledger entry. Declare it only where :meth:`client_updates` returns what
        :meth:`client_update` returns, to round-off.
        """
        return False

    def client_updates(
        self, clients: Sequence[Client], broadcast: Message, memory_budget: int
    ) -> List[Union[Message, Exception]]:
        """What :meth:`client_update` returns for each client of ``clients`` (or the exception it raises), in order.

        Default: one :meth:`client_update` after the other. An algorithm whose :meth:`batched` is True for the phase
        overrides it to compute them together, using at most ``memory_budget`` bytes in one computation (a larger
        cohort is processed in chunks, not refused).
        """
        out: List[Union[Message, Exception]] = []
        for client in clients:
            try:
                out.append(self.client_update(client, broadcast))
            except Exception as exc:  # noqa: BLE001 - the client's own failure, answered as client_update's
                out.append(exc)
        return out

    @abc.abstractmethod
    def server_update(self, state: StateT, aggregate: Aggregate) -> StateT:
        """The server's new state from the reduced messages of one phase."""

    @abc.abstractmethod
    def result(self, state: StateT) -> gpflow.models.GPModel:
        """A GPflow model ready for ``predict_f`` / ``predict_y``, built from the server state alone."""

    def round_metrics(self, state: StateT, aggregates: Sequence[Aggregate]) -> Dict[str, float]:
        """Scalars to record for a round (default: the weight-averaged client metrics of each phase)."""
        out: Dict[str, float] = {}
        for agg in aggregates:
            for k, v in agg.metrics.items():
                out[k if len(aggregates) == 1 else f"{agg.phase}/{k}"] = v
        return out

    def copy_state(self, state: StateT) -> StateT:
        """A deep copy of the state (used to evaluate mid-training without disturbing it)."""
        import gpflow

        return gpflow.utilities.deepcopy(state)

    def checkpoint_objects(self) -> Dict[str, Any]:
        """``{attribute: object}``: the TensorFlow objects of this (bound) algorithm a run checkpoint saves and a
        resume restores. Default: every attribute ``tf.train.Checkpoint`` can save; an algorithm leaves out what it
        recomputes each round (and must keep each object's attribute name, which the checkpoint's paths carry)."""
        from .fingerprint import is_trackable

        return {attr: value for attr, value in sorted(vars(self).items()) if is_trackable(value)}

    # --- helper for subclasses -----------------------------------------------------------------------
    @staticmethod
    def reply(
        client: Client,
        broadcast: Message,
        arrays: Mapping[str, Any],
        weight: float = 1.0,
        metrics: Optional[Mapping[str, float]] = None,
    ) -> Message:
        """Build the client's answer to ``broadcast``."""
        return Message(
            sender=client.id,
            round=broadcast.round,
            phase=broadcast.phase,
            arrays=dict(arrays),
            weight=weight,
            metrics=dict(metrics or {}),
        )

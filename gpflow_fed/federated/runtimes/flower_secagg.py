"""Secure aggregation and differential privacy on the Flower runtime, through Flower's own SecAgg+.

A phase the :class:`~gpflow_fed.federated.aggregator.Aggregator` protects runs in two exchanges:

1. **prepare** — the server broadcasts as usual, with a ``"protect"`` record (the cohort size). Each client
   runs ``Algorithm.client_update`` and ``Aggregator.prepare``: clipping and weight capping (DP), then the
   fixed-point encoding of :class:`~gpflow_fed.federated.SecureAggregation` (``round(2^f x) mod 2^64``). With
   DP only, it sends the clipped message and the server finishes with ``Aggregator.reduce``. With secure
   aggregation it keeps the encoding in its Flower ``Context.state`` and sends only its *layout* (array
   names and shapes), so faults (raise, NaN, out-of-range values, wrong shapes) are screened before any
   masking, as in ``LocalRuntime``.
2. **SecAgg+** — for the clients whose layouts agree, the server runs Flower's
   ``SecAggPlusWorkflow`` (Bell et al., CCS 2020: X25519 key agreement, Shamir shares of each client's
   mask seed and key, pairwise and private masks) against Flower's ``secaggplus_mod`` on the clients.
   A client that drops out during the protocol is recovered from its neighbours' shares, so the sum of
   the survivors is still exact; the server learns only that sum.

**Exact sums through SecAgg+.** SecAgg+ sums integers below ``Q`` modulo 2³², after mapping each float
``v ∈ [-c, c]`` to ``(v + c) Q / 2c`` with stochastic rounding and dividing the result by the number of
clients. Each 64-bit code is therefore cut into ``⌈64 / b⌉`` limbs of ``b = 31 - ⌈log₂ K⌉`` bits and
sent as ``d - c`` with ``c = 2^{b-1}``, ``Q = 2^b``: the mapping is then the identity on integers (no
rounding happens), ``K (2^b - 1) < 2³²`` so no limb sum wraps, and the server rebuilds
``Σ_k code_k mod 2^64 = Σ_j 2^{bj} Σ_k d_{kj}`` exactly. The decoded sum is bit-for-bit the one
``LocalRuntime(secure_aggregation=True)`` gets; the price is ``⌈64 / b⌉`` int32-sized values per float
(3 for up to 2 clients, 4 up to 512, 5 up to 2²¹).

**What it protects** (honest-but-curious server): the server sees each client's public keys, encrypted
key shares it cannot read, its masked limb vector, and the shares needed to unmask the sum. Flower 1.41
expands each mask from the shared key folded to 32 bits (``numpy.random.RandomState``), so the masks are
only as strong as a 32-bit seed; that is Flower's implementation, documented here rather than hidden.
Client metrics are masked with the payload (their weighted mean is revealed), the layout is public.

Every party builds the same :class:`Aggregator` from the run config (:func:`aggregator_to_config`,
:func:`aggregator_from_config`), as it builds the algorithm from its factory.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitIns, FitRes, Parameters, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from flwr.server import SimpleClientManager
from flwr.server.compat.legacy_context import LegacyContext
from flwr.server.workflow import SecAggPlusWorkflow
from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
from flwr.server.workflow.constant import Key as WorkflowKey
from flwr.serverapp import Grid

from ..protection.dp import DifferentialPrivacy
from ..protection.masking import SecureAggregation, from_limb_sums, to_limbs
from ..protection.robust import RobustAggregation
from ..algorithm import Algorithm
from ..messages import Message
from ..aggregator import Aggregator
from ..faults import reply_fault
from .flower_records import message_to_recorddict

__all__ = [
    "PROTECT",
    "aggregator_from_config",
    "aggregator_to_config",
    "check_secagg_settings",
    "keep_prepared",
    "layout_message",
    "layout_of",
    "limb_bits",
    "masked_input",
    "prepare_reply",
    "protocol_arrays",
    "secagg_plus_sum",
    "secure_sum_mod",
    "shifted_limbs",
]

#: the broadcast record that marks a protected phase (``cohort-size``, ``secure``)
PROTECT = "protect"
#: where a client keeps its encoded payload between the two exchanges (its Flower ``Context.state``)
PREPARED = "gpflow-fed.prepared"
PREPARED_TAG = "gpflow-fed.prepared-tag"
LAYOUT = "layout"
MODULUS = 2**32
#: Flower's name for the config a SecAgg+ message carries
SECAGG_RECORD = RECORD_KEY_CONFIGS


# --- the Aggregator as run config ------------------------------------------------------------------------
def aggregator_to_config(aggregator: Aggregator) -> Dict[str, Union[bool, int, float, str]]:
    """The run-config entries from which :func:`aggregator_from_config` rebuilds ``aggregator``.

    Keys: ``secure-aggregation`` (bool), ``fractional-bits``, ``min-cohort``; ``robust-method``,
    ``robust-trim``, ``robust-clip-norm``; with DP ``dp-noise-multiplier``,
    ``dp-clip-norm``, ``dp-delta``, ``dp-weight-bound``, ``dp-accountant`` and ``dp-phases`` (comma-separated,
    empty for every sum phase).
    """
    config: Dict[str, Union[bool, int, float, str]] = {"secure-aggregation": aggregator.secure is not None}
    if aggregator.secure is not None:
        config["fractional-bits"] = int(aggregator.secure.fractional_bits)
        config["min-cohort"] = int(aggregator.secure.min_cohort)
    if aggregator.robust is not None:
        config.update({"robust-method": aggregator.robust.method, "robust-trim": float(aggregator.robust.trim)})
        if aggregator.robust.clip_norm is not None:
            config["robust-clip-norm"] = float(aggregator.robust.clip_norm)
    dp = aggregator.dp
    if dp is not None:
        config.update(
            {
                "dp-noise-multiplier": float(dp.noise_multiplier),
                "dp-clip-norm": float(dp.clip_norm),
                "dp-delta": float(dp.delta),
                "dp-weight-bound": float(dp.weight_bound),
                "dp-accountant": dp.accountant,
                "dp-phases": "" if dp.phases is None else ",".join(dp.phases),
            }
        )
        if dp.insecure_noise_seed is not None:  # tests only (see DifferentialPrivacy)
            config["dp-insecure-noise-seed"] = int(dp.insecure_noise_seed)
    return config


def aggregator_from_config(config: Mapping[str, Any]) -> Aggregator:
    """The :class:`Aggregator` a run config describes (none of the keys: no protection).

    :raises ValueError, TypeError: invalid settings (from ``SecureAggregation``/``DifferentialPrivacy``).
    """
    secure = None
    if config.get("secure-aggregation", False):
        secure = SecureAggregation(
            int(config.get("fractional-bits", SecureAggregation.fractional_bits)),
            min_cohort=int(config.get("min-cohort", SecureAggregation.min_cohort)),
        )
    robust = None
    if "robust-method" in config:
        clip = config.get("robust-clip-norm")
        robust = RobustAggregation(
            str(config["robust-method"]),
            float(config.get("robust-trim", RobustAggregation.trim)),
            None if clip is None else float(clip),
        )
    dp = None
    if "dp-noise-multiplier" in config or "dp-clip-norm" in config:
        phases = str(config.get("dp-phases", ""))
        dp = DifferentialPrivacy(
            noise_multiplier=float(config["dp-noise-multiplier"]),
            clip_norm=float(config["dp-clip-norm"]),
            delta=float(config.get("dp-delta", DifferentialPrivacy.delta)),
            weight_bound=float(config.get("dp-weight-bound", DifferentialPrivacy.weight_bound)),
            accountant=str(config.get("dp-accountant", DifferentialPrivacy.accountant)),
            phases=tuple(p for p in phases.split(",") if p) or None,
            insecure_noise_seed=int(config["dp-insecure-noise-seed"]) if "dp-insecure-noise-seed" in config else None,
        )
    return Aggregator(secure=secure, dp=dp, robust=robust)


# --- 64-bit codes as limbs SecAgg+ sums exactly ---------------------------------------------------------
def limb_bits(cohort_size: int) -> int:
    """``b = 31 - ⌈log₂ K⌉``: ``K`` limbs below ``2^b`` (and SecAgg+'s ``K Q`` weight) stay below 2³².

    :raises ValueError: ``cohort_size < 1``, or a cohort too large for limbs of at least 2 bits.
    """
    if cohort_size < 1:
        raise ValueError(f"a cohort has at least one client, got {cohort_size}")
    bits = 31 - (int(cohort_size) - 1).bit_length()
    if bits < 2:
        raise ValueError(f"a SecAgg+ cohort of {cohort_size} clients is too large for exact sums modulo 2^32")
    return bits


def shifted_limbs(codes: np.ndarray, bits: int) -> np.ndarray:
    """:func:`~gpflow_fed.federated.protection.masking.to_limbs` shifted to ``d - 2^{b-1}``, inside SecAgg+'s
    clipping range ``[-c, c]`` with ``c = 2^{b-1}``, where its quantisation is the identity."""
    return to_limbs(codes, bits) - float(1 << (bits - 1))


# --- the client's side ---------------------------------------------------------------------------------
def layout_of(message: Message) -> str:
    """A message's public layout, ``[[name, shape], ...]`` in sorted-name order, as JSON."""
    return json.dumps([[name, list(np.shape(message.arrays[name]))] for name in sorted(message.arrays)])


def layout_message(content: RecordDict) -> Message:
    """The server's stand-in for a secure prepare reply: zeros in the announced layout, for fault screening.

    :raises ValueError: a content without a layout record.
    """
    if LAYOUT not in content.config_records:
        raise ValueError("a reply to a secure phase must carry its layout")
    record = content.config_records[LAYOUT]
    arrays = {str(name): np.zeros(shape) for name, shape in json.loads(str(record[LAYOUT]))}
    return Message(str(record["sender"]), int(record["round"]), str(record["phase"]), arrays, weight=0.0)  # type: ignore[arg-type]


def protocol_arrays(config: Mapping[str, Any]) -> Dict[str, np.ndarray]:
    """The numbers and bytes of one SecAgg+ message as arrays, for the ledger (the stage name is dropped)."""
    arrays: Dict[str, np.ndarray] = {}
    for key, value in config.items():
        if isinstance(value, bytes):
            arrays[key] = np.frombuffer(value, dtype=np.uint8)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            arrays[key] = np.frombuffer(b"".join(value), dtype=np.uint8)
        elif isinstance(value, (list, int, float)) and not isinstance(value, bool):
            arrays[key] = np.asarray(value)
    return arrays


def keep_prepared(context: Context, prepared: Message, purpose: str) -> RecordDict:
    """Keep the encoded ``prepared`` message in the client's ``Context.state``; return the layout reply."""
    names = sorted(prepared.arrays)
    context.state.array_records[PREPARED] = ArrayRecord(
        {n: Array(np.array(prepared.arrays[n], order="C")) for n in names}
    )
    tag = {"purpose": purpose, "round": int(prepared.round), "phase": prepared.phase, "sender": prepared.sender}
    context.state.config_records[PREPARED_TAG] = ConfigRecord(tag)
    return RecordDict({LAYOUT: ConfigRecord({**tag, LAYOUT: layout_of(prepared)})})


def prepare_reply(
    context: Context,
    algorithm: Algorithm,
    client_id: str,
    down: Message,
    reply: Message,
    purpose: str,
    protect: ConfigRecord,
) -> RecordDict:
    """A client's reply in the prepare exchange of a protected phase (module docstring, step 1).

    Checks the reply as the server would (``reply_fault``), then ``Aggregator.prepare`` with the run
    config's aggregator: with DP only, the clipped message; with secure aggregation, the encoding is kept
    (:func:`keep_prepared`) and only its layout is returned.

    :raises ValueError: a faulty reply or a value outside the fixed-point range (the server excludes the
        client with this reason).
    """
    fault = reply_fault(reply, client_id, down)
    if fault is not None:
        raise ValueError(fault)
    aggregator = aggregator_from_config(context.run_config)
    prepared = aggregator.prepare(reply, algorithm.aggregation(down.phase), int(protect["cohort-size"]))  # type: ignore[arg-type]
    if aggregator.secure is None:
        return message_to_recorddict(prepared, purpose)
    return keep_prepared(context, prepared, purpose)


def masked_input(content: RecordDict, context: Context) -> RecordDict:
    """What the app hands SecAgg+'s collect stage: the kept encoding as limbs, in a FitRes content.

    ``num_examples`` is 1 and the workflow's ``max_weight`` is 1, so SecAgg+'s weighting is the identity.

    :raises ValueError: nothing kept, or kept for another exchange than the server asks about.
    """
    fitins = compat.recorddict_to_fitins(content, keep_input=True)
    if PREPARED_TAG not in context.state.config_records:
        raise ValueError("SecAgg+ asked for a masked payload, but this client prepared none")
    kept = context.state.config_records[PREPARED_TAG]
    wanted = {k: fitins.config[k] for k in ("purpose", "round", "phase")}
    if {k: kept[k] for k in wanted} != wanted:
        raise ValueError(f"SecAgg+ asked for {wanted}, but this client prepared {dict(kept)}")
    arrays = context.state.array_records[PREPARED]
    codes = np.concatenate([arrays[n].numpy().astype(np.uint64).ravel() for n in sorted(arrays)])
    limbs = shifted_limbs(codes, int(fitins.config["limb-bits"]))  # type: ignore[arg-type]
    del context.state.array_records[PREPARED], context.state.config_records[PREPARED_TAG]
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters([limbs]), 1, {})
    return compat.fitres_to_recorddict(fitres, keep_input=True)


def secure_sum_mod(
    msg: FlowerMessage, context: Context, call_next: Callable[[FlowerMessage, Context], FlowerMessage]
) -> FlowerMessage:
    """ClientApp mod: SecAgg+ messages (those carrying its config record) go through Flower's
    ``secaggplus_mod``; every other message goes straight to the app."""
    if msg.has_content() and SECAGG_RECORD in msg.content.config_records:
        return secaggplus_mod(msg, context, call_next)
    return call_next(msg, context)


# --- the server's side ---------------------------------------------------------------------------------
class _Node:
    """What ``SecAggPlusWorkflow`` needs of a legacy ``ClientProxy``: its node id."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id


class _Exchange:
    """The legacy ``Strategy`` face ``SecAggPlusWorkflow`` drives: it names the cohort and keeps the sum."""

    def __init__(self, nodes: Sequence[int], config: Dict[str, Union[int, str]]) -> None:
        self.nodes = list(nodes)
        self.config = config
        self.sum: Optional[np.ndarray] = None
        self.survivors: List[int] = []

    def configure_fit(
        self, server_round: int, parameters: Parameters, client_manager: Any
    ) -> List[Tuple[_Node, FitIns]]:
        return [(_Node(n), FitIns(Parameters([], "numpy.ndarray"), dict(self.config))) for n in self.nodes]

    def aggregate_fit(
        self, server_round: int, results: Sequence[Tuple[_Node, FitRes]], failures: Sequence[Any]
    ) -> Tuple[None, Dict]:
        # SecAgg+ gives every result the unmasked mean over the K survivors; K times it is the sum
        self.survivors = [int(node.node_id) for node, _ in results]
        (mean,) = parameters_to_ndarrays(results[0][1].parameters)
        self.sum = len(results) * (np.asarray(mean, dtype=np.float64) + float(self.config["offset"]))
        return None, {}


class _RecordingGrid(Grid):
    """A Grid that hands every SecAgg+ message and reply to ``record(node, stage, outgoing, config)``."""

    def __init__(self, grid: Grid, record: Callable[[int, str, bool, Mapping[str, Any]], None]) -> None:
        self.grid = grid
        self.record = record

    def __getattr__(self, name: str) -> Any:
        return getattr(self.grid, name)

    def send_and_receive(
        self, messages: Sequence[FlowerMessage], *, timeout: Optional[float] = None
    ) -> List[FlowerMessage]:
        messages = list(messages)
        stage = ""
        for msg in messages:
            config = msg.content.config_records[SECAGG_RECORD]
            stage = str(config.get("stage", ""))
            self.record(int(msg.metadata.dst_node_id), stage, True, config)
        replies = list(self.grid.send_and_receive(messages, timeout=timeout))
        for reply in replies:
            if not reply.has_error():
                self.record(int(reply.metadata.src_node_id), stage, False, reply.content.config_records[SECAGG_RECORD])
        return replies

    # the abstract Grid interface, delegated
    def set_run(self, run_id: int) -> None:
        self.grid.set_run(run_id)

    @property
    def run(self) -> Any:
        return self.grid.run

    def create_message(self, *args: Any, **kwargs: Any) -> FlowerMessage:
        return self.grid.create_message(*args, **kwargs)

    def get_node_ids(self) -> Any:
        return self.grid.get_node_ids()

    def push_messages(self, messages: Any) -> Any:
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids: Any) -> Any:
        return self.grid.pull_messages(message_ids)


def check_secagg_settings(num_shares: Union[int, float], reconstruction_threshold: Union[int, float]) -> None:
    """Check SecAgg+'s ``num_shares`` and ``reconstruction_threshold`` before a run (Flower's own checks).

    :raises ValueError, TypeError: settings ``SecAggPlusWorkflow`` refuses (its message names them).
    """
    SecAggPlusWorkflow(num_shares, reconstruction_threshold)


def secagg_plus_sum(
    grid: Grid,
    nodes: Sequence[int],
    size: int,
    exchange: Mapping[str, Union[int, str]],
    *,
    num_shares: Union[int, float] = 1.0,
    reconstruction_threshold: Union[int, float] = 0.5,
    timeout: Optional[float] = None,
    record: Optional[Callable[[int, str, bool, Mapping[str, Any]], None]] = None,
) -> Tuple[Optional[np.ndarray], List[int]]:
    """``Σ_k code_k mod 2^64`` over the ``nodes`` that finish Flower's SecAgg+ protocol, and those nodes.

    :param nodes: the cohort's node ids (at least 2: SecAgg+ refuses fewer).
    :param size: the number of 64-bit codes each client holds.
    :param exchange: ``purpose``, ``round``, ``phase`` of the kept encodings (sent to the clients, which check it).
    :param num_shares: SecAgg+'s neighbours per client (a fraction of the cohort, or a count > 2).
    :param reconstruction_threshold: shares needed to recover a secret (a fraction, or a count).
    :param record: called for every protocol message (node, stage, outgoing?, config) — the ledger.
    :return: ``(codes, survivors)``; ``(None, [])`` if the protocol halted (too few clients left).
    """
    bits = limb_bits(len(nodes))
    offset = 1 << (bits - 1)
    config: Dict[str, Union[int, str]] = {**dict(exchange), "limb-bits": bits, "offset": offset}
    strategy = _Exchange(nodes, config)
    state = RecordDict(
        {
            MAIN_CONFIGS_RECORD: ConfigRecord({WorkflowKey.CURRENT_ROUND: int(exchange["round"])}),
            MAIN_PARAMS_RECORD: ArrayRecord(),
        }
    )
    context = LegacyContext(
        Context(run_id=0, node_id=0, node_config={}, state=state, run_config={}),
        strategy=strategy,  # type: ignore[arg-type]
        client_manager=SimpleClientManager(),
    )
    workflow = SecAggPlusWorkflow(
        num_shares=num_shares,
        reconstruction_threshold=reconstruction_threshold,
        max_weight=1.0,
        clipping_range=float(offset),
        quantization_range=1 << bits,
        modulus_range=MODULUS,
        timeout=timeout,
    )
    workflow(_RecordingGrid(grid, record) if record is not None else grid, context)
    if strategy.sum is None:
        return None, []
    codes = from_limb_sums(strategy.sum, bits)
    if codes.size != size:
        raise ValueError(f"SecAgg+ returned {codes.size} codes, expected {size}")
    return codes, strategy.survivors

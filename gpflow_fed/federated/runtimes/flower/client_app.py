"""The Flower ClientApp of gpflow-fed: one party's side of any :class:`~gpflow_fed.federated.Algorithm`.

A SuperNode is one party. Its node config names its private data, its place in the federation and its own
protection policy. These are every key the ClientApp reads, one line each (each value parsed strictly: a malformed
one is a ``ValueError`` naming its key):

* ``data``: path to an ``.npz`` file holding ``X`` ``[N_k, D]`` and ``Y`` ``[N_k, P]`` (never sent);
* ``client-index``: k ∈ {0, …, K-1}: the client ``"client_k"``, seeded as ``make_clients`` seeds it;
* ``state-dir`` (optional): its private model-state folder between messages (default ``$XDG_CACHE_HOME/gpflow_fed``);
* ``features`` and ``target`` (optional): its column names (comma-separated features), reported by ``describe``;
* ``party-name`` (optional): the label the server shows for this party, reported by ``describe`` when
  :func:`~gpflow_fed.validation.party_name` accepts it (its protocol id stays ``client_k``);
* ``signing-key``: its Ed25519 key file (``gpflow-fed flower keygen``), checked with ``roster`` at setup;
* ``roster``: the roster file agreed out of band (one ``<id> <hex public key>`` line per party);
* ``no-roster`` (default false): ``true`` opts out of ``signing-key`` and ``roster`` (a semi-honest server only);
* ``secure-aggregation`` (default true): never send a ``"sum"``/``"mean"`` payload in plain;
* ``min-cohort`` (default 2): the fewest cohort members it masks with;
* ``fractional-bits`` (default 32): its fixed-point resolution ``2^-f``;
* ``protect-small-cohorts`` (default true): refuse a sum that would determine a small cohort's rows;
* ``masking-degree`` (default 0: the protocol's): the least degree of a masking or share-holder graph it accepts;
* ``min-noise-multiplier`` (default 0: none): the least distributed-DP noise it adds itself;
* ``honest-clients`` (default 0: any): the most honest clients it assumes under distributed DP;
* ``max-rounds`` (default ``DEFAULT_MAX_ROUNDS``, 1000): the most training rounds it answers;
* ``max-colluders`` (default: the protocol's c): the collusion bound that sets its consistency-round quorum;
* ``trust-server-noise`` (default false): let a DP clip bind its bounded payload under central DP's (server's) noise;
* ``dp-budget-epsilon`` and ``dp-budget-delta`` (both or neither): the (ε, δ) its distributed-DP answers may spend;
* ``dp-ledger``: its DP ledger file, required with a budget (``gpflow-fed flower ledger create``);
* ``worker`` (optional): the folder of the party's worker (:mod:`.worker`), which computes its updates in one
  process for the whole run (``gpflow-fed flower party`` starts it and sets this).

The policy keys are :meth:`~gpflow_fed.federated.protection.policy.ClientPolicy.from_node_config`'s (what each
means: :mod:`~gpflow_fed.federated.protection.policy`); no run config and no message can lower them.

A table run (``gpflow-fed flower party``) holds two jobs: its requests name them (:func:`.records.job_moments`).
For the ``"moments"`` job the party answers :class:`~gpflow_fed.federated.algorithms.Moments` on its rows as they
are; for the ``"train"`` job it standardises its own rows with the moments the request carries, before anything
else sees them. Each job has its own client and state folder.

The run config's ``algorithm`` names the algorithm factory ``"package.module:function"`` (see
:func:`~gpflow_fed.federated.runtimes.flower.records.load_factory`); every party calls it with the run config and
binds its own copy to the federation the server announces.

Handlers: ``query`` answers the server's ``describe`` with ``(k, N_k, D, P)`` (what
:class:`~gpflow_fed.federated.FederationInfo` holds); ``train`` answers one stage of an exchange with the party's
:class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint` — the same code that answers in every runtime. Flower
starts a
fresh ClientApp process for every message, so after each message the client writes its own state — RNG,
``client.state``, and through ``tf.train.Checkpoint`` its model, optimizer (Adam moments, step count) and
TensorFlow objects, the same record as a checkpoint of :mod:`gpflow_fed.federated.engine.checkpoint` — to its
``state-dir``, and its encoder (keys, what it prepared and answered) to Flower's ``Context.state`` only; the next
message rebuilds the client with ``Algorithm.setup_client`` and restores both, so a Flower client evolves exactly
like a ``LocalRuntime`` one.

**A message costs what it carries.** Only a stage that computes on the party's rows (an ``update``) builds the
party's algorithm, reads its data and restores its model, and so imports TensorFlow (GPflow, its checkpoint). A
secure-aggregation stage (``advertise``, ``share``, ``store``, ``masked_input``, ``unmask``) is answered by the
party's encoder alone, restored from and saved back to ``Context.state`` (:func:`_protocol_answer`), and ``describe``
reads only its data's shapes: this module imports no TensorFlow, so a ClientApp process that handles such a message
starts in about the time Flower's own imports take. An update goes to the party's worker when its node config names
one (:mod:`.worker`: TensorFlow imported once, the party's endpoint kept alive, its encoder still in
``Context.state``), and is computed here only when the worker cannot be reached (:class:`ClientHost`).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.clientapp import ClientApp

from ....validation import integer, party_name
from ...protocol.algorithm import Algorithm, FederationInfo
from ...protocol.client import Client
from ...engine.endpoint import ClientEndpoint, fault_response, protocol_response
from ...protocol.fingerprint import is_trackable
from ...protection.encoder import ClientEncoder
from ...protection.identity import node_identity
from ...protection.policy import ClientPolicy
from ...protocol.transport import PROTOCOL_STAGES, Request, Response
from .records import (
    TRAIN_JOB,
    AgreedMoments,
    job_algorithm as default_job_algorithm,
    job_moments,
    recorddict_to_request,
    request_context,
    response_to_recorddict,
)

__all__ = ["DESCRIBE", "ClientHost", "JobAlgorithm", "describe_reply", "load_client_data", "make_client_app", "app"]

DESCRIBE = "describe"

#: the algorithm a party runs for a job, from the job's name and the run config (default :func:`.records.job_algorithm`)
JobAlgorithm = Callable[[str, Mapping[str, Any]], Algorithm]
#: the endpoints a kept-alive ClientApp holds, by (run id, node id, job)
Live = Dict[Tuple[int, int, str], ClientEndpoint]
#: where a party keeps its encoder (its keys, what it prepared and answered) between messages: ``Context.state``
ENCODER_STATE = "gpflow-fed.encoder"
#: ``Context.state`` record: per job, the request context (:func:`.records.request_context`) the party answers it with
CONTEXTS = "gpflow-fed.contexts"
#: ``Context.state`` record: per job, how many updates the party has answered (a worker's live endpoint must match it)
UPDATES = "gpflow-fed.updates"
#: the node config key naming the party's worker folder (:mod:`.worker`; set by ``gpflow-fed flower party``)
WORKER = "worker"


def _node_setting(context: Context, key: str) -> Any:
    if key not in context.node_config:
        raise ValueError(
            f"SuperNode {context.node_id}: node config lacks {key!r}; start it with "
            f"--node-config \"data='/path/client.npz' client-index=0\""
        )
    return context.node_config[key]


def load_client_data(context: Context) -> Tuple[int, np.ndarray, np.ndarray]:
    """``(k, X_k, Y_k)`` from the node config, validated like a :class:`~gpflow_fed.data.FederatedDataset`.

    :raises ValueError: a missing setting, a missing file, or an ``.npz`` without ``X`` and ``Y``.
    """
    path = str(_node_setting(context, "data"))
    index = _node_setting(context, "client-index")
    index = integer(index, "node config client-index", minimum=0)
    from ....data.dataset import validate_regression_data  # GPflow's float: imports TensorFlow

    X, Y = _read_data(path)
    X, Y = validate_regression_data(X, Y, f"client {index} ({path})")
    return int(index), X, Y


def _read_data(path: str) -> Tuple[np.ndarray, np.ndarray]:
    """The arrays ``X`` and ``Y`` of the party's ``.npz`` file, as stored.

    :raises ValueError: no such file, or no ``X`` and ``Y`` in it.
    """
    if not os.path.isfile(path):
        raise ValueError(f"node config data={path!r}: no such file")
    with np.load(path) as npz:
        if "X" not in npz.files or "Y" not in npz.files:
            raise ValueError(f"{path!r} must hold arrays 'X' [N, D] and 'Y' [N, P]; it has {npz.files}")
        return npz["X"], npz["Y"]


def describe_reply(context: Context) -> RecordDict:
    """The party's public description: ``client-index``, ``num-data`` N_k, ``input-dim`` D, ``output-dim`` P and,
    when its node config names them, its ``features`` and ``target`` column names (no data) and its ``party-name``
    (in :func:`~gpflow_fed.validation.party_name`'s normal form; a name it refuses is left out, never an error: it is
    only a label).

    Only the shapes are read here (no TensorFlow: ``describe`` is a message of its own, in a ClientApp process of
    its own); the values are checked (:func:`load_client_data`) before the party's first update uses them.

    :raises ValueError: a missing setting or file, or arrays that are not ``X`` ``[N, D]`` and ``Y`` ``[N, P]``
        (or ``[N]``) with the same N ≥ 1.
    """
    path = str(_node_setting(context, "data"))
    index = integer(_node_setting(context, "client-index"), "node config client-index", minimum=0)
    X, Y = _read_data(path)
    rows = {np.shape(X)[0] if np.ndim(X) else 0, np.shape(Y)[0] if np.ndim(Y) else 0}
    if np.ndim(X) != 2 or np.ndim(Y) not in (1, 2) or len(rows) != 1 or rows == {0}:
        raise ValueError(
            f"{path!r}: X must be [N, D] and Y [N, P] with the same N >= 1 rows, got {np.shape(X)} and {np.shape(Y)}"
        )
    described: Dict[str, Any] = {
        "client-index": int(index),
        "num-data": int(X.shape[0]),
        "input-dim": int(X.shape[1]),
        "output-dim": int(Y.shape[1]) if Y.ndim == 2 else 1,
    }
    for key in ("features", "target"):
        if key in context.node_config:
            described[key] = str(context.node_config[key])
    if "party-name" in context.node_config:
        try:
            described["party-name"] = party_name(context.node_config["party-name"], "node config party-name")
        except (TypeError, ValueError):  # a label only: a bad one is left out, the party still answers
            pass
    return RecordDict({DESCRIBE: ConfigRecord(described)})


def _state_dir(context: Context, client_id: str, job: str = TRAIN_JOB) -> str:
    """This party's private state folder ``<root>/run-<run id>/node-<node id>-<client id>`` (with ``-<job>`` added
    for a job other than ``"train"``).

    ``<root>`` is the node config's ``state-dir`` or, by default, ``$XDG_CACHE_HOME/gpflow_fed/flower``
    (``~/.cache/gpflow_fed/flower``): per user, never a shared temporary folder. Each level is created 0700 when
    missing (the default root and the run and node folders are also set to 0700 when they exist); a symbolic link, a
    file or another user's folder at any level is refused with a ``ValueError``. Keys never go here: the encoder's
    state lives in ``Context.state`` only.
    """
    from ....private_files import make_private_folder

    from .commands import default_state_root

    configured = context.node_config.get("state-dir")
    if configured:
        root = make_private_folder(str(configured), "node config state-dir")
    else:
        root = make_private_folder(default_state_root(), "the Flower state folder", tighten=True)
    run_dir = make_private_folder(
        os.path.join(root, f"run-{int(context.run_id)}"), "the run's state folder", tighten=True
    )
    suffix = "" if job == TRAIN_JOB else f"-{job}"
    node = os.path.join(run_dir, f"node-{int(context.node_id)}-{client_id}{suffix}")
    return make_private_folder(node, "the client's state folder", tighten=True)


def _save_client(directory: str, client: Client) -> None:
    """The client's own checkpoint (RNG, plain ``client.state``, TensorFlow objects) in its private ``directory``.

    Written into a fresh private staging folder (folders 0700, files 0600, nothing created through a link), then
    moved in: ``manifest.json`` is removed first and written last, so an interrupted save is refused by the next
    restore instead of being half read; ``client.json`` is only ever replaced, and anything else in ``directory`` (a
    leftover, a planted link) is removed, never followed.
    """
    import tensorflow as tf

    from ....private_files import new_file, private_folder, remove, seal
    from ...engine.checkpoint import encode_tree, tracked_objects, write_manifest

    arrays: Dict[str, np.ndarray] = {}
    plain = {k: v for k, v in client.state.items() if not is_trackable(v) and _encodable(v)}
    record = {"rng": client.rng.bit_generator.state, "state": encode_tree(plain, arrays)}
    objects = tracked_objects(None, {client.id: client}, [client.id])
    with private_folder(directory, "the client's state folder", tighten=True) as folder:
        staging = tempfile.mkdtemp(prefix=".staging-", dir=folder)
        try:
            tf.train.Checkpoint(**objects).write(os.path.join(staging, "tf", "objects"))
            with new_file(os.path.join(staging, "arrays.npz"), "wb") as f:
                np.savez(f, **arrays)
            with new_file(os.path.join(staging, "client.json")) as f:
                json.dump(record, f)
            seal(staging)
            remove(os.path.join(folder, "manifest.json"))
            for name in os.listdir(folder):
                if name not in ("client.json", os.path.basename(staging)):
                    remove(os.path.join(folder, name))
            os.rename(os.path.join(staging, "tf"), os.path.join(folder, "tf"))
            os.rename(os.path.join(staging, "arrays.npz"), os.path.join(folder, "arrays.npz"))
            os.replace(os.path.join(staging, "client.json"), os.path.join(folder, "client.json"))
            os.rmdir(staging)
            write_manifest(folder)  # SHA-256 of every file, checked before the next restore
        finally:
            remove(staging)


def _encodable(value: Any) -> bool:
    from ...engine.checkpoint import encode_tree

    try:
        encode_tree(value, {})
    except TypeError:
        return False
    return True


def _restore_client(directory: str, client: Client) -> bool:
    """Restore what :func:`_save_client` wrote; False if this client has not answered before.

    :raises ValueError: ``directory`` is a symbolic link or another user's folder; a file is missing, added, altered
        or a link (checked against the manifest before anything is read).
    """
    import tensorflow as tf

    from ....private_files import check_folder
    from ...engine.checkpoint import decode_tree, tracked_objects, verify_manifest

    pointer = os.path.join(directory, "client.json")
    if not check_folder(directory, "the client's state folder") or not os.path.lexists(pointer):
        return False
    verify_manifest(directory)  # a truncated, altered, added or missing file is a ValueError naming it
    with open(pointer) as f:
        record = json.load(f)
    with np.load(os.path.join(directory, "arrays.npz"), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    client.rng.bit_generator.state = record["rng"]
    client.state.update(decode_tree(record["state"], arrays, allowed={}))
    objects = tracked_objects(None, {client.id: client}, [client.id])
    tf.train.Checkpoint(**objects).read(os.path.join(directory, "tf", "objects")).assert_existing_objects_matched()
    return True


def _policy(context: Context) -> ClientPolicy:
    """This party's own protection policy, from its node config (never from the run config or a message)."""
    return ClientPolicy.from_node_config(context.node_config)


def _client_id(context: Context, info: FederationInfo) -> Tuple[int, str]:
    """This party's index k (its node config's ``client-index``) and id ``client_k``, which ``info`` must hold.

    :raises ValueError: no or a bad ``client-index``, or a federation without this party.
    """
    index = integer(_node_setting(context, "client-index"), "node config client-index", minimum=0)
    client_id = f"client_{index}"
    if client_id not in info.client_ids:
        raise ValueError(f"this party is {client_id!r}, which the server's federation {info.client_ids} lacks")
    return int(index), client_id


def _encoder(context: Context, client_id: str) -> ClientEncoder:
    """The party's encoder for this run: restored from ``Context.state`` (its keys live only there, never on disk),
    or a new one; its policy and identity always from its own node config."""
    identity = node_identity(context.node_config, client_id)
    state: Optional[Mapping[str, Any]] = context.state.config_records.get(ENCODER_STATE)  # converted below
    if state is None:
        return ClientEncoder(client_id, _policy(context), identity=identity)
    return ClientEncoder.from_state(client_id, _policy(context), bytes(state["state"]), identity)


def _protocol_answer(info: FederationInfo, context: Context, request: Request) -> Response:
    """A restarted party's answer to a secure-aggregation stage: its encoder alone, restored from ``Context.state``
    and saved back (:func:`~gpflow_fed.federated.engine.endpoint.protocol_response`). The stage needs neither the
    party's algorithm nor its rows, so this ClientApp process imports no TensorFlow."""
    _, client_id = _client_id(context, info)
    try:
        encoder = _encoder(context, client_id)
        encoder.sizes = info.client_sizes  # public, read only (as an endpoint sets it)
        response = protocol_response(encoder, client_id, request)
    except Exception as exc:  # noqa: BLE001 - as an endpoint: a client-side failure is a fault the server screens
        return fault_response(exc)
    context.state.config_records[ENCODER_STATE] = ConfigRecord({"state": encoder.to_state()})
    return response


def _endpoint(
    info: FederationInfo,
    context: Context,
    job: str,
    moments: Optional[AgreedMoments],
    request_ctx: bytes,
    live: Live,
    job_algorithm: JobAlgorithm,
) -> Tuple[ClientEndpoint, Optional[str]]:
    """This party's endpoint for ``job``, found alive or rebuilt: its algorithm bound to ``info``, its rows
    standardised with ``moments`` (the agreed moments) when given, its client restored from its ``state-dir``,
    its encoder restored from ``Context.state`` (keys live only there, never on disk) or shared with its live other
    job, and ``request_ctx`` (:func:`.records.request_context` of ``info``, ``job``, ``moments``) as context;
    ``live`` holds the endpoints a kept-alive ClientApp keeps, ``job_algorithm`` builds the job's algorithm."""
    from ..base import client_seed  # the runtimes' seeds: imports TensorFlow, as the update does

    key = (int(context.run_id), int(context.node_id), job)
    if key in live:
        return live[key], None
    index, client_id = _client_id(context, info)
    _, X, Y = load_client_data(context)
    if moments is not None:  # the party's own rows, with the moments every party agreed
        X, Y = moments.standardizer().transform(X, Y)
    client = Client(client_id, (X, Y), client_seed(info.seed, index, info.num_clients))
    algorithm = job_algorithm(job, context.run_config).bind(info)
    # one encoder per party and run, whatever the job (its schedule, its stop): a live party's other job shares it,
    # as a restarted party's jobs share Context.state
    shared = next((e.encoder for k, e in live.items() if k[:2] == key[:2]), None)
    encoder = shared if shared is not None else _encoder(context, client_id)
    endpoint = ClientEndpoint(algorithm, client, info, encoder)
    endpoint.context = request_ctx  # the request context its rows were standardised under (bound into its views)
    directory = _state_dir(context, client_id, job)
    if _restore_client_after_setup(directory, endpoint):
        endpoint.setup()
    return endpoint, directory


def _context_refusal(context: Context, job: str, current: bytes, live: Live) -> str:
    """The party answers each job of a run under one request context (federation and agreed moments): the first it
    is shown, kept in ``Context.state`` (and, for a live endpoint, the one its rows were standardised with). Another
    would let a server compute one party's answers from inputs the others' pads do not bind (a live endpoint built
    by a first message with other moments) or re-ask under other moments; refused ("" when it matches)."""
    record = context.state.config_records.get(CONTEXTS)
    pinned = dict(record) if record is not None else {}
    endpoint = live.get((int(context.run_id), int(context.node_id), job))
    if job not in pinned:  # the first context this job is shown: pinned for the run
        pinned[job] = current.hex()
        context.state.config_records[CONTEXTS] = ConfigRecord(pinned)
    first = pinned[job]
    if first != current.hex() or (endpoint is not None and endpoint.context != current):
        return (
            f"this party answers job {job!r} of this run with the federation and agreed moments it was first shown; "
            "this request carries others; refused"
        )
    return ""


def _restore_client_after_setup(directory: str, endpoint: ClientEndpoint) -> bool:
    """Set the client up and restore its saved state, if it answered before (False: a fresh client)."""
    if not os.path.exists(os.path.join(directory, "client.json")):
        return False
    endpoint.setup()
    return _restore_client(directory, endpoint.client)


class ClientHost:
    """What one ClientApp holds for its parties: the job's algorithm and, kept alive, their endpoints.

    Three ways to hold a party between messages:

    * **restarted** (the default, ``keep_alive=False``): a deployed ClientApp process answers one message and exits,
      so it keeps nothing: every update ends by writing the client's state to its ``state-dir`` and its encoder's to
      ``Context.state``, and the next message restores them. When the node config names a ``worker``
      (:mod:`.worker`), an update is forwarded to the party's worker instead, and computed here only when the worker
      cannot be reached.
    * **resident** (``resident=True``): the party's worker (:mod:`.worker`). Each job's endpoint (its algorithm,
      client, model and traced functions) stays in :attr:`live`, and is still saved after every update as a restarted
      one is; its encoder is read from the forwarded ``Context.state`` for every update and written back to it, so
      keys, answers and budget live where a restarted ClientApp keeps them. An endpoint that missed an update (one the
      ClientApp answered without its worker: the count in ``Context.state`` differs) is rebuilt from its
      ``state-dir``.
    * **kept alive** (``keep_alive=True``): an in-process transport (:class:`~.testing.LoopbackGrid`) keeps each
      party's endpoint, encoder included, in :attr:`live`; nothing is written.

    Nothing is held at module level: each host is one federation's parties.

    :param keep_alive: keep each party's endpoint and encoder in :attr:`live` between messages.
    :param resident: keep each party's endpoint in :attr:`live`, and its state where a restarted one keeps it.
    :param job_algorithm: the algorithm of a job (default :func:`.records.job_algorithm`: the run config's registered
        factory, or the moments job's).
    :raises ValueError: both ``keep_alive`` and ``resident``.
    """

    def __init__(
        self, *, keep_alive: bool = False, resident: bool = False, job_algorithm: Optional[JobAlgorithm] = None
    ) -> None:
        if keep_alive and resident:
            raise ValueError("a ClientHost is kept alive (in process) or resident (a worker), not both")
        self.keep_alive = bool(keep_alive)
        self.resident = bool(resident)
        self.job_algorithm: JobAlgorithm = job_algorithm or default_job_algorithm
        #: the parties' endpoints by (run id, node id, job); empty unless ``keep_alive`` or ``resident``
        self.live: Live = {}
        #: a resident host's count of each live endpoint's updates (as ``Context.state`` counted them)
        self._counts: Dict[Tuple[int, int, str], int] = {}

    def answer(self, content: RecordDict, context: Context) -> RecordDict:
        """The party's reply to one ``train`` message's ``content`` (one stage of an exchange), ``context.state``
        updated in place."""
        request, info = recorddict_to_request(content)
        job, moments = job_moments(content, info)
        current = request_context(info, job, moments)
        refusal = _context_refusal(context, job, current, self.live)
        if refusal:
            response = Response(fault=refusal, error=PermissionError(refusal))
            return response_to_recorddict(response, request.purpose)
        if request.stage in PROTOCOL_STAGES and not self.keep_alive:  # no TensorFlow (module docstring)
            return response_to_recorddict(_protocol_answer(info, context, request), request.purpose)
        if not (self.keep_alive or self.resident) and context.node_config.get(WORKER):
            from .worker import forward  # no TensorFlow

            forwarded = forward(str(context.node_config[WORKER]), content, context)
            if forwarded is not None:
                return forwarded
        key = (int(context.run_id), int(context.node_id), job)
        if self.resident:  # a worker serves its party's runs one after another: it keeps the current run's only
            for old in [k for k in self.live if k[0] != key[0]]:
                del self.live[old], self._counts[old]
            if key in self.live and self._counts.get(key) != _updates(context, job):
                del self.live[key]  # it missed an update answered without this worker: rebuilt from its state folder
        endpoint, directory = _endpoint(info, context, job, moments, current, self.live, self.job_algorithm)
        if self.resident:
            _, client_id = _client_id(context, info)
            endpoint.encoder = _encoder(context, client_id)  # Context.state is where the party's encoder lives
            endpoint.encoder.sizes = info.client_sizes
            directory = directory or _state_dir(context, client_id, job)
        response = endpoint.handle(request)
        if self.keep_alive:
            self.live[key] = endpoint
        else:
            if directory is not None and endpoint.ready:
                _save_client(directory, endpoint.client)
            context.state.config_records[ENCODER_STATE] = ConfigRecord({"state": endpoint.encoder.to_state()})
            count = _count_update(context, job)
            if self.resident:
                self.live[key], self._counts[key] = endpoint, count
        return response_to_recorddict(response, request.purpose)

    def app(self) -> ClientApp:
        """The ClientApp: ``query`` answers ``describe``, ``train`` one stage of an exchange (:meth:`answer`)."""
        client_app = ClientApp()

        @client_app.query()
        def describe(msg: FlowerMessage, context: Context) -> FlowerMessage:
            return FlowerMessage(describe_reply(context), reply_to=msg)

        @client_app.train()
        def train(msg: FlowerMessage, context: Context) -> FlowerMessage:
            return FlowerMessage(self.answer(msg.content, context), reply_to=msg)

        return client_app


def _counts_of(context: Context) -> Dict[str, int]:
    """``Context.state``'s count of updates answered, per job, in this run."""
    record = context.state.config_records.get(UPDATES)
    return {} if record is None else {str(job): int(str(count)) for job, count in record.items()}


def _updates(context: Context, job: str) -> int:
    """How many updates of ``job`` this party has answered in this run (``Context.state``'s count)."""
    return _counts_of(context).get(job, 0)


def _count_update(context: Context, job: str) -> int:
    """Count one more update of ``job`` in ``Context.state``; the new count."""
    counts = _counts_of(context)
    counts[job] = counts.get(job, 0) + 1
    context.state.config_records[UPDATES] = ConfigRecord(dict(counts))
    return counts[job]


def make_client_app(*, keep_alive: bool = False, job_algorithm: Optional[JobAlgorithm] = None) -> ClientApp:
    """A ClientApp running any gpflow-fed algorithm on the data named by the node config
    (:class:`ClientHost`'s, with the same arguments)."""
    return ClientHost(keep_alive=keep_alive, job_algorithm=job_algorithm).app()


#: the ClientApp of a Flower deployment (``clientapp = "gpflow_fed.federated.runtimes.flower.client_app:app"``)
app = make_client_app()

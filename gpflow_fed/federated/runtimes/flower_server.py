"""The Flower ServerApp of gpflow-fed: the round loop of any :class:`~gpflow_fed.federated.Algorithm` over a Grid.

The server runs the round loop of every runtime,
:func:`~gpflow_fed.federated.runtimes.loop.run_rounds` (evaluation and checkpoints included); only the
transport of a phase's messages, :class:`GridTransport`, is Flower's. First it asks every SuperNode to
``describe`` itself (client index k, N_k, D, P: what :class:`~gpflow_fed.federated.FederationInfo` holds; no
data), then for each round r it

1. selects the round's clients with ``Algorithm.select_clients`` and the server's sampling RNG (seeded as
   :func:`~gpflow_fed.federated.runtimes.make_clients` seeds it, so the same seed picks the same clients as
   ``LocalRuntime``);
2. for each phase, sends ``Algorithm.broadcast`` to the selected SuperNodes as a Flower ``train`` message
   (:mod:`~gpflow_fed.federated.runtimes.flower_records`) and rebuilds their replies as
   :class:`~gpflow_fed.federated.Message` objects; the aggregator
   (:meth:`~gpflow_fed.federated.aggregator.Aggregator.aggregate`) records, screens and reduces them exactly
   as on ``LocalRuntime``, before ``Algorithm.server_update``;
3. after the last round runs ``Algorithm.final_phases`` with every client and returns
   ``Algorithm.result``.

Secure aggregation (Flower's SecAgg+) and differential privacy (client clipping, server noise, the
accountant) protect the ``"sum"``/``"mean"`` phases as in ``LocalRuntime``; see
:mod:`~gpflow_fed.federated.runtimes.flower_secagg`.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import gpflow
import numpy as np
from flwr.app import ConfigRecord, Context, MessageType, RecordDict
from flwr.app import Message as FlowerMessage
from flwr.serverapp import Grid, ServerApp

from ..algorithm import Algorithm, FederationInfo
from ..ledger import Channel, CommunicationLedger
from ..messages import SERVER, Message
from ..fingerprint import describe_settings
from ..result import FederatedResult
from ..aggregator import Aggregator, ExchangeContext
from ...validation import integer
from ..faults import FaultPolicy, RoundFailedError, reply_fault, weight_fault
from ..transport import Broadcast, Reply, SecureSum, Transport
from .base import sampling_rng
from .flower_client import DESCRIBE
from .flower_records import (
    INFO,
    build_algorithm,
    info_to_config,
    message_to_recorddict,
    recorddict_to_message,
)
from .flower_secagg import (
    PROTECT,
    aggregator_from_config,
    check_secagg_settings,
    layout_message,
    protocol_arrays,
    secagg_plus_sum,
)
from .loop import Server, check_loop_settings, run_rounds

__all__ = ["FederationShape", "FlowerServer", "GridTransport", "app", "save_error", "save_result"]


@dataclass(frozen=True)
class FederationShape:
    """What ``Algorithm.validate`` may use on a Flower server, which never holds client data."""

    client_sizes: Tuple[int, ...]
    input_dim: int
    output_dim: int
    test: Optional[Tuple[np.ndarray, np.ndarray]] = None

    @property
    def num_clients(self) -> int:
        return len(self.client_sizes)

    @property
    def num_data(self) -> int:
        return int(sum(self.client_sizes))


@dataclass
class GridTransport(Transport):
    """The Flower ServerApp's transport: one phase's messages over a Flower ``Grid``.

    Each selected SuperNode gets the broadcast as a Flower ``train`` message
    (:mod:`~gpflow_fed.federated.runtimes.flower_records`); an error reply, no reply within ``timeout``, a
    malformed reply, one that fails :func:`~gpflow_fed.federated.faults.reply_fault` or (unless its weight is
    hidden) :func:`~gpflow_fed.federated.faults.weight_fault` is a fault. In a protected phase the clients
    prepare their replies themselves (clipped under DP; under secure aggregation encoded, kept, and announced
    by their layout only), and under secure aggregation :meth:`masked` runs Flower's SecAgg+
    (:mod:`~gpflow_fed.federated.runtimes.flower_secagg`) over the cohort.
    """

    server: "FlowerServer"
    grid: Grid
    info: FederationInfo
    node_of: Mapping[str, int]
    channel: Channel

    def exchange(self, broadcast: Broadcast, cohort: Sequence[str]) -> Dict[str, Reply]:
        server, down, purpose = self.server, broadcast.message, broadcast.purpose
        secure = broadcast.protected and server.aggregator.secure is not None
        outgoing = []
        for cid in cohort:
            content = message_to_recorddict(down, purpose)
            content[INFO] = info_to_config(self.info)
            if broadcast.protected:
                content[PROTECT] = ConfigRecord({"cohort-size": len(cohort)})
            outgoing.append(
                FlowerMessage(
                    content,
                    dst_node_id=self.node_of[cid],
                    message_type=MessageType.TRAIN,
                    group_id=f"{purpose}/{down.round}/{down.phase}",
                )
            )
        client_of = {n: c for c, n in self.node_of.items()}
        received = {
            client_of[int(r.metadata.src_node_id)]: r
            for r in self.grid.send_and_receive(outgoing, timeout=server.timeout)
        }
        replies: Dict[str, Reply] = {}
        for cid in cohort:
            reply, message = received.get(cid), None
            if reply is None:
                fault = f"no reply within {server.timeout} s"
            elif reply.has_error():
                fault = f"raised on its SuperNode: {reply.error.reason}"
            else:
                try:
                    message = layout_message(reply.content) if secure else recorddict_to_message(reply.content)[0]
                except (ValueError, TypeError, KeyError) as exc:
                    fault = f"sent a malformed reply: {exc}"
                else:
                    fault = reply_fault(message, cid, down)
                    if fault is None and not secure:
                        size = self.info.client_sizes[cid]
                        fault = weight_fault(message, server.algorithm.expected_weight(down.phase, size), size)
            replies[cid] = Reply(message, fault, None if fault is None else RuntimeError(fault))
        return replies

    def masked(self, context: ExchangeContext, replies: Mapping[str, Reply]) -> Union[Dict[str, Message], SecureSum]:
        """Under DP alone, the clipped messages the clients sent; under secure aggregation, SecAgg+'s sum."""
        if self.server.aggregator.secure is None:
            return {cid: replies[cid].message for cid in context.cohort}
        cohort, node_of = context.cohort, self.node_of
        client_of = {node_of[c]: c for c in cohort}

        def record(node: int, stage: str, outgoing: bool, config: Mapping[str, Any]) -> None:
            message = Message(
                SERVER if outgoing else client_of[node],
                context.round,
                f"{context.phase}/secagg+/{stage}",
                protocol_arrays(config),
                weight=0.0,
            )
            self.channel.send(message, client_of[node] if outgoing else SERVER, context.purpose)

        layout = replies[cohort[0]].message.arrays
        names = sorted(layout)
        size = int(sum(layout[n].size for n in names))
        codes, survivors = secagg_plus_sum(
            self.grid,
            [node_of[c] for c in cohort],
            size,
            {"purpose": context.purpose, "round": int(context.round), "phase": context.phase},
            num_shares=self.server.secagg_shares,
            reconstruction_threshold=self.server.secagg_threshold,
            timeout=self.server.timeout,
            record=record,
        )
        if codes is None:
            raise RoundFailedError(
                f"round {context.round}, phase {context.phase!r}: SecAgg+ halted: too few of the cohort {cohort} "
                "finished the protocol"
            )
        alive = tuple(c for c in cohort if node_of[c] in set(survivors))
        dropped = {
            c: "dropped out during SecAgg+ (its masks were removed with its neighbours' shares)"
            for c in cohort
            if c not in alive
        }
        sums, offset = {}, 0
        for name in names:
            sums[name] = codes[offset : offset + layout[name].size].reshape(layout[name].shape)
            offset += layout[name].size
        return SecureSum(sums, alive, dropped)


class FlowerServer:
    """Runs an algorithm's rounds over a Flower ``Grid`` (see the module docstring).

    :param algorithm: the algorithm (built on the server; clients build theirs from the same factory).
    :param seed: the run's seed (client sampling here; each client derives its own seed from it).
    :param faults: how faulty clients are treated (default: the first fault stops the run).
    :param timeout: seconds to wait for the replies of one phase (None: no limit).
    :param keep_payloads: keep every message in the ledger.
    :param num_clients: wait until this many SuperNodes are connected (None: use those connected now).
    :param wait: seconds to wait for them.
    :param aggregator: secure aggregation and/or DP of the ``"sum"``/``"mean"`` phases (default: none); the
        clients must build the same one from the run config
        (:func:`~gpflow_fed.federated.runtimes.flower_secagg.aggregator_to_config`).
    :param secagg_shares: SecAgg+'s ``num_shares``: each client's neighbours, a fraction of the cohort or a
        count > 2 (1.0: every client; fewer make the protocol cheaper for large cohorts).
    :param secagg_threshold: SecAgg+'s ``reconstruction_threshold``: the shares needed to unmask, a
        fraction of ``num_shares`` or a count; more clients than ``num_shares`` minus this may drop out.
    :param eval_every: evaluate on the ``test`` set of :meth:`run` every this many rounds (0: only at the end).
    :param checkpoint_dir: save the server's part of the run (state, sampling RNG, history, ledger, DP releases)
        there every ``checkpoint_every`` rounds; ``resume`` continues from it (the clients keep their own state
        on their SuperNodes).
    :raises ValueError: bad ``seed``, ``timeout``, ``num_clients``, ``wait``, round-loop or SecAgg+ settings.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        seed: int = 0,
        faults: Optional[FaultPolicy] = None,
        timeout: Optional[float] = None,
        keep_payloads: bool = False,
        num_clients: Optional[int] = None,
        wait: float = 120.0,
        aggregator: Optional[Aggregator] = None,
        secagg_shares: Union[int, float] = 1.0,
        secagg_threshold: Union[int, float] = 0.5,
        eval_every: int = 0,
        checkpoint_dir: Optional[str] = None,
        checkpoint_every: int = 1,
        resume: bool = False,
    ) -> None:
        check_loop_settings(eval_every, checkpoint_dir, checkpoint_every, resume)
        self.eval_every, self.checkpoint_every, self.resume = eval_every, checkpoint_every, bool(resume)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"algorithm must be a gpflow_fed Algorithm, got {type(algorithm).__name__}")
        integer(seed, "seed", minimum=0)
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        if num_clients is not None:
            integer(num_clients, "num_clients", minimum=1)
        if not wait >= 0:
            raise ValueError(f"wait must be non-negative seconds, got {wait!r}")
        if faults is not None and not isinstance(faults, FaultPolicy):
            raise TypeError(f"faults must be a FaultPolicy, got {type(faults).__name__}")
        self.algorithm = algorithm
        self.seed = int(seed)
        self.faults = faults or FaultPolicy()
        self.timeout = timeout
        self.keep_payloads = keep_payloads
        self.num_clients = num_clients
        self.wait = float(wait)
        if aggregator is not None and not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregator must be an Aggregator, got {type(aggregator).__name__}")
        self.aggregator = aggregator or Aggregator()
        if self.aggregator.secure is not None:
            check_secagg_settings(secagg_shares, secagg_threshold)
        self.secagg_shares = secagg_shares
        self.secagg_threshold = secagg_threshold

    # --- the federation ------------------------------------------------------------------------------
    def _nodes(self, grid: Grid) -> List[int]:
        deadline = time.monotonic() + self.wait
        while True:
            nodes = sorted(int(n) for n in grid.get_node_ids())
            if self.num_clients is None and nodes or self.num_clients is not None and len(nodes) >= self.num_clients:
                return nodes
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"only {len(nodes)} SuperNode(s) connected after {self.wait:g} s, "
                    f"expected {self.num_clients or 'at least 1'}; start them with flower-supernode"
                )
            time.sleep(0.5)

    def discover(self, grid: Grid) -> Tuple[FederationInfo, Dict[str, int]]:
        """Ask every SuperNode to describe itself: the :class:`FederationInfo` and ``{client id: node id}``.

        :raises ValueError: missing, repeated or out-of-range client indices, or parties with different D or P.
        """
        nodes = self._nodes(grid)
        messages = [
            FlowerMessage(RecordDict({}), dst_node_id=n, message_type=MessageType.QUERY, group_id=DESCRIBE)
            for n in nodes
        ]
        replies = list(grid.send_and_receive(messages, timeout=self.timeout))
        described: Dict[int, Tuple[int, int, int, int]] = {}
        for reply in replies:
            if reply.has_error():
                raise ValueError(
                    f"SuperNode {reply.metadata.src_node_id} could not describe itself: {reply.error.reason}"
                )
            cfg = reply.content.config_records[DESCRIBE]
            described[int(reply.metadata.src_node_id)] = (
                int(cfg["client-index"]),
                int(cfg["num-data"]),
                int(cfg["input-dim"]),
                int(cfg["output-dim"]),  # type: ignore[arg-type]
            )
        silent = sorted(set(nodes) - set(described))
        if silent:
            raise ValueError(f"SuperNode(s) {silent} did not answer 'describe' within {self.timeout} s")
        indices = sorted(d[0] for d in described.values())
        if indices != list(range(len(nodes))):
            raise ValueError(
                f"the SuperNodes' client-index values are {indices}; give the K = {len(nodes)} parties the distinct "
                f"indices 0 … {len(nodes) - 1} in --node-config"
            )
        dims = {(d[2], d[3]) for d in described.values()}
        if len(dims) != 1:
            raise ValueError(f"the parties' data disagree on (D, P): {sorted(dims)}")
        ((input_dim, output_dim),) = dims
        order = sorted(described, key=lambda n: described[n][0])
        ids = tuple(f"client_{described[n][0]}" for n in order)
        info = FederationInfo(
            client_ids=ids,
            client_sizes={c: described[n][1] for c, n in zip(ids, order)},
            input_dim=input_dim,
            output_dim=output_dim,
            seed=self.seed,
        )
        return info, dict(zip(ids, order))

    # --- the run -------------------------------------------------------------------------------------
    def run(
        self,
        grid: Grid,
        *,
        test: Optional[Tuple[np.ndarray, np.ndarray]] = None,
        monitor: Optional[Callable[..., Any]] = None,
    ) -> FederatedResult:
        """Discover the parties, run every round and the final phases; the result as ``LocalRuntime``'s.

        :param test: a held-out ``(X, Y)`` the server may hold, for ``result.metrics``.
        :param monitor: called as ``monitor(r, history=..., state=..., algorithm=...)`` after each round.
        """
        start = time.perf_counter()
        algorithm = self.algorithm
        settings = describe_settings(algorithm)
        info, node_of = self.discover(grid)
        ids = list(info.client_ids)
        algorithm.validate(
            FederationShape(tuple(info.client_sizes[c] for c in ids), info.input_dim, info.output_dim, test)
        )
        self.aggregator.check(algorithm)
        self.aggregator.start()
        channel = Channel(CommunicationLedger(keep_payloads=self.keep_payloads))
        rng = self.aggregator.sampling_rng(sampling_rng(self.seed, len(ids)))
        transport = GridTransport(self, grid, info, node_of, channel)
        server = Server(algorithm, transport, self.aggregator, channel, self.faults)
        return run_rounds(
            server,
            info,
            rng,
            settings=settings,
            test=test,
            eval_every=self.eval_every,
            checkpoint_dir=self.checkpoint_dir,
            checkpoint_every=self.checkpoint_every,
            resume=self.resume,
            monitor=monitor,
            start=start,
        )


def save_result(result: FederatedResult, directory: str, predict_at: Optional[np.ndarray] = None) -> None:
    """Write a Flower run's result where the caller can read it (the ServerApp runs in its own process).

    Files: ``parameters.npz`` (``gpflow.utilities.read_values`` of the model), ``predictions.npz``
    (``mean``, ``var`` of ``predict_f`` at ``predict_at``, if given) and ``result.json`` (history, metrics,
    ledger entries, seconds), the last written last, so its presence means the run finished.
    """
    os.makedirs(directory, exist_ok=True)
    values = {k: np.asarray(v) for k, v in gpflow.utilities.read_values(result.model).items()}
    np.savez(os.path.join(directory, "parameters.npz"), **values)
    if predict_at is not None:
        mean, var = result.model.predict_f(np.asarray(predict_at, dtype=gpflow.default_float()))
        np.savez(os.path.join(directory, "predictions.npz"), mean=mean.numpy(), var=var.numpy())
    record = {
        "history": result.history,
        "metrics": dict(result.metrics),
        "ledger": [asdict(e) for e in result.ledger.entries],
        "seconds": result.seconds,
    }
    tmp = os.path.join(directory, "result.json.tmp")
    with open(tmp, "w") as f:
        json.dump(record, f, default=float)
    os.replace(tmp, os.path.join(directory, "result.json"))


def save_error(error: BaseException, directory: str) -> None:
    """Write ``error.json`` (the exception's type and message) when a ServerApp run fails."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "error.json"), "w") as f:
        json.dump({"type": type(error).__name__, "message": str(error)}, f)


def _run_config_number(config: Mapping[str, Any], key: str, default: Any) -> Any:
    value = config.get(key, default)
    return None if value == "" else value


def make_server_app() -> ServerApp:
    """A ServerApp configured entirely by the run config (``flwr run … --run-config``):

    * ``algorithm`` (required): a registered algorithm factory (:mod:`gpflow_fed.federated.factories`),
      called with the run config;
    * ``seed`` (default 0); ``num-clients``: wait for this many SuperNodes (default: those connected);
    * ``timeout``: seconds per phase (default: none); ``min-clients`` and ``on-error``
      (``"raise"``/``"exclude"``) for the :class:`FaultPolicy`;
    * ``output``: folder for :func:`save_result`; ``test-data``: an ``.npz`` with ``X``, ``Y`` the server
      holds, for test metrics and ``predictions.npz``;
    * secure aggregation and DP: the keys of
      :func:`~gpflow_fed.federated.runtimes.flower_secagg.aggregator_to_config` (``secure-aggregation``,
      ``fractional-bits``, ``dp-*``), which every ClientApp reads too, and ``secagg-shares``,
      ``secagg-threshold`` for SecAgg+;
    * ``eval-every``, ``checkpoint-dir``, ``checkpoint-every``, ``resume``: as for ``LocalRuntime``.
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        config = context.run_config
        if "algorithm" not in config:
            raise ValueError("run config lacks 'algorithm': pass --run-config \"algorithm='package.module:factory'\"")
        try:
            algorithm = build_algorithm(str(config["algorithm"]), config)
        except Exception as exc:
            if config.get("output"):
                save_error(exc, str(config["output"]))
            raise
        timeout = _run_config_number(config, "timeout", None)
        server = FlowerServer(
            algorithm,
            seed=int(config.get("seed", 0)),
            faults=FaultPolicy(
                on_error=str(config.get("on-error", "raise")), min_clients=int(config.get("min-clients", 1))
            ),
            timeout=None if timeout is None else float(timeout),
            num_clients=int(config["num-clients"]) if "num-clients" in config else None,
            aggregator=aggregator_from_config(config),
            secagg_shares=config.get("secagg-shares", 1.0),  # type: ignore[arg-type]
            secagg_threshold=config.get("secagg-threshold", 0.5),  # type: ignore[arg-type]
            eval_every=int(config.get("eval-every", 0)),
            checkpoint_dir=str(config["checkpoint-dir"]) if config.get("checkpoint-dir") else None,
            checkpoint_every=int(config.get("checkpoint-every", 1)),
            resume=bool(config.get("resume", False)),
        )
        test = None
        if config.get("test-data"):
            with np.load(str(config["test-data"])) as npz:
                test = (npz["X"].astype(gpflow.default_float()), npz["Y"].astype(gpflow.default_float()))
        try:
            result = server.run(grid, test=test)
        except Exception as exc:  # the ServerApp's own process: leave the reason where the caller looks
            if config.get("output"):
                save_error(exc, str(config["output"]))
            raise
        if config.get("output"):
            save_result(result, str(config["output"]), None if test is None else test[0])

    return server_app


#: the ServerApp of a Flower deployment (``serverapp = "gpflow_fed.federated.runtimes.flower_server:app"``)
app = make_server_app()

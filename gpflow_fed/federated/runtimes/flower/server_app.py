"""The Flower ServerApp of gpflow-fed: any :class:`~gpflow_fed.federated.Algorithm` over a Flower Grid.

The server runs the same set-up and round loop as every runtime (:func:`~gpflow_fed.federated.engine.loop.set_up_run`,
:func:`~gpflow_fed.federated.engine.loop.run_rounds`); only its transport, :class:`~.transport.GridTransport`, is
Flower's.
First it asks every SuperNode to ``describe`` itself (client index k, N_k, D, P: what
:class:`~gpflow_fed.federated.FederationInfo` holds; no data); then every stage of every exchange is a Flower
``train`` message to the stage's clients, which the ClientApp (:mod:`~.client_app`) answers with the party's
:class:`~gpflow_fed.federated.engine.endpoint.ClientEndpoint`.

The run config carries the server's options and its protection *request*
(:meth:`~gpflow_fed.federated.Protection.to_config`; secure aggregation unless it says otherwise); each party's own
policy comes from its node config, and a request below it is refused by the party itself.

**A table run** (``standardize=true``, what ``gpflow-fed flower server`` submits) runs two jobs over the same grid:
first :class:`~gpflow_fed.federated.algorithms.Moments` — the parties' column counts, sums and sums of squares,
summed under the run's protection — then the algorithm, each party standardising its own rows with the agreed
moments, which every request of the second job carries (:func:`.records.job_to_config`). No row leaves a party;
the returned model is a :class:`~gpflow_fed.models.StandardizedModel` (raw inputs in, the target's units out).

The ServerApp reports its progress in its log (Flower's logger, which ``flwr run --stream`` and the SuperLink's
output show): the parties it found (by the names they give themselves, :func:`party_labels`, with their protocol ids
``client_k``), the agreed moments' exchange, one line per round (its number, clients, seconds) and where it saved the
model.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from logging import INFO
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import gpflow
import numpy as np
from flwr.app import Context, MessageType, RecordDict
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from ....validation import integer
from ...protocol.algorithm import Algorithm, FederationInfo
from ...engine.loop import run_rounds, set_up_run
from ...engine.options import RunOptions
from ...protection.request import Protection
from ...engine.result import FederatedResult, party_labels
from ....data.standardize import Standardizer
from ..base import sampling_rng
from .app_config import TABLE_APP
from .client_app import DESCRIBE
from .records import MOMENTS_JOB, TRAIN_JOB, build_algorithm
from .pace import expected_exchanges, job_shape, round_line
from .transport import GridTransport, exchange, instruction

__all__ = [
    "FederationShape",
    "FlowerServer",
    "TableJob",
    "app",
    "options_from_config",
    "save_error",
    "save_result",
]


#: a table run's job over the server's grid (:meth:`FlowerServer.run`): ``job(run_job, server, test)``
TableJob = Callable[
    [Callable[[Algorithm, Optional[Standardizer]], FederatedResult], "FlowerServer", Any], FederatedResult
]
#: saves a run's model: ``save(model, path)`` returns the path written (a str or Path)
SaveModel = Callable[[Any, str], Any]


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


class FlowerServer:
    """Runs an algorithm's rounds over a Flower ``Grid`` (see the module docstring).

    :param algorithm: the algorithm (its configuration; clients build theirs from the same factory).
    :param seed: the run's seed (client sampling here; each client derives its own seed from it).
    :param options: the run's :class:`~gpflow_fed.federated.RunOptions`; a Flower server checkpoints its own part
        of the run (state, sampling RNG, history, ledger, DP releases), the clients keep theirs on their SuperNodes.
    :param protection: the server's :class:`~gpflow_fed.federated.Protection` request.
    :param timeout: seconds to wait for the replies of one stage (None: no limit).
    :param num_clients: wait until this many SuperNodes are connected (None: use those connected now).
    :param wait: seconds to wait for them.
    :param report: called with one line of progress at a time (the parties found, the moments, each round).
    :raises ValueError: bad ``seed``, ``timeout``, ``num_clients`` or ``wait``.
    :raises TypeError: an algorithm, options or protection of the wrong type.
    """

    def __init__(
        self,
        algorithm: Algorithm,
        *,
        seed: int = 0,
        options: Optional[RunOptions] = None,
        protection: Optional[Protection] = None,
        timeout: Optional[float] = None,
        num_clients: Optional[int] = None,
        wait: float = 120.0,
        report: Optional[Callable[[str], None]] = None,
    ) -> None:
        if not isinstance(algorithm, Algorithm):
            raise TypeError(f"algorithm must be a gpflow_fed Algorithm, got {type(algorithm).__name__}")
        integer(seed, "seed", minimum=0)
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be positive seconds or None, got {timeout!r}")
        if num_clients is not None:
            integer(num_clients, "num_clients", minimum=1)
        if not wait >= 0:
            raise ValueError(f"wait must be non-negative seconds, got {wait!r}")
        if options is not None and not isinstance(options, RunOptions):
            raise TypeError(f"options must be a RunOptions, got {type(options).__name__}")
        if protection is not None and not isinstance(protection, Protection):
            raise TypeError(f"protection must be a Protection, got {type(protection).__name__}")
        self.algorithm = algorithm
        self.seed = int(seed)
        self.options = options or RunOptions()
        self.protection = protection or Protection()
        self.timeout = timeout
        self.num_clients = num_clients
        self.wait = float(wait)
        self.report = report or (lambda text: None)
        #: the transport of the last run (its message counts)
        self.transport: Optional[GridTransport] = None
        #: the last run's Flower messages and stages, per exchange kind: ``describe``, and each job's
        self.exchanges: Dict[str, Dict[str, Any]] = {}
        #: the last run's transport of each job (``"moments"``, ``"train"``): its stages' groups
        self.transports: Dict[str, GridTransport] = {}
        self._reported = 0
        #: the parties' column names, when their node configs give them: ``(features, target)``
        self.columns: Optional[Tuple[str, str]] = None
        #: the last run's party names, ``{protocol id: name}`` (:func:`party_labels`; the id where a party gives none)
        self.party_names: Dict[str, str] = {}

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
        """Ask every SuperNode to describe itself: the :class:`FederationInfo` and ``{client id: node id}``; the names
        the parties give themselves go to :attr:`party_names` (:func:`party_labels`; one report line on the names it
        could not use).

        :raises ValueError: missing, repeated or out-of-range client indices, or parties with different D or P.
        """
        nodes = self._nodes(grid)
        messages = [instruction(RecordDict({}), MessageType.QUERY, n, DESCRIBE) for n in nodes]
        started = time.perf_counter()
        replies = exchange(grid, messages, self.timeout)
        seconds = time.perf_counter() - started
        self.exchanges = {"describe": {"messages": len(messages), "stages": 1, "seconds": seconds}}
        described: Dict[int, Tuple[int, int, int, int]] = {}
        columns: Dict[int, Tuple[str, str]] = {}
        claimed: Dict[int, Any] = {}  # the names the nodes give, as they came (checked by party_labels)
        for reply in replies:
            if reply.has_error():
                raise ValueError(
                    f"SuperNode {reply.metadata.src_node_id} could not describe itself: {reply.error.reason}"
                )
            cfg: Mapping[str, Any] = reply.content.config_records[DESCRIBE]  # from the wire: converted below
            described[int(reply.metadata.src_node_id)] = (
                int(cfg["client-index"]),
                int(cfg["num-data"]),
                int(cfg["input-dim"]),
                int(cfg["output-dim"]),
            )
            if "features" in cfg or "target" in cfg:
                columns[int(reply.metadata.src_node_id)] = (str(cfg.get("features", "")), str(cfg.get("target", "")))
            if "party-name" in cfg:
                claimed[int(reply.metadata.src_node_id)] = cfg["party-name"]
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
        self.columns = None
        if columns:
            named = {described[n][0]: columns.get(n, ("?", "?")) for n in order}
            if len(set(named.values())) != 1:
                listed = "; ".join(f"client_{k}: {f} -> {t}" for k, (f, t) in sorted(named.items()))
                raise ValueError(
                    f"the parties' columns differ ({listed}); give every party the same --features, in the same "
                    "order, and the same --target"
                )
            self.columns = next(iter(named.values()))
        ids = tuple(f"client_{described[n][0]}" for n in order)
        self.party_names, refused = party_labels({c: claimed.get(n) for c, n in zip(ids, order)})
        if refused:
            self.report(refused)
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
        job: Optional["TableJob"] = None,
    ) -> FederatedResult:
        """Discover the parties, run every round and the final phases; the result as ``LocalRuntime``'s.

        :param test: a held-out ``(X, Y)`` the server may hold, for ``result.metrics`` (in the parties' units).
        :param monitor: called as ``monitor(r, history=..., state=..., algorithm=...)`` after each round.
        :param job: a table run (module docstring), e.g. :func:`gpflow_fed.fitting.flower.table_job`: called as
            ``job(run_job, server, test)`` with ``run_job(algorithm, standardizer)`` running one job over this grid
            (``standardizer`` None: the moments job on the parties' rows as they are; else the training job, each
            party standardising its own rows with it, and ``test`` standardised with it for the metrics).
        """
        start = time.perf_counter()
        info, node_of = self.discover(grid)
        columns = "" if self.columns is None else f"; features {self.columns[0]} -> target {self.columns[1]}"
        self.report(
            f"{info.num_clients} parties, {info.num_data} rows: "
            + ", ".join(_party_entry(c, self.party_names.get(c, c), info.client_sizes[c]) for c in info.client_ids)
            + columns
        )
        shape = FederationShape(tuple(info.client_sizes[c] for c in info.client_ids), info.input_dim, info.output_dim)
        monitor = self._reporting(monitor)
        if job is None:
            return self._job(grid, node_of, info, shape, self.algorithm, test, monitor, start)

        def run_job(algorithm: Algorithm, standardizer: Optional[Standardizer]) -> FederatedResult:
            if standardizer is None:  # the moments job: the parties' rows as they are, no monitor, faults only
                options = RunOptions(faults=self.options.faults, keep_payloads=self.options.keep_payloads)
                began = time.perf_counter()
                moments = self._job(grid, node_of, info, shape, algorithm, None, None, began, MOMENTS_JOB, options)
                self._estimate(info)
                return moments
            scaled = None if test is None else standardizer.transform(*test)
            return self._job(
                grid, node_of, info, shape, algorithm, scaled, monitor, start, TRAIN_JOB, None, standardizer
            )

        return job(run_job, self, test)

    def _job(
        self,
        grid: Grid,
        node_of: Mapping[str, int],
        info: FederationInfo,
        shape: "FederationShape",
        algorithm: Algorithm,
        test: Optional[Tuple[np.ndarray, np.ndarray]],
        monitor: Optional[Callable[..., Any]],
        start: float,
        job: str = TRAIN_JOB,
        options: Optional[RunOptions] = None,
        standardizer: Optional[Any] = None,
    ) -> FederatedResult:
        """One run of the shared loop over the grid: ``algorithm``'s set-up and rounds as ``job``."""
        setup = set_up_run(algorithm, info, replace_test(shape, test), options or self.options, self.protection)
        transport = self.transport = GridTransport(
            grid, node_of, info, self.timeout, job=job, standardizer=standardizer
        )
        self._reported = 0  # the job's stages already in a progress line
        try:
            result = run_rounds(
                setup, transport, seeded_sampling=sampling_rng(self.seed), test=test, monitor=monitor, start=start
            )
            result.party_names = dict(self.party_names)
            return result
        finally:
            self.exchanges[job] = stage_times(transport)
            self.transports[job] = transport

    def _estimate(self, info: FederationInfo) -> None:
        """Report the training's exchanges and time at the pace of the moments job just run (:mod:`.pace`): the same
        set-up and stages per phase, the training algorithm's phases, the moments' seconds per exchange (an update
        that trains takes longer than one that sums columns, so this is a floor)."""
        moments = self.transports[MOMENTS_JOB]
        if not moments.seconds:
            return
        each = sum(moments.seconds) / len(moments.seconds)
        setup, per_phase = job_shape(moments.groups)
        bound = self.algorithm.bind(info)
        phases = [len(bound.phases(r)) for r in range(bound.rounds)]
        total = expected_exchanges(phases, len(bound.final_phases()), setup, per_phase)
        self.report(
            f"{len(moments.groups)} exchanges of {each:.1f} s for the moments; the training's {bound.rounds} rounds "
            f"take {total} exchanges ({round(sum(phases) * per_phase / max(bound.rounds, 1))} a round, {setup} to "
            f"set up, {round(len(bound.final_phases()) * per_phase)} to finish): at least {total * each / 60:.1f} min"
        )

    def _reporting(self, monitor: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        """``monitor`` after a progress line for the round (:func:`.pace.round_line`): its number, clients,
        exchanges and seconds, and the time left at its pace."""

        def reporting(r: int, *, history: List[Dict[str, Any]], algorithm: Algorithm, **kwargs: Any) -> None:
            transport = self.transport
            if transport is None:
                return
            start, self._reported = self._reported, len(transport.groups)
            groups, seconds = transport.groups[start:], transport.seconds[start:]
            clients = history[-1]["clients"]
            self.report(round_line(r, algorithm.rounds, clients, groups, seconds, len(algorithm.final_phases())))
            if monitor is not None:
                monitor(r, history=history, algorithm=algorithm, **kwargs)

        return reporting


def _party_entry(client: str, name: str, rows: int) -> str:
    """A party in the server's log: ``Africa (client_0, 624)``, or ``client_0 (624)`` when it has no name of its own."""
    return f"{client} ({rows})" if name == client else f"{name} ({client}, {rows})"


def stage_times(transport: GridTransport) -> Dict[str, Any]:
    """A job's exchanges: Flower ``messages`` sent, ``stages`` (exchanges), their ``seconds`` in all and, per stage
    kind (``update``, ``advertise``, … ``unmask``), ``by_stage``: ``[exchanges, seconds]``."""
    by_stage: Dict[str, List[float]] = {}
    for group, seconds in zip(transport.groups, transport.seconds):
        entry = by_stage.setdefault(group.rsplit("/", 1)[-1], [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
    return {
        "messages": transport.messages_sent,
        "stages": transport.stages,
        "seconds": float(sum(transport.seconds)),
        "by_stage": by_stage,
    }


def replace_test(shape: FederationShape, test: Optional[Tuple[np.ndarray, np.ndarray]]) -> FederationShape:
    return FederationShape(shape.client_sizes, shape.input_dim, shape.output_dim, test)


def options_from_config(config: Mapping[str, Any]) -> RunOptions:
    """The :class:`RunOptions` a run config describes: :meth:`RunOptions.from_config
    <gpflow_fed.federated.RunOptions.from_config>` (``min-clients``, ``on-error``, ``timeout``, ``eval-every``,
    ``checkpoint-dir``, ``checkpoint-every``, ``resume``, ``keep-payloads``, ``progress``; each optional, parsed
    strictly; the run config's other keys are the algorithm's, the protection's and the server's).

    :raises ValueError: a value of the wrong kind or out of range, naming its key.
    """
    return RunOptions.from_config(config)


def save_result(
    result: FederatedResult,
    directory: str,
    predict_at: Optional[np.ndarray] = None,
    exchanges: Optional[Mapping[str, Mapping[str, Any]]] = None,
    party_names: Optional[Mapping[str, str]] = None,
) -> None:
    """Write a Flower run's result where the caller can read it (the ServerApp runs in its own process).

    Files: ``parameters.npz`` (``gpflow.utilities.read_values`` of the model), ``predictions.npz``
    (``mean``, ``var`` of ``predict_f`` at ``predict_at``, if given) and ``result.json`` (history, metrics,
    ledger entries, seconds, ``exchanges``: the Flower messages, stages and seconds of each exchange kind, from
    :attr:`FlowerServer.exchanges`, :func:`stage_times`, and ``party_names``: ``{protocol id: name}``, from
    :attr:`FlowerServer.party_names`), the last written last, so its presence means the run finished.
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
        "exchanges": {k: dict(v) for k, v in (exchanges or {}).items()},
        "party_names": dict(party_names or {}),
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


def _positive_or_none(config: Mapping[str, Any], key: str) -> Optional[float]:
    value = config.get(key, "")
    return None if value in ("", 0, 0.0) else float(value)


def make_server_app(job: Optional[TableJob] = None, save: Optional[SaveModel] = None) -> ServerApp:
    """A ServerApp configured entirely by the run config (``flwr run … --run-config``):

    * ``algorithm`` (required): a registered algorithm factory (:mod:`gpflow_fed.federated.engine.factories`),
      called with the run config; ``"gpflow-fed:fit"`` builds :func:`gpflow_fed.fit`'s ``method``
      (:mod:`gpflow_fed.fitting.flower`);
    * ``seed`` (default 0); ``num-clients``: wait up to ``wait`` seconds (default 120) for this many SuperNodes
      (default or 0: those connected);
    * ``standardize`` (default false): a table run (module docstring), run as ``job`` (an app without one refuses it;
      :data:`gpflow_fed.fitting.flower.server_app` has :func:`gpflow_fed.fitting.flower.table_job`);
    * ``output``: folder for :func:`save_result`; ``save``: a ``.npz`` for the model, written by ``save`` (an app
      without one refuses it); ``test-data``: an ``.npz`` with ``X``, ``Y`` the server holds, for test metrics
      and ``predictions.npz``;
    * the run options (:func:`options_from_config`, :meth:`RunOptions.to_config
      <gpflow_fed.federated.RunOptions.to_config>`: ``timeout`` — seconds a party may take per request, 0: no limit
      —, ``min-clients``, ``on-error``, ``eval-every``, ``checkpoint-dir``, ``checkpoint-every``, ``resume``,
      ``keep-payloads``, ``progress``);
    * the protection request (:meth:`Protection.from_config <gpflow_fed.federated.Protection.from_config>`:
      ``secure-aggregation`` — true unless given —, ``fractional-bits``, ``min-cohort``, ``dp-*``, ``robust-*``). It
      is only a request: each party's own policy (its node config) decides what it accepts.

    :func:`.app_config.run_config_defaults` lists the keys with their defaults.
    """
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        config = context.run_config
        output = str(config.get("output", "") or "")
        try:
            if "algorithm" not in config:
                raise ValueError(
                    "run config lacks 'algorithm': pass --run-config \"algorithm='package.module:factory'\""
                )
            table = bool(config.get("standardize", False))
            if table and job is None:
                raise ValueError(f"standardize=true is a table run; {TABLE_APP} runs it, this app does not")
            if config.get("save") and save is None:
                raise ValueError(f"save= needs an app that saves models ({TABLE_APP}); this one does not")
            algorithm = build_algorithm(str(config["algorithm"]), config)
            num_clients = int(config.get("num-clients", 0) or 0)
            server = FlowerServer(
                algorithm,
                seed=int(config.get("seed", 0)),
                options=options_from_config(config),
                protection=Protection.from_config(config),
                timeout=_positive_or_none(config, "timeout"),
                num_clients=num_clients or None,
                wait=float(config.get("wait", 120.0)),
                report=lambda text: log(INFO, "[gpflow-fed] %s", text),
            )
            test = None
            if config.get("test-data"):
                with np.load(str(config["test-data"])) as npz:
                    test = (npz["X"].astype(gpflow.default_float()), npz["Y"].astype(gpflow.default_float()))
            result = server.run(grid, test=test, job=job if table else None)
            if config.get("save") and save is not None:
                path = save(result.model, str(config["save"]))
                log(INFO, "[gpflow-fed] model saved to %s (%s)", path, type(result.model).__name__)
        except Exception as exc:  # the ServerApp's own process: leave the reason where the caller looks
            if output:
                save_error(exc, output)
            raise
        if output:
            save_result(result, output, None if test is None else test[0], server.exchanges, server.party_names)

    return server_app


#: the ServerApp of a Flower deployment of any registered algorithm
#: (``serverapp = "gpflow_fed.federated.runtimes.flower.server_app:app"``); table runs use :data:`TABLE_APP`
app = make_server_app()

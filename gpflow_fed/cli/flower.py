"""``gpflow-fed flower``: train across machines with Flower, each party on its own CSV.

``gpflow-fed flower party --csv FILE --target COL [--features COL ...] --client-index K --superlink HOST:PORT``
    one party: checks its table (before TensorFlow), keeps its rows privately for its SuperNode (a 0600 file in a
    0700 folder) and runs that ``flower-supernode``, with its own protection policy in its node config (secure
    aggregation required unless ``--no-secure-aggregation``; ``--min-cohort``, ``--max-rounds``, ``--max-colluders``,
    ``--dp-budget``; every policy node key is listed in ``gpflow_fed.federated.runtimes.flower.commands``) and its name
    (``--name``, default the CSV file's stem: the label the server's log and result show; its id stays ``client_K``,
    checked by :func:`gpflow_fed.validation.party_name`). Its rows
    never leave it: it answers the server's requests (the column moments, then the training) with sums that are masked
    under secure aggregation. It stops by itself once the server's SuperLink has not answered for ``--linger`` seconds
    (the run is over; ``--stay`` keeps serving); Ctrl-C (or ``kill``) stops it and every process its SuperNode started.

``gpflow-fed flower server --clients K --save FILE [--method fsgp] [--rounds R ...] [--port 9100]``
    the server: starts ``flower-superlink`` and submits the table run with ``flwr run`` (its app folder, written
    under ``--workdir``, runs :func:`gpflow_fed.fit`'s method): it waits for the K parties, agrees the columns'
    means and scales with them (a protected moments exchange), trains on the standardised rows each party makes
    itself, logs its exchange count and a line per round (exchanges, seconds, time left), saves the model (a
    ``StandardizedModel``: raw inputs in, the target's units out) and stops the SuperLink. Ctrl-C (or ``kill``) stops
    the SuperLink, the run and every process they started.

``gpflow-fed flower app APP_DIR --algorithm mypkg.jobs:fsgp --clients 2 [--superlink HOST:PORT] [--data-dir DIR]
[--set key=value ...]``
    any registered algorithm factory: checks that ``mypkg.jobs`` imports and registers the factory, writes
    ``APP_DIR/pyproject.toml`` (every run-config key with its default, so ``flwr run --run-config`` may set any)
    and ``APP_DIR/flwr_home/config.toml``, and prints the commands: the environment, ``flower-superlink``, one
    ``flower-supernode`` per party (party k reads ``DIR/client_k.npz``: arrays ``X``, ``Y``) and ``flwr run``
    (``--json``: the same under ``outputs``).

``gpflow-fed flower ledger create PATH``
    a party's DP ledger, once (0600 in a 0700 folder; never over an existing file): a party with a DP budget
    (``flower party --dp-budget EPSILON DELTA --dp-ledger PATH``, or the node-config keys ``dp-budget-epsilon``,
    ``dp-budget-delta``, ``dp-ledger``) records every distributed-DP answer there, across runs, and refuses once the
    budget would be passed, or when the ledger is missing or corrupt (:mod:`gpflow_fed.federated.protection.budget`).

The Flower guide (docs/guides/flower.md) has the commands for N parties on one machine and across machines.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any, Dict, List, Tuple

from .options import (
    add_run_option_arguments,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    run_options,
)

#: the SuperLink connection's name in the written ``flwr_home/config.toml``.
CONNECTION = "gpflow-fed"
#: seconds the processes a ``flower`` command started have to end after SIGTERM, before SIGKILL
STOP_GRACE = 10.0
#: the method settings ``flower server`` takes, as ``{option dest: fit's setting}``
METHOD_OPTIONS = {
    "rounds": "rounds",
    "local_steps": "local_steps",
    "learning_rate": "learning_rate",
    "inducing": "num_inducing",
}


def _value(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def _settings(pairs: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes key=value, got {pair!r}")
        out[key] = _value(value)
    return out


def _address_problem(address: str, option: str) -> List[str]:
    from ..federated.runtimes.flower.commands import parse_address

    try:
        parse_address(address, option)
    except ValueError as exc:
        return [str(exc)]
    return []


# --- ledger ---------------------------------------------------------------------------------------------------
def _no_tensorflow(args: argparse.Namespace) -> None:
    args.tensorflow = False


def _ledger_create(args: argparse.Namespace) -> int:
    from ..federated.protection.budget import create_ledger

    try:
        path = create_ledger(args.path)
    except (FileExistsError, ValueError) as exc:
        print(f"gpflow-fed flower ledger create: {exc}", file=sys.stderr)
        return 2
    print(
        f"created the DP ledger {path} (empty; 0600). Give it to this party: --dp-ledger {path}, or node config "
        f'dp-ledger = "{path}" with dp-budget-epsilon and dp-budget-delta'
    )
    return 0


def _ledger_show(args: argparse.Namespace) -> int:
    from ..federated.protection.budget import read_ledger
    from ..federated.protection.distributed_dp import zcdp_epsilon

    try:
        total, entries = read_ledger(args.path)
        epsilon = zcdp_epsilon(total, args.delta)
    except ValueError as exc:
        print(f"gpflow-fed flower ledger show: {exc}", file=sys.stderr)
        return 2
    print(f"rho {total:.6g}  epsilon {epsilon:.6g} at delta {args.delta:g}  ({len(entries)} answers)")
    for e in entries:
        print(f"  run {e['run'] or '-'}  {e['purpose']} round {e['round']} {e['phase']}  rho {e['rho']:.6g}")
    return 0


# --- party ----------------------------------------------------------------------------------------------------
def _check_party(args: argparse.Namespace) -> None:
    """The options and the party's table, before TensorFlow (the party command never imports it)."""
    from ..data.tabular import read_party_table
    from .own_data import OPTIONS

    args.tensorflow = False
    problems = _address_problem(args.superlink, "--superlink")
    if not 0 < args.port < 65536:
        problems.append(f"--port must be in 1-65535, got {args.port}")
    if args.min_cohort < 2:
        problems.append(f"--min-cohort must be at least 2, got {args.min_cohort}")
    if (args.dp_budget is None) != (args.dp_ledger is None):
        problems.append("--dp-budget and --dp-ledger go together (the budget's spend lives in the ledger)")
    elif args.dp_budget is not None:
        epsilon, delta = args.dp_budget
        if not (0 < epsilon < float("inf") and 0 < delta < 1):
            problems.append(f"--dp-budget needs EPSILON > 0 and DELTA in (0, 1), got {epsilon:g} {delta:g}")
        if not os.path.isfile(os.path.expanduser(args.dp_ledger)):
            problems.append(
                f"--dp-ledger {args.dp_ledger}: no ledger there; create it once with "
                f"`gpflow-fed flower ledger create {args.dp_ledger}`"
            )
    name_problem = _check_name(args)
    if name_problem:
        problems.append(name_problem)
    args.identity = _identity_settings(args)
    try:  # the same check the party's ClientApp makes, before its SuperNode starts
        from ..federated.protection.identity import node_identity

        node_identity(args.identity, f"client_{args.client_index}")
    except (OSError, ValueError) as exc:
        problems.append(str(exc).replace("node config ", "--").replace("signing-key", "signing-key FILE"))
    try:
        args.table = read_party_table(args.csv, target=args.target, features=args.features, spelling=OPTIONS)
    except ValueError as exc:
        problems.append(f"--csv {args.csv}: {exc}")
    else:  # the names travel in the node config: comma-separated, quoted
        names = [*args.table.features, args.table.target]
        odd = [n for n in names if "," in n or "\n" in n or not _carried(n)]
        if odd:
            problems.append(
                f"column names {[ascii(n) for n in odd]} cannot go in a Flower node config (a comma, a line break, "
                "both quotes, or a character beyond U+FFFF)"
            )
    if problems:
        raise ValueError("; ".join(problems))


def _carried(value: str) -> bool:
    """Whether a text value survives a Flower node config: Flower reads it as TOML, quoted with no escapes, so it must
    come back as it went (both quotes are refused by ``node_config``; a character beyond U+FFFF is written as an
    escape TOML refuses)."""
    import tomllib

    from ..federated.runtimes.flower.commands import node_config

    try:
        return tomllib.loads(node_config({"value": value})) == {"value": value}
    except ValueError:
        return False


def _check_name(args: argparse.Namespace) -> str:
    """Set ``args.party_name``: ``--name`` (default: the stem of ``--csv``, ``hospital_a`` for ``hospital_a.csv``) in
    :func:`~gpflow_fed.validation.party_name`'s normal form, which travels in the node config as ``party-name``.

    It is only the label the server's log and result show for this party; its protocol id stays ``client_K``.

    :return: the problem, in one line naming ``--name`` ("" when there is none; ``args.party_name`` is then set).
    """
    from ..validation import party_name

    args.party_name = None
    given = getattr(args, "name", None)
    where = "--name" if given is not None else f"--name (by default the stem of --csv {args.csv})"
    raw = given if given is not None else os.path.splitext(os.path.basename(str(args.csv)))[0]
    hint = "" if given is not None else "; give one with --name NAME"
    try:
        name = party_name(raw, where)
    except ValueError as exc:  # its message names `where`, in one line
        return f"{exc}{hint}"
    if not _carried(name):
        return (
            f"{where}: the party name {ascii(name)} cannot go in a Flower node config (both quotes, or a character "
            f"beyond U+FFFF){hint}"
        )
    args.party_name = name
    return ""


def _identity_settings(args: argparse.Namespace) -> Dict[str, Any]:
    """The party's authentication as node-config entries: its key and roster files (absolute), or the opt-out."""
    settings: Dict[str, Any] = {}
    if getattr(args, "no_roster", False):
        settings["no-roster"] = True
    for option, key in (("signing_key", "signing-key"), ("roster", "roster")):
        value = getattr(args, option, None)
        if value is not None:
            settings[key] = os.path.abspath(os.path.expanduser(value))
    return settings


def _keygen(args: argparse.Namespace) -> int:
    from ..federated.protection.identity import public_key_bytes, roster_line, write_signing_key
    from ..validation import party_name

    try:
        if party_name(args.id, "--id") != args.id:
            raise ValueError(f"--id {args.id!r} is not in normal form")
        key = write_signing_key(args.out)
    except (FileExistsError, ValueError) as exc:
        print(f"gpflow-fed flower keygen: {exc}", file=sys.stderr)
        return 2
    line = roster_line(args.id, public_key_bytes(key))
    print(
        f"# wrote the signing key of {args.id} to {args.out} (0600; keep it private). Give every party this line "
        "for its roster file, over a channel the server does not control:",
        file=sys.stderr,
    )
    print(line)
    if args.roster:  # one machine trying the guide: every party's line into one roster file
        with open(args.roster, "a", encoding="utf-8") as roster:
            roster.write(line + "\n")
    return 0


def party_command(args: argparse.Namespace) -> Tuple[List[str], str]:
    """The ``flower-supernode`` command of a checked ``flower party`` (its table in ``args.table``) and the file it
    wrote the party's rows to, privately, under ``--state-dir``."""
    from ..federated.runtimes.flower.commands import default_state_root, executable, supernode_command, write_party_data

    table = args.table
    root = os.path.abspath(args.state_dir) if args.state_dir else default_state_root()
    data = write_party_data(root, args.client_index, table.X, table.Y)
    policy = {
        "secure-aggregation": not args.no_secure_aggregation,
        "min-cohort": args.min_cohort,
        "protect-small-cohorts": True,
        "max-rounds": args.max_rounds,
        **({} if getattr(args, "max_colluders", None) is None else {"max-colluders": args.max_colluders}),
        **(
            {}
            if args.dp_budget is None
            else {
                "dp-budget-epsilon": args.dp_budget[0],
                "dp-budget-delta": args.dp_budget[1],
                "dp-ledger": os.path.abspath(os.path.expanduser(args.dp_ledger)),
            }
        ),
        "features": ",".join(table.features),
        "target": table.target,
        **({} if getattr(args, "party_name", None) is None else {"party-name": args.party_name}),
        **(getattr(args, "identity", None) or _identity_settings(args)),
        **({} if getattr(args, "worker", None) is None else {"worker": args.worker}),
    }
    command = supernode_command(args.superlink, args.port, data, args.client_index, root, policy)
    return [executable("flower-supernode"), *command[1:]], data


def _party(args: argparse.Namespace) -> int:
    from ..federated.runtimes.flower.commands import party_environment
    from ..federated.runtimes.flower.lifetime import serve_party
    from ..federated.runtimes.flower.processes import Interrupted, ProcessFamily

    import shutil
    import tempfile

    from ..federated.runtimes.flower.worker import worker_command

    # the party's worker (its updates in one process, TensorFlow imported once): a private folder of its own
    args.worker = tempfile.mkdtemp(prefix="gpflow-fed-party-")
    command, data = party_command(args)
    table = args.table
    who = f"party {args.client_index}"
    until = (
        "until stopped (--stay)"
        if args.stay
        else f"until its SuperLink has stopped for {args.linger:g} s (the run is over) or Ctrl-C"
    )
    print(
        f"{who}: {table.X.shape[0]} rows of {args.csv} ({', '.join(table.features)} -> {table.target}) kept "
        f"privately in {data}; its SuperNode serves {args.superlink} {until}",
        flush=True,
    )
    sys.stderr.flush()

    def report(line: str) -> None:
        print(f"{who}: {line}", flush=True)

    family = ProcessFamily(grace=STOP_GRACE, signals=True)
    try:
        with family:
            environment = party_environment(command[0])
            status = serve_party(
                family,
                command,
                environment,
                args.superlink,
                linger=args.linger,
                stay=args.stay,
                report=report,
                worker=worker_command(args.worker),
            )
    except Interrupted as stop:
        ended = family.ended
        print(f"{who}: stopped ({stop}); its SuperNode and the {ended} process(es) it ran have ended", flush=True)
        return stop.exit_status
    finally:
        shutil.rmtree(args.worker, ignore_errors=True)
    return status


# --- server ---------------------------------------------------------------------------------------------------
def _check_server(args: argparse.Namespace) -> None:
    """The options, before TensorFlow: every problem at once."""
    from ..fitting import DEFAULTS

    args.tensorflow = False  # the server's command starts processes and reads their result: no TensorFlow here
    problems = []
    if not 0 < args.port < 65536:
        problems.append(f"--port must be in 1-65535, got {args.port}")
    if args.min_cohort < 2:
        problems.append(f"--min-cohort must be at least 2, got {args.min_cohort}")
    elif not args.no_secure_aggregation and args.clients < args.min_cohort:
        problems.append(
            f"--clients {args.clients} is below --min-cohort {args.min_cohort}: secure aggregation sums no fewer "
            f"parties' data; start {args.min_cohort} parties or more (--clients {args.min_cohort})"
            + (", or lower --min-cohort (≥ 2)" if args.min_cohort > 2 else "")
        )
    save = os.path.abspath(args.save)
    if os.path.isdir(save):
        problems.append(f"--save {args.save} is a folder; name the model's file (e.g. model.npz)")
    ignored = [
        f"--{dest.replace('_', '-')}"
        for dest, name in METHOD_OPTIONS.items()
        if getattr(args, dest) is not None and name not in DEFAULTS[args.method]
    ]
    if ignored:
        problems.append(f"{', '.join(ignored)} do(es) not apply to --method {args.method}; drop it")
    try:
        run_options(args)
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def server_config(args: argparse.Namespace) -> Dict[str, Any]:
    """The run config ``flower server`` submits: the table run of ``--method`` with every setting of the method
    (its defaults unless given, so that ``flwr run --run-config`` may change any), the parties, the protection
    request, the run options (:func:`.options.run_options`, as ``RunOptions.to_config`` writes them) and where the
    model goes."""
    from ..federated import Protection
    from ..fitting import DEFAULTS

    given = {name: getattr(args, dest) for dest, name in METHOD_OPTIONS.items() if getattr(args, dest) is not None}
    settings = {**DEFAULTS[args.method], **given}
    protection = Protection() if not args.no_secure_aggregation else Protection(secure_aggregation=False)
    options = run_options(args).to_config()
    if options["checkpoint-dir"]:  # the ServerApp runs in its own process and folder
        options["checkpoint-dir"] = os.path.abspath(options["checkpoint-dir"])
    config: Dict[str, Any] = {
        "method": args.method,
        **{name.replace("_", "-"): value for name, value in settings.items()},
        "seed": args.seed,
        "num-clients": args.clients,
        "wait": float(args.wait),
        **options,
        "standardize": True,
        "save": os.path.abspath(args.save),
        **protection.to_config(),
    }
    if protection.secure is not None:
        config["min-cohort"] = args.min_cohort
    return config


def _server(args: argparse.Namespace) -> int:
    from ..federated.runtimes.flower.app_config import FIT_FACTORY
    from ..federated.runtimes.flower.deploy import SuperLinkServer
    from ..federated.runtimes.flower.processes import Interrupted

    config = server_config(args)
    workdir = os.path.abspath(args.workdir)
    print(
        f"SuperLink on {args.host}:{args.port}; waiting up to {args.wait:g} s for {args.clients} parties "
        f"(gpflow-fed flower party --csv FILE --target COL --client-index K --superlink HOST:{args.port}); "
        f"logs in {workdir}; Ctrl-C stops it all",
        flush=True,
    )
    server = SuperLinkServer(workdir, host=args.host, port=args.port, grace=STOP_GRACE, signals=True)
    try:
        with server:
            out = server.run(FIT_FACTORY, config, timeout=None, stream=True)
    except Interrupted as stop:
        print(
            f"server: stopped ({stop}); the SuperLink, the run and the {server.family.ended} process(es) they ran "
            "have ended",
            flush=True,
        )
        return stop.exit_status
    record = out["record"]
    rounds = len(record["history"])
    print(
        f"trained {args.method} in {rounds} rounds ({record['seconds']:.1f} s); the model (raw inputs in, the "
        f"target's units out) is saved in {config['save']}: gpflow_fed.models.StandardizedModel.load"
        f"({config['save']!r})",
        flush=True,
    )
    return 0


# --- app ------------------------------------------------------------------------------------------------------
def _check_app(args: argparse.Namespace) -> None:
    """The options, before TensorFlow: every problem of --clients, --superlink and --set."""
    problems = []
    if args.clients < 1:
        problems.append(f"--clients must be at least 1, got {args.clients}")
    problems += _address_problem(args.superlink, "--superlink")
    try:
        _settings(args.set or [])
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def _app(args: argparse.Namespace) -> int:
    from ..federated.engine.factories import TRUSTED_MODULES_ENV
    from ..federated.runtimes.flower.deploy import OFFLINE_ENV, superlink_command, supernode_command, write_app

    port = args.superlink.rpartition(":")[2]
    config = {"num-clients": args.clients, **_settings(args.set or [])}
    module = _check_factory(args.algorithm)
    app = os.path.abspath(write_app(args.app_dir, args.algorithm, config))
    home = os.path.join(app, "flwr_home")
    os.makedirs(home, exist_ok=True)
    with open(os.path.join(home, "config.toml"), "w") as f:
        f.write(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\naddress = "{args.superlink}"\n'
            "insecure = true\n"
        )
    environment = {**OFFLINE_ENV, TRUSTED_MODULES_ENV: module}
    data_dir = os.path.abspath(args.data_dir)
    commands: Dict[str, Any] = {
        "superlink": shlex.join(superlink_command(int(port), host="0.0.0.0")),
        "supernodes": [
            shlex.join(supernode_command(args.superlink, 9110 + k, os.path.join(data_dir, f"client_{k}.npz"), k))
            for k in range(args.clients)
        ],
        "run": f"FLWR_HOME={shlex.quote(home)} " + shlex.join(["flwr", "run", app, CONNECTION]),
    }
    if args.json:  # the commands' common layout (docs "Command output"); what to run is under "outputs"
        from .report import emit, payload

        settings = {"algorithm": args.algorithm, "clients": args.clients, "superlink": args.superlink,
                    "data_dir": data_dir, "run_config": config}  # fmt: skip
        emit(True, payload("flower", None, settings, [], outputs={"app": app, "environment": environment, **commands}))
        return 0
    print("export " + " ".join(f"{k}={v}" for k, v in environment.items()))
    print("\n".join([commands["superlink"], *commands["supernodes"], commands["run"]]))
    return 0


def _check_factory(spec: str) -> str:
    """Import the factory's module (the app writer's own code) and check the factory is registered; returns
    the module name. Flower run configs may name registered factories only (see
    :mod:`gpflow_fed.federated.engine.factories`)."""
    import importlib

    from ..federated.engine.factories import TRUSTED_MODULES_ENV, load_factory

    if not isinstance(spec, str) or spec.count(":") != 1 or not all(spec.split(":")):
        raise ValueError(f"--algorithm must be a factory 'package.module:function', got {spec!r}")
    module, function = spec.split(":")
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        raise ValueError(
            f"--algorithm {spec}: module {module!r} does not import ({exc}); every party needs it "
            "installed or on PYTHONPATH"
        ) from None
    if not callable(getattr(imported, function, None)):
        raise ValueError(f"--algorithm {spec}: {module!r} has no function {function!r}")
    try:
        load_factory(spec)
    except ValueError:
        raise ValueError(
            f"--algorithm {spec} is not a registered algorithm factory: decorate {function} with "
            f"@gpflow_fed.federated.register_algorithm_factory in {module} (parties load it through "
            f"{TRUSTED_MODULES_ENV}={module})"
        ) from None
    return module


def _protection_arguments(parser: argparse.ArgumentParser, who: str) -> None:
    parser.add_argument(
        "--no-secure-aggregation",
        action="store_true",
        help=f"{who} sums in plain (default: secure aggregation; every party must allow it)",
    )
    parser.add_argument(
        "--min-cohort", type=int, default=2, help="the fewest parties whose sum is revealed, under secure aggregation"
    )


def register(subparsers: Any) -> None:
    from ..federated.protection.policy import DEFAULT_MAX_ROUNDS
    from ..fitting import DEFAULTS, METHODS

    parser = subparsers.add_parser(
        "flower",
        help="train across machines with Flower: each party on its own CSV, or any algorithm as a Flower app",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="flower_command", metavar="ROLE", required=True)

    party = sub.add_parser("party", help="one party: its own CSV, served by its SuperNode")
    party.add_argument("--csv", required=True, metavar="FILE", help="this party's table (a header row; its rows only)")
    party.add_argument("--target", required=True, metavar="COL", help="the output column")
    party.add_argument(
        "--features", nargs="+", default=None, metavar="COL", help="input columns (default: every other column)"
    )
    party.add_argument(
        "--client-index", type=non_negative_int, required=True, help="this party's index k in 0 … K-1 (each once)"
    )
    party.add_argument("--superlink", required=True, metavar="HOST:PORT", help="the server's SuperLink")
    party.add_argument(
        "--name",
        default=None,
        metavar="NAME",
        help="this party's name in the server's log and result (default: the CSV file's name without its extension); "
        "its protocol id stays client_K",
    )
    party.add_argument(
        "--max-rounds",
        type=positive_int,
        default=DEFAULT_MAX_ROUNDS,
        help="the most training rounds this party answers, whatever the server asks (default: %(default)s)",
    )
    party.add_argument(
        "--max-colluders",
        type=non_negative_int,
        default=None,
        metavar="N",
        help="the most parties of a cohort it assumes collude with the server, which sets the quorum it needs in the "
        "consistency round; the server may ask for more, never fewer (default: the protocol's, max(⌊n/3⌋, t − 1))",
    )
    party.add_argument("--port", type=int, default=9110, help="this SuperNode's local Runtime API port (one per party)")
    party.add_argument(
        "--state-dir",
        default=None,
        metavar="DIR",
        help="private folder for this party's rows and state (default ~/.cache/gpflow_fed/flower)",
    )
    party.add_argument(
        "--dp-budget",
        nargs=2,
        type=float,
        default=None,
        metavar=("EPSILON", "DELTA"),
        help="this party's own (ε, δ) budget across runs: it answers distributed DP only, until the budget is spent",
    )
    party.add_argument(
        "--dp-ledger", default=None, metavar="PATH", help="its DP ledger (with --dp-budget; `flower ledger create`)"
    )
    party.add_argument("--signing-key", metavar="FILE", help="this party's key file (gpflow-fed flower keygen)")
    party.add_argument(
        "--roster", metavar="FILE", help="the roster agreed out of band: one '<id> <hex public key>' line per party"
    )
    party.add_argument(
        "--no-roster",
        action="store_true",
        help="opt out of authenticated parties (then protected against a semi-honest server only)",
    )
    party.add_argument(
        "--linger",
        type=non_negative_float,
        default=15.0,
        metavar="SECONDS",
        help="stop once the SuperLink, seen before, has not answered for this long: the server's run is over",
    )
    party.add_argument(
        "--stay", action="store_true", help="keep serving after the SuperLink stops (for the next run; Ctrl-C ends it)"
    )
    _protection_arguments(party, "allow the server to ask for this party's")
    party.set_defaults(func=_party, check=_check_party)

    server = sub.add_parser("server", help="the server: SuperLink, the table run, the saved model")
    server.add_argument("--clients", type=positive_int, required=True, help="K, the number of parties")
    server.add_argument("--save", required=True, metavar="FILE", help="the trained model's .npz (StandardizedModel)")
    server.add_argument("--method", choices=METHODS, default="fsgp", help="fit's method")
    d = DEFAULTS["fsgp"]
    server.add_argument(
        "--rounds", type=positive_int, default=None, help=f"R (default: the method's; fsgp {d['rounds']})"
    )
    server.add_argument("--local-steps", type=positive_int, default=None, help="local steps per round (fsgp, fedbnr)")
    server.add_argument("--learning-rate", type=positive_float, default=None, help="Adam λ (fsgp, fedbnr)")
    server.add_argument("--inducing", "-M", type=positive_int, default=None, help="M (fsgp, pvi)")
    server.add_argument("--seed", type=non_negative_int, default=0, help="seed of the run (public)")
    server.add_argument("--port", type=int, default=9100, help="the SuperLink's port")
    server.add_argument("--host", default="127.0.0.1", help="the SuperLink's address (0.0.0.0: every interface)")
    server.add_argument("--wait", type=positive_float, default=600.0, help="seconds to wait for the parties")
    server.add_argument(
        "--workdir", default="gpflow-fed-server", metavar="DIR", help="the app, Flower's home and the logs"
    )
    _protection_arguments(server, "ask for the parties'")
    add_run_option_arguments(server, checkpoints=" (the server's part of the run; each party keeps its own)")
    server.set_defaults(func=_server, check=_check_server)

    keygen = sub.add_parser("keygen", help="make a party's signing key (0600) and print its roster line")
    keygen.add_argument("--out", required=True, metavar="FILE", help="the key file (never over an existing file)")
    keygen.add_argument("--id", required=True, metavar="client_K", help="the party's id, client_K for --client-index K")
    keygen.add_argument(
        "--roster", metavar="FILE", help="also append the roster line to FILE (when you hold every party's line)"
    )
    keygen.set_defaults(func=_keygen, check=_no_tensorflow)

    ledger = sub.add_parser("ledger", help="a party's DP ledger: create it once")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", metavar="ACTION", required=True)
    create = ledger_sub.add_parser("create", help="create an empty DP ledger (never over an existing file)")
    create.add_argument("path", metavar="PATH", help="the ledger file (0600; its folder made 0700 if missing)")
    create.set_defaults(func=_ledger_create, check=_no_tensorflow)
    show = ledger_sub.add_parser("show", help="print a DP ledger's total ρ, its ε at --delta, and its entries")
    show.add_argument("path", metavar="PATH", help="the ledger file")
    show.add_argument("--delta", type=float, default=1e-5, help="δ of the ε printed (default: %(default)s)")
    show.set_defaults(func=_ledger_show, check=_no_tensorflow)

    app = sub.add_parser("app", help="write a Flower app for a registered algorithm factory and print the commands")
    app.add_argument("app_dir", help="folder for the app's pyproject.toml")
    app.add_argument("--algorithm", required=True, help="algorithm factory 'package.module:function(run_config)'")
    app.add_argument("--clients", type=int, required=True, help="number of parties K")
    app.add_argument("--superlink", default="127.0.0.1:9100", help="the SuperLink's HOST:PORT")
    app.add_argument("--data-dir", default=".", help="where party k's client_k.npz is (X, Y)")
    app.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run-config default (repeatable)")
    app.add_argument(
        "--json", action="store_true", help="print the app folder, the environment and the commands as JSON"
    )
    app.set_defaults(func=_app, check=_check_app)

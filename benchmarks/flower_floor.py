"""Flower on real processes: the floor of one exchange (an empty ClientApp) beside the package's table run.

Everything runs as on a deployment, on this machine: ``flower-superlink`` and one ``flower-supernode`` per party,
the run submitted with ``flwr run``; every message starts a ``flwr-clientapp`` process (Flower 1.41's subprocess
executor), which installs the app and imports its ClientApp module.

* ``floor``: this file as the Flower app (``flower_floor:server_app``, ``flower_floor:client_app``): the ServerApp
  sends ``--exchanges`` times one ``train`` message to every SuperNode and waits for the replies; the ClientApp
  replies at once with an empty message and imports nothing but Flower; its SuperExecs look for work every 0.2 s, as a
  party's do. Measured twice: with Flower's
  ``Grid.send_and_receive`` (it pulls the replies every 3 s) and with the package's pull loop
  (``gpflow_fed.federated.runtimes.flower.transport.exchange``, every 0.1 s), which the package's ServerApp uses.
* ``package``: the Flower guide's table run as written — ``gpflow-fed flower server --clients K`` and K
  ``gpflow-fed flower party`` processes on the generated hospital tables (secure aggregation, authenticated
  parties), FSGP with ``--rounds`` and ``--inducing`` — and its exchanges from the ServerApp's ``result.json``: how
  many of each stage kind and their seconds (an ``update`` trains or sums, and imports TensorFlow in its ClientApp;
  the secure-aggregation stages do not).

Reported: seconds per exchange of each, the package's per stage kind, and the ratio to the floor with the same pull
loop. The machine's load is recorded (``provenance.save``); the numbers are the wall times of this machine as it was.

    .venv/bin/python benchmarks/flower_floor.py [--parties 4] [--exchanges 10] [--rounds 1] [--inducing 10]
        [--only floor|package] [--out FILE]
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
OUT = os.path.join(HERE, "results", "flower_floor.json")

# --- the empty app: imported by flwr-serverapp and flwr-clientapp (Flower only at module level) -------------------
client_app = ClientApp()


@client_app.train()
def _reply(msg: Message, context: Context) -> Message:
    return Message(RecordDict(), reply_to=msg)


server_app = ServerApp()


@server_app.main()
def _floor(grid: Grid, context: Context) -> None:
    config = context.run_config
    wanted, count, poll = int(config["num-clients"]), int(config["exchanges"]), float(config["poll"])
    deadline = time.monotonic() + 600
    while len(nodes := sorted(grid.get_node_ids())) < wanted:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {len(nodes)} SuperNodes after 600 s")
        time.sleep(0.5)
    if poll > 0:
        sys.path.insert(0, ROOT)
        from gpflow_fed.federated.runtimes.flower.transport import exchange
    seconds: List[float] = []
    for e in range(count):
        messages = [
            Message(RecordDict({"e": ConfigRecord({"e": e})}), node, MessageType.TRAIN, group_id=str(e))
            for node in nodes
        ]
        started = time.perf_counter()
        if poll > 0:
            replies = exchange(grid, messages, None, poll)
        else:
            replies = list(grid.send_and_receive(messages))
        seconds.append(time.perf_counter() - started)
        assert len(replies) == len(nodes) and not any(r.has_error() for r in replies), replies
    with open(str(config["output"]), "w") as f:
        json.dump({"seconds": seconds}, f)


# --- the runs -----------------------------------------------------------------------------------------------------
FLOOR_APP = """[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-floor"
version = "1.0.0"
dependencies = ["flwr"]

[tool.flwr.app]
publisher = "gpflow-fed"

[tool.flwr.app.components]
serverapp = "flower_floor:server_app"
clientapp = "flower_floor:client_app"

[tool.flwr.app.config]
num-clients = {parties}
exchanges = {exchanges}
poll = {poll}
output = "{output}"
"""


def floor(folder: str, parties: int, exchanges: int, poll: float) -> Dict[str, Any]:
    """The empty app's exchanges on a SuperLink and ``parties`` SuperNodes; ``poll`` 0: Flower's pull."""
    import subprocess

    from gpflow_fed.federated.runtimes.flower.commands import free_port
    from gpflow_fed.federated.runtimes.flower.deploy import SuperLinkServer

    os.makedirs(folder, exist_ok=True)
    output = os.path.join(folder, "floor.json")
    app = os.path.join(folder, "app")
    os.makedirs(app, exist_ok=True)
    with open(os.path.join(app, "pyproject.toml"), "w") as f:
        f.write(FLOOR_APP.format(parties=parties, exchanges=exchanges, poll=float(poll), output=output))
    from gpflow_fed.federated.runtimes.flower.commands import SUPEREXEC_POLL, SUPEREXEC_POLL_ENV

    # the SuperNodes' SuperExec looks for work as often as a party's (gpflow-fed flower party) does
    env = {"PYTHONPATH": HERE + os.pathsep + ROOT, SUPEREXEC_POLL_ENV: SUPEREXEC_POLL}
    started = time.perf_counter()
    with SuperLinkServer(folder, env=env) as server:
        for k in range(parties):
            command = ["flower-supernode", "--insecure", "--superlink", server.address, "--port", str(free_port())]
            server._start(command, f"supernode_{k}.log")
        with open(os.path.join(folder, "flwr_run.log"), "w") as log:
            submit = server.family.start(
                [os.path.join(server.bin_dir, "flwr"), "run", app, server.CONNECTION, "--stream"],
                env=server.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            submit.wait(timeout=3600)
        with open(output) as f:
            seconds = json.load(f)["seconds"]
    return {
        "path": "empty ClientApp, " + ("Flower's send_and_receive (3 s pulls)" if poll <= 0 else f"{poll:g} s pulls"),
        "parties": parties,
        "exchanges": exchanges,
        "seconds_per_exchange": sum(seconds) / len(seconds),
        "min": min(seconds),
        "max": max(seconds),
        "wall_seconds": time.perf_counter() - started,
    }


def package(folder: str, parties: int, rounds: int, inducing: int) -> Dict[str, Any]:
    """The guide's table run: ``flower server`` and ``parties`` ``flower party`` processes (module docstring)."""
    import subprocess

    from gpflow_fed.federated.runtimes.flower.commands import free_port
    from gpflow_fed.federated.runtimes.flower.processes import ProcessFamily

    names = ["north", "south", "east", "west"]
    if parties > len(names):
        raise SystemExit(f"--parties: the generated hospital tables are {len(names)}")
    os.makedirs(folder, exist_ok=True)
    env = {**os.environ, "XDG_CACHE_HOME": os.path.join(folder, "cache"), "PYTHONPATH": ROOT}
    cli = [sys.executable, "-m", "gpflow_fed.cli"]

    def run(*argv: str) -> None:
        subprocess.run([*cli, *argv], cwd=folder, env=env, check=True, stdout=subprocess.DEVNULL)

    run("datasets", "--write-party-examples", "hospitals")
    for k in range(parties):
        run("flower", "keygen", "--out", f"keys/{names[k]}.key", "--id", f"client_{k}", "--roster", "roster.txt")
    port = free_port()
    server_command = [
        *cli, "flower", "server", "--clients", str(parties), "--save", "model.npz", "--rounds", str(rounds),
        "--inducing", str(inducing), "--port", str(port), "--workdir", "server",
    ]  # fmt: skip
    started = time.perf_counter()
    with ProcessFamily(grace=10.0) as family, open(os.path.join(folder, "server.log"), "w") as log:
        server = family.start(server_command, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT)
        for k in range(parties):
            party = [
                *cli, "flower", "party", "--csv", f"hospitals/{names[k]}.csv", "--target", "los", "--client-index",
                str(k), "--superlink", f"127.0.0.1:{port}", "--port", str(free_port()), "--signing-key",
                f"keys/{names[k]}.key", "--roster", "roster.txt", "--linger", "2",
            ]  # fmt: skip
            with open(os.path.join(folder, f"party_{k}.log"), "w") as party_log:
                family.start(party, cwd=folder, env=env, stdout=party_log, stderr=subprocess.STDOUT)
        if server.wait(timeout=7200) != 0:
            raise SystemExit(f"the server failed; see {folder}/server.log")
        wall = time.perf_counter() - started
    with open(os.path.join(folder, "server", "output", "result.json")) as f:
        record = json.load(f)
    exchanges = record["exchanges"]
    stages = sum(int(e["stages"]) for e in exchanges.values())
    seconds = sum(float(e["seconds"]) for e in exchanges.values())
    by_stage: Dict[str, List[float]] = {}
    for job in exchanges.values():
        for stage, (count, spent) in job.get("by_stage", {}).items():
            entry = by_stage.setdefault(stage, [0, 0.0])
            entry[0] += count
            entry[1] += spent
    return {
        "path": f"gpflow-fed flower server + {parties} parties, FSGP R = {rounds}, M = {inducing}",
        "parties": parties,
        "rounds": rounds,
        "exchanges": stages,
        "exchanges_by_job": {job: int(e["stages"]) for job, e in exchanges.items()},
        "seconds_per_exchange": seconds / stages,
        "seconds_per_exchange_by_stage": {s: spent / count for s, (count, spent) in sorted(by_stage.items())},
        "exchanges_by_stage": {s: int(count) for s, (count, _) in sorted(by_stage.items())},
        "exchange_seconds": seconds,
        "run_seconds": float(record["seconds"]),
        "wall_seconds": wall,
    }


def main() -> int:
    import argparse
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parties", type=int, default=4)
    parser.add_argument("--exchanges", type=int, default=10, help="the floor's exchanges per measurement")
    parser.add_argument("--rounds", type=int, default=1, help="the package's FSGP rounds R")
    parser.add_argument("--inducing", type=int, default=10)
    parser.add_argument("--only", choices=("floor", "package"), default=None)
    parser.add_argument("--keep", default=None, metavar="DIR", help="run in DIR and keep the logs (default: a temp)")
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    sys.path.insert(0, HERE)
    from provenance import save

    rows: List[Dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or tmp
        if args.only in (None, "floor"):
            rows.append(floor(os.path.join(folder, "floor-flower"), args.parties, args.exchanges, 0.0))
            rows.append(floor(os.path.join(folder, "floor-package"), args.parties, args.exchanges, 0.1))
        if args.only in (None, "package"):
            rows.append(package(os.path.join(folder, "package"), args.parties, args.rounds, args.inducing))
    print(f"Flower 1.41 on real processes: a SuperLink and {args.parties} SuperNodes on this machine "
          f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f})\n")  # fmt: skip
    print("| path | exchanges | s per exchange | wall s |")
    print("|---|---|---|---|")
    for row in rows:
        print(f"| {row['path']} | {row['exchanges']} | {row['seconds_per_exchange']:.2f} | {row['wall_seconds']:.0f} |")
    floors = [r for r in rows if "0.1 s pulls" in r["path"]]
    for row in rows:
        if "seconds_per_exchange_by_stage" in row:
            by_stage = row["seconds_per_exchange_by_stage"].items()
            kinds = ", ".join(f"{s} {row['exchanges_by_stage'][s]} × {t:.2f} s" for s, t in by_stage)
            print(f"\nthe package's exchanges by stage: {kinds}")
            if floors:
                ratio = row["seconds_per_exchange"] / floors[0]["seconds_per_exchange"]
                print(f"the package's time per exchange is {ratio:.2f} × the floor with the same pull loop")
    save(args.out, {"parties": args.parties, "rows": rows}, __file__, sys.argv[1:])
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``gpflow-fed flower``: write a Flower app folder for an algorithm factory and print the commands that run it.

``gpflow-fed flower APP_DIR --algorithm mypkg.jobs:fsgp --clients 2 [--superlink HOST:PORT]
[--data-dir DIR] [--set key=value ...]`` writes ``APP_DIR/pyproject.toml`` (gpflow-fed's ServerApp and
ClientApp, the run config) and prints, one per line, the ``flower-superlink`` command, one
``flower-supernode`` command per party (party k reads ``DIR/client_k.npz``) and the ``flwr run`` command.
See ``docs/guides/flower.md``.
"""

from __future__ import annotations

import argparse
import os
import shlex
from typing import Any, Dict, List


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


def _run(args: argparse.Namespace) -> int:
    from ..federated.runtimes.flower_deploy import OFFLINE_ENV, superlink_command, supernode_command, write_app

    if args.clients < 1:
        raise ValueError(f"--clients must be at least 1, got {args.clients}")
    _host, sep, port = args.superlink.rpartition(":")
    if not sep or not _host or not port.isdigit():
        raise ValueError(f"--superlink must be HOST:PORT, got {args.superlink!r}")
    config = {"num-clients": args.clients, **_settings(args.set or [])}
    app = os.path.abspath(write_app(args.app_dir, args.algorithm, config))
    env = " ".join(f"{k}={v}" for k, v in OFFLINE_ENV.items())
    print(f"export {env}")
    print(shlex.join(superlink_command(int(port), host="0.0.0.0")))
    data_dir = os.path.abspath(args.data_dir)
    for k in range(args.clients):
        data = os.path.join(data_dir, f"client_{k}.npz")
        print(shlex.join(supernode_command(args.superlink, 9110 + k, data, k)))
    print(shlex.join(["flwr", "run", app, "<connection in $FLWR_HOME/config.toml>"]))
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("flower", help="write a Flower app for an algorithm and print the commands to run it",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("app_dir", help="folder for the app's pyproject.toml")
    parser.add_argument("--algorithm", required=True, help="algorithm factory 'package.module:function(run_config)'")
    parser.add_argument("--clients", type=int, required=True, help="number of parties K")
    parser.add_argument("--superlink", default="127.0.0.1:9100", help="the SuperLink's HOST:PORT")
    parser.add_argument("--data-dir", default=".", help="where party k's client_k.npz is (X, Y)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run-config default (repeatable)")
    parser.set_defaults(func=_run)

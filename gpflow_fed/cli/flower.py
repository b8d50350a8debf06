"""``gpflow-fed flower``: write a Flower app folder for an algorithm factory and print the commands that run it.

``gpflow-fed flower APP_DIR --algorithm mypkg.jobs:fsgp --clients 2 [--superlink HOST:PORT]
[--data-dir DIR] [--set key=value ...]`` checks that ``mypkg.jobs`` imports and that ``fsgp`` is a registered
algorithm factory (``@register_algorithm_factory``), writes ``APP_DIR/pyproject.toml`` (depends on
``gpflow-fed[flower]``; gpflow-fed's ServerApp and ClientApp; the run config) and ``APP_DIR/flwr_home/config.toml``
(the SuperLink connection), and prints, one per line, the environment to export on every machine (including
``GPFLOW_FED_ALGORITHM_MODULES``, so each party loads the factory's registration), the ``flower-superlink``
command, one ``flower-supernode`` command per party (party k reads ``DIR/client_k.npz``) and the ``flwr run``
command (``--json``: the same under ``outputs`` of the commands' common JSON layout). The training itself runs
under ``flwr run``, in the ServerApp, so this command has no progress bar, TensorBoard or plot of its own. See the
Flower guide
(docs/guides/flower.md).
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


def _check(args: argparse.Namespace) -> None:
    """The options, before TensorFlow: every problem of --clients, --superlink and --set."""
    problems = []
    if args.clients < 1:
        problems.append(f"--clients must be at least 1, got {args.clients}")
    _host, sep, port = args.superlink.rpartition(":")
    if not sep or not _host or not port.isdigit():
        problems.append(f"--superlink must be HOST:PORT, got {args.superlink!r}")
    try:
        _settings(args.set or [])
    except ValueError as exc:
        problems.append(str(exc))
    if problems:
        raise ValueError("; ".join(problems))


def _run(args: argparse.Namespace) -> int:
    from ..federated.factories import TRUSTED_MODULES_ENV
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


#: the SuperLink connection's name in the written ``flwr_home/config.toml``.
CONNECTION = "gpflow-fed"


def _check_factory(spec: str) -> str:
    """Import the factory's module (the app writer's own code) and check the factory is registered; returns
    the module name. Flower run configs may name registered factories only (see
    :mod:`gpflow_fed.federated.factories`)."""
    import importlib

    from ..federated.factories import TRUSTED_MODULES_ENV, load_factory

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


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "flower",
        help="write a Flower app for an algorithm and print the commands to run it",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("app_dir", help="folder for the app's pyproject.toml")
    parser.add_argument("--algorithm", required=True, help="algorithm factory 'package.module:function(run_config)'")
    parser.add_argument("--clients", type=int, required=True, help="number of parties K")
    parser.add_argument("--superlink", default="127.0.0.1:9100", help="the SuperLink's HOST:PORT")
    parser.add_argument("--data-dir", default=".", help="where party k's client_k.npz is (X, Y)")
    parser.add_argument("--set", action="append", metavar="KEY=VALUE", help="a run-config default (repeatable)")
    parser.add_argument(
        "--json", action="store_true", help="print the app folder, the environment and the commands as JSON"
    )
    parser.set_defaults(func=_run, check=_check)

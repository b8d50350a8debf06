"""Flower from tables: exchanges per round and seconds per exchange, loopback ClientApps beside FlowerRuntime.

The same table run (the generated hospitals of ``gpflow-fed datasets --write-party-examples``: 4 parties, 220
rows, ``age, dose -> los``; FSGP with ``gpflow_fed.fit``'s defaults but ``--rounds`` and ``--inducing``; secure
aggregation on, as by default) on two Flower paths:

* ``FlowerRuntime``: ``gpflow_fed.fit(table, runtime=FlowerRuntime())``, every party a ClientApp kept alive in this
  process, messages through Flower's protobuf encoding;
* ``loopback``: the ServerApp's table run (``gpflow-fed flower server``'s run config) over a loopback grid whose
  ClientApps are restarted for every message, state on disk between messages, as on a SuperNode.

An exchange is one stage sent to the cohort and its replies (one Flower ``send_and_receive``); on a SuperNode each
costs at least its polling interval (3 s in Flower 1.41) and a new ClientApp process, so a run's time there is
about its exchanges times that. Reported: exchanges of the whole run by kind (describe, moments, training) and per
training round, and seconds per exchange (the run's wall time over its exchanges).

    .venv/bin/python benchmarks/flower_exchanges.py [--rounds 3] [--inducing 10]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections import Counter
from typing import Any, Dict, List

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from provenance import save  # noqa: E402

OUT = os.path.join(HERE, "results", "flower_exchanges.json")


def _per_round(groups: List[str]) -> Dict[str, int]:
    """Exchanges per training round (``train/<round>/...`` groups), by round."""
    rounds = Counter(g.split("/")[1] for g in groups if g.startswith("train/"))
    return {r: n for r, n in sorted(rounds.items(), key=lambda kv: int(kv[0]))}


def _kinds(groups: List[str]) -> Dict[str, int]:
    """Exchanges by what they are: the secure-aggregation setup, updates, masked inputs, unmasks."""
    return dict(Counter(g.rsplit("/", 1)[1] for g in groups))


def in_process(table: Dict[str, np.ndarray], rounds: int, inducing: int) -> Dict[str, Any]:
    from gpflow_fed import fit
    from gpflow_fed.federated import FlowerRuntime

    transports: List[Any] = []

    class Counting(FlowerRuntime):
        def execute(self, *args: Any, **kwargs: Any) -> Any:
            result = super().execute(*args, **kwargs)
            transports.append(self.transport)
            return result

    start = time.perf_counter()
    result = fit(
        table,
        party_column="hospital",
        target="los",
        test_fraction=0.0,
        runtime=Counting(),
        rounds=rounds,
        num_inducing=inducing,
    )
    seconds = time.perf_counter() - start
    moments, train = transports  # fit runs the moments and the training as two runs, each with its describe
    return _row("FlowerRuntime (in process)", seconds, len(transports), moments.groups, train.groups, result)


def loopback(folder: str, rounds: int, inducing: int) -> Dict[str, Any]:
    from gpflow_fed.data.example import write_party_examples
    from gpflow_fed.data.tabular import read_party_table
    from gpflow_fed.federated import Protection
    from gpflow_fed.federated.runtimes.flower.client_app import make_client_app
    from gpflow_fed.fitting.flower import FIT_FACTORY, fit_method
    from gpflow_fed.federated.runtimes.flower.app_config import run_config_defaults
    from gpflow_fed.federated.runtimes.flower.server_app import FlowerServer
    from gpflow_fed.fitting.flower import table_job
    from gpflow_fed.federated.runtimes.flower.testing import LoopbackGrid
    from gpflow_fed.federated.runtimes.flower.commands import write_party_data

    from gpflow_fed.federated.protection.identity import write_federation

    nodes = []
    paths = write_party_examples(os.path.join(folder, "hospitals"))
    keys, roster = write_federation(os.path.join(folder, "identity"), [f"client_{k}" for k in range(len(paths))])
    for k, path in enumerate(paths):
        party = read_party_table(str(path), target="los")
        data = write_party_data(os.path.join(folder, "state"), k, party.X, party.Y)
        identity = {"signing-key": keys[f"client_{k}"], "roster": roster}  # authenticated parties, as by default
        nodes.append({"data": data, "client-index": k, "state-dir": os.path.join(folder, "state"), **identity})
    run_config = {
        **run_config_defaults(),
        "algorithm": FIT_FACTORY,
        "method": "fsgp",
        "rounds": rounds,
        "num-inducing": inducing,
        "standardize": True,
    }
    grid = LoopbackGrid(make_client_app(), nodes, run_config, 11)
    server = FlowerServer(fit_method(run_config), seed=0, protection=Protection.from_config(run_config))
    start = time.perf_counter()
    result = server.run(grid, job=table_job)
    seconds = time.perf_counter() - start
    row = _row(
        "loopback grid, ClientApps restarted per message",
        seconds,
        server.exchanges["describe"]["stages"],
        server.transports["moments"].groups,
        server.transports["train"].groups,
        result,
    )
    return row


def _row(name: str, seconds: float, describe: int, moments: List[str], train: List[str], result: Any) -> Dict[str, Any]:
    total = describe + len(moments) + len(train)
    per_round = _per_round(train)
    x = np.array([[40.0, 0.5]])
    return {
        "path": name,
        "seconds": seconds,
        "exchanges": total,
        "describe": describe,
        "moments_exchanges": len(moments),
        "moments_kinds": _kinds(moments),
        "train_exchanges": len(train),
        "train_kinds": _kinds(train),
        "exchanges_per_round": per_round,
        "seconds_per_exchange": seconds / total,
        "prediction_at_age_40_dose_0.5": float(np.asarray(result.model.predict_y(x)[0])[0, 0]),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--inducing", type=int, default=10)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()

    from gpflow_fed.data.example import example_table

    table = example_table()
    rows = [in_process(table, args.rounds, args.inducing)]
    with tempfile.TemporaryDirectory() as tmp:
        rows.append(loopback(tmp, args.rounds, args.inducing))
    print(f"FSGP table run, 4 parties (220 rows), M = {args.inducing}, {args.rounds} rounds, secure aggregation\n")
    print("| path | exchanges (describe + moments + training) | per training round | seconds | s per exchange |")
    print("|---|---|---|---|---|")
    for row in rows:
        per_round = sorted(set(row["exchanges_per_round"].values()))
        print(
            f"| {row['path']} | {row['exchanges']} ({row['describe']} + {row['moments_exchanges']} + "
            f"{row['train_exchanges']}) | {'/'.join(map(str, per_round))} | {row['seconds']:.1f} | "
            f"{row['seconds_per_exchange']:.2f} |"
        )
    print("\ntraining exchanges by stage:", rows[-1]["train_kinds"])
    save(args.out, {"rounds": args.rounds, "inducing": args.inducing, "rows": rows}, __file__, sys.argv[1:])
    print(f"saved {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

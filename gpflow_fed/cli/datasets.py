"""``gpflow-fed datasets``: list the offline datasets, or show one split among simulated clients.

``gpflow-fed datasets`` prints every real dataset of :func:`gpflow_fed.data.available_datasets` (N, D,
groups, coordinates, licence; a dataset whose package is missing is marked so) and the FSGP synthetic sets.
``gpflow-fed datasets NAME --partition P --clients K`` loads one and prints its client sizes and their
max − min (the imbalance the FSGP paper reports); ``--plot FILE`` draws the split. ``--json`` prints
machine-readable output.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Dict, List

SYNTHETIC = ("synthetic1", "synthetic2")
#: the names of :func:`gpflow_fed.data.available_datasets` and the keys of ``gpflow_fed.data.PARTITIONS``,
#: spelled out so that parsing imports no TensorFlow (a test checks they agree with the library).
REAL_DATASETS = ("ames", "boston", "co2", "concrete", "deliveries", "diabetes", "ozone", "sunspots", "weather")
PARTITION_NAMES = ("group", "iid", "random_sizes", "sorted_chunks", "spatial")


def _load(name: str) -> Any:
    from ..data import fsgp_synthetic_1, fsgp_synthetic_2, load_dataset

    if name in SYNTHETIC:
        data = fsgp_synthetic_1() if name == "synthetic1" else fsgp_synthetic_2()
        return data.X_train, data.Y_train, {"licence": "generated (FSGP paper eqs. 18-19)", "groups": None}
    real = load_dataset(name)
    return real.X, real.Y, {"licence": real.licence, "groups": real.groups, "coordinates": real.coordinates}


def _summary(name: str) -> Dict[str, Any]:
    try:
        X, _, meta = _load(name)
    except ImportError as exc:
        return {"name": name, "error": str(exc)}
    groups = meta.get("groups")
    return {
        "name": name,
        "N": int(X.shape[0]),
        "D": int(X.shape[1]),
        "groups": None if groups is None else int(len(set(groups.tolist()))),
        "coordinates": meta.get("coordinates") is not None,
        "licence": meta["licence"],
    }


def _run(args: argparse.Namespace) -> int:
    from ..data import available_datasets, make_federated

    if args.name is None:
        if args.plot is not None:
            raise ValueError(
                "--plot draws one dataset's split: name the dataset (gpflow-fed datasets NAME --plot FILE)"
            )
        rows: List[Dict[str, Any]] = [_summary(n) for n in (*available_datasets(), *SYNTHETIC)]
        if args.json:
            print(json.dumps(rows, indent=2))
            return 0
        print("| name | N | D | groups | coordinates | licence |\n|---|---|---|---|---|---|")
        for r in rows:
            if "error" in r:
                print(f"| {r['name']} | – | – | – | – | not installed: {r['error']} |")
            else:
                cells = [r["name"], r["N"], r["D"], r["groups"] or "–", r["coordinates"], r["licence"]]
                print("| " + " | ".join(map(str, cells)) + " |")
        return 0
    X, Y, meta = _load(args.name)
    extra: Dict[str, Any] = {}
    if args.partition == "group":
        extra["groups"] = meta.get("groups")
    if args.partition == "spatial" and meta.get("coordinates") is not None:
        extra["coordinates"] = meta["coordinates"]
    fed = make_federated(
        X, Y, partition=args.partition, num_clients=args.clients, seed=args.seed, name=args.name, **extra
    )
    sizes = list(fed.client_sizes)
    result = {"name": args.name, "partition": args.partition, "sizes": sizes, "imbalance": max(sizes) - min(sizes)}
    if args.plot is not None:
        result["plot"] = str(_plot(fed, args))
    text = f"{fed}\nmax - min client size: {result['imbalance']}"
    print(json.dumps(result) if args.json else text + (f"\nwrote {result['plot']}" if args.plot else ""))
    return 0


def _plot(fed: Any, args: argparse.Namespace) -> Path:
    """The split: each client's size, and the first input column (against the output, or the second input)
    coloured by client; written to ``args.plot`` (``.png`` appended when missing, folders created)."""
    import numpy as np

    from ..plotting import figure

    path = args.plot if args.plot.suffix == ".png" else args.plot.with_name(args.plot.name + ".png")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = figure(figsize=(9, 3.6))
    sizes_ax, data_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    sizes_ax.bar(np.arange(fed.num_clients), fed.client_sizes, color="C0")
    sizes_ax.set_xlabel("client")
    sizes_ax.set_ylabel("points")
    sizes_ax.set_title(f"{fed.num_clients} clients, {args.partition}")
    two_inputs = fed.clients[0][0].shape[1] >= 2
    for k, (X, Y) in enumerate(fed.clients):
        data_ax.plot(X[:, 0], X[:, 1] if two_inputs else Y[:, 0], ".", ms=3, label=f"client {k}" if k < 10 else None)
    data_ax.set_xlabel("input 1")
    data_ax.set_ylabel("input 2" if two_inputs else "output")
    data_ax.set_title(f"{args.name}: points by client" + (" (first two inputs)" if two_inputs else ""))
    if fed.num_clients <= 10:
        data_ax.legend(fontsize=7, markerscale=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def register(subparsers: Any) -> None:
    """Add the ``datasets`` subcommand."""
    parser = subparsers.add_parser("datasets", help="list offline datasets, or split one among clients")
    parser.add_argument("name", nargs="?", choices=[*REAL_DATASETS, *SYNTHETIC], help="dataset to split")
    parser.add_argument("--partition", default="iid", choices=PARTITION_NAMES)
    parser.add_argument("--clients", type=int, default=None, help="K (default for group: one per group)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="with NAME: write a PNG of the split (client sizes, points coloured by client)",
    )
    parser.set_defaults(func=_run)

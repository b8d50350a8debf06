"""The shape of the library: lines, the largest modules, import cycles, and the walk of one FSGP round.

Usage::

    python benchmarks/architecture.py lines            # library lines and the ten largest modules
    python benchmarks/architecture.py cycles           # import cycles between modules and between packages
    python benchmarks/architecture.py trace [--json]   # which modules one FSGP round enters, and from where

``cycles`` reads every ``import``/``from … import`` of ``gpflow_fed`` (module level and inside functions: a deferred
import is still a dependency) and reports the strongly connected components of the module graph, and of the graph of
top-level sub-packages (``gpflow_fed.federated``, ``gpflow_fed.models``, …). Package ``__init__`` re-exports are
left out of the module graph (a package importing its own sub-modules is not a cycle).

``trace`` runs one FSGP round (FedAvg, 4 clients, secure aggregation on) under ``sys.setprofile`` and records each
*transition*: a call from a function of one ``gpflow_fed`` module into a function of another. It prints, per stage of
the phase owner (``gpflow_fed.federated.engine.exchange``), the modules entered from it, and every module that is
entered from a module below the phase owner and then calls back up into it ("re-entered from below").

The layers themselves (which module may import which) are checked by ``tests/test_architecture.py``.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from collections import defaultdict
from typing import Dict, List, Set, Tuple

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
PACKAGE = os.path.join(ROOT, "gpflow_fed")


def modules() -> Dict[str, str]:
    """``{dotted module name: path}`` of every module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                rel = os.path.relpath(path, ROOT)[: -len(".py")].replace(os.sep, ".")
                found[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return found


def _resolve(module: str, is_package: bool, level: int, target: str) -> str:
    base = module.split(".") if is_package else module.split(".")[:-1]
    if level:
        base = base[: len(base) - (level - 1)]
        return ".".join(base + ([target] if target else []))
    return target


def imports(module: str, path: str, known: Set[str]) -> Set[str]:
    """The package modules ``module`` imports (``from x import y`` counts ``x.y`` when that is a module)."""
    with open(path) as f:
        tree = ast.parse(f.read())
    is_package = path.endswith("__init__.py")
    out: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve(module, is_package, node.level, node.module or "")
            names = [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                out.add(name)
    return out


def graph() -> Dict[str, Set[str]]:
    known = modules()
    edges = {m: imports(m, p, set(known)) for m, p in known.items()}
    packages = {m for m, p in known.items() if p.endswith("__init__.py")}
    # a package's __init__ re-exports its sub-modules; an edge into a package stands for its public face
    return {
        m: {t for t in targets if not (m in packages and t.startswith(m + "."))}
        for m, targets in edges.items()
        if m not in packages
    } | {m: {t for t in edges[m] if not t.startswith(m + ".")} for m in packages}


def strongly_connected(edges: Dict[str, Set[str]]) -> List[List[str]]:
    """Tarjan's algorithm: the components with more than one node."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(out)


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else module


def cycles() -> Tuple[List[List[str]], List[List[str]]]:
    """Module-level and package-level import cycles (the latter between ``gpflow_fed.<sub-package>``)."""
    edges = graph()
    packages: Dict[str, Set[str]] = defaultdict(set)
    for source, targets in edges.items():
        for target in targets:
            a, b = package_of(source), package_of(target)
            if a != b and a != "gpflow_fed" and b != "gpflow_fed":
                packages[a].add(b)
    return strongly_connected(edges), strongly_connected(dict(packages))


def lines() -> Tuple[int, List[Tuple[int, str]]]:
    """Total library lines and ``(lines, module)`` of the ten largest modules."""
    sizes = []
    for module, path in modules().items():
        with open(path) as f:
            sizes.append((sum(1 for _ in f), module))
    return sum(n for n, _ in sizes), sorted(sizes, reverse=True)[:10]


def trace() -> Dict[str, object]:
    """Transitions between package modules during one FSGP round (see the module docstring)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import gpflow
    import numpy as np

    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import Protection, run
    from gpflow_fed.federated.algorithms import FSGP

    rng = np.random.default_rng(0)
    clients = [(rng.normal(size=(n, 1)), rng.normal(size=(n, 1))) for n in (9, 10, 11, 12)]
    dataset = FederatedDataset(clients)
    Z = np.linspace(-2, 2, 3)[:, None]

    def make() -> FSGP:
        return FSGP(gpflow.kernels.SquaredExponential(), Z, rounds=1, local_steps=1)

    protection = Protection(secure_aggregation=True)  # the default, stated
    run(make(), dataset, protection=protection)  # warm up: tracing and imports happen outside the trace
    transitions: Dict[Tuple[str, str], int] = defaultdict(int)
    owner = "gpflow_fed.federated.engine.exchange"
    per_stage: Dict[str, Dict[str, int]] = defaultdict(lambda: defaultdict(int))
    reentered: Dict[str, int] = defaultdict(int)
    stack: List[Tuple[str, str]] = []  # (module, the phase owner's stage at the time)

    def profile(frame, event, arg):  # noqa: ANN001
        if event == "call":
            module = frame.f_globals.get("__name__", "")
            caller, stage = stack[-1] if stack else ("", "")
            if module == owner and frame.f_code.co_name in ("run", "_send"):
                stage = "update" if frame.f_code.co_name == "run" else str(frame.f_locals.get("stage"))
            stack.append((module, stage))
            if module.startswith("gpflow_fed") and caller.startswith("gpflow_fed") and module != caller:
                transitions[(caller, module)] += 1
                if caller == owner:
                    per_stage[stage][module] += 1
                elif module == owner and any(m == owner for m, _ in stack[:-1]):
                    reentered[caller] += 1
        elif event == "return" and stack:
            stack.pop()
        return None

    sys.setprofile(profile)
    try:
        run(make(), dataset, protection=protection)
    finally:
        sys.setprofile(None)
    return {
        "transitions": sum(transitions.values()),
        "module_pairs": len(transitions),
        "from_phase_owner": {s: dict(sorted(m.items())) for s, m in sorted(per_stage.items())},
        "reentered_from_below": dict(sorted(reentered.items())),
    }


def main(argv: List[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("lines", "cycles", "trace"))
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    if args.what == "lines":
        total, largest = lines()
        out: object = {"total": total, "largest": [{"lines": n, "module": m} for n, m in largest]}
    elif args.what == "cycles":
        module_cycles, package_cycles = cycles()
        out = {"module_cycles": module_cycles, "package_cycles": package_cycles}
    else:
        out = trace()
    if args.json:
        print(json.dumps(out, indent=1))
    else:
        print(json.dumps(out, indent=1, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Secure aggregation with drop-out recovery: the one-off setup and the per-exchange cost, against a plain sum and
today's masking without recovery.

For each cohort size K (all clients in this process, so a time is the work of all K clients plus the server;
``client s`` is the part spent inside the clients), with P ``uint64`` codes per client:

* ``setup``: :meth:`SecAggServer.setup` — keys, the roster relayed to every client, each client's Shamir shares
  of its self-mask seed encrypted to its 2⌈log₂K⌉ holders, relayed and stored. Once per run.
* ``plain``: the server adds the K code vectors.
* ``masking``: :func:`~gpflow_fed.federated.protection.masking.mask` per client over the sparse graph (key
  agreements cached, as after a run's first exchange) and :func:`sum_masked`; no recovery, so no drop-out.
* ``secagg 0%``: :meth:`SecAggServer.secure_sum` (masked input, unmask: self-mask seeds) with every client.
  ``plain``, ``masking`` and ``secagg 0%`` exchanges alternate, ``--repeats`` times each. Each masking and
  secure row first runs one exchange of its cohort without drop-outs (``1st exch s``): it makes the cohort's
  key agreements, which later exchanges of the same cohort reuse.
* ``secagg 10%``: the same with 10 % of the cohort gone after masking (their pads come from their surviving
  neighbours); ``secagg 10% + late``: another exchange with 10 % of the masked inputs lost (those clients are
  back for the unmask) and 1 % of the survivors failing the unmask (their seeds rebuilt from Shamir shares).

Dropped clients are excluded for the rest of the run, so each drop-out row uses the clients still eligible.
Times (wall and this process's CPU, which a loaded machine disturbs less) are medians over ``--repeats``
exchanges for the rows without drop-outs, single exchanges otherwise; bytes
are :func:`~gpflow_fed.federated.protection.secagg.payload_bytes` of every request and response (no framing).
Every secure total is checked to equal the plain sum of the survivors' codes.

Usage: ``python benchmarks/secure_recovery.py [--clients 100,1000] [--codes 1000] [--repeats 3]
[--json benchmarks/results/secure_recovery.json]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402


class Network:
    """In-process clients with chosen clients offline per stage; it times the clients' own work."""

    def __init__(self, clients: Dict[str, Any]) -> None:
        self.clients, self.codes, self.offline = clients, {}, {}
        self.client_seconds = 0.0

    def send(self, stage: str, requests: Dict[str, Dict[str, Any]]) -> Dict[str, Any]:
        from gpflow_fed.federated.protection.secagg import SecAggRefused

        answers: Dict[str, Any] = {}
        for c, request in requests.items():
            answers[c] = None
            if c in self.offline.get(stage, ()):
                continue
            begin = time.perf_counter()
            try:
                answers[c] = self.clients[c].respond(stage, request, self.codes.get(c))
            except SecAggRefused:
                pass
            self.client_seconds += time.perf_counter() - begin
        return answers


def _drive(stages: Any, send: Any) -> Any:
    """Run a secure-aggregation protocol generator with ``send`` answering each stage (as the phase owner does)."""
    try:
        stage, requests = next(stages)
        while True:
            stage, requests = stages.send(send(stage, requests))
    except StopIteration as done:
        return done.value


def main(argv: Any = None) -> Dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="100,1000", help="comma-separated cohort sizes K")
    parser.add_argument("--codes", type=int, default=1000, help="P, uint64 codes per client")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default="benchmarks/results/secure_recovery.json", help="'' to skip")
    args = parser.parse_args(argv)
    sizes = [int(k) for k in args.clients.split(",")]
    if min(sizes) < 20 or args.codes < 1 or args.repeats < 1:
        raise SystemExit("--clients must be ≥ 20 (10 % drop-outs), --codes and --repeats ≥ 1")

    from gpflow_fed.federated.protection.masking import Exchange, MaskingKeys, mask, masking_graph, sum_masked
    from gpflow_fed.federated.protection.secagg import SecAggClient, SecAggServer, default_degree, payload_bytes
    from gpflow_fed.randomness import new_run_id

    rng = np.random.default_rng(0)
    P = args.codes
    rows: List[Dict[str, Any]] = []

    def draw(cohort) -> Dict[str, np.ndarray]:
        return {c: rng.integers(0, np.iinfo(np.uint64).max, P, dtype=np.uint64, endpoint=True) for c in cohort}

    def plain(codes, members) -> np.ndarray:
        total = np.zeros(P, dtype=np.uint64)
        for c in members:
            total += codes[c]
        return total

    for K in sizes:
        ids = [f"client_{k:04d}" for k in range(K)]
        run_id = new_run_id()
        net = Network({c: SecAggClient(c) for c in ids})
        server = SecAggServer(run_id)
        begin, cpu = time.perf_counter(), time.process_time()
        report = _drive(server.setup_stages(ids), net.send)
        setup_seconds, setup_cpu = time.perf_counter() - begin, time.process_time() - cpu
        rows.append(
            {
                "clients": K,
                "config": "setup",
                "seconds": setup_seconds,
                "cpu_seconds": setup_cpu,
                "client_seconds": net.client_seconds,
                "degree": report.degree,
                "threshold": report.threshold,
                "bytes_to_clients": report.bytes_to_clients,
                "bytes_from_clients": report.bytes_from_clients,
                "excluded": len(report.excluded),
            }
        )
        print(f"K={K:5d} setup {setup_seconds:8.2f} s, d = {report.degree}, t = {report.threshold}", flush=True)
        round_ = 0

        def exchange_row(config: str, times: List[float], cpus: List[float], **extra: Any) -> None:
            rows.append(
                {
                    "clients": K,
                    "config": config,
                    "seconds": statistics.median(times),
                    "all_seconds": times,
                    "cpu_seconds": statistics.median(cpus),
                    "all_cpu_seconds": cpus,
                    **extra,
                }
            )
            print(f"K={K:5d} {config:18s} {statistics.median(times):9.4f} s", flush=True)

        def timed(step: Callable[[], Any]) -> Tuple[float, float, Any]:
            begin, cpu = time.perf_counter(), time.process_time()
            value = step()
            return time.perf_counter() - begin, time.process_time() - cpu, value

        codes = draw(ids)
        keys = {c: MaskingKeys() for c in ids}
        public = {c: k.public_bytes for c, k in keys.items()}

        def masking(r: int) -> None:
            exchange = Exchange(run_id, "masking", r, "stats", tuple(ids))
            graph = masking_graph(exchange, default_degree(K))
            total = sum_masked([mask(keys[c], c, {"q": codes[c]}, exchange, public, graph[c]) for c in ids])["q"]
            assert np.array_equal(total, plain(codes, ids))

        def secure(cohort: Sequence[str], lost: Sequence[str] = (), late_fraction: float = 0.0) -> Any:
            nonlocal round_
            exchange = Exchange(run_id, "train", round_, "stats", tuple(cohort))
            round_ += 1
            net.codes = draw(cohort)
            late = set()
            if late_fraction:
                others = [c for c in cohort if c not in lost]
                late = set(rng.choice(others, max(1, int(late_fraction * len(others))), replace=False))
            net.offline = {"masked_input": set(lost), "unmask": late | (set() if late_fraction else set(lost))}
            net.client_seconds = 0.0
            result = _drive(server.secure_sum_stages(exchange, P), net.send)
            assert np.array_equal(result.total, plain(net.codes, result.survivors))
            return result, net.client_seconds

        def secure_row(config: str, samples: List[Tuple[float, float, Any]], first: float, cohort: int) -> None:
            result = samples[-1][2][0]
            exchange_row(
                config,
                [w for w, _, _ in samples],
                [c for _, c, _ in samples],
                first_exchange_seconds=first,
                client_seconds=statistics.median(value[1] for _, _, value in samples),
                cohort=cohort,
                survivors=len(result.survivors),
                dropped=len(result.dropped),
                recovered=len(result.recovered),
                bytes_to_clients=result.bytes_to_clients,
                bytes_from_clients=result.bytes_from_clients,
            )

        # the first exchange of a cohort makes its key agreements (cached for the run): timed apart; then plain,
        # masking and secure exchanges interleaved, so that the machine's load drifts alike for all three
        masking_first = timed(lambda: masking(0))[0]
        cohort = server.eligible
        secure_first = timed(lambda: secure(cohort))[0]
        plains, maskings, secures = [], [], []
        for r in range(1, args.repeats + 1):
            plains.append(timed(lambda: plain(codes, ids)))
            maskings.append(timed(lambda: masking(r)))
            secures.append(timed(lambda: secure(cohort)))
        payload = K * payload_bytes(codes[ids[0]])
        exchange_row("plain", [w for w, _, _ in plains], [c for _, c, _ in plains], bytes_from_clients=payload)
        exchange_row(
            "masking",
            [w for w, _, _ in maskings],
            [c for _, c, _ in maskings],
            first_exchange_seconds=masking_first,
            bytes_from_clients=payload,
        )
        secure_row("secagg 0%", secures, secure_first, len(cohort))
        # drop-outs: the dropped are excluded from then on, so the next row's cohort is new (first exchange apart)
        for config, late_fraction in (("secagg 10%", 0.0), ("secagg 10% + late", 0.01)):
            cohort = server.eligible
            first = timed(lambda: secure(cohort))[0]
            lost = list(rng.choice(cohort, len(cohort) // 10, replace=False))
            secure_row(config, [timed(lambda: secure(cohort, lost, late_fraction))], first, len(cohort))

    print(
        f"\nP = {P} codes; times are all K clients plus the server in one process\n"
        f"{'K':>5} {'configuration':18} {'1st exch s':>10} {'seconds':>9} {'cpu s':>9} {'client s':>9} {'× plain':>9} "
        f"{'× masking':>9} {'cpu × mask':>10} {'MB to':>8} {'MB from':>8} {'dropped':>7} {'rebuilt b':>9}"
    )
    for r in rows:
        same = {x["config"]: x for x in rows if x["clients"] == r["clients"]}
        ratios = ("", "", "")
        if r["config"] != "setup":
            plain_s, mask_s, mask_cpu = (
                same[k][f] for k, f in (("plain", "seconds"), ("masking", "seconds"), ("masking", "cpu_seconds"))
            )
            ratios = (
                f"{r['seconds'] / plain_s:9.0f}",
                f"{r['seconds'] / mask_s:9.2f}",
                f"{r['cpu_seconds'] / mask_cpu:10.2f}",
            )
        mb_to = f"{r['bytes_to_clients'] / 1e6:8.2f}" if "bytes_to_clients" in r else f"{'':8}"
        first = f"{r['first_exchange_seconds']:10.3f}" if "first_exchange_seconds" in r else ""
        print(
            f"{r['clients']:5d} {r['config']:18} {first:>10} {r['seconds']:9.4f} {r['cpu_seconds']:9.4f} "
            f"{r.get('client_seconds', 0.0):9.3f} {ratios[0]:>9} {ratios[1]:>9} {ratios[2]:>10} {mb_to} "
            f"{r['bytes_from_clients'] / 1e6:8.2f} {r.get('dropped', r.get('excluded', 0)):7d} "
            f"{r.get('recovered', 0):9d}"
        )
    result = {"benchmark": "secure_recovery", "codes": P, "repeats": args.repeats, "rows": rows}
    if args.json:
        save(args.json, result, __file__, argv)
        print(f"\nwritten to {args.json}")
    return result


if __name__ == "__main__":
    main()

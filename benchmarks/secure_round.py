"""Cost of secure aggregation in a whole FSGP round: plain vs secure (drop-out recovery), with drop-outs, all pairs.

FSGP (FedAvg, M = 50 inducing points, N_k = 15 points per client, 3 local Adam steps) on FSGP synthetic
dataset 1, every client every round, ``LocalRuntime``. For each K the configurations run side by side in one
process, and each round's wall time comes from ``history[r]["seconds"]``; round 0 (client set-up, tracing)
is reported apart from the steady rounds 1…R−1 (round 0 also holds the protocol's once-per-run setup: keys and
Shamir shares of every client's self-mask seed). ``sparse`` is ``SecureAggregation()`` (degree 2⌈log₂ K⌉, as
SecAgg+; the default protection); ``dropouts`` is the same with 10 % of each round's cohort lost after it answered
its update (their masked inputs never arrive: the survivors' sum is recovered, and the lost clients take no further
part); ``all-pairs`` is ``SecureAggregation(degree=K-1)``, the cost of classic pairwise masking. Secure rounds
include each client's fixed-point encoding, its self-mask and pads (X25519, HKDF, AES-CTR), the unmasking stage,
and the server's decoding.

Usage: ``python benchmarks/secure_round.py [--clients 100 300 1000] [--all-pairs-up-to 300] [--rounds 3]
[--out benchmarks/results/secure_round.json]``; prints a Markdown table and saves the JSON (with the git commit
and the command).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import FaultPolicy, LocalRuntime, Protection, RunOptions, SecureAggregation, run  # noqa: E402
from gpflow_fed.federated.protocol.transport import Response  # noqa: E402

#: the share of each secure exchange's cohort that drops out after answering its update (``dropouts``)
DROPOUT = 0.1


class DroppingRuntime(LocalRuntime):
    """``LocalRuntime`` whose network loses the masked inputs of ``DROPOUT`` of each exchange's cohort."""

    def send(self, requests):  # type: ignore[no-untyped-def]
        responses = super().send(requests)
        first = next(iter(requests.values()), None)
        if first is None or first.stage != "masked_input":
            return responses
        lost = sorted(requests)[:: int(round(1 / DROPOUT))]
        return {cid: Response(fault="lost on the network") if cid in lost else r for cid, r in responses.items()}


from gpflow_fed.federated.algorithms import FSGP, initial_inducing_inputs  # noqa: E402


def _dataset(K: int, points: int, seed: int) -> FederatedDataset:
    data = fsgp_synthetic_1(seed=seed, num_train=K * points)
    parts = iid_partition(len(data.X_train), K, seed=seed)
    return FederatedDataset(clients=[(data.X_train[p], data.Y_train[p]) for p in parts], name="fsgp-1")


def _algorithm(dataset: FederatedDataset, M: int, rounds: int, seed: int) -> FSGP:
    Z = initial_inducing_inputs(np.concatenate([X for X, _ in dataset.clients]), M, seed=seed)
    return FSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=rounds, local_steps=3, learning_rate=0.1)


def measure(K: int, config: str, *, points: int, M: int, rounds: int, seed: int) -> Dict[str, Any]:
    dataset = _dataset(K, points, seed)
    secure = {
        "plain": False,
        "sparse": SecureAggregation(),
        "dropouts": SecureAggregation(),
        "all-pairs": SecureAggregation(degree=K - 1),
    }[config]
    runtime_class = DroppingRuntime if config == "dropouts" else LocalRuntime
    runtime = runtime_class(protection=Protection(secure_aggregation=secure))
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    start = time.perf_counter()
    result = run(_algorithm(dataset, M, rounds, seed), dataset, runtime=runtime, options=options, seed=seed)
    seconds = [h["seconds"] for h in result.history]
    degree = 0 if secure is False else secure.masking_degree(K)
    return {
        "K": K,
        "config": config,
        "degree": degree,
        "round0_s": seconds[0],
        "steady_s": float(np.mean(seconds[1:])),
        "total_s": time.perf_counter() - start,
        "bytes_up_per_round": result.history[-1]["bytes_up"],
        "clients_last_round": result.history[-1]["clients"],
        "params": {k: np.asarray(v).tolist() for k, v in result.state.params.items()},
    }


def main(argv: List[str] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 300, 1000])
    parser.add_argument("--all-pairs-up-to", type=int, default=300, help="largest K for the all-pairs configuration")
    parser.add_argument("--points", type=int, default=15)
    parser.add_argument("--inducing", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="save the rows as JSON here")
    args = parser.parse_args(argv)
    rows = []
    for K in args.clients:
        configs = ["plain", "sparse", "dropouts"] + (["all-pairs"] if K <= args.all_pairs_up_to else [])
        for config in configs:
            rows.append(measure(K, config, points=args.points, M=args.inducing, rounds=args.rounds, seed=args.seed))
            print(f"K={K} {config}: steady round {rows[-1]['steady_s']:.2f} s", file=sys.stderr, flush=True)
    print("| K | masking | degree | round 0 (s) | steady round (s) | steady ÷ plain | max |Δθ| vs plain |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        plain = next(r for r in rows if r["K"] == row["K"] and r["config"] == "plain")
        diff = max(float(np.max(np.abs(np.subtract(row["params"][k], plain["params"][k])))) for k in row["params"])
        row["ratio"] = row["steady_s"] / plain["steady_s"]
        row["max_param_diff"] = diff
        print(
            f"| {row['K']} | {row['config']} | {row['degree']} | {row['round0_s']:.2f} | {row['steady_s']:.2f} | "
            f"{row['ratio']:.2f} | {diff:.1e} |"
        )
    if args.out:
        save(args.out, {"rows": rows}, __file__, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``gpflow-fed pvi``: federated sparse GP by PVI (DPO, CPO, fixed-Z, FedAvg-Z or global VI) on a dataset."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pvi", help="PVI for sparse GPs with q(Z) and DPO factors")
    parser.add_argument("--dataset", default="toy", help="'toy' (five-partition task) or a name from `gpflow-fed datasets`")
    parser.add_argument("--method", default="dpo", choices=["dpo", "cpo", "fixed", "fedavg", "global"])
    parser.add_argument("--clients", type=int, default=10, help="K for real datasets (iid clients; regional for ozone)")
    parser.add_argument("--max-points", type=int, default=0, help="random subset of at most this many rows (0: all)")
    parser.add_argument("--rounds", type=int, default=20, help="communications (one client update each)")
    parser.add_argument("--inducing", type=int, default=20, help="M")
    parser.add_argument("--local-steps", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from ..data import pvi_five_partition_toy
    from ..federated.algorithms.pvi_experiment import real_split, run_method, standardise

    if args.rounds < 1 or args.inducing < 1 or args.clients < 1 or args.max_points < 0:
        raise ValueError("--rounds, --inducing and --clients must be ≥ 1 and --max-points ≥ 0")
    if args.dataset == "toy":
        dataset = standardise(pvi_five_partition_toy(seed=args.seed))
    else:
        dataset = real_split(args.dataset, args.seed, args.clients, args.max_points)
    out = run_method(args.method, dataset, args.rounds, args.inducing, args.seed, local_steps=args.local_steps)
    print(f"{dataset.name} {args.method}: test log-lik/point {out['ll']:.4f}  RMSE {out['rmse']:.4f}  ({out['seconds']:.1f} s)")
    return 0

"""One malicious client of four under FSGP's default masking (issue 44, finding 7): the damage it does unseen.

Secure aggregation hides each client's statistics and update from the server, so the server checks only the masked
sum (``Algorithm.check_sum``): per-client validity checks (``Algorithm.check_reply``, which the plain mode applies to
every reply) are given up. This script measures what one bad client then does, on FSGP synthetic-style data
(``y = sin 2x + 0.1 ε``, x uniform on [−3, 3]; 4 clients × 30 points, 200 test points), FSGP FedAvg with 6 inducing
inputs, 3 rounds × 20 local Adam steps, learning rate 0.05:

* ``statistics``: in the final (prediction) phase ``client_0`` sends ``C y`` times −4, ``‖y‖²`` times 16 and
  ``tr K_ff`` times −0.5. Its own check rejects it (negative trace, non-PSD block); the masked sum passes;
* ``box``: in every training round ``client_0`` sends the broadcast plus 98 % of the server's FedAvg box in every
  coordinate (a consistent lie: always the same direction), with the old box ``8 · lr · P`` (``--old-box``, what
  the server accepted before issue 44) or the current Adam bound (``checks.adam_displacement_bound``).

Each attack runs masked (the default ``Protection()``) and plain (``secure_aggregation=False``, where the server
excludes what its per-client checks reject, and ``RobustAggregation("median")`` can be used).

Usage: ``python benchmarks/malicious_masking.py [--seeds 0 1 2]``; prints a Markdown table of test RMSEs.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Dict, List, Optional

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset  # noqa: E402
from gpflow_fed.federated import FaultPolicy, Protection, RobustAggregation, RunOptions, run  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP  # noqa: E402
from gpflow_fed.federated.protocol.faults import RoundFailedError  # noqa: E402
from gpflow_fed.federated.algorithms.fsgp.checks import (  # noqa: E402
    adam_displacement_bound,
    statistics_fault,
)

LEARNING_RATE, LOCAL_STEPS, ROUNDS = 0.05, 20, 3
MASKED = Protection()
PLAIN = Protection(secure_aggregation=False)
ROBUST = Protection(secure_aggregation=False, robust=RobustAggregation("median"))


def dataset(seed: int = 0, num_clients: int = 4) -> FederatedDataset:
    """4 clients × 30 points of ``sin 2x + 0.1 ε`` on [−3, 3], 200 test points."""
    rng = np.random.default_rng(seed)

    def draw(n: int) -> Any:
        X = rng.uniform(-3, 3, size=(n, 1))
        return X, np.sin(2 * X) + 0.1 * rng.normal(size=(n, 1))

    return FederatedDataset([draw(30) for _ in range(num_clients)], test=draw(200))


class BadStatistics(FSGP):
    """``client_0`` sends final statistics its own check rejects (``faults`` records what the check said)."""

    #: what the per-client check said of each bad reply (a class list: the runtime may run a copy of the algorithm)
    faults: List[Optional[str]] = []

    def payload_bound(self, broadcast: Any, domain: Any) -> None:
        return None  # a malicious client encodes what it likes: its own code states no bound

    def client_update(self, client: Any, broadcast: Any) -> Any:
        reply = super().client_update(client, broadcast)
        if client.id != "client_0" or broadcast.phase != "predict":
            return reply
        arrays = dict(reply.arrays)
        arrays["kuf_y"] = -4.0 * arrays["kuf_y"]
        arrays["y_squared_sum"] = 16.0 * arrays["y_squared_sum"]
        arrays["trace_kff"] = -0.5 * arrays["trace_kff"]
        BadStatistics.faults.append(
            statistics_fault(arrays, client.num_data, kernel_variance=None, whitened=self.whiten)
        )
        return self.reply(client, broadcast, arrays, reply.weight, reply.metrics)


class BoxLiar(FSGP):
    """``client_0`` sends the broadcast plus ``fraction`` of the FedAvg box in every coordinate, every round."""

    def __init__(self, *args: Any, fraction: float = 0.98, old_box: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fraction, self.old_box = fraction, old_box

    def payload_bound(self, broadcast: Any, domain: Any) -> None:
        return None  # a malicious client encodes what it likes: its own code states no bound

    def client_update(self, client: Any, broadcast: Any) -> Any:
        reply = super().client_update(client, broadcast)
        if client.id != "client_0" or broadcast.phase != "train":
            return reply
        if self.old_box:
            box = 8.0 * self.learning_rate * self.local_steps
        else:
            box = adam_displacement_bound(self.learning_rate, self.local_steps, broadcast.round)
        arrays = {k: np.asarray(broadcast.arrays[k]) + self.fraction * box for k in reply.arrays}
        return self.reply(client, broadcast, arrays, reply.weight, reply.metrics)


def fsgp(cls: type = FSGP, **kwargs: Any) -> FSGP:
    """The FSGP of the module docstring."""
    return cls(
        gpflow.kernels.SquaredExponential(),
        gpflow.inducing_variables.InducingPoints(np.linspace(-3, 3, 6)[:, None]),
        noise_variance=0.1,
        rounds=ROUNDS,
        local_steps=LOCAL_STEPS,
        learning_rate=LEARNING_RATE,
        **kwargs,
    )


def rmse(algorithm: FSGP, seed: int, protection: Protection) -> Dict[str, Any]:
    """Test RMSE of one run, and every exclusion its history records."""
    options = RunOptions(faults=FaultPolicy(on_error="exclude"))
    try:
        result = run(algorithm, dataset(seed), seed=seed, protection=protection, options=options)
    except RoundFailedError as exc:  # the masked sum fails the server's check: detected, not attributed
        return {"rmse": float("nan"), "excluded": {}, "failed": str(exc).split(":")[0]}
    excluded = {k: v for entry in result.history for k, v in entry.items() if k.endswith("excluded")}
    return {"rmse": float(result.metrics["test_rmse"]), "excluded": excluded}


def measure(seed: int = 0) -> Dict[str, Dict[str, Any]]:
    """Every configuration of the module docstring for one seed."""
    out: Dict[str, Dict[str, Any]] = {
        "clean, masked": rmse(fsgp(), seed, MASKED),
        "bad statistics, masked": rmse(fsgp(BadStatistics), seed, MASKED),
        "bad statistics, plain": rmse(fsgp(BadStatistics), seed, PLAIN),
        "box lie (old 8·lr·P box), masked": rmse(fsgp(BoxLiar, old_box=True), seed, MASKED),
        "box lie (Adam bound), masked": rmse(fsgp(BoxLiar), seed, MASKED),
        "box lie (Adam bound), plain median": rmse(fsgp(BoxLiar), seed, ROBUST),
    }
    return out


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args(argv)
    runs = [measure(seed) for seed in args.seeds]
    print("| configuration | test RMSE (mean over seeds) | excluded |")
    print("|---|---|---|")
    for name in runs[0]:
        values = [r[name]["rmse"] for r in runs]
        excluded = sorted({c for r in runs for e in r[name]["excluded"].values() for c in e})
        failed = [r[name]["failed"] for r in runs if "failed" in r[name]]
        shown = f"{np.mean(values):.3f}" if not failed else f"run fails ({failed[0]}: the masked mean fails the box)"
        print(f"| {name} | {shown} | {', '.join(excluded) or '—'} |")


if __name__ == "__main__":
    main()

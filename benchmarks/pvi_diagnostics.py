"""Why DPO stays short of global VI on regional clients (BENCHMARKS.md § PVI, docs "Regional clients").

Three measurements on one split of ``benchmarks/pvi.py``'s data (same subsample, standardisation and partition):

``trace``: a DPO (CPO, global-VI) run that prints, after every communication, one JSON line with the spread of
q(Z) (the mean standard deviation of its coordinates), how many inducing means lie nearest to each client's
training inputs (first two coordinates, i.e. latitude/longitude for ozone), the mean of q(β) (lengthscales,
σ_f², σ_n²) and, every K communications, the test log-likelihood per point::

    python benchmarks/pvi_diagnostics.py trace --dataset ozone --method dpo --rounds 100
    python benchmarks/pvi_diagnostics.py trace --dataset ozone --method global --rounds 20
    python benchmarks/pvi_diagnostics.py trace --dataset ozone --method dpo --partition iid   # iid clients
    python benchmarks/pvi_diagnostics.py trace --dataset ozone --method dpo --alpha 0.01      # (and global)
    python benchmarks/pvi_diagnostics.py trace --dataset ozone --method dpo --rounds 20 --initial-factors split
    python benchmarks/pvi_diagnostics.py trace --dataset ozone --clients 32 --max-pseudo 100 --rounds 64  # 32 regions
    python benchmarks/pvi_diagnostics.py trace --dataset boston --method global --rounds 20   # concrete, diabetes
    python benchmarks/pvi_diagnostics.py trace --dataset boston --method cpo

``--out FILE`` also saves a trace (its arguments and every line) as JSON through ``benchmarks/provenance.py``.

``first-client``: the first client's update alone (cavity = prior), then its local free energy (400 Monte-Carlo
samples) at the q(Z) it found and after re-fitting everything else with q(Z)'s variance held at 0.01::

    python benchmarks/pvi_diagnostics.py first-client --dataset ozone

``cpo-factors``: a CPO run that prints, after every communication, the largest precision (eigenvalue of S_k⁻¹)
of any client's u-factor, the smallest eigenvalue of any factor, and how far the server's running sum of
natural parameters is from the sum of the clients' factors (the CPO floor, docs "Why CPO's S_k has a floor")::

    python benchmarks/pvi_diagnostics.py cpo-factors --dataset ozone --rounds 12
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from provenance import save  # noqa: E402


def load_split(a: argparse.Namespace) -> Any:
    """The split of ``benchmarks/pvi.py`` (``--partition`` may force iid or regional clients)."""
    from gpflow_fed.data import real_split

    regional = {"auto": None, "iid": False, "regional": True}[a.partition]
    return real_split(a.dataset, a.split, a.clients, a.max_points, regional=regional)


def trace(a: argparse.Namespace) -> None:
    from gpflow_fed.data import FederatedDataset
    from gpflow_fed.federated import LocalRuntime, Protection, run
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    fed = load_split(a)
    train = np.concatenate([X for X, _ in fed.clients])
    owner = np.concatenate([np.full(len(X), k) for k, (X, _) in enumerate(fed.clients)])
    Xt, Yt = fed.test
    every = a.clients
    if a.method == "global":
        fed, every = FederatedDataset([fed.pooled()], test=fed.test, name=fed.name), 1
    algorithm = make_pvi(
        a.method,
        fed.input_dim,
        a.rounds,
        a.inducing,
        a.split,
        alpha=a.alpha,
        local_steps=a.local_steps,
        patience=a.patience,
        num_predict_samples=a.predict_samples,
        initial_factors=a.initial_factors,
        max_pseudo=a.max_pseudo,
    )

    def monitor(r: int, *, state: Any, algorithm: Any, **_: Any) -> None:
        mean, var = state.qZ.moments()
        nearest = ((mean[:, None, :2] - train[None, :, :2]) ** 2).sum(-1).argmin(1)
        entry = {
            "round": r,
            "qZ_std": float(np.sqrt(var).mean()),
            "inducing_per_client": np.bincount(owner[nearest], minlength=a.clients).tolist(),
            "beta": np.exp(state.qrho.moments()[0]).round(4).tolist(),
        }
        if (r + 1) % every == 0:
            entry["test_ll"] = float(np.mean(algorithm.result(state).predict_log_density((Xt, Yt)).numpy()))
        print(json.dumps(entry), flush=True)
        entries.append(entry)

    entries: list = []
    run(
        algorithm,
        fed,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=False)),
        monitor=monitor,
        seed=a.split,
    )
    if a.out:
        arguments = {k: v for k, v in vars(a).items() if k not in ("what", "out", "argv")}
        save(a.out, {"arguments": arguments, "trace": entries}, __file__, a.argv)


def first_client(a: argparse.Namespace) -> None:
    import tensorflow as tf
    from gpflow.keras import tf_keras

    from gpflow_fed.federated import LocalRuntime, Protection, run
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    fed = load_split(a)

    def first_update(local_steps: int) -> Any:
        updates: list = []
        algorithm = make_pvi(
            "dpo",
            fed.input_dim,
            1,
            a.inducing,
            a.split,
            alpha=a.alpha,
            local_steps=local_steps,
            patience=a.patience,
            num_predict_samples=2,
            on_client_update=updates.append,
        )
        run(algorithm, fed, runtime=LocalRuntime(protection=Protection(secure_aggregation=False)), seed=a.split)
        (update,) = updates
        return update.worker, update.metrics["local_steps"]

    def free_energy(problem: Any, samples: int = 400) -> str:
        values = []
        for i in range(samples):  # fresh random-stream positions, away from the ones used in training
            problem.counter.assign(10**6 + i)
            values.append(float(problem.free_energy(False).numpy()))
        return f"{np.mean(values):.1f} ± {np.std(values) / np.sqrt(samples):.1f}"

    problem, steps = first_update(a.local_steps)
    std = float(np.sqrt(problem.q_Z_moments()[1]).mean())
    print(f"first client, its own fit ({steps:.0f} Adam steps): q(Z) std {std:.3f}, free energy {free_energy(problem)}")
    problem, _ = first_update(1)  # the same client from its initial state, with q(Z)'s variance held at 0.01
    problem.set_q((problem.q_Z_moments()[0], np.full(problem.q_Z_moments()[1].shape, 0.01)), None)
    variables = problem.trainables("joint")  # own factor, q(log β) and the mean of q(Z)
    optimizer = tf_keras.optimizers.Adam(problem.learning_rate)

    @tf.function
    def step() -> None:
        with tf.GradientTape() as tape:
            loss = -problem.free_energy(False)
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        problem.counter.assign_add(1)

    for _ in range(a.refit_steps):
        step()
    print(f"same client, q(Z) std held at 0.1, {a.refit_steps} Adam steps: free energy {free_energy(problem)}")


def cpo_factors(a: argparse.Namespace) -> None:
    from gpflow_fed.federated import LocalRuntime, Protection, run
    from gpflow_fed.federated.algorithms.pvi.methods import make_pvi

    fed = load_split(a)
    factors = {}

    def recorded(update: Any) -> None:  # the factor precision each client will hold if accepted
        factors[update.client_id] = update.factors["t_Lam"]

    algorithm = make_pvi(
        "cpo",
        fed.input_dim,
        a.rounds,
        a.inducing,
        a.split,
        local_steps=a.local_steps,
        patience=a.patience,
        num_predict_samples=2,
        on_client_update=recorded,
    )

    def monitor(r: int, *, state: Any, **_: Any) -> None:
        total = sum(factors.values())
        eig = [np.linalg.eigvalsh(0.5 * (t + t.T)) for t in factors.values()]
        print(
            json.dumps(
                {
                    "round": r,
                    "largest_factor_precision": float(max(e.max() for e in eig)),
                    "smallest_factor_eigenvalue": float(min(e.min() for e in eig)),
                    "server_sum_error": float(np.abs(state.Lam - 0.5 * (total + total.T)).max()),
                }
            ),
            flush=True,
        )

    run(
        algorithm,
        fed,
        runtime=LocalRuntime(protection=Protection(secure_aggregation=False)),
        monitor=monitor,
        seed=a.split,
    )


def main(argv: Any = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="?", choices=("trace", "first-client", "cpo-factors"), default="first-client")
    p.add_argument("--dataset", default="ozone")
    p.add_argument(
        "--partition",
        choices=("auto", "iid", "regional"),
        default="auto",
        help="auto: regional clients for ozone, iid otherwise (as benchmarks/pvi.py)",
    )
    p.add_argument("--method", choices=("dpo", "cpo", "global"), default="dpo")
    p.add_argument("--split", type=int, default=0)
    p.add_argument("--clients", type=int, default=10)
    p.add_argument("--max-points", type=int, default=4000)
    p.add_argument("--inducing", type=int, default=100)
    p.add_argument("--rounds", type=int, default=100)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--local-steps", type=int, default=5000)
    p.add_argument("--patience", type=int, default=50)
    p.add_argument("--predict-samples", type=int, default=100)
    p.add_argument("--refit-steps", type=int, default=3000)
    p.add_argument("--max-pseudo", type=int, default=500, help="trace: cap on M_k = min(0.8 N_k, cap)")
    p.add_argument(
        "--initial-factors",
        choices=("prior", "split"),
        default="prior",
        help="trace: PVI's initial Z/β factors (split: the paper's q⁰ = prior·Π t_k⁰, Alg. 2 line 2)",
    )
    p.add_argument("--out", help="trace: also save the trace as JSON here")
    a = p.parse_args(argv)
    a.argv = argv
    {"trace": trace, "first-client": first_client, "cpo-factors": cpo_factors}[a.what](a)
    return 0


if __name__ == "__main__":
    sys.exit(main())

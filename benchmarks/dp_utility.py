"""Utility vs ε of differentially private sums: FSGP's prediction statistics and FedBNR's phase 2.

Both parts release one summed exchange with client-level DP (``DifferentialPrivacy(phases=(...),
accountant="pld")``: every client's whole payload clipped to L2 norm C, Gaussian noise ``N(0, (zC)²)`` on
every entry of the sum, replace-one-client adjacency, δ = 1e-5, one release, so ε depends on z only). Each
setting is repeated over ``--draws`` noise draws (run seeds 0, 1, ...); the tables give the mean test RMSE and
NLPD over the draws and how many draws failed. The no-DP row is the same pipeline without noise.

**FSGP** (FedAvg, the paper's settings: P = 3 local Adam steps, λ = 0.1, R rounds, M inducing points) on FSGP
synthetic dataset 1 (eq. 18) with ``K × N_k`` points split iid, outputs clipped to ±``--fsgp-y-bound``.
Training is not noised; only the final ``"predict"`` sums are. Training does not depend on the noise, so it
runs once (a pilot with ``keep_payloads=True``) and each DP row reruns only the final phase at the trained w
(``FSGP(rounds=0)`` from the pilot's kernel, Z and σ²; its no-DP result equals the pilot's, checked). Three
releases of the same statistics are compared:

* ``C Cᵀ``: the default sums ``(C_k C_kᵀ, C_k y_k, ‖y_k‖², tr K_ff,k, N_k)``; C is the largest client payload
  norm of the pilot, rounded up to two significant digits (data dependent, as in a first version of this
  benchmark; a real deployment must fix C in advance);
* ``whitened`` (``FSGP(whiten=True)``): ``A_k = L⁻¹C_k`` instead of ``C_k``, with the public bound
  ``C = N_k (2σ_f⁴ + σ_f² y_max² + y_max⁴ + 1)^{1/2}`` (``tr A_kA_kᵀ ≤ N_k σ_f²``), which never clips;
* ``whitened + τI``: the same release, post-processed by the server as ``PSD(Σ A_k A_kᵀ) + τ I`` with
  ``τ = z C √(2M)`` (≈ the spectral norm of the symmetrized noise; public) — the subclass below, not FSGP.

FSGP's server always projects the noised ``Σ C Cᵀ`` onto the PSD cone (post-processing).

**FedBNR phase 2** (the exact global last layer, eqs. 3.5–3.6): a URK with m random Fourier features
(``L = 2m``), fixed public hyperparameters (no phase 1), on FSGP synthetic dataset 1 scaled by public
constants (x/10, y/3, then y clipped to ±``--y-bound``). Clients send ``(Φ_kᵀΦ_k, Φ_kᵀy_k, y_kᵀy_k, N_k)``
(phase ``"scatter"``). C is a *public* bound, not a pilot: Fourier features have ``‖φ(x)‖² = σ_f² m/(m−1)``
exactly, so one point adds at most ``b = (B² + B y_max² + y_max⁴ + 1)^{1/2}`` (B = ‖φ‖²) to the payload norm
and a client at most ``N_k b``; C = ``max_k N_k · b`` never clips. Columns RMSE/NLPD: a subclass that uses the
noised ``Σ ΦᵀΦ`` as it is; "PSD": a subclass that projects it onto the PSD cone; "PSD + τI": FedBNR itself, whose
server adds ``τ = z C √(2L)`` after the projection (``denoised_gram``; post-processing, no privacy cost).

Usage: ``python benchmarks/dp_utility.py [--part fsgp|fedbnr|all] [--draws 3] [--quick]``; prints Markdown
tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import time
from typing import Any, List, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import gpflow  # noqa: E402
import numpy as np  # noqa: E402

from gpflow_fed.data import FederatedDataset, fsgp_synthetic_1  # noqa: E402
from gpflow_fed.data.partition import iid_partition  # noqa: E402
from gpflow_fed.federated import LocalRuntime, Protection, RunOptions, run  # noqa: E402
from gpflow_fed.federated.protocol.algorithm import Aggregate  # noqa: E402
from gpflow_fed.federated.algorithms import FSGP, FedBNR, initial_inducing_inputs  # noqa: E402
from gpflow_fed.kernels import URK  # noqa: E402
from gpflow_fed.federated.algorithms.postprocess import project_to_psd  # noqa: E402
from gpflow_fed.federated.protection.dp import DifferentialPrivacy, PrivacyAccountant  # noqa: E402

NOISE_MULTIPLIERS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # K and 10K at z and 10z: the noise/signal ratio is z/K


def repaired(matrix: np.ndarray, ridge: float) -> np.ndarray:
    """Post-processing of a noised Gram-type sum: the nearest PSD matrix, plus ``ridge · I``."""
    return project_to_psd(matrix) + ridge * np.eye(matrix.shape[0])


def noise_ridge(dp: DifferentialPrivacy, size: int) -> float:
    """τ = z C √(2L): about the spectral norm of the symmetrized noise ``(E + Eᵀ)/2`` on an L × L sum (public)."""
    return dp.noise_multiplier * dp.clip_norm * math.sqrt(2.0 * size)


class RidgeFSGP(FSGP):
    """FSGP whose server replaces the released ``Σ A_k A_kᵀ`` by ``PSD(Σ A_k A_kᵀ) + τ I`` (post-processing)."""

    ridge = 0.0

    def server_update(self, state: Any, aggregate: Aggregate) -> Any:
        if aggregate.phase == "predict":
            arrays = dict(aggregate.arrays)
            arrays["kuf_kfu"] = repaired(arrays["kuf_kfu"], self.ridge)
            aggregate = dataclasses.replace(aggregate, arrays=arrays)
        return super().server_update(state, aggregate)


class RepairedFedBNR(FedBNR):
    """FedBNR whose server replaces the released ``Σ Φ_kᵀΦ_k`` by ``PSD(Σ Φ_kᵀΦ_k) + ridge · I`` itself and hides
    the noise from FedBNR's own repair (which is ``PSD + τ I``,
    :func:`~gpflow_fed.federated.algorithms.postprocess.denoised_gram`):
    ``ridge = None`` keeps the noised sum as it is, ``0.0`` projects it only."""

    ridge: Any = 0.0

    def server_update(self, state: Any, aggregate: Aggregate) -> Any:
        if aggregate.phase == "scatter":
            arrays = dict(aggregate.arrays)
            if self.ridge is not None:
                arrays["phi_t_phi"] = repaired(arrays["phi_t_phi"], self.ridge)
            aggregate = dataclasses.replace(aggregate, arrays=arrays, noised=False, noise_std=0.0)
        return super().server_update(state, aggregate)


def with_ridge(algorithm: Any, ridge: float) -> Any:
    algorithm.ridge = ridge
    return algorithm


def payload_norms(ledger: Any, phase: str) -> List[float]:
    return [
        math.sqrt(sum(float(np.sum(np.square(a))) for a in m.arrays.values()))
        for m in ledger.messages
        if m.sender != "server" and m.phase == phase
    ]


def two_digits_up(value: float) -> float:
    scale = 10 ** (math.floor(math.log10(value)) - 1)
    return float(math.ceil(value / scale) * scale)


def epsilon(dp: DifferentialPrivacy, num_clients: int) -> float:
    """ε at dp.delta of one release over every client (what ``result.privacy["epsilon"]`` reports)."""
    accountant = PrivacyAccountant(dp)
    accountant.record(num_clients, num_clients, 1)
    return accountant.epsilon()


def noised_runs(
    factory: Any, dataset: FederatedDataset, dp: DifferentialPrivacy, draws: int, scale: float = 1.0
) -> Tuple[float, float, int]:
    """Mean RMSE and NLPD over the successful draws (in data units: outputs were divided by ``scale``), and
    the number of failed draws."""
    rmses, nlpds, failed = [], [], 0
    for draw in range(draws):
        try:
            result = run(
                factory(),
                dataset,
                runtime=LocalRuntime(protection=Protection(secure_aggregation=False, differential_privacy=dp)),
                seed=draw,
            )
        except Exception:  # a noised sum that cannot be factorised is a result to report, not to hide
            failed += 1
            continue
        assert result.privacy["epsilon"] == epsilon(dp, dataset.num_clients)
        rmses.append(result.metrics["test_rmse"] * scale)
        nlpds.append(result.metrics["test_nlpd"] + math.log(scale))
    mean = lambda v: float(np.mean(v)) if v else float("nan")
    return mean(rmses), mean(nlpds), failed


def cells(rmse: float, nlpd: float, failed: int, draws: int) -> str:
    if failed == draws:
        return "fails | fails"
    note = f" ({failed}/{draws} failed)" if failed else ""
    return f"{rmse:.4g}{note} | {nlpd:.4g}"


def fsgp_part(args: argparse.Namespace) -> None:
    y_max = args.fsgp_y_bound
    print(
        f"### FSGP prediction statistics (N_k = {args.fsgp_points}, M = {args.inducing}, R = {args.rounds}, "
        f"P = 3, λ = 0.1; y clipped to ±{y_max}; {args.draws} noise draws)\n"
    )
    print(
        "| K | N | z | ε (δ = 1e-5) | RMSE, C Cᵀ | NLPD, C Cᵀ | RMSE, whitened | NLPD, whitened "
        "| RMSE, whitened + τI | NLPD, whitened + τI |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for K in args.fsgp_clients:
        data = fsgp_synthetic_1(seed=args.seed, num_train=K * args.fsgp_points)
        parts = iid_partition(len(data.X_train), K, seed=args.seed)
        Y = np.clip(data.Y_train, -y_max, y_max)
        dataset = FederatedDataset(
            clients=[(data.X_train[p], Y[p]) for p in parts], test=(data.X_test, data.Y_test), name="fsgp-1"
        )
        Z = initial_inducing_inputs(data.X_train, args.inducing, seed=args.seed)
        pilot = run(
            FSGP(gpflow.kernels.SquaredExponential(), Z, 0.1, rounds=args.rounds, local_steps=3, learning_rate=0.1),
            dataset,
            runtime=LocalRuntime(
                options=RunOptions(keep_payloads=True), protection=Protection(secure_aggregation=False)
            ),
            seed=args.seed,
        )
        trained = pilot.model
        noise = float(trained.likelihood.variance.numpy())
        variance = float(trained.kernel.variance.numpy())

        def factory(whiten: bool = False, trained: Any = trained, noise: float = noise, cls: type = FSGP) -> FSGP:
            return cls(
                trained.kernel,
                trained.inducing_variable.Z.numpy(),
                noise,
                rounds=0,
                local_steps=3,
                learning_rate=0.1,
                whiten=whiten,
            )

        norms = payload_norms(pilot.ledger, "predict")
        clip = two_digits_up(max(norms))
        # whitened: tr(A Aᵀ) ≤ N_k σ_f², ‖A y‖ ≤ N_k σ_f y_max, ‖y‖² ≤ N_k y_max², tr K_ff = N_k σ_f², N_k
        clip_white = max(dataset.client_sizes) * math.sqrt(2 * variance**2 + variance * y_max**2 + y_max**4 + 1.0)
        checks = [
            run(
                factory(w),
                dataset,
                runtime=LocalRuntime(
                    options=RunOptions(keep_payloads=True), protection=Protection(secure_aggregation=False)
                ),
                seed=args.seed,
            )
            for w in (False, True)
        ]
        for check in checks:
            gap = abs(check.metrics["test_rmse"] - pilot.metrics["test_rmse"])
            assert gap < 1e-6, f"the predict-only rerun differs from the pilot by {gap}"
        assert max(payload_norms(checks[1].ledger, "predict")) <= clip_white, "the public bound must not clip"
        print(
            f"| {K} | {dataset.num_data} | no DP | ∞ | {pilot.metrics['test_rmse']:.4g} | "
            f"{pilot.metrics['test_nlpd']:.4g} "
            f"| {checks[1].metrics['test_rmse']:.4g} | {checks[1].metrics['test_nlpd']:.4g} | | |",
            flush=True,
        )
        for z in NOISE_MULTIPLIERS:
            dp = DifferentialPrivacy(noise_multiplier=z, clip_norm=clip, phases=("predict",), accountant="pld")
            dp_white = DifferentialPrivacy(
                noise_multiplier=z, clip_norm=clip_white, phases=("predict",), accountant="pld"
            )
            raw = noised_runs(factory, dataset, dp, args.draws)
            white = noised_runs(lambda: factory(True), dataset, dp_white, args.draws)
            tau = noise_ridge(dp_white, args.inducing)
            ridge = noised_runs(lambda: with_ridge(factory(True, cls=RidgeFSGP), tau), dataset, dp_white, args.draws)
            print(
                f"| {K} | {dataset.num_data} | {z:g} | {epsilon(dp, K):.3g} | {cells(*raw, args.draws)} "
                f"| {cells(*white, args.draws)} | {cells(*ridge, args.draws)} |",
                flush=True,
            )
        print(
            f"\nK = {K}: {int(np.sum(np.abs(data.Y_train) > y_max))} training outputs clipped; C Cᵀ: C = {clip:g} "
            f"(client payload norms {min(norms):.4g}..{max(norms):.4g}, pilot); whitened: public C = N_k (2σ_f⁴ + "
            f"σ_f² y_max² + y_max⁴ + 1)^½ = {clip_white:.4g} (σ_f² = {variance:.4g}; payload norms "
            f"{min(payload_norms(checks[1].ledger, 'predict')):.4g}.."
            f"{max(payload_norms(checks[1].ledger, 'predict')):.4g}); "
            f"test-set std of y {float(np.std(data.Y_test)):.4g} (RMSE of a constant prediction)\n",
            flush=True,
        )


def scaled_fsgp1(num_clients: int, points: int, seed: int, y_max: float) -> FederatedDataset:
    """FSGP synthetic dataset 1 over K iid clients of ``points`` rows, scaled by public constants: x/10, y/3
    clipped to ±``y_max`` (the test outputs are scaled, not clipped)."""
    data = fsgp_synthetic_1(seed=seed, num_train=num_clients * points)
    parts = iid_partition(len(data.X_train), num_clients, seed=seed)
    X, Y = data.X_train / 10.0, np.clip(data.Y_train / 3.0, -y_max, y_max)
    return FederatedDataset(
        clients=[(X[p], Y[p]) for p in parts], test=(data.X_test / 10.0, data.Y_test / 3.0), name="fsgp-1 scaled"
    )


def point_bound(num_samples: int, variance: float, y_max: float) -> float:
    """b = (B² + B y_max² + y_max⁴ + 1)^½, the most one point adds to a phase-2 payload's norm, where
    B = ‖φ(x)‖² = σ_f² m/(m−1) for every x (random Fourier features with m samples)."""
    B = variance * num_samples / (num_samples - 1)
    return math.sqrt(B**2 + B * y_max**2 + y_max**4 + 1.0)


def fedbnr_part(args: argparse.Namespace) -> None:
    m, variance, lengthscale, y_max = args.features, 1.0, args.lengthscale, args.y_bound
    b = point_bound(m, variance, y_max)
    noise_variance = (0.5 / 3.0) ** 2  # the generator's noise std 0.5, in units of y/3
    print(
        f"### FedBNR phase 2 (URK, m = {m} Fourier samples, L = {2 * m} features, ℓ = {lengthscale} on x/10, "
        f"σ_f² = {variance}, σ² = {noise_variance:.4g}, λ² = 1; y/3 clipped to ±{y_max}; per-point bound "
        f"b = {b:.4g}; N_k = {args.fedbnr_points}; {args.draws} noise draws; RMSE and NLPD in data units)\n"
    )
    print(
        "| K | N | C = N_k b | z | ε (δ = 1e-5) | RMSE | NLPD | RMSE, PSD | NLPD, PSD | RMSE, PSD + τI "
        "| NLPD, PSD + τI |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for K in args.fedbnr_clients:
        dataset = scaled_fsgp1(K, args.fedbnr_points, args.seed, y_max)
        clip = max(dataset.client_sizes) * b

        def factory(cls: type = FedBNR) -> FedBNR:
            kernel = URK(
                1, num_samples=m, seed=args.seed, variance=variance, feature_map_options={"lengthscales": lengthscale}
            )
            return cls(kernel, noise_variance=noise_variance, prior_variance=1.0, rounds=0, protocol="statistics")

        exact = run(
            factory(),
            dataset,
            runtime=LocalRuntime(
                options=RunOptions(keep_payloads=True), protection=Protection(secure_aggregation=False)
            ),
            seed=args.seed,
        )
        norms = payload_norms(exact.ledger, "scatter")
        assert max(norms) <= clip, "the public bound must not clip"
        print(
            f"| {K} | {dataset.num_data} | {clip:.4g} | no DP | ∞ | {3 * exact.metrics['test_rmse']:.4g} "
            f"| {exact.metrics['test_nlpd'] + math.log(3.0):.4g} | | | | |",
            flush=True,
        )
        for z in NOISE_MULTIPLIERS:
            dp = DifferentialPrivacy(noise_multiplier=z, clip_norm=clip, phases=("scatter",), accountant="pld")
            eps = epsilon(dp, K)
            rmse, nlpd, failed = noised_runs(
                lambda: with_ridge(factory(RepairedFedBNR), None), dataset, dp, args.draws, scale=3.0
            )
            projected = noised_runs(lambda: factory(RepairedFedBNR), dataset, dp, args.draws, scale=3.0)
            ridge = noised_runs(factory, dataset, dp, args.draws, scale=3.0)  # FedBNR's own repair: PSD + τI
            print(
                f"| {K} | {dataset.num_data} | {clip:.4g} | {z:g} | {eps:.3g} | "
                f"{cells(rmse, nlpd, failed, args.draws)} "
                f"| {cells(*projected, args.draws)} | {cells(*ridge, args.draws)} |",
                flush=True,
            )
        print(
            f"\nK = {K}: client 'scatter' payload norms {min(norms):.4g}..{max(norms):.4g} (bound C = {clip:.4g}); "
            f"test-set std of y {float(3.0 * np.std(dataset.test[1])):.4g}\n",
            flush=True,
        )


def main(argv: Sequence[str] = ()) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("fsgp", "fedbnr", "all"), default="all")
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fsgp-clients", type=int, nargs="+", default=[5, 50, 500])
    parser.add_argument("--fsgp-points", type=int, default=100, help="N_k of the FSGP part")
    parser.add_argument("--fsgp-y-bound", type=float, default=5.0, help="|y| bound of the FSGP part (clipped)")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--inducing", type=int, default=20)
    parser.add_argument("--fedbnr-clients", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--fedbnr-points", type=int, default=20, help="N_k of the FedBNR part")
    parser.add_argument("--features", type=int, default=25, help="m, Fourier samples of the URK (L = 2m)")
    parser.add_argument("--lengthscale", type=float, default=0.3)
    parser.add_argument("--y-bound", type=float, default=1.5)
    parser.add_argument("--quick", action="store_true", help="one draw, K = 5 (FSGP, 3 rounds) and K = 10 (FedBNR)")
    args = parser.parse_args(list(argv) or None)
    if args.quick:
        args.draws, args.fsgp_clients, args.rounds, args.fedbnr_clients = 1, [5], 3, [10]
    start = time.perf_counter()
    if args.part in ("fsgp", "all"):
        fsgp_part(args)
    if args.part in ("fedbnr", "all"):
        fedbnr_part(args)
    print(f"wall time {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()

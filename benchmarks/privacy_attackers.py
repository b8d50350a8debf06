"""Two Monte Carlo attackers against the privacy-aware release's floor (issue 44), by their actual squared error.

* ``bayes``: knows the design θ and uses the Bayes-optimal predictor ``E[T | W] = C_TX (K + V + Σ)⁻¹ W`` of the
  protected target T (the record ``Y_s`` at a sensitive training input, or ``f(s)``); its mean squared error over
  many releases of data drawn from the design prior estimates ``Var[T | W]``, which the release floors at ξ.
* ``refit``: knows only the release (X, W, Σ, σ²): fits θ (lengthscale and variance) by maximum likelihood on W
  alone, then predicts with it; the data are drawn from a θ other than the design's (finding 4's set-up: design
  lengthscale 0.2, data 0.5, and other data lengthscales). Each row is one ``release(...)`` configuration: the
  default (lengthscales within ×2 of the design's and the check under the θ refitted on W), other θ ranges, the
  check on or off. Besides MSE / ξ it reports what the configuration costs: the mean tr Σ of the releases and the
  RMSE of the released model's predictive mean of f at the inputs, and how often the check added noise or refused.

Usage: ``python benchmarks/privacy_attackers.py [--draws 2000] [--refits 40] [--data-lengthscales 0.2,0.5,0.8,1.5]``
(prints Markdown tables; the release noise comes from the OS, so each run differs by a few %).
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any, Dict, List, Tuple

import gpflow
import numpy as np

from gpflow_fed.models import PrivacyAwareGPR, release
from gpflow_fed.release import ProportionalKernel, obfuscate, synthetic_noise_covariance
from gpflow_fed.release.linalg import kernel_matrix

N = 40
X = np.linspace(0.0, 1.0, N)[:, None]
J = 20
SIGMA2, ALPHA, DESIGN_LENGTHSCALE = 1e-2, 0.5, 0.2
#: the ``release(...)`` configurations of the refitting attacker's table: name → keyword arguments.
CONFIGURATIONS: Dict[str, Dict[str, Any]] = {
    "default (×2 range, refit check)": {},
    "×3 range, refit check": {"theta_range": 3.0},
    "design θ only, refit check": {"theta_range": "design"},
    "×3 range, no check": {"theta_range": 3.0, "refit_check": False},
    "×2 range, no check": {"theta_range": 2.0, "refit_check": False},
    "×1.5 range, no check": {"theta_range": 1.5, "refit_check": False},
    "design θ only, no check (main before)": {"theta_range": "design", "refit_check": False},
}


def draws(kernel: gpflow.kernels.Kernel, noise_variance: float, count: int, seed: int) -> Tuple[np.ndarray, np.ndarray]:
    """``(F, Y)``: ``count`` columns of f ~ GP(0, K) at X and Y = f + ε."""
    rng = np.random.default_rng(seed)
    K = kernel_matrix(kernel, X)
    F = np.linalg.cholesky(K + 1e-9 * np.eye(N)) @ rng.standard_normal((N, count))
    return F, F + np.sqrt(noise_variance) * rng.standard_normal((N, count))


def bayes(lengthscale: float, noise_variance: float, alpha: float, protect: str, count: int) -> float:
    """MSE / ξ of the Bayes-optimal attacker on the record Y_J."""
    k = gpflow.kernels.SquaredExponential(lengthscales=lengthscale)
    Sigma = np.asarray(
        synthetic_noise_covariance(
            k, X, X[[J]], ProportionalKernel(k, alpha), noise_variance=noise_variance, protect=protect
        )
    )
    _, Y = draws(k, noise_variance, count, seed=1)
    W = obfuscate(Y, Sigma)
    K = kernel_matrix(k, X)
    cross = K[:, J] + noise_variance * np.eye(N)[:, J]
    prediction = cross @ np.linalg.solve(K + noise_variance * np.eye(N) + Sigma, W)
    return float(np.mean((prediction - Y[J]) ** 2)) / alpha


def attack(W: np.ndarray, Sigma: np.ndarray) -> Tuple[np.ndarray, float]:
    """The refitting attacker: ``a`` of its predictor ``aᵀW`` of Y_J after fitting θ on W alone, and the fitted ℓ."""
    model = PrivacyAwareGPR(
        (X, W), gpflow.kernels.SquaredExponential(lengthscales=DESIGN_LENGTHSCALE), Sigma, noise_variance=SIGMA2
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables, compile=False)
    K = kernel_matrix(model.kernel, X)
    a = np.linalg.solve(K + SIGMA2 * np.eye(N) + Sigma, K[:, J] + SIGMA2 * np.eye(N)[:, J])
    return a, float(model.kernel.lengthscales.numpy())


def refit(count: int, data_lengthscale: float, kwargs: Dict[str, Any], seed: int = 2) -> Dict[str, float]:
    """One row of the refitting attacker's table: ``count`` releases of data drawn with ``data_lengthscale``."""
    truth_kernel = gpflow.kernels.SquaredExponential(lengthscales=data_lengthscale)
    F, Y = draws(truth_kernel, SIGMA2, count, seed=seed)
    truth = kernel_matrix(truth_kernel, X) + SIGMA2 * np.eye(N)
    errors, expected, scales, traces, rmse, steps, refused = [], [], [], [], [], [], 0
    for i in range(count):
        design = gpflow.kernels.SquaredExponential(lengthscales=DESIGN_LENGTHSCALE)
        try:
            out = release(
                (X, Y[:, i : i + 1]),
                X[[J]],
                ProportionalKernel(design, ALPHA),
                kernel=design,
                noise_variance=SIGMA2,
                ledger=None,
                confirm_public=True,  # the design variance 1 is public; a sample variance near it is chance
                **kwargs,
            )
        except ValueError as exc:
            if "refitted" not in str(exc):
                raise
            refused += 1
            continue
        Sigma = np.asarray(out.Sigma)
        a, scale = attack(out.W, Sigma)
        errors.append((a @ out.W[:, 0] - Y[J, i]) ** 2)
        d = a - np.eye(N)[:, J]
        expected.append(d @ truth @ d + a @ Sigma @ a)
        scales.append(scale)
        traces.append(float(np.trace(Sigma)))
        mean, _ = out.model.predict_f(X)
        rmse.append(float(np.sqrt(np.mean((mean.numpy()[:, 0] - F[:, i]) ** 2))))
        steps.append(0 if out.refit_check is None else out.refit_check.steps)
    return {
        "mse": float(np.mean(errors)) / ALPHA,
        "se": float(np.std(errors) / np.sqrt(len(errors))) / ALPHA,
        "expected": float(np.mean(expected)) / ALPHA,
        "median_l": float(np.median(scales)),
        "trace": float(np.mean(traces)),
        "rmse": float(np.mean(rmse)),
        "with_noise": float(np.mean(np.asarray(steps) > 0)),
        "refused": refused / count,
    }


def main(argv: "List[str] | None" = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--refits", type=int, default=40)
    parser.add_argument("--data-lengthscales", default="0.2,0.5,0.8,1.5")
    parser.add_argument("--configurations", default=None, help="names of CONFIGURATIONS separated by ';' (all)")
    args = parser.parse_args(argv)
    print("| attacker | set-up | protect | MSE / ξ |\n|---|---|---|---|")
    for ls, s2, alpha in [(0.02, 0.3, 0.2), (0.1, 0.05, 0.5)]:
        for protect in ("records", "latent"):
            value = bayes(ls, s2, alpha, protect, args.draws)
            print(f"| Bayes (design θ), {args.draws} releases | ℓ={ls}, σ²={s2}, α={alpha} | {protect} | {value:.3f} |")
    names = list(CONFIGURATIONS) if args.configurations is None else args.configurations.split(";")
    print(
        f"\nθ refitted on W, {args.refits} releases per row (design ℓ = {DESIGN_LENGTHSCALE}, σ² = {SIGMA2}, "
        f"α = {ALPHA}, records):\n\n| release | data ℓ | MSE / ξ (± se) | expected MSE / ξ | median fitted ℓ | "
        "mean tr Σ | RMSE of f | check added noise | refused |\n|---|---|---|---|---|---|---|---|---|"
    )
    for name in names:
        for data_lengthscale in (float(v) for v in args.data_lengthscales.split(",")):
            start = time.time()
            row = refit(args.refits, data_lengthscale, CONFIGURATIONS[name])
            print(
                f"| {name} | {data_lengthscale:g} | {row['mse']:.2f} ± {row['se']:.2f} | {row['expected']:.2f} | "
                f"{row['median_l']:.3f} | {row['trace']:.1f} | {row['rmse']:.3f} | {row['with_noise']:.0%} | "
                f"{row['refused']:.0%} |",
                flush=True,
            )
            print(f"<!-- {name}, data ℓ {data_lengthscale:g}: {time.time() - start:.0f} s -->", flush=True)


if __name__ == "__main__":
    main()

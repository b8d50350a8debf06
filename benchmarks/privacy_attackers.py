"""Two Monte Carlo attackers against the privacy-aware release's floor (issue 44), by their actual squared error.

* ``bayes``: knows the design θ and uses the Bayes-optimal predictor ``E[T | W] = C_TX (K + V + Σ)⁻¹ W`` of the
  protected target T (the record ``Y_s`` at a sensitive training input, or ``f(s)``); its mean squared error over
  many releases of data drawn from the design prior estimates ``Var[T | W]``, which the release floors at ξ.
* ``refit``: knows only the release (X, W, Σ, σ²): fits θ by maximum likelihood on W alone, then predicts with it;
  the data are drawn from a θ other than the design's (finding 4's set-up: design lengthscale 0.2, data 0.5).

Usage: ``python benchmarks/privacy_attackers.py [--draws 2000] [--refits 40]`` (prints a Markdown table).
"""

from __future__ import annotations

import argparse
import warnings

import gpflow
import numpy as np
import tensorflow as tf

from gpflow_fed.models import PrivacyAwareGPR
from gpflow_fed.release import ProportionalKernel, obfuscate, synthetic_noise_covariance
from gpflow_fed.release.linalg import kernel_matrix

N = 40
X = np.linspace(0.0, 1.0, N)[:, None]
J = 20


def draws(kernel: gpflow.kernels.Kernel, noise_variance: float, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    K = kernel_matrix(kernel, X)
    F = np.linalg.cholesky(K + 1e-9 * np.eye(N)) @ rng.standard_normal((N, count))
    return F + np.sqrt(noise_variance) * rng.standard_normal((N, count))


def bayes(lengthscale: float, noise_variance: float, alpha: float, protect: str, count: int) -> float:
    """MSE / ξ of the Bayes-optimal attacker on the record Y_J."""
    k = gpflow.kernels.SquaredExponential(lengthscales=lengthscale)
    Sigma = np.asarray(
        synthetic_noise_covariance(
            k, X, X[[J]], ProportionalKernel(k, alpha), noise_variance=noise_variance, protect=protect
        )
    )
    Y = draws(k, noise_variance, count, seed=1)
    W = obfuscate(Y, Sigma)
    K = kernel_matrix(k, X)
    cross = K[:, J] + noise_variance * np.eye(N)[:, J]
    prediction = cross @ np.linalg.solve(K + noise_variance * np.eye(N) + Sigma, W)
    return float(np.mean((prediction - Y[J]) ** 2)) / alpha


def refit(count: int, protect: str) -> "tuple[float, float]":
    """MSE / ξ of the attacker that fits θ on W alone (data lengthscale 0.5, design 0.2), and the median fitted ℓ."""
    design = gpflow.kernels.SquaredExponential(lengthscales=0.2)
    sigma2, alpha = 1e-2, 0.5
    Sigma = synthetic_noise_covariance(
        design, X, X[[J]], ProportionalKernel(design, alpha), noise_variance=sigma2, protect=protect
    )
    Y = draws(gpflow.kernels.SquaredExponential(lengthscales=0.5), sigma2, count, seed=2)
    W = obfuscate(Y, Sigma)
    errors, scales = [], []
    for i in range(count):
        start = gpflow.kernels.SquaredExponential(lengthscales=0.2)
        model = PrivacyAwareGPR((X, W[:, i : i + 1]), start, Sigma, noise_variance=sigma2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables, compile=False)
        X_, W_ = model.data
        L = model._observation_cholesky()
        cross = model.kernel(X_, X[[J]]).numpy()[:, 0] + sigma2 * np.eye(N)[:, J]
        a = tf.linalg.cholesky_solve(L, (W_ - model.mean_function(X_))).numpy()[:, 0]
        prediction = float(model.mean_function(X[[J]]).numpy()[0, 0] + cross @ a)
        errors.append((prediction - Y[J, i]) ** 2)
        scales.append(float(model.kernel.lengthscales.numpy()))
    return float(np.mean(errors)) / alpha, float(np.median(scales))


def main(argv: "list[str] | None" = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--draws", type=int, default=2000)
    parser.add_argument("--refits", type=int, default=40)
    args = parser.parse_args(argv)
    print("| attacker | set-up | protect | MSE / ξ |\n|---|---|---|---|")
    for ls, s2, alpha in [(0.02, 0.3, 0.2), (0.1, 0.05, 0.5)]:
        for protect in ("records", "latent"):
            value = bayes(ls, s2, alpha, protect, args.draws)
            print(f"| Bayes (design θ), {args.draws} releases | ℓ={ls}, σ²={s2}, α={alpha} | {protect} | {value:.3f} |")
    for protect in ("records", "latent"):
        value, median = refit(args.refits, protect)
        print(
            f"| θ refitted on W, {args.refits} releases | design ℓ=0.2, data ℓ=0.5, σ²=0.01, α=0.5 "
            f"(median fitted ℓ {median:.3f}) | {protect} | {value:.3f} |"
        )


if __name__ == "__main__":
    main()

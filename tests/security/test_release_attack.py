"""Attack: de-noise a privacy-aware release by regenerating its synthetic noise from guessed seeds.

Σ is public (the released model carries it; it also follows from the released kernel, X and tolerance), so if
Z were drawn from a guessable seed, ``W − obfuscate(0, Σ, seed)`` would return the raw Y exactly. The attacker
has the code, the defaults and W, and tries seeds 0…999 (which include the CLI's former default ``--seed 0``).
"""

import csv

import gpflow
import numpy as np
import pytest

from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR, release
from gpflow_fed.release import ProportionalKernel, obfuscate, synthetic_noise_covariance

GUESSES = range(1000)


def _data():
    X = np.linspace(0, 1, 25)[:, None]
    Y = np.sin(6 * X) + 0.05 * np.cos(40 * X)
    return X, Y


def _recover(W: np.ndarray, Sigma: object) -> "list[np.ndarray]":
    """The candidate Ys the attacker gets from each seed guess (the pre-fix noise was ``default_rng(seed)``):
    ``W ∓ Z(seed)`` (both signs, in case the attacker's eigenvectors are flipped)."""
    zero = np.zeros_like(W)
    noises = [obfuscate(zero, Sigma, insecure_noise_seed=s) for s in GUESSES]
    return [W - Z for Z in noises] + [W + Z for Z in noises]


def _hits(candidates: "list[np.ndarray]", Y: np.ndarray) -> "list[int]":
    n = len(GUESSES)
    return [GUESSES[i % n] for i, c in enumerate(candidates) if np.allclose(c, Y, rtol=0, atol=1e-8)]


def test_the_attack_works_when_the_noise_is_seeded() -> None:
    """The attack is real: a release made with a guessable seed (the old default) is de-noised exactly."""
    X, Y = _data()
    k = gpflow.kernels.SquaredExponential(lengthscales=0.3)
    out = release(
        (X, Y), [[0.5]], ProportionalKernel(k, 0.5), kernel=k, fit=False, noise_variance=1e-4, insecure_noise_seed=0
    )
    assert not np.allclose(out.W, Y, atol=1e-3)
    assert _hits(_recover(out.W, out.Sigma), Y) == [0]


def test_guessing_seeds_does_not_denoise_a_default_release() -> None:
    X, Y = _data()
    k = gpflow.kernels.SquaredExponential(lengthscales=0.3)
    out = release((X, Y), [[0.5]], ProportionalKernel(k, 0.5), kernel=k, fit=False, noise_variance=1e-4)
    assert not np.allclose(out.W, Y, atol=1e-3)
    assert _hits(_recover(out.W, out.Sigma), Y) == []
    with pytest.raises(TypeError):
        release((X, Y), [[0.5]], 0.1, kernel=k, fit=False, seed=0)  # no seed governs the noise any more


def test_guessing_seeds_does_not_denoise_the_cli_release(tmp_path) -> None:
    X, Y = _data()
    path = tmp_path / "data.csv"
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([["x", "y"], *np.concatenate([X, Y], axis=1).tolist()])
    out = tmp_path / "out"
    assert (
        main(
            [
                "privacy",
                str(path),
                "--sensitive",
                "0.5",
                "--alpha",
                "0.5",
                "--noise-variance",
                "1e-4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    W = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)[:, 1:]
    model = PrivacyAwareGPR.load(out / "model.npz")
    # the attacker recomputes Σ from public information: the released kernel, X, the tolerance and σ²
    sigma2 = float(model.likelihood.variance.numpy())
    Sigma = synthetic_noise_covariance(
        model.kernel, X, [[0.5]], ProportionalKernel(model.kernel, 0.5), noise_variance=sigma2
    )
    np.testing.assert_allclose(np.asarray(model.Sigma), Sigma, atol=1e-10)
    assert not np.allclose(W, Y, atol=1e-3)
    assert _hits(_recover(W, Sigma), Y) == []
    with pytest.raises(SystemExit) as exc:  # the former "--seed" (default 0) is gone, not silently ignored
        main(["privacy", str(path), "--sensitive", "0.5", "--alpha", "0.5", "--seed", "0", "--out", str(out)])
    assert exc.value.code == 2

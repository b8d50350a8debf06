"""Attacks on a privacy-aware release by someone who holds only what it publishes (``released.csv``, ``model.npz``).

The published Σ is low rank (≈ one direction per sensitive input), so ``W = Y + Lω`` fixes the raw Y up to the r
unknown scalars ω. Two attacks follow:

1. **Regenerate the noise.** If ω came from a guessable seed, ``W − Lω(seed)`` is Y. The attacker tries seeds 0…999
   (which include the CLI's former default ``--seed 0``).
2. **Solve for ω.** Anything published beside W that depends on the raw Y is an equation in ω. Before the fix the
   constant mean and kernel hyperparameters were fitted by maximum likelihood on the raw Y, so their stationarity
   equations hold at ``Y = W − Lω``::

       ∂/∂c:  1ᵀC⁻¹(Y − c1) = 0,        ∂/∂θⱼ:  rᵀC⁻¹ĊⱼC⁻¹r = tr(C⁻¹Ċⱼ)   (r = Y − c1, C = K_θ + σ²I),

   r or more equations in r unknowns; and with ``fit=False`` the published mean was ``mean(Y)``, one linear
   equation (enough for one sensitive input). The controls reproduce those old releases inside the test (the
   library no longer offers them) and recover Y to ~1e-6 of the noise; the attacker's posterior variance at the
   sensitive inputs then collapses far below the tolerance.

After the fix everything published is a function of W and public inputs. The attacks then return a wrong Y, and,
the decisive property, two raw datasets that yield the same W yield the very same published files, so the
attacker's best posterior of f(s) is ``p(f(s) | W)``, whose variance (the released model's) is ≥ the tolerance.
"""

import csv
import json

import gpflow
import numpy as np
import pytest
from scipy.optimize import least_squares

import gpflow_fed.randomness as randomness
from gpflow_fed.cli import main
from gpflow_fed.models import PrivacyAwareGPR, fit_hyperparameters, release
from gpflow_fed.release import ProportionalKernel, obfuscate, resolution_noise, synthetic_noise_covariance

GUESSES = range(1000)
ALPHA = 0.5
#: public design hyperparameters of the fixed releases (lengthscale, kernel variance, σ²)
DESIGN = (0.2, 1.0, 1e-4)
POINTS = {1: [[0.5]], 3: [[0.3], [0.5], [0.7]]}


def _data(n: int = 25, seed: int = 0) -> "tuple[np.ndarray, np.ndarray]":
    X = np.linspace(0, 1, n)[:, None]
    return X, np.sin(6 * X) + 0.05 * np.random.default_rng(seed).standard_normal(X.shape)


def _public_data() -> "tuple[np.ndarray, np.ndarray]":
    """Data from the same process at other inputs (disjoint from the release)."""
    X = np.linspace(0.01, 0.99, 30)[:, None]
    return X, np.sin(6 * X) + 0.05 * np.random.default_rng(7).standard_normal(X.shape)


def _design_kernel() -> gpflow.kernels.SquaredExponential:
    lengthscale, variance, _ = DESIGN
    return gpflow.kernels.SquaredExponential(lengthscales=lengthscale, variance=variance)


# ---------------------------------------------------------------- the attacker: reads files, solves equations


def _published(path) -> dict:
    """What the attacker reads from ``model.npz``: X, W, the noise factor's effective directions, σ², θ, c."""
    f = np.load(path)
    U, s, _ = np.linalg.svd(f["noise_factor"], full_matrices=False)
    keep = s > 1e-6 * s[0]  # directions with variance ≥ 1e-12 of the largest
    return {
        "X": f["X"],
        "W": f["W"][:, 0],
        "L": U[:, keep] * s[keep],
        "sigma2": float(f["noise_variance"]),
        "c": float(np.ravel(f["param.mean_function.c"])[0]),
        "variance": float(f["param.kernel.variance"]),
        "lengthscale": float(f["param.kernel.lengthscales"]),
    }


def _kernel_matrices(p: dict) -> "tuple[np.ndarray, np.ndarray]":
    D2 = np.sum((p["X"][:, None, :] - p["X"][None, :, :]) ** 2, axis=-1)
    return p["variance"] * np.exp(-0.5 * D2 / p["lengthscale"] ** 2), D2


def _stationarity_attack(p: dict) -> np.ndarray:
    """Solve the maximum-likelihood stationarity equations at the published (c, θ, σ²) for ω; return ``W − Lω``.

    The attacker does not know whether σ² was fitted or fixed, so it solves both systems (with and without the
    σ² equation) from several starts and keeps the solution with the smallest residual.
    """
    K, D2 = _kernel_matrices(p)
    n = K.shape[0]
    C = K + p["sigma2"] * np.eye(n)
    Ci = np.linalg.inv(C)
    scaled_derivatives = [K, K * D2 / p["lengthscale"] ** 2, p["sigma2"] * np.eye(n)]  # θⱼ ∂C/∂θⱼ

    def residual(omega: np.ndarray, with_noise: bool) -> np.ndarray:
        a = Ci @ (p["W"] - p["L"] @ omega - p["c"])
        equations = [np.sum(a)]
        for dC in scaled_derivatives[: 3 if with_noise else 2]:
            equations.append(0.5 * a @ dC @ a - 0.5 * np.sum(Ci * dC))
        return np.array(equations)

    rng = np.random.default_rng(1)
    r = p["L"].shape[1]
    best = None
    for with_noise in (True, False):
        for start in [np.zeros(r)] + [rng.standard_normal(r) for _ in range(2)]:
            sol = least_squares(residual, start, args=(with_noise,), xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=200)
            if best is None or sol.cost < best.cost:
                best = sol
    return p["W"] - p["L"] @ best.x


def _sample_mean_attack(p: dict) -> np.ndarray:
    """The published mean is ``mean(Y)``: ``mean(W − Lω) = c``, solved for ω (least norm)."""
    row = np.mean(p["L"], axis=0)[None, :]
    omega = np.linalg.lstsq(row, np.array([np.mean(p["W"]) - p["c"]]), rcond=None)[0]
    return p["W"] - p["L"] @ omega


def _variance_given_outputs(p: dict, S: np.ndarray) -> np.ndarray:
    """``Var[f(s) | Y]`` under the published θ: the attacker's posterior variance once it knows Y."""
    K, _ = _kernel_matrices(p)
    k = lambda A, B: p["variance"] * np.exp(-0.5 * np.sum((A[:, None] - B[None]) ** 2, -1) / p["lengthscale"] ** 2)  # noqa: E731
    KXS = k(p["X"], S)
    return p["variance"] - np.sum(KXS * np.linalg.solve(K + p["sigma2"] * np.eye(K.shape[0]), KXS), axis=0)


def _relative_error(Yhat: np.ndarray, Y: np.ndarray, W: np.ndarray) -> float:
    """``max |Ŷ − Y|`` as a fraction of the noise's largest entry."""
    return float(np.max(np.abs(Yhat - Y[:, 0])) / np.max(np.abs(W[:, 0] - Y[:, 0])))


# ---------------------------------------------------------------- the releases


def _old_release(path, X, Y, S, *, fit=True, noise_variance=None, method="strong", maxiter=1000) -> None:
    """main's release before the fix: hyperparameters and mean fitted on the raw Y (``mean(Y)`` with ``fit=False``)."""
    k = gpflow.kernels.SquaredExponential() if fit else _design_kernel()
    if fit:
        gpr, sigma2 = fit_hyperparameters((X, Y), k, noise_variance=noise_variance, maxiter=maxiter)
        c = gpr.mean_function.c.numpy()
    else:
        sigma2, c = DESIGN[2], np.mean(Y, axis=0)
    Sigma = synthetic_noise_covariance(k, X, S, ProportionalKernel(k, ALPHA), noise_variance=sigma2, method=method)
    W = obfuscate(Y, Sigma, insecure_noise_seed=3)  # the seed only makes the test reproducible; no attack uses it
    model = PrivacyAwareGPR((X, W), gpflow.utilities.deepcopy(k), Sigma, gpflow.mean_functions.Constant(c), sigma2)
    model.save(path)


def _new_release(X, Y, S, how: str, seed: int = 3, method: str = "strong", **kwargs):
    """Today's release, with the design hyperparameters given (``public``), fitted on public data, or refitted."""
    k = _design_kernel() if how != "public_data" else gpflow.kernels.SquaredExponential()
    design = {"noise_variance": DESIGN[2]} if how != "public_data" else {"public_data": _public_data()}
    return release(
        (X, Y),
        np.array(S, dtype=float),
        ProportionalKernel(k, ALPHA),
        kernel=k,
        method=method,
        refit=how == "refit",
        insecure_noise_seed=seed,
        **design,
        **kwargs,
    )


OLD_CASES = {
    "1 point, σ² fitted": dict(points=1),
    "3 points, σ² fitted": dict(points=3),
    "1 point, fixed --noise-variance": dict(points=1, noise_variance=1e-4),
    "1 point, --quick (20 L-BFGS steps)": dict(points=1, maxiter=20),
    "2 points, --method weak": dict(points=2, method="weak"),
}


@pytest.mark.parametrize("case", OLD_CASES, ids=list(OLD_CASES))
def test_control_hyperparameters_fitted_on_the_raw_y_give_y_back(tmp_path, case) -> None:
    """The attack is real: main's release (fit on the raw Y) is de-noised from model.npz alone."""
    settings = dict(OLD_CASES[case])
    S = np.array([[0.5], [0.3], [0.7]][: settings.pop("points")])
    X, Y = _data()
    _old_release(tmp_path / "model.npz", X, Y, S, **settings)
    p = _published(tmp_path / "model.npz")
    W = p["W"][:, None]
    error = _relative_error(_stationarity_attack(p), Y, W)
    variance = _variance_given_outputs(p, S)
    tolerance = ALPHA * p["variance"]
    print(f"{case}: max |Ŷ − Y| / max |Z| = {error:.2e}; attacker's variance {variance.max():.1e} vs {tolerance:.3g}")
    assert error < 1e-2, error
    # knowing Y, the attacker's posterior variance at each sensitive input is far below the tolerance α K(s, s)
    assert np.all(variance < 0.1 * tolerance)


def test_control_publishing_mean_y_gives_y_back_with_one_sensitive_input(tmp_path) -> None:
    """main's ``fit=False`` published ``mean(Y)``: with rank-1 noise that alone is one equation in one unknown."""
    X, Y = _data()
    _old_release(tmp_path / "model.npz", X, Y, np.array([[0.5]]), fit=False)
    p = _published(tmp_path / "model.npz")
    assert p["L"].shape[1] == 1
    assert _relative_error(_sample_mean_attack(p), Y, p["W"][:, None]) < 1e-6


NEW_CASES = {
    "1 point, public values": (1, "public", "strong"),
    "3 points, public values": (3, "public", "strong"),
    "1 point, fitted on public data": (1, "public_data", "strong"),
    "1 point, refit on W": (1, "refit", "strong"),
    "2 points, --method weak": (2, "public", "weak"),
}


@pytest.mark.parametrize("case", NEW_CASES, ids=list(NEW_CASES))
def test_the_equations_no_longer_give_y_back(tmp_path, case) -> None:
    points, how, method = NEW_CASES[case]
    S = [[0.5], [0.3], [0.7]][:points]
    X, Y = _data()
    out = _new_release(X, Y, S, how, method=method)
    out.model.save(tmp_path / "model.npz")
    p = _published(tmp_path / "model.npz")
    # one noise draw says little (on this fixed Y the miss ranged 0.009–1 of the noise over draws): the attack is
    # judged by its squared error over many draws in the two tests below; here, what it is solved from
    error = _relative_error(_stationarity_attack(p), Y, out.W)
    print(f"{case}: max |Ŷ − Y| / max |Z| = {error:.2e}")
    # the published mean is no statistic of Y but the maximum-likelihood constant given W: 1ᵀC⁻¹W / 1ᵀC⁻¹1 with
    # C = K + σ²I + Σ, all public (so fit=False's mean(Y) equation is gone too)
    K, _ = _kernel_matrices(p)
    C = K + p["sigma2"] * np.eye(K.shape[0]) + np.asarray(out.model.Sigma)
    a = np.linalg.solve(C, np.ones(K.shape[0]))
    if how != "refit":  # a refit moves θ and c together; the indistinguishability test below covers it
        np.testing.assert_allclose(p["c"], a @ p["W"] / a.sum(), rtol=1e-8)
        assert abs(p["c"] - np.mean(Y)) > 1e-3
    # the floor under the published θ (which is the attacker's best, by the indistinguishability test below)
    # (of the records at sensitive training inputs, Var[Y_j | W], and of f elsewhere: the default protect="records")
    var = np.diag(out.model.protected_covariance(out.targets.points, out.targets.records).numpy())
    np.testing.assert_array_less(out.tolerance * (1 - 1e-6), var)


def _stationarity_mse(draw_y, releases: int, **kwargs) -> float:
    """The stationarity attacker's squared error at the sensitive record (x = 0.5, row 12) over ``releases``
    releases with OS noise (public design values, ``release(**kwargs)``), as a fraction of ξ; ``draw_y(i)`` gives
    the i-th raw Y."""
    X, _ = _data()
    errors = []
    for i in range(releases):
        Y = draw_y(i)
        out = release(
            (X, Y),
            np.array([[0.5]]),
            ProportionalKernel(_design_kernel(), ALPHA),
            kernel=_design_kernel(),
            noise_variance=DESIGN[2],
            ledger=None,
            confirm_public=True,  # the design's kernel variance 1 is public, whatever var(Y) of a draw is
            **kwargs,
        )
        p = {
            "X": X,
            "W": out.W[:, 0],
            "L": out.model.noise_factor.numpy(),
            "sigma2": DESIGN[2],
            "c": float(out.model.mean_function.c.numpy()[0]),
            "variance": DESIGN[1],
            "lengthscale": DESIGN[0],
        }
        errors.append((_stationarity_attack(p)[12] - Y[12, 0]) ** 2)
    return float(np.mean(errors) / float(out.tolerance[0]))


def test_the_stationarity_attack_on_data_from_the_design_prior_stays_above_the_floor():
    """The floor is Bayesian: over Y drawn from the design prior (θ, σ² = 1e-4), the attacker that solves the
    stationarity equations for ω predicts the record with MSE ≥ ξ, in the paper's setting (Σ for the design θ alone,
    no check: measured 13.9 ξ over 40 draws; the default release, measured 4.0 ξ, is slower to make)."""
    X, _ = _data()
    K = _design_kernel()(X, full_cov=True).numpy() + DESIGN[2] * np.eye(X.shape[0])
    chol = np.linalg.cholesky(K)
    draws = lambda i: chol @ np.random.default_rng(i).standard_normal((X.shape[0], 1))  # noqa: E731
    assert _stationarity_mse(draws, 40, theta_range="design", refit_check=False) >= 1.0


def _one_fixed_dataset(releases: int, floor: float) -> None:
    """On one fixed Y that the design fits more tightly than its prior says (sin(6x) + 0.05ε against σ² = 1e-4),
    the default release (the θ range around the design and the check under the θ refitted on W) keeps the
    stationarity attacker's MSE at the record ≥ ``floor`` ξ over ``releases`` OS noise draws. Control (30 draws,
    fast): Σ for the design θ alone without the check (the paper's setting), where the attacker predicts the record
    with MSE 4.8 % of ξ (measured): that floor averages over data from the design prior."""
    _, Y = _data()
    assert _stationarity_mse(lambda i: Y, releases) >= floor
    assert _stationarity_mse(lambda i: Y, 30, theta_range="design", refit_check=False) < 0.5


@pytest.mark.slow
def test_the_stationarity_attack_on_one_fixed_dataset():
    """10 default releases (≈ 3–4 s each: slow; the default suite keeps the design-prior test above and the refit
    check's own tests), MSE ≥ 0.5 ξ. Measured over 30: 2.50 ξ, single draws 0.003–5.6 ξ; of 20,000 resamples of 10
    of those 30 draws none had a mean below 0.5 (0.6 % below 1.0)."""
    _one_fixed_dataset(10, 0.5)


@pytest.mark.slow
def test_the_stationarity_attack_on_one_fixed_dataset_at_scale():
    """30 default releases, MSE ≥ ξ (measured 2.51 ξ and 2.50 ξ in two runs)."""
    _one_fixed_dataset(30, 1.0)


def _same_w_other_y(X, Y, S, how, method="strong"):
    """Two releases that publish the same W from different raw outputs: Y with noise seed 3, and
    ``Y' = Y + Z₃ − Z₄`` with seed 4 (so ``W' = Y' + Z₄ = W``), Z the noise Lω plus the resolution noise τη (τ the
    precision floor here, the same for both); Y' differs from Y by the noise scale."""
    first = _new_release(X, Y, S, how, seed=3, method=method)
    zero = np.zeros_like(Y)
    # Σ of the first draw (the refit check may add noise to W after it, post-processing); it does not depend on Y
    Sigma = _new_release(X, Y, S, how, seed=3, method=method, refit_check=False, ledger=None).Sigma
    Y_other = Y + obfuscate(zero, Sigma, insecure_noise_seed=3) - obfuscate(zero, Sigma, insecure_noise_seed=4)
    Y_other += resolution_noise(len(Y), first.resolution, 3) - resolution_noise(len(Y), first.resolution, 4)
    second = _new_release(X, Y_other, S, how, seed=4, method=method, ledger=None)  # another owner's table
    return first, second, Y_other


@pytest.mark.parametrize("case", NEW_CASES, ids=list(NEW_CASES))
def test_the_release_is_a_function_of_w_and_public_inputs(tmp_path, case) -> None:
    """Raw outputs that differ by the noise scale but give the same W give the same published file: nothing in it
    tells the attacker more than W, so its best posterior variance at s is the released model's, ≥ the tolerance."""
    points, how, method = NEW_CASES[case]
    S = [[0.5], [0.3], [0.7]][:points]
    X, Y = _data()
    first, second, Y_other = _same_w_other_y(X, Y, S, how, method)
    assert np.max(np.abs(Y_other - Y)) > 0.1
    first.model.save(tmp_path / "a.npz")
    second.model.save(tmp_path / "b.npz")
    a, b = np.load(tmp_path / "a.npz"), np.load(tmp_path / "b.npz")
    assert set(a.files) == set(b.files)
    for key in a.files:
        if key == "spec":  # JSON with the kernel's values
            spec_a, spec_b = json.loads(str(a[key])), json.loads(str(b[key]))
            assert spec_a["mean_function"] == spec_b["mean_function"]
            for name in ("variance", "lengthscales"):
                np.testing.assert_allclose(spec_a["kernel"][name], spec_b["kernel"][name], rtol=1e-6)
        elif a[key].dtype.kind == "f":
            np.testing.assert_allclose(a[key], b[key], rtol=1e-6, atol=1e-9, err_msg=key)
        else:
            assert a[key] == b[key], key
    np.testing.assert_allclose(first.log_marginal_likelihood, second.log_marginal_likelihood, rtol=1e-8)
    np.testing.assert_array_less(first.tolerance * (1 - 1e-6), first.variance)


def test_control_the_old_fit_tells_the_two_datasets_apart() -> None:
    """The same pair through main's fit gives different published hyperparameters (which is what attack 2 uses)."""
    X, Y = _data()
    S = [[0.5]]
    _, _, Y_other = _same_w_other_y(X, Y, S, "public")
    fitted = []
    for outputs in (Y, Y_other):
        k = gpflow.kernels.SquaredExponential()
        gpr, _ = fit_hyperparameters((X, outputs), k)
        fitted.append([float(gpr.mean_function.c.numpy()[0]), float(k.lengthscales.numpy())])
    assert not np.allclose(fitted[0], fitted[1], rtol=1e-3)


def _write_csv(path, X, Y) -> None:
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([["x", "y"], *np.concatenate([X, Y], axis=1).tolist()])


CLI_DESIGN = ["--lengthscale", str(DESIGN[0]), "--variance", str(DESIGN[1]), "--noise-variance", str(DESIGN[2])]


def test_every_number_the_cli_publishes_is_a_function_of_w(tmp_path, monkeypatch, capsys) -> None:
    """End to end through ``gpflow-fed privacy``: with the OS noise replaced by seeded noise (for this test only),
    raw tables giving the same W give the same released.csv, model.npz, printed JSON and TensorBoard scalars."""
    X, Y = _data()
    S = np.array([[0.5]])
    # the Σ the command designs (the default θ range; the refit check may add noise to W after the first draw)
    k = _design_kernel()
    Sigma = release(
        (X, Y), S, ProportionalKernel(k, ALPHA), kernel=k, noise_variance=DESIGN[2], ledger=None, refit_check=False
    ).Sigma
    zero = np.zeros_like(Y)
    tables = {
        3: Y,
        4: Y + obfuscate(zero, Sigma, insecure_noise_seed=3) - obfuscate(zero, Sigma, insecure_noise_seed=4),
    }
    real = randomness.protective_rng
    outputs = {}
    for seed, outputs_y in tables.items():
        _write_csv(tmp_path / f"d{seed}.csv", X, outputs_y)
        calls = []  # W's own noise seeded per table; the refit check's draws (post-processing) the same for both

        def seeded(insecure_seed=None, s=seed, calls=calls):
            calls.append(s)
            return real(s if len(calls) == 1 else 99)

        monkeypatch.setattr(randomness, "protective_rng", seeded)
        argv = ["privacy", "--csv", str(tmp_path / f"d{seed}.csv"), "--target", "y", "--sensitive", "0.5"]
        argv += ["--alpha", str(ALPHA), *CLI_DESIGN, "--json", "--out", str(tmp_path / f"out{seed}")]
        argv += ["--ledger", str(tmp_path / f"ledger{seed}")]  # two owners' tables at the same inputs
        assert main(argv) == 0
        printed = json.loads(capsys.readouterr().out)
        outputs[seed] = (
            {k: v for k, v in printed.items() if isinstance(v, float)},
            np.loadtxt(tmp_path / f"out{seed}" / "released.csv", delimiter=",", skiprows=1),
            dict(np.load(tmp_path / f"out{seed}" / "model.npz")),
        )
    (json3, csv3, npz3), (json4, csv4, npz4) = outputs[3], outputs[4]
    assert json3.keys() == json4.keys() and len(json3) == 6  # with "resolution" (0 here: full-precision tables)
    np.testing.assert_allclose([json3[k] for k in json3], [json4[k] for k in json3], rtol=1e-8)
    np.testing.assert_allclose(csv3, csv4, rtol=1e-12, atol=1e-12)
    for key, value in npz3.items():
        if value.dtype.kind == "f":
            np.testing.assert_allclose(value, npz4[key], rtol=1e-8, atol=1e-12, err_msg=key)
    assert json3["min_sensitive_variance"] >= json3["min_tolerance"] * (1 - 1e-6)


# ---------------------------------------------------------------- attack 1: regenerate seeded noise


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
    out = _new_release(X, Y, [[0.5]], "public", seed=0, refit_check=False)  # W = Y + Z(seed 0) exactly
    assert not np.allclose(out.W, Y, atol=1e-3)
    assert _hits(_recover(out.W, out.Sigma), Y) == [0]


def test_guessing_seeds_does_not_denoise_a_default_release() -> None:
    X, Y = _data()
    k = _design_kernel()
    out = release((X, Y), [[0.5]], ProportionalKernel(k, ALPHA), kernel=k, noise_variance=DESIGN[2])
    assert not np.allclose(out.W, Y, atol=1e-3)
    assert _hits(_recover(out.W, out.Sigma), Y) == []
    with pytest.raises(TypeError):
        release((X, Y), [[0.5]], 0.1, kernel=k, noise_variance=1e-4, seed=0)  # no seed governs the noise any more


def test_guessing_seeds_does_not_denoise_the_cli_release(tmp_path) -> None:
    X, Y = _data()
    path = tmp_path / "data.csv"
    _write_csv(path, X, Y)
    out = tmp_path / "out"
    argv = ["privacy", "--csv", str(path), "--target", "y", "--sensitive", "0.5", "--alpha", str(ALPHA), *CLI_DESIGN]
    assert main([*argv, "--out", str(out)]) == 0
    W = np.loadtxt(out / "released.csv", delimiter=",", skiprows=1)[:, 1:]
    model = PrivacyAwareGPR.load(out / "model.npz")
    # Σ is published (model.npz): the design θ's, the default θ range's and any noise of the refit check
    Sigma = np.asarray(model.Sigma)
    assert not np.allclose(W, Y, atol=1e-3)
    assert _hits(_recover(W, Sigma), Y) == []
    with pytest.raises(SystemExit) as exc:  # the former "--seed" (default 0) is gone, not silently ignored
        main([*argv, "--seed", "0", "--out", str(tmp_path / "o2")])
    assert exc.value.code == 2

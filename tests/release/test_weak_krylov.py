"""The weak SDP (eq. 10) by certified block-Krylov reduction (gpflow_fed.release.weak) against the dense oracle."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.release import (
    CertifiedCovariance,
    LowRankCovariance,
    synthetic_noise_covariance,
    verify_privacy,
)
from gpflow_fed.release.lowrank import orthonormal_block
from gpflow_fed.release.sdp import solve_privacy_sdp
from gpflow_fed.release import weak as weak_module
from gpflow_fed.release.weak import (
    _lifted_lower_bound,
    _rank_one_lower_bound,
    _small_weak_barrier,
    _schur_inverse,
    _small_weak_sdp,
    solve_weak_krylov,
)

from tests.once import computed_once  # noqa: F401  (a fixture)

X9 = (np.arange(1, 10) / 10.0)[:, None]


def example_kernel():
    return gpflow.kernels.SquaredExponential(lengthscales=1.0 / np.sqrt(20.0))


def problem(kernel, N, gamma, noise, xi, seed):
    rng = np.random.default_rng(seed)
    X = np.sort(rng.uniform(0.0, 1.0, (N, 1)), axis=0)
    S = rng.uniform(0.1, 0.9, (gamma, 1))
    return X, S


# Several kernels, noise levels, γ and tolerances; N ≤ 24 keeps the dense oracle to about a second each.
CASES = [
    (gpflow.kernels.SquaredExponential(lengthscales=0.2), 20, 1, 1e-2, 0.5),
    (gpflow.kernels.SquaredExponential(lengthscales=0.1), 24, 3, 1e-3, 0.7),
    (gpflow.kernels.Matern52(lengthscales=0.3), 22, 2, 0.1, 0.3),
    (gpflow.kernels.Matern32(variance=2.0, lengthscales=0.25), 18, 3, 1e-4, 1.2),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_equals_dense_sdp_and_certificate(case):
    kernel, N, gamma, noise, xi = CASES[case]
    X, S = problem(kernel, N, gamma, noise, xi, seed=case)
    dense = synthetic_noise_covariance(kernel, X, S, xi, noise_variance=noise, method="weak", solver="dense")
    red = synthetic_noise_covariance(kernel, X, S, xi, noise_variance=noise, method="weak")
    assert isinstance(red, CertifiedCovariance) and isinstance(red, LowRankCovariance)
    t_dense, t_red = float(np.trace(dense)), red.trace()
    assert abs(t_red - t_dense) <= 1e-6 * t_dense
    c = red.certificate
    assert c.objective == pytest.approx(t_red, rel=1e-12)
    assert c.lower_bound <= c.objective
    assert c.relative_gap == pytest.approx((c.objective - c.lower_bound) / c.objective, rel=1e-9)
    assert c.relative_gap <= 1e-6
    assert c.lower_bound <= t_dense * (1 + 1e-8)  # the bound holds for the true optimum too
    assert red.rank <= c.krylov_dimension <= N and c.steps >= 1 and c.seconds > 0
    check = verify_privacy(kernel, X, S, xi, red, noise_variance=noise)
    assert check.weak_margin >= -1e-9 * xi
    assert c.feasibility_margin == pytest.approx(check.weak_margin, abs=1e-8)
    if gamma == 1:  # one sensitive input: weak and strong coincide
        strong = synthetic_noise_covariance(kernel, X, S, xi, noise_variance=noise)
        assert t_red == pytest.approx(float(np.trace(np.asarray(strong))), rel=1e-6)


def test_example_2_and_theorem_2():
    k = example_kernel()
    S = np.array([[0.4], [0.6]])
    weak = synthetic_noise_covariance(k, X9, S, 0.5, method="weak")
    assert weak.trace() == pytest.approx(5.32992, rel=1e-5)
    assert weak.certificate.relative_gap <= 1e-6
    assert verify_privacy(k, X9, S, 0.5, weak).weak_margin >= -1e-9
    for c in (0.45, 0.5, 0.3):  # Theorem 2: tr Σ_weak ≤ tr Σ_strong for Ξ with diagonal ξ
        strong = synthetic_noise_covariance(k, X9, S, np.array([[0.5, c], [c, 0.5]]))
        assert weak.trace() <= float(np.trace(np.asarray(strong))) * (1 + 1e-9)


def test_theorem_2_on_a_larger_problem():
    k = gpflow.kernels.SquaredExponential(lengthscales=0.3)
    X = np.linspace(0, 3, 120)[:, None]
    S = np.array([[0.5], [1.2], [2.4]])
    weak = synthetic_noise_covariance(k, X, S, 0.4, noise_variance=0.01, method="weak")
    strong = synthetic_noise_covariance(k, X, S, 0.4, noise_variance=0.01)
    assert weak.certificate.relative_gap <= 1e-6
    assert weak.trace() <= float(np.trace(np.asarray(strong))) * (1 + 1e-9)
    assert verify_privacy(k, X, S, 0.4, weak, noise_variance=0.01).weak_margin >= -1e-9


def test_reduction_is_exact_for_any_basis_containing_B():
    """bᵢᵀ(C + QSQᵀ)⁻¹bᵢ = hᵢᵀ(S + G⁻¹)⁻¹hᵢ with hᵢ = Qᵀbᵢ, G = QᵀC⁻¹Q (the congruence of the module doc)."""
    rng = np.random.default_rng(3)
    k = gpflow.kernels.Matern52(lengthscales=0.2)
    X = rng.uniform(0, 1, (30, 1))
    C = k.K(X).numpy() + 0.05 * np.eye(30)
    B = k.K(X, np.array([[0.3], [0.7]])).numpy()
    Q = orthonormal_block(np.concatenate([B, rng.standard_normal((30, 5))], axis=1), None, 1.0)
    A = rng.standard_normal((Q.shape[1], Q.shape[1]))
    S = A @ A.T
    Ginv = _schur_inverse(np.linalg.cholesky(C), Q)
    full = np.einsum("ni,ni->i", B, np.linalg.solve(C + Q @ S @ Q.T, B))
    H = Q.T @ B
    reduced = np.einsum("ni,ni->i", H, np.linalg.solve(S + Ginv, H))
    np.testing.assert_allclose(reduced, full, rtol=1e-10)


def test_lifted_bound_is_below_the_optimum_in_a_small_space():
    k = gpflow.kernels.SquaredExponential(lengthscales=0.1)
    X, S = problem(k, 24, 2, 1e-3, 0.5, seed=7)
    C = k.K(X).numpy() + 1e-3 * np.eye(24)
    B, m = k.K(X, S).numpy(), np.full(2, 0.5)
    optimum = float(np.trace(solve_privacy_sdp(C, B, m)[0]))
    Q = orthonormal_block(B, None, 1.0)  # k = γ: far from converged
    Ginv = _schur_inverse(np.linalg.cholesky(C), Q)
    Sred, Y, nu = _small_weak_sdp(Ginv, Q.T @ B, m)
    lower = _lifted_lower_bound(Y, nu, Q.T @ C @ Q, Q.T @ B, m)
    assert lower <= optimum <= float(np.trace(Sred)) * (1 + 1e-8)
    assert float(np.trace(Sred)) > optimum * (1 + 1e-4)  # the one-block space is really too small here


def test_no_noise_needed_gives_zero():
    k = example_kernel()
    Sigma = synthetic_noise_covariance(k, X9, [[0.45]], 1e-6, noise_variance=0.5, method="weak")
    assert Sigma.rank == 0 and Sigma.trace() == 0.0
    assert Sigma.certificate.relative_gap == 0.0 and Sigma.certificate.feasibility_margin > 0


def test_bad_inputs():
    k = example_kernel()
    C, B = k.K(X9).numpy() + 0.01 * np.eye(9), k.K(X9, [[0.5]]).numpy()
    with pytest.raises(ValueError, match="mᵢ"):
        solve_weak_krylov(C, B, np.array([0.0]))
    with pytest.raises(ValueError, match="gap_rtol"):
        solve_weak_krylov(C, B, np.array([0.5]), gap_rtol=0.0)
    with pytest.raises(ValueError, match="max_dimension"):
        solve_weak_krylov(C, B, np.array([0.5]), max_dimension=0)
    with pytest.raises(ValueError, match="finite"):
        solve_weak_krylov(C, B * np.nan, np.array([0.5]))
    # K + V singular (a duplicated input, V = 0): the reduction needs C ≻ 0 and says so.
    Xd = np.concatenate([X9, X9[:1]])
    with pytest.raises(ValueError, match="noise_variance > 0"):
        synthetic_noise_covariance(k, Xd, [[0.5]], 0.5, method="weak")
    # A space too small to certify: the message names the gap and margin reached and the fix.
    k2 = gpflow.kernels.SquaredExponential(lengthscales=0.1)
    X, S = problem(k2, 24, 2, 1e-3, 0.5, seed=7)
    with pytest.raises(ValueError, match=r"relative gap .* feasibility margin .* raise max_dimension"):
        solve_weak_krylov(k2.K(X).numpy() + 1e-3 * np.eye(24), k2.K(X, S).numpy(), np.full(2, 0.5), max_dimension=2)
    with pytest.raises(ValueError, match="unknown solver"):
        synthetic_noise_covariance(k, X9, [[0.5]], 0.5, method="weak", solver="MOSEK")
    with pytest.raises(ValueError, match="solver='krylov' applies to method='weak'"):
        synthetic_noise_covariance(k, X9, [[0.5]], 0.5, method="diagonal", solver="krylov")


def test_release_uses_the_certified_path():
    from gpflow_fed.models.privacy_aware_gpr import release

    k = gpflow.kernels.SquaredExponential(lengthscales=0.2)
    X = np.linspace(0, 1, 25)[:, None]
    Y = np.sin(6 * X)
    result = release((X, Y), np.array([[0.5], [0.7]]), 0.6, kernel=k, method="weak", noise_variance=1e-3)
    # the design θ's Σ is certified; the default θ range and the refit check add to it
    assert result.certificate is not None and result.certificate.relative_gap <= 1e-6
    # 0.5 is a training input: its record is protected (Var[Y | W]); 0.7 is not, so f(0.7) is
    assert result.targets.records.tolist() == [12, -1]
    var = np.diag(result.model.protected_covariance(result.targets.points, result.targets.records).numpy())
    assert np.all(var >= 0.6 * (1 - 1e-9))
    from gpflow_fed.release import Interval, ProportionalKernel

    region = release(
        (X, Y),
        Interval(0.4, 0.6),
        ProportionalKernel(k, 0.5),
        kernel=k,
        density=50,
        method="weak",
        noise_variance=1e-3,
        ledger=None,  # a fresh release of the same rows, for this test only
    )
    # 11 grid points and the 5 records inside [0.4, 0.6] (0.5 is both): every record there is protected
    assert region.certificate is not None and region.sensitive.shape[0] == 15
    assert region.targets.num_records == 5 and len(set(region.targets.records[region.targets.records >= 0])) == 5
    var = np.diag(region.model.protected_covariance(region.targets.points, region.targets.records).numpy())
    assert np.all(var >= 0.5 * float(k.variance.numpy()) * (1 - 1e-9))
    with pytest.raises(ValueError, match="'strong' or 'weak'"):
        release(
            (X, Y),
            Interval(0.4, 0.6),
            ProportionalKernel(k, 0.5),
            kernel=k,
            density=50,
            method="diagonal",
            noise_variance=1e-3,
        )


def test_weak_region_and_cli(tmp_path, capsys):
    import csv

    from gpflow_fed.cli import main
    from gpflow_fed.release import Interval, ProportionalKernel, region_noise_covariance

    k = gpflow.kernels.SquaredExponential(lengthscales=0.15)
    X = np.linspace(0, 1, 30)[:, None]
    H = ProportionalKernel(k, 0.5)
    weak = region_noise_covariance(k, X, Interval(0.4, 0.6), H, density=100, noise_variance=1e-3, method="weak")
    strong = region_noise_covariance(k, X, Interval(0.4, 0.6), H, density=100, noise_variance=1e-3)
    grid = Interval(0.4, 0.6).discretise(100)
    inside = X[(X[:, 0] >= 0.4) & (X[:, 0] <= 0.6)]  # 6 records, none on the grid: 27 sensitive inputs
    assert isinstance(weak, CertifiedCovariance) and weak.certificate.krylov_dimension < grid.shape[0] + len(inside)
    assert verify_privacy(k, X, grid, H, weak, noise_variance=1e-3).weak_margin >= -1e-9
    assert verify_privacy(k, X, inside, H, weak, noise_variance=1e-3).weak_margin >= -1e-9  # Var[Y_j | W] there
    assert weak.trace() <= float(np.trace(np.asarray(strong))) * (1 + 1e-9)  # Theorem 2 on the grid
    with pytest.raises(ValueError, match="method='strong' or 'weak'"):
        region_noise_covariance(k, X, Interval(0.4, 0.6), H, density=10, method="diagonal")
    path = tmp_path / "data.csv"
    with open(path, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["t", "y"])
        writer.writerows(zip(X[:, 0], np.sin(6 * X[:, 0])))
    rc = main(
        [
            "privacy",
            "--csv",
            str(path),
            "--target",
            "y",
            "--lengthscale",
            "0.15",
            "--variance",
            "1",
            "--sensitive",
            "0.4,0.6",
            "--tolerance",
            "0.3",
            "--method",
            "weak",
            "--noise-variance",
            "1e-3",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert rc == 0
    assert "relative gap" in capsys.readouterr().out


def _full_problem(seed=3, N=40, gamma=4):
    """The weak SDP (C, B, m) that :func:`_reduced_problem` reduces."""
    k = gpflow.kernels.SquaredExponential(lengthscales=0.15)
    X, S = problem(k, N, gamma, 1e-3, 0.5, seed=seed)
    return k.K(X).numpy() + 1e-3 * np.eye(N), k.K(X, S).numpy(), np.full(gamma, 0.5)


def _reduced_problem(steps, seed=3, N=40, gamma=4):
    """A reduced weak SDP (G⁻¹, H, m, T) after ``steps`` Krylov blocks."""
    C, B, m = _full_problem(seed, N, gamma)
    Q = orthonormal_block(B, None, 1.0)
    for _ in range(steps - 1):
        Q = np.concatenate([Q, orthonormal_block(C @ Q[:, -gamma:], Q, 1.0)], axis=1)
    Ginv = _schur_inverse(np.linalg.cholesky(C), Q)
    return Ginv, Q.T @ B, m, Q.T @ C @ Q


@pytest.fixture(scope="module")
def full_optimum(computed_once) -> float:
    """The full-dimensional oracle optimum of :func:`_full_problem` (a dense SDP solve, about 7 s of CPU): the same
    for every number of Krylov steps, so solved once per session (``tests/once.py``), not once per step count."""
    return computed_once(
        "test_weak_krylov-full-optimum", lambda: float(np.trace(solve_privacy_sdp(*_full_problem())[0]))
    )


@pytest.mark.parametrize("steps", [1, 3])
def test_barrier_matches_clarabel_on_the_reduced_sdp(steps, full_optimum):
    Ginv, H, m, T = _reduced_problem(steps)
    optimum = full_optimum
    S_bar, U = _small_weak_barrier(Ginv, H, m)
    S_cla, _, _ = _small_weak_sdp(Ginv, H, m)
    assert float(np.trace(S_bar)) == pytest.approx(float(np.trace(S_cla)), rel=1e-7)
    # strictly feasible: S ≻ 0 and every reduced constraint hᵢᵀ(S + G⁻¹)⁻¹hᵢ < mᵢ
    assert np.linalg.eigvalsh(S_bar)[0] > 0
    np.testing.assert_array_less(np.einsum("ki,ki->i", H, np.linalg.solve(S_bar + Ginv, H)), m)
    np.testing.assert_allclose(U, np.linalg.solve(S_bar + Ginv, H), rtol=1e-8, atol=1e-12)
    lower = _rank_one_lower_bound(U, Ginv, T, H, m)
    assert lower <= optimum * (1 + 1e-10) <= float(np.trace(S_bar)) * (1 + 1e-8)
    if steps == 3:  # converged space: the rank-one dual certifies the optimum
        assert (float(np.trace(S_bar)) - lower) / float(np.trace(S_bar)) <= 1e-6


def test_small_solvers_agree_and_fallback_certifies(monkeypatch):
    k = gpflow.kernels.Matern52(lengthscales=0.2)
    X, S = problem(k, 60, 5, 1e-2, 0.6, seed=11)
    C, B, m = k.K(X).numpy() + 1e-2 * np.eye(60), k.K(X, S).numpy(), np.full(5, 0.4)
    bar = solve_weak_krylov(C, B, m)
    cla = solve_weak_krylov(C, B, m, small_solver="clarabel")
    assert bar.trace() == pytest.approx(cla.trace(), rel=1e-6)
    for sigma in (bar, cla):
        assert sigma.certificate.relative_gap <= 1e-6 and sigma.certificate.feasibility_margin >= -1e-9
    calls = []
    original = weak_module._small_weak_sdp
    monkeypatch.setattr(weak_module, "_small_weak_sdp", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(weak_module, "BARRIER_MAX_NEWTON", 1)  # every centring stage "stalls"
    fallback = solve_weak_krylov(C, B, m)
    assert calls and fallback.trace() == pytest.approx(cla.trace(), rel=1e-9)
    assert fallback.certificate.relative_gap <= 1e-6
    with pytest.raises(ValueError, match="small_solver"):
        solve_weak_krylov(C, B, m, small_solver="scs")


def test_an_earlier_release_meeting_the_floor_to_round_off_needs_no_more_noise():
    """C = K + Σ₁ of an earlier release that meets the floor exactly: the slack mᵢ − bᵢᵀC⁻¹bᵢ is round-off, of
    either sign. Σ_Δ = 0 is the optimum and is returned as such (on an AMD BLAS kernel the Krylov solve of that
    round-off problem once ended with a relative gap of 1.24, refusing a release that needed nothing)."""
    X = np.linspace(0.0, 1.0, 15)[:, None]
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.2)
    C = kernel(X, full_cov=True).numpy() + 0.1 * np.eye(15)
    b = kernel(X, np.array([[0.5]])).numpy()
    need = float(b[:, 0] @ np.linalg.solve(C, b[:, 0]))
    for m in (need * (1 - 1e-12), need * (1 + 1e-12)):
        Sigma = solve_weak_krylov(C, b, np.array([m]))
        assert Sigma.eigenvalues.size == 0 and Sigma.certificate.relative_gap == 0.0
    assert solve_weak_krylov(C, b, np.array([need * (1 - 1e-3)])).certificate.objective > 0  # control: a shortfall

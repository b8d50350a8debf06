"""Privacy-aware GP release (Tuo & Bhattacharya): closed forms, SDPs, theorems, examples, regions, errors."""

import warnings

import gpflow
import numpy as np
import pytest

from gpflow_fed.release import (
    Interval,
    LowRankCovariance,
    ProportionalKernel,
    RegionUnion,
    check_tolerance_kernel,
    gaussian_tolerance_kernel,
    obfuscate,
    posterior_covariance,
    refine_region,
    region_noise_covariance,
    synthetic_noise_covariance,
    uniform_privacy_covariance,
    verify_privacy,
)
from gpflow_fed.release.lowrank import _galerkin_margin, krylov_positive_part, min_eigenvalue_lower_bound
from gpflow_fed.release.obfuscation import strong_factor
from gpflow_fed.release.regions import pivoted_region_factor

X9 = (np.arange(1, 10) / 10.0)[:, None]


def example_kernel():
    """K(x, y) = exp(−10 (x − y)²) of Examples 1–2 (lengthscale 1/√20)."""
    return gpflow.kernels.SquaredExponential(lengthscales=1.0 / np.sqrt(20.0))


def assert_psd(S, tol=1e-10):
    dense = np.asarray(S)
    np.testing.assert_allclose(dense, dense.T, atol=1e-12)
    assert np.linalg.eigvalsh(dense)[0] >= -tol * max(1.0, np.abs(dense).max())


def test_example_1_strong_and_diagonal():
    k = example_kernel()
    Sigma = synthetic_noise_covariance(k, X9, [[0.5]], 0.5, protect="latent")
    assert_psd(Sigma)
    assert np.trace(Sigma) == pytest.approx(3.545614, abs=1e-6)
    var = posterior_covariance(k, X9, np.array([[0.5]]), Sigma)[0, 0]
    assert var == pytest.approx(0.5, abs=1e-8)
    D = synthetic_noise_covariance(k, X9, [[0.5]], 0.5, method="diagonal", protect="latent")
    assert np.count_nonzero(D - np.diag(np.diag(D))) == 0
    assert np.trace(D) == pytest.approx(20.0729, rel=1e-5)
    assert posterior_covariance(k, X9, np.array([[0.5]]), D)[0, 0] >= 0.5 - 1e-8


def test_example_2_weak_strong_and_theorem_2():
    k = example_kernel()
    S = np.array([[0.4], [0.6]])
    weak = synthetic_noise_covariance(k, X9, S, 0.5, method="weak", protect="latent")
    assert_psd(weak)
    assert np.trace(weak) == pytest.approx(5.32992, rel=1e-5)
    assert verify_privacy(k, X9, S, 0.5, weak, protect="latent").weak_margin >= -1e-8
    for c, expected in [(0.45, 5.5883), (0.5, 6.1367), (0.3, 6.4111)]:
        Xi = np.array([[0.5, c], [c, 0.5]])
        strong = synthetic_noise_covariance(k, X9, S, Xi, protect="latent")
        assert np.trace(strong) == pytest.approx(expected, abs=1e-4)
        assert np.trace(weak) <= np.trace(strong) + 1e-7  # Theorem 2(1)
        check = verify_privacy(k, X9, S, Xi, strong, protect="latent")
        assert check.strong_margin >= -1e-8 and check.weak_margin >= -1e-8


def test_example_3_validity_range():
    k = gpflow.kernels.SquaredExponential(lengthscales=0.5)  # θ₀ = 2
    H = gaussian_tolerance_kernel(k, c=0.25, theta=1.0, input_dim=1)  # c²θ₀ = 0.125 ≤ 1 ≤ 2
    np.testing.assert_allclose(H.K(np.zeros((1, 1)), np.ones((1, 1))).numpy(), 0.25 * np.exp(-1.0))
    gaussian_tolerance_kernel(k, c=0.5, theta=0.5, input_dim=1)  # boundary θ = c^{2/d} θ₀ is valid
    for c, theta in [(1.0, 1.0), (0.5, 2.5), (0.5, 0.4), (-0.1, 1.0)]:
        with pytest.raises(ValueError, match="invalid .c, θ."):
            gaussian_tolerance_kernel(k, c=c, theta=theta, input_dim=1)
    # In d = 2 the lower end is c^{2/d} θ₀ = c θ₀.
    with pytest.raises(ValueError, match="choose"):
        gaussian_tolerance_kernel(k, c=0.5, theta=0.9, input_dim=2)
    gaussian_tolerance_kernel(k, c=0.5, theta=1.0, input_dim=2)
    # A valid H gives K_SS − H_SS ≻ 0 at any S, and the strong guarantee for random β.
    rng = np.random.default_rng(0)
    X = np.sort(rng.uniform(0, 3, (25, 1)), 0)
    S = np.array([[0.7], [0.9], [1.3], [2.2]])
    Sigma = synthetic_noise_covariance(k, X, S, H, noise_variance=1e-3)
    cov = posterior_covariance(k, X, S, Sigma, 1e-3)
    Xi = H.K(S).numpy()
    for beta in rng.standard_normal((200, 4)):
        assert beta @ cov @ beta >= beta @ Xi @ beta - 1e-8


def test_strong_guarantee_for_random_beta_and_all_methods_psd():
    rng = np.random.default_rng(1)
    k = gpflow.kernels.Matern52(variance=1.7, lengthscales=0.6)
    X = rng.uniform(-2, 2, (30, 2))
    S = rng.uniform(-2, 2, (3, 2))
    H = ProportionalKernel(k, 0.6)
    Sigma = synthetic_noise_covariance(k, X, S, H, noise_variance=0.05)
    assert_psd(Sigma)
    cov = posterior_covariance(k, X, S, Sigma, 0.05)
    Xi = 0.6 * k.K(S).numpy()
    betas = rng.standard_normal((500, 3))
    assert np.all(np.einsum("bi,ij,bj->b", betas, cov - Xi, betas) >= -1e-8)
    for method in ("weak", "diagonal"):
        Sw = synthetic_noise_covariance(k, X, S, np.full(3, 0.9), noise_variance=0.05, method=method)
        assert_psd(Sw)
        assert np.all(np.diag(posterior_covariance(k, X, S, Sw, 0.05)) >= 0.9 - 1e-8)


def test_theorem_1_minimum_trace_against_random_feasible_perturbations():
    rng = np.random.default_rng(2)
    k = example_kernel()
    S = np.array([[0.35], [0.62]])
    Xi = np.array([[0.4, 0.2], [0.2, 0.4]])
    Sigma = synthetic_noise_covariance(k, X9, S, Xi, protect="latent")
    Kss, Kxs, Kxx = k.K(S).numpy(), k.K(X9, S).numpy(), k.K(X9).numpy()
    A = Kxs @ np.linalg.solve(Kss - Xi, Kxs.T) - Kxx
    tried = 0
    for _ in range(300):
        G = rng.standard_normal((9, 9)) * rng.uniform(1e-4, 1.0)
        E = G @ G.T
        # (A + E)⁺ ⪰ A + E ⪰ A and ⪰ 0: feasible for (11), in random directions and sizes down to 1e-8.
        lam, vecs = np.linalg.eigh(A + E)
        candidate = (vecs * np.clip(lam, 0, None)) @ vecs.T
        assert np.linalg.eigvalsh(candidate - A)[0] >= -1e-10
        tried += 1
        assert np.trace(candidate) >= np.trace(Sigma) - 1e-10
    assert tried == 300
    # Shrinking the optimum in any eigen-direction it uses makes it infeasible.
    lam, vecs = np.linalg.eigh(Sigma)
    shrunk = Sigma - 1e-3 * lam[-1] * np.outer(vecs[:, -1], vecs[:, -1])
    assert np.linalg.eigvalsh(shrunk - A)[0] < 0


def test_scalar_tolerance_with_several_inputs_must_not_build_invalid_xi():
    k = example_kernel()
    S = np.array([[0.40], [0.41]])
    with pytest.raises(ValueError, match="diag\\(ξ\\).*ProportionalKernel"):
        synthetic_noise_covariance(k, X9, S, 0.5, protect="latent")
    # The weak method accepts the same request.
    W = synthetic_noise_covariance(k, X9, S, 0.5, method="weak", protect="latent")
    assert verify_privacy(k, X9, S, 0.5, W, protect="latent").weak_margin >= -1e-8


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sensitive=[[0.5]], tolerance=1.0), "≥ the prior variance"),
        (dict(sensitive=[[0.5]], tolerance=-0.1), "negative tolerance"),
        (dict(sensitive=[[0.4], [0.6]], tolerance=np.array([[0.5, 0.6], [0.6, 0.5]])), "Ξ is not positive semi-def"),
        (dict(sensitive=[[0.4], [0.6]], tolerance=np.array([[0.5, 0.1], [0.1, 0.5]])), "K_SS − Ξ is not positive def"),
        (dict(sensitive=[[0.4, 0.1]], tolerance=0.5), "sensitive inputs have 2 columns"),
        (dict(sensitive=[[0.5]], tolerance=0.5, method="exact"), "unknown method"),
        (dict(sensitive=[[0.4], [0.6]], tolerance=[0.1, 0.2, 0.3]), "3 entries but there are 2"),
    ],
)
def test_bad_input_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        synthetic_noise_covariance(example_kernel(), X9, **kwargs)


def test_kernel_tolerance_errors():
    k = example_kernel()
    with pytest.raises(ValueError, match="0 < α < 1"):
        ProportionalKernel(k, 1.0)
    big = gpflow.kernels.Matern32(variance=0.5, lengthscales=0.05)
    with pytest.raises(ValueError, match="K − H at the sensitive inputs is not positive definite"):
        check_tolerance_kernel(k, big, np.array([[0.4], [0.6]]))
    with pytest.raises(ValueError, match="not positive definite"):
        synthetic_noise_covariance(k, X9, np.array([[0.4], [0.6]]), big, protect="latent")
    with pytest.raises(TypeError, match="SquaredExponential"):
        gaussian_tolerance_kernel(gpflow.kernels.Matern52(), 0.1, 1.0, 1)


def test_unknown_solver_infeasible_and_failed_sdp_raise(monkeypatch):
    """Eq. 10 is always feasible (Σ = cI for c large), so a non-optimal status or a solver failure can only come
    from the solver; both paths are forced here and must raise the ValueError that names the status and a fix."""
    import cvxpy as cp

    from gpflow_fed.release import solve_privacy_sdp

    k = example_kernel()
    args = (k.K(X9).numpy() + 0.01 * np.eye(9), k.K(X9, [[0.5]]).numpy(), np.array([0.5]))
    with pytest.raises(ValueError, match="unknown SDP solver"):
        solve_privacy_sdp(*args, solver="MOSEK")
    Sigma, info = solve_privacy_sdp(*args)  # the real solve: optimal
    assert info.status == cp.OPTIMAL and np.isfinite(Sigma).all()

    def infeasible(self, *a, **kw):
        self._status = cp.INFEASIBLE

    monkeypatch.setattr(cp.Problem, "solve", infeasible)
    with pytest.raises(ValueError, match="the privacy SDP is infeasible .*method='strong'"):
        solve_privacy_sdp(*args)

    def failing(self, *a, **kw):
        raise cp.error.SolverError("numerical trouble")

    monkeypatch.setattr(cp.Problem, "solve", failing)
    with pytest.raises(ValueError, match="failed in SCS .*numerical trouble"):
        solve_privacy_sdp(*args, solver="SCS")


def _strong_problem(k, X, S, alpha):
    KSS = k.K(S).numpy()
    return strong_factor(k.K(X, S).numpy(), KSS, alpha * KSS), k.K(X).numpy()


def _cholesky_margin(B, KXX, v, Sigma):
    """Oracle: λ_min(I − Bᵀ(K + V + Σ)⁻¹B) by a dense Cholesky."""
    L = np.linalg.cholesky(KXX + np.diag(v) + np.asarray(Sigma))
    Y = np.linalg.solve(L, B)
    return np.linalg.eigvalsh(np.eye(B.shape[1]) - Y.T @ Y)[0]


def test_low_rank_matches_dense_and_certificate_is_rigorous():
    rng = np.random.default_rng(3)
    k = gpflow.kernels.SquaredExponential(lengthscales=0.4)
    X = np.sort(rng.uniform(0, 10, (400, 1)), 0)
    S = np.linspace(0.5, 9.5, 8)[:, None]
    H = ProportionalKernel(k, 0.5)
    dense = synthetic_noise_covariance(k, X, S, H, noise_variance=0.01, low_rank=False)
    low = synthetic_noise_covariance(k, X, S, H, noise_variance=0.01, low_rank=True)
    assert isinstance(low, LowRankCovariance) and low.rank == 8
    assert np.linalg.norm(np.asarray(low) - dense) <= 1e-10 * np.linalg.norm(dense)
    assert low.trace() == pytest.approx(np.trace(dense), rel=1e-12)
    assert verify_privacy(k, X, S, H, low, noise_variance=0.01).strong_margin >= -1e-8
    # The automatic rule picks the O(N²γ) path here (N ≥ 200, γ ≤ N/5, V > 0).
    assert isinstance(synthetic_noise_covariance(k, X, S, H, noise_variance=0.01), LowRankCovariance)
    # The Krylov space from the start block B needs few steps, and the O(N k²) certificate is a lower bound on
    # the exact margin (dense Cholesky oracle).
    B, KXX = _strong_problem(k, X, S, 0.5)
    v = np.full(400, 0.01)
    Sigma, info = krylov_positive_part(B, KXX, v)
    assert info.converged and info.basis_size <= 10 * 8 and info.max_residual <= 1e-10
    exact = _cholesky_margin(B, KXX, v, Sigma)
    assert info.certified_margin <= exact + 1e-12 and info.certified_margin >= -1e-9
    # The certificate catches a missing direction: drop the smallest positive eigenpair and it fails.
    i = np.argsort(Sigma.eigenvalues)[1:]
    short = LowRankCovariance(Sigma.eigenvalues[i], Sigma.eigenvectors[:, i])
    blocks = [B]
    for _ in range(info.steps - 1):
        blocks.append(KXX @ blocks[-1])
    Q, _ = np.linalg.qr(np.concatenate(blocks, axis=1))
    W = Q.T @ short.eigenvectors
    np.testing.assert_allclose(Q @ W, short.eigenvectors, atol=1e-8)  # Σ lies in the Krylov space
    certified = _galerkin_margin(
        B, Q, KXX @ Q + v[:, None] * Q, W, short.eigenvalues, min_eigenvalue_lower_bound(KXX, v)
    )
    assert certified <= _cholesky_margin(B, KXX, v, short) + 1e-12 < -1e-6


def test_low_rank_repeated_eigenvalues_and_zero_noise_fallbacks():
    # Nearly diagonal K with sensitive training inputs: one positive eigenvalue of multiplicity γ, found in one
    # block run; V = 0 but K is diagonally dominant, so Gershgorin gives the certificate's bound.
    k2 = gpflow.kernels.SquaredExponential(lengthscales=1e-3)
    X2 = np.linspace(0, 3, 200)[:, None]
    S2 = X2[60:66]
    H2 = ProportionalKernel(k2, 0.5)
    dense2 = synthetic_noise_covariance(k2, X2, S2, H2, low_rank=False)
    low2 = synthetic_noise_covariance(k2, X2, S2, H2, low_rank=True)
    assert low2.rank == 6
    np.testing.assert_allclose(low2.eigenvalues, np.full(6, 1.0), rtol=1e-10)  # (2 − 1): B Bᵀ = 2 e_S e_Sᵀ
    np.testing.assert_allclose(np.asarray(low2), dense2, atol=1e-12)
    B2, K2 = _strong_problem(k2, X2, S2, 0.5)
    _, info2 = krylov_positive_part(B2, K2, np.zeros(200))
    assert info2.certified_margin is not None and info2.certified_margin >= -1e-9
    assert verify_privacy(k2, X2, S2, H2, low2).strong_margin >= -1e-8
    # V = 0 and a smooth kernel: no bound on λ_min(K), so the result is certified by one Cholesky instead.
    k3 = gpflow.kernels.SquaredExponential(lengthscales=0.3)
    X3 = np.linspace(0, 10, 60)[:, None]
    S3 = np.array([[2.05], [7.3]])
    B3, K3 = _strong_problem(k3, X3, S3, 0.5)
    assert min_eigenvalue_lower_bound(K3, np.zeros(60)) <= 0
    Sigma3, info3 = krylov_positive_part(B3, K3, np.zeros(60))
    assert info3.converged and info3.certified_margin is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        low3 = synthetic_noise_covariance(k3, X3, S3, ProportionalKernel(k3, 0.5), low_rank=True)
    np.testing.assert_allclose(
        np.asarray(low3), synthetic_noise_covariance(k3, X3, S3, ProportionalKernel(k3, 0.5), low_rank=False), atol=1e-9
    )


def test_obfuscate_follows_sigma_and_draws_from_the_os():
    k = example_kernel()
    Sigma = synthetic_noise_covariance(k, X9, [[0.5]], 0.5, protect="latent")
    Y = np.sin(X9)
    # by default two releases of the same data differ (OS randomness); only the test-only seed repeats a draw
    assert not np.allclose(obfuscate(Y, Sigma), obfuscate(Y, Sigma))
    W1, W2 = obfuscate(Y, Sigma, insecure_noise_seed=7), obfuscate(Y, Sigma, insecure_noise_seed=7)
    np.testing.assert_array_equal(W1, W2)
    assert not np.allclose(obfuscate(Y, Sigma, insecure_noise_seed=8), W1)
    with pytest.raises(TypeError):
        obfuscate(Y, Sigma, 7)  # the former positional seed is refused, not silently used
    with pytest.raises(TypeError, match="must be None"):
        obfuscate(Y, Sigma, insecure_noise_seed=True)
    with pytest.raises(ValueError, match="must be a non-negative int"):
        obfuscate(Y, Sigma, insecure_noise_seed=-1)
    # Z lies in the range of Σ (no noise in its null space) ...
    lam, vecs = np.linalg.eigh(Sigma)
    small = lam < 1e-10 * lam.max()
    assert np.all(np.abs(vecs[:, small].T @ (W1 - Y))[:, 0] <= 6 * np.sqrt(np.clip(lam[small], 0, None)) + 1e-12)
    # ... and has covariance Σ: 20,000 columns; the standard error of each entry is ≤ √(2/20000)·max λ.
    Z = obfuscate(np.zeros((9, 20000)), Sigma)
    np.testing.assert_allclose(np.cov(Z), Sigma, atol=6 * np.sqrt(2 / 20000) * lam.max())
    with pytest.raises(ValueError, match="Sigma is 9×9 but Y has 3 rows"):
        obfuscate(np.zeros(3), Sigma)
    with pytest.raises(ValueError, match="Sigma is not positive semi-definite"):
        obfuscate(np.zeros(9), -np.eye(9))


def test_regions_refinement_and_uniform_solution():
    k = example_kernel()
    H = ProportionalKernel(k, 0.5)
    result = refine_region(k, X9, Interval(0.3, 0.5), H, density=5.0, rtol=1e-4, max_refinements=5)
    assert result.converged and result.num_points[:3] == [2, 3, 5]
    # Nested pivot sets: the traces never decrease (Theorem 3) and stay below tr G(ℝ) − tr K = tr K_XX = 9.
    assert np.all(np.diff(result.traces) >= -1e-10 * result.traces[-1])
    assert result.traces[-1] <= 9.0
    # While K_SS is well conditioned they equal the exact values (80-digit mpmath: 5 grid points → 7.70480663752).
    assert result.traces[2] == pytest.approx(7.70480663752, rel=1e-9)
    # On a well-conditioned grid the pivoted factor keeps every point and equals the closed form (eq. 12).
    S3 = Interval(0.3, 0.5).discretise(10.0)
    M3 = 0.5 * k.K(S3).numpy()
    B3, P3 = pivoted_region_factor(k.K(X9, S3).numpy(), M3)
    assert sorted(P3.tolist()) == [0, 1, 2]
    G3 = k.K(X9, S3).numpy() @ np.linalg.solve(M3, k.K(S3, X9).numpy())
    np.testing.assert_allclose(B3 @ B3.T, G3, rtol=1e-10, atol=1e-12)
    grid = Interval(0.3, 0.5).discretise(10.0)
    assert np.all(np.diag(posterior_covariance(k, X9, grid, result.Sigma)) >= 0.5 * 1.0 - 1e-6)
    # H = αK and S ⊇ X: G(S) = (1 − α)⁻¹ K_XX, the uniformly privacy-aware solution (end of §4.4).
    uniform = uniform_privacy_covariance(k, X9, 0.5)
    S = np.concatenate([X9, [[0.05], [0.97]]])
    np.testing.assert_allclose(synthetic_noise_covariance(k, X9, S, H, protect="latent"), uniform, atol=1e-8)
    anywhere = np.random.default_rng(0).uniform(-1, 2, (50, 1))
    assert np.all(np.diag(posterior_covariance(k, X9, anywhere, uniform)) >= 0.5 - 1e-8)
    union = RegionUnion(Interval(0.1, 0.2), Interval(0.2, 0.3))
    assert union.discretise(10.0).shape == (3, 1)
    Sigma_u = region_noise_covariance(k, X9, union, H, density=10.0)
    assert np.all(np.diag(posterior_covariance(k, X9, union.discretise(10.0), Sigma_u)) >= 0.5 - 1e-8)
    with pytest.raises(TypeError, match="kernel tolerance"):
        refine_region(k, X9, Interval(0.3, 0.5), 0.5)
    with pytest.raises(ValueError, match="region has 1 dimensions but X has 2"):
        region_noise_covariance(k, np.zeros((3, 2)), Interval(0, 1), H, density=4.0)

"""Issue 44: inputs far from zero in lengthscales (Unix timestamps) make GPflow's r² round-off; the release refuses
them before any design work, naming the column and the remedy (subtract a reference value)."""

import gpflow
import numpy as np
import pytest

from gpflow_fed.models import release
from gpflow_fed.release import Interval, ProportionalKernel
from gpflow_fed.release.linalg import FLOAT64_EPS
from gpflow_fed.release.precision import (
    MAX_SQUARED_DISTANCE_ROUNDOFF,
    check_input_precision,
    squared_distance_roundoff,
)

N, J, S2 = 40, 20, 0.01
#: ‖x/ℓ‖ at which r²'s round-off bound 3ε‖x/ℓ‖² (one column) is the tolerance
EDGE = float(np.sqrt(MAX_SQUARED_DISTANCE_ROUNDOFF / (3 * FLOAT64_EPS)))


def _data(offset: float, ell: float = 1.0):
    t = np.linspace(0.0, 5.0 * ell, N)
    rng = np.random.default_rng(3)
    y = np.sin(t / ell) + np.sqrt(S2) * rng.standard_normal(N)
    return (offset + t)[:, None], np.round(y, 6)[:, None]


def _release(X, Y, sensitive, kernel=None, **kw):
    kernel = gpflow.kernels.SquaredExponential() if kernel is None else kernel
    return release(
        (X, Y), sensitive, ProportionalKernel(kernel, 0.5), kernel=kernel, noise_variance=S2, ledger=None, **kw
    )


def test_offset_inputs_are_refused_and_centred_ones_release_the_exact_floor():
    X, Y = _data(1e5)  # the old release took this: its reported floor was off by up to 2e-4 of the exact one
    with pytest.raises(ValueError, match=r"column 0 \(SquaredExponential\): inputs up to 2e\+05 .* \(ℓ = 0.5\)") as e:
        _release(X, Y, X[J : J + 1])  # at the smallest lengthscale of the default θ range, ℓ/2
    assert "subtract a reference value from the column" in str(e.value) and "lengthscales are unchanged" in str(e.value)
    Xc = X - X[0]  # the remedy: the same model
    out = _release(Xc, Y, Xc[J : J + 1])
    m = out.model
    d = Xc - Xc.T
    K = np.exp(-0.5 * d * d)
    C = K + np.asarray(m.Sigma) + float(m.likelihood.variance.numpy()) * np.eye(N)
    c = K[:, J].copy()
    c[J] += S2
    exact = K[J, J] + S2 - c @ np.linalg.solve(C, c)
    np.testing.assert_allclose(float(out.variance.ravel()[0]), exact, rtol=1e-9)


def test_the_smallest_lengthscale_of_the_theta_range_decides():
    X, Y = _data(0.75 * EDGE)  # within the tolerance at ℓ, beyond it at ℓ/2 (the default range's end)
    _release(X, Y, X[J : J + 1], theta_range="design")
    with pytest.raises(ValueError, match="too far from zero"):
        _release(X, Y, X[J : J + 1])


def test_a_far_sensitive_input_and_a_far_region_are_refused():
    X, Y = _data(0.0)
    with pytest.raises(ValueError, match=r"column 0 \(SquaredExponential\): inputs up to 1e\+06"):
        _release(X, Y, np.array([[1e6]]), theta_range="design")
    with pytest.raises(ValueError, match=r"column 0 \(SquaredExponential\): inputs up to 1e\+06"):
        _release(X, Y, Interval(1e6, 1e6 + 0.5), theta_range="design", method="weak")


def test_the_offset_column_is_named_and_periodic_parts_are_not_blamed():
    X, Y = _data(0.0)
    X2 = np.concatenate([X, 3e6 + X], axis=1)  # column 1 offset, column 0 not
    k = gpflow.kernels.SquaredExponential(lengthscales=[1.0, 1.0])
    with pytest.raises(ValueError, match=r"column 1 \(SquaredExponential\): inputs up to 3e\+06") as e:
        _release(X2, Y, X2[J : J + 1], kernel=k, theta_range="design")
    assert "column 0" not in str(e.value)
    # Periodic computes sin(π(x − x')/p) from raw differences (no ‖x‖² cancellation): only the SE part is named
    kp = gpflow.kernels.Periodic(gpflow.kernels.SquaredExponential(), period=2.0) + gpflow.kernels.SquaredExponential()
    Xo = X + 1e5
    with pytest.raises(ValueError, match=r"column 0 \(SquaredExponential\)") as e:
        _release(Xo, Y, Xo[J : J + 1], kernel=kp, theta_range="design")
    assert "Periodic" not in str(e.value)


def test_the_bound_covers_gpflows_square_distance_and_other_kernels():
    for m in (1e4, 1e6, 5.7e7):
        X = m + np.linspace(0, 7, 300)[:, None]
        exact = np.square(X - X.T)  # X − X' is exact here (Sterbenz)
        r2 = gpflow.utilities.ops.square_distance(X, None).numpy()
        ((name, bound, columns),) = squared_distance_roundoff(gpflow.kernels.SquaredExponential(), [X])
        assert name == "SquaredExponential" and columns[0][0] == 0
        assert np.max(np.abs(r2 - exact)) <= bound <= 4 * np.max(np.abs(r2 - exact))  # c = 3 vs measured 1.6–2
        per = gpflow.kernels.Periodic(gpflow.kernels.SquaredExponential(), period=3.0)
        np.testing.assert_array_equal(per(X).numpy(), per(X - m).numpy())  # Periodic: no cancellation at all
        ((_, periodic_bound, _),) = squared_distance_roundoff(per, [X])
        assert periodic_bound < 1e-12
        assert squared_distance_roundoff(gpflow.kernels.Linear(), [X]) == []  # no r², no cancellation
        check_input_precision([per, gpflow.kernels.Linear(), gpflow.kernels.Polynomial()], [X])


def test_a_small_noise_variance_tightens_the_tolerance():
    # σ² = 1e-8: K's round-off grows up to (tr K + Nσ²)/σ² = 4e9 in the posterior; at ‖x/ℓ‖ = 1e3 (ρ = 6.7e-10,
    # within the plain tolerance) the reported floor was measured 9e-8 off the exact one (1e-6 near ‖x/ℓ‖ = 3e3)
    X, Y = _data(1e3)
    k = gpflow.kernels.SquaredExponential()
    with pytest.raises(ValueError, match=r"over \(tr K \+ Nσ²\)/σ² = 4e\+09"):
        release((X, Y), X[J : J + 1], ProportionalKernel(k, 0.5), kernel=k, noise_variance=1e-8, ledger=None)

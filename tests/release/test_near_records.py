"""A sensitive input a hair off a record names the record (issue 44, a fourteenth attacker).

``--sensitive 0.512820513`` for the record at ``x = 0.5128205128205128`` missed the record by more than rounding, so
only ``f(s)`` got a floor and the record beside it, left without synthetic noise, was published as ``Y_j`` (the CLI
said "safe to publish"; ``Var[Y_j | W] = 0.006 ξ``). Such a point is now refused before anything is designed.
"""

import gpflow
import numpy as np
import pytest

from gpflow_fed.models.privacy_aware_gpr import release
from gpflow_fed.release.obfuscation import NEAR_RECORD_LENGTHSCALES, check_near_records, with_near_records
from gpflow_fed.release.regions import Interval, with_records
from gpflow_fed.release.tolerance import ProportionalKernel


def _table(N: int = 40):
    X = np.linspace(0.0, 1.0, N)[:, None]
    return X, np.sin(12 * X) + 0.1 * np.cos(40 * X)


@pytest.mark.parametrize("offset", [1e-13, 1e-9, 0.5e-3 * 0.01])
def test_a_sensitive_input_a_hair_off_a_record_is_refused_naming_the_record(offset):
    """The attacker's table and kernel (N = 40 on [0, 1], ℓ = 0.01): a point 1e-13, 1e-9 or half the threshold off
    record 20 is one ValueError naming row 20, before any design (on the code before: released, 0.006 ξ)."""
    X, Y = _table()
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.01)
    S = X[[20]] + offset
    with pytest.raises(ValueError, match=r"the record at row 20 \(\[0\.5128205128205128\]\)"):
        release((X, Y), S, ProportionalKernel(kernel, 0.4), kernel=kernel, noise_variance=1.0, ledger=None)


def test_the_records_own_input_and_points_beyond_the_threshold_are_not_refused():
    """Control: the record's own input (also as text rounds it, the same float), and points 2 thresholds away in
    either direction, pass the check; so do kernels without lengthscales."""
    X, _ = _table()
    ell = 0.01
    kernel = gpflow.kernels.SquaredExponential(lengthscales=ell)
    far = 2 * NEAR_RECORD_LENGTHSCALES * ell
    check_near_records(kernel, X, np.array([X[20], [float(repr(X[20, 0]))], X[20] + far, X[20] - far]))
    check_near_records(gpflow.kernels.Linear(), X, X[[20]] + 1e-12)


def test_the_smallest_lengthscale_of_a_sum_sets_the_scale_per_column():
    X = np.array([[0.0, 0.0], [1.0, 1.0]])
    kernel = gpflow.kernels.SquaredExponential(lengthscales=[10.0, 10.0]) + gpflow.kernels.Matern32(
        lengthscales=[0.01, 10.0]
    )
    check_near_records(kernel, X, np.array([[0.0 + 2e-5, 0.0]]))  # 2e-3 of column 0's smallest ℓ: beyond
    with pytest.raises(ValueError, match="row 0"):
        check_near_records(kernel, X, np.array([[0.0 + 5e-6, 0.0]]))  # 5e-4 of it: within


@pytest.mark.parametrize("interval", [(0.512820513, 0.512820513), (0.45, 0.5128205128), (0.512820513, 0.6)])
def test_a_record_a_hair_outside_a_regions_edge_is_the_regions_too(interval):
    """The attack (``/tmp/attack44k/region_edge.sh``): an interval ending 2e-11 short of a record, or a zero-width one
    1.8e-10 off it, left the record outside the region (exact comparison) and unprotected: 0.55 ξ over 30 releases,
    "safe to publish". Records within the threshold of a region's grid are now among its sensitive points."""
    X, _ = _table()
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.02)
    grid = Interval(*interval).discretise(200.0)
    inside = with_records(grid, X, Interval(*interval))
    assert not np.any(np.all(inside == X[20], axis=1))  # the record is not inside the region: the code before
    protected = with_near_records(inside, X, kernel)
    assert np.any(np.all(protected == X[20], axis=1))
    assert with_near_records(X[[3]], X, kernel).shape == (1, 1)  # control: nothing near, nothing added

"""A sensitive input a hair off a record names the record (issue 44, a fourteenth attacker).

``--sensitive 0.512820513`` for the record at ``x = 0.5128205128205128`` missed the record by more than rounding, so
only ``f(s)`` got a floor and the record beside it, left without synthetic noise, was published as ``Y_j`` (the CLI
said "safe to publish"; ``Var[Y_j | W] = 0.006 ξ``). Such a point is now refused before anything is designed.
"""

import gpflow
import numpy as np
import pytest

from gpflow_fed.models.privacy_aware_gpr import release
from gpflow_fed.release import obfuscation
from gpflow_fed.release.obfuscation import (
    NEAR_RECORD_DECORRELATION,
    check_near_records,
    records_near,
    with_near_records,
)
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
    either direction, pass the check; so does a point 1% off a record under a linear kernel (correlation 1, but not
    one input to the model: ``d² = 1e-4``)."""
    X, _ = _table()
    ell = 0.01
    kernel = gpflow.kernels.SquaredExponential(lengthscales=ell)
    far = 2 * np.sqrt(2 * NEAR_RECORD_DECORRELATION) * ell  # twice the radius of the rule for one RBF
    check_near_records(kernel, X, np.array([X[20], [float(repr(X[20, 0]))], X[20] + far, X[20] - far]))
    # a linear kernel's correlation is 1 between any two points of one sign (1-D), yet 1% off is not one input
    check_near_records(gpflow.kernels.Linear(), X, X[[20]] * 1.01)


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


def _sum_with_a_tiny_lengthscale() -> gpflow.kernels.Kernel:
    """The attacker's sum: ℓ = 0.01 carries the variance, a part with ℓ = 1e-9 and variance 1e-7 set the old
    threshold (1e-3 of the smallest lengthscale: 1e-12) without changing the model near a record."""
    return gpflow.kernels.SquaredExponential(lengthscales=0.01) + gpflow.kernels.SquaredExponential(
        variance=1e-7, lengthscales=1e-9
    )


def _columns(N: int = 40) -> np.ndarray:
    X, _ = _table(N)
    return np.concatenate([X, np.random.default_rng(0).uniform(0.0, 1.0, (N, 1))], axis=1)


def _case(case: str) -> "tuple[np.ndarray, gpflow.kernels.Kernel, np.ndarray, np.ndarray]":
    """``(X, kernel, near, far)``: a point the kernel cannot tell from record 20, and one it can."""
    X, _ = _table()
    if case == "sum with a tiny lengthscale":  # 1e-9 off (the old radius 1e-12); 2e-5 off: 2 radii of the ℓ = 0.01 part
        return X, _sum_with_a_tiny_lengthscale(), X[[20]] + 1e-9, X[[20]] + 2e-5
    if case == "active_dims":  # 0.3 off in the column it does not see (the old radius 1e-5 in every column)
        X = _columns()
        kernel = gpflow.kernels.SquaredExponential(lengthscales=0.01, active_dims=[0])
        return X, kernel, X[[20]] + [[0.0, 0.3]], X[[20]] + [[2e-5, 0.0]]
    if case == "active_dims part":  # the same with a part of variance 1e-7 seeing column 1
        X = _columns()
        kernel = gpflow.kernels.SquaredExponential(lengthscales=0.01, active_dims=[0]) + (
            gpflow.kernels.SquaredExponential(variance=1e-7, lengthscales=1.0, active_dims=[1])
        )
        return X, kernel, X[[20]] + [[0.0, 0.3]], X[[20]] + [[2e-5, 0.0]]
    if case == "periodic":  # one period off (its base was not checked at all); 0.0123 off no record modulo the period
        kernel = gpflow.kernels.Periodic(gpflow.kernels.SquaredExponential(lengthscales=0.5), period=0.1)
        return X, kernel, X[[20]] + 0.1, X[[20]] + 0.0123
    # linear: 1e-12 off (not checked before); 1% off has correlation 1 too (1-D) but d² = 1e-4: told apart
    return X, gpflow.kernels.Linear(), X[[20]] + 1e-12, X[[20]] * 1.01


@pytest.mark.parametrize(
    "case", ["sum with a tiny lengthscale", "active_dims", "active_dims part", "periodic", "linear"]
)
def test_a_record_that_is_one_input_to_the_model_is_refused_for_every_kernel(case):
    """The correlation rule (issue 44, h10-44near): a point the kernel cannot tell from record 20 is refused naming it,
    where the lengthscale rule let it through (the attacker measured 0.73 ξ for the sum); a point the kernel tells
    from every record is still accepted."""
    X, kernel, near, far = _case(case)
    with pytest.raises(ValueError, match=r"one input to the model with the record at row 20 "):
        check_near_records(kernel, X, near)
    check_near_records(kernel, X, far)
    assert np.flatnonzero(records_near(kernel, X, np.concatenate([near, far]))).tolist() == [20]


def test_zero_prior_variance_pairs_are_one_input_and_one_sided_zero_is_not():
    """Linear on column 0: a point (0, z') beside a record (0, z) has f = 0 at both (k = 0 at both): one input to the
    model, refused; a point with k(s, s) > 0 beside a record with k(x, x) = 0 is told apart, accepted."""
    X = np.array([[0.0, 0.25], [1.0, 0.5]])
    kernel = gpflow.kernels.Linear(active_dims=[0])
    with pytest.raises(ValueError, match=r"record at row 0 "):
        check_near_records(kernel, X, np.array([[0.0, 0.75]]))
    check_near_records(kernel, X, np.array([[1e-12, 0.25]]))


def test_the_near_records_rule_is_evaluated_in_bounded_blocks(monkeypatch):
    """A grid of G points against N records in blocks of NEAR_RECORD_BLOCK elements: the answer does not depend on
    the block size (here 7 elements: blocks of single rows and a few columns)."""
    X, _ = _table()
    kernel = _sum_with_a_tiny_lengthscale()
    S = np.concatenate([X[[3, 20, 31]] + 1e-9, X[[10]] + 0.2])
    whole = records_near(kernel, X, S)
    monkeypatch.setattr(obfuscation, "NEAR_RECORD_BLOCK", 7)
    assert np.array_equal(records_near(kernel, X, S), whole)
    assert np.flatnonzero(whole).tolist() == [3, 20, 31]


@pytest.mark.parametrize("interval", [(0.45, 0.5128205128), (0.512820513, 0.6)])
def test_a_record_a_hair_outside_a_regions_edge_is_added_under_a_sum_kernel(interval):
    """The region-edge attack with the attacker's sum kernel: the old radius (1e-12) missed the record 2e-11 or 5e-10
    outside the interval; the correlation rule adds it."""
    X, _ = _table()
    kernel = _sum_with_a_tiny_lengthscale()
    grid = Interval(*interval).discretise(200.0)
    inside = with_records(grid, X, Interval(*interval))
    assert not np.any(np.all(inside == X[20], axis=1))
    protected = with_near_records(inside, X, kernel)
    assert np.any(np.all(protected == X[20], axis=1))


def test_a_point_a_hair_off_a_record_far_from_zero_is_refused_for_a_kernel_not_smooth_in_r2():
    """An eighteenth attacker: with a Matérn-1/2 kernel at x/ℓ ≈ 100, GPflow's r² round-off (≈ ε‖x/ℓ‖²) became
    Var ≈ 2√(ε‖x/ℓ‖²) > 1e-6, so points 1e-10 lengthscales off a record were judged far (7 of 40 offsets) and the
    record was released at 0.05–0.57 ξ. The rule is evaluated at the exact difference for a shift-invariant kernel."""
    X = np.linspace(800.0, 1000.0, 40)[:, None]
    kernel = gpflow.kernels.Matern12(lengthscales=10.0)
    missed = []
    for d in np.geomspace(2e-11, 4e-6, 40):
        S = X[[20]] + d
        if not records_near(kernel, X, S)[20]:
            missed.append(float(d))
    assert missed == [], missed
    assert not records_near(kernel, X, X[[20]] + 1e-3)[20]  # 1e-4 lengthscales: correlation 1 − 1e-4, far


def _white_kernels() -> "list[gpflow.kernels.Kernel]":
    """A White part at the top of a sum, inside a product inside a sum, and inside a change-point kernel."""
    se = gpflow.kernels.SquaredExponential
    return [
        se(lengthscales=0.02) + gpflow.kernels.White(1e-5),
        se(lengthscales=0.02) * gpflow.kernels.Constant(1.0) + gpflow.kernels.Linear() * gpflow.kernels.White(1e-5),
        gpflow.kernels.ChangePoints([se(lengthscales=0.02), gpflow.kernels.White(1e-5)], locations=[0.5]),
    ]


@pytest.mark.parametrize("which", [0, 1, 2])
def test_a_kernel_with_a_white_part_is_refused_at_every_entry_point(tmp_path, which):
    """Issue 44 (attack44n, ``white_near.py``): GPflow's White is 0 whenever a second input is given, so the near rule
    saw ``d² = 2w/(1 + w)`` for every pair and released a record a hair off a sensitive input (5e-12 ξ); the design's
    K_XX left White out while the model kept it. A White part anywhere in the kernel is refused, naming σ²'s
    argument (on the code before: released)."""
    from gpflow_fed.models import PrivacyAwareGPR
    from gpflow_fed.release import region_noise_covariance, synthetic_noise_covariance, uniform_privacy_covariance

    X, Y = _table()
    kernel = _white_kernels()[which]
    white = r"White part.*likelihood variance σ² \(noise_variance=\)"
    S = np.concatenate([X[[20]] + 1e-12, X[[5]]])
    with pytest.raises(ValueError, match=white):
        release((X, Y), S, ProportionalKernel(kernel, 0.2), kernel=kernel, noise_variance=1.0, ledger=None)
    with pytest.raises(ValueError, match=white):
        release((X, Y), X[[5]], ProportionalKernel(kernel, 0.2), kernel=kernel, noise_variance=1.0, ledger=None)
    with pytest.raises(ValueError, match=white):
        records_near(kernel, X, S)
    with pytest.raises(ValueError, match=white):
        synthetic_noise_covariance(kernel, X, X[[5]], 0.1, noise_variance=1.0)
    with pytest.raises(ValueError, match=white):
        region_noise_covariance(kernel, X, Interval(0.3, 0.5), ProportionalKernel(kernel, 0.2), density=50.0)
    with pytest.raises(ValueError, match=white):
        uniform_privacy_covariance(kernel, X, 0.2, noise_variance=1.0)
    with pytest.raises(ValueError, match=white):
        PrivacyAwareGPR((X, Y), kernel, np.zeros((X.shape[0], X.shape[0])), noise_variance=1.0)
    plain = gpflow.kernels.SquaredExponential(lengthscales=0.02)
    path = PrivacyAwareGPR((X, Y), plain, np.zeros((X.shape[0], X.shape[0])), noise_variance=1.0).save(
        tmp_path / "m.npz"
    )
    with pytest.raises(ValueError, match=white):
        PrivacyAwareGPR.load(path, kernel=kernel)


@pytest.mark.parametrize("part", ["constant", "linear", "linear product"])
def test_a_sum_that_is_not_shift_invariant_keeps_the_exact_difference_of_its_matern_part(part):
    """Issue 44 (attack44n, ``probe_nonsi.py``): Matérn-1/2 + Constant (or + Linear) went through GPflow's r², whose
    round-off made 16 of 100 points 1e-13–1e-11 off a record "far" (a full release then published the record at
    8e-4 ξ). Evaluated part by part, each shift-invariant part at the exact difference, none is missed (on the code
    before: 16 missed for the sums); a point 1e-4 lengthscales off is still far."""
    X, _ = _table()
    m12 = gpflow.kernels.Matern12(lengthscales=0.01)
    kernel = {
        "constant": m12 + gpflow.kernels.Constant(0.1),
        "linear": m12 + gpflow.kernels.Linear(variance=1e-3),
        "linear product": m12 * gpflow.kernels.Linear(variance=1.0) + gpflow.kernels.Constant(0.1),
    }[part]
    missed = [
        (j, d)
        for j in range(20, 40)
        for d in (1e-13, 3e-13, 1e-12, 3e-12, 1e-11)
        if not records_near(kernel, X, X[[j]] + d)[j]
    ]
    assert missed == [], missed
    assert not records_near(kernel, X, X[[30]] + 1e-6).any()
    with pytest.raises(ValueError, match=r"record at row 20 "):
        check_near_records(kernel, X, X[[20]] + 3e-12)


@pytest.mark.parametrize("variance", [1e298, 1e-200])
def test_the_near_rule_neither_overflows_nor_underflows_with_the_kernel_variance(variance):
    """attack44n (``--variance 1e298``): ``√(k(s,s)·k(x,x))`` overflowed, so every record was near and a point 2.5
    lengthscales from record 20 was refused naming row 0; below 1e-162 it underflows and every record is far. With
    ``√k(s,s)·√k(x,x)`` a point 1e-4 lengthscales off (``1 − ρ = 5e-9``) is near and one 2.5 lengthscales off is far,
    at any scale (on the code before: 1e298 judged the far point near, 1e-200 the near point far)."""
    X, _ = _table()
    kernel = gpflow.kernels.SquaredExponential(variance=variance, lengthscales=0.02)
    assert np.flatnonzero(records_near(kernel, X, X[[20]] + 2e-6)).tolist() == [20]
    assert not records_near(kernel, X, X[[20]] + 0.05).any()
    check_near_records(kernel, X, X[[20]] + 0.05)


def _matern12_parts():
    return [gpflow.kernels.Matern12(lengthscales=1.0), gpflow.kernels.Matern12(lengthscales=1.0)]


@pytest.mark.parametrize("kind", ["changepoints", "proportional", "sliced proportional"])
def test_a_kernel_holding_kernels_keeps_the_exact_difference_of_its_parts(kind):
    """Issue 44 (attack44p, ``a1_changepoints.py``): a ``ChangePoints`` of Matérn-1/2 parts, or ``ProportionalKernel``
    used as K, was evaluated at the raw inputs near 1000, through GPflow's r² round-off, so a point 1e-9 off record 8
    was judged far (the record released at 0.135 ξ). Its parts now see the exact difference: refused (on the code
    before: records_near False, no refusal); a point 1e-3 lengthscales off stays far, and near 0 (where GPflow's r²
    has no round-off) the part-by-part values are GPflow's own."""
    X = 1000.0 + np.linspace(0.0, 10.0, 40)[:, None]
    kernel = {
        "changepoints": gpflow.kernels.ChangePoints(_matern12_parts(), locations=[1005.0], steepness=1.0),
        "proportional": ProportionalKernel(gpflow.kernels.Matern12(variance=2.0, lengthscales=1.0), 0.5),
        "sliced proportional": ProportionalKernel(
            gpflow.kernels.Matern12(variance=2.0, lengthscales=1.0, active_dims=[0]), 0.5
        ),
    }[kind]
    assert np.flatnonzero(records_near(kernel, X, X[[8]] + 1e-9)).tolist() == [8]
    with pytest.raises(ValueError, match=r"record at row 8 "):
        check_near_records(kernel, X, X[[8]] + 1e-9)
    assert not records_near(kernel, X, X[[8]] + 1e-3).any()
    if kind == "changepoints":  # two change points, mixed parts
        kernel = gpflow.kernels.ChangePoints(
            [
                gpflow.kernels.SquaredExponential(0.5, 0.7),
                gpflow.kernels.Linear(0.3),
                gpflow.kernels.Matern32(2.0, 0.4),
            ],
            locations=[1.0, -0.5],
            steepness=[3.0, 0.8],
        )
    X, S = np.linspace(-2.0, 3.0, 17)[:, None], np.array([[-1.3], [0.2], [2.9]])
    steps = (X[None, :, :] - S[:, None, :]).reshape(-1, 1)
    np.testing.assert_allclose(obfuscation._pair_values(kernel, S, X, steps), kernel(S, X).numpy(), rtol=1e-12)


def test_another_kernel_holding_kernels_is_refused_by_type():
    """A custom kernel holding kernels (its parts cannot be evaluated one by one) is one ValueError naming its type
    (on the code before: evaluated at the raw inputs, records_near False for the point 1e-9 off)."""

    class Wrapped(gpflow.kernels.Kernel):
        def __init__(self, base):
            super().__init__()
            self.base = base

        def K(self, X, X2=None):
            return self.base(X, X2)

        def K_diag(self, X):
            return self.base(X, full_cov=False)

    X = 1000.0 + np.linspace(0.0, 10.0, 40)[:, None]
    with pytest.raises(ValueError, match=r"Wrapped part holds other kernels"):
        records_near(Wrapped(gpflow.kernels.Matern12()), X, X[[8]] + 1e-9)


class _Nugget(gpflow.kernels.Kernel):
    """GPflow's White re-typed (attack44p, ``a2_custom_white.py``): ``w·I`` for ``k(X)``, 0 for ``k(X, X2)``."""

    def __init__(self, variance: float) -> None:
        super().__init__()
        self.variance = gpflow.Parameter(variance)

    def K(self, X, X2=None):
        import tensorflow as tf

        if X2 is None:
            return tf.linalg.diag(tf.fill(tf.shape(X)[:-1], tf.squeeze(self.variance)))
        return tf.zeros(tf.concat([tf.shape(X)[:-1], tf.shape(X2)[:-1]], 0), dtype=X.dtype)

    def K_diag(self, X):
        import tensorflow as tf

        return tf.fill(tf.shape(X)[:-1], tf.squeeze(self.variance))


def test_a_custom_kernel_that_behaves_like_white_is_refused():
    """Issue 44 (attack44p, ``a2_custom_white.py``): SE + a re-typed White passed the class check; the near rule saw
    ``d = w`` and released record 17, 1e-9 off a sensitive input, at 0.857 ξ. Its ``k(x, x)`` differs from ``k(x, x')``
    at a copy: one ValueError naming σ² (on the code before: released). A kernel without such a part passes, and
    ArcCosine's round-off (1.6e-8) is not taken for a nugget."""
    X, Y = _table()
    kernel = gpflow.kernels.SquaredExponential(lengthscales=0.1) + _Nugget(1e-3)
    message = r"differs from its diagonal at row 0 .*noise-like \(White\) part; give it as σ²"
    with pytest.raises(ValueError, match=message):
        release((X, Y), X[[17]] + 1e-9, 0.6, kernel=kernel, noise_variance=1.0, ledger=None)
    with pytest.raises(ValueError, match=message):
        records_near(kernel, X, X[[17]] + 0.3)
    for plain in (
        gpflow.kernels.SquaredExponential(lengthscales=0.1),
        gpflow.kernels.ArcCosine(order=0) + gpflow.kernels.Linear(),
    ):
        obfuscation.check_white_like(plain, np.random.default_rng(0).normal(size=(300, 1)) * 100)

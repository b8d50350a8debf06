"""``H = αK`` (``release.tolerance.ProportionalKernel``) sees the columns its base kernel sees."""

import gpflow
import numpy as np

from gpflow_fed.release.tolerance import ProportionalKernel


def test_the_base_kernels_active_dims_apply():
    """The base kernel's ``active_dims`` were skipped (``K`` called directly reads every column): H differed from αK."""
    rng = np.random.default_rng(0)
    X, X2 = rng.normal(size=(5, 3)), rng.normal(size=(4, 3))
    base = gpflow.kernels.SquaredExponential(lengthscales=0.7, active_dims=[1])
    H = ProportionalKernel(base, 0.3)
    np.testing.assert_allclose(H(X, X2).numpy(), 0.3 * base(X, X2).numpy(), rtol=1e-15)
    np.testing.assert_allclose(H(X, full_cov=False).numpy(), 0.3 * base(X, full_cov=False).numpy(), rtol=1e-15)
    assert not np.allclose(base(X, X2).numpy(), base.K(X, X2).numpy())  # slicing matters for these inputs

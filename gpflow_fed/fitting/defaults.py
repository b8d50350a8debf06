"""The methods of :func:`gpflow_fed.fit` and their default settings: plain data, no imports (the command line reads
them for its ``--help`` without TensorFlow; :mod:`gpflow_fed.fitting.methods` builds the algorithms)."""

from typing import Any, Dict

__all__ = ["DEFAULTS", "METHODS"]

METHODS = ("fsgp", "pvi", "fedbnr")

#: Every method's default settings, shared by :func:`fit` and the command line, on standardised data. Chosen by
#: ``benchmarks/fit_defaults.py`` (saved run ``benchmarks/results/fit_defaults.json``): the candidate with the
#: lowest mean standardised test NLPD over two real tables (diabetes, concrete; 5 parties; 3 seeds).
#: Z, for FSGP and PVI, needs no client data (FSGP: ``inducing_grid([(-2, 2)] * D, M)``; PVI: N(0, I) draws).
DEFAULTS: Dict[str, Dict[str, Any]] = {
    "fsgp": dict(num_inducing=30, rounds=100, local_steps=3, learning_rate=0.1, noise_variance=0.1),
    "pvi": dict(num_inducing=20, rounds=20, local_steps=500),
    "fedbnr": dict(
        rounds=10, local_steps=10, learning_rate=0.01, num_samples=50, hidden=50, noise_variance=0.5,
        prior_variance=1.0,
    ),
}  # fmt: skip

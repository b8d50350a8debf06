"""The methods of :func:`gpflow_fed.fit` and their default settings: plain data, no imports (the command line reads
them for its ``--help`` without TensorFlow; :mod:`gpflow_fed.fitting.methods` builds the algorithms)."""

from typing import Any, Dict, Tuple

__all__ = ["DEFAULTS", "METHODS", "SETTINGS"]

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

#: Every setting each method's algorithm takes through ``fit(**settings)`` (:func:`~gpflow_fed.fitting.algorithm`):
#: its :data:`DEFAULTS` and the algorithm's own keywords (FSGP's, PVI's through ``make_pvi`` with ``variant``, FedBNR's
#: with ``hidden`` and ``num_samples`` of its default kernel). A test checks them against the constructors' signatures;
#: :func:`gpflow_fed.fitting.checks.check_settings` refuses any other name before TensorFlow is imported.
SETTINGS: Dict[str, Tuple[str, ...]] = {
    "fsgp": (
        "num_inducing", "rounds", "local_steps", "learning_rate", "noise_variance", "client_fraction", "mode", "whiten",
        "stopping",
    ),
    "pvi": (
        "num_inducing", "rounds", "local_steps", "variant", "init_noise", "damping", "alpha", "learn_hyperparameters",
        "client_fraction", "pseudo_fraction", "max_pseudo", "pseudo_init", "init_Z_var", "init_rho_var", "init_S",
        "num_samples", "num_predict_samples", "learning_rate", "patience", "fedavg_steps", "local_solver", "jitter",
        "initial_factors", "on_client_update",
    ),
    "fedbnr": (
        "rounds", "local_steps", "learning_rate", "num_samples", "hidden", "noise_variance", "prior_variance",
        "aggregation", "distillation_data", "alpha", "kd_steps", "protocol", "client_fraction", "compile",
    ),
}  # fmt: skip

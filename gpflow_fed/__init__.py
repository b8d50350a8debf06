"""gpflow-fed: federated and privacy-aware Gaussian processes for GPflow 2.

Importing the package activates its GPflow dispatch registrations (``Kuu``/``Kuf``, posteriors).
"""

__version__ = "0.1.0"

from . import data, federated, metrics, models  # noqa: E402
from . import likelihoods  # noqa: E402
from . import baselines  # noqa: E402
from . import covariances, inducing_variables, posteriors  # noqa: E402
from . import kernels  # noqa: E402
from . import monitor  # noqa: E402

__all__ = ["monitor", "likelihoods", "kernels", "baselines", "covariances", "inducing_variables", "posteriors", "data", "federated", "metrics", "models", "__version__"]

"""Bayesian linear regression in the primal (feature) space of a random-feature kernel (thesis §2.1.1).

With features ``Φ = φ(X): [N, L]`` (rows are points; the thesis writes Φ as ``L × N``), the prior
``w ~ N(0, λ² I)`` (eq. 2.2, Σ = λ²I as in App. A.1) and ``y = Φw + ε``, ε ~ N(0, σ²I) (eqs. 2.1, 2.3):

* posterior (eq. 2.4): ``w | y ~ N(w̄, A⁻¹)``, ``A = σ⁻² ΦᵀΦ + λ⁻² I``, ``w̄ = σ⁻² A⁻¹ Φᵀ y``;
* predictive (eq. 2.6): ``f* ~ N(φ*ᵀ w̄, φ*ᵀ A⁻¹ φ*)``, ``y* = f* + ε``;
* log marginal likelihood (eq. 2.8 / 3.3 with the constants and the ½ that make it a normalised density):
  ``log p(y) = −½ [N log 2π + N log σ² + L log λ² + log|A| + σ⁻² yᵀy − w̄ᵀ A w̄]``,
  equal to ``log N(y | 0, λ² ΦΦᵀ + σ² I)`` by the matrix determinant lemma and Woodbury (eqs. 2.9–2.18).

Everything depends on the data only through the *statistics* ``ΦᵀΦ [L, L]``, ``Φᵀy [L, P]``,
``yᵀy [P]`` and N, which are sums over data points, hence over clients (eqs. 3.5–3.6). The model is
therefore the exact GPR with kernel ``λ²·φ(x)ᵀφ(x')`` at O(N L²) cost.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Tuple, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.models.training_mixins import InternalDataTrainingLossMixin
from gpflow.utilities import positive

from ..validation import positive_float

__all__ = [
    "BLR_STATISTICS",
    "BayesianLinearRegression",
    "blr_log_marginal_likelihood",
    "blr_posterior",
    "blr_statistics",
]

BLR_STATISTICS = ("phi_t_phi", "phi_t_y", "y_t_y", "num_data")
"""Names of the sufficient statistics, in wire order."""


@check_shapes("Phi: [N, L]", "Y: [N, P]")
def blr_statistics(Phi: tf.Tensor, Y: tf.Tensor) -> Dict[str, tf.Tensor]:
    """``ΦᵀΦ``, ``Φᵀy``, ``yᵀy`` (per output column) and N: the sums that eqs. 2.4, 2.8, 3.5, 3.6 need."""
    Y = tf.cast(Y, Phi.dtype)
    return {
        "phi_t_phi": tf.linalg.matmul(Phi, Phi, transpose_a=True),
        "phi_t_y": tf.linalg.matmul(Phi, Y, transpose_a=True),
        "y_t_y": tf.reduce_sum(tf.square(Y), axis=0),
        "num_data": tf.cast(tf.shape(Y)[0], Phi.dtype),
    }


@check_shapes("phi_t_phi: [L, L]", "phi_t_y: [L, P]", "return[0]: [L, P]", "return[1]: [L, L]")
def blr_posterior(
    phi_t_phi: tf.Tensor, phi_t_y: tf.Tensor, noise_variance: tf.Tensor, prior_variance: tf.Tensor
) -> Tuple[tf.Tensor, tf.Tensor]:
    """The posterior mean ``w̄ = σ⁻² A⁻¹ Φᵀy`` and the Cholesky factor of ``A = σ⁻²ΦᵀΦ + λ⁻²I`` (eq. 2.4)."""
    dtype = phi_t_phi.dtype
    noise = tf.cast(noise_variance, dtype)
    prior = tf.cast(prior_variance, dtype)
    eye = tf.eye(tf.shape(phi_t_phi)[0], dtype=dtype)
    chol_A = tf.linalg.cholesky(phi_t_phi / noise + eye / prior)
    w_mean = tf.linalg.cholesky_solve(chol_A, phi_t_y / noise)
    return w_mean, chol_A


@check_shapes("phi_t_phi: [L, L]", "phi_t_y: [L, P]", "y_t_y: [P]", "num_data: []", "return: []")
def blr_log_marginal_likelihood(
    phi_t_phi: tf.Tensor,
    phi_t_y: tf.Tensor,
    y_t_y: tf.Tensor,
    num_data: tf.Tensor,
    noise_variance: tf.Tensor,
    prior_variance: tf.Tensor,
) -> tf.Tensor:
    """``Σ_p log N(y_p | 0, λ²ΦΦᵀ + σ²I)`` from the statistics alone (eq. 2.8 / 3.3, normalised).

    ``−½ Σ_p [N log 2π + N log σ² + L log λ² + log|A| + σ⁻² y_pᵀy_p − ‖L_A⁻¹ σ⁻² Φᵀy_p‖²]``, where the
    last term is ``w̄ᵀAw̄`` and ``L_A`` the Cholesky factor of A.
    """
    dtype = phi_t_phi.dtype
    noise = tf.cast(noise_variance, dtype)
    prior = tf.cast(prior_variance, dtype)
    num_features = tf.cast(tf.shape(phi_t_phi)[0], dtype)
    num_outputs = tf.cast(tf.shape(phi_t_y)[1], dtype)
    _, chol_A = blr_posterior(phi_t_phi, phi_t_y, noise, prior)
    c = tf.linalg.triangular_solve(chol_A, phi_t_y / noise, lower=True)  # [L, P]
    log_det_A = 2.0 * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(chol_A)))
    per_output = (
        num_data * np.log(2 * np.pi) + num_data * tf.math.log(noise) + num_features * tf.math.log(prior) + log_det_A
    )
    return -0.5 * (num_outputs * per_output + tf.reduce_sum(y_t_y) / noise - tf.reduce_sum(tf.square(c)))


class BayesianLinearRegression(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    """Bayesian linear regression on ``kernel.features`` (e.g. a :class:`~gpflow_fed.kernels.URK`).

    Equal to ``gpflow.models.GPR`` with the kernel ``λ²·k`` and the same noise (exactly, for λ² = 1: the same
    kernel), at ``O(N L² + L³)`` instead of ``O(N³)``.

    :param data: ``(X: [N, D], Y: [N, P])``.
    :param kernel: a kernel with ``features(X) -> [N, L]`` and ``num_features`` (a URK).
    :param noise_variance: σ² > 0 (a trainable ``Gaussian`` likelihood variance).
    :param prior_variance: λ² > 0 (a trainable parameter), the prior variance of the weights.

    :meth:`from_statistics` builds the same model from summed statistics (FedBNR's server).
    """

    def __init__(
        self,
        data: Optional[Tuple[Any, Any]],
        kernel: gpflow.kernels.Kernel,
        noise_variance: float = 1.0,
        prior_variance: float = 1.0,
        *,
        statistics: Optional[Mapping[str, Any]] = None,
    ) -> None:
        if not (hasattr(kernel, "features") and hasattr(kernel, "num_features")):
            raise TypeError(
                "kernel must expose features(X) and num_features (e.g. gpflow_fed.kernels.URK), got "
                f"{type(kernel).__name__}"
            )
        noise = positive_float(noise_variance, "noise_variance")
        prior = positive_float(prior_variance, "prior_variance")
        if (data is None) == (statistics is None):
            raise ValueError("give exactly one of data=(X, Y) and statistics=")
        if data is not None:
            X, Y = gpflow.models.util.data_input_to_tensor(data)
            if X.shape.rank != 2 or Y.shape.rank != 2:
                raise ValueError(f"data must be (X: [N, D], Y: [N, P]), got shapes {X.shape} and {Y.shape}")
            if X.dtype != gpflow.default_float() or Y.dtype != gpflow.default_float():
                raise TypeError(
                    f"data must have dtype {np.dtype(gpflow.default_float()).name}, got {X.dtype.name}, {Y.dtype.name}"
                )
            num_outputs = int(Y.shape[1])
            self._statistics = None
        else:
            # exactly one of data and statistics is given (checked above)
            stats = self._check_statistics(cast(Mapping[str, Any], statistics), kernel.num_features)
            num_outputs = int(stats["phi_t_y"].shape[1])
            # non-trainable variables: a tf.train.Checkpoint or save_model of the model holds the sums
            self._statistics = {n: tf.Variable(v, trainable=False, name=n) for n, v in stats.items()}
        likelihood = gpflow.likelihoods.Gaussian(variance=noise)
        super().__init__(kernel, likelihood, None, num_latent_gps=num_outputs)
        if statistics is not None:  # the sums fix the features: the kernel is outside the objective
            gpflow.set_trainable(self.kernel, False)
        self.data = data if data is None else (X, Y)
        self.prior_variance = gpflow.Parameter(prior, transform=positive())

    @staticmethod
    def _check_statistics(statistics: Mapping[str, Any], num_features: int) -> Dict[str, tf.Tensor]:
        missing = [n for n in BLR_STATISTICS if n not in statistics]
        if missing:
            raise ValueError(f"statistics are missing {missing}; expected {BLR_STATISTICS}")
        stats = {n: tf.constant(np.asarray(statistics[n]), dtype=gpflow.default_float()) for n in BLR_STATISTICS}
        if tuple(stats["phi_t_phi"].shape) != (num_features, num_features):
            raise ValueError(
                f"phi_t_phi has shape {tuple(stats['phi_t_phi'].shape)}, expected ({num_features}, {num_features})"
            )
        if stats["phi_t_y"].shape.rank != 2 or stats["phi_t_y"].shape[0] != num_features:
            raise ValueError(f"phi_t_y has shape {tuple(stats['phi_t_y'].shape)}, expected ({num_features}, P)")
        if tuple(stats["y_t_y"].shape) != (stats["phi_t_y"].shape[1],) or stats["num_data"].shape.rank != 0:
            raise ValueError("y_t_y must have shape [P] and num_data must be a scalar")
        return stats

    @classmethod
    def from_statistics(
        cls,
        statistics: Mapping[str, Any],
        kernel: gpflow.kernels.Kernel,
        noise_variance: float = 1.0,
        prior_variance: float = 1.0,
    ) -> "BayesianLinearRegression":
        """The model from summed statistics ``{phi_t_phi, phi_t_y, y_t_y, num_data}`` (eqs. 3.5–3.6).

        The features are frozen at ``kernel``'s current hyperparameters, so the kernel's parameters are made
        non-trainable (``gpflow.set_trainable(kernel, False)``, on the kernel passed in); σ² and λ² can still
        be trained (the marginal likelihood needs only the statistics), e.g. with
        ``Scipy().minimize(model.training_loss, model.trainable_variables)``.
        """
        return cls(None, kernel, noise_variance, prior_variance, statistics=statistics)

    def statistics(self) -> Dict[str, tf.Tensor]:
        """The current sufficient statistics (recomputed from the data, or the stored sums)."""
        if self._statistics is not None:
            return {n: tf.convert_to_tensor(v) for n, v in self._statistics.items()}
        X, Y = cast(Tuple[tf.Tensor, tf.Tensor], self.data)  # no stored sums: built from data
        return blr_statistics(self.kernel.features(X), Y)

    def posterior_weights(self) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(w̄: [L, P], A⁻¹: [L, L])`` of eq. 2.4."""
        stats = self.statistics()
        w_mean, chol_A = blr_posterior(
            stats["phi_t_phi"], stats["phi_t_y"], self.likelihood.variance, self.prior_variance
        )
        eye = tf.eye(tf.shape(chol_A)[0], dtype=chol_A.dtype)
        return w_mean, tf.linalg.cholesky_solve(chol_A, eye)

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        return self.log_marginal_likelihood()

    def log_marginal_likelihood(self) -> tf.Tensor:
        """``log p(Y)`` (eq. 2.8 / 3.3, normalised; equals ``GPR.log_marginal_likelihood``)."""
        s = self.statistics()
        return blr_log_marginal_likelihood(
            s["phi_t_phi"], s["phi_t_y"], s["y_t_y"], s["num_data"], self.likelihood.variance, self.prior_variance
        )

    @inherit_check_shapes
    def predict_f(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """Predictive ``f*`` of eq. 2.6 without the noise: mean ``φ*w̄``, covariance ``φ* A⁻¹ φ*ᵀ``."""
        if full_output_cov:
            raise NotImplementedError("outputs are independent: full_output_cov=True is not supported")
        stats = self.statistics()
        w_mean, chol_A = blr_posterior(
            stats["phi_t_phi"], stats["phi_t_y"], self.likelihood.variance, self.prior_variance
        )
        phi = self.kernel.features(Xnew)
        mean = tf.linalg.matmul(phi, w_mean)
        v = tf.linalg.triangular_solve(chol_A, tf.transpose(phi), lower=True)  # [L, N*]
        if full_cov:
            cov = tf.linalg.matmul(v, v, transpose_a=True)
            return mean, tf.tile(cov[None], [self.num_latent_gps, 1, 1])
        var = tf.reduce_sum(tf.square(v), axis=0)[:, None]
        return mean, tf.tile(var, [1, self.num_latent_gps])

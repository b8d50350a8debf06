"""Personalised GPs (the pFedGP-style baseline of thesis §3.2.2): each client's own SGPR posterior at shared
hyperparameters and inducing inputs Z, built from its statistics ``K_uf K_fu`` and ``K_uf y``.

Client c's model (:meth:`PersonalisedGPs.predict_client`):

    ``A_c = K_uu + σ⁻² K_uf K_fu``,  ``μ_c(x) = σ⁻² k_xu A_c⁻¹ K_uf y``,
    ``v_c(x) = k_xx − k_xu K_uu⁻¹ k_ux + k_xu A_c⁻¹ k_ux``;

``predict_f`` is the moment-matched equal mixture of the client models. The federated training that produces the
statistics is :class:`~gpflow_fed.federated.algorithms.PersonalisedGP`.
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes

__all__ = ["PersonalisedGPs"]


class PersonalisedGPs(gpflow.models.GPModel):
    """K personal SGPR posteriors sharing a kernel, Z and σ², built from each client's statistics.

    :param kernel: the shared kernel.
    :param inducing_points: Z ``[M, D]``.
    :param noise_variance: σ².
    :param client_statistics: one ``(kuf_kfu [M, M], kuf_y [M, P])`` pair per client.
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_points: np.ndarray,
        noise_variance: float,
        client_statistics: Sequence[Tuple[np.ndarray, np.ndarray]],
    ) -> None:
        if not client_statistics:
            raise ValueError("PersonalisedGPs needs the statistics of at least one client")
        super().__init__(
            kernel,
            gpflow.likelihoods.Gaussian(noise_variance),
            None,
            num_latent_gps=int(client_statistics[0][1].shape[1]),
        )
        self.inducing_variable = gpflow.inducing_variables.InducingPoints(inducing_points)
        self.client_statistics = [(tf.constant(a), tf.constant(b)) for a, b in client_statistics]

    @property
    def num_clients(self) -> int:
        return len(self.client_statistics)

    def maximum_log_likelihood_objective(self, *args: Any) -> tf.Tensor:
        raise NotImplementedError(
            "PersonalisedGPs is trained federatedly by PersonalisedGP; it has no objective of its own"
        )

    @check_shapes("Xnew: [N, D]", "return[0]: [N, P]", "return[1]: [N, P]")
    def predict_client(self, client: int, Xnew: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        """Client ``client``'s personal predictive ``f*`` (mean, marginal variance)."""
        if not 0 <= client < self.num_clients:
            raise ValueError(f"client must be in [0, {self.num_clients}), got {client}")
        kuf_kfu, kuf_y = self.client_statistics[client]
        noise = self.likelihood.variance
        Kuu = gpflow.covariances.Kuu(self.inducing_variable, self.kernel, jitter=gpflow.config.default_jitter())
        Kux = gpflow.covariances.Kuf(self.inducing_variable, self.kernel, Xnew)
        chol_Kuu = tf.linalg.cholesky(Kuu)
        chol_A = tf.linalg.cholesky(Kuu + kuf_kfu / noise)
        mean = tf.linalg.matmul(Kux, tf.linalg.cholesky_solve(chol_A, kuf_y / noise), transpose_a=True)
        a = tf.linalg.triangular_solve(chol_Kuu, Kux, lower=True)
        b = tf.linalg.triangular_solve(chol_A, Kux, lower=True)
        var = self.kernel(Xnew, full_cov=False) - tf.reduce_sum(a**2, 0) + tf.reduce_sum(b**2, 0)
        return mean, tf.tile(var[:, None], [1, self.num_latent_gps])

    @inherit_check_shapes
    def predict_f(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> Tuple[tf.Tensor, tf.Tensor]:
        """The equal mixture of the personal models, moment matched: mean of means, mean of second moments minus
        the squared mean."""
        if full_cov or full_output_cov:
            raise NotImplementedError("PersonalisedGPs predicts marginal variances only")
        preds = [self.predict_client(c, Xnew) for c in range(self.num_clients)]
        means = tf.stack([m for m, _ in preds])
        second = tf.stack([v + m**2 for m, v in preds])
        mean = tf.reduce_mean(means, 0)
        return mean, tf.reduce_mean(second, 0) - mean**2

"""AggregatedSGPR: Titsias' sparse GP regression built from summed sufficient statistics, with no data.

The collapsed SGPR posterior and bound (FSGP paper eqs. 9, 12–15) touch the data only through

* ``Kuf Kfu = Σ_k C_{MN_k} C_{MN_k}ᵀ``                    ``[M, M]``
* ``Kuf y   = Σ_k C_{MN_k} y_k``                          ``[M, P]``
* ``yᵀy     = Σ_k Σ_n ‖y_{k,n}‖²``                        scalar (bound only)
* ``tr Kff  = Σ_k Σ_n c(x_{k,n}, x_{k,n})``               scalar (bound only)
* ``N       = Σ_k N_k``                                    scalar (bound only)

so a server holding only these sums can predict (eqs. 14, 15) and evaluate the bound (eq. 9). The maths
follows GPflow's :class:`gpflow.models.SGPR` in its whitened, Cholesky-based form (no explicit inverses):
with ``L Lᵀ = Kuu``, ``AAᵀ = L⁻¹ (Kuf Kfu) L⁻ᵀ / σ²``, ``B = I + AAᵀ = L_B L_Bᵀ`` and
``c = L_B⁻¹ L⁻¹ (Kuf y) / σ²``,

* mean (eq. 14): ``μ(x*) = (L_B⁻¹ L⁻¹ k_u*)ᵀ c``;
* variance (eq. 15): ``k** − ‖L⁻¹ k_u*‖² + ‖L_B⁻¹ L⁻¹ k_u*‖²`` (``predict_y`` adds σ²);
* bound (eq. 9, times N): ``−½NP log 2πσ² − P Σ log diag L_B − ½ yᵀy/σ² + ½‖c σ‖² − ½P (tr Kff/σ² − tr AAᵀ)``.
"""

from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.covariances import Kuu
from gpflow.models.training_mixins import InternalDataTrainingLossMixin
from gpflow.models.util import inducingpoint_wrapper
from gpflow.utilities import assert_params_false

__all__ = ["AggregatedSGPR", "collapsed_sgpr_bound"]


def _as_float_tensor(value: Any, name: str, ndim: int) -> tf.Tensor:
    array: np.ndarray = np.asarray(value, dtype=gpflow.default_float())
    if array.ndim != ndim:
        raise ValueError(f"AggregatedSGPR: {name} must have rank {ndim}, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"AggregatedSGPR: {name} contains NaN or inf values")
    return tf.constant(array)


def _statistic(value: tf.Tensor, name: str) -> tf.Variable:
    return tf.Variable(value, trainable=False, name=name)


@check_shapes(
    "kuu: [M, M]",
    "kuf_kfu: [M, M]",
    "kuf_y: [M, P]",
    "y_squared_sum: []",
    "trace_kff: []",
    "num_data: []",
    "noise_variance: []",
    "return: []",
)
def collapsed_sgpr_bound(
    kuu: Optional[tf.Tensor],
    kuf_kfu: tf.Tensor,
    kuf_y: tf.Tensor,
    y_squared_sum: tf.Tensor,
    trace_kff: tf.Tensor,
    num_data: tf.Tensor,
    noise_variance: tf.Tensor,
) -> tf.Tensor:
    """Titsias' collapsed lower bound ``N·F(θ, σ, Z)`` (FSGP eq. 9) from summed sufficient statistics.

    Equals :meth:`gpflow.models.SGPR.elbo` on the pooled data (zero mean function, homoscedastic noise):

    ``F·N = −½NP log(2πσ²) − P Σ log diag L_B − ½ yᵀy/σ² + ½‖L_B⁻¹ L⁻¹ Kuf y‖²/σ⁴ − ½P (tr Kff/σ² − tr AAᵀ)``.

    :param kuu: ``Kuu`` including jitter; ``None`` when the statistics are whitened.
    :param kuf_kfu: ``Σ_k C_{MN_k} C_{MN_k}ᵀ`` (whitened: ``L⁻¹ (Σ_k C C ᵀ) L⁻ᵀ``, ``L Lᵀ = Kuu``).
    :param kuf_y: ``Σ_k C_{MN_k} y_k`` (whitened: ``L⁻¹ Σ_k C y``).
    :param y_squared_sum: ``Σ yᵀy`` over clients and outputs.
    :param trace_kff: ``Σ_n c(x_n, x_n)``.
    :param num_data: N.
    :param noise_variance: σ².
    """
    output_dim = tf.cast(tf.shape(kuf_y)[1], kuf_y.dtype)
    if kuu is None:  # whitened statistics: already L⁻¹ Kuf Kfu L⁻ᵀ and L⁻¹ Kuf y
        AAT = kuf_kfu / noise_variance
        Linv_kuf_y = kuf_y
    else:
        L = tf.linalg.cholesky(kuu)
        LinvKufKfu = tf.linalg.triangular_solve(L, kuf_kfu, lower=True)
        AAT = tf.linalg.triangular_solve(L, tf.transpose(LinvKufKfu), lower=True) / noise_variance
        Linv_kuf_y = tf.linalg.triangular_solve(L, kuf_y, lower=True)
    AAT = 0.5 * (AAT + tf.transpose(AAT))
    B = AAT + tf.eye(tf.shape(AAT)[0], dtype=AAT.dtype)
    LB = tf.linalg.cholesky(B)
    Aerr = Linv_kuf_y / tf.sqrt(noise_variance)
    c = tf.linalg.triangular_solve(LB, Aerr, lower=True) / tf.sqrt(noise_variance)
    const = -0.5 * num_data * output_dim * tf.math.log(2.0 * np.pi * noise_variance)
    logdet = -output_dim * tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LB)))
    trace = -0.5 * output_dim * (trace_kff / noise_variance - tf.linalg.trace(AAT))
    quad = -0.5 * (y_squared_sum / noise_variance - tf.reduce_sum(tf.square(c)))
    return const + logdet + trace + quad


class AggregatedSGPR(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    """Sparse GP regression (Titsias 2009) whose "data" are the summed statistics of K clients.

    A GPflow model that predicts without any data (FSGP paper §3.2, eqs. 14–15): ``predict_f`` (also with
    ``full_cov``), ``predict_y`` and ``predict_log_density`` equal :class:`gpflow.models.SGPR` on the pooled
    data with the same kernel, inducing inputs and noise variance. With the three optional scalars it
    also offers :meth:`elbo` (eq. 9 times N), so it can be monitored and trained like SGPR on fixed
    statistics. The statistics are non-trainable ``tf.Variable`` s of the model: a ``tf.train.Checkpoint`` of the
    model restores its predictions, and :func:`~gpflow_fed.models.save_model` writes them. The statistics
    depend on θ and Z, so training those needs fresh client statistics (what
    ``FSGP(mode="exact")`` does): the kernel's and Z's parameters are therefore made non-trainable
    (``gpflow.set_trainable(kernel, False)``, which also affects the kernel object passed in), and
    ``Scipy().minimize(model.training_loss, model.trainable_variables)`` trains σ² alone, for which the
    statistics stay valid.

    :param kernel: the kernel ``c(·,·; θ)``.
    :param inducing_variable: Z as ``gpflow.inducing_variables.InducingPoints`` or an ``[M, D]`` array.
    :param noise_variance: σ² > 0.
    :param kuf_kfu: ``Σ_k C_{MN_k} C_{MN_k}ᵀ``, ``[M, M]``, computed with this kernel and Z.
    :param kuf_y: ``Σ_k C_{MN_k} y_k``, ``[M, P]``.
    :param num_data: N (for the bound).
    :param y_squared_sum: ``Σ_k ‖y_k‖²`` (for the bound).
    :param trace_kff: ``Σ_n c(x_n, x_n)`` (for the bound).
    :param whitened: ``kuf_kfu`` and ``kuf_y`` are whitened, ``L⁻¹ Kuf Kfu L⁻ᵀ`` and ``L⁻¹ Kuf y`` with
        ``L Lᵀ = Kuu + jitter`` at this kernel and Z (better conditioned; what ``FSGP(mode="exact")`` sends).
    :param freeze_statistics_parameters: make the kernel and Z non-trainable (default). ``False`` keeps their
        trainability as given, for a container of parameters whose statistics are recomputed by the clients
        after every change (FSGP's server state); training them against fixed statistics is meaningless
        (the bound diverges).
    :raises ValueError: shapes inconsistent with Z, a non-symmetric ``kuf_kfu``, non-finite statistics,
        or a non-positive noise variance.
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        inducing_variable: Any,
        noise_variance: float,
        kuf_kfu: Any,
        kuf_y: Any,
        *,
        num_data: Optional[Union[float, np.ndarray]] = None,
        y_squared_sum: Optional[Union[float, np.ndarray]] = None,
        trace_kff: Optional[Union[float, np.ndarray]] = None,
        whitened: bool = False,
        freeze_statistics_parameters: bool = True,
    ) -> None:
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"AggregatedSGPR: kernel must be a gpflow.kernels.Kernel, got {type(kernel).__name__}")
        if not (np.isfinite(noise_variance) and float(noise_variance) > 0):
            raise ValueError(f"AggregatedSGPR: noise_variance must be positive and finite, got {noise_variance!r}")
        inducing_variable = inducingpoint_wrapper(inducing_variable)
        num_inducing = inducing_variable.num_inducing
        kuf_kfu_t = _as_float_tensor(kuf_kfu, "kuf_kfu", 2)
        kuf_y_t = _as_float_tensor(kuf_y, "kuf_y", 2)
        if tuple(kuf_kfu_t.shape) != (num_inducing, num_inducing):
            raise ValueError(
                f"AggregatedSGPR: kuf_kfu has shape {tuple(kuf_kfu_t.shape)}, expected [{num_inducing}, {num_inducing}]"
                " (M = number of inducing points)"
            )
        if int(kuf_y_t.shape[0]) != num_inducing:
            raise ValueError(f"AggregatedSGPR: kuf_y has {kuf_y_t.shape[0]} rows, expected M = {num_inducing}")
        if not np.allclose(kuf_kfu_t.numpy(), kuf_kfu_t.numpy().T, rtol=1e-10, atol=1e-12):
            raise ValueError("AggregatedSGPR: kuf_kfu must be symmetric (a sum of C_{MN_k} C_{MN_k}^T)")
        likelihood = gpflow.likelihoods.Gaussian(float(noise_variance))
        super().__init__(kernel, likelihood, mean_function=None, num_latent_gps=int(kuf_y_t.shape[1]))
        self.inducing_variable = inducing_variable
        if freeze_statistics_parameters:
            gpflow.set_trainable(self.kernel, False)
            gpflow.set_trainable(self.inducing_variable, False)
        self.whitened = bool(whitened)
        # the sums are the model's "data": non-trainable variables, so tf.train.Checkpoint, tf.saved_model and
        # save_model hold them with the kernel and Z
        self.kuf_kfu = _statistic(kuf_kfu_t, "kuf_kfu")
        self.kuf_y = _statistic(kuf_y_t, "kuf_y")
        scalars = {"num_data": num_data, "y_squared_sum": y_squared_sum, "trace_kff": trace_kff}
        given = [k for k, v in scalars.items() if v is not None]
        if given and len(given) != 3:
            raise ValueError(f"AggregatedSGPR: give all of num_data, y_squared_sum, trace_kff or none; got {given}")
        for name, value in scalars.items():
            setattr(self, name, None if value is None else _statistic(_as_float_tensor(value, name, 0), name))

    @property
    def has_bound_statistics(self) -> bool:
        """Whether the model holds N, yᵀy and tr Kff, i.e. whether :meth:`elbo` is available."""
        return self.num_data is not None

    def _posterior_factors(self) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """``L`` (chol Kuu), ``L_B`` (chol B) and ``c`` (see the module docstring)."""
        kuu = Kuu(self.inducing_variable, self.kernel, jitter=gpflow.config.default_jitter())
        sigma_sq = self.likelihood.variance
        L = tf.linalg.cholesky(kuu)
        if self.whitened:
            AAT = self.kuf_kfu / sigma_sq
            Linv_kuf_y = self.kuf_y
        else:
            LinvKufKfu = tf.linalg.triangular_solve(L, self.kuf_kfu, lower=True)
            AAT = tf.linalg.triangular_solve(L, tf.transpose(LinvKufKfu), lower=True) / sigma_sq
            Linv_kuf_y = tf.linalg.triangular_solve(L, self.kuf_y, lower=True)
        AAT = 0.5 * (AAT + tf.transpose(AAT))
        LB = tf.linalg.cholesky(AAT + tf.eye(tf.shape(AAT)[0], dtype=AAT.dtype))
        c = tf.linalg.triangular_solve(LB, Linv_kuf_y, lower=True) / sigma_sq
        return L, LB, c

    @inherit_check_shapes
    def predict_f(
        self, Xnew: gpflow.base.InputData, full_cov: bool = False, full_output_cov: bool = False
    ) -> gpflow.models.model.MeanAndVariance:
        """The approximate posterior ``q(f*)`` (FSGP eqs. 14, 15 without the noise term σ²).

        :raises NotImplementedError: for ``full_output_cov=True`` (as ``gpflow.models.SGPR``).
        """
        assert_params_false(self.predict_f, full_output_cov=full_output_cov)
        L, LB, c = self._posterior_factors()
        Kus = gpflow.covariances.Kuf(self.inducing_variable, self.kernel, Xnew)  # [M, N*]
        tmp1 = tf.linalg.triangular_solve(L, Kus, lower=True)
        tmp2 = tf.linalg.triangular_solve(LB, tmp1, lower=True)
        mean = tf.linalg.matmul(tmp2, c, transpose_a=True) + self.mean_function(Xnew)
        num_latent = self.num_latent_gps
        if full_cov:
            var = (
                self.kernel(Xnew)
                + tf.linalg.matmul(tmp2, tmp2, transpose_a=True)
                - tf.linalg.matmul(tmp1, tmp1, transpose_a=True)
            )
            var = tf.tile(var[None, ...], [num_latent, 1, 1])  # [P, N*, N*]
        else:
            var = (
                self.kernel(Xnew, full_cov=False)
                + tf.reduce_sum(tf.square(tmp2), 0)
                - tf.reduce_sum(tf.square(tmp1), 0)
            )
            var = tf.tile(var[:, None], [1, num_latent])  # [N*, P]
        return mean, var

    @check_shapes("return: []")
    def elbo(self) -> tf.Tensor:
        """The collapsed bound ``N·F(θ, σ, Z)`` (FSGP eq. 9), equal to ``gpflow.models.SGPR.elbo`` on the
        pooled data. Needs ``num_data``, ``y_squared_sum`` and ``trace_kff``."""
        if not self.has_bound_statistics:
            raise ValueError(
                "AggregatedSGPR.elbo needs num_data, y_squared_sum and trace_kff; build the model with them "
                "(FSGP's final phase sends them)"
            )
        kuu = None if self.whitened else Kuu(self.inducing_variable, self.kernel, jitter=gpflow.config.default_jitter())
        return collapsed_sgpr_bound(
            kuu,
            self.kuf_kfu,
            self.kuf_y,
            self.y_squared_sum,
            self.trace_kff,
            self.num_data,
            self.likelihood.variance,
        )

    @inherit_check_shapes
    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        return self.elbo()

"""Fitting the local models of Recyclable GPs (Moreno-Muñoz et al., *Recyclable Gaussian Processes*, eq. 1) fast.

Every party fits one single-output sparse GP ``q_k(u_k) = N(μ_k, S_k)`` at ``Z_k`` by maximising

    L_k = Σ_n E_{q_k(f_n)}[log p(y_n | f_n)] − KL(q_k(u_k) ‖ p_k(u_k))                       (paper eq. 1)

on its full batch. :class:`LocalSVGPTrainer` builds one working GPflow model per shape ``(M_k, D, P)`` with the
data held in ``tf.Variable`` s of unknown length, so GPflow's ``Scipy`` optimiser compiles its L-BFGS loss and
gradient once (``compile=True``, reused through its compile cache) and every further local model of that shape,
of any ``N_k``, reuses the traced graph instead of tracing a new one.

* **Gaussian likelihood.** ``max_q L_k`` has the closed form of Titsias (2009): ``(Z_k, θ_k, σ²)`` maximise
  GPflow's collapsed ``SGPR`` bound (the same objective with q at its optimum), and q_k is then set to that
  optimum. In whitened coordinates ``u = L_K v``, ``L_K = chol(K_uu + εI)``, ``Φ = L_K⁻¹K_uf / σ``:

      S̃ = (I + ΦΦᵀ)⁻¹,   m̃ = S̃ Φ y / σ,   i.e.  S_k = L_K S̃ L_Kᵀ ⪯ K_k,   μ_k = L_K m̃,

  which is exactly one natural-gradient step with γ = 1 (Salimbeni et al. 2018) from any q. It is computed
  directly here because GPflow's ``NaturalGradient`` round trip through the natural parameters can fail
  (Cholesky) on typical local models (see BENCHMARKS.md 'Recyclable GPs'), which would leave q where
  L-BFGS stopped. ``S_k ⪯ K_k`` keeps the ensemble bound bounded (see
  :class:`~gpflow_fed.models.RecyclableWarning`).
* **Other likelihoods.** ``gpflow.models.SVGP`` trained jointly on ``(q_k, Z_k, θ_k)`` with L-BFGS (GPflow's
  Gauss–Hermite ``variational_expectations``), then on q_k alone with ``(Z_k, θ_k)`` fixed, so that q_k is the
  optimum for the hyperparameters it is exported with, as in the Gaussian case. The joint run can stop with q_k
  far from it: on the banana data (seed 4, BENCHMARKS.md 'Recyclable GPs') one quadrant's model ended wider than
  its own prior (whitened ``S̃`` with eigenvalue 1.61), which no optimum has for a log-concave likelihood
  (there ``S_k⁻¹ = K_k⁻¹ + Λ`` with ``Λ ⪰ 0``), and the ensemble over it oversmoothed; q_k alone then reached
  eigenvalue 0.84 and an ELBO 1.27 nats higher.
* **Degenerate local fits are refitted** (Gaussian likelihood). On a small partition, maximising eq. 1 over θ_k
  can reach hyperparameters that the partition cannot support, and a recycled model passes them on to the
  ensemble through its prior ``p_k(u_k)`` (eqs. 15–18). A fit is refitted with θ_k held at the initial kernel
  hyperparameters (``Z_k`` and σ² still optimised, q_k still the closed-form optimum) when either

  - it **collapsed to pure noise**: its signal-to-noise ratio ``mean_n k_θ(x_n, x_n) / σ²`` on its own inputs is
    below ``collapse_snr``. Then ``K_k ≈ 0`` and ``q_k(u_k) ≈ N(0, S_k ⪯ K_k ≈ 0)`` claims ``f ≈ 0`` with ≈ 0
    variance everywhere, not only on its partition; or
  - a **lengthscale is not identifiable**: it exceeds ``max_lengthscale_ratio`` times the extent of the
    partition's inputs along that dimension (stationary kernels with a ``lengthscales`` parameter). The data of
    a window of width w carry no information about correlations over lengths ≫ w (the likelihood is flat in
    ℓ there), so ℓ_k is arbitrary, ``K_k(Z_k, Z_k)`` is numerically singular, and the ensemble would inherit a
    long-range correlation that no data supported.

  Healthy fits are returned unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from numpy.typing import DTypeLike

from ..validation import integer, non_negative_float

__all__ = ["LocalSVGPTrainer", "train_local_svgp"]


@dataclass
class _Slot:
    """The working model of one shape ``(M, D, P)``: data variables, reset values, compiled loss."""

    model: gpflow.models.GPModel
    X: tf.Variable
    Y: tf.Variable
    initial: Dict[str, np.ndarray]
    loss: Callable[[], tf.Tensor]
    optimizer: gpflow.optimizers.Scipy


class LocalSVGPTrainer:
    """Fits local models (paper eq. 1) one after another, reusing one compiled L-BFGS loop per shape.

    Every call to :meth:`fit` starts from the same initial kernel and likelihood (copies of the templates)
    and returns an independent ``gpflow.models.SVGP``; results do not depend on what was fitted before.

    :param kernel: template kernel θ (default ``SquaredExponential()``); copied, never modified.
    :param likelihood: template likelihood (default ``Gaussian()``); for classification use
        ``gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)`` (the paper's logit link; GPflow defaults to probit).
    :param maxiter: L-BFGS iterations per local model (0: keep the initial hyperparameters).
    :param train_inducing: optimise Z_k too.
    :param whiten: return whitened SVGPs (GPflow's default; pass them through :func:`export_svgp`) or
        unwhitened ones (directly recyclable).
    :param collapse_snr: Gaussian likelihood only: a fit whose signal-to-noise ratio
        ``mean_n k_θ(x_n, x_n) / σ²`` on its own inputs is below this is refitted with the kernel kept at its
        initial hyperparameters (module docstring). ``0`` disables the check. The default ``1e-3`` flags a model
        whose signal variance is three orders of magnitude below its noise variance.
    :param max_lengthscale_ratio: Gaussian likelihood only: a fit with a lengthscale longer than this many times
        the extent of its inputs along that dimension is refitted likewise. ``0`` disables the check.

    :ivar num_refitted: how many fits so far were found degenerate and refitted.
    """

    def __init__(
        self,
        kernel: Optional[gpflow.kernels.Kernel] = None,
        likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
        *,
        maxiter: int = 200,
        train_inducing: bool = True,
        whiten: bool = True,
        collapse_snr: float = 1e-3,
        max_lengthscale_ratio: float = 10.0,
    ) -> None:
        kernel = kernel if kernel is not None else gpflow.kernels.SquaredExponential()
        likelihood = likelihood if likelihood is not None else gpflow.likelihoods.Gaussian()
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow Kernel, got {type(kernel).__name__}")
        if not isinstance(likelihood, gpflow.likelihoods.Likelihood):
            raise TypeError(f"likelihood must be a gpflow Likelihood, got {type(likelihood).__name__}")
        self.kernel = gpflow.utilities.deepcopy(kernel)
        self.likelihood = gpflow.utilities.deepcopy(likelihood)
        self.maxiter = integer(maxiter, "maxiter", minimum=0)
        self.train_inducing = bool(train_inducing)
        self.whiten = bool(whiten)
        self.collapse_snr = non_negative_float(collapse_snr, "collapse_snr")
        self.max_lengthscale_ratio = non_negative_float(max_lengthscale_ratio, "max_lengthscale_ratio")
        self.num_refitted = 0
        self._slots: Dict[Tuple[int, int, int], _Slot] = {}

    @property
    def gaussian(self) -> bool:
        """Whether the conjugate (collapsed bound + closed-form q) path is used."""
        return isinstance(self.likelihood, gpflow.likelihoods.Gaussian)

    def _slot(self, M: int, D: int, P: int) -> _Slot:
        key = (M, D, P)
        if key not in self._slots:
            dtype = gpflow.default_float()
            X = tf.Variable(np.zeros((0, D), dtype=dtype), shape=tf.TensorShape([None, D]), trainable=False)
            Y = tf.Variable(np.zeros((0, P), dtype=dtype), shape=tf.TensorShape([None, P]), trainable=False)
            kernel = gpflow.utilities.deepcopy(self.kernel)
            likelihood = gpflow.utilities.deepcopy(self.likelihood)
            iv = gpflow.inducing_variables.InducingPoints(np.zeros((M, D), dtype=dtype))
            model: gpflow.models.GPModel
            if self.gaussian:
                model = gpflow.models.SGPR((X, Y), kernel, iv, likelihood=likelihood, num_latent_gps=P)
                loss: Callable[[], tf.Tensor] = model.training_loss
            else:
                model = gpflow.models.SVGP(kernel, likelihood, iv, num_latent_gps=P, whiten=True)
                loss = model.training_loss_closure((X, Y), compile=False)
            gpflow.set_trainable(model.inducing_variable, self.train_inducing)
            initial = {  # the parameters only: the data variables are reassigned per fit
                k: v.numpy()
                for k, v in gpflow.utilities.parameter_dict(model).items()
                if isinstance(v, gpflow.Parameter)
            }
            self._slots[key] = _Slot(model, X, Y, initial, loss, gpflow.optimizers.Scipy())
        return self._slots[key]

    @check_shapes("X: [N, D]", "Y: [N, P]", "Z: [M, D]")
    def fit(self, X: np.ndarray, Y: np.ndarray, Z: np.ndarray) -> gpflow.models.SVGP:
        """Fit one local model on ``(X_k, Y_k)`` from initial inducing inputs ``Z_k`` (paper eq. 1).

        :returns: a new ``gpflow.models.SVGP`` (``num_data = N_k``) holding the fitted ``(q_k, Z_k, θ_k)``.
        :raises ValueError: for no data or non-finite inputs.
        """
        dtype: DTypeLike = gpflow.default_float()
        X, Y, Z = (np.asarray(a, dtype=dtype) for a in (X, Y, Z))
        if X.shape[0] == 0:
            raise ValueError("train_local_svgp: no data (N_k = 0)")
        for name, a in (("X", X), ("Y", Y), ("Z", Z)):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"train_local_svgp: {name} contains NaN or inf")
        slot = self._slot(Z.shape[0], X.shape[1], Y.shape[1])
        slot.X.assign(X)
        slot.Y.assign(Y)
        gpflow.utilities.multiple_assign(slot.model, slot.initial)
        slot.model.inducing_variable.Z.assign(Z)
        self._minimize(slot, slot.model.trainable_variables)
        if self.gaussian and self._degenerate(slot.model, X):
            kernel_vars = {id(v) for v in slot.model.kernel.trainable_variables}
            gpflow.utilities.multiple_assign(slot.model, slot.initial)
            slot.model.inducing_variable.Z.assign(Z)
            self._minimize(slot, tuple(v for v in slot.model.trainable_variables if id(v) not in kernel_vars))
            self.num_refitted += 1
        if not self.gaussian:  # q_k's optimum for the final (Z_k, θ_k) (module docstring)
            self._minimize(slot, slot.model.q_mu.trainable_variables + slot.model.q_sqrt.trainable_variables)
        kernel = gpflow.utilities.deepcopy(slot.model.kernel)
        likelihood = gpflow.utilities.deepcopy(slot.model.likelihood)
        Z_k = slot.model.inducing_variable.Z.numpy()
        if self.gaussian:
            q_mu, q_sqrt = self._optimal_whitened_q(kernel, likelihood, Z_k, X, Y)
        else:
            q_mu, q_sqrt = slot.model.q_mu.numpy(), slot.model.q_sqrt.numpy()
        out = gpflow.models.SVGP(
            kernel, likelihood, gpflow.inducing_variables.InducingPoints(Z_k),
            num_latent_gps=Y.shape[1], num_data=X.shape[0], whiten=self.whiten,
        )  # fmt: skip
        if not self.whiten:
            L_K = np.linalg.cholesky(
                gpflow.covariances.Kuu(out.inducing_variable, kernel, jitter=gpflow.config.default_jitter()).numpy()
            )
            q_mu, q_sqrt = L_K @ q_mu, np.matmul(L_K[None], q_sqrt)
        out.q_mu.assign(q_mu)
        out.q_sqrt.assign(q_sqrt)
        gpflow.set_trainable(out.inducing_variable, self.train_inducing)
        return out

    def _minimize(self, slot: _Slot, variables: Tuple[tf.Variable, ...]) -> None:
        """L-BFGS on the slot's loss over ``variables`` (compiled once per variable set, cached by GPflow)."""
        if self.maxiter and variables:
            slot.optimizer.minimize(slot.loss, variables, options={"maxiter": self.maxiter}, compile=True)

    def _degenerate(self, model: gpflow.models.GPModel, X: np.ndarray) -> bool:
        """Whether a Gaussian fit collapsed to noise or has an unidentifiable lengthscale (module docstring)."""
        if self.collapse_snr > 0:
            signal = float(tf.reduce_mean(model.kernel(X, full_cov=False)).numpy())
            if signal < self.collapse_snr * float(model.likelihood.variance.numpy()):
                return True
        lengthscales = getattr(model.kernel, "lengthscales", None)
        if self.max_lengthscale_ratio > 0 and isinstance(lengthscales, gpflow.Parameter):
            extent = np.ptp(X, axis=0)
            ratio = np.broadcast_to(lengthscales.numpy(), extent.shape)[extent > 0] / extent[extent > 0]
            return bool(np.any(ratio > self.max_lengthscale_ratio))
        return False

    @staticmethod
    def _optimal_whitened_q(
        kernel: gpflow.kernels.Kernel,
        likelihood: gpflow.likelihoods.Gaussian,
        Z: np.ndarray,
        X: np.ndarray,
        Y: np.ndarray,
    ) -> Tuple[np.ndarray, np.ndarray]:
        """``argmax_q L_k`` for a Gaussian likelihood (module docstring): ``m̃ [M, P]``, ``L̃ [P, M, M]``."""
        iv = gpflow.inducing_variables.InducingPoints(Z)
        L_K = tf.linalg.cholesky(gpflow.covariances.Kuu(iv, kernel, jitter=gpflow.config.default_jitter()))
        sigma = tf.sqrt(likelihood.variance)
        Phi = tf.linalg.triangular_solve(L_K, gpflow.covariances.Kuf(iv, kernel, X), lower=True) / sigma
        precision = tf.eye(Z.shape[0], dtype=Phi.dtype) + tf.matmul(Phi, Phi, transpose_b=True)
        L_P = tf.linalg.cholesky(precision)
        S = tf.linalg.cholesky_solve(L_P, tf.eye(Z.shape[0], dtype=Phi.dtype))
        q_mu = tf.linalg.cholesky_solve(L_P, tf.matmul(Phi, Y) / sigma)
        q_sqrt = tf.linalg.cholesky(0.5 * (S + tf.transpose(S)))
        P = Y.shape[1]
        return q_mu.numpy(), np.repeat(q_sqrt.numpy()[None], P, axis=0)


@check_shapes("X: [N, D]", "Y: [N, P]", "Z: [M, D]")
def train_local_svgp(
    X: np.ndarray,
    Y: np.ndarray,
    Z: np.ndarray,
    kernel: Optional[gpflow.kernels.Kernel] = None,
    likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
    *,
    maxiter: int = 200,
    train_inducing: bool = True,
    whiten: bool = True,
    collapse_snr: float = 1e-3,
    max_lengthscale_ratio: float = 10.0,
) -> gpflow.models.SVGP:
    """Fit one local model (paper eq. 1) with a fresh :class:`LocalSVGPTrainer` (see there and the module
    docstring: collapsed bound and closed-form q_k for a Gaussian likelihood, L-BFGS on the SVGP ELBO, then on
    q_k alone, otherwise). To fit many local models, reuse one trainer: its compiled loops are traced once per
    shape.

    :param kernel: initial kernel θ_k (copied; default SquaredExponential with unit variance and lengthscale).
    :param likelihood: defaults to ``Gaussian()``; for classification use
        ``gpflow.likelihoods.Bernoulli(invlink=tf.sigmoid)`` (the paper's logit link; GPflow defaults to probit).
    :param maxiter: L-BFGS iterations.
    :param train_inducing: optimise Z_k too.
    :param whiten: return a whitened SVGP (pass it through :func:`export_svgp` before recycling it).
    :param collapse_snr: refit a Gaussian fit that collapsed to noise with the initial kernel (see
        :class:`LocalSVGPTrainer`).
    :param max_lengthscale_ratio: refit a Gaussian fit with a lengthscale this many times longer than its inputs'
        extent likewise.
    """
    trainer = LocalSVGPTrainer(
        kernel,
        likelihood,
        maxiter=maxiter,
        train_inducing=train_inducing,
        whiten=whiten,
        collapse_snr=collapse_snr,
        max_lengthscale_ratio=max_lengthscale_ratio,
    )
    return trainer.fit(X, Y, Z)

"""The client side of PVI: q(Z), q(log β) and the client's own u-factor, fitted by Adam with early stopping
(docs guide 'PVI') on the Monte-Carlo local free energy (paper eq. 7 with the α-scaled Z-KL of §4.1)::

    L_k,α = E_{q(Z)q(β)}[ ELL_k(Z, β) − KL[q(u|Z,β) ‖ q_\\k(u|Z,β)] ] − KL[q(β) ‖ q_\\k(β)] − α KL[q(Z) ‖ q_\\k(Z)]

built from the package's objects: GaussianInducingPoints (q(Z)), LogNormalHyperparameters (q(log β)),
PseudoObservations (the own DPO factor and the cavity's pseudo-sets; CPO: natural factors) and
:func:`gpflow_fed.models.dpo_svgp.dpo_free_energy_terms` (the per-sample terms of DPOSVGP's bound).

A :class:`LocalProblem` is a *worker* shared by every client with the same M_k: its variables, Adam optimizer
and compiled step are reused across clients and rounds (data and cavity have a dynamic leading dimension, so
N_k and the cavity size do not retrace); a client's data, cavity and factor are loaded before each update.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes
from gpflow.keras import tf_keras

from ....inducing_variables import S_FLOOR, GaussianInducingPoints, NaturalFactor, PseudoObservations
from ....inducing_variables.natural_factor import natural_whitened_terms
from ....models.dpo_svgp import dpo_free_energy_terms
from ....posteriors import LogNormalHyperparameters
from ....training.adam import adam_steps
from .factors import NaturalGaussian

MAX_JITTER = 1e-2
MAX_HALVINGS = 6
"""After the jitter is exhausted, a failed chunk is retried with half the learning rate, at most this many times."""
CHUNK = 10
"""Adam steps per call of the compiled step (one Python round trip per chunk)."""


def num_hyperparameters(input_dim: int, likelihood: gpflow.likelihoods.Likelihood, learn: bool) -> int:
    """H = D + 1, or D + 2 with a learned Gaussian noise variance (0 when β is fixed)."""
    return (int(input_dim) + 1 + int(isinstance(likelihood, gpflow.likelihoods.Gaussian))) if learn else 0


@check_shapes("return: [H]")
def initial_log_beta(
    kernel: gpflow.kernels.Kernel, likelihood: gpflow.likelihoods.Likelihood, input_dim: int
) -> np.ndarray:
    """log of the SE-ARD kernel's (and a Gaussian noise's) values: the initial mean of q(log β)."""
    ls = np.broadcast_to(np.asarray(kernel.lengthscales.numpy(), float), (int(input_dim),))
    values = list(ls) + [float(kernel.variance.numpy())]
    if isinstance(likelihood, gpflow.likelihoods.Gaussian):
        values.append(float(cast(gpflow.Parameter, likelihood.variance).numpy()))  # no variance_function
    return np.log(np.asarray(values))


class CPOFactor:
    """A client's own CPO factor over u (paper §5.1) as trainable ``(m [M, 1], S_raw [M, M])``: S_k = L Lᵀ +
    S_FLOOR·I with L = tril(S_raw) and an exp diagonal (positive definite for any S_raw); natural parameters
    Λ = S_k⁻¹, η = Λ m."""

    def __init__(self, M: int, dtype: tf.DType) -> None:
        self.m = tf.Variable(tf.zeros((M, 1), dtype), shape=(M, 1))
        self.S_raw = tf.Variable(tf.zeros((M, M), dtype), shape=(M, M))

    def cpo_sqrt(self) -> tf.Tensor:
        """Cholesky factor of ``S_k = L Lᵀ + S_FLOOR·I``, ``L`` lower-triangular with an exp diagonal.
        The floor bounds the factor's precision by 1/S_FLOOR, as for DPO's diagonal s: without it Adam drives
        S_k's eigenvalues to 0 in directions the client cannot see, which breaks other clients' cavities (docs
        "Why CPO's S_k has a floor")."""
        raw = tf.linalg.band_part(self.S_raw, -1, 0)
        L = raw - tf.linalg.diag(tf.linalg.diag_part(raw)) + tf.linalg.diag(tf.exp(tf.linalg.diag_part(raw)))
        eye = tf.eye(tf.shape(L)[0], dtype=L.dtype)
        return tf.linalg.cholesky(tf.matmul(L, L, transpose_b=True) + S_FLOOR * eye)

    def natural(self) -> Tuple[tf.Tensor, tf.Tensor]:
        """``(η, Λ)`` with Λ = S_k⁻¹ = Ls⁻ᵀ Ls⁻¹ and η = Λ m."""
        Ls = self.cpo_sqrt()
        Linv = tf.linalg.triangular_solve(Ls, tf.eye(tf.shape(Ls)[0], dtype=Ls.dtype), lower=True)
        Lam = tf.matmul(Linv, Linv, transpose_a=True)
        return tf.matmul(Lam, self.m), Lam

    def whitened_terms(self, kernel: object, Z: tf.Tensor, L: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        return natural_whitened_terms(L, *self.natural())


class LocalProblem:
    """Variables and a compiled Adam step for every client with the same own-factor shape.

    :param kernel: the GPflow kernel (used as is when β is fixed; its SE-ARD values initialise q(log β) otherwise).
    :param likelihood: the GPflow likelihood (a Gaussian's noise variance is part of β when it is learned).
    :param input_dim: D.
    :param learn_hyperparameters: train q(log β) (else β is the kernel's and likelihood's fixed values).
    :param M: number of inducing inputs.
    :param mode: how Z is handled: ``"distribution"`` (q(Z) mean and log-variance are trained, α-scaled KL to
        the cavity), ``"point"`` (a point Z, the mean of q(Z); trained only in the FedAvg-Z joint phase).
    :param param: ``"dpo"`` (own pseudo-set V, m, log s) or ``"cpo"`` (own m and Cholesky of S over u).
    :param num_pseudo: M_k (DPO; the only shape that is fixed per worker).
    """

    def __init__(
        self,
        kernel: gpflow.kernels.Kernel,
        likelihood: gpflow.likelihoods.Likelihood,
        input_dim: int,
        *,
        learn_hyperparameters: bool,
        M: int,
        num_pseudo: int,
        mode: str,
        param: str,
        alpha: float,
        num_samples: int,
        learning_rate: float,
    ) -> None:
        dtype = gpflow.default_float()
        self.kernel, self.likelihood = kernel, likelihood
        self.mode, self.param, self.alpha, self.S = mode, param, float(alpha), int(num_samples)
        D, H = int(input_dim), num_hyperparameters(input_dim, likelihood, learn_hyperparameters)
        self.num_hyper = H
        z: Callable[..., tf.Variable] = lambda *shape: tf.Variable(tf.zeros(shape, dtype), shape=shape, trainable=False)  # noqa: E731

        def dynamic(*shape: int) -> tf.Variable:  # leading dimension may change between loads
            return tf.Variable(tf.zeros((0, *shape), dtype), shape=tf.TensorShape([None, *shape]), trainable=False)

        self.X, self.Y = dynamic(D), dynamic(1)
        self.q_Z = GaussianInducingPoints(np.zeros((M, D)), 1.0)
        self.cavZ_nu, self.cavZ_lam = z(M, D), z(M, D)
        self.q_beta = LogNormalHyperparameters(np.zeros(H), 1.0, D) if H else None
        self.cavR_nu, self.cavR_lam = z(max(H, 1)), z(max(H, 1))
        self.own: Any  # PseudoObservations (param "dpo") or CPOFactor ("cpo")
        if param == "dpo":
            self.own = PseudoObservations(np.zeros((num_pseudo, D)), np.zeros(num_pseudo), np.ones(num_pseudo))
            self.cav: Any = PseudoObservations(np.zeros((1, D)), np.zeros(1), np.ones(1), dynamic=True)
            self.factor_vars = {
                "V": self.own.V.unconstrained_variable,
                "m": self.own.m.unconstrained_variable,
                "log_s": self.own.S_diag.unconstrained_variable,
            }
        else:
            self.own = CPOFactor(M, dtype)
            self.cav = NaturalFactor(np.zeros((M, 1)), np.zeros((M, M)))
            self.factor_vars = {"m": self.own.m, "S_raw": self.own.S_raw}
        self.jitter = tf.Variable(tf.cast(1e-6, dtype), trainable=False)
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seed = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.learning_rate = float(learning_rate)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate, beta_1=0.9, beta_2=0.999)
        self._steps: Dict[str, tf.types.experimental.GenericFunction] = {}
        self.optimizer.build(self.trainables("all"))  # one optimizer serves the "factor", "joint" and "all" steps

    # --- loading a client ----------------------------------------------------------------------------
    def load(
        self,
        data: Tuple[np.ndarray, np.ndarray],
        factor: Mapping[str, np.ndarray],
        *,
        seed: int,
        counter: int,
        jitter: float,
    ) -> None:
        """Make this worker client k's problem: its data, its own factor (``V, m, log_s`` or ``m, S_raw``),
        its random-stream position and jitter; Adam moments and learning rate are reset (pvi: "Resetting
        optimiser")."""
        self.X.assign(data[0]), self.Y.assign(data[1])
        for name, var in self.factor_vars.items():
            var.assign(factor[name])
        self.seed.assign(int(seed)), self.counter.assign(int(counter)), self.jitter.assign(float(jitter))
        for v in self.optimizer.variables:
            v.assign(tf.zeros_like(v))
        self.optimizer.learning_rate.assign(self.learning_rate)

    def snapshot(self) -> Dict[str, np.ndarray]:
        """The client's own trainable factor parameters, to keep between rounds (warm start)."""
        return {name: var.numpy() for name, var in self.factor_vars.items()}

    def set_cavity(
        self, qZ: Optional[NaturalGaussian], qrho: Optional[NaturalGaussian], sets: Mapping[str, np.ndarray]
    ) -> None:
        """Load the cavities: ``q_\\k(Z)`` and ``q_\\k(log β)`` in natural parameters, and the other clients' u-factors
        (DPO pseudo-sets ``V, m, s``, possibly none; CPO summed natural parameters ``eta, Lam``)."""
        if qZ is not None:
            self.cavZ_nu.assign(qZ.nu), self.cavZ_lam.assign(qZ.lam)
        if qrho is not None:
            self.cavR_nu.assign(qrho.nu), self.cavR_lam.assign(qrho.lam)
        if self.param == "dpo":
            self.cav.V.assign(sets["V"]), self.cav.m.assign(sets["m"])
            self.cav.S_diag.unconstrained_variable.assign(np.log(np.maximum(np.asarray(sets["s"]) - S_FLOOR, 1e-300)))
        else:
            self.cav.eta.assign(sets["eta"]), self.cav.Lam.assign(sets["Lam"])

    def set_q(
        self, Z: Optional[Tuple[np.ndarray, Optional[np.ndarray]]], rho: Optional[Tuple[np.ndarray, np.ndarray]]
    ) -> None:
        """Start values ``(mean, var)`` of q(Z) (or a point Z with var None) and of q(log β)."""
        if Z is not None:
            self.q_Z.Z_mean.assign(Z[0])
            if Z[1] is not None:
                self.q_Z.Z_var.unconstrained_variable.assign(np.log(Z[1]))
        if rho is not None:
            q_beta = cast(LogNormalHyperparameters, self.q_beta)  # given a start only when β is learnt
            q_beta.mean.assign(rho[0])
            q_beta.var.unconstrained_variable.assign(np.log(rho[1]))

    # --- the objective --------------------------------------------------------------------------------
    def free_energy(self, point_Z: bool) -> tf.Tensor:
        """The Monte-Carlo estimate of L_k,α (reparameterised samples of q(Z), q(log β)) at the loaded client's
        current random-stream position."""
        dtype = gpflow.default_float()
        seed = tf.stack([tf.convert_to_tensor(self.seed), tf.convert_to_tensor(self.counter)])
        M, D = self.q_Z.Z_mean.shape
        H = self.num_hyper
        eps_Z = tf.random.stateless_normal([self.S, M, D], seed=seed, dtype=dtype)
        eps_R = tf.random.stateless_normal([self.S, max(H, 1)], seed=seed + 1, dtype=dtype)
        X, Y = tf.convert_to_tensor(self.X), tf.convert_to_tensor(self.Y)
        total = tf.constant(0.0, dtype)
        q_beta = cast(LogNormalHyperparameters, self.q_beta)  # read only when H > 0, when q(log β) exists
        kern: Callable[..., tf.Tensor]  # the kernel, or q(log β)'s sampled kernel
        for s in range(self.S):
            Z = tf.convert_to_tensor(self.q_Z.Z_mean) if point_Z else self.q_Z.sample_from_noise(eps_Z[s][None])[0]
            kern, noise = self.kernel, None
            if H:
                beta = q_beta.sample_from_noise(eps_R[s, :H])
                kern, noise = q_beta.kernel(beta), q_beta.noise(beta)
            ell, kl_u = dpo_free_energy_terms(
                kern, self.likelihood, noise, X, Y, Z, [self.own], [self.cav], self.jitter
            )
            total += ell - kl_u
        bound = total / self.S
        if H:
            bound -= q_beta.kl_divergence(self.cavR_nu / self.cavR_lam, 1.0 / self.cavR_lam)
        if not point_Z:
            bound -= self.alpha * self.q_Z.kl_divergence(self.cavZ_nu / self.cavZ_lam, 1.0 / self.cavZ_lam)
        return bound

    def trainables(self, which: str) -> List[tf.Variable]:
        """``"factor"``: own factor (+ q(log β)); ``"all"``: also q(Z) (or the point Z for ``which="joint"``)."""
        out = list(self.factor_vars.values())
        if self.q_beta is not None:
            out += [self.q_beta.mean.unconstrained_variable, self.q_beta.var.unconstrained_variable]
        if which == "all":
            out += [self.q_Z.Z_mean.unconstrained_variable, self.q_Z.Z_var.unconstrained_variable]
        elif which == "joint":
            out += [self.q_Z.Z_mean.unconstrained_variable]
        return out

    def step_function(self, which: str) -> tf.types.experimental.GenericFunction:
        """The compiled chunk of Adam steps on ``trainables(which)``: ``f(n) -> losses [n]`` (n a scalar
        tensor, so any n reuses the one trace; check with ``f.experimental_get_tracing_count()``)."""
        if which not in self._steps:
            variables = self.trainables(which)
            point_Z = which != "all" or self.mode == "point"

            def steps(n: tf.Tensor) -> tf.Tensor:
                loss = lambda: -self.free_energy(point_Z)  # noqa: E731
                return adam_steps(loss, variables, self.optimizer, n, after_step=lambda: self.counter.assign_add(1))

            self._steps[which] = tf.function(steps, autograph=False)
        return self._steps[which]

    def fit(self, which: str, max_steps: int, patience: int, smoothing: int = 20) -> Tuple[float, int]:
        """Adam until the running mean of the free energy stops improving for ``patience`` steps (pvi
        ``EarlyStopping`` semantics on a ``smoothing``-step running mean) or ``max_steps``; the rule is
        checked after every step, and steps run in compiled chunks of :data:`CHUNK`.

        A chunk whose Cholesky fails is undone (variables, Adam state and random-stream position restored) and
        retried with the jitter ×10, up to :data:`MAX_JITTER`; past that, with half the learning rate
        (for the rest of this update), at most :data:`MAX_HALVINGS` times.
        TensorFlow's CPU Cholesky reports an indefinite matrix either by raising or by filling its output with
        NaNs, so a non-finite free energy is treated the same way. When neither helps it raises ``ValueError``
        (the client's factor is then left as it was before the failed chunk).
        :return: (final smoothed free energy, steps taken).
        """
        step = self.step_function(which)
        state = self.trainables(which) + list(self.optimizer.variables) + [self.counter]
        window: deque = deque(maxlen=smoothing)
        smoothed: List[float] = []
        steps = halvings = 0
        while steps < max_steps:
            before = [v.numpy() for v in state]
            try:
                losses = step(tf.constant(min(CHUNK, max_steps - steps), tf.int32)).numpy()
                failure = None if np.all(np.isfinite(losses)) else "the local free energy became non-finite"
            except tf.errors.InvalidArgumentError as exc:
                failure = f"Cholesky failed ({exc.message[:200]})"
            if failure is not None:
                for variable, value in zip(state, before):
                    variable.assign(value)
                jitter = float(self.jitter.numpy())
                if jitter * 10 <= MAX_JITTER:
                    self.jitter.assign(jitter * 10.0)
                elif halvings < MAX_HALVINGS:
                    halvings += 1
                    self.optimizer.learning_rate.assign(self.learning_rate / 2**halvings)
                else:
                    rate = self.learning_rate / 2**halvings
                    raise ValueError(f"{failure} even with jitter {jitter:.0e} and learning rate {rate:.1e}")
                continue
            stop = False
            for loss in losses:
                steps += 1
                window.append(-float(loss))
                smoothed.append(float(np.mean(window)))
                if steps >= smoothing + patience and max(smoothed[-patience:]) <= smoothed[-patience - 1]:
                    stop = True
            if stop:
                break
        return (smoothed[-1] if smoothed else float("nan")), steps

    # --- reading the result -----------------------------------------------------------------------
    def q_Z_moments(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the client's q(Z)."""
        return self.q_Z.Z_mean.numpy(), self.q_Z.Z_var.numpy()

    def q_rho_moments(self) -> Tuple[np.ndarray, np.ndarray]:
        """``(mean, var)`` of the client's q(log β) (empty arrays when β is fixed)."""
        if self.q_beta is None:
            return np.zeros(0), np.zeros(0)
        return self.q_beta.mean.numpy(), self.q_beta.var.numpy()

    def own_factor_arrays(self) -> Dict[str, np.ndarray]:
        """DPO: ``V, m, s``; CPO: natural parameters ``eta [M, 1], Lam [M, M]`` of t_k(u)."""
        if self.param == "dpo":
            return {"V": self.own.V.numpy(), "m": self.own.m.numpy(), "s": self.own.S_diag.numpy()}
        eta, Lam = self.own.natural()
        return {"eta": eta.numpy(), "Lam": Lam.numpy()}


def stack_sets(sets: Sequence[Dict[str, np.ndarray]], D: int) -> Dict[str, np.ndarray]:
    """Concatenate DPO pseudo-sets (with diagonal S the union of pseudo-sets is exactly the product of factors)."""
    if not sets:
        return {"V": np.zeros((0, D)), "m": np.zeros((0, 1)), "s": np.zeros((0,))}
    return {k: np.concatenate([s[k] for s in sets], axis=0) for k in ("V", "m", "s")}

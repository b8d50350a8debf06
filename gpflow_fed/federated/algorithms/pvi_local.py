"""The client side of PVI: trainable q(Z), q(log β) and a client's own u-factor, fitted by Adam on the
Monte-Carlo local free energy of :mod:`pvi_objective` (spec §2.6, §5) with early stopping (spec P9).

A :class:`LocalProblem` is a *worker*: its variables, Adam optimizer and compiled step are shared by every
client whose own factor has the same shape (the same M_k). The data, the cavity and the client's persistent
factor are loaded into the worker before each local update (:meth:`LocalProblem.load`) and read back after it
(:meth:`LocalProblem.snapshot`), so the step is traced once per shape signature and reused across clients and
rounds; data and cavity variables have a dynamic leading dimension, so N_k and the cavity size do not retrace.
"""

from __future__ import annotations

from collections import deque
from typing import Dict, List, Mapping, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from .pvi_objective import RHO_CLIP, HyperModel, PseudoSets, meanfield_kl_natural, sample_terms

S_FLOOR = 1e-6
MAX_JITTER = 1e-2
MAX_HALVINGS = 6
"""After the jitter is exhausted, a failed chunk is retried with half the learning rate, at most this many times."""
CHUNK = 10
"""Adam steps per call of the compiled step (one Python round trip per chunk)."""


class LocalProblem:
    """Variables and a compiled Adam step for every client with the same own-factor shape.

    :param mode: how Z is handled: ``"distribution"`` (q(Z) mean and log-variance are trained, α-scaled KL to
        the cavity), ``"point"`` (a point Z is a variable; trained only in the FedAvg-Z joint phase).
    :param param: ``"dpo"`` (own pseudo-set V, m, log s) or ``"cpo"`` (own m and Cholesky of S over u).
    :param num_pseudo: M_k (DPO; the only shape that is fixed per worker).
    """

    def __init__(
        self,
        hyper: HyperModel,
        input_dim: int,
        *,
        M: int,
        num_pseudo: int,
        mode: str,
        param: str,
        alpha: float,
        num_samples: int,
        learning_rate: float,
    ) -> None:
        dtype = gpflow.default_float()
        self.hyper, self.mode, self.param, self.alpha, self.S = hyper, mode, param, float(alpha), int(num_samples)
        D, H = int(input_dim), hyper.num_hyper
        z = lambda *shape: tf.Variable(tf.zeros(shape, dtype), shape=shape)  # noqa: E731

        def dynamic(*shape: int) -> tf.Variable:  # leading dimension may change between loads
            return tf.Variable(tf.zeros((0, *shape), dtype), shape=tf.TensorShape([None, *shape]), trainable=False)

        self.X, self.Y = dynamic(D), dynamic(1)
        self.Z_mean, self.Z_logvar = z(M, D), z(M, D)
        self.cavZ_nu, self.cavZ_lam = z(M, D), z(M, D)
        self.rho_mean, self.rho_logvar, self.cavR_nu, self.cavR_lam = z(H), z(H), z(H), z(H)
        if param == "dpo":
            self.V, self.m, self.log_s = z(num_pseudo, D), z(num_pseudo, 1), z(num_pseudo)
            cav_s = tf.Variable(tf.zeros((0,), dtype), shape=tf.TensorShape([None]), trainable=False)
            self.cav = PseudoSets(V=dynamic(D), m=dynamic(1), s=cav_s)
            self.factor_vars = {"V": self.V, "m": self.m, "log_s": self.log_s}
        else:
            self.m, self.S_raw = z(M, 1), z(M, M)
            self.cav = PseudoSets(eta=z(M, 1), Lam=z(M, M))
            self.factor_vars = {"m": self.m, "S_raw": self.S_raw}
        self.jitter = tf.Variable(tf.cast(1e-6, dtype), trainable=False)
        self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.seed = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.learning_rate = float(learning_rate)
        self.optimizer = tf_keras.optimizers.Adam(learning_rate=learning_rate, beta_1=0.9, beta_2=0.999)
        self._steps: Dict[str, tf.types.experimental.GenericFunction] = {}
        self.optimizer.build(self.trainables("all"))  # one optimizer serves the "factor", "joint" and "all" steps

    # --- loading a client ----------------------------------------------------------------------------
    def load(self, data: Tuple[np.ndarray, np.ndarray], factor: Mapping[str, np.ndarray], *, seed: int, counter: int, jitter: float) -> None:
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

    def set_cavity_sets(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Load the other clients' u-factors (DPO ``V, m, s``; CPO ``eta, Lam``) into the cavity."""
        for name, value in arrays.items():
            getattr(self.cav, name).assign(value)

    # --- the client's own factor -------------------------------------------------------------------
    def own_sets(self) -> PseudoSets:
        if self.param == "dpo":
            return PseudoSets(V=self.V, m=self.m, s=S_FLOOR + tf.exp(self.log_s))
        Ls = self.cpo_sqrt()
        # Λ = S⁻¹ = Ls⁻ᵀ Ls⁻¹, η = Λ m
        Linv = tf.linalg.triangular_solve(Ls, tf.eye(tf.shape(Ls)[0], dtype=Ls.dtype), lower=True)
        Lam = tf.matmul(Linv, Linv, transpose_a=True)
        return PseudoSets(eta=tf.matmul(Lam, self.m), Lam=Lam)

    def cpo_sqrt(self) -> tf.Tensor:
        """Cholesky factor of ``S_k = L Lᵀ + S_FLOOR·I``, ``L`` lower-triangular with an exp diagonal (spec P3).

        The floor bounds the factor's precision S_k⁻¹ by 1/S_FLOOR, as it bounds DPO's diagonal s. Without it,
        directions of u that the client's objective cannot see (where the sampled K_ZZ is nearly singular) let
        Adam drive S_k's eigenvalues below 1e-15: the factor then breaks every other client's cavity (another Z
        sample sees that direction) and the server's running sum of natural parameters loses all its digits
        (seen on the ozone CPO run: a factor precision of 2.4e17 after round 6, an indefinite cavity in round 31;
        ``benchmarks/pvi_diagnostics.py cpo-factors``)."""
        raw = tf.linalg.band_part(self.S_raw, -1, 0)
        L = raw - tf.linalg.diag(tf.linalg.diag_part(raw)) + tf.linalg.diag(tf.exp(tf.linalg.diag_part(raw)))
        eye = tf.eye(tf.shape(L)[0], dtype=L.dtype)
        return tf.linalg.cholesky(tf.matmul(L, L, transpose_b=True) + S_FLOOR * eye)

    # --- the objective --------------------------------------------------------------------------------
    def free_energy(self, point_Z: bool) -> tf.Tensor:
        """The Monte-Carlo estimate of L_k,α (spec §2.6) at the loaded client's current random-stream position."""
        dtype = self.Z_mean.dtype
        seed = tf.stack([tf.convert_to_tensor(self.seed), tf.convert_to_tensor(self.counter)])
        M, D = self.Z_mean.shape
        H = self.hyper.num_hyper
        eps_Z = tf.random.stateless_normal([self.S, M, D], seed=seed, dtype=dtype)
        eps_R = tf.random.stateless_normal([self.S, max(H, 1)], seed=seed + 1, dtype=dtype)
        own = [self.own_sets()]
        X, Y = tf.convert_to_tensor(self.X), tf.convert_to_tensor(self.Y)
        total = tf.constant(0.0, dtype)
        for s in range(self.S):
            if point_Z:
                Z = tf.convert_to_tensor(self.Z_mean)
            else:
                Z = self.Z_mean + tf.exp(0.5 * self.Z_logvar) * eps_Z[s]
            beta = None
            if H:
                rho = self.rho_mean + tf.exp(0.5 * self.rho_logvar) * eps_R[s, :H]
                beta = tf.exp(tf.clip_by_value(rho, -RHO_CLIP, RHO_CLIP))
            ell, kl_u = sample_terms(self.hyper, X, Y, Z, beta, own, [self.cav], self.jitter)
            total += ell - kl_u
        bound = total / self.S
        if H:
            bound -= meanfield_kl_natural(self.rho_mean, tf.exp(self.rho_logvar), self.cavR_nu, self.cavR_lam)
        if not point_Z:
            bound -= self.alpha * meanfield_kl_natural(self.Z_mean, tf.exp(self.Z_logvar), self.cavZ_nu, self.cavZ_lam)
        return bound

    def trainables(self, which: str) -> List[tf.Variable]:
        """``"factor"``: own factor (+ q(log β)); ``"all"``: also q(Z) (or the point Z for ``which="joint"``)."""
        out = list(self.factor_vars.values())
        if self.hyper.num_hyper:
            out += [self.rho_mean, self.rho_logvar]
        if which == "all":
            out += [self.Z_mean, self.Z_logvar]
        elif which == "joint":
            out += [self.Z_mean]
        return out

    def step_function(self, which: str) -> tf.types.experimental.GenericFunction:
        """The compiled chunk of Adam steps on ``trainables(which)``: ``f(n) -> losses [n]`` (n a scalar
        tensor, so any n reuses the one trace; check with ``f.experimental_get_tracing_count()``)."""
        if which not in self._steps:
            variables = self.trainables(which)
            point_Z = which != "all" or self.mode == "point"
            dtype = self.Z_mean.dtype

            @tf.function
            def steps(n: tf.Tensor) -> tf.Tensor:
                losses = tf.TensorArray(dtype, size=n)
                for i in tf.range(n):
                    with tf.GradientTape() as tape:
                        loss = -self.free_energy(point_Z)
                    grads = tape.gradient(loss, variables)
                    self.optimizer.apply_gradients(zip(grads, variables))
                    self.counter.assign_add(1)
                    losses = losses.write(i, loss)
                return losses.stack()

            self._steps[which] = steps
        return self._steps[which]

    def fit(self, which: str, max_steps: int, patience: int, smoothing: int = 20) -> Tuple[float, int]:
        """Adam until the running mean of the free energy stops improving for ``patience`` steps (pvi
        ``EarlyStopping`` semantics on a ``smoothing``-step running mean, spec §5) or ``max_steps``; the rule is
        checked after every step, and steps run in compiled chunks of :data:`CHUNK`.

        A chunk whose Cholesky fails is undone (variables, Adam state and random-stream position restored) and
        retried with the jitter ×10, up to :data:`MAX_JITTER` (spec P1); past that, with half the learning rate
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
        return self.Z_mean.numpy(), np.exp(self.Z_logvar.numpy())

    def q_rho_moments(self) -> Tuple[np.ndarray, np.ndarray]:
        return self.rho_mean.numpy(), np.exp(self.rho_logvar.numpy())

    def own_factor_arrays(self) -> Dict[str, np.ndarray]:
        """DPO: ``V, m, s``; CPO: natural parameters ``eta [M, 1], Lam [M, M]`` of t_k(u)."""
        own = self.own_sets()
        if self.param == "dpo":
            return {"V": self.V.numpy(), "m": self.m.numpy(), "s": own.s.numpy()}
        return {"eta": own.eta.numpy(), "Lam": own.Lam.numpy()}


def stack_sets(sets: Sequence[Dict[str, np.ndarray]], D: int) -> Dict[str, np.ndarray]:
    """Concatenate DPO pseudo-sets (diagonal S makes the union exact, spec §1.4)."""
    if not sets:
        return {"V": np.zeros((0, D)), "m": np.zeros((0, 1)), "s": np.zeros((0,))}
    return {k: np.concatenate([s[k] for s in sets], axis=0) for k in ("V", "m", "s")}

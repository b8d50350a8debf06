"""EnsembleSVGP: the Recyclable-GP ensemble of already fitted sparse GPs, without revisiting their data.

Paper: Moreno-Muñoz, Artés-Rodríguez & Álvarez, *Recyclable Gaussian Processes* (arXiv:2010.02554); equation
numbers below are that paper's. The whitened and closed forms are derived from them (checked numerically by the
tests); the docs guide 'Recyclable Gaussian processes' lists them and where the authors' code departs.

Given recyclable models ``M_k = {μ_k, S_k = L_kL_kᵀ, Z_k, θ_k}`` (:class:`RecyclableModel`) and a global sparse
GP ``q(u_*) = N(μ_*, S_*)`` at ``Z_*`` with kernel ψ, the ensemble bound (paper eq. 6 = App. eq. 14) is

    L_E = Σ_k E_{q_C(u_k)}[log q_k(u_k) − log p_k(u_k)] − KL(q(u_*) ‖ p(u_*)),

with the contrastive predictive ``q_C(u_k) = N(A_kμ_*, K^ψ_kk + A_k(S_* − K_**)A_kᵀ)``,
``A_k = K^ψ_{k*}K_**⁻¹`` (eq. 17) and ``p_k(u_k) = N(0, K_k)`` under the **local** kernel (eq. 18). Writing
``log q_k(u) − log p_k(u) = −½uᵀΛ_ku + h_kᵀu + c_k`` with ``Λ_k = S_k⁻¹ − K_k⁻¹``, ``h_k = S_k⁻¹μ_k`` and
``c_k = −½μ_kᵀS_k⁻¹μ_k − ½log|S_k| + ½log|K_k|``, and in whitened coordinates ``L = chol(K_**)``,
``W_k = L⁻¹K^ψ_{*k}``, ``α = L⁻¹μ_*``, ``R = L⁻¹L_*``:

    Σ_k E[·] = −½ tr(G(RRᵀ + ααᵀ)) + cᵀα + κ,   G = Σ_k W_kΛ_kW_kᵀ,  c = Σ_k W_kh_k,
    κ = −½ Σ_k tr(Λ_k K^ψ_kk) + ½ tr G + Σ_k c_k,

so one evaluation costs ``O(M_*³ + Σ_k M_*²M_k)``, independent of N. The closed-form optimum for fixed
``(Z_*, ψ)`` is ``S̃ = (I + G)⁻¹``, ``α = S̃c`` with the collapsed bound ``½cᵀS̃c − ½log|I + G| + κ``.
Local parameters are constants here: the bound never sends gradients to the recyclable models.
``kl="reverse"`` reproduces the authors' code, which uses ``KL(p‖q)``; the default is the paper's ``KL(q‖p)``.
"""

from __future__ import annotations

import functools
import warnings
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.base import Parameter
from gpflow.conditionals import base_conditional
from gpflow.kullback_leiblers import gauss_kl
from gpflow.models.model import GPModel, MeanAndVariance
from gpflow.models.training_mixins import InternalDataTrainingLossMixin
from gpflow.utilities import assert_params_false, set_trainable, triangular
from gpflow.utilities.ops import square_distance
from numpy.typing import DTypeLike
from scipy.linalg import solve_triangular

from ..validation import integer
from .recyclable import RecyclableModel, export_svgp
from .serialization import kernel_from_spec, kernel_spec, likelihood_from_spec, likelihood_spec

__all__ = ["EnsembleSVGP", "RecyclableWarning", "as_recyclable"]


class RecyclableWarning(UserWarning):
    """A local model is wider than its own prior (``S_k ⋠ K_k``), so the ensemble bound may be unbounded.

    With every ``S_k ⪯ K_k`` each ``Λ_k`` is positive semi-definite and the bound is concave and bounded in q;
    otherwise overlapping local models can make ``K_**⁻¹ + B`` indefinite.
    """


def as_recyclable(model: Any, index: int = 0) -> RecyclableModel:
    """Accept a :class:`RecyclableModel`, an unwhitened ``SVGP`` or an :class:`EnsembleSVGP` (pyramids,
    paper App. E.1).

    :raises ValueError: for a whitened SVGP (convert it explicitly with :func:`export_svgp`, which
        unwhitens with the local kernel's Cholesky factor).
    :raises TypeError: for anything else.
    """
    if isinstance(model, RecyclableModel):
        return model
    if isinstance(model, gpflow.models.SVGP):
        if model.whiten:
            raise ValueError(
                f"local model {index} is a whitened SVGP; its q(u) is not in the unwhitened form the ensemble needs. "
                "Convert it with gpflow_fed.models.export_svgp(model) or train it with whiten=False"
            )
        return export_svgp(model)
    if isinstance(model, EnsembleSVGP):
        return model.to_recyclable()
    raise TypeError(f"local model {index} is a {type(model).__name__}; expected RecyclableModel, SVGP or EnsembleSVGP")


class _Group:
    """Constants of the local models that share one M_k, stacked along a leading axis B, in the local models'
    whitened coordinates: ``L_K = chol(K_k)``, ``Q = L_S⁻¹L_K`` and ``h̃ = QᵀL_S⁻¹μ_k``, so that
    ``Λ_k = L_K⁻ᵀ(QᵀQ − I)L_K⁻¹`` and ``h_k = L_K⁻ᵀh̃``."""

    def __init__(self, Z: np.ndarray, L_K: np.ndarray, Q: np.ndarray, h: np.ndarray, offset: int) -> None:
        dtype = gpflow.default_float()
        self.B, self.M = Z.shape[0], Z.shape[1]
        self.Z, self.h, self.offset = tf.constant(Z, dtype), tf.constant(h, dtype), offset
        self.L_K, self.Q = tf.constant(L_K, dtype), tf.constant(Q, dtype)


def _local_grams(models: Sequence[RecyclableModel]) -> List[np.ndarray]:
    """``K_k = k_{θ_k}(Z_k, Z_k)`` of every local model, by one batched GPflow evaluation per kernel class and
    M_k: ``σ_k² · g(‖(z − z')/ℓ_k‖²)`` with g the class's unit-variance ``K_r2`` (all recyclable kernels are
    isotropic stationary). Building one GPflow kernel object per local model instead took most of the
    ensemble's set-up time."""
    dtype = gpflow.default_float()
    grams: List[np.ndarray] = [np.empty((0, 0))] * len(models)
    batches: Dict[Tuple[str, int], List[int]] = {}
    for i, m in enumerate(models):
        batches.setdefault((m.kernel["class"], m.num_inducing), []).append(i)
    for (name, _), indices in batches.items():
        unit = kernel_from_spec({"class": name, "variance": 1.0, "lengthscales": [1.0]})
        scaled = np.stack([models[i].Z / np.asarray(models[i].kernel["lengthscales"], dtype=dtype) for i in indices])
        unit_grams = unit.K_r2(square_distance(tf.constant(scaled, dtype), None)).numpy()
        for i, gram in zip(indices, unit_grams):
            grams[i] = float(models[i].kernel["variance"]) * gram
    return grams


class EnsembleSVGP(GPModel, InternalDataTrainingLossMixin):
    """Recyclable-GP ensemble over a dictionary of fitted sparse GPs (paper eq. 6), single latent function.

    :param local_models: non-empty sequence or mapping of :class:`RecyclableModel`, unwhitened ``SVGP`` or
        ``EnsembleSVGP`` (ensembles of ensembles).
    :param kernel: the global kernel ψ (trained).
    :param inducing_variable: ``InducingPoints`` or ``[M, D]`` array Z_* (trained).
    :param likelihood: used for ``predict_y`` / ``predict_log_density`` and the data term; ``None`` takes the
        local models' common likelihood (Gaussian: the mean of their noise variances; the
        authors fix σ = 1). Without
        ``data`` the bound does not depend on it, so its parameters are made non-trainable (also on the object
        passed in), and ``Scipy().minimize(model.training_loss, model.trainable_variables)`` works.
    :param q_mu: ``[M, 1]`` initial μ_* (default zeros). :param q_sqrt: ``[1, M, M]`` initial L_* (default prior).
    :param data: optional new ``(X, Y)`` whose likelihood term is kept exact (combined bound, App. C eq. 19).
    :param whiten: parameterise q in whitened coordinates (``α, R``); the bound is the same.
    :param kl: ``"forward"`` (paper, KL(q‖p)) or ``"reverse"`` (authors' code, KL(p‖q)).
    :param jitter: added to ``K_**`` and every local ``K_k`` (default GPflow's).
    """

    def __init__(
        self,
        local_models: Union[Sequence[Any], Mapping[str, Any]],
        kernel: gpflow.kernels.Kernel,
        inducing_variable: Any,
        likelihood: Optional[gpflow.likelihoods.Likelihood] = None,
        q_mu: Optional[np.ndarray] = None,
        q_sqrt: Optional[np.ndarray] = None,
        *,
        data: Optional[Tuple[np.ndarray, np.ndarray]] = None,
        whiten: bool = False,
        kl: str = "forward",
        jitter: Optional[float] = None,
    ) -> None:
        dtype = gpflow.default_float()
        if not isinstance(kernel, gpflow.kernels.Kernel):
            raise TypeError(f"kernel must be a gpflow Kernel, got {type(kernel).__name__}")
        if kl not in ("forward", "reverse"):
            raise ValueError(f"kl must be 'forward' (paper) or 'reverse' (authors' code), got {kl!r}")
        if not isinstance(inducing_variable, gpflow.inducing_variables.InducingPoints):
            Z: np.ndarray = np.asarray(inducing_variable, dtype=dtype)
            if Z.ndim != 2 or Z.shape[0] == 0 or not np.all(np.isfinite(Z)):
                raise ValueError(f"inducing_variable must be a finite [M, D] array, got shape {Z.shape}")
            inducing_variable = gpflow.inducing_variables.InducingPoints(Z)
        M, D = inducing_variable.Z.shape
        models = list(local_models.values()) if isinstance(local_models, Mapping) else list(local_models or [])
        if not models:
            raise ValueError("EnsembleSVGP needs at least one local model; the dictionary is empty")
        self.local_models: Tuple[RecyclableModel, ...] = tuple(as_recyclable(m, i) for i, m in enumerate(models))
        for i, m in enumerate(self.local_models):
            if m.input_dim != D:
                raise ValueError(f"local model {i} has input dimension {m.input_dim}, but Z_* has D = {D}")
        self.jitter = float(gpflow.config.default_jitter() if jitter is None else jitter)
        if likelihood is None:
            likelihood = self._common_likelihood()
        if data is not None:
            data = self._check_data(data, D, likelihood)
        super().__init__(kernel, likelihood, None, num_latent_gps=1)
        if data is None:  # the bound does not involve the likelihood: leave nothing without a gradient
            set_trainable(self.likelihood, False)
        self.inducing_variable = inducing_variable
        self.data = data
        self.whiten = bool(whiten)
        self.kl = kl
        self._precompute()
        if q_mu is None:
            q_mu = np.zeros((M, 1), dtype=dtype)
        if q_sqrt is None:
            q_sqrt = np.eye(M, dtype=dtype)
            if not whiten:
                q_sqrt = np.linalg.cholesky(self._Kuu().numpy())
        q_mu, q_sqrt = np.asarray(q_mu, dtype=dtype), np.asarray(q_sqrt, dtype=dtype)
        q_sqrt = q_sqrt[None] if q_sqrt.ndim == 2 else q_sqrt
        if q_mu.shape != (M, 1) or q_sqrt.shape != (1, M, M):
            raise ValueError(f"q_mu must be [{M}, 1] and q_sqrt [1, {M}, {M}], got {q_mu.shape} and {q_sqrt.shape}")
        self.q_mu = Parameter(q_mu, dtype=dtype)
        self.q_sqrt = Parameter(q_sqrt, transform=triangular())

    # --- set-up ----------------------------------------------------------------------------------------
    def _common_likelihood(self) -> gpflow.likelihoods.Likelihood:
        specs = [m.likelihood for m in self.local_models]
        if specs and all(s is not None and s["class"] == "Gaussian" for s in specs):
            variances = [cast(Mapping[str, Any], s)["variance"] for s in specs]  # none is None (checked)
            return gpflow.likelihoods.Gaussian(variance=float(np.mean(variances)))
        if specs[0] is not None and all(s == specs[0] for s in specs):
            return cast(gpflow.likelihoods.Likelihood, likelihood_from_spec(specs[0]))  # a spec gives one
        raise ValueError(
            "local models have different or unknown likelihoods; pass likelihood= explicitly "
            "(e.g. gpflow_fed.likelihoods.HeterogeneousLikelihood or the likelihood of the output to predict)"
        )

    @staticmethod
    def _check_data(data: Any, D: int, likelihood: Any) -> Tuple[tf.Tensor, tf.Tensor]:
        dtype: DTypeLike = gpflow.default_float()
        X, Y = (np.asarray(a, dtype=dtype) for a in data)
        if X.ndim != 2 or X.shape[1] != D or Y.ndim != 2 or Y.shape[0] != X.shape[0] or X.shape[0] == 0:
            raise ValueError(f"data must be (X [N, {D}], Y [N, P]) with N > 0, got {X.shape} and {Y.shape}")
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(Y))):
            raise ValueError("data contains NaN or inf")
        if hasattr(likelihood, "check_index"):
            likelihood.check_index(Y)
        return tf.constant(X), tf.constant(Y)

    def _precompute(self) -> None:
        """Constants of every recyclable model, once: Λ_k, h_k, c_k and the width check ``S_k ⪯ K_k``."""
        dtype = gpflow.default_float()
        per_size: Dict[int, List[Tuple[np.ndarray, ...]]] = {}
        total_c, ratios = 0.0, []
        self._local_chol: List[Tuple[np.ndarray, np.ndarray]] = []
        for i, (m, K_k) in enumerate(zip(self.local_models, _local_grams(self.local_models))):
            K_k = K_k + self.jitter * np.eye(m.num_inducing, dtype=dtype)
            # L_S is q_sqrt itself with a positive diagonal (forming S_k = L_kL_kᵀ and refactorising it would
            # square its condition number)
            diag = np.diag(m.q_sqrt)
            try:
                if not np.all(np.abs(diag) > 0):
                    raise np.linalg.LinAlgError("zero on the diagonal of q_sqrt")
                L_K, L_S = np.linalg.cholesky(K_k), m.q_sqrt * np.sign(diag)[None, :]
            except np.linalg.LinAlgError as exc:
                raise ValueError(f"local model {i}: K_k or S_k is not positive definite (singular q_sqrt?)") from exc
            self._local_chol.append((L_S, L_K))
            Q = solve_triangular(L_S, L_K, lower=True)  # L_S⁻¹L_K: no explicit inverse of an ill-conditioned factor
            mu_s = solve_triangular(L_S, m.q_mu[:, 0], lower=True)  # L_S⁻¹μ_k
            total_c += float(-0.5 * mu_s @ mu_s - np.sum(np.log(np.abs(np.diag(L_S)))) + np.sum(np.log(np.diag(L_K))))
            A = solve_triangular(L_K, L_S, lower=True)
            ratios.append(float(np.linalg.svd(A, compute_uv=False)[0] ** 2))
            per_size.setdefault(m.num_inducing, []).append((m.Z, L_K, Q, Q.T @ mu_s))
        self.prior_width_ratios = np.array(ratios)
        wide = np.flatnonzero(self.prior_width_ratios > 1.0 + 1e-3)
        if wide.size:
            warnings.warn(
                f"local models {wide.tolist()} are wider than their own prior (max eigenvalue of L_K⁻¹S_kL_K⁻ᵀ up to "
                f"{self.prior_width_ratios.max():.4g} > 1); the ensemble bound may be unbounded",
                RecyclableWarning,
                stacklevel=3,
            )
        self._sum_c = tf.constant(total_c, dtype=dtype)
        self._groups: List[_Group] = []
        offset, Z_all = 0, []
        for Mk, items in per_size.items():
            Z, L_K, Q, h = (np.stack(parts) for parts in zip(*items))
            self._groups.append(_Group(Z, L_K, Q, h, offset))
            Z_all.append(Z.reshape(-1, Z.shape[-1]))
            offset += Z.shape[0] * Mk
        self._Z_all = tf.constant(np.concatenate(Z_all, axis=0), dtype)

    # --- the bound -------------------------------------------------------------------------------------
    def _Kuu(self) -> tf.Tensor:
        return gpflow.covariances.Kuu(self.inducing_variable, self.kernel, jitter=self.jitter)

    def _cross(self, Za: tf.Tensor, Zb: tf.Tensor) -> tf.Tensor:
        """``Cov(u(Za), u(Zb)) = ψ(Za, Zb) + ε·[za = zb]``: the jitter ε of ``K_**`` and ``K_k`` is a nugget on the
        inducing outputs, so an inducing input shared by Z_* and Z_k carries it in the cross-covariance too.
        Without it ``A_k = K_{k*}K_**⁻¹`` is not the identity when Z_* = Z_k, ψ = θ_k, and an ensemble of one
        model would not reproduce that model where ``ε/λ_min(K_k)`` is not negligible (ill-conditioned Z_k)."""
        same = tf.reduce_all(tf.equal(Za[:, None, :], Zb[None, :, :]), axis=-1)
        return self.kernel.K(Za, Zb) + tf.cast(self.jitter, Za.dtype) * tf.cast(same, Za.dtype)

    def _statistics(self, with_data: bool) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor, tf.Tensor]:
        """``(L, G, c, κ)`` of the module docstring; with Gaussian data also its exact terms (closed form)."""
        Z = self.inducing_variable.Z
        L = tf.linalg.cholesky(self._Kuu())
        K_all = self._cross(self._Z_all, Z)  # [ΣM_k, M*]
        M = tf.shape(L)[0]
        G = tf.zeros_like(L)
        c = tf.zeros([M], dtype=L.dtype)
        trace = tf.constant(0.0, dtype=L.dtype)
        for g in self._groups:
            # T_k = L⁻¹K^ψ_{*k}L_K⁻ᵀ = W_kL_K⁻ᵀ (the identity when ψ = θ_k and Z_* = Z_k), so that
            # W_kΛ_kW_kᵀ = T_k(QᵀQ − I)T_kᵀ and W_kh_k = T_kh̃ (whitened in both coordinates).
            Kg = tf.reshape(K_all[g.offset : g.offset + g.B * g.M], [g.B, g.M, M])
            U = tf.linalg.triangular_solve(g.L_K, Kg, lower=True)  # L_K⁻¹K^ψ_{k*}, [B, M_k, M*]
            T = tf.linalg.triangular_solve(L, tf.reshape(tf.transpose(U, [2, 0, 1]), [M, g.B * g.M]), lower=True)
            T = tf.reshape(T, [M, g.B, g.M])
            V_S = tf.einsum("mbi,bji->mbj", T, g.Q)
            G += tf.einsum("mbj,nbj->mn", V_S, V_S) - tf.einsum("mbj,nbj->mn", T, T)
            c += tf.einsum("mbi,bi->m", T, g.h)
            # tr(Λ_kK^ψ_kk) = tr((QᵀQ − I)L_K⁻¹K^ψ_kkL_K⁻ᵀ), K^ψ_kk with the nugget ε (see _cross)
            K_kk = self.kernel.K(g.Z) + tf.cast(self.jitter, L.dtype) * tf.eye(g.M, dtype=L.dtype)
            A = tf.linalg.triangular_solve(g.L_K, K_kk, lower=True)
            K_w = tf.linalg.triangular_solve(g.L_K, tf.linalg.matrix_transpose(A), lower=True)
            trace += tf.reduce_sum(tf.matmul(g.Q, K_w) * g.Q) - tf.linalg.trace(tf.reduce_sum(K_w, 0))
        kappa = -0.5 * trace + 0.5 * tf.linalg.trace(G) + self._sum_c
        if with_data and self.data is not None:
            if not isinstance(self.likelihood, gpflow.likelihoods.Gaussian):
                raise ValueError("the closed form and collapsed bound need a Gaussian likelihood for the new data")
            X, Y = self.data
            s2 = self.likelihood.variance
            Wn = tf.linalg.triangular_solve(L, self.kernel.K(Z, X), lower=True)
            G += tf.matmul(Wn, Wn, transpose_b=True) / s2
            c += tf.linalg.matvec(Wn, Y[:, 0]) / s2
            n = tf.cast(tf.shape(X)[0], L.dtype)
            kappa += (
                -0.5 * tf.reduce_sum(self.kernel.K_diag(X)) / s2
                + 0.5 * tf.reduce_sum(tf.square(Wn)) / s2
                - 0.5 * n * tf.math.log(tf.cast(2 * np.pi, L.dtype) * s2)
                - 0.5 * tf.reduce_sum(tf.square(Y)) / s2
            )
        return L, G, c[:, None], kappa

    def _whitened_q(self, L: tf.Tensor) -> Tuple[tf.Tensor, tf.Tensor]:
        if self.whiten:
            return self.q_mu, self.q_sqrt[0]
        return (
            tf.linalg.triangular_solve(L, self.q_mu, lower=True),
            tf.linalg.triangular_solve(L, self.q_sqrt[0], lower=True),
        )

    @check_shapes("return: []")
    def prior_kl(self) -> tf.Tensor:
        """``KL(q(u_*)‖p(u_*))`` (paper eq. 6) or, with ``kl="reverse"``, the authors' code's ``KL(p‖q)``."""
        alpha, R = self._whitened_q(tf.linalg.cholesky(self._Kuu()))
        if self.kl == "forward":
            return gauss_kl(alpha, R[None], K=None)
        # KL(N(0, I) ‖ N(α, RRᵀ)) in whitened coordinates (KL is invariant under the map L·).
        M = tf.cast(tf.shape(R)[0], R.dtype)
        Rinv = tf.linalg.triangular_solve(R, tf.eye(tf.shape(R)[0], dtype=R.dtype), lower=True)
        Rinv_alpha = tf.linalg.triangular_solve(R, alpha, lower=True)
        logdet = 2.0 * tf.reduce_sum(tf.math.log(tf.abs(tf.linalg.diag_part(R))))
        return 0.5 * (tf.reduce_sum(tf.square(Rinv)) + tf.reduce_sum(tf.square(Rinv_alpha)) - M + logdet)

    @check_shapes("return: []")
    def elbo(self) -> tf.Tensor:
        """The ensemble bound ``L_E`` (paper eq. 6 / App. eq. 14), plus the exact data term of App. C (eq. 19)
        when ``data`` was given (computed with the likelihood's ``variational_expectations``)."""
        L, G, c, kappa = self._statistics(with_data=False)
        alpha, R = self._whitened_q(L)
        GR = tf.matmul(G, R)
        expected = (
            -0.5 * (tf.reduce_sum(R * GR) + tf.reduce_sum(alpha * tf.matmul(G, alpha)))
            + tf.reduce_sum(c * alpha)
            + kappa
        )
        bound = expected - self.prior_kl()
        if self.data is not None:
            X, Y = self.data
            f_mean, f_var = self.predict_f(X)
            bound += tf.reduce_sum(self.likelihood.variational_expectations(X, f_mean, f_var, Y))
        return bound

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        return self.elbo()

    @check_shapes("return: []")
    def collapsed_elbo(self) -> tf.Tensor:
        """``max_q L_E`` for the current ``(Z_*, ψ)``: ``½cᵀ(I+G)⁻¹c − ½log|I+G| + κ`` (whitened form).

        Needs ``kl="forward"`` and no data or Gaussian data. Fails (Cholesky error) where ``I + G`` is not
        positive definite, i.e. where the bound is unbounded in q (see :class:`RecyclableWarning`).
        """
        self._check_closed_form()
        _, G, c, kappa = self._statistics(with_data=True)
        LA = tf.linalg.cholesky(tf.eye(tf.shape(G)[0], dtype=G.dtype) + G)
        v = tf.linalg.triangular_solve(LA, c, lower=True)
        return 0.5 * tf.reduce_sum(tf.square(v)) - tf.reduce_sum(tf.math.log(tf.linalg.diag_part(LA))) + kappa

    def _check_closed_form(self) -> None:
        if self.kl != "forward":
            raise ValueError("the closed-form optimum exists only for kl='forward' (the paper's bound)")
        if self.data is not None and not isinstance(self.likelihood, gpflow.likelihoods.Gaussian):
            raise ValueError(
                "the closed-form optimum needs a Gaussian likelihood for the new data; use fit(method='joint')"
            )

    def precision_min_eigenvalue(self) -> float:
        """``λ_min(I + G)``; the bound is concave and bounded in q iff it is positive (a monitor to watch)."""
        _, G, _, _ = self._statistics(with_data=True)
        return float(np.linalg.eigvalsh(np.eye(G.shape[0]) + G.numpy())[0])

    def set_optimal_q(self) -> None:
        """Assign the closed-form optimum ``S_* = (K_**⁻¹ + B)⁻¹``, ``μ_* = S_*b`` for the current ``(Z_*, ψ)``.

        :raises ValueError: if ``K_**⁻¹ + B`` is not positive definite (unbounded bound); q is unchanged.
        """
        self._check_closed_form()
        L, G, c, _ = (t.numpy() for t in self._statistics(with_data=True))
        A = np.eye(G.shape[0]) + G
        if np.linalg.eigvalsh(A)[0] <= 0:
            raise ValueError(
                "K_**⁻¹ + B is not positive definite: some local models are wider than their prior and overlap, so "
                "the ensemble bound is unbounded in S_*; refit those local models or drop them"
            )
        S_tilde = np.linalg.inv(A)
        alpha, R = S_tilde @ c, np.linalg.cholesky(0.5 * (S_tilde + S_tilde.T))
        if not self.whiten:
            alpha, R = L @ alpha, L @ R
        self.q_mu.assign(alpha)
        self.q_sqrt.assign(R[None])

    # --- diagnostics -----------------------------------------------------------------------------------
    def contrastive_predictive(self, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """``(m_C,k [M_k, 1], Σ_C,k [M_k, M_k])`` of eq. 17, via GPflow's ``base_conditional``."""
        Z_k = tf.constant(self.local_models[k].Z, gpflow.default_float())
        Z = self.inducing_variable.Z
        mean, cov = base_conditional(
            self._cross(Z, Z_k), self._Kuu(), self.kernel.K(Z_k), self.q_mu,
            full_cov=True, q_sqrt=self.q_sqrt, white=self.whiten,
        )  # fmt: skip
        return mean.numpy(), cov.numpy()[0]

    def expected_log_densities(self) -> np.ndarray:
        """``[K, 2]``: ``E_{q_C}[log q_k]`` and ``E_{q_C}[log p_k]`` per local model (App. B eq. 18)."""
        out = []
        for k, m in enumerate(self.local_models):
            m_C, S_C = self.contrastive_predictive(k)
            row = []
            for chol, mean in zip(self._local_chol[k], (m.q_mu, np.zeros_like(m.q_mu))):
                Li_S = np.linalg.solve(chol, S_C)
                Li_d = np.linalg.solve(chol, m_C - mean)
                trace = np.trace(np.linalg.solve(chol.T, Li_S))
                logdet = 2 * np.sum(np.log(np.abs(np.diag(chol))))
                row.append(-0.5 * (m.num_inducing * np.log(2 * np.pi) + logdet + trace + float(Li_d.T @ Li_d)))
            out.append(row)
        return np.array(out)

    # --- prediction, export, training ----------------------------------------------------------------
    @inherit_check_shapes
    def predict_f(self, Xnew: Any, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        """``q(f_⋆) = N(k_{⋆*}K_**⁻¹μ_*, k_⋆⋆ − k_{⋆*}(K_**⁻¹ − K_**⁻¹S_*K_**⁻¹)k_{*⋆})``, the global
        predictive (paper §2.3).

        :raises NotImplementedError: for ``full_output_cov=True`` (one latent function).
        """
        assert_params_false(self.predict_f, full_output_cov=full_output_cov)
        Z = self.inducing_variable.Z
        Knn = self.kernel.K(Xnew) if full_cov else self.kernel.K_diag(Xnew)
        return base_conditional(
            self.kernel.K(Z, Xnew), self._Kuu(), Knn, self.q_mu,
            full_cov=full_cov, q_sqrt=self.q_sqrt, white=self.whiten,
        )  # fmt: skip

    def to_recyclable(self, name: str = "") -> RecyclableModel:
        """This ensemble as a recyclable model ``{μ_*, L_*, Z_*, ψ}`` for the next pyramid level (paper App. E.1)."""
        q_mu, q_sqrt = self.q_mu.numpy(), self.q_sqrt.numpy()[0]
        if self.whiten:
            L = np.linalg.cholesky(self._Kuu().numpy())
            q_mu, q_sqrt = L @ q_mu, L @ q_sqrt
        try:
            lik = likelihood_spec(self.likelihood)
        except TypeError:
            lik = None
        return RecyclableModel(q_mu, q_sqrt, self.inducing_variable.Z.numpy(), kernel_spec(self.kernel), lik, name)

    def fit(self, maxiter: int = 200, method: str = "collapsed", iterations: int = 3) -> float:
        """Train ``(Z_*, ψ)`` (and the likelihood when data is given) and q; returns the final ``L_E``.

        * ``"collapsed"``: L-BFGS on the collapsed bound, then :meth:`set_optimal_q` (closed form);
        * ``"alternate"``: ``iterations`` × (VE: closed form; VM: L-BFGS on ``L_E`` with q fixed) (App. A.3);
        * ``"joint"``: L-BFGS on ``L_E`` over everything (any likelihood, either KL).

        The objective is compiled without AutoGraph: the bound has no data-dependent Python control flow, and
        converting it took longer than the whole optimisation on the paper's 10k setting (the first fit of a
        process). A custom kernel or likelihood that needs AutoGraph can be trained with
        ``gpflow.optimizers.Scipy().minimize(model.training_loss, model.trainable_variables)``.

        :raises ValueError: for an unknown method, or if the closed form is unbounded at the start.
        """
        if method not in ("collapsed", "alternate", "joint"):
            raise ValueError(f"method must be 'collapsed', 'alternate' or 'joint', got {method!r}")
        integer(maxiter, "maxiter", minimum=0)
        hyper = list(self.kernel.trainable_variables) + list(self.inducing_variable.trainable_variables)
        if self.data is not None:
            hyper += list(self.likelihood.trainable_variables)
        q_vars = list(self.q_mu.trainable_variables) + list(self.q_sqrt.trainable_variables)
        opt = gpflow.optimizers.Scipy()
        minimize = functools.partial(opt.minimize, tf_fun_args={"autograph": False})
        if method != "joint":
            self._check_closed_form()
            if self.precision_min_eigenvalue() <= 0:
                self.set_optimal_q()  # raises the unbounded-bound error
        if method == "collapsed":
            if hyper and maxiter:
                minimize(lambda: -self.collapsed_elbo(), hyper, options={"maxiter": int(maxiter)})
            self.set_optimal_q()
        elif method == "alternate":
            for _ in range(int(iterations)):
                self.set_optimal_q()
                if hyper and maxiter:
                    minimize(self.training_loss, hyper, options={"maxiter": int(maxiter)})
            self.set_optimal_q()
        elif maxiter:
            minimize(self.training_loss, hyper + q_vars, options={"maxiter": int(maxiter)})
        return float(self.elbo().numpy())

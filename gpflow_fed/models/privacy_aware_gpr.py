r"""PrivacyAwareGPR: GP regression on obfuscated data with full noise covariance ``V + Σ`` (Tuo & Bhattacharya).

The released model predicts with eq. (3)–(4)::

    f̂_P(x*) = m(x*) + K_{x*X} (K_XX + V + Σ)⁻¹ (W − M),
    Var[f(x*) | X, W] = K_{x*x*} − K_{x*X} (K_XX + V + Σ)⁻¹ K_{Xx*},

which is the best (minimum-MSE) predictor anyone can build from the released ``(X, W)``, the GP's mean and
covariance, V and Σ; so the variance at the sensitive inputs is a hard floor (§3.2) — provided nothing else
published depends on the raw Y. :func:`release` therefore departs from §3.2's step 1 (which fits the GP on the
raw data): Σ is designed from *public* hyperparameters (given, or fitted on public or disjoint data), and the
mean and any refit are post-processing of W. See ``docs/guides/privacy-aware.md`` for why the low rank of Σ
makes any statistic of the raw Y published beside W fatal.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from check_shapes.exceptions import CheckShapesError
from gpflow.models.training_mixins import InternalDataTrainingLossMixin
from gpflow.utilities import assert_params_false
from numpy.typing import ArrayLike

from ..release.linalg import as_inputs
from ..release.design import Floor, ReleaseDesign
from ..release.lowrank import LowRankCovariance
from ..release.ledger import EarlierRelease, ReleaseLedger, resolve_ledger
from ..release.linalg import check_kernel_numerics, check_no_white, check_predictions
from ..release.linalg import kernel_diag, numerically_positive, psd_factor
from ..release.obfuscation import (
    Covariance,
    Targets,
    check_method,
    check_near_records,
    check_protect,
    obfuscate,
    protected_targets,
    release_inputs,
    with_near_records,
)
from ..release.regions import Region, check_region, with_records
from ..release.precision import check_input_precision, range_kernels
from ..release.resolution import check_resolution, recording_resolution, resolution_noise
from ..release.theta import DEFAULT_RANGE, ThetaRange, check_theta_range, describe_theta_range, theta_grid
from ..release.tolerance import Tolerance
from ..validation import public_inputs_on_released
from ..untrusted_files import parse_json
from .serialization import read_npz
from .serialization import kernel_from_spec, kernel_spec


def _fixed_gaussian(noise_variance: float) -> gpflow.likelihoods.Gaussian:
    """A Gaussian likelihood whose variance is exactly ``noise_variance`` ≥ 0 and not trainable (0 allowed)."""
    likelihood = gpflow.likelihoods.Gaussian()
    likelihood.variance = gpflow.Parameter(float(noise_variance), trainable=False, dtype=gpflow.default_float())
    return likelihood


def _noise_factor(Sigma: Covariance) -> np.ndarray:
    """L with ``Σ = L Lᵀ`` from the positive eigenpairs of Σ."""
    if isinstance(Sigma, LowRankCovariance):
        return Sigma.factor()
    lam, vecs = psd_factor(np.asarray(Sigma))
    return vecs * np.sqrt(lam)[None, :]


def _covariance_from_factor(L: np.ndarray) -> LowRankCovariance:
    """``Σ = L Lᵀ`` as a :class:`LowRankCovariance` (from the SVD of L)."""
    U, s, _ = np.linalg.svd(L, full_matrices=False)
    keep = numerically_positive(s**2, size=L.shape[0])
    return LowRankCovariance(s[keep] ** 2, U[:, keep])


#: A stored noise factor's entries lie within ±this, so that ``Σ = LLᵀ`` is finite in float64.
MAX_FACTOR_ENTRY = 1e150


def _stored_factor(L: np.ndarray) -> LowRankCovariance:
    """A covariance whose :meth:`~LowRankCovariance.factor` is the stored ``L`` itself (:meth:`PrivacyAwareGPR.load`).

    Loading must cost time linear in the file (a 51 KB compressed file once took 30 s and 982 MB in the SVD of
    :func:`_covariance_from_factor`): ``L`` is the model's parameter as saved, so no decomposition is needed; the
    eigenpairs are computed when :attr:`PrivacyAwareGPR.Sigma` is asked for. (``factor()`` of
    ``LowRankCovariance(ones, L)`` is ``L`` exactly; the object is used for that alone.)
    """
    L = np.asarray(L)
    if L.ndim != 2 or L.dtype.kind != "f" or not np.all(np.isfinite(L)):
        raise ValueError(f"noise_factor must be a finite [N, r] float array, got dtype {L.dtype.str} shape {L.shape}")
    if L.size and float(np.max(np.abs(L))) > MAX_FACTOR_ENTRY:  # Σ = LLᵀ would overflow: NaN predictions
        raise ValueError(f"noise_factor has entries beyond ±{MAX_FACTOR_ENTRY:g} (Σ = LLᵀ would not be finite)")
    return LowRankCovariance(np.ones(L.shape[1]), L)


class PrivacyAwareGPR(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    r"""GPR with observation covariance ``V + Σ``, ``V = σ²I`` and a fixed synthetic-noise covariance Σ (eq. 3–4).

    :param data: ``(X, W)``: ``[N, D]`` inputs and ``[N, 1]`` released (obfuscated) outputs.
    :param kernel: K; a ``White`` part is refused (observation noise belongs in ``noise_variance``:
        :func:`~gpflow_fed.release.linalg.check_no_white`).
    :param Sigma: ``[N, N]`` PSD synthetic-noise covariance (dense or :class:`LowRankCovariance`); stored as a
        factor ``L`` (``Σ = LLᵀ``, ``[N, r]``), a non-trainable parameter.
    :param mean_function: m (GPflow's zero mean if None).
    :param noise_variance: the Gaussian noise variance of W beside Σ, ``σ² + τ²`` ≥ 0 (σ² of the intrinsic noise V,
        0 for deterministic simulators; τ² of the resolution noise); fixed.
    :param resolution: τ ≥ 0, the sd of the full-rank noise ``τη`` a release adds for a target recorded on a grid
        (:mod:`~gpflow_fed.release.resolution`); part of W's noise but not of a record ``Y_j = f(x_j) + ε_j``, whose
        noise variance is ``noise_variance − τ²`` (:meth:`protected_covariance`).
    """

    @check_shapes("data[0]: [N, D]", "data[1]: [N, 1]")
    def __init__(
        self,
        data: "tuple[np.ndarray, np.ndarray]",
        kernel: gpflow.kernels.Kernel,
        Sigma: Covariance,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        noise_variance: float = 0.0,
        resolution: float = 0.0,
    ) -> None:
        X: np.ndarray = np.asarray(data[0], dtype=gpflow.default_float())
        W: np.ndarray = np.asarray(data[1], dtype=gpflow.default_float())
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(W))):
            raise ValueError("PrivacyAwareGPR: X and W must be finite")
        if 0 in X.shape:  # no columns: it would load and fail at the first prediction; no rows: a release of nothing
            raise ValueError(
                f"PrivacyAwareGPR: X has no {'columns' if X.shape[1:] == (0,) else 'rows'} "
                f"(shape {X.shape}); a release needs at least one row and one input column"
            )
        if not (np.isfinite(noise_variance) and noise_variance >= 0):
            raise ValueError(f"noise_variance must be finite and ≥ 0, got {noise_variance}")
        if not (np.isfinite(resolution) and 0 <= resolution <= np.sqrt(noise_variance)):  # never squares 1e200
            raise ValueError(
                f"resolution must be finite, ≥ 0 and its square within noise_variance {noise_variance} (σ² + τ²), "
                f"got {resolution}"
            )
        check_no_white(kernel)  # a White part would be in K(X) but not in K(x*, X) (linalg.check_no_white)
        L = _noise_factor(Sigma)
        if L.shape[0] != X.shape[0]:
            raise ValueError(f"Sigma is {L.shape[0]}×{L.shape[0]} but X has {X.shape[0]} rows")
        super().__init__(kernel, _fixed_gaussian(noise_variance), mean_function, num_latent_gps=1)
        self.data = (tf.constant(X), tf.constant(W))
        self.noise_factor = gpflow.Parameter(L, trainable=False, dtype=gpflow.default_float(), name="noise_factor")
        self.resolution = float(resolution)

    @property
    def Sigma(self) -> LowRankCovariance:
        """Σ as a :class:`LowRankCovariance`."""
        return _covariance_from_factor(self.noise_factor.numpy())

    def _observation_cholesky(self) -> tf.Tensor:
        X = self.data[0]
        K = self.kernel(X)
        C = K + tf.matmul(self.noise_factor, self.noise_factor, transpose_b=True)
        C = tf.linalg.set_diag(C, tf.linalg.diag_part(C) + self.likelihood.variance)
        return tf.linalg.cholesky(0.5 * (C + tf.transpose(C)))

    def maximum_log_likelihood_objective(self) -> tf.Tensor:
        r"""``log N(W; m(X), K_XX + V + Σ)`` — the log likelihood of the released data."""
        X, W = self.data
        L = self._observation_cholesky()
        residual = W - self.mean_function(X)
        alpha = tf.linalg.triangular_solve(L, residual, lower=True)
        n = tf.cast(tf.shape(X)[0], L.dtype)
        log_two_pi = tf.cast(np.log(2.0 * np.pi), L.dtype)
        return (
            -0.5 * tf.reduce_sum(tf.square(alpha))
            - tf.reduce_sum(tf.math.log(tf.linalg.diag_part(L)))
            - 0.5 * n * log_two_pi
        )

    @inherit_check_shapes
    def predict_f(
        self, Xnew: tf.Tensor, full_cov: bool = False, full_output_cov: bool = False
    ) -> "tuple[tf.Tensor, tf.Tensor]":
        r"""Eq. (3) mean and eq. (4) (co)variance of f at ``Xnew`` given the released ``(X, W)``.

        :raises NotImplementedError: for ``full_output_cov=True`` (as ``gpflow.models.GPR``).
        :raises ValueError: (run eagerly) a mean or variance that is not finite, or a variance below round-off of
            the prior's ``k(x, x)`` (:func:`~gpflow_fed.release.linalg.check_predictions`; inputs of 1e300 once
            predicted NaN).
        """
        assert_params_false(self.predict_f, full_output_cov=full_output_cov)
        mean, cov, prior = self._posterior(Xnew, full_cov)
        if tf.executing_eagerly():
            var = tf.linalg.diag_part(cov) if full_cov else cov
            check_predictions(mean.numpy(), var.numpy(), prior.numpy(), "at the inputs given")
        return mean, (cov[None, :, :] if full_cov else cov[:, None])

    def _posterior(self, Xnew: tf.Tensor, full_cov: bool = False) -> "tuple[tf.Tensor, tf.Tensor, tf.Tensor]":
        """Unchecked eq. (3) mean ``[M, 1]``, eq. (4) covariance ``[M, M]`` or variance ``[M]``, prior ``k(x, x)``."""
        X, W = self.data
        Xnew = tf.convert_to_tensor(Xnew, dtype=gpflow.default_float())
        L = self._observation_cholesky()
        Kxs = self.kernel(X, Xnew)
        A = tf.linalg.triangular_solve(L, Kxs, lower=True)
        b = tf.linalg.triangular_solve(L, W - self.mean_function(X), lower=True)
        mean = self.mean_function(Xnew) + tf.matmul(A, b, transpose_a=True)
        prior = self.kernel(Xnew, full_cov=False)
        if full_cov:
            return mean, self.kernel(Xnew) - tf.matmul(A, A, transpose_a=True), prior
        return mean, prior - tf.reduce_sum(tf.square(A), axis=0), prior

    @check_shapes("points: [T, D]", "records: [T]", "return: [T, T]")
    def protected_covariance(self, points: np.ndarray, records: np.ndarray) -> tf.Tensor:
        r"""``Cov[T | X, W]`` of the protected targets under the current θ (eq. 4 with ``K_XS → C_XT``).

        Target a is the record ``Y_j = f(x_j) + ε_j`` of row ``j = records[a]`` (``Cov[Y_j, W] = K_{x_j X} + σ²e_jᵀ``,
        prior ``K(x_j, x_j) + σ²``), or ``f(points[a])`` when ``records[a] = −1``. σ² is the noise variance less the
        resolution noise's τ² (``τη`` is in W, not in the record).
        """
        X = self.data[0]
        pts = tf.convert_to_tensor(points, dtype=gpflow.default_float())
        rec = np.asarray(records, dtype=int)
        onehot = np.zeros((X.shape[0], rec.shape[0]))
        same = (rec[:, None] == rec[None, :]) & (rec[:, None] >= 0)
        for a, j in enumerate(rec):
            if j >= 0:
                onehot[j, a] = 1.0
        s2 = self.likelihood.variance - self.resolution**2
        C = self.kernel(X, pts) + s2 * tf.constant(onehot, dtype=gpflow.default_float())
        P = self.kernel(pts) + s2 * tf.constant(same.astype(float), dtype=gpflow.default_float())
        A = tf.linalg.triangular_solve(self._observation_cholesky(), C, lower=True)
        return P - tf.matmul(A, A, transpose_a=True)

    def save(self, path: Union[str, Path]) -> Path:
        """Write the released model to an ``.npz`` of numbers and JSON only (no pickled code, no raw Y).

        The file holds X, W, Σ's factor, W's Gaussian noise variance σ² + τ² (``noise_variance``), the resolution τ
        (``resolution``; a file without it has τ = 0), every kernel and mean-function parameter value under its GPflow
        path (``.kernel.variance``, ...), and a JSON description of the kernel and mean function where
        :func:`~gpflow_fed.models.serialization.kernel_spec` can describe them (stationary kernels; ``Zero`` or
        ``Constant`` means). Other kernels are saved by value only: pass a kernel of the same structure to
        :meth:`load`.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        X, W = (t.numpy() for t in self.data)
        arrays = {f"param{key}": np.asarray(value.numpy()) for key, value in _saved_parameters(self).items()}
        spec = {"kernel": _describe(kernel_spec, self.kernel), "mean_function": type(self.mean_function).__name__}
        with open(path, "wb") as fh:
            np.savez(
                fh,
                format=np.array(SAVE_FORMAT),
                spec=np.array(json.dumps(spec)),
                X=X,
                W=W,
                noise_factor=self.noise_factor.numpy(),
                noise_variance=np.array(float(self.likelihood.variance.numpy())),
                resolution=np.array(self.resolution),
                **arrays,
            )
        return path

    @staticmethod
    def load(
        path: Union[str, Path],
        kernel: Optional[gpflow.kernels.Kernel] = None,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
    ) -> "PrivacyAwareGPR":
        """Read a model written by :meth:`save` (never unpickles anything).

        :param kernel: a kernel of the saved structure, needed only when the file could not describe it
            (non-stationary or composite kernels); its parameter values are overwritten by the saved ones.
        :param mean_function: likewise, for mean functions other than ``Zero`` and ``Constant``.
        :raises FileNotFoundError: ``path`` does not exist.
        :raises ValueError: naming the file: a file that is not a saved PrivacyAwareGPR (another kind of
            file, truncated, bit-flipped, incomplete, pickled data), inconsistent arrays, parameters that do
            not fit the given kernel / mean function, parameters outside the range where float64 computes the
            kernel finitely and well-conditioned (:func:`~gpflow_fed.release.linalg.check_kernel_numerics`:
            ``‖x/ℓ‖ ≤ 1/√ε``, finite ``k(x, x)``, ``(tr K + tr Σ + Nσ²)/σ² ≤ 1/ε``), or a model whose
            predictions at its own inputs X are not finite or have a negative variance beyond round-off (a crafted
            file with X = 1e300 or ℓ = 1e-300 once predicted NaN, a kernel variance of 1e300 a negative variance).
        """
        arrays = read_npz(
            path,
            "PrivacyAwareGPR file (PrivacyAwareGPR.save)",
            SAVE_FORMAT,
            ("spec", "X", "W", "noise_factor", "noise_variance"),
        )
        # every float field in float64 before any check (a float128 1e4000 is finite until cast, then inf)
        with np.errstate(over="ignore", under="ignore"):
            arrays = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in arrays.items()}
        try:
            spec = parse_json(str(arrays["spec"]), f"{path}: model description")
            kernel_description, mean_name = spec["kernel"], str(spec["mean_function"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: corrupt model description ({type(exc).__name__}: {exc})") from exc
        if kernel is None:
            if kernel_description is None:
                raise ValueError(
                    f"{path} holds a kernel that only its values describe: pass kernel= a kernel of the same structure"
                )
            try:
                kernel = kernel_from_spec(kernel_description)
            except (
                KeyError,
                TypeError,
                ValueError,
                AttributeError,
                ArithmeticError,  # a 400-digit integer for a value
                tf.errors.InvalidArgumentError,  # an infinite value (JSON 1e999)
            ) as exc:
                raise ValueError(f"{path}: corrupt kernel description ({type(exc).__name__}: {exc})") from exc
        try:
            check_no_white(kernel)
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        if mean_function is None:
            if mean_name == "Zero":
                mean_function = gpflow.mean_functions.Zero()
            elif mean_name == "Constant":
                if "param.mean_function.c" not in arrays:
                    raise ValueError(
                        f"{path}: incomplete file, missing arrays ['param.mean_function.c'] of its Constant mean"
                    )
                # the saved value fixes c's shape (a scalar Constant(0.0) or the default [1])
                c = arrays["param.mean_function.c"]
                if c.dtype.kind != "f" or c.ndim > 1 or c.size > 1 or not np.all(np.isfinite(c)):
                    raise ValueError(
                        f"{path}: corrupt Constant mean: a finite float scalar or [1] array, got dtype {c.dtype.str} "
                        f"shape {c.shape}"
                    )
                mean_function = gpflow.mean_functions.Constant(c)
            else:
                raise ValueError(f"{path} holds a {mean_name!r} mean: pass mean_function= one of that class")
        saved = {key[len("param") :]: value for key, value in arrays.items() if key.startswith("param.")}
        floats: "tuple[str, ...]" = ("X", "W", "noise_factor", "noise_variance")
        if "resolution" in arrays:  # written since the resolution noise (files before it have τ = 0)
            floats += ("resolution",)
        not_float = [name for name in floats if arrays[name].dtype.kind != "f"]  # never cast (complex, text, ints)
        if not_float or arrays["noise_variance"].size != 1 or arrays.get("resolution", np.zeros(())).size != 1:
            raise ValueError(
                f"{path}: corrupt arrays: {', '.join(floats)} must be float arrays (noise_variance, resolution one "
                f"value); got {', '.join(f'{n}: {arrays[n].dtype.str} {arrays[n].shape}' for n in floats)}"
            )
        try:
            model = PrivacyAwareGPR(
                (arrays["X"], arrays["W"]),
                kernel,
                _stored_factor(arrays["noise_factor"]),
                mean_function,
                float(arrays["noise_variance"]),
                float(arrays.get("resolution", np.zeros(()))),
            )
        except (ValueError, TypeError, CheckShapesError, np.linalg.LinAlgError, tf.errors.InvalidArgumentError) as exc:
            raise ValueError(f"{path}: inconsistent or corrupt arrays ({type(exc).__name__}: {exc})") from exc
        expected = _saved_parameters(model)
        if set(saved) != set(expected) or any(np.shape(expected[k].numpy()) != v.shape for k, v in saved.items()):
            raise ValueError(
                f"{path}: saved parameters {sorted(saved)} do not fit the kernel/mean function given "
                f"({sorted(expected)})"
            )
        bad = [k for k, v in saved.items() if v.dtype.kind != "f" or not np.all(np.isfinite(v))]
        if bad:
            raise ValueError(f"{path}: corrupt parameter values (not finite floats) for {bad}")
        try:
            gpflow.utilities.multiple_assign(model, saved)
        except (ValueError, tf.errors.InvalidArgumentError) as exc:  # e.g. a lengthscale outside its support
            raise ValueError(f"{path}: parameter values outside their support ({exc})") from exc
        columns = int(arrays["X"].shape[1])
        ard = {k: np.size(v) for k, v in saved.items() if k.endswith("lengthscales") and np.size(v) not in (1, columns)}
        if ard:  # broadcast against X's columns, they would define another kernel without an error
            raise ValueError(f"{path}: lengthscales {ard} do not fit X's {columns} column(s) (1 or {columns} each)")
        try:
            check_kernel_numerics(model.kernel, arrays["X"], arrays["noise_factor"], float(arrays["noise_variance"]))
            mean, var, prior = model._posterior(arrays["X"])
            check_predictions(mean.numpy(), var.numpy(), prior.numpy(), "at its own inputs X")
        except tf.errors.InvalidArgumentError as exc:  # C = K + Σ + σ²I not positive definite in float64
            raise ValueError(
                f"{path}: the model's covariance K + Σ + σ²I of its inputs has no float64 Cholesky factor "
                f"({type(exc).__name__})"
            ) from exc
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from exc
        return model


SAVE_FORMAT = "gpflow-fed-privacy-aware/1"


def _saved_parameters(model: PrivacyAwareGPR) -> Dict[str, Any]:
    """The kernel's and mean function's parameters by GPflow path (what :meth:`PrivacyAwareGPR.save` stores)."""
    params = gpflow.utilities.parameter_dict(model)
    return {k: v for k, v in params.items() if k.startswith((".kernel.", ".mean_function."))}


def _describe(describe: Any, obj: Any) -> Optional[Dict[str, Any]]:
    """``describe(obj)``, or ``None`` when it cannot describe ``obj`` (then only its values are saved)."""
    try:
        return describe(obj)
    except TypeError:
        return None


@dataclass
class PrivacyRelease:
    """The outcome of :func:`release`; every field is computed from W and public inputs only (safe to publish).

    :param model: the released :class:`PrivacyAwareGPR` (X, W, Σ, hyperparameters, mean).
    :param Sigma: Σ.
    :param W: ``[N, 1]`` the obfuscated outputs.
    :param sensitive: ``[γ, D]`` the sensitive inputs.
    :param noise_variance: σ² used for V (the released model's Gaussian noise variance is σ² + τ²).
    :param log_marginal_likelihood: ``log N(W; m(X), K_XX + V + Σ)`` of the released model — the likelihood of
        the *released* W (before the fix that introduced ``public_data``, this was the raw-data GPR's optimum, a
        statistic of the raw Y that must not be published).
    :param variance: ``[t]`` the released model's predictive variance of each protected target (eq. 4 under the
        published θ): the record ``Y_j`` at a sensitive training input (``protect="records"``), else ``f(s)``.
    :param tolerance: ``[t]`` ξ of each target as designed (the floor that ``variance`` respects).
    :param targets: the protected targets (points, record rows or −1, the sensitive input each comes from).
    :param protect: ``"records"`` or ``"latent"``.
    :param unchanged_rows: how many rows are released unchanged (``Σ_jj ≤ UNCHANGED_RTOL·K(x_j, x_j)``).
    :param rank: rank Σ: W − Y lies in range(Σ), so this many independent facts about Y give Y back.
    :param earlier: the ledger entry this release was computed from (``W = W₁ + Δ``), or None for a first release.
    :param theta_range: the public θ range Σ was solved over, in words (:func:`~gpflow_fed.release.theta.
        describe_theta_range`).
    :param refit_check: the check of the floor under the θ refitted on the released W (None when turned off).
    :param certificate: the weak method's certificate (:class:`~gpflow_fed.release.weak.WeakCertificate`) of the
        design θ's Σ, before the θ range and the refit check added to it (None for the other methods).
    :param resolution: τ, the sd of the full-rank noise ``τη`` added to W (the target's recording resolution,
        detected from Y or declared; published: a fact about how the target is recorded); 0 when none was added.
    :param resolution_declared: whether τ was declared (``resolution=``) rather than detected.
    """

    model: PrivacyAwareGPR
    Sigma: Covariance
    W: np.ndarray
    sensitive: np.ndarray
    noise_variance: float
    log_marginal_likelihood: float
    variance: np.ndarray
    tolerance: np.ndarray
    targets: Optional[Targets] = None
    protect: str = "records"
    unchanged_rows: int = 0
    rank: int = 0
    earlier: Optional[str] = None
    theta_range: str = ""
    refit_check: Optional["RefitCheck"] = None
    certificate: Optional[Any] = None
    resolution: float = 0.0
    resolution_declared: bool = False


def _check_tolerance_shape(tolerance: Tolerance, gamma: int) -> None:
    """Checks that do not depend on the hyperparameters, run before any fitting (sign, shape, finiteness)."""
    if isinstance(tolerance, gpflow.kernels.Kernel):
        return
    array: np.ndarray = np.asarray(tolerance, dtype=gpflow.default_float())
    if not np.all(np.isfinite(array)):
        raise ValueError("tolerance contains NaN or inf values")
    if np.any((np.diag(array) if array.ndim == 2 else array) < 0):
        raise ValueError("negative tolerance; tolerances are variances and must be ≥ 0")
    if array.ndim == 1 and array.shape[0] != gamma or array.ndim == 2 and array.shape != (gamma, gamma):
        raise ValueError(
            f"tolerance of shape {array.shape} does not match {gamma} sensitive inputs; pass a scalar, "
            f"a [{gamma}] vector or a [{gamma}, {gamma}] matrix"
        )


def fit_hyperparameters(
    data: "tuple[np.ndarray, np.ndarray]",
    kernel: gpflow.kernels.Kernel,
    *,
    noise_variance: Optional[float] = None,
    maxiter: int = 1000,
) -> "tuple[gpflow.models.GPR, float]":
    r"""GPflow GPR maximum likelihood with a constant mean (updates ``kernel`` in place).

    For a privacy-aware release, call it on **public or disjoint data only**, never on the outputs being
    released: Σ is low rank, so W determines Y up to a few scalars, and the stationarity equations of this fit
    on the raw Y (``1ᵀC⁻¹(Y − c1) = 0``, ``rᵀC⁻¹Ċ_jC⁻¹r = tr(C⁻¹Ċ_j)``) give those scalars back
    (``tests/security/test_release_attack.py``). :func:`release` calls it only on its ``public_data``.

    The constant is initialised at ``mean(Y)``. ``noise_variance=None`` estimates σ²; a number fixes it
    (0 allowed: deterministic data). Returns the fitted GPR and σ².
    """
    X, Y = data
    mean = gpflow.mean_functions.Constant(np.mean(Y, axis=0))
    if noise_variance is None:
        likelihood = gpflow.likelihoods.Gaussian(variance=max(1e-3 * float(np.var(Y)), 1.1e-6))
    else:
        likelihood = _fixed_gaussian(noise_variance)
    gpr = gpflow.models.GPR((X, Y), kernel, mean_function=mean, likelihood=likelihood)
    gpflow.optimizers.Scipy().minimize(gpr.training_loss, gpr.trainable_variables, options=dict(maxiter=int(maxiter)))
    return gpr, float(gpr.likelihood.variance.numpy())


@contextmanager
def _singular(what: str) -> Iterator[None]:
    """Turn TensorFlow's failed Cholesky (``K + V + Σ`` numerically singular) into a one-line ``ValueError``."""
    try:
        yield
    except tf.errors.InvalidArgumentError:
        raise ValueError(
            f"{what} failed: the covariance K_XX + V + Σ is numerically singular (repeated inputs, or "
            "noise_variance = 0 with a smooth kernel); pass noise_variance > 0"
        ) from None


def _outputs(Y: object, rows: int, what: str) -> np.ndarray:
    """``Y`` as a finite real ``[rows, 1]`` array (an ``[N]`` vector becomes a column)."""
    if np.iscomplexobj(cast(ArrayLike, Y)):  # any object: numpy reads its dtype or converts it
        raise TypeError(f"{what} is complex; pass real outputs (casting would drop the imaginary part)")
    array: np.ndarray = np.asarray(Y, dtype=gpflow.default_float())
    if array.ndim == 1:
        array = array[:, None]
    if array.shape != (rows, 1) or not np.all(np.isfinite(array)):
        raise ValueError(f"{what} must be a finite [N, 1] array matching X's {rows} rows, got shape {array.shape}")
    return array


def _public_fit_data(
    public_data: "tuple[np.ndarray, np.ndarray]", X: np.ndarray, Y: np.ndarray
) -> "tuple[np.ndarray, np.ndarray]":
    """``public_data`` checked: real, finite, X's columns, at least 2 rows, and no input on a released input
    (:func:`~gpflow_fed.validation.public_inputs_on_released`)."""
    if not isinstance(public_data, (tuple, list)) or len(public_data) != 2:
        raise TypeError("public_data must be a pair (X_public [M, D], Y_public [M, 1]) of public or disjoint data")
    Xp = as_inputs(public_data[0], "public_data X")
    if Xp.shape[1] != X.shape[1] or Xp.shape[0] < 2:
        raise ValueError(f"public_data X must have X's {X.shape[1]} columns and at least 2 rows, got shape {Xp.shape}")
    Yp = _outputs(public_data[1], Xp.shape[0], "public_data Y")
    on_released = public_inputs_on_released(Xp, X)
    if on_released:
        raise ValueError(
            f"public_data has {on_released} input(s) on inputs of the data being released: their outputs carry the "
            "released outputs, and hyperparameters fitted on them let anyone holding the release recover them; fit "
            "on public data at other inputs"
        )
    return Xp, Yp


def _gls_mean(model: PrivacyAwareGPR) -> np.ndarray:
    r"""The maximum-likelihood constant given W: ``ĉ = 1ᵀC⁻¹W / 1ᵀC⁻¹1``, ``C = K_XX + V + Σ`` (post-processing)."""
    W = model.data[1]
    L = model._observation_cholesky()
    ones = tf.ones_like(W)
    a = tf.linalg.triangular_solve(L, ones, lower=True)
    b = tf.linalg.triangular_solve(L, W, lower=True)
    return (tf.reduce_sum(a * b) / tf.reduce_sum(a * a)).numpy().reshape(1)


#: Relative slack (of the largest prior variance at the sensitive inputs) allowed in the floor check.
FLOOR_RTOL = 1e-6
#: Bisection steps of the refit's retreat towards the design hyperparameters (to 2⁻²⁰ of the path).
REFIT_BISECTIONS = 20


def _short(model: PrivacyAwareGPR, floor: Floor, strict: bool = False) -> "tuple[np.ndarray, np.ndarray, float]":
    """The released model's variance of each target (eq. 4, under its current θ), the indices where it is below ξ,
    and the strong margin ``λ_min(Cov[T | W] − Ξ_T)`` scaled to the prior (0 when the strong floor is not claimed).
    Shortfalls count beyond ``FLOOR_RTOL`` of the largest prior variance, or at all when ``strict``."""
    cov = model.protected_covariance(floor.targets.points, floor.targets.records).numpy()
    variance = np.diag(cov).copy()
    scale = float(np.max(model.kernel(floor.targets.points, full_cov=False).numpy()))
    slack = 0.0 if strict else FLOOR_RTOL * scale
    margin = 0.0
    if floor.strong:
        margin = float(np.linalg.eigvalsh(0.5 * (cov + cov.T) - floor.Xi)[0]) + slack
    return variance, np.flatnonzero(variance < floor.xi - slack), margin


def _holds(model: PrivacyAwareGPR, floor: Floor) -> bool:
    _, short, margin = _short(model, floor, strict=True)
    return not short.size and margin >= 0.0


def _refit(model: PrivacyAwareGPR, floor: Floor, maxiter: int, fixed_mean: bool) -> None:
    r"""Post-processing: refit the kernel (and the mean unless ``fixed_mean``) by maximum likelihood on W.

    The refitted θ̂ may predict the protected targets better than the design θ₀ that Σ was built for. Then the
    kernel's unconstrained parameters retreat along the segment ``θ₀ + t(θ̂ − θ₀)`` to the largest ``t ∈ [0, 1]``
    (bisection) at which **every floor the release claims** holds: each ``Var[Tₐ | W] ≥ ξₐ``, and for the strong
    method ``λ_min(Cov[T | W] − Ξ_T) ≥ 0`` (eq. 11); ``t = 0`` is the design, where they hold by construction.
    Every step uses only W, Σ, σ², X, S and Ξ, so the result is a function of public quantities.
    """
    kernel_params = model.kernel.trainable_parameters
    start = [p.unconstrained_variable.numpy() for p in kernel_params]
    gpflow.optimizers.Scipy().minimize(
        model.training_loss, model.trainable_variables, options=dict(maxiter=int(maxiter))
    )
    if _holds(model, floor):
        return
    end = [p.unconstrained_variable.numpy() for p in kernel_params]

    def move(t: float) -> bool:
        for p, a, b in zip(kernel_params, start, end):
            p.unconstrained_variable.assign(a + t * (b - a))
        return _holds(model, floor)

    low, high = 0.0, 1.0
    for _ in range(REFIT_BISECTIONS):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if move(mid) else (low, mid)
    move(low)
    if not fixed_mean:
        model.mean_function.c.assign(_gls_mean(model))
    warnings.warn(
        f"refit=True: the hyperparameters fitted on W would predict the protected values better than the tolerance "
        f"allows; published θ = θ_design + {low:.3g}·(θ_refit − θ_design) (unconstrained), the largest step that "
        "keeps the floor",
        UserWarning,
        stacklevel=3,
    )


def _floor(model: PrivacyAwareGPR, floor: Floor) -> np.ndarray:
    """The released model's variance of each target under the *published* θ, checked against ξ (the guarantee)."""
    variance, short, margin = _short(model, floor)
    if short.size or margin < 0:
        i = int(short[np.argmin(variance[short] - floor.xi[short])]) if short.size else int(np.argmin(variance))
        raise ValueError(
            f"the released model's variance at sensitive input {int(floor.targets.source[i])} is {variance[i]:.6g} "
            f"(tolerance {floor.xi[i]:.6g}, strong margin {margin:.3g}); Σ could not be certified: report this as a bug"
        )
    return variance


#: At most this many post-processing noise steps of the check under the θ refitted on W (:func:`_refit_check`); a
#: release whose floor still fails under the refitted θ after them is refused.
REFIT_CHECK_STEPS = 4
#: L-BFGS iterations of each fit of the check (an attacker does not stop early: ``maxiter`` / ``--quick`` do not apply).
REFIT_CHECK_MAXITER = 1000
#: L-BFGS-B's relative decrease and projected-gradient tolerances of the check's fits.
REFIT_CHECK_FTOL, REFIT_CHECK_GTOL = 1e-15, 1e-10
#: Significant digits of the refitted θ̂ under which a check step's noise is solved (:func:`_rounded`).
REFIT_CHECK_DIGITS = 6


def refit_check_scale(step: int) -> float:
    r"""The schedule of the check under the refitted θ: step k (0, 1, …) adds noise of covariance ``(1 + k)·Σ*_k``.

    ``Σ*_k`` is the minimum-trace covariance that meets the floor under ``θ̂_k`` (the θ refitted on ``W_k``) given
    the noise already in W; the attacker then refits on ``W_{k+1}`` and lands elsewhere, so later steps add a margin
    that grows with k (measured in ``docs/guides/privacy-aware.md``).
    """
    return 1.0 + float(step)


@dataclass(frozen=True)
class RefitCheck:
    """The floor checked under the θ an attacker fits on the released W (issue 44, finding 4; :func:`_refit_check`).

    Every field is computed from the published W, X, Σ, σ² and the public design (safe to publish).

    :param steps: post-processing noise steps added to W (0: the floor held under the first refit).
    :param theta: the kernel hyperparameters refitted on the published W by maximum likelihood, by GPflow path (the
        kernel variances stay the design's, see :func:`_refitted`), under which the floor was last checked.
    :param variance: ``[t]`` ``Var[T | W]`` of each protected target under that θ and σ².
    :param added_trace: the trace of the covariance of the noise the steps added (0 when none).
    :param noise_variance: σ² of V refitted on the published W with θ (the design's σ² is the release's public
        value; the data's own noise may be smaller, see :func:`_refitted`).
    """

    steps: int
    theta: Dict[str, np.ndarray]
    variance: np.ndarray
    added_trace: float
    noise_variance: float


#: σ² refitted by :func:`_refitted` is at least this fraction of the kernel's largest prior variance: below it,
#: ``K_θ + V + Σ`` is numerically singular for a smooth kernel (GPflow's jitter scale), and a posterior variance
#: moves by about this much of the prior between that σ² and 0.
NOISE_REFIT_FLOOR = 1e-6


def _refitted(model: PrivacyAwareGPR, maxiter: int) -> PrivacyAwareGPR:
    r"""A copy of ``model`` with θ and σ² refitted by maximum likelihood on its W, ``log N(W; c1, K_θ + σ²I + Σ)``,
    Σ fixed, as the attacker of finding 4 does: every kernel parameter (whatever the owner's trainable flags), the
    constant mean and σ² (from the design's, bounded below by :data:`NOISE_REFIT_FLOOR` times the largest prior
    variance), except the kernel parameters named ``variance``, which keep their design values.

    Why σ² is refitted: a design σ² above the data's own noise counts noise the records do not have (a record
    ``Y_s = f(s) + ε_s`` is as predictable as f(s) when ε is small), and in the directions outside the range of Σ,
    W is ``f + ε`` itself, so an attacker estimates the data's σ² from W (a fresh attacker recovered a record to
    3e-4 ξ with true σ² 1e-6 and design σ² 0.05, before the check refitted it).

    Why the variance stays: the tolerance ξ is stated on the design's scale, and the variance fitted on one sample
    path is too noisy to hold an absolute ξ against (for data drawn from the design θ itself it often falls below
    ξ, and no noise can help under such a θ̂: the release would be refused); scaling ξ with the fitted variance
    instead lets the attacker through. What the design's Σ misses when the data are smoother than designed is the
    lengthscale (``docs/guides/privacy-aware.md``).
    """
    fitted = gpflow.utilities.deepcopy(model)
    for path, parameter in gpflow.utilities.parameter_dict(fitted.kernel).items():
        gpflow.set_trainable(parameter, path.split(".")[-1] != "variance")
    gpflow.set_trainable(fitted.mean_function, True)
    lowest = NOISE_REFIT_FLOOR * float(np.max(kernel_diag(fitted.kernel, fitted.data[0].numpy())))
    # W's noise is σ² + τ² with the resolution τ public: the attacker fits σ² (the records' own noise) above τ²
    tau2 = fitted.resolution**2
    start = max(float(fitted.likelihood.variance.numpy()), tau2 + 2.0 * lowest)
    fitted.likelihood.variance = gpflow.Parameter(
        start, transform=gpflow.utilities.positive(lower=tau2 + lowest), dtype=gpflow.default_float()
    )
    # converged to round-off (not L-BFGS-B's default ftol 2e-9): W's that agree to round-off give θ̂'s that do, so
    # the check's noise is a function of W (tests/security/test_release_attack.py compares the files)
    options = dict(maxiter=int(maxiter), ftol=REFIT_CHECK_FTOL, gtol=REFIT_CHECK_GTOL)
    gpflow.optimizers.Scipy().minimize(fitted.training_loss, fitted.trainable_variables, options=options)
    return fitted


#: Entropy of the test-only streams of the check's noise (``insecure_noise_seed`` given), apart from every stream of
#: W's own noise.
REFIT_CHECK_TEST_ENTROPY = 0x5EED_C4EC


def _step_seed(seed: Optional[int], step: int, W: np.ndarray) -> Optional[int]:
    """The test-only seed of step ``step``'s noise (None stays None: OS randomness), from W itself.

    Seeded by ``W_k`` (rounded to 9 digits of its scale) rather than by ``seed``: two seeded releases that land on
    the same W publish the same W' (the post-processing property ``tests/security/test_release_attack.py``
    checks), while releases of different W draw different noise (a Monte Carlo over seeded releases stays one).
    """
    if seed is None:
        return None
    scale = float(np.max(np.abs(W))) or 1.0
    digest = hashlib.sha256(np.round(W / scale, 9).astype(np.float64).tobytes()).digest()
    words = np.frombuffer(digest[:16], dtype=np.uint32).tolist()
    return int(np.random.SeedSequence([REFIT_CHECK_TEST_ENTROPY, step, *words]).generate_state(1)[0])


def _rounded(kernel: gpflow.kernels.Kernel) -> gpflow.kernels.Kernel:
    """A copy of ``kernel`` with every parameter rounded to ``REFIT_CHECK_DIGITS`` significant digits.

    The noise of a check step is solved under the refitted θ̂ so rounded: W's that agree to round-off give θ̂'s that
    agree to the optimiser's tolerance only (about 1e-8 on a flat optimum), which an SDP solved to 1e-9 would
    carry into the noise; rounded, they give the same covariance, so the check's noise is a reproducible function of W.
    """
    copy = gpflow.utilities.deepcopy(kernel)
    values = gpflow.utilities.parameter_dict(copy)
    rounded = {
        path: np.vectorize(lambda v: float(f"{v:.{REFIT_CHECK_DIGITS}g}"))(p.numpy()) for path, p in values.items()
    }
    gpflow.utilities.multiple_assign(copy, rounded)
    return copy


def _step_covariance(star: np.ndarray, scale: float, floor: float) -> LowRankCovariance:
    """``scale · Σ*`` by its eigenpairs above ``DELTA_RTOL · floor`` (rounding dropped), each eigenvector's sign fixed
    (its largest entry positive): the noise drawn from it is a continuous function of Σ* and the draws."""
    lam, vecs = np.linalg.eigh(0.5 * (star + star.T))
    keep = lam > DELTA_RTOL * floor
    lam, vecs = lam[keep], vecs[:, keep]
    signs = np.sign(vecs[np.argmax(np.abs(vecs), axis=0), np.arange(vecs.shape[1])])
    return LowRankCovariance(scale * lam, vecs * signs[None, :])


def _released_model(
    X: np.ndarray,
    W: np.ndarray,
    kernel: gpflow.kernels.Kernel,
    Sigma: Covariance,
    noise_variance: float,
    resolution: float = 0.0,
) -> PrivacyAwareGPR:
    """The model of ``(X, W)`` with a copy of ``kernel`` and the maximum-likelihood constant given W (σ² of the records,
    plus τ² of the resolution noise in W)."""
    model = PrivacyAwareGPR(
        (X, W),
        gpflow.utilities.deepcopy(kernel),
        Sigma,
        gpflow.mean_functions.Constant(np.zeros(1)),
        noise_variance + resolution**2,
        resolution=resolution,
    )
    model.mean_function.c.assign(_gls_mean(model))
    return model


def _refit_check(
    W: np.ndarray,
    Sigma: Covariance,
    design: ReleaseDesign,
    insecure_noise_seed: Optional[int] = None,
    resolution: float = 0.0,
) -> "tuple[np.ndarray, Covariance, RefitCheck]":
    r"""Check the floor under the θ refitted on W; where it fails, add noise to W (post-processing), on a schedule.

    Step k = 0, 1, …: ``θ̂_k`` and ``σ̂²_k`` are refitted on ``W_k`` (:func:`_refitted`, ``W_0 = W``, ``Σ_0 = Σ``).
    If every floor the release claims holds under them (each ``Var[Tₐ | W_k] ≥ ξₐ``, and the strong margin when
    claimed), the check ends. Otherwise ``Σ*_k = solve(θ̂_k, σ̂²_k, Σ_k)``, the minimum-trace covariance that, added
    to ``Σ_k``, meets the floor under them (eq. 8/10/11 with ``K + V → K_θ̂ + σ̂²I + Σ_k``, as for a later release),
    and
    ``W_{k+1} = W_k + Δ_k``, ``Δ_k ~ N(0, c_k Σ*_k)`` from OS randomness (:func:`~gpflow_fed.release.obfuscate`),
    ``Σ_{k+1} = Σ_k + c_k Σ*_k``, ``c_k =`` :func:`refit_check_scale` ``(k)``; at most :data:`REFIT_CHECK_STEPS`
    steps. The noise is in the refitted θ's directions, not the design's. W's resolution noise ``τη`` (``resolution``
    τ, public) is in every model the check fits (noise ``σ̂² + τ²``), and σ̂², the records' own noise, is refitted
    above τ²; ``Σ*_k`` is solved with V = σ̂²I alone (τ² not counted: more noise, never less).

    **Post-processing**: Y is not an argument. ``Δ_k``'s covariance is a function of ``W_k``, X, ``Σ_k``, σ² and the
    public design, and ``Δ_k`` is drawn independently of everything else, so ``W' − W`` is independent of Y given
    W: whoever holds ``W'`` knows no more than whoever holds W, and the design-θ floor of W still holds (more noise
    only raises the posterior variance), as does the floor under every ``θ̂_j`` for which noise was added.

    :return: ``(W', Σ', check)``: the released outputs, the covariance of their noise (``Σ + Σ_k c_k Σ*_k``) and
        the record of the check.
    :raises ValueError: the floor still fails under the refitted θ after the last step, or the refitted θ's prior
        variance at a failing target is at or below its tolerance (no noise can help); the message names the point.
    """
    added = 0.0
    step = 0
    while True:
        model = _released_model(design.X, W, design.kernel, Sigma, design.noise_variance, resolution)
        fitted = _refitted(model, REFIT_CHECK_MAXITER)
        sigma2 = float(f"{float(fitted.likelihood.variance.numpy()) - resolution**2:.{REFIT_CHECK_DIGITS}g}")
        at = replace(design, noise_variance=sigma2)
        floor = at.floor(fitted.kernel)
        variance, short, margin = _short(fitted, floor)
        if not short.size and margin >= 0.0:
            theta = {k: v.numpy() for k, v in gpflow.utilities.parameter_dict(fitted.kernel).items()}
            return W, Sigma, RefitCheck(step, theta, variance, added, sigma2)
        hopeless = np.flatnonzero(floor.prior <= floor.xi)
        i = int(hopeless[0]) if hopeless.size else int(np.argmin(variance - floor.xi))
        if hopeless.size or step == REFIT_CHECK_STEPS:
            raise ValueError(_refit_refusal(fitted, floor, i, variance[i], step, margin))
        try:
            star = np.asarray(at.solve(_rounded(fitted.kernel), np.asarray(Sigma)))
        except ValueError as exc:
            raise ValueError(f"{_refit_refusal(fitted, floor, i, variance[i], step, margin)} ({exc})") from None
        delta = _step_covariance(star, refit_check_scale(step), float(np.max(floor.prior)))
        W = obfuscate(W, delta, insecure_noise_seed=_step_seed(insecure_noise_seed, step, W))
        Sigma = _covariance_from_factor(np.concatenate([_noise_factor(Sigma), delta.factor()], axis=1))
        added += delta.trace()
        step += 1


def _theta_text(kernel: gpflow.kernels.Kernel) -> str:
    """``lengthscales=0.52, variance=1`` for a kernel's parameters (their last path component; scalars shortened)."""
    parts = []
    for path, value in gpflow.utilities.parameter_dict(kernel).items():
        array = np.asarray(value.numpy())
        parts.append(f"{path.lstrip('.')}={array.item():.4g}" if array.size == 1 else f"{path.lstrip('.')}={array}")
    return ", ".join(parts)


def _refit_refusal(fitted: PrivacyAwareGPR, floor: Floor, i: int, variance: float, steps: int, margin: float) -> str:
    """The refusal of :func:`_refit_check`, naming the point (and saying when no noise can help)."""
    record = int(floor.targets.records[i])
    where = f"the record in row {record}" if record >= 0 else "f"
    point = floor.targets.points[i].tolist()
    what = (
        f"Var = {variance:.6g} < tolerance {floor.xi[i]:.6g}"
        if variance < floor.xi[i]
        else f"the strong margin λ_min(Cov[T | W] − Ξ) is {margin:.3g} < 0"
    )
    text = (
        f"refused: under the θ refitted on the released W by maximum likelihood ({_theta_text(fitted.kernel)}, "
        f"σ² = {float(fitted.likelihood.variance.numpy()) - fitted.resolution**2:.4g}), the "
        f"floor fails at sensitive input {int(floor.targets.source[i])} (x = {point}, {where}): {what}, after "
        f"{steps} post-processing noise step(s) (at most {REFIT_CHECK_STEPS})"
    )
    if floor.prior[i] <= floor.xi[i]:
        text += (
            f"; the refitted θ's prior variance there, {floor.prior[i]:.6g}, is at or below the tolerance: no noise "
            "can help"
        )
    return text + (
        ". Nothing was released: lower the tolerance, widen theta_range (CLI --lengthscale-range), or give the "
        "data's own noise variance (a design σ² above it counts noise the records do not have)"
    )


#: Region grids have at least this many points per (smallest) lengthscale of the design kernel.
REGION_POINTS_PER_LENGTHSCALE = 4.0
#: The region floor is verified on a grid this many times denser than the design grid (and at the records).
REGION_CHECK_FACTOR = 4.0


def region_density(kernel: gpflow.kernels.Kernel) -> float:
    """The default grid density of a region: ``max(20, REGION_POINTS_PER_LENGTHSCALE / min ℓ)`` points per unit.

    :raises ValueError: the kernel has no ``lengthscales`` (then pass ``density=``).
    """
    lengthscales = getattr(kernel, "lengthscales", None)
    if lengthscales is None:
        raise ValueError(
            f"a {type(kernel).__name__} kernel has no lengthscales to set a region's grid density: pass density="
        )
    return max(20.0, REGION_POINTS_PER_LENGTHSCALE / float(np.min(lengthscales.numpy())))


def _verify_region(
    model: PrivacyAwareGPR, region: Region, tolerance: gpflow.kernels.Kernel, density: float, protect: str
) -> None:
    """The floor ``Var[T | W] ≥ H(t, t)`` on a grid ``REGION_CHECK_FACTOR`` times denser than the design grid and at
    every record inside the region, under the published θ (before anything is written).

    :raises ValueError: naming the worst point, its variance and its tolerance.
    """
    X = model.data[0].numpy()
    points = with_records(region.discretise(REGION_CHECK_FACTOR * density), X, region)
    if protect == "records":  # the records a hair outside its edge too (with_near_records), under the published θ
        points = with_near_records(points, X, model.kernel)
    targets = protected_targets(X, points, protect if protect == "records" else "latent")
    xi = kernel_diag(tolerance, targets.points)
    variance = np.concatenate(
        [
            np.diag(model.protected_covariance(targets.points[i : i + 512], targets.records[i : i + 512]).numpy())
            for i in range(0, targets.points.shape[0], 512)
        ]
    )
    slack = FLOOR_RTOL * float(np.max(model.kernel(targets.points, full_cov=False).numpy()))
    gap = variance - xi
    worst = int(np.argmin(gap))
    if gap[worst] < -slack:
        record = targets.records[worst]
        where = f"the record in row {record}" if record >= 0 else "f"
        raise ValueError(
            f"the region's floor fails between the grid points: at x = {targets.points[worst].tolist()} ({where}) "
            f"the released model's variance is {variance[worst]:.6g} < tolerance {xi[worst]:.6g} (checked on a grid "
            f"{REGION_CHECK_FACTOR:g}× denser than density={density:g} and at the records); raise density"
        )


#: Eigenvalues of a later release's Σ_Δ below this fraction of the largest prior variance are rounding (Δ = 0).
DELTA_RTOL = 1e-9
#: A row whose noise variance ``Σ_jj`` is at most this fraction of ``K(x_j, x_j)`` is released unchanged (its noise
#: sd is below 1e-6 of the prior sd).
UNCHANGED_RTOL = 1e-12
#: A kernel variance within this many sd (of what the release noise leaves unknown about the raw Y's sample
#: variance) of that sample variance is refused unless confirmed (:func:`_public_statistics`).
PUBLIC_VARIANCE_TOL = 0.1


def _unchanged(Sigma: Covariance, prior: np.ndarray) -> np.ndarray:
    """``[N]`` whether each row's noise variance ``Σ_jj`` is ≤ ``UNCHANGED_RTOL · K(x_j, x_j)`` (W_j = Y_j)."""
    diag = Sigma.diagonal() if isinstance(Sigma, LowRankCovariance) else np.diag(np.asarray(Sigma))
    return np.asarray(diag <= UNCHANGED_RTOL * prior)


#: A public mean m is taken as if ``|m − mean(Y)|`` were ``|m − mean(W)|`` less this many sd of ``mean(W) − mean(Y)``
#: (:func:`_public_statistics`: decided from W, so that the flag is no oracle for mean(Y)).
MEAN_SLACK_SDS = 4.0


def _public_statistics(
    Y: np.ndarray,
    W: np.ndarray,
    Sigma: Covariance,
    mean: Optional[float],
    kernel_variance: Optional[float],
    *,
    X: np.ndarray,
    kernel: gpflow.kernels.Kernel,
    noise_variance: float,
    floor: Floor,
    resolution: float = 0.0,
) -> List[str]:
    r"""The public values given beside W that are facts about Y the floor does not allow.

    ``W − Y = Lω`` with ``Σ = LLᵀ`` (rank r) and ``ω ~ N(0, I_r)``, so each independent fact about Y fixes one
    combination of ω, and r of them give Y back.

    **The mean** m is one fact ``m = aᵀY + e``, ``a = 1/N`` (every entry), with e of size ``|m − mean(Y)|``, which
    the check bounds from W alone: ``g = max(0, |m − mean(W)| − MEAN_SLACK_SDS·sd)``, where ``mean(W) − mean(Y)`` is
    ``aᵀLω + τ·mean(η)``, of ``sd = √(aᵀΣa + τ²/N)``; so the flag is a function of W, m and Σ, never an oracle for
    ``mean(Y)`` (a fifth fresh attacker bisected a flag computed from Y to ``mean(Y)`` within 7.9e-9).
    Whoever holds W and m knows ``s = aᵀW − m = bᵀω − e``, ``b = Lᵀa``, which does not depend on Y. With e taken as
    ``N(0, g²)`` independent of ω, Gaussian conditioning gives ``ω | s ~ N(μ(s), I − b(bᵀb + g²)⁻¹bᵀ)``, and
    ``W' = W − Lμ(s) = Y + L(ω − μ(s))``, whose noise ``L(ω − μ(s))`` is independent of s and of Y: (W, m) tells
    about Y exactly what W' tells, a release with noise covariance

    ``Σ' = Σ − Σa(aᵀΣa + g²)⁻¹aᵀΣ = L'L'ᵀ``,  ``L' = L·M^{1/2}``,  ``M = I_r − b(bᵀb + g²)⁻¹bᵀ``

    (a rank-one downdate of L; ``M^{1/2}`` from M's eigenpairs, so ``g = 0``, the exact mean, removes b's direction,
    and ``g → ∞`` gives ``Σ' → Σ``). m is flagged when the floor fails under Σ' where it holds under Σ
    (:func:`_short` on the model of X with Σ', the design θ and σ²: some ``Var[Tₐ | W'] < ξₐ`` beyond ``FLOOR_RTOL``,
    or the strong margin < 0 when claimed). Σ is the one solved before the check under the refitted θ, whose noise
    (added later) is not counted: more flags, never fewer. The floor has slack where the θ range adds noise. On a
    fresh attacker's set-up (N = 40 on [0, 1], ℓ = 0.2, σ² = 0.01, the record at x₂₀, ξ = 0.5 K, the default θ range,
    rank Σ = 3) the record's variance is 1.165 ξ from W alone and, with m at ``g = h·√(aᵀΣa)``, 0.365 ξ at h = 0,
    0.434 ξ at 0.2, 0.662 ξ at 0.5 and 0.927 ξ at 1 (flagged), 1.129 ξ at 3 and 1.161 ξ at 10 (not flagged). Where
    the floor has no slack (``theta_range="design", refit_check=False``: 1.000 ξ from W) every informative mean fails
    it (0.951 ξ at h = 3, 0.999 ξ at 30) and is flagged.

    **The kernel variance** v against the sample variance ``var_d(Y) = YᵀPY/(N − d)`` (P centres, ddof d = 0, 1) is
    the same kind of fact, linearised at Y (``a = 2PY/(N − d)``), but v is also the design prior's own parameter, which
    the floor already assumes known: a v from other knowledge lies within a few ``√(aᵀΣa)`` of var(Y) on data that
    follow the prior, and the downdate, which counts v as a measurement, flags it (3 of 7 data sets drawn from the
    design prior with v = 1: 0.549–0.917 ξ). So v is flagged only within ``PUBLIC_VARIANCE_TOL`` of that sd, as
    before (``sd_var = (2/N)√((PY)ᵀΣ(PY))``): var(Y) passed as v, not a rounded var(Y).

    Computed by the owner (it uses Y); the messages name no statistic of Y.
    """
    L = _noise_factor(Sigma)
    N = Y.shape[0]
    values = Y[:, 0]
    found = []
    if mean is not None and L.shape[1]:

        def shortfalls(factor: np.ndarray) -> "tuple[set[int], bool]":
            """The targets below their floor with noise factor ``factor``, and whether the strong margin fails."""
            model = PrivacyAwareGPR(
                (X, np.zeros((N, 1))), kernel, _covariance_from_factor(factor), None, noise_variance
            )
            with _singular("the check of the public mean"):
                _, short, margin = _short(model, floor)
            return set(short.tolist()), margin < 0.0

        b = L.T @ np.full(N, 1.0 / N)
        # from W, not Y: a flag decided by |m − mean(Y)| was an oracle (a fifth fresh attacker bisected accept/refuse
        # to mean(Y) within 7.9e-9 in 45 calls, and the record's variance fell to 0.267 ξ); mean(W) − mean(Y) = bᵀω,
        # so m is taken as close to Y's mean as MEAN_SLACK_SDS of that noise allows
        slack = MEAN_SLACK_SDS * float(np.sqrt(b @ b + resolution**2 / N))  # W's resolution noise τη too
        gap = max(0.0, abs(float(mean) - float(np.mean(W))) - slack)
        M = np.eye(L.shape[1]) - np.outer(b, b) / max(float(b @ b) + gap**2, np.finfo(float).tiny)
        lam, Q = np.linalg.eigh(0.5 * (M + M.T))
        base_short, base_margin = shortfalls(L)  # Σ meets the floor unless the owner confirmed an unprotected release
        short, margin = shortfalls(L @ (Q * np.sqrt(np.clip(lam, 0.0, None))[None, :]))
        if short - base_short or (margin and not base_margin):
            found.append(
                f"mean={float(mean):g} published beside W is one more fact about Y, close enough to the released "
                f"target's own mean that the floor fails with it; rank Σ = {L.shape[1]} such facts give Y back"
            )
    if kernel_variance is not None:
        sd = 2.0 / N * float(np.linalg.norm(L.T @ (values - np.mean(values))))
        for ddof in (0, 1):
            if abs(float(kernel_variance) - float(np.var(values, ddof=ddof))) <= PUBLIC_VARIANCE_TOL * sd:
                found.append(
                    f"the kernel variance {float(kernel_variance):g} is within {PUBLIC_VARIANCE_TOL} sd of the "
                    f"target's own sample variance (ddof={ddof}): var(Y) is a natural guess for it, but published "
                    f"beside W it is one more (quadratic) fact about Y, and rank Σ = {L.shape[1]} such facts give Y "
                    "back; use a value from other knowledge"
                )
                break
    return found


def _check_earlier_floor(
    X: np.ndarray, previous: EarlierRelease, kernel: gpflow.kernels.Kernel, noise_variance: float, floor: Floor
) -> None:
    r"""Refuse a later release whose floor the earlier release of the same records already breaks.

    ``W₂ = W₁ + Δ`` tells its holders nothing beyond W₁, so whoever holds W₁ predicts each protected target with
    ``Var[T | W₁]`` (Σ₁ alone, under the design θ), however much noise Δ adds. A later release with a higher
    tolerance, or protecting a sensitive input the earlier one did not (a fresh attacker: MSE 0.04 ξ there from W₁),
    would promise a floor that holders of W₁ do not meet. Computed from W₁, Σ₁ and the public design only.

    Its holders have the **whole** earlier release as published (a fresh attacker dropped a row from the second
    release, and reordered rows of equal value, so that the rows repeated hid the earlier release's own noise-free
    row), so the floor is checked twice: on the rows repeated (each target as this release defines it, with the
    strong margin when claimed), and on the whole earlier release ``(X₁, W₁, Σ₁)`` under the design θ, where a
    record is the earlier row of its value and inputs or, where its inputs changed, any earlier row of its value (the
    smallest variance counts), and ``f(s)`` is at s. An earlier
    release with inputs of another dimension cannot be checked there, and is refused too.

    :raises ValueError: some ``Var[Tₐ | W₁] < ξₐ`` (or the strong margin < 0), naming the input.
    """
    earlier = _released_model(X, previous.W, kernel, _covariance_from_factor(previous.factor), noise_variance)
    with _singular("the earlier release's floor"):
        variance, short, margin = _short(earlier, floor)
    if previous.released is not None and not short.size and margin >= 0.0:
        X1, W1, L1 = previous.released
        if X1.shape[1] != X.shape[1]:
            raise ValueError(
                f"these records were released before ({previous.entry}) with inputs of {X1.shape[1]} column(s), "
                f"and this release has {X.shape[1]}: the floor its holders have at this release's sensitive inputs "
                "cannot be computed. Confirm that this release's audience does not hold the earlier one "
                "(confirm_new_audience=True, CLI --confirm-new-audience)"
            )
        whole = _released_model(X1, W1, kernel, _covariance_from_factor(L1), noise_variance)
        variance = _whole_release_variance(whole, X, floor, previous.same_value)
        scale = float(np.max(kernel_diag(kernel, X1)))
        short = np.flatnonzero(variance < floor.xi - FLOOR_RTOL * scale)
    if not short.size and margin >= 0.0:
        return
    i = int(short[np.argmin(variance[short] - floor.xi[short])]) if short.size else int(np.argmin(variance))
    what = (
        f"Var = {variance[i]:.6g} < tolerance {floor.xi[i]:.6g}"
        if short.size
        else f"the strong margin λ_min(Cov[T | W₁] − Ξ) is {margin:.3g} < 0"
    )
    raise ValueError(
        f"these records were released before ({previous.entry}), and holders of that release already predict "
        f"sensitive input {int(floor.targets.source[i])} beyond this release's floor ({what}): a later release is "
        "computed from the earlier one and cannot take back what it revealed. Release with a tolerance the earlier "
        "release meets (W₁ is then republished), or confirm that this release's audience does not hold the earlier "
        "one (confirm_new_audience=True, CLI --confirm-new-audience): its floor then holds against them only"
    )


def _whole_release_variance(
    whole: PrivacyAwareGPR, X: np.ndarray, floor: Floor, same_value: "tuple[np.ndarray, ...]"
) -> np.ndarray:
    """``[t]`` each target's variance given the whole earlier release (``whole``): a record, at the earlier row of
    its value and its inputs (this release's ``X``), else the smallest over the earlier rows of its value; ``f(s)``,
    at s."""
    X1 = whole.data[0].numpy()
    points, records, owner = [], [], []
    for a, (point, row) in enumerate(zip(floor.targets.points, floor.targets.records)):
        rows = same_value[row] if row >= 0 and same_value else np.empty(0, dtype=int)
        same_inputs = rows[[bool(np.array_equal(X1[i], X[row])) for i in rows]] if rows.size else rows
        rows = same_inputs if same_inputs.size else rows
        for i in rows:
            points.append(X1[i])
            records.append(int(i))
            owner.append(a)
        if row < 0 or not rows.size:
            points.append(point)
            records.append(-1)
            owner.append(a)
    with _singular("the earlier release's floor"):
        cov = whole.protected_covariance(np.asarray(points), np.asarray(records)).numpy()
    variance = np.full(floor.xi.shape, np.inf)
    np.minimum.at(variance, np.asarray(owner), np.diag(cov))
    return variance


def _resolution(
    Y: np.ndarray, W0: np.ndarray, noise_variances: np.ndarray, declared: Optional[float], protected: np.ndarray
) -> float:
    """τ of the resolution noise: 0 if declared 0 (confirmed), else the larger of the declared value and
    :func:`~gpflow_fed.release.resolution.recording_resolution` of Y at the magnitude
    ``max_j(|W₀_j| + 6·√Σ_jj)`` (W₀ the release before the resolution noise, ``noise_variances`` the diagonal of its
    noise covariance Σ: post-processing of W₀ and Σ, not a function of Y, and above ``max|Y|`` but for a 6-sd draw of
    the noise), found on the rows that are not protected records (``protected``: their indices) while they are at
    least half of Y: τ is published, and computed with a protected record it told whether that record's value is on
    a coarser grid (a fresh attacker: τ 0.05 or 0.1 as a 5-cent price was a multiple of 0.05 or not)."""
    if declared == 0.0:
        return 0.0
    others = np.setdiff1d(np.arange(Y.shape[0]), protected)
    rows = Y[others] if 2 * others.size >= Y.shape[0] else Y
    magnitude = float(np.max(np.abs(W0[:, 0]) + 6.0 * np.sqrt(np.maximum(noise_variances, 0.0))))
    detected = recording_resolution(rows, magnitude=magnitude)
    return detected if declared is None else max(declared, detected)


def release(
    data: "tuple[np.ndarray, np.ndarray]",
    sensitive: Union[np.ndarray, Region],
    tolerance: Tolerance,
    *,
    kernel: Optional[gpflow.kernels.Kernel] = None,
    noise_variance: Optional[float] = None,
    mean: Optional[float] = None,
    public_data: "Optional[tuple[np.ndarray, np.ndarray]]" = None,
    refit: bool = False,
    density: Optional[float] = None,
    method: str = "strong",
    low_rank: Optional[bool] = None,
    solver: Optional[str] = None,
    maxiter: int = 1000,
    insecure_noise_seed: Optional[int] = None,
    protect: str = "records",
    ledger: Union[str, Path, ReleaseLedger, None, bool] = True,
    confirm_unprotected: bool = False,
    confirm_public: bool = False,
    theta_range: ThetaRange = DEFAULT_RANGE,
    theta_points: int = 3,
    refit_check: bool = True,
    confirm_new_audience: bool = False,
    resolution: Optional[float] = None,
    confirm_no_resolution: bool = False,
) -> PrivacyRelease:
    r"""The owner's release (§3.2): design Σ (eq. 8/10/11) from **public** hyperparameters, obfuscate (§4.1),
    build the released model.

    Everything the result holds is computed from what is already public: X, the tolerance, the design
    hyperparameters (given, or fitted on ``public_data``) and W. The raw Y enters only W. Σ is low rank (rank ≈
    the number of sensitive inputs), so W fixes Y up to that many scalars, and *any* statistic of the raw Y
    published beside W (a mean, hyperparameters fitted on Y) adds equations that solve for them.

    1. Design (public): θ and σ² are ``kernel``'s values and ``noise_variance`` as given, or, with
       ``public_data``, fitted by maximum likelihood (:func:`fit_hyperparameters`) on that public or disjoint
       data (rows of the released data are refused).
    2. Σ from the design θ, σ² (eq. 8/10/11), solved jointly over the public θ range (``theta_range``: by default
       every lengthscale within ×2 of the design's), ``W = Y + Z`` with ``Z ~ N(0, Σ)`` from OS randomness.
    3. Before anything is returned or recorded, the floor is checked under the θ an attacker would fit on W alone
       (maximum likelihood, :func:`_refit_check`); where it fails, noise is added to W (post-processing, never a
       redraw from Y) in the refitted θ's directions, at most ``REFIT_CHECK_STEPS`` steps, else the release is
       refused naming the point.
    4. Post-processing of W: the constant mean is ``mean`` if given, else its maximum-likelihood value given W
       (``1ᵀC⁻¹W / 1ᵀC⁻¹1``, ``C = K_XX + V + Σ``); with ``refit=True`` the kernel hyperparameters (and the mean
       unless given) are refitted by maximum likelihood on ``(X, W)`` with Σ and σ² fixed. Σ is tight at the
       design θ, so a refitted θ̂ often predicts some sensitive input better than ξ; the published θ then
       retreats towards the design θ until the floor holds (with a ``UserWarning``; see :func:`_refit`).
    5. The floor: the released model's variance of each protected target (eq. 4, under the **published** θ) is
       checked to be ≥ ξ (``result.variance``), and for ``method="strong"`` the strong margin
       ``λ_min(Cov[T | W] − Ξ_T) ≥ 0``.

    **Resolution noise** (issue 44, a target recorded on a grid): ``W − Lω − Y = 0`` in every direction outside
    range(Σ), so a target recorded to Δ (2 decimals: 0.01) is given back exactly by enumerating the grid values of
    rank Σ pivot rows and keeping the ω that puts every row on the grid. Step 2 therefore adds independent full-rank
    noise ``τη``, ``η ~ N(0, I_N)`` from OS randomness (:func:`~gpflow_fed.release.resolution.resolution_noise`), with
    τ = Δ the target's recording resolution: a Gaussian of sd Δ wrapped on the grid's spacing Δ is uniform to a
    relative ripple ``2·exp(−2π²) ≈ 5.4e-9`` per row, so the grid no longer tells candidate ω apart
    (:mod:`~gpflow_fed.release.resolution`; the attack is tested in ``tests/release/test_resolution.py``). Δ is
    detected from Y (:func:`~gpflow_fed.release.resolution.recording_resolution`: the coarsest grid a group of
    records shares beyond chance — decimal grids, half-steps, integers, ``1.8·C + 32``, at any offset, with off-grid
    records or a subset on a coarser grid — and at least the precision floor, 1e-11 for data of magnitude 1) or
    declared (``resolution=``, for a grid the detection misses, e.g. thirds among finer records; a declared Δ below
    the detected one is raised to it). τ is published
    (``result.resolution``, ``model.npz``), a fact about how the target is recorded, and the released model's
    Gaussian noise variance is ``σ² + τ²`` (``τη`` is in W, not in the records: :class:`PrivacyAwareGPR`). Σ is
    designed, and every floor checked, with τη not counted as protection beyond that noise variance of W (the floor
    is met by Σ alone under σ²; the refit check fits σ² above τ²). A later release ``W₁ + Δ`` adds fresh ``τη`` with
    Δ (the earlier release's resolution noise is in W₁ but not counted); a republished W₁ (Δ = 0) is W₁ unchanged,
    with τ = 0.

    Which quantity is protected (``protect``): by default the **records** — at a sensitive input that is a training
    input, ``Var[Y_j | W] ≥ ξ`` for the recorded value ``Y_j = f(x_j) + ε_j`` (feasible iff ``ξ < K(s, s) + σ²``);
    at a sensitive input without a record, ``Var[f(s) | W] ≥ ξ``. ``protect="latent"`` is the paper's floor on f.
    For a region, every training input inside it is a sensitive input too.

    Refusals (``ValueError``) unless the owner confirms: a Σ that is zero or leaves a protected record's row
    unchanged (``confirm_unprotected=True``); a ``mean`` or kernel variance close enough to the raw Y's own mean /
    sample variance that, taken as one more fact about Y, it breaks the floor (``confirm_public=True``; see
    :func:`_public_statistics`).

    Later releases (DESIGN.md §5, principle 6): the records are looked up in the owner's private ledger
    (:mod:`~gpflow_fed.release.ledger`, by recorded value); records released before give ``W = W₁ + Δ`` with Δ's
    covariance solved with Σ₁ fixed (Δ = 0 republishes W₁ when Σ₁ already meets the floor), and the release is
    recorded before it is returned. Holders of W₁ know everything W tells, so a release whose floor W₁ already
    breaks (a higher tolerance, a new sensitive input) is refused unless ``confirm_new_audience=True``
    (:func:`_check_earlier_floor`). So is a target that is an affine map ``aY₁ + b`` (a unit change) of an earlier
    release's rows, none of whose values were released before (:meth:`~gpflow_fed.release.ledger.ReleaseLedger.
    check_unit_change`): publish ``aW₁ + b`` instead.

    :param data: raw ``(X [N, D], Y [N, 1])``; Y is used for W only.
    :param sensitive: ``[γ, D]`` sensitive inputs, or a :class:`~gpflow_fed.release.Region` (interval, box,
        union) discretised at ``density`` and handled by
        :func:`~gpflow_fed.release.region_noise_covariance` (needs a kernel tolerance H; ``method="strong"``:
        eq. 12–13, ``method="weak"``: eq. 10 at the grid points, certified Krylov reduction).
    :param tolerance: as for :func:`~gpflow_fed.release.synthetic_noise_covariance`; a kernel H may wrap
        ``kernel`` (e.g. ``ProportionalKernel(kernel, 0.5)``) and then follows the design hyperparameters.
    :param kernel: K with public hyperparameter values (the design θ); required unless ``public_data`` is given
        (then ``SquaredExponential()`` by default, fitted in place on ``public_data``).
    :param noise_variance: σ² of V, a public number ≥ 0 (0 for deterministic data); required unless
        ``public_data`` is given (then None estimates it there).
    :param mean: the released constant mean, a public number; None: its maximum-likelihood value given W.
    :param public_data: ``(X_public, Y_public)``, public data or data disjoint from ``data`` (not released by
        this call), on which the design θ and σ² are fitted.
    :param refit: refit the kernel hyperparameters (and the mean unless given) on the released ``(X, W)``,
        post-processing, kept within the floor under the published θ (step 3).
    :param density: grid points per unit length when ``sensitive`` is a region; None (default): follows the design
        lengthscale, :func:`region_density`. Either way the floor is then verified on a grid
        ``REGION_CHECK_FACTOR`` times denser and at every record inside the region, under the published θ, and a
        release that fails there is refused naming the worst point.
    :param method: ``"strong" | "weak" | "diagonal"``.
    :param low_rank: see :func:`~gpflow_fed.release.synthetic_noise_covariance`.
    :param solver: for the SDP methods (see :func:`~gpflow_fed.release.synthetic_noise_covariance`): the weak
        method uses the certified Krylov reduction unless ``solver="dense"``.
    :param maxiter: L-BFGS iterations of each maximum-likelihood fit (``public_data``, ``refit``; the refit check
        always runs ``REFIT_CHECK_MAXITER``).
    :param insecure_noise_seed: leave None: the synthetic noise (§4.1) comes from the OS, so the release cannot
        be de-noised by regenerating it; an int makes W reproducible for tests only (see
        :func:`~gpflow_fed.release.obfuscate`).
    :param protect: ``"records"`` (default) or ``"latent"`` (the paper's floor on f, by name).
    :param ledger: the owner's private release ledger: True (default: :func:`~gpflow_fed.release.ledger.
        default_ledger_folder`), a folder or a :class:`~gpflow_fed.release.ledger.ReleaseLedger`; None turns it off
        (then a second release of the same rows with fresh noise can give Y back: tests and simulations only).
    :param confirm_unprotected: release even though Σ is zero or leaves a protected record's row unchanged.
    :param confirm_public: publish ``mean`` / the kernel variance even though they lie within the stated tolerance
        of the raw Y's own statistics.
    :param theta_range: the public θ range over which the floor must hold too (an attacker fits θ on W;
        :mod:`~gpflow_fed.release.theta`): ``"default"`` (every lengthscale within
        ``DEFAULT_LENGTHSCALE_FACTOR`` = 2 of the design's), a factor ``F > 1`` (lengthscales within ×F), a dict
        ``{"lengthscales": (lo, hi), "variance": (lo, hi)}`` (any scalar kernel parameter by name), or the named
        opt-out ``"design"`` (the design θ only: the paper's setting). Σ is accumulated over the grid of
        ``theta_points`` geometric values per axis (and the design θ), ``Σ ← Σ + (A_θ − K_θ − V − Σ)⁺`` for the
        strong method (the weak SDP with ``C = K_θ + V + Σ`` likewise), which is feasible for every grid θ (not of
        minimum trace). A kernel tolerance ``αK`` of ``kernel`` follows each θ (``αK_θ``); any other tolerance stays
        as designed (:mod:`~gpflow_fed.release.design`). ``None`` is refused (name ``"design"``).
    :param theta_points: grid values per axis of ``theta_range`` (≥ 2).
    :param confirm_new_audience: release records released before even though the earlier release already breaks
        this release's floor (its audience must not hold the earlier release: the floor holds against them only).
    :param refit_check: check the floor under the θ refitted on W and add post-processing noise where it fails
        (step 3, :func:`_refit_check`); False turns the check off (simulations and tests only, like
        ``ledger=None``).
    :param resolution: the target's recording resolution Δ (τ of the resolution noise, above): None (default)
        detects it from Y; a number > 0 declares it (raised to the detected one if below it); 0 adds no resolution
        noise and is refused unless ``confirm_no_resolution=True``.
    :param confirm_no_resolution: release without resolution noise (``resolution=0``): a target on a grid is then
        given back exactly by enumerating grid values (tests and full-precision data only).
    :raises ValueError: bad data, a missing public design input, a kernel with a ``White`` part (observation noise:
        give it in ``noise_variance``; :func:`~gpflow_fed.release.linalg.check_no_white`) or any of the tolerance
        errors (all before any fitting); the refusals above; rows shared with several earlier releases; a grid θ whose
        prior variance is at or below the tolerance (no noise can help there); a kernel without lengthscales under
        the default range; the refit check's refusal (step 3).
    """
    check_method(method)
    check_protect(protect)
    if kernel is not None:  # before any fit on public_data: a White part is noise (linalg.check_no_white)
        check_no_white(kernel)
    theta_range = check_theta_range(theta_range)
    store = resolve_ledger(ledger)
    region = sensitive if isinstance(sensitive, Region) else None
    if region is not None:
        if method == "diagonal":
            raise ValueError(
                "a sensitive region needs method='strong' or 'weak' (got 'diagonal'); discretise it "
                "yourself with region.discretise(density) for the diagonal SDP"
            )
        if density is not None and not (np.isfinite(density) and density > 0):
            raise ValueError(f"a sensitive region needs density > 0 (grid points per unit length), got {density}")
        X = as_inputs(data[0], "X")
        check_region(region, X, tolerance)
        S = X[:0]  # the grid follows the design lengthscale, known after the design fit below
    else:
        X, S = release_inputs(data[0], sensitive)
    Y = _outputs(data[1], X.shape[0], "Y")
    declared = check_resolution(resolution)
    if declared == 0.0 and not confirm_no_resolution:
        raise ValueError(
            "resolution=0 adds no resolution noise: a target recorded on a grid is then given back exactly by "
            "enumerating the grid values of a few rows (issue 44); omit resolution to detect it, declare the "
            "spacing, or confirm with confirm_no_resolution=True (CLI: --confirm-no-resolution)"
        )
    if noise_variance is not None and not (np.isfinite(noise_variance) and noise_variance >= 0):
        raise ValueError(f"noise_variance must be None or a number ≥ 0, got {noise_variance}")
    if mean is not None and not np.isfinite(mean):
        raise ValueError(f"mean must be None (estimated from W) or a finite number, got {mean}")
    if public_data is None and (kernel is None or noise_variance is None):
        missing = [name for name, value in (("kernel", kernel), ("noise_variance", noise_variance)) if value is None]
        raise ValueError(
            f"give {' and '.join(missing)} as public inputs (a kernel with public hyperparameter values; σ² of V, 0 "
            "for deterministic data), or public_data= (public or disjoint data to fit them on): Σ is designed "
            "from them, and fitted on the raw Y they let anyone holding the release recover Y"
        )
    if region is None:
        _check_tolerance_shape(tolerance, S.shape[0])
    kernel = gpflow.kernels.SquaredExponential() if kernel is None else kernel
    given_variance = None
    if public_data is not None:
        _, noise_variance = fit_hyperparameters(
            _public_fit_data(public_data, X, Y), kernel, noise_variance=noise_variance, maxiter=maxiter
        )
    elif isinstance(getattr(kernel, "variance", None), gpflow.Parameter) and np.size(kernel.variance.numpy()) == 1:
        given_variance = float(kernel.variance.numpy())
    # given or fitted (checked above); a region has a kernel tolerance (check_region)
    sigma2 = float(cast(float, noise_variance))
    if region is None and protect == "records":  # a point a hair off a record names the record (check_near_records)
        check_near_records(kernel, X, S)
    if region is not None:
        density = region_density(kernel) if density is None else float(density)
        S = region.discretise(density)
        if protect == "records":  # every record inside the region, or a hair outside its edge, is a sensitive input
            S = with_near_records(with_records(S, X, region), X, kernel)
    hashes = store.row_hashes(Y) if store is not None else None
    previous = store.find(hashes, Y) if store is not None and hashes is not None else None
    affine = store.affine_hashes(Y) if store is not None else None
    if store is not None and affine is not None and previous is None and not confirm_new_audience:
        store.check_unit_change(affine)  # a·Y + b of an earlier release's rows: refused (ledger module docstring)
    if store is not None and previous is None and not confirm_new_audience:
        store.check_same_inputs(X)  # another target on inputs released before: refused (log Y of the same rows)
    # issue 44: inputs so far from zero in lengthscales that float64 computes the kernel in round-off, at every θ of
    # the range and every point the kernel will see (X, the sensitive inputs or region grid), before any design (after
    # the ledger's refusals, which compare inputs exactly)
    check_input_precision(range_kernels(kernel, theta_range, theta_points), X, [S], noise_variance=sigma2)
    Sigma1 = None if previous is None else previous.factor @ previous.factor.T

    design = ReleaseDesign(
        kernel,
        X,
        S,
        tolerance,
        sigma2,
        protected_targets(X, S, protect),
        method=method,
        protect=protect,
        region=region,
        density=density,
        low_rank=low_rank,
        solver=solver,
    )
    targets = design.targets
    floor = design.floor(kernel)
    if previous is not None and not confirm_new_audience:
        _check_earlier_floor(X, previous, kernel, sigma2, floor)
    Sigma = design.solve(kernel, Sigma1)
    certificate = getattr(Sigma, "certificate", None)
    grid = theta_grid(kernel, theta_range, theta_points)
    if grid:
        total = np.asarray(Sigma).copy()
        for name, at in grid:
            fixed = total if Sigma1 is None else total + Sigma1
            try:
                total += np.asarray(design.solve(at, fixed))
            except ValueError as exc:
                raise ValueError(f"under θ = {name} of theta_range: {exc}") from None
        Sigma = 0.5 * (total + total.T)
    xi = floor.xi
    if previous is not None:  # W₂ = W₁ + Δ: the released noise is Z₁ + Δ, Σ = Σ₁ + Σ_Δ
        delta = _noise_factor(Sigma)
        # Σ_Δ = (A − K − V − Σ₁)⁺ is zero up to rounding when Σ₁ already meets the floor: then W₁ is republished
        delta = delta[:, np.sum(delta**2, axis=0) > DELTA_RTOL * float(np.max(kernel_diag(kernel, X)))]
        W = previous.W.copy()
        tau = 0.0  # W₁ republished unchanged, unless Δ ≠ 0
        if delta.shape[1]:  # fresh resolution noise with Δ (W₁'s own, if any, is not counted)
            W = obfuscate(W, delta @ delta.T, insecure_noise_seed=insecure_noise_seed)
            variances = np.sum(previous.factor**2, axis=1) + np.sum(delta**2, axis=1)
            tau = _resolution(Y, W, variances, declared, targets.records[targets.records >= 0])
            W = W + resolution_noise(W.shape[0], tau, insecure_noise_seed)
        Sigma = _covariance_from_factor(np.concatenate([previous.factor, delta], axis=1))
    else:
        W = obfuscate(Y, Sigma, insecure_noise_seed=insecure_noise_seed)
        variances = Sigma.diagonal() if isinstance(Sigma, LowRankCovariance) else np.diag(np.asarray(Sigma))
        tau = _resolution(Y, W, variances, declared, targets.records[targets.records >= 0])
        W = W + resolution_noise(W.shape[0], tau, insecure_noise_seed)
    unchanged = _unchanged(Sigma, kernel_diag(kernel, X))
    records = targets.records[targets.records >= 0]
    if not confirm_unprotected and (unchanged.all() or unchanged[records].any()):
        what = (
            "Σ is zero: W equals Y in every row"
            if unchanged.all()
            else (f"Σ leaves {int(unchanged[records].sum())} protected record(s) unchanged (W_j = Y_j)")
        )
        raise ValueError(
            f"{what}; this is not a privacy-aware release (protect={protect!r}); raise the tolerance, use "
            "protect='records', or confirm with confirm_unprotected=True (CLI: --confirm-unprotected)"
        )
    if not confirm_public:
        found = _public_statistics(
            Y, W, Sigma, mean, given_variance, X=X, kernel=kernel, noise_variance=sigma2, floor=floor, resolution=tau
        )
        if found:
            raise ValueError(
                "; ".join(found)
                + ". Confirm with confirm_public=True (CLI: --confirm-public) if it is public knowledge"
            )
    del Y  # nothing below may depend on the raw outputs
    checked = None
    if refit_check:
        with _singular("the check under the θ refitted on W"):
            W, Sigma, checked = _refit_check(W, Sigma, design, insecure_noise_seed, tau)
        unchanged = _unchanged(Sigma, kernel_diag(kernel, X))
    constant = gpflow.mean_functions.Constant(np.zeros(1) if mean is None else np.array([float(mean)]))
    model = PrivacyAwareGPR(
        (X, W), gpflow.utilities.deepcopy(kernel), Sigma, constant, noise_variance=sigma2 + tau**2, resolution=tau
    )
    with _singular("the released model"):
        if mean is None:
            constant.c.assign(_gls_mean(model))
        else:
            gpflow.set_trainable(constant, False)
        if refit:
            _refit(model, floor, maxiter, fixed_mean=mean is not None)
        gpflow.set_trainable(constant, True)
        variance = _floor(model, floor)
        if region is not None:
            _verify_region(model, region, cast(gpflow.kernels.Kernel, tolerance), float(cast(float, density)), protect)
        log_likelihood = float(model.maximum_log_likelihood_objective().numpy())
    factor = model.noise_factor.numpy()
    if store is not None and hashes is not None:
        store.record(hashes, X, W, factor, affine)
    return PrivacyRelease(
        model=model,
        Sigma=Sigma,
        W=W,
        sensitive=S,
        noise_variance=sigma2,
        log_marginal_likelihood=log_likelihood,
        variance=variance,
        tolerance=xi,
        targets=targets,
        protect=protect,
        unchanged_rows=int(unchanged.sum()),
        rank=int(factor.shape[1]),
        earlier=None if previous is None else previous.entry,
        theta_range=describe_theta_range(theta_range, theta_points),
        refit_check=checked,
        certificate=certificate,
        resolution=tau,
        resolution_declared=declared is not None,
    )

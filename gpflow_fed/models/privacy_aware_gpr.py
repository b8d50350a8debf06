r"""PrivacyAwareGPR: GP regression on obfuscated data with full noise covariance ``V + Σ`` (Tuo & Bhattacharya).

The released model predicts with eq. (3)–(4)::

    f̂_P(x*) = m(x*) + K_{x*X} (K_XX + V + Σ)⁻¹ (W − M),
    Var[f(x*) | X, W] = K_{x*x*} − K_{x*X} (K_XX + V + Σ)⁻¹ K_{Xx*},

which is the best (minimum-MSE) predictor anyone can build from the released ``(X, W)``, the GP's mean and
covariance, V and Σ; so the variance at the sensitive inputs is a hard floor (§3.2). :func:`release` runs
the owner's three steps (§3.2): fit hyperparameters on the raw data (GPflow GPR maximum likelihood with a
constant mean), compute Σ, obfuscate, and build the released model, which holds only X, W and Σ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from check_shapes.exceptions import CheckShapesError
from gpflow.models.training_mixins import InternalDataTrainingLossMixin
from gpflow.utilities import assert_params_false

from ..release._linalg import as_inputs
from ..release.lowrank import LowRankCovariance
from ..release.obfuscation import Covariance, _check_method, _inputs, obfuscate, synthetic_noise_covariance
from ..release.regions import Region, check_region, region_noise_covariance
from ..release.tolerance import Tolerance
from ._npz import read_npz
from .recyclable import kernel_from_spec, kernel_spec


def _fixed_gaussian(noise_variance: float) -> gpflow.likelihoods.Gaussian:
    """A Gaussian likelihood whose variance is exactly ``noise_variance`` ≥ 0 and not trainable (0 allowed)."""
    likelihood = gpflow.likelihoods.Gaussian()
    likelihood.variance = gpflow.Parameter(float(noise_variance), trainable=False, dtype=gpflow.default_float())
    return likelihood


def _noise_factor(Sigma: Covariance) -> np.ndarray:
    """L with ``Σ = L Lᵀ`` from the positive eigenpairs of Σ."""
    if isinstance(Sigma, LowRankCovariance):
        return Sigma.factor()
    lam, vecs = np.linalg.eigh(0.5 * (np.asarray(Sigma) + np.asarray(Sigma).T))
    keep = lam > 0
    return vecs[:, keep] * np.sqrt(lam[keep])[None, :]


def _covariance_from_factor(L: np.ndarray) -> LowRankCovariance:
    """``Σ = L Lᵀ`` as a :class:`LowRankCovariance` (from the SVD of L)."""
    U, s, _ = np.linalg.svd(L, full_matrices=False)
    keep = s > 0
    return LowRankCovariance(s[keep] ** 2, U[:, keep])


class PrivacyAwareGPR(gpflow.models.GPModel, InternalDataTrainingLossMixin):
    r"""GPR with observation covariance ``V + Σ``, ``V = σ²I`` and a fixed synthetic-noise covariance Σ (eq. 3–4).

    :param data: ``(X, W)``: ``[N, D]`` inputs and ``[N, 1]`` released (obfuscated) outputs.
    :param kernel: K.
    :param Sigma: ``[N, N]`` PSD synthetic-noise covariance (dense or :class:`LowRankCovariance`); stored as a
        factor ``L`` (``Σ = LLᵀ``, ``[N, r]``), a non-trainable parameter.
    :param mean_function: m (GPflow's zero mean if None).
    :param noise_variance: σ² ≥ 0 of the intrinsic noise V (0 for deterministic simulators); fixed.
    """

    @check_shapes("data[0]: [N, D]", "data[1]: [N, 1]")
    def __init__(
        self,
        data: "tuple[np.ndarray, np.ndarray]",
        kernel: gpflow.kernels.Kernel,
        Sigma: Covariance,
        mean_function: Optional[gpflow.mean_functions.MeanFunction] = None,
        noise_variance: float = 0.0,
    ) -> None:
        X = np.asarray(data[0], dtype=gpflow.default_float())
        W = np.asarray(data[1], dtype=gpflow.default_float())
        if not (np.all(np.isfinite(X)) and np.all(np.isfinite(W))):
            raise ValueError("PrivacyAwareGPR: X and W must be finite")
        if not (np.isfinite(noise_variance) and noise_variance >= 0):
            raise ValueError(f"noise_variance must be finite and ≥ 0, got {noise_variance}")
        L = _noise_factor(Sigma)
        if L.shape[0] != X.shape[0]:
            raise ValueError(f"Sigma is {L.shape[0]}×{L.shape[0]} but X has {X.shape[0]} rows")
        super().__init__(kernel, _fixed_gaussian(noise_variance), mean_function, num_latent_gps=1)
        self.data = (tf.constant(X), tf.constant(W))
        self.noise_factor = gpflow.Parameter(L, trainable=False, dtype=gpflow.default_float(), name="noise_factor")

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
        """
        assert_params_false(self.predict_f, full_output_cov=full_output_cov)
        X, W = self.data
        Xnew = tf.convert_to_tensor(Xnew, dtype=gpflow.default_float())
        L = self._observation_cholesky()
        Kxs = self.kernel(X, Xnew)
        A = tf.linalg.triangular_solve(L, Kxs, lower=True)
        b = tf.linalg.triangular_solve(L, W - self.mean_function(X), lower=True)
        mean = self.mean_function(Xnew) + tf.matmul(A, b, transpose_a=True)
        if full_cov:
            cov = self.kernel(Xnew) - tf.matmul(A, A, transpose_a=True)
            return mean, cov[None, :, :]
        var = self.kernel(Xnew, full_cov=False) - tf.reduce_sum(tf.square(A), axis=0)
        return mean, var[:, None]

    def save(self, path: Union[str, Path]) -> Path:
        """Write the released model to an ``.npz`` of numbers and JSON only (no pickled code, no raw Y).

        The file holds X, W, Σ's factor, σ², every kernel and mean-function parameter value under its GPflow
        path (``.kernel.variance``, ...), and a JSON description of the kernel and mean function where
        :func:`~gpflow_fed.models.recyclable.kernel_spec` can describe them (stationary kernels; ``Zero`` or
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
            file, truncated, bit-flipped, incomplete, pickled data), inconsistent arrays, or parameters that do
            not fit the given kernel / mean function.
        """
        arrays = read_npz(
            path,
            "PrivacyAwareGPR file (PrivacyAwareGPR.save)",
            SAVE_FORMAT,
            ("spec", "X", "W", "noise_factor", "noise_variance"),
        )
        try:
            spec = json.loads(str(arrays["spec"]))
            kernel_description, mean_name = spec["kernel"], str(spec["mean_function"])
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: corrupt model description ({type(exc).__name__}: {exc})") from exc
        if kernel is None:
            if kernel_description is None:
                raise ValueError(
                    f"{path} holds a kernel that only its values describe: pass kernel= a kernel of the same structure"
                )
            try:
                kernel = kernel_from_spec(kernel_description)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValueError(f"{path}: corrupt kernel description ({type(exc).__name__}: {exc})") from exc
        if mean_function is None:
            if mean_name == "Zero":
                mean_function = gpflow.mean_functions.Zero()
            elif mean_name == "Constant":
                if "param.mean_function.c" not in arrays:
                    raise ValueError(
                        f"{path}: incomplete file, missing arrays ['param.mean_function.c'] of its Constant mean"
                    )
                # the saved value fixes c's shape (a scalar Constant(0.0) or the default [1])
                mean_function = gpflow.mean_functions.Constant(arrays["param.mean_function.c"])
            else:
                raise ValueError(f"{path} holds a {mean_name} mean: pass mean_function= one of that class")
        saved = {key[len("param") :]: value for key, value in arrays.items() if key.startswith("param.")}
        try:
            model = PrivacyAwareGPR(
                (arrays["X"], arrays["W"]),
                kernel,
                _covariance_from_factor(arrays["noise_factor"]),
                mean_function,
                float(arrays["noise_variance"]),
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
    """The outcome of :func:`release`.

    :param model: the released :class:`PrivacyAwareGPR` (safe to publish: X, W, Σ, hyperparameters).
    :param Sigma: Σ.
    :param W: ``[N, 1]`` the obfuscated outputs.
    :param sensitive: ``[γ, D]`` the sensitive inputs.
    :param noise_variance: σ² used for V.
    :param log_marginal_likelihood: the raw-data GPR's optimum (owner-side diagnostics).
    """

    model: PrivacyAwareGPR
    Sigma: Covariance
    W: np.ndarray
    sensitive: np.ndarray
    noise_variance: float
    log_marginal_likelihood: float


def _check_tolerance_shape(tolerance: Tolerance, gamma: int) -> None:
    """Checks that do not depend on the fitted hyperparameters, run before fitting (sign, shape, finiteness)."""
    if isinstance(tolerance, gpflow.kernels.Kernel):
        return
    array = np.asarray(tolerance, dtype=gpflow.default_float())
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
    r"""Step 1 of §3.2: GPflow GPR maximum likelihood with a constant mean (updates ``kernel`` in place).

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
    # Eager evaluation: tracing the loss into a graph costs more than the whole L-BFGS run at the sizes this
    # closed-form release handles (each evaluation is dominated by one O(N³) Cholesky either way).
    gpflow.optimizers.Scipy().minimize(
        gpr.training_loss, gpr.trainable_variables, options=dict(maxiter=int(maxiter)), compile=False
    )
    return gpr, float(gpr.likelihood.variance.numpy())


def release(
    data: "tuple[np.ndarray, np.ndarray]",
    sensitive: Union[np.ndarray, Region],
    tolerance: Tolerance,
    *,
    kernel: Optional[gpflow.kernels.Kernel] = None,
    density: Optional[float] = None,
    method: str = "strong",
    noise_variance: Optional[float] = None,
    fit: bool = True,
    low_rank: Optional[bool] = None,
    solver: Optional[str] = None,
    maxiter: int = 1000,
    insecure_noise_seed: Optional[int] = None,
) -> PrivacyRelease:
    r"""The owner's release workflow (§3.2): fit, compute Σ (eq. 8/10/11), obfuscate (§4.1), build the model.

    :param data: raw ``(X [N, D], Y [N, 1])`` — never stored in the result's model.
    :param sensitive: ``[γ, D]`` sensitive inputs, or a :class:`~gpflow_fed.release.Region` (interval, box,
        union) discretised at ``density`` and handled by
        :func:`~gpflow_fed.release.region_noise_covariance` (needs a kernel tolerance H; ``method="strong"``:
        eq. 12–13, ``method="weak"``: eq. 10 at the grid points, certified Krylov reduction).
    :param tolerance: as for :func:`~gpflow_fed.release.synthetic_noise_covariance`; a kernel H may wrap
        ``kernel`` (e.g. ``ProportionalKernel(kernel, 0.5)``) and then follows the fitted hyperparameters.
    :param kernel: K (``SquaredExponential()`` if None); its hyperparameters are fitted in place.
    :param density: grid points per unit length when ``sensitive`` is a region.
    :param method: ``"strong" | "weak" | "diagonal"``.
    :param noise_variance: σ² of V: None to estimate it, a number to fix it (0 for deterministic data).
    :param fit: False to keep the kernel's (and σ²'s) values as given (mean = ``mean(Y)``).
    :param low_rank: see :func:`~gpflow_fed.release.synthetic_noise_covariance`.
    :param solver: for the SDP methods (see :func:`~gpflow_fed.release.synthetic_noise_covariance`): the weak
        method uses the certified Krylov reduction unless ``solver="dense"``.
    :param maxiter: L-BFGS iterations of the maximum-likelihood fit (ignored with ``fit=False``).
    :param insecure_noise_seed: leave None: the synthetic noise (§4.1) comes from the OS, so the release cannot
        be de-noised by regenerating it; an int makes W reproducible for tests only (see
        :func:`~gpflow_fed.release.obfuscate`).
    :raises ValueError: bad data or any of the tolerance errors, before any fitting.
    """
    _check_method(method)
    region = sensitive if isinstance(sensitive, Region) else None
    if region is not None:
        if method == "diagonal":
            raise ValueError(
                "a sensitive region needs method='strong' or 'weak' (got 'diagonal'); discretise it "
                "yourself with region.discretise(density) for the diagonal SDP"
            )
        if density is None or not (np.isfinite(density) and density > 0):
            raise ValueError(f"a sensitive region needs density > 0 (grid points per unit length), got {density}")
        X = as_inputs(data[0], "X")
        check_region(region, X, tolerance)
        S = region.discretise(density)
    else:
        X, S = _inputs(data[0], sensitive)
    if np.iscomplexobj(data[1]):
        raise TypeError("Y is complex; pass real outputs (casting would drop the imaginary part)")
    Y = np.asarray(data[1], dtype=gpflow.default_float())
    if Y.ndim == 1:
        Y = Y[:, None]
    if Y.shape != (X.shape[0], 1) or not np.all(np.isfinite(Y)):
        raise ValueError(f"Y must be a finite [N, 1] array matching X's {X.shape[0]} rows, got shape {Y.shape}")
    if noise_variance is not None and not (np.isfinite(noise_variance) and noise_variance >= 0):
        raise ValueError(f"noise_variance must be None (estimate) or a number ≥ 0, got {noise_variance}")
    kernel = gpflow.kernels.SquaredExponential() if kernel is None else kernel
    _check_tolerance_shape(tolerance, S.shape[0])
    if fit:
        gpr, sigma2 = fit_hyperparameters((X, Y), kernel, noise_variance=noise_variance, maxiter=maxiter)
        mean_value = gpr.mean_function.c.numpy()
        lml = float(gpr.log_marginal_likelihood().numpy())
    else:
        sigma2 = 0.0 if noise_variance is None else float(noise_variance)
        mean_value = np.mean(Y, axis=0)
        lml = float("nan")
    if region is not None:
        Sigma = region_noise_covariance(
            kernel,
            X,
            region,
            tolerance,
            density=float(density),
            noise_variance=sigma2,
            low_rank=bool(low_rank),
            method=method,
        )
    else:
        Sigma = synthetic_noise_covariance(
            kernel, X, S, tolerance, noise_variance=sigma2, method=method, low_rank=low_rank, solver=solver
        )
    W = obfuscate(Y, Sigma, insecure_noise_seed=insecure_noise_seed)
    released_kernel = gpflow.utilities.deepcopy(kernel)
    model = PrivacyAwareGPR(
        (X, W), released_kernel, Sigma, gpflow.mean_functions.Constant(mean_value), noise_variance=sigma2
    )
    return PrivacyRelease(
        model=model, Sigma=Sigma, W=W, sensitive=S, noise_variance=sigma2, log_marginal_likelihood=lml
    )

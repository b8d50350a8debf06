"""Numerical helpers shared by the privacy-aware release modules (kernel matrices, PSD parts, checks)."""

from __future__ import annotations

from typing import Optional, Tuple, Union

import gpflow
import numpy as np

ArrayLike = Union[np.ndarray, float, list]

#: Row block used when a kernel matrix is evaluated in pieces, to bound TensorFlow's temporaries.
KERNEL_BLOCK_ROWS = 1024


def as_inputs(value: object, what: str) -> np.ndarray:
    """Return ``value`` as a finite ``[N, D]`` array of ``gpflow.default_float()`` (a 1-D array is ``[N, 1]``).

    :raises TypeError: if it is not numeric, or complex.
    :raises ValueError: if it is empty, of rank > 2 or holds NaN/inf.
    """
    array = np.asarray(value)
    if not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
        raise TypeError(f"{what} must be numeric, got dtype {array.dtype}")
    if np.iscomplexobj(array):
        raise TypeError(f"{what} is complex ({array.dtype}); pass real values (casting would drop the imaginary part)")
    if array.ndim == 0:
        array = array.reshape(1, 1)
    elif array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ValueError(f"{what} must have shape [N, D], got shape {array.shape}")
    if array.shape[0] == 0:
        raise ValueError(f"{what} is empty; pass at least one point")
    if array.shape[1] == 0:
        raise ValueError(f"{what} has no columns (shape {array.shape}); pass at least one input column")
    array = array.astype(gpflow.default_float())
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{what} contains NaN or inf values")
    return array


#: Two inputs are the same point when every coordinate agrees to this fraction of its column's spread ...
SAME_INPUT_RTOL = 1e-9
#: ... plus this many units in the last place of the column's largest magnitude (a value converted twice).
SAME_INPUT_ULPS = 64


def column_tolerance(X: np.ndarray) -> np.ndarray:
    r"""``[D]`` how far apart two inputs may lie in each column and still be the same point (float rounding).

    Column j's tolerance is ``SAME_INPUT_RTOL·(max X_j − min X_j) + SAME_INPUT_ULPS·ulp(max |X_j|)``: its own
    scale, never another column's. Issue 44: one tolerance ``1e-9·max|X|`` over all columns let a column of
    magnitude 1e7 beside one in [0, 1] match a region's grid points 0.01 apart to a record (their f neither
    designed for nor checked). The spread, not the magnitude, sets the scale because stationary kernels see
    differences: a column offset far from zero (timestamps near 1.7e9 s) would otherwise match points 1.7 s apart.
    The ulp term covers a value read or converted twice (0.1 + 0.2 against 0.3, a unit change) in a column that is
    constant or offset; a value read twice from the same text is the same float and matches exactly.
    """
    Xa: np.ndarray = np.asarray(X, dtype=gpflow.default_float())
    if Xa.shape[0] == 0:
        return np.zeros(Xa.shape[1:], dtype=Xa.dtype)
    spread = np.max(Xa, axis=0) - np.min(Xa, axis=0)
    return np.asarray(SAME_INPUT_RTOL * spread + SAME_INPUT_ULPS * np.spacing(np.max(np.abs(Xa), axis=0)))


def same_inputs(A: np.ndarray, s: np.ndarray) -> np.ndarray:
    r"""``[N]`` whether each row of ``A`` is the point ``s`` up to float rounding: in every column
    ``|a_j − s_j| ≤ SAME_INPUT_ULPS·(ulp(max(|a_j|, |s_j|)) + ulp(1))``, the rounding of the two values alone (a value
    read or converted twice), never a scale taken from other rows or columns. A point this misses by more than
    rounding protects ``f(s)`` alone, which does not bound the record beside it: a miss that leaves the two one input
    to the model (the kernel's correlation ≥ 1 − 5e-7) is refused
    (:func:`~gpflow_fed.release.obfuscation.check_near_records`).
    Issue 44: a tolerance of 1e-9 of a column's spread let one far row
    (x = 1e8) widen it to 0.1, so records 0.09 from a sensitive point with none were matched to it and f there was
    neither designed for nor checked (0.35 ξ); before that, 1e-9·max|X| over all columns did the same across columns.
    """
    A = np.asarray(A, dtype=np.float64)
    return same_input_rows(A, np.broadcast_to(np.asarray(s, dtype=np.float64)[None, :], A.shape))


def same_input_rows(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``[P]`` whether row p of ``A`` is row p of ``B`` up to float rounding (the test of :func:`same_inputs`, pair by
    pair: ``A`` and ``B`` are ``[P, D]``)."""
    A, B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
    tolerance = SAME_INPUT_ULPS * (np.spacing(np.maximum(np.abs(A), np.abs(B))) + np.spacing(1.0))
    return np.asarray(np.all(np.abs(A - B) <= tolerance, axis=1))


def input_window(values: np.ndarray) -> np.ndarray:
    """A half-width around each of ``values`` that holds every value :func:`same_inputs` may match to it (a search
    window on one sorted column; the test itself decides)."""
    values = np.asarray(values, dtype=np.float64)
    return np.asarray(4 * SAME_INPUT_ULPS * (np.spacing(np.abs(values)) + np.spacing(1.0)))


def check_no_white(kernel: gpflow.kernels.Kernel, argument: str = "noise_variance") -> None:
    """Refuse a kernel with a ``gpflow.kernels.White`` part anywhere in its tree (sums, products, change-points).

    GPflow's White is ``σ²_w`` on the diagonal of ``k(X)`` but 0 whenever a second input is given (``k(A, B)``), so a
    release would see it in some places and not in others: the near-record rule compared ``k(s, x)`` without it to
    ``k(s, s)``, ``k(x, x)`` with it and judged every record far (``d² = 2w/(1 + w)``), and the design's ``K_XX``
    left it out while the published model kept it (issue 44: a record a hair off a sensitive input was published at
    ``5e-12 ξ``). A White part is observation noise: give it as the likelihood variance σ².

    :param argument: the name of the σ² argument of the caller, for the message.
    :raises ValueError: naming the argument.
    """
    parts = [kernel, *getattr(kernel, "submodules", ())]
    if any(isinstance(part, gpflow.kernels.White) for part in parts):
        raise ValueError(
            "the kernel has a White part: a White (nugget) kernel is observation noise, which a privacy-aware "
            f"release cannot use as part of the kernel (GPflow's White is 0 between two inputs); remove it and add "
            f"its variance to the likelihood variance σ² ({argument}=)"
        )


def kernel_matrix(kernel: gpflow.kernels.Kernel, A: np.ndarray, B: Optional[np.ndarray] = None) -> np.ndarray:
    """The Gram matrix ``k(A, B)`` as numpy, evaluated in row blocks so that large N fits in memory.

    For ``B = None`` only the blocks on and above the diagonal are evaluated and mirrored, so the result is
    exactly symmetric at half the kernel evaluations. The kernel is called (``kernel(A, B)``), not its ``K``: a kernel
    with ``active_dims`` sees its own columns only, as in the model (``kernel.K`` skips the slicing of the top-level
    kernel: with ``active_dims=[0]`` it read every column).
    """
    dtype = gpflow.default_float()
    if B is not None:
        out: np.ndarray = np.empty((A.shape[0], B.shape[0]), dtype=dtype)
        for start in range(0, A.shape[0], KERNEL_BLOCK_ROWS):
            stop = min(start + KERNEL_BLOCK_ROWS, A.shape[0])
            out[start:stop] = kernel(A[start:stop], B).numpy()
        return out
    N = A.shape[0]
    out = np.empty((N, N), dtype=dtype)
    for start in range(0, N, KERNEL_BLOCK_ROWS):
        stop = min(start + KERNEL_BLOCK_ROWS, N)
        block = kernel(A[start:stop], A[start:]).numpy()
        diagonal = block[:, : stop - start]
        block[:, : stop - start] = 0.5 * (diagonal + diagonal.T)
        out[start:stop, start:] = block
        out[stop:, start:stop] = block[:, stop - start :].T
    return out


def kernel_diag(kernel: gpflow.kernels.Kernel, A: np.ndarray) -> np.ndarray:
    """``k(a, a)`` for each row of ``A`` (the kernel called with ``full_cov=False``, so ``active_dims`` applies)."""
    return np.asarray(kernel(A, full_cov=False).numpy(), dtype=gpflow.default_float())


def noise_vector(noise_variance: ArrayLike, num_data: int) -> np.ndarray:
    """The diagonal of V as a length-N vector; a scalar is broadcast.

    :raises ValueError: wrong length, negative or non-finite entries.
    """
    v: np.ndarray = np.asarray(noise_variance, dtype=gpflow.default_float())
    if v.ndim == 0:
        v = np.full(num_data, float(v))
    v = v.reshape(-1)
    if v.shape[0] != num_data:
        raise ValueError(
            f"noise_variance has {v.shape[0]} entries but X has {num_data} rows; pass a scalar or one per row"
        )
    if not np.all(np.isfinite(v)) or np.any(v < 0):
        raise ValueError("noise_variance must be finite and non-negative (V is a covariance diagonal)")
    return v


def sym_eigh(A: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Eigen-decomposition of the symmetric part of ``A`` (ascending eigenvalues)."""
    return np.linalg.eigh(0.5 * (A + A.T))


def numerically_positive(lam: np.ndarray, size: Optional[int] = None) -> np.ndarray:
    """Which eigenvalues of an ``[N, N]`` symmetric matrix are positive beyond round-off: ``λ > N·ε·max|λ|``
    (``N`` is ``size``, by default the number of eigenvalues given).

    This is numpy's ``matrix_rank`` tolerance; eigenvalues below it are rounding of zero, and keeping them would
    report (and draw noise along) directions the covariance does not have.
    """
    lam = np.asarray(lam)
    scale = float(np.max(np.abs(lam))) if lam.size else 0.0
    n = lam.shape[0] if size is None else size
    return np.asarray(lam > max(n, 1) * np.finfo(float).eps * scale)


def psd_factor(A: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Eigenpairs ``(λ⁺, O)`` of the PSD part ``A⁺ = O diag(λ⁺) Oᵀ`` (eq. 8), keeping the numerically positive λ
    (:func:`numerically_positive`)."""
    lam, vecs = sym_eigh(A)
    keep = numerically_positive(lam)
    return lam[keep], vecs[:, keep]


def psd_check(A: np.ndarray, what: str, fix: str, *, strict: bool, rtol: float = 1e-10) -> float:
    """Check that the symmetric ``A`` is PSD (or PD when ``strict``) relative to its scale; return λ_min.

    :raises ValueError: naming ``what`` and ``fix`` when the check fails.
    """
    if not np.allclose(A, A.T, rtol=1e-10, atol=1e-12 * max(1.0, float(np.max(np.abs(A))))):
        raise ValueError(f"{what} is not symmetric; {fix}")
    lam = np.linalg.eigvalsh(0.5 * (A + A.T))
    scale = max(float(np.max(np.abs(lam))), float(np.finfo(float).tiny))
    threshold = rtol * scale
    if (strict and lam[0] <= threshold) or (not strict and lam[0] < -threshold):
        kind = "positive definite" if strict else "positive semi-definite"
        raise ValueError(f"{what} is not {kind} (smallest eigenvalue {lam[0]:.3e}); {fix}")
    return float(lam[0])


#: Round-off of float64 (``ε = 2.2e-16``).
FLOAT64_EPS = float(np.finfo(np.float64).eps)

#: The largest ``‖x/ℓ‖`` a stationary kernel's inputs may have: ``1/√ε ≈ 6.7e7`` (:func:`check_kernel_numerics`).
MAX_SCALED_INPUT = 1.0 / np.sqrt(FLOAT64_EPS)

#: The largest bound on the condition number of ``C = K + Σ + σ²I`` a model may have: ``1/ε ≈ 4.5e15``.
MAX_CONDITION = 1.0 / FLOAT64_EPS

#: A predictive variance below ``−PREDICTIVE_RTOL · k(x, x)`` is more than round-off (:func:`check_predictions`).
PREDICTIVE_RTOL = 1e-6


def stationary_parts(kernel: gpflow.kernels.Kernel) -> "list[gpflow.kernels.Stationary]":
    """The kernel itself and every kernel inside it (sums, products) that has lengthscales and sees the inputs.

    A periodic kernel's base sees ``sin(π(x − x')/p)``, not ``x``: it is left out.
    """
    parts = [kernel, *getattr(kernel, "submodules", ())]
    bases = {id(part.base_kernel) for part in parts if isinstance(part, gpflow.kernels.Periodic)}
    return [part for part in parts if isinstance(part, gpflow.kernels.Stationary) and id(part) not in bases]


def check_kernel_numerics(
    kernel: gpflow.kernels.Kernel, X: np.ndarray, noise_factor: np.ndarray, noise_variance: float
) -> None:
    r"""Refuse a GP model whose float64 kernel computations at its inputs ``X`` are not finite or carry no digit.

    The rule (applied to a model read from a file, :meth:`~gpflow_fed.models.PrivacyAwareGPR.load`):

    * **Scaled inputs** ``‖x/ℓ‖ ≤ 1/√ε ≈ 6.7e7`` for every row and every stationary part of the kernel. A
      stationary kernel is a function of ``r² = ‖x/ℓ‖² + ‖x'/ℓ‖² − 2 (x/ℓ)·(x'/ℓ)`` as GPflow computes it, whose
      round-off is about ``ε ‖x/ℓ‖²``; beyond ``1/√ε`` that round-off exceeds 1, the scale on which the kernel
      varies, so ``K`` is round-off (and past ``1e154`` the squares overflow: ``X = 1e300`` or ``ℓ = 1e-300``
      predicted NaN).
    * **Prior variances** ``k(x, x)`` finite and ≥ 0 at every row.
    * **Conditioning** ``(tr K + tr Σ + Nσ²) / σ² ≤ 1/ε ≈ 4.5e15`` when ``σ² > 0``: the left side bounds the
      condition number of ``C = K + Σ + σ²I`` (its largest eigenvalue is at most its trace, its smallest at least
      σ²); beyond ``1/ε`` the Cholesky factor of C has no correct digit, and a predictive variance
      ``k(x, x) − ‖L⁻¹k_x‖²`` is the difference of two numbers whose round-off exceeds it (a kernel variance of
      1e300 beside σ² = 0.01 predicted −2.7e285). With ``σ² = 0`` (a deterministic simulator) C's conditioning is
      K's own, which no bound on the parameters gives: :func:`check_predictions` at the model's own inputs decides.

    :raises ValueError: naming the rule that fails.
    """
    X = np.asarray(X, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for part in stationary_parts(kernel):
            scaled = np.asarray(part.scale(part.slice(X, None)[0]).numpy(), dtype=np.float64)
            norms = np.sqrt(np.sum(np.square(scaled / MAX_SCALED_INPUT), axis=-1)) * MAX_SCALED_INPUT
            largest = float(np.max(norms)) if norms.size else 0.0
            if not largest <= MAX_SCALED_INPUT:
                size = f"{largest:.3g}" if np.isfinite(largest) else "more than float64's range of"
                raise ValueError(
                    f"inputs of {size} lengthscales from the origin (‖x/ℓ‖ for {type(part).__name__}); float64 "
                    f"computes a stationary kernel only within {MAX_SCALED_INPUT:.3g} (1/√ε: beyond it the round-off "
                    "of the squared distance exceeds 1)"
                )
        diag = kernel_diag(kernel, X)
        if not (np.all(np.isfinite(diag)) and np.all(diag >= 0)):
            raise ValueError("the kernel's prior variances k(x, x) at the inputs are not all finite and ≥ 0")
        if noise_variance > 0:
            trace = float(np.sum(diag)) + float(np.sum(np.square(noise_factor))) + X.shape[0] * noise_variance
            condition = trace / noise_variance
            if not condition <= MAX_CONDITION:
                raise ValueError(
                    f"an ill-conditioned model: (tr K + tr Σ + Nσ²)/σ² = {condition:.3g} beyond 1/ε = "
                    f"{MAX_CONDITION:.3g} (σ² = {noise_variance:.3g}): float64 predictions would carry no correct digit"
                )


def check_predictions(mean: np.ndarray, var: np.ndarray, prior: np.ndarray, where: str) -> None:
    r"""Refuse predictions with a non-finite mean or variance, or a variance below ``−PREDICTIVE_RTOL · k(x, x)``.

    ``prior`` is ``k(x, x)`` at the same points: a predictive variance ``k(x, x) − ‖L⁻¹k_x‖²`` is ≥ 0 in exact
    arithmetic; a negative value beyond round-off of the prior's scale means the computation carried no digit.

    :raises ValueError: naming the problem and ``where`` (e.g. "at its own inputs", "at the inputs given").
    """
    mean = np.asarray(mean, dtype=np.float64)
    var = np.asarray(var, dtype=np.float64).reshape(-1)
    prior = np.asarray(prior, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(mean)):
        raise ValueError(f"the model predicts a non-finite mean {where} ({int(np.sum(~np.isfinite(mean)))} points)")
    if not np.all(np.isfinite(var)):
        raise ValueError(f"the model predicts a non-finite variance {where} ({int(np.sum(~np.isfinite(var)))} points)")
    with np.errstate(over="ignore", invalid="ignore"):
        floor = -PREDICTIVE_RTOL * np.broadcast_to(np.abs(prior), var.shape) if prior.size else np.zeros_like(var)
        negative = var < floor
    if np.any(negative):
        raise ValueError(
            f"the model predicts a negative variance {where} (smallest {float(np.min(var)):.3g} at "
            f"{int(np.sum(negative))} points): its float64 computation carried no correct digit"
        )

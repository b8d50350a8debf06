r"""Synthetic noise for privacy-aware GP release (Tuo & Bhattacharya, §3–4).

**Which quantity is protected** (``protect=``). The paper's floor is on the latent ``f(s)``. A sensitive input
that is a training input carries a *record* ``Y_j = f(x_j) + ε_j``, and ε_j is correlated with ``W_j``: a floor on
f leaves the record itself predictable (the intrinsic noise V counts toward the floor on f, but not on Y_j). So by
default (``protect="records"``) every record at a sensitive input is protected, with cross-covariance
``Cov[Y_T, Y_X] = K_TX + V_TX`` and prior ``Cov[Y_T] = K_TT + V_TT``, i.e. ``Var[Y_j | W] ≥ ξ``; a sensitive input
with no record keeps the floor on ``f(s)`` (a future record there has ``Var[Y_s | W] = Var[f(s) | W] + σ²``).
Every formula below holds with ``K_XS → C_XT = K_XT + V_XT`` and ``K_SS → P_T = K_TT + V_TT`` (the Schur
argument of eq. 11 is about these two blocks only); it is feasible iff ``ξ < P_tt`` (``K(s, s) + σ²`` at a
record), for every method (strong, weak, diagonal, kernel tolerances). ``protect="latent"`` is the paper's
floor on f (Examples 1–3 use it by name).

The owner releases ``W = Y + Z`` with ``Z ~ N(0, Σ)``; the released model predicts with eq. (3)–(4), and for
every sensitive input ``sᵢ`` the predictive variance ``K(sᵢ,sᵢ) − K_{sᵢX}(K_XX + V + Σ)⁻¹K_{Xsᵢ}`` stays ≥ the
tolerance ξᵢ (eq. 5). Among all such Σ the returned one has minimum trace:

* ``method="strong"``: ``Σ = (K_XS (K_SS − Ξ)⁻¹ K_SX − K_XX − V)⁺`` (eq. 8, 11; Theorem 1), which also
  guarantees ``Var[βᵀf(S) | W] ≥ βᵀΞβ`` for every β. Needs ``K_SS − Ξ ≻ 0``.
* ``method="weak"``: the SDP (10) (one constraint per sensitive input); ``tr Σ_weak ≤ tr Σ_strong``
  (Theorem 2). By default solved by the exact block-Krylov reduction of :mod:`~gpflow_fed.release.weak`,
  which returns a :class:`~gpflow_fed.release.weak.CertifiedCovariance` (low rank, with a certified optimality
  gap and a full-dimensional feasibility margin); ``solver="dense"`` solves the N×N SDP with cvxpy.
* ``method="diagonal"``: the SDP (10) restricted to diagonal Σ (independent noise; Example 1's comparison).
  Always the dense cvxpy SDP: a diagonal Σ is generally of full rank, so no low-dimensional subspace holds it
  and the Krylov reduction (which needs ``range Σ`` inside a small space containing ``K_XS``) does not apply.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterator, Optional, Union

import gpflow
import numpy as np
from check_shapes import check_shapes
from scipy.linalg import cholesky, solve_triangular
from scipy.special import expit

from .. import randomness
from .linalg import (
    as_inputs,
    check_no_white,
    input_window,
    kernel_diag,
    kernel_matrix,
    noise_vector,
    psd_check,
    psd_factor,
    same_input_rows,
    same_inputs,
)
from .lowrank import CERTIFY_TOL, LowRankCovariance, krylov_positive_part
from .sdp import solve_privacy_sdp
from .weak import solve_weak_krylov
from .tolerance import ProportionalKernel, ResolvedTolerance, Tolerance, resolve_tolerance

Covariance = Union[np.ndarray, LowRankCovariance]
METHODS = ("strong", "weak", "diagonal")
#: ``protect=`` values: the records at the sensitive inputs (default) or the paper's latent f (eq. 5).
PROTECT = ("records", "latent")
#: ``solver=`` values for the SDP methods: the certified Krylov reduction (weak only) or the dense cvxpy SDP.
SOLVERS = ("krylov", "dense", "CLARABEL", "SCS")
#: Automatic low-rank rule: use block Krylov when N ≥ this, γ ≤ N / 5 and min V > 0 (so the O(N k²)
#: certificate applies; with V = 0 the kernel matrix is often numerically singular and eigh is used).
LOW_RANK_MIN_N = 200


def check_method(method: str) -> str:
    """``method`` if it is one of :data:`METHODS`; a ``ValueError`` otherwise."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; use one of {', '.join(METHODS)}")
    return method


def release_inputs(X: object, sensitive: object) -> "tuple[np.ndarray, np.ndarray]":
    """The inputs ``X`` and the sensitive inputs, as ``[N, D]`` and ``[γ, D]`` arrays of the same width."""
    Xa = as_inputs(X, "X")
    S = as_inputs(sensitive, "sensitive inputs")
    if S.shape[1] != Xa.shape[1]:
        raise ValueError(
            f"sensitive inputs have {S.shape[1]} columns but X has {Xa.shape[1]}; pass sensitive points "
            "in the same input space as X ([γ, D])"
        )
    return Xa, S


def check_protect(protect: str) -> str:
    """``protect`` if it is one of :data:`PROTECT`; a ``ValueError`` otherwise."""
    if protect not in PROTECT:
        raise ValueError(
            f"unknown protect={protect!r}; use 'records' (the recorded values Y at sensitive training inputs, the "
            "default) or 'latent' (the paper's floor on f)"
        )
    return protect


@dataclass(frozen=True)
class Targets:
    r"""The protected quantities T: one per record at a sensitive input (``protect="records"``), or ``f(s)``.

    :param points: ``[t, D]`` the input of each target.
    :param records: ``[t]`` the row of X whose record ``Y_j`` is protected, or −1 for the latent ``f(s)``.
    :param source: ``[t]`` the index of the sensitive input each target comes from.
    """

    points: np.ndarray
    records: np.ndarray
    source: np.ndarray

    @property
    def num_records(self) -> int:
        """How many targets are records (rows of X)."""
        return int(np.count_nonzero(self.records >= 0))


@check_shapes("X: [N, D]", "S: [G, D]")
def protected_targets(X: np.ndarray, S: np.ndarray, protect: str = "records") -> Targets:
    """The targets T for sensitive inputs S.

    With ``"records"`` each training row equal to a sensitive input up to float rounding in every column
    (:func:`~gpflow_fed.release.linalg.same_inputs`: the values' own ulps, no scale from other rows) is a record to
    protect (every one of them, if the input is repeated), placed at its own row's input; other sensitive inputs (and
    all of them with ``"latent"``) protect ``f(s)``. Rows are looked up through X's first column sorted, so a region's
    dense grid costs ``O((γ + N) log N)`` plus the few candidate rows.
    """
    check_protect(protect)
    points, records, source = [], [], []
    order = np.argsort(X[:, 0], kind="stable")
    first = X[order, 0]
    window = input_window(S[:, 0])  # a wider window: the test below decides
    lo = np.searchsorted(first, S[:, 0] - window, side="left")
    hi = np.searchsorted(first, S[:, 0] + window, side="right")
    for i, s in enumerate(S):
        if protect == "records":  # equal up to float rounding (a value read twice from text, say), per column
            candidates = np.sort(order[lo[i] : hi[i]])
            rows = candidates[same_inputs(X[candidates], s)]
        else:
            rows = np.zeros(0, dtype=int)
        for j in rows if rows.size else [-1]:
            points.append(X[j] if j >= 0 else s)
            records.append(int(j))
            source.append(i)
    return Targets(np.asarray(points, dtype=S.dtype), np.asarray(records, dtype=int), np.asarray(source, dtype=int))


#: a record is one input to the model with a sensitive point ``s`` (:func:`records_near`) when it is not ``s`` up to
#: rounding but the kernel's normalised distance ``d² = (k(s,s) + k(x,x) − 2k(s,x)) / √(k(s,s) k(x,x))`` is at most
#: ``2·NEAR_RECORD_DECORRELATION``: for a stationary kernel (``k(s,s) = k(x,x)``) exactly a correlation
#: ``k(s,x)/√(k(s,s)k(x,x)) ≥ 1 − 5e-7``, which for one squared exponential is ``1e-3`` lengthscales
#: (``1 − exp(−½·1e-6) ≈ 5e-7``); for any other kernel (sums, products, ``active_dims``, periodic, linear) the same
#: statement about f: ``Var[f(s) − f(x)] ≤ 1e-6 √(Var f(s) Var f(x))``, the two values one random variable to 1e-3
#: of their prior standard deviation.
NEAR_RECORD_DECORRELATION = 5e-7

#: :func:`records_near` evaluates the kernel between blocks of S and X of at most this many ``rows × cols × D``
#: elements (8 bytes each: 32 MB a block, and TensorFlow's temporaries a few times that).
NEAR_RECORD_BLOCK = 1 << 22

#: :func:`check_white_like` evaluates a leaf's ``k(a, a')`` at the inputs in row blocks of this many rows.
PAIRED_BLOCK = 256

#: :func:`check_white_like`: ``k(a, a)`` and ``k(a, a')`` at a copy may differ by this fraction of the larger, a tenth
#: of :data:`NEAR_RECORD_DECORRELATION` (a difference below it moves the near rule's ``½k(s,s) + ½k(x,x) − k(s,x)``
#: by less than a tenth of its threshold). Round-off stays far below it: GPflow's ``ArcCosine(order=0)`` differs by
#: 1.6e-8 (its ``acos`` jitter), Linear and Polynomial by 0.
WHITE_LIKE_RTOL = 0.1 * NEAR_RECORD_DECORRELATION


def shift_invariant(kernel: gpflow.kernels.Kernel) -> bool:
    """Whether ``k(s, x) = k(0, x − s)`` for every s and x: a stationary, periodic or constant kernel, or sums and
    products of them (a part's ``active_dims`` select columns of the difference as of the inputs). ``White`` is not
    (it is 0 between two inputs, even at the same point: :func:`~gpflow_fed.release.linalg.check_no_white`)."""
    if isinstance(kernel, (gpflow.kernels.Sum, gpflow.kernels.Product)):
        return all(shift_invariant(part) for part in kernel.kernels)
    return isinstance(kernel, (gpflow.kernels.Stationary, gpflow.kernels.Periodic, gpflow.kernels.Constant))


def _sliced(kernel: gpflow.kernels.Kernel, *arrays: np.ndarray) -> "list[np.ndarray]":
    """``arrays`` with the columns ``kernel``'s ``active_dims`` select, as GPflow's ``kernel(A, B)`` slices them (a
    difference's columns are the difference of the inputs' columns)."""
    return [np.asarray(kernel.slice(a, None)[0], dtype=a.dtype) for a in arrays]


def _paired_leaf(kernel: gpflow.kernels.Kernel, S: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``[P]`` ``k(s_p, x_p)`` for a leaf evaluated at the inputs: the diagonals of ``kernel(S_b, X_b)`` over row blocks
    of :data:`PAIRED_BLOCK` (memory ``O(block²)``)."""
    out: np.ndarray = np.empty(S.shape[0], dtype=gpflow.default_float())
    for start in range(0, S.shape[0], PAIRED_BLOCK):
        stop = min(start + PAIRED_BLOCK, S.shape[0])
        out[start:stop] = np.diagonal(kernel(S[start:stop], X[start:stop]).numpy())
    return out


def _sigmoids(kernel: gpflow.kernels.ChangePoints, A: np.ndarray) -> np.ndarray:
    """``[n, C]`` GPflow's change-point sigmoids ``σ_c(a) = 1/(1 + exp(−s_c(a − x_c)))`` at the absolute (1-D) inputs
    ``A`` (locations sorted, as ``ChangePoints._sigmoids`` sorts them)."""
    if A.shape[1] != 1:
        raise ValueError(f"a ChangePoints kernel needs 1-D inputs (its active_dims), got {A.shape[1]} columns")
    locations = np.sort(np.reshape(np.asarray(kernel.locations.numpy(), dtype=np.float64), (-1,)))
    steepness = np.reshape(np.asarray(kernel.steepness.numpy(), dtype=np.float64), (-1,))
    return np.asarray(expit(steepness * (A[:, :1] - locations)))


def _pair_values(
    kernel: gpflow.kernels.Kernel, S: np.ndarray, X: np.ndarray, steps: np.ndarray, *, paired: bool = False
) -> np.ndarray:
    """``k(s_i, x_j)`` ``[G, N]`` for the rows of ``S`` ``[G, D]`` and ``X`` ``[N, D]``, evaluated part by part: a
    ``Sum`` is the sum of its parts' values, a ``Product`` their product, a :func:`shift_invariant` leaf is evaluated at
    the exact difference ``k(0, x − s)`` (``steps`` ``[G·N, D]``, row ``i·N + j`` is ``x_j − s_i``) and any other plain
    leaf (``Linear``, ``Polynomial``, ``ArcCosine``, …) at the inputs. Each part is called as GPflow calls it
    (``part(A, B)``), so its ``active_dims`` select columns of the difference as of the inputs. With ``paired``, ``S``,
    ``X`` and ``steps`` are ``[P, D]`` (``steps = X − S``) and the result is ``[P]``, ``k(s_p, x_p)``.

    Part by part, a shift-invariant part keeps its exact difference beside a part that is not (issue 44: Matérn-1/2 +
    ``Constant`` or + ``Linear`` went through GPflow's ``r²`` and its round-off, and 16 of 100 points 1e-13–1e-11 off
    a record were judged far). The same holds inside the kernels that hold kernels (issue 44, a twentieth attacker: a
    ``ChangePoints`` of Matérn-1/2 parts, or ``ProportionalKernel`` used as K, evaluated at inputs near 1000 judged a
    point 1e-9 off a record far, and the record went out at 0.135 ξ): a ``ProportionalKernel`` is α times its base
    kernel's values, a ``ChangePoints`` is GPflow's ``Σ_i σ_i(s) σ_i(x) K_i(s, x)`` (the sigmoid factors at the
    absolute inputs, each ``K_i`` part by part). Any other kernel holding kernels cannot be evaluated part by part
    here and is refused.

    :raises ValueError: for a kernel that holds kernels and is none of ``Sum``, ``Product``, ``ChangePoints``,
        ``ProportionalKernel`` or a shift-invariant kernel.
    """
    if isinstance(kernel, (gpflow.kernels.Sum, gpflow.kernels.Product)):  # GPflow's Sum/Product do not slice
        total = _pair_values(kernel.kernels[0], S, X, steps, paired=paired)
        for part in kernel.kernels[1:]:
            if isinstance(kernel, gpflow.kernels.Sum):
                total = total + _pair_values(part, S, X, steps, paired=paired)
            else:
                total = total * _pair_values(part, S, X, steps, paired=paired)
        return total
    if isinstance(kernel, ProportionalKernel):  # K = α·base(X, X2) after its own slicing
        S1, X1, steps1 = _sliced(kernel, S, X, steps)
        return kernel.alpha * _pair_values(kernel.base_kernel, S1, X1, steps1, paired=paired)
    if isinstance(kernel, gpflow.kernels.ChangePoints):  # GPflow's formula; its parts see its sliced inputs
        S1, X1, steps1 = _sliced(kernel, S, X, steps)
        sig_s, sig_x = _sigmoids(kernel, S1), _sigmoids(kernel, X1)

        def both(a: np.ndarray, b: np.ndarray) -> np.ndarray:
            return a * b if paired else a[:, None] * b[None, :]

        count = sig_s.shape[1]
        total = np.zeros(S1.shape[0] if paired else (S1.shape[0], X1.shape[0]), dtype=gpflow.default_float())
        for i, part in enumerate(kernel.kernels):
            value = _pair_values(part, S1, X1, steps1, paired=paired)
            if i > 0:
                value = value * both(sig_s[:, i - 1], sig_x[:, i - 1])
            if i < count:
                value = value * both(1.0 - sig_s[:, i], 1.0 - sig_x[:, i])
            total = total + value
        return total
    if shift_invariant(kernel):
        origin = np.zeros((1, S.shape[1]), dtype=steps.dtype)
        values = kernel_matrix(kernel, origin, steps)
        return values.reshape(-1) if paired else values.reshape(S.shape[0], X.shape[0])
    if any(isinstance(part, gpflow.kernels.Kernel) for part in kernel.submodules):
        raise ValueError(
            f"the kernel's {type(kernel).__name__} part holds other kernels, which the near-record rule cannot "
            "evaluate exactly (a shift-invariant part through GPflow's r² loses its round-off there); build the "
            "kernel from GPflow's kernels with +, *, ChangePoints or ProportionalKernel"
        )
    return _paired_leaf(kernel, S, X) if paired else kernel_matrix(kernel, S, X)


def check_white_like(kernel: gpflow.kernels.Kernel, A: np.ndarray, argument: str = "noise_variance") -> None:
    """Refuse a kernel whose ``k(a, a)`` (its diagonal, ``kernel(A, full_cov=False)``) differs from ``k(a, a')`` at a
    copy ``a'`` of the same point (as the near-record rule evaluates it, :func:`_pair_values`) by more than
    :data:`WHITE_LIKE_RTOL` of the larger: a noise-like part, 0 between two inputs even at the same point.

    :func:`~gpflow_fed.release.linalg.check_no_white` refuses GPflow's White by class; a custom kernel that behaves
    like it (``w·I`` for ``k(X)``, 0 when a second input is given) passed (issue 44, a twentieth attacker: SE + such a
    nugget, the near rule saw ``½k(s,s) + ½k(x,x) − k(s,x) = w`` and released a record 1e-9 off a sensitive input at
    0.857 ξ).
    Evaluated in row blocks (memory ``O(block²)``).

    :raises ValueError: naming the first row that differs and σ²'s argument.
    """
    A = np.asarray(A, dtype=gpflow.default_float())
    if A.shape[0] == 0:
        return
    copy = np.array(A, copy=True)
    diag = kernel_diag(kernel, A)
    cross = _pair_values(kernel, A, copy, np.zeros_like(A), paired=True)
    with np.errstate(invalid="ignore", over="ignore"):
        bad = ~(np.abs(diag - cross) <= WHITE_LIKE_RTOL * np.maximum(np.abs(diag), np.abs(cross)))
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(
            f"the kernel's k(x, x) differs from its diagonal at row {i} ({float(cross[i]):.6g} between two copies "
            f"of the input, {float(diag[i]):.6g} on the diagonal): a noise-like (White) part; give it as σ² "
            f"({argument}=)"
        )


def _near_blocks(
    kernel: gpflow.kernels.Kernel, X: np.ndarray, S: np.ndarray
) -> "Iterator[tuple[int, int, np.ndarray]]":
    """``(start, stop, near)`` for blocks of S in order, one at a time: ``near`` ``[stop − start, N]`` is whether X's
    row j is one input to the model with S's row i (the rule of :data:`NEAR_RECORD_DECORRELATION`) without being S's
    row i up to rounding (:func:`~gpflow_fed.release.linalg.same_inputs`). Memory is bounded by
    :data:`NEAR_RECORD_BLOCK` (the kernel's block) and ``N`` booleans per row of the block.

    The rule is tested as ``½k(s,s) + ½k(x,x) − k(s,x) ≤ δ·√k(s,s)·√k(x,x)``, never as ``1 − ρ`` with a quotient:
    the left side is ``½Var[f(s) − f(x)]`` from the kernel's own three values (its round-off ``≈ ε·(k(s,s) + k(x,x))``,
    far below ``δ√k(s,s)√k(x,x)`` at δ = 5e-7 unless the variances differ by 1e9), each square root taken alone
    (``√(k(s,s)·k(x,x))`` overflowed for a kernel variance of 1e298, making every record near, and underflows below
    1e-162, making every record far; halving keeps the sum finite up to float64's largest value), and the product
    form decides the zero-variance cases without 0/0: where ``k(s,s) = k(x,x) = 0`` (``Linear`` at 0, a part that sees
    neither point) ``f(s) = f(x) = 0`` and the pair is near (one input to the model: nothing tells them apart); where
    only one is 0 the left side is half the other's variance > 0 and the pair is far (the model tells them apart).

    The kernel is evaluated part by part (:func:`_pair_values`), every :func:`shift_invariant` part at the difference,
    ``k(0, x − s)``: GPflow's ``r² = ‖x/ℓ‖² + ‖s/ℓ‖² − 2(x/ℓ)·(s/ℓ)`` carries round-off ``≈ ε‖x/ℓ‖²``, which a kernel
    not smooth in r² (Matérn-1/2: ``exp(−√r²)``) turned into ``Var ≈ 2√(ε‖x/ℓ‖²)`` — 2.7e-6 at ``x/ℓ ≈ 100``, above
    1e-6 — so a point 1e-10 lengthscales off a record was judged far and released (issue 44, an eighteenth attacker:
    the record at 0.05–0.57 ξ; then the same through a sum with a ``Constant`` or ``Linear`` part).
    """
    check_no_white(kernel)
    N, D = X.shape
    if N == 0 or S.shape[0] == 0:
        return
    check_white_like(kernel, X)  # a custom White: the rule below would see every record far
    check_white_like(kernel, S)
    dx = np.maximum(kernel_diag(kernel, X), 0.0)
    ds = np.maximum(kernel_diag(kernel, S), 0.0)
    sx, ss = np.sqrt(dx), np.sqrt(ds)
    cols = max(1, min(N, NEAR_RECORD_BLOCK // max(D, 1)))
    rows = max(1, NEAR_RECORD_BLOCK // (cols * max(D, 1)))
    delta = NEAR_RECORD_DECORRELATION
    for start in range(0, S.shape[0], rows):
        stop = min(start + rows, S.shape[0])
        near = np.zeros((stop - start, N), dtype=bool)
        for c0 in range(0, N, cols):
            c1 = min(c0 + cols, N)
            # shift-invariant parts at the exact difference: no ‖x/ℓ‖² cancellation (docstring)
            steps = (X[None, c0:c1, :] - S[start:stop, None, :]).reshape(-1, D)
            k = _pair_values(kernel, S[start:stop], X[c0:c1], steps)
            a, b = ds[start:stop, None], dx[None, c0:c1]
            with np.errstate(invalid="ignore", over="ignore"):
                near[:, c0:c1] = (0.5 * a + 0.5 * b) - k <= delta * (ss[start:stop, None] * sx[None, c0:c1])
        i, j = np.nonzero(near)
        if i.size:  # equal up to rounding is the record itself, not a point beside it
            same = same_input_rows(S[start + i], X[j])
            near[i[same], j[same]] = False
        yield start, stop, near


@check_shapes("X: [N, D]", "S: [G, D]", "return: [N]")
def records_near(kernel: gpflow.kernels.Kernel, X: np.ndarray, S: np.ndarray) -> np.ndarray:
    """``[N]`` whether each row of X is one input to the model with some point of S (normalised distance
    ``d² ≤ 2·``:data:`NEAR_RECORD_DECORRELATION`, for every kernel) without being equal to it up to rounding
    (:func:`~gpflow_fed.release.linalg.same_inputs`). Costs ``G × N`` kernel evaluations, in blocks of bounded
    memory."""
    near = np.zeros(X.shape[0], dtype=bool)
    for _, _, block in _near_blocks(kernel, X, S):
        near |= np.any(block, axis=0)
    return near


@check_shapes("X: [N, D]", "S: [G, D]")
def check_near_records(kernel: gpflow.kernels.Kernel, X: np.ndarray, S: np.ndarray) -> None:
    """Refuse a sensitive input that misses a record by more than float rounding
    (:func:`~gpflow_fed.release.linalg.same_inputs`) but is one input to the model with it: the kernel's correlation
    at least ``1 −`` :data:`NEAR_RECORD_DECORRELATION` (:func:`records_near`), for every kernel.

    Such a point protects ``f(s)`` only, and the record beside it need not be protected at all: a row the design
    leaves without synthetic noise is published as ``Y_j`` up to the resolution noise (issue 44, a fourteenth
    attacker: ``--sensitive 0.512820513`` for the record at ``0.5128205128205128`` gave ``Var[Y_j | W] = 0.006 ξ``,
    the CLI saying "safe to publish"). The rule is the kernel's own, so a sum with a tiny second lengthscale, a part
    seeing some columns only (``active_dims``) and a periodic kernel (a record one period away) are covered; the
    earlier rule in lengthscales was not. (A region protects such records instead: :func:`with_near_records`.)

    :raises ValueError: naming the sensitive input and the record's row and input.
    """
    for start, _, block in _near_blocks(kernel, X, S):
        hits = np.argwhere(block)
        if hits.size:
            i, j = int(start + hits[0, 0]), int(hits[0, 1])
            raise ValueError(
                f"sensitive input {S[i].tolist()} is one input to the model with the record at row {j} "
                f"({X[j].tolist()}) but not equal to it (the kernel's correlation there ≥ "
                f"1 − {NEAR_RECORD_DECORRELATION:g}): "
                "a point there protects f alone, not the recorded value beside it; give the record's own input to "
                "protect it, or a point farther from it"
            )


@check_shapes("S: [G, D]", "X: [N, D]", "return: [H, D]")
def with_near_records(S: np.ndarray, X: np.ndarray, kernel: gpflow.kernels.Kernel) -> np.ndarray:
    """A region's sensitive points ``S`` and every record that is one input to the model with one of them
    (:func:`records_near`, :data:`NEAR_RECORD_DECORRELATION`) and not already among them: a record a hair outside a
    region's edge (an interval typed to 10 decimals, a zero-width one), or one period away under a periodic kernel,
    is the region's too (issue 44, a fifteenth attacker: such a record was published at 0.55 ξ, "safe to
    publish")."""
    rows = np.flatnonzero(records_near(kernel, X, S))
    new = [X[j] for j in rows if not np.any(same_inputs(S, X[j]))]
    if not new:
        return S
    _, first = np.unique(np.asarray(new), axis=0, return_index=True)
    return np.concatenate([S, np.asarray(new)[np.sort(first)]], axis=0)


def target_blocks(
    kernel: gpflow.kernels.Kernel, X: np.ndarray, targets: Targets, v: np.ndarray
) -> "tuple[np.ndarray, np.ndarray]":
    r"""``(C_XT, P_T)``: ``Cov[Y_X, T] = K_XT + V_XT`` ``[N, t]`` and ``Cov[T] = K_TT + V_TT`` ``[t, t]``."""
    C = kernel_matrix(kernel, X, targets.points)
    P = kernel_matrix(kernel, targets.points)
    for a, j in enumerate(targets.records):
        if j >= 0:
            C[j, a] += v[j]
            P[a, targets.records == j] += v[j]
    return C, 0.5 * (P + P.T)


def target_tolerance(
    resolved: ResolvedTolerance, targets: Targets, prior: np.ndarray, *, check_prior: bool = True
) -> "tuple[np.ndarray, np.ndarray]":
    """``(Ξ_T, ξ_T)`` for the targets (a scalar or vector tolerance stays diagonal), refused where ``ξ ≥ P_tt``.

    :param check_prior: False skips the refusal (the caller reports it: the check under a refitted θ).
    :raises ValueError: naming the first target whose tolerance reaches its prior variance (no noise reaches it).
    """
    src = targets.source
    if resolved.kind in ("scalar", "vector"):
        Xi = np.diag(resolved.xi[src])
    else:
        Xi = resolved.Xi[np.ix_(src, src)]
    xi = np.diag(Xi).copy()
    bad = np.flatnonzero(xi >= prior) if check_prior else np.zeros(0, dtype=int)
    if bad.size:
        a = int(bad[0])
        what = (
            f"the record in row {targets.records[a]} (prior variance K(s, s) + σ²)"
            if targets.records[a] >= 0
            else "f at that input (prior variance K(s, s))"
        )
        raise ValueError(
            f"tolerance {xi[a]:g} at sensitive input {int(src[a])} is ≥ the prior variance {prior[a]:g} of {what}; "
            "no noise can reach it. Lower the tolerance below the prior variance"
        )
    return 0.5 * (Xi + Xi.T), xi


def strong_factor(KXS: np.ndarray, KSS: np.ndarray, Xi: np.ndarray, resolved_kind: str = "matrix") -> np.ndarray:
    r"""``B`` with ``BBᵀ = K_XS (K_SS − Ξ)⁻¹ K_SX`` (the positive term of eq. 11 / G(S) of eq. 12).

    ``K_SS − Ξ = Q diag(m) Qᵀ`` and ``B = K_XS Q diag(m^{-1/2})``. (Dense region grids, where ``K_SS − H_SS``
    is numerically singular, use the pivoted factor of :mod:`~gpflow_fed.release.regions` instead.)

    :raises ValueError: if ``K_SS − Ξ`` is not positive definite.
    """
    M = 0.5 * ((KSS - Xi) + (KSS - Xi).T)
    if resolved_kind in ("scalar", "vector") and M.shape[0] > 1:
        fix = (
            "with several sensitive inputs a scalar or vector tolerance builds Ξ = diag(ξ), which is invalid "
            "here; pass a kernel tolerance H (e.g. ProportionalKernel(kernel, alpha)) or a matrix Ξ with "
            "K_SS − Ξ ≻ 0, lower the tolerances, or use method='weak'"
        )
    else:
        fix = (
            "choose a smaller Ξ / H (e.g. H = αK with 0 < α < 1, or H within gaussian_tolerance_kernel's "
            "range), drop duplicated sensitive inputs, or use method='weak'"
        )
    psd_check(M, "K_SS − Ξ", fix, strict=True)
    m, Q = np.linalg.eigh(M)
    return KXS @ (Q / np.sqrt(m)[None, :])


def _cholesky_margin(candidate: LowRankCovariance, B: np.ndarray, KXX: np.ndarray, v: np.ndarray) -> Optional[float]:
    """``λ_min(I − Bᵀ(K + V + Σ)⁻¹B)`` by one Cholesky (O(N³/3)); None if ``K + V + Σ`` is numerically singular.

    The fallback certificate of the low-rank path, used only when no positive lower bound on
    ``λ_min(K + V)`` exists (V = 0 with a kernel matrix that is not diagonally dominant).
    """
    C = KXX + np.asarray(candidate)
    C[np.diag_indices(C.shape[0])] += v
    try:
        L = cholesky(C, lower=True, overwrite_a=True, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    Y = solve_triangular(L, B, lower=True, check_finite=False)
    return float(np.linalg.eigvalsh(np.eye(B.shape[1]) - Y.T @ Y)[0])


@check_shapes("B: [N, G]", "KXX: [N, N]", "v: [N]")
def positive_part_of_difference(B: np.ndarray, KXX: np.ndarray, v: np.ndarray, *, low_rank: bool) -> Covariance:
    r"""``(BBᵀ − K_XX − V)⁺`` (eq. 8, 11, 13): dense eigh (O(N³)), or block Krylov when ``low_rank`` (O(N²γ)).

    The low-rank result is certified: every Ritz pair's residual is checked, and the strong condition at the
    sensitive inputs, ``I − Bᵀ(K + V + Σ)⁻¹B ⪰ 0`` (eq. 11 through the Schur complement), is proved by the
    Galerkin bound of :mod:`~gpflow_fed.release.lowrank` (O(N k²)), or, when V = 0 leaves no positive
    bound on ``λ_min(K + V)``, by one Cholesky. If certification fails the dense decomposition is used, with a
    warning.
    """
    N = KXX.shape[0]
    if low_rank and B.shape[1] < N - 1:
        candidate, info = krylov_positive_part(B, KXX, v)
        if candidate is not None:
            margin = info.certified_margin
            if margin is None or margin < -CERTIFY_TOL:
                margin = _cholesky_margin(candidate, B, KXX, v)
            if margin is not None and margin >= -CERTIFY_TOL:
                return candidate
        warnings.warn("the low-rank positive part could not be certified; using the dense eigen-decomposition")
    A = B @ B.T
    A -= KXX
    A[np.diag_indices(N)] -= v
    lam, vecs = psd_factor(A)
    del A
    Sigma = (vecs * lam[None, :]) @ vecs.T
    return 0.5 * (Sigma + Sigma.T)


def synthetic_noise_covariance(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    sensitive: np.ndarray,
    tolerance: Tolerance,
    *,
    noise_variance: Union[float, np.ndarray] = 0.0,
    method: str = "strong",
    low_rank: Optional[bool] = None,
    solver: Optional[str] = None,
    protect: str = "records",
    earlier: Optional[Covariance] = None,
) -> Covariance:
    r"""The minimum-trace covariance Σ of the synthetic noise (eq. 8, 10, 11).

    :param kernel: the GP covariance K (hyperparameters already estimated, §3.2 step 1).
    :param X: ``[N, D]`` training inputs.
    :param sensitive: ``[γ, D]`` sensitive inputs S (they need not be training inputs).
    :param tolerance: a scalar ξ, a ``[γ]`` vector ξᵢ, a ``[γ, γ]`` PSD matrix Ξ (strong, eq. 11) or a GPflow
        kernel H with Ξ = H_SS (§4.3; see :class:`ProportionalKernel`, :func:`gaussian_tolerance_kernel`). The
        weak and diagonal methods use ξᵢ = Ξᵢᵢ.
    :param noise_variance: V, a scalar or ``[N]`` diagonal (0 for deterministic simulators).
    :param method: ``"strong"`` (closed form), ``"weak"`` (SDP 10) or ``"diagonal"`` (diagonal-Σ SDP).
    :param low_rank: strong method only; compute the rank-≤γ positive part by certified block Krylov in
        O(N²γ) (deterministic; ``None``: when ``N ≥ 200``, ``γ ≤ N/5`` and ``min V > 0``). The result is then
        a :class:`LowRankCovariance`.
    :param solver: for the SDP methods: ``"krylov"`` (the default for ``"weak"``: certified block-Krylov
        reduction, :func:`~gpflow_fed.release.weak.solve_weak_krylov`; needs ``K + V`` numerically positive
        definite), ``"dense"`` (= ``"CLARABEL"``, the N×N SDP with cvxpy; the default for ``"diagonal"``) or
        ``"SCS"`` (dense, lower accuracy).
    :param protect: ``"records"`` (default): at a sensitive input that is a training input, the recorded value
        ``Y_j`` is protected, ``Var[Y_j | W] ≥ ξ`` (feasible iff ``ξ < K(s, s) + σ²``); ``"latent"``: the
        paper's floor on ``f(s)`` (eq. 5, ``ξ < K(s, s)``). See the module docstring.
    :param earlier: Σ₁ of an earlier release of these rows (``W₂ = W₁ + Δ``, DESIGN.md §5 principle 6): the
        returned covariance is Δ's, solved with Σ₁ fixed (``K + V`` becomes ``K + V + Σ₁``), so the total
        ``Σ₁ + Σ_Δ`` meets the floor; Δ = 0 when Σ₁ already does (a lower tolerance republishes W₁).
    :return: Σ, ``[N, N]`` PSD: a dense array, or a :class:`LowRankCovariance` (``np.asarray`` gives the dense);
        the weak Krylov path returns a :class:`~gpflow_fed.release.weak.CertifiedCovariance` whose
        ``.certificate`` holds the objective, certified lower bound, relative gap, feasibility margin, Krylov
        dimension and time.
    :raises ValueError: negative tolerance; tolerance ≥ prior variance; Ξ not PSD; ``K_SS − Ξ`` not PD
        (strong); dimension mismatch between X and S; unknown method or solver; infeasible or failed SDP; a
        weak solution that cannot be certified (the message names the gap and margin reached and the fix).
    """
    check_method(method)
    if solver is not None and solver not in SOLVERS and str(solver).upper() not in SOLVERS:
        raise ValueError(f"unknown solver {solver!r}; use one of {', '.join(SOLVERS)}")
    if solver == "krylov" and method != "weak":
        raise ValueError(
            f"solver='krylov' applies to method='weak' only (got method={method!r}): the strong method "
            "has a closed form, and a diagonal Σ is of full rank, so use solver='dense' (the default) for "
            "method='diagonal'"
        )
    check_no_white(kernel)
    Xa, S = release_inputs(X, sensitive)
    v = noise_vector(noise_variance, Xa.shape[0])
    targets = protected_targets(Xa, S, protect)
    resolved = resolve_tolerance(kernel, S, tolerance, check_prior=False)
    CXT, PT = target_blocks(kernel, Xa, targets, v)
    Xi, xi = target_tolerance(resolved, targets, np.diag(PT))
    KXX = kernel_matrix(kernel, Xa)
    if earlier is not None:
        KXX += np.asarray(earlier)
        low_rank = False
    if method == "strong":
        B = strong_factor(CXT, PT, Xi, resolved.kind)
        if low_rank is None:
            low_rank = Xa.shape[0] >= LOW_RANK_MIN_N and 5 * S.shape[0] <= Xa.shape[0] and float(np.min(v)) > 0
        return positive_part_of_difference(B, KXX, v, low_rank=bool(low_rank))
    C = KXX
    C[np.diag_indices(Xa.shape[0])] += v
    KXS = CXT
    margin = np.diag(PT) - xi
    if method == "weak" and solver in (None, "krylov"):
        return solve_weak_krylov(C, KXS, margin)
    dense_solver = "CLARABEL" if solver in (None, "dense") else str(solver).upper()
    Sigma, _ = solve_privacy_sdp(C, KXS, margin, diagonal=method == "diagonal", solver=dense_solver)
    return Sigma


def _eigenpairs(Sigma: object) -> "tuple[np.ndarray, np.ndarray]":
    if isinstance(Sigma, LowRankCovariance):
        return Sigma.eigenvalues, Sigma.eigenvectors
    dense: np.ndarray = np.asarray(Sigma, dtype=gpflow.default_float())
    if dense.ndim != 2 or dense.shape[0] != dense.shape[1]:
        raise ValueError(f"Sigma must be a square [N, N] matrix, got shape {dense.shape}")
    if not np.all(np.isfinite(dense)):
        raise ValueError("Sigma contains NaN or inf values")
    psd_check(dense, "Sigma", "pass the covariance returned by synthetic_noise_covariance", strict=False, rtol=1e-8)
    return psd_factor(dense)


def obfuscate(Y: np.ndarray, Sigma: Covariance, *, insecure_noise_seed: Optional[int] = None) -> np.ndarray:
    r"""Obfuscated outputs ``W = Y + Z``, ``Z ~ N(0, Σ)``, by the eigen-decomposition steps of §4.1.

    Step 1: ``Σ = Oᵀ diag(λ) O``. Step 2: ``U = (√λ₁⁺ ω₁, …, √λₙ⁺ ωₙ)`` with ωᵢ iid standard normal (only for
    λᵢ > 0). Step 3: ``Z = OᵀU``. Each output column of Y gets its own independent Z.

    :param Y: ``[N]`` or ``[N, P]`` raw outputs.
    :param Sigma: ``[N, N]`` PSD covariance (dense or :class:`LowRankCovariance`).
    :param insecure_noise_seed: leave None: ω is drawn from 128 OS-random bits
        (:func:`~gpflow_fed.randomness.protective_rng`), so nobody can regenerate Z and compute
        ``W − Z = Y`` (Σ itself is public: it follows from the released kernel, X and tolerance). An int makes W
        reproducible for tests and removes all protection.
    :return: W with the shape of Y.
    :raises ValueError: shape mismatch, or Σ not square / not PSD / not finite.
    :raises TypeError: a positional third argument (the former ``seed``) or a non-int ``insecure_noise_seed``.
    """
    if np.iscomplexobj(Y):
        raise TypeError("Y is complex; pass real outputs (casting would drop the imaginary part)")
    Ya: np.ndarray = np.asarray(Y, dtype=gpflow.default_float())
    if Ya.ndim not in (1, 2) or not np.all(np.isfinite(Ya)):
        raise ValueError(f"Y must be a finite [N] or [N, P] array, got shape {Ya.shape}")
    lam, O = _eigenpairs(Sigma)
    if O.shape[0] != Ya.shape[0]:
        raise ValueError(f"Sigma is {O.shape[0]}×{O.shape[0]} but Y has {Ya.shape[0]} rows")
    rng = randomness.protective_rng(insecure_noise_seed)  # looked up at call time (tests substitute it)
    columns = 1 if Ya.ndim == 1 else Ya.shape[1]
    omega = rng.standard_normal((lam.shape[0], columns))
    Z = O @ (np.sqrt(lam)[:, None] * omega)
    return Ya + (Z[:, 0] if Ya.ndim == 1 else Z)


@check_shapes("X: [N, D]", "Xnew: [M, D]", "return: [M, M]")
def posterior_covariance(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    Xnew: np.ndarray,
    Sigma: Covariance,
    noise_variance: Union[float, np.ndarray] = 0.0,
) -> np.ndarray:
    r"""``Cov[f(X*) | X, W] = K_** − K_*X (K_XX + V + Σ)⁻¹ K_X*`` (eq. 4), in numpy (an oracle for checks)."""
    Xa, Xs = as_inputs(X, "X"), as_inputs(Xnew, "Xnew")
    C = kernel_matrix(kernel, Xa) + np.asarray(Sigma)
    C[np.diag_indices(Xa.shape[0])] += noise_vector(noise_variance, Xa.shape[0])
    L = np.linalg.cholesky(0.5 * (C + C.T))
    A = solve_triangular(L, kernel_matrix(kernel, Xa, Xs), lower=True)
    return kernel_matrix(kernel, Xs) - A.T @ A


@check_shapes("X: [N, D]", "return: [T, T]")
def protected_covariance(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    targets: Targets,
    Sigma: Covariance,
    noise_variance: Union[float, np.ndarray] = 0.0,
) -> np.ndarray:
    r"""``Cov[T | W] = P_T − C_TX (K_XX + V + Σ)⁻¹ C_XT`` (eq. 4 with ``K_XS → C_XT``, ``K_SS → P_T``; numpy oracle).

    For latent targets this is :func:`posterior_covariance`; a record ``Y_j`` adds σ²ⱼ to its prior variance and to
    its cross-covariance with ``W_j``.
    """
    Xa = as_inputs(X, "X")
    v = noise_vector(noise_variance, Xa.shape[0])
    CXT, PT = target_blocks(kernel, Xa, targets, v)
    C = kernel_matrix(kernel, Xa) + np.asarray(Sigma)
    C[np.diag_indices(Xa.shape[0])] += v
    L = np.linalg.cholesky(0.5 * (C + C.T))
    A = solve_triangular(L, CXT, lower=True)
    return PT - A.T @ A


@dataclass(frozen=True)
class PrivacyCheck:
    """The privacy margins achieved by Σ at the protected targets (records or f at the sensitive inputs).

    :param variance: ``[t]`` posterior variances ``Var[Tₐ | W]`` of each target (eq. 4; ``t = γ`` unless a
        sensitive input repeats a training input, see :func:`protected_targets`).
    :param tolerance: ``[t]`` ξ of each target.
    :param weak_margin: ``minₐ (Var[Tₐ|W] − ξₐ)``, ≥ 0 when the weak condition (5)/(10) holds.
    :param strong_margin: ``λ_min(Cov[T|W] − Ξ_T)``, ≥ 0 when ``Var[βᵀT|W] ≥ βᵀΞβ`` for all β (eq. 11).
    :param targets: which quantities were checked.
    """

    variance: np.ndarray
    tolerance: np.ndarray
    weak_margin: float
    strong_margin: float
    targets: Optional[Targets] = None


def verify_privacy(
    kernel: gpflow.kernels.Kernel,
    X: np.ndarray,
    sensitive: np.ndarray,
    tolerance: Tolerance,
    Sigma: Covariance,
    *,
    noise_variance: Union[float, np.ndarray] = 0.0,
    protect: str = "records",
) -> PrivacyCheck:
    """Evaluate the weak and strong privacy conditions for a given Σ (O(N³); for checks and reports).

    :param protect: ``"records"`` (default) checks ``Var[Y_j | W]`` at every record on a sensitive input (f elsewhere),
        ``"latent"`` the paper's ``Var[f(s) | W]``.
    """
    Xa, S = release_inputs(X, sensitive)
    targets = protected_targets(Xa, S, protect)
    resolved: ResolvedTolerance = resolve_tolerance(kernel, S, tolerance, check_prior=False)
    v = noise_vector(noise_variance, Xa.shape[0])
    Xi, xi = target_tolerance(resolved, targets, np.diag(target_blocks(kernel, Xa, targets, v)[1]))
    cov = protected_covariance(kernel, Xa, targets, Sigma, v)
    variance = np.diag(cov).copy()
    strong = float(np.linalg.eigvalsh(0.5 * (cov + cov.T) - Xi)[0])
    return PrivacyCheck(
        variance=variance,
        tolerance=xi,
        weak_margin=float(np.min(variance - xi)),
        strong_margin=strong,
        targets=targets,
    )


def prior_variance(kernel: gpflow.kernels.Kernel, X: np.ndarray) -> np.ndarray:
    """``[N]`` ``K(x, x)`` — the largest tolerance any Σ can reach is just below it."""
    return kernel_diag(kernel, as_inputs(X, "X"))


__all__ = [
    "METHODS",
    "NEAR_RECORD_DECORRELATION",
    "PROTECT",
    "Targets",
    "check_near_records",
    "records_near",
    "with_near_records",
    "protected_covariance",
    "protected_targets",
    "SOLVERS",
    "PrivacyCheck",
    "obfuscate",
    "posterior_covariance",
    "prior_variance",
    "synthetic_noise_covariance",
    "verify_privacy",
]

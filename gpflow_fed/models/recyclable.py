"""Recyclable models: fitted sparse GPs exported in unwhitened form and persisted without their data.

A *recyclable model* (Moreno-Muñoz et al., *Recyclable Gaussian Processes*, §2 and eq. 1) is the tuple
``M_k = {μ_k, L_k, Z_k, θ_k}`` of a fitted single-output SVGP ``q_k(u_k) = N(μ_k, S_k)``, ``S_k = L_k L_kᵀ``,
``u_k = f(Z_k)`` with the local kernel ``k_{θ_k}``, plus the spec of the likelihood it was trained with.
The ensemble bound (:class:`~gpflow_fed.models.EnsembleSVGP`) needs only these arrays, never ``X_k`` or ``y_k``.

GPflow's ``SVGP`` is whitened by default (``u = L_K v`` with ``L_K = chol(K_k + εI)``); :func:`export_svgp`
converts to the paper's unwhitened form ``μ_k = L_K m̃``, ``L_k = L_K L̃``, with the Cholesky factor of the
**local** kernel (a whitened q is meaningless to the ensemble, whose kernel differs).

Persistence is a single ``.npz`` file holding only numeric arrays and JSON strings (no pickled code):
``save_recyclable(path, {"name": model, ...})`` and ``load_recyclable(path)``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, Mapping, Optional, Sequence, Union

import gpflow
import numpy as np
from check_shapes import check_shapes
from numpy.typing import DTypeLike

from .recyclable_training import train_local_svgp
from ..untrusted_files import parse_json
from .serialization import kernel_from_spec, kernel_spec, likelihood_from_spec, likelihood_spec, read_npz

__all__ = [
    "FORMAT",
    "RecyclableModel",
    "export_svgp",
    "load_recyclable",
    "save_recyclable",
    "train_local_svgp",
]

FORMAT = "gpflow-fed-recyclable/1"


@dataclass(frozen=True)
class RecyclableModel:
    """A fitted local sparse GP in unwhitened form: ``q_k(u_k) = N(q_mu, q_sqrt q_sqrtᵀ)`` at ``Z``
    (Moreno-Muñoz et al., eq. 1).

    :param q_mu: ``[M, 1]`` variational mean μ_k.
    :param q_sqrt: ``[M, M]`` lower-triangular ``L_k`` (the upper triangle is ignored and zeroed).
    :param Z: ``[M, D]`` inducing inputs Z_k.
    :param kernel: :func:`kernel_spec` of the local kernel θ_k.
    :param likelihood: :func:`likelihood_spec` of the likelihood the model was trained with (or ``None``).
    :param name: a label.
    :raises ValueError: for inconsistent shapes or non-finite values.
    """

    q_mu: np.ndarray
    q_sqrt: np.ndarray
    Z: np.ndarray
    kernel: Mapping[str, Any]
    likelihood: Optional[Mapping[str, Any]] = None
    name: str = ""

    def __post_init__(self) -> None:
        dtype: DTypeLike = gpflow.default_float()
        q_mu, q_sqrt, Z = (np.array(a, dtype=dtype) for a in (self.q_mu, self.q_sqrt, self.Z))
        if Z.ndim != 2 or Z.shape[0] == 0:
            raise ValueError(f"recyclable model {self.name!r}: Z must be [M, D] with M > 0, got shape {Z.shape}")
        M = Z.shape[0]
        if q_mu.shape != (M, 1):
            raise ValueError(f"recyclable model {self.name!r}: q_mu must be [{M}, 1], got {q_mu.shape}")
        if q_sqrt.shape == (1, M, M):
            q_sqrt = q_sqrt[0]
        if q_sqrt.shape != (M, M):
            raise ValueError(f"recyclable model {self.name!r}: q_sqrt must be [{M}, {M}], got {q_sqrt.shape}")
        for label, a in (("q_mu", q_mu), ("q_sqrt", q_sqrt), ("Z", Z)):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"recyclable model {self.name!r}: {label} contains NaN or inf")
        kernel_from_spec(self.kernel)  # validates
        likelihood_from_spec(self.likelihood)
        lengthscales = self.kernel["lengthscales"]
        if len(lengthscales) not in (1, Z.shape[1]):
            raise ValueError(
                f"recyclable model {self.name!r}: kernel has {len(lengthscales)} lengthscales but D = {Z.shape[1]}"
            )
        for name, a in (("q_mu", q_mu), ("q_sqrt", np.tril(q_sqrt)), ("Z", Z)):
            a.setflags(write=False)
            object.__setattr__(self, name, a)
        object.__setattr__(self, "kernel", dict(self.kernel))
        object.__setattr__(self, "likelihood", None if self.likelihood is None else dict(self.likelihood))

    @property
    def num_inducing(self) -> int:
        """M_k."""
        return int(self.Z.shape[0])

    @property
    def input_dim(self) -> int:
        """D."""
        return int(self.Z.shape[1])

    def build_kernel(self) -> gpflow.kernels.Kernel:
        """A fresh GPflow kernel with the local hyperparameters θ_k."""
        return kernel_from_spec(self.kernel)

    def build_likelihood(self) -> Optional[gpflow.likelihoods.Likelihood]:
        """A fresh GPflow likelihood of the local model (``None`` if none was recorded)."""
        return likelihood_from_spec(self.likelihood)

    def to_svgp(self) -> gpflow.models.SVGP:
        """An unwhitened ``gpflow.models.SVGP`` with these parameters, e.g. to predict with one local model."""
        likelihood = self.build_likelihood() or gpflow.likelihoods.Gaussian()
        return gpflow.models.SVGP(
            self.build_kernel(),
            likelihood,
            gpflow.inducing_variables.InducingPoints(self.Z.copy()),
            q_mu=self.q_mu.copy(),
            q_sqrt=self.q_sqrt[None].copy(),
            whiten=False,
        )

    @check_shapes("offset: [D]")
    def shifted(self, offset: np.ndarray, name: Optional[str] = None) -> "RecyclableModel":
        """The same posterior moved to ``Z_k + offset`` (stationary kernels only; the "compositional number").

        For a stationary kernel, ``q_k`` over ``f(Z_k + δ)`` is the fitted posterior of ``x ↦ f(x − δ)``.
        """
        return replace(self, Z=self.Z + np.asarray(offset, dtype=self.Z.dtype)[None, :], name=name or self.name)

    def to_arrays(self, prefix: str = "") -> Dict[str, np.ndarray]:
        """Numeric arrays only (the JSON spec as a unicode array), for messages and ``.npz`` files."""
        spec = json.dumps({"kernel": self.kernel, "likelihood": self.likelihood, "name": self.name})
        return {
            f"{prefix}q_mu": self.q_mu,
            f"{prefix}q_sqrt": self.q_sqrt,
            f"{prefix}Z": self.Z,
            f"{prefix}spec": np.array(spec),
        }

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], prefix: str = "") -> "RecyclableModel":
        """Inverse of :meth:`to_arrays`; raises ``ValueError`` naming what is missing or corrupt."""
        missing = [k for k in ("q_mu", "q_sqrt", "Z", "spec") if f"{prefix}{k}" not in arrays]
        if missing:
            raise ValueError(f"corrupt recyclable model {prefix!r}: missing arrays {missing}")
        try:
            spec = parse_json(str(np.asarray(arrays[f"{prefix}spec"])), f"recyclable model {prefix!r} spec")
            kernel, likelihood, name = spec["kernel"], spec["likelihood"], spec["name"]
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"corrupt recyclable model {prefix!r}: unreadable spec ({exc})") from exc
        return cls(
            q_mu=arrays[f"{prefix}q_mu"],
            q_sqrt=arrays[f"{prefix}q_sqrt"],
            Z=arrays[f"{prefix}Z"],
            kernel=kernel,
            likelihood=likelihood,
            name=str(name),
        )


def export_svgp(model: Any, name: str = "") -> RecyclableModel:
    """Export a fitted single-output ``gpflow.models.SVGP`` (or a fitted :class:`EnsembleSVGP`) as a
    :class:`RecyclableModel` in unwhitened form.

    For ``whiten=True``: ``μ_k = L_K m̃``, ``L_k = L_K L̃`` with ``L_K = chol(Kuu(Z_k) + εI)`` from the **local**
    kernel, ``ε`` GPflow's default jitter.

    :raises TypeError: for other model types, kernels or likelihoods, or non-``InducingPoints`` inducing variables.
    :raises ValueError: for multi-output models.
    """
    if callable(getattr(model, "to_recyclable", None)):  # an EnsembleSVGP (or any model that exports itself)
        return model.to_recyclable(name=name)
    if not isinstance(model, gpflow.models.SVGP):
        raise TypeError(f"export_svgp needs a gpflow.models.SVGP or an EnsembleSVGP, got {type(model).__name__}")
    iv = model.inducing_variable
    if type(iv) is not gpflow.inducing_variables.InducingPoints:
        raise TypeError(f"export_svgp needs InducingPoints, got {type(iv).__name__}")
    if model.num_latent_gps != 1 or model.q_mu.shape[1] != 1:
        raise ValueError(f"export_svgp needs a single-output SVGP, got {model.q_mu.shape[1]} latent GPs")
    if model.q_sqrt.shape.ndims != 3:
        raise ValueError("export_svgp needs a full-covariance SVGP (q_diag=False)")
    q_mu = model.q_mu.numpy()
    q_sqrt = model.q_sqrt.numpy()[0]
    if model.whiten:
        L_K = np.linalg.cholesky(
            gpflow.covariances.Kuu(iv, model.kernel, jitter=gpflow.config.default_jitter()).numpy()
        )
        q_mu, q_sqrt = L_K @ q_mu, L_K @ q_sqrt
    return RecyclableModel(
        q_mu=q_mu,
        q_sqrt=q_sqrt,
        Z=iv.Z.numpy(),
        kernel=kernel_spec(model.kernel),
        likelihood=likelihood_spec(model.likelihood),
        name=name,
    )


ModelsLike = Union[Mapping[str, RecyclableModel], Sequence[RecyclableModel]]


def _as_named(models: ModelsLike) -> Dict[str, RecyclableModel]:
    if isinstance(models, Mapping):
        named = {str(k): v for k, v in models.items()}
    elif isinstance(models, Iterable) and not isinstance(models, (str, bytes)):
        named = {
            (m.name if isinstance(m, RecyclableModel) and m.name else f"model_{i}"): m for i, m in enumerate(models)
        }
    else:
        raise TypeError(f"expected a mapping or sequence of RecyclableModel, got {type(models).__name__}")
    if not named:
        raise ValueError("the dictionary of recyclable models is empty; save at least one model")
    for key, m in named.items():
        if not isinstance(m, RecyclableModel):
            raise TypeError(f"model {key!r} is a {type(m).__name__}; convert it with export_svgp(model) first")
    return named


def save_recyclable(path: Union[str, os.PathLike], models: ModelsLike) -> None:
    """Write a dictionary of recyclable models to one ``.npz`` file (numeric arrays and JSON text only).

    :param path: the file to write (``.npz`` is appended by numpy if missing).
    :param models: ``{name: RecyclableModel}`` or a sequence (named ``model_i`` unless the model has a name).
    """
    named = _as_named(models)
    arrays: Dict[str, np.ndarray] = {"format": np.array(FORMAT), "names": np.array(list(named))}
    for i, m in enumerate(named.values()):
        arrays.update(m.to_arrays(prefix=f"{i}/"))
    np.savez(path, **arrays)


def load_recyclable(path: Union[str, os.PathLike]) -> Dict[str, RecyclableModel]:
    """Read a dictionary written by :func:`save_recyclable` (never unpickles anything).

    :raises FileNotFoundError: if ``path`` does not exist.
    :raises ValueError: naming the file, for a corrupt or incompatible file (not an ``.npz``, truncated,
        bit-flipped, pickled data, wrong format tag, missing or malformed arrays).
    """
    arrays = read_npz(path, "recyclable-model file (save_recyclable)", FORMAT, ("names",))
    names = [str(n) for n in np.atleast_1d(arrays["names"])]
    if not names:
        raise ValueError(f"{path}: the file holds no models")
    models = {}
    for i, n in enumerate(names):
        try:
            models[n] = RecyclableModel.from_arrays(arrays, prefix=f"{i}/")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path}: model {n!r} is corrupt or incomplete ({type(exc).__name__}: {exc})") from exc
    return models

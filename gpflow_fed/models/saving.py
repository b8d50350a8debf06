"""Saving and loading the models the package returns: one ``.npz`` file, or a ``tf.saved_model`` folder.

``save_model(model, path)`` writes

* ``structure``: JSON naming the model's class and its parts' structure (kernel classes, parameter shapes, fixed
  settings such as a Monte Carlo seed; :mod:`~gpflow_fed.models.serialization`), never code;
* ``variables/<path>``: the value of every variable under its attribute path
  (:func:`~gpflow_fed.models.serialization.named_variables`; a parameter's unconstrained value, so it
  round-trips bit for bit) and which of them train;
* ``constants/<name>``: arrays a model is built from (the local models inside an ensemble).

``load_model(path)`` reads it without unpickling (:func:`~gpflow_fed.models.serialization.read_npz`), builds
the model from the closed list below, and fills its variables after checking that the file names exactly the
model's variables, each with its shape and dtype. Supported: :class:`~gpflow_fed.models.StandardizedModel`
around any of :class:`~gpflow_fed.models.AggregatedSGPR` (FSGP), :class:`~gpflow_fed.models.FederatedDPOSVGP`
(PVI), :class:`~gpflow_fed.models.BayesianLinearRegression` built from statistics (FedBNR) and
:class:`~gpflow_fed.models.EnsembleSVGP` without data (Recycle), or those models alone. ``save_model`` loads
what it wrote before writing, so a file it writes always loads.

``export_saved_model(model, path)`` writes a ``tf.saved_model`` whose ``predict_f``, ``predict_y`` and
``predict_log_density`` are concrete functions of ``[None, D]`` inputs: ``tf.saved_model.load(path).predict_y(X)``
needs neither this package nor GPflow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf

from .serialization import (
    saved_fields,
    saved_integer,
    build_kernel,
    build_likelihood,
    kernel_structure,
    likelihood_structure,
    allocation_budget,
    named_variables,
    read_npz,
    skeleton_array,
)
from ..untrusted_files import parse_json

__all__ = ["FORMAT", "export_saved_model", "load_model", "save_model"]

FORMAT = "gpflow-fed-model/1"
WHAT = "gpflow-fed model file (save_model)"
PathLike = Union[str, "os.PathLike[str]"]


def _float(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
        raise ValueError(f"saved model: {what} must be a finite number, got {value!r}")
    return float(value)


# --- per model: its structure, and a skeleton built from it -------------------------------------------------


def _aggregated_structure(model: Any) -> Dict[str, Any]:
    M, D = (int(n) for n in model.inducing_variable.Z.shape)
    if type(model.inducing_variable) is not gpflow.inducing_variables.InducingPoints:
        raise TypeError("cannot save an AggregatedSGPR whose inducing variable is not InducingPoints")
    return {
        "kernel": kernel_structure(model.kernel),
        "num_inducing": M,
        "input_dim": D,
        "output_dim": int(model.kuf_y.shape[1]),
        "whitened": bool(model.whitened),
        "bound_statistics": bool(model.has_bound_statistics),
        "variance_lower_bound": float(model.likelihood.variance_lower_bound),
    }


def _aggregated_build(s: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Any:
    from .aggregated_sgpr import AggregatedSGPR

    M = saved_integer(s["num_inducing"], "num_inducing", 1)
    D, P = saved_integer(s["input_dim"], "input_dim", 1), saved_integer(s["output_dim"], "output_dim", 1)
    scalars: Dict[str, Any] = (
        {k: 0.0 for k in ("num_data", "y_squared_sum", "trace_kff")} if s["bound_statistics"] else {}
    )
    model = AggregatedSGPR(
        build_kernel(s["kernel"]), skeleton_array((M, D), "Z"), 1.0, skeleton_array((M, M), "kuf_kfu"),
        skeleton_array((M, P), "kuf_y"),
        whitened=bool(s["whitened"]), **scalars,
    )  # fmt: skip
    model.likelihood = build_likelihood({"class": "Gaussian", "variance_lower_bound": s["variance_lower_bound"]})
    return model


def _dpo_structure(model: Any) -> Dict[str, Any]:
    from ..inducing_variables import PseudoObservations

    if not isinstance(model.mean_function, gpflow.mean_functions.Zero):
        raise TypeError("cannot save a FederatedDPOSVGP with a mean function")
    pseudo = model.pseudo
    if isinstance(pseudo, PseudoObservations):
        part: Dict[str, Any] = {"class": "PseudoObservations", "num_pseudo": pseudo.num_pseudo}
        part.update(full_S=bool(pseudo.full_S), input_dim=int(pseudo.V.shape[1]))
    else:
        part = {"class": "NaturalFactor", "num_pseudo": int(pseudo.eta.shape[0])}
    part["Z"] = None if pseudo.Z is None else [int(n) for n in pseudo.Z.shape]
    q_Z = model.q_Z
    q_beta = model.q_beta
    return {
        "kernel": kernel_structure(model.kernel),
        "likelihood": likelihood_structure(model.likelihood),
        "pseudo": part,
        "q_Z": None if q_Z is None else [int(n) for n in q_Z.Z_mean.shape],
        "q_beta": None if q_beta is None else [q_beta.num_hyper, int(q_beta.input_dim)],
        "alpha": model.alpha,
        "num_samples": model.num_samples,
        "num_predict_samples": model.num_predict_samples,
        "seed": model.seed,
        "jitter": model.jitter,
        "input_dim": int(model.input_dim),
        "output_dim": 1,
    }


def _dpo_build(s: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Any:
    from ..inducing_variables import GaussianInducingPoints, NaturalFactor, PseudoObservations
    from ..posteriors import LogNormalHyperparameters
    from .dpo_svgp import FederatedDPOSVGP

    part = saved_fields(s["pseudo"], "pseudo-observations", ["class", "num_pseudo", "Z"])
    J = saved_integer(part["num_pseudo"], "num_pseudo", 1)
    Z = None if part["Z"] is None else skeleton_array([saved_integer(n, "Z shape", 1) for n in part["Z"]], "Z")
    if part["class"] == "PseudoObservations":
        D = saved_integer(saved_fields(part, "pseudo-observations", ["input_dim"])["input_dim"], "input_dim", 1)
        S = skeleton_array((J, J), "S", "eye") if part.get("full_S") else skeleton_array((J,), "S", "ones")
        pseudo: Any = PseudoObservations(skeleton_array((J, D), "V"), skeleton_array((J,), "y"), S, Z=Z)
    elif part["class"] == "NaturalFactor":
        pseudo = NaturalFactor(skeleton_array((J, 1), "eta"), skeleton_array((J, J), "factor"), Z=Z)
    else:
        raise ValueError(f"saved model: unknown pseudo-observation class {part['class']!r}")
    q_Z = None
    if s["q_Z"] is not None:
        M, D = (saved_integer(n, "q_Z shape", 1) for n in s["q_Z"])
        q_Z = GaussianInducingPoints(skeleton_array((M, D), "q_Z"), 1.0)
    q_beta = None
    if s["q_beta"] is not None:
        H, D = (saved_integer(n, "q_beta shape", 1) for n in s["q_beta"])
        q_beta = LogNormalHyperparameters(skeleton_array((H,), "q_beta"), 1.0, D)
    return FederatedDPOSVGP(
        build_kernel(s["kernel"]), build_likelihood(s["likelihood"]), pseudo, q_Z, q_beta,
        alpha=_float(s["alpha"], "alpha"), num_samples=saved_integer(s["num_samples"], "num_samples", 1),
        num_predict_samples=saved_integer(s["num_predict_samples"], "num_predict_samples", 1),
        seed=saved_integer(s["seed"], "seed"), jitter=_float(s["jitter"], "jitter"),
    )  # fmt: skip


def _blr_structure(model: Any) -> Dict[str, Any]:
    if model.data is not None:
        raise TypeError(
            "cannot save a BayesianLinearRegression that holds its data: build it with from_statistics (a saved "
            "model holds no rows)"
        )
    stats = model.statistics()
    return {
        "kernel": kernel_structure(model.kernel),
        "num_features": int(stats["phi_t_phi"].shape[0]),
        "input_dim": int(model.kernel.input_dim),
        "output_dim": int(stats["phi_t_y"].shape[1]),
    }


def _blr_build(s: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Any:
    from .bayesian_linear_regression import BayesianLinearRegression

    kernel = build_kernel(s["kernel"])
    L, P = saved_integer(s["num_features"], "num_features", 1), saved_integer(s["output_dim"], "output_dim", 1)
    if getattr(kernel, "num_features", None) != L:
        raise ValueError(f"saved model: the kernel has {getattr(kernel, 'num_features', None)} features, not {L}")
    stats = {
        "phi_t_phi": skeleton_array((L, L), "phi_t_phi", "eye"),
        "phi_t_y": skeleton_array((L, P), "phi_t_y"),
        "y_t_y": skeleton_array((P,), "y_t_y"),
        "num_data": 1.0,
    }
    return BayesianLinearRegression.from_statistics(stats, kernel)


def _ensemble_structure(model: Any) -> Dict[str, Any]:
    if model.data is not None:
        raise TypeError("cannot save an EnsembleSVGP that holds data (data=...): a saved model holds no rows")
    M, D = (int(n) for n in model.inducing_variable.Z.shape)
    return {
        "kernel": kernel_structure(model.kernel),
        "likelihood": likelihood_structure(model.likelihood),
        "num_inducing": M,
        "input_dim": D,
        "output_dim": 1,
        "local_models": len(model.local_models),
        "whiten": bool(model.whiten),
        "kl": model.kl,
        "jitter": model.jitter,
    }


def _ensemble_constants(model: Any) -> Dict[str, np.ndarray]:
    arrays: Dict[str, np.ndarray] = {}
    for i, local in enumerate(model.local_models):
        arrays.update(local.to_arrays(prefix=f"local/{i}/"))
    return arrays


def _ensemble_build(s: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Any:
    from .ensemble_svgp import EnsembleSVGP
    from .recyclable import RecyclableModel

    K = saved_integer(s["local_models"], "local_models", 1)
    locals_ = [RecyclableModel.from_arrays(constants, prefix=f"local/{i}/") for i in range(K)]
    M, D = saved_integer(s["num_inducing"], "num_inducing", 1), saved_integer(s["input_dim"], "input_dim", 1)
    kl = s["kl"] if s["kl"] in ("forward", "reverse") else None
    if kl is None:
        raise ValueError(f"saved model: unknown ensemble kl {s['kl']!r}")
    return EnsembleSVGP(
        locals_, build_kernel(s["kernel"]), skeleton_array((M, D), "Z"), build_likelihood(s["likelihood"]),
        whiten=bool(s["whiten"]), kl=kl, jitter=_float(s["jitter"], "jitter"),
    )  # fmt: skip


Structure = Callable[[Any], Dict[str, Any]]
Builder = Callable[[Mapping[str, Any], Mapping[str, np.ndarray]], Any]
#: class name -> (structure, constants, builder, required structure fields)
_MODELS: Dict[str, Tuple[Structure, Callable[[Any], Dict[str, np.ndarray]], Builder, Tuple[str, ...]]] = {
    "AggregatedSGPR": (
        _aggregated_structure, lambda m: {}, _aggregated_build,
        ("kernel", "num_inducing", "input_dim", "output_dim", "whitened", "bound_statistics", "variance_lower_bound"),
    ),
    "FederatedDPOSVGP": (
        _dpo_structure, lambda m: {}, _dpo_build,
        ("kernel", "likelihood", "pseudo", "q_Z", "q_beta", "alpha", "num_samples", "num_predict_samples", "seed",
         "jitter"),
    ),
    "BayesianLinearRegression": (
        _blr_structure, lambda m: {}, _blr_build, ("kernel", "num_features", "output_dim")
    ),
    "EnsembleSVGP": (
        _ensemble_structure, _ensemble_constants, _ensemble_build,
        ("kernel", "likelihood", "num_inducing", "input_dim", "local_models", "whiten", "kl", "jitter"),
    ),
}  # fmt: skip


def register_model(
    name: str,
    structure: Structure,
    constants: Callable[[Any], Dict[str, np.ndarray]],
    build: Builder,
    required: Tuple[str, ...],
) -> None:
    """Let :func:`save_model`/:func:`load_model` handle the package's model class ``name`` (a model defined above this
    module registers itself, e.g. :class:`~gpflow_fed.models.StandardizedModel`)."""
    _MODELS[name] = (structure, constants, build, required)


def _class_name(model: Any) -> str:
    name = type(model).__name__
    if name not in _MODELS or type(model).__module__.split(".")[0] != "gpflow_fed":
        raise TypeError(
            f"save_model cannot save a {name}: supported are {', '.join(_MODELS)} (export any model with "
            "export_saved_model)"
        )
    return name


def model_structure(model: Any) -> Dict[str, Any]:
    """The JSON description of a registered model (its class and structure), as a saved file's header holds it."""
    name = _class_name(model)
    return {"class": name, **_MODELS[name][0](model)}


def model_constants(model: Any) -> Dict[str, np.ndarray]:
    """The arrays a registered model is built from that are not variables (saved beside its variables)."""
    return _MODELS[_class_name(model)][1](model)


def build_model(structure: Any, constants: Mapping[str, np.ndarray]) -> Any:
    """A new model of the described structure (:func:`model_structure`), its variables not yet restored."""
    name = saved_fields(structure, "model", ["class"])["class"]
    if name not in _MODELS:
        raise ValueError(f"saved model: unknown model class {name!r}; this package reads {', '.join(_MODELS)}")
    _, _, build, required = _MODELS[name]
    return build(saved_fields(structure, name, required), constants)


# --- files -------------------------------------------------------------------------------------------------


def _npz(path: PathLike) -> Path:
    out = Path(path)
    return out if out.suffix == ".npz" else out.with_name(out.name + ".npz")


def _assign(model: Any, values: Mapping[str, np.ndarray], trainable: Mapping[str, bool], where: str) -> None:
    """Fill ``model``'s variables from ``values`` after checking names, shapes and dtypes."""
    variables = named_variables(model)
    missing = sorted(set(variables) - set(values))
    unexpected = sorted(set(values) - set(variables))
    if missing or unexpected:
        raise ValueError(
            f"{where}: the variables do not match the model it describes (missing {missing[:5]}, unexpected "
            f"{unexpected[:5]})"
        )
    for path, (variable, _) in variables.items():
        value = values[path]
        if value.dtype != variable.dtype.as_numpy_dtype or tuple(value.shape) != tuple(variable.shape):
            raise ValueError(
                f"{where}: variable {path} is {value.dtype}{list(value.shape)}, the model needs "
                f"{variable.dtype.name}{variable.shape.as_list()}"
            )
        if not np.all(np.isfinite(value)):
            raise ValueError(f"{where}: variable {path} holds NaN or inf values")
    for path, (variable, _) in variables.items():
        variable.assign(values[path])
        if path in trainable:
            variable._trainable = bool(trainable[path])  # what gpflow.set_trainable sets


def _from_arrays(arrays: Mapping[str, np.ndarray], where: str) -> Any:
    structure = arrays["structure"]
    if structure.dtype.kind != "U" or structure.ndim != 0:
        raise ValueError(f"{where}: unreadable structure (not a JSON text)")
    header = saved_fields(parse_json(str(structure), f"{where}: unreadable structure"), "file", ["model", "trainable"])
    trainable = header["trainable"]
    if not isinstance(trainable, Mapping) or not all(isinstance(v, bool) for v in trainable.values()):
        raise ValueError(f"{where}: 'trainable' must map variable names to true/false")
    constants = {k[len("constants/") :]: v for k, v in arrays.items() if k.startswith("constants/")}
    values = {k[len("variables/") :]: v for k, v in arrays.items() if k.startswith("variables/")}
    try:
        with allocation_budget(arrays):
            model = build_model(header["model"], constants)
    except (TypeError, KeyError, AttributeError, IndexError, tf.errors.InvalidArgumentError) as exc:
        raise ValueError(f"{where}: the model it describes cannot be built ({type(exc).__name__}: {exc})") from exc
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc
    _assign(model, values, trainable, where)
    return model


def save_model(model: Any, path: PathLike) -> Path:
    """Write ``model`` to one ``.npz`` file (``.npz`` appended when missing; parent folders created).

    :param model: a model :func:`load_model` supports (module docstring), typically ``fit(...).model``.
    :return: the path written.
    :raises TypeError: a model, kernel, likelihood or network the format does not cover, or a model that holds
        its training data.
    """
    variables = named_variables(model)
    arrays: Dict[str, np.ndarray] = {f"variables/{p}": v.numpy() for p, (v, _) in variables.items()}
    arrays.update({f"constants/{k}": np.asarray(v) for k, v in model_constants(model).items()})
    trainable = {
        p: bool(v.trainable) for p, (v, param) in variables.items() if not p.split(".")[-1].startswith("weights[")
    }
    header = {"model": model_structure(model), "trainable": trainable}
    arrays["structure"] = np.array(json.dumps(header))
    arrays["format"] = np.array(FORMAT)
    rebuilt = _from_arrays(arrays, "save_model")  # a file that cannot be read back is never written
    for p, (v, param) in named_variables(rebuilt).items():
        original = variables[p][1]
        # the rebuilt model has the same structure: a Parameter where the original has one
        if original is not None and not np.array_equal(cast(gpflow.Parameter, param).numpy(), original.numpy()):
            raise TypeError(f"cannot save {p}: its parameter uses a transform the file format does not record")
    out = _npz(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, **arrays)
    return out


def load_model(path: PathLike) -> Any:
    """Read a model written by :func:`save_model` (nothing unpickled; names, shapes and dtypes checked).

    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: naming the file: not a model file of this package, corrupt, or describing a model
        whose variables differ from those stored.
    """
    return _from_arrays(read_npz(path, WHAT, FORMAT, ("structure",)), str(path))


def _dims(model: Any) -> Tuple[int, int]:
    structure = model_structure(model)
    return int(structure["input_dim"]), int(structure["output_dim"])


def export_saved_model(model: Any, path: PathLike) -> Path:
    """Write ``model`` as a ``tf.saved_model`` with concrete ``predict_f(X)``, ``predict_y(X)`` and
    ``predict_log_density(X, Y)`` (``X: [None, D]``, ``Y: [None, P]``, ``gpflow.default_float()``).

    Monte Carlo predictions (PVI with q(Z) or q(β)) use the model's stored seed, so the exported functions
    return what the model returns. Load with ``tf.saved_model.load(path)``.

    :return: the folder written.
    """
    D, P = _dims(model)
    dtype = gpflow.default_float()
    x_spec, y_spec = tf.TensorSpec([None, D], dtype, name="X"), tf.TensorSpec([None, P], dtype, name="Y")
    holder = tf.Module()
    holder.model = model
    holder.predict_f = tf.function(lambda X: model.predict_f(X), input_signature=[x_spec])
    holder.predict_y = tf.function(lambda X: model.predict_y(X), input_signature=[x_spec])
    holder.predict_log_density = tf.function(
        lambda X, Y: model.predict_log_density((X, Y)), input_signature=[x_spec, y_spec]
    )
    out = Path(path)
    tf.saved_model.save(holder, str(out))
    return out

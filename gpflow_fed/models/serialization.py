"""Serialisation helpers: the one home of how the package writes GPflow objects to files and reads them back.

Nothing here unpickles anything. A file is numbers (``numpy`` arrays) and JSON text, and a reader rebuilds
objects only from a closed list of classes, checking every value it is given:

* :func:`read_npz` reads a package ``.npz`` file eagerly under ``allow_pickle=False`` and turns every kind of
  damage into one ``ValueError`` naming the file;
* :func:`kernel_spec` / :func:`kernel_from_spec` and :func:`likelihood_spec` / :func:`likelihood_from_spec`
  describe a stationary kernel's or a likelihood's *values* as JSON (recyclable models, Recycle's messages);
* :func:`kernel_structure` / :func:`build_kernel` and :func:`likelihood_structure` / :func:`build_likelihood`
  describe a kernel's or likelihood's *structure* (classes, shapes, fixed settings: no trained values) as JSON
  and rebuild a skeleton from it, whose variables are then filled from the file (:mod:`.saving`);
* :func:`named_variables` names every variable of a module by its attribute path, the keys under which a
  model file stores values.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union, cast

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from ..untrusted_files import MAX_BYTES, read_npz_arrays

__all__ = [
    "KERNELS",
    "LINKS",
    "allocation_budget",
    "build_kernel",
    "build_likelihood",
    "kernel_from_spec",
    "kernel_spec",
    "kernel_structure",
    "likelihood_from_spec",
    "likelihood_spec",
    "likelihood_structure",
    "named_variables",
    "read_npz",
    "skeleton_array",
]

# --- reading files -----------------------------------------------------------------------------------------


def read_npz(
    path: Union[str, os.PathLike], what: str, format_tag: str, required: Sequence[str] = (), max_bytes: int = MAX_BYTES
) -> Dict[str, np.ndarray]:
    """Every array of the ``.npz`` at ``path``, after checking its format tag and required members.

    The file is read by :func:`~gpflow_fed.untrusted_files.read_npz_arrays`: member names, sizes, dtypes and shapes
    are checked from the archive's structure before any array is allocated (a 1.7 KB file declaring a
    ``10⁶ × 10⁶`` array is refused, not allocated), and the cost of reading is linear in the file. A file can be
    truncated, bit-flipped (each member carries a CRC-32), incomplete, hold pickled objects or be another kind of
    file; each becomes one ``ValueError`` naming the file and the problem; only a missing file keeps its
    ``FileNotFoundError``.

    :param what: the kind of file, for messages (e.g. ``"PrivacyAwareGPR file (PrivacyAwareGPR.save)"``).
    :param format_tag: the expected value of the file's ``format`` member.
    :param required: members that must be present besides ``format``.
    :param max_bytes: bound on the members' total declared size.
    :raises FileNotFoundError: ``path`` does not exist.
    :raises ValueError: an unreadable or oversized file, another format tag, or a missing required member.
    """
    arrays = read_npz_arrays(path, what, max_bytes)
    tag = arrays.get("format")
    if tag is None or tag.dtype.kind != "U" or str(tag) != format_tag:
        found = "none" if tag is None else repr(str(tag)[:80])
        raise ValueError(f"{path}: incompatible file format {found}, expected {format_tag!r}: not a {what}")
    missing = [name for name in required if name not in arrays]
    if missing:
        raise ValueError(f"{path}: incomplete file, missing arrays {missing} (not a complete {what})")
    return arrays


#: the number of values a skeleton built from a file may allocate at once (None: unbounded, e.g. when saving)
_BUDGET: "contextvars.ContextVar[Optional[int]]" = contextvars.ContextVar("gpflow_fed_skeleton_budget", default=None)
#: values every skeleton may allocate whatever the file holds (scalars, small defaults)
BUDGET_SLACK = 4096


@contextlib.contextmanager
def allocation_budget(arrays: Mapping[str, np.ndarray]) -> Iterator[int]:
    """Bound every :func:`skeleton_array` built inside the block by the number of values ``arrays`` hold.

    A file describes its model's sizes in its JSON structure; a model is built from that structure before its
    variables are checked against the file, so a structure claiming ``num_inducing = 10⁶`` would allocate
    ``10⁶ × 10⁶`` values from a file of a few kilobytes. A genuine file stores every variable of its model, so no
    array of the skeleton holds more values than the file stores: the budget is the file's total number of stored
    values plus :data:`BUDGET_SLACK`.

    :return: (as the ``with`` target) the budget.
    """
    budget = int(sum(int(np.asarray(a).size) for a in arrays.values())) + BUDGET_SLACK
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def skeleton_array(shape: Sequence[int], what: str, fill: str = "zeros") -> np.ndarray:
    """A placeholder array of ``shape`` (``fill``: ``"zeros"``, ``"ones"`` or ``"eye"``, square shapes) for a model
    skeleton, after checking its size against the current :func:`allocation_budget`.

    :raises ValueError: the array would hold more values than the file being read stores.
    """
    dims = tuple(int(n) for n in shape)
    count = 1
    for n in dims:
        count *= n
    budget = _BUDGET.get()
    if budget is not None and count > budget:
        raise ValueError(
            f"saved model: {what} of shape {list(dims)} needs {count} values, more than the file stores "
            f"({budget - BUDGET_SLACK}): the structure does not describe the arrays stored"
        )
    if fill == "eye":
        return np.eye(dims[0])
    return np.ones(dims) if fill == "ones" else np.zeros(dims)


# --- value specs (recyclable models and Recycle's messages) ------------------------------------------------

KERNELS = ("SquaredExponential", "Matern12", "Matern32", "Matern52")
LINKS = {"logistic": tf.sigmoid, "probit": gpflow.likelihoods.utils.inv_probit, "exp": tf.exp}


def kernel_spec(kernel: gpflow.kernels.Kernel) -> Dict[str, Any]:
    """A JSON-able description of a stationary kernel's values ``θ = (σ², ℓ)``.

    :raises TypeError: for kernels other than SquaredExponential / Matern12 / Matern32 / Matern52, or with
        ``active_dims`` set (wrap such kernels yourself and persist them by other means).
    """
    name = type(kernel).__name__
    if name not in KERNELS or not isinstance(kernel, gpflow.kernels.Stationary):
        raise TypeError(f"cannot export kernel {name}: supported kernels are {', '.join(KERNELS)}")
    if not isinstance(kernel.active_dims, slice) or kernel.active_dims != slice(None, None, None):
        raise TypeError(f"cannot export kernel {name} with active_dims={kernel.active_dims}; use all input dimensions")
    lengthscales = np.atleast_1d(kernel.lengthscales.numpy()).astype(float)
    return {"class": name, "variance": float(kernel.variance.numpy()), "lengthscales": lengthscales.tolist()}


def kernel_from_spec(spec: Mapping[str, Any]) -> gpflow.kernels.Kernel:
    """Rebuild a kernel from :func:`kernel_spec` output; raises ``ValueError`` for an invalid spec."""
    try:
        name, variance, lengthscales = spec["class"], float(spec["variance"]), spec["lengthscales"]
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"invalid kernel spec {spec!r}: needs class, variance and lengthscales") from exc
    if name not in KERNELS:
        raise ValueError(f"unknown kernel class {name!r} in saved model; supported: {', '.join(KERNELS)}")
    ell: np.ndarray = np.asarray(lengthscales, dtype=gpflow.default_float())
    if ell.ndim != 1 or ell.size == 0 or variance <= 0 or np.any(ell <= 0) or not np.all(np.isfinite(ell)):
        raise ValueError(f"invalid kernel hyperparameters in saved model: variance={variance}, lengthscales={ell}")
    return getattr(gpflow.kernels, name)(variance=variance, lengthscales=ell if ell.size > 1 else float(ell[0]))


def _link_name(invlink: Any) -> str:
    for name, fn in LINKS.items():
        if invlink is fn:
            return name
    raise TypeError(f"cannot export likelihood link {invlink!r}: supported links are {', '.join(LINKS)}")


def likelihood_spec(likelihood: Optional[gpflow.likelihoods.Likelihood]) -> Optional[Dict[str, Any]]:
    """A JSON-able description of a Gaussian, Bernoulli or Poisson likelihood (``None`` passes through).

    :raises TypeError: for other likelihoods or links.
    """
    if likelihood is None:
        return None
    if isinstance(likelihood, gpflow.likelihoods.Gaussian):
        # a Gaussian built with variance_function has no variance Parameter: not supported (AttributeError as before)
        return {"class": "Gaussian", "variance": float(cast(gpflow.Parameter, likelihood.variance).numpy())}
    if isinstance(likelihood, (gpflow.likelihoods.Bernoulli, gpflow.likelihoods.Poisson)):
        return {"class": type(likelihood).__name__, "invlink": _link_name(likelihood.invlink)}
    raise TypeError(f"cannot export likelihood {type(likelihood).__name__}: supported are Gaussian, Bernoulli, Poisson")


def likelihood_from_spec(spec: Optional[Mapping[str, Any]]) -> Optional[gpflow.likelihoods.Likelihood]:
    """Rebuild a likelihood from :func:`likelihood_spec` output; raises ``ValueError`` for an invalid spec."""
    if spec is None:
        return None
    name = spec.get("class") if isinstance(spec, Mapping) else None
    if name == "Gaussian":
        variance = float(spec.get("variance", -1.0))
        if not variance > 0:
            raise ValueError(f"invalid Gaussian likelihood variance {variance} in saved model")
        return gpflow.likelihoods.Gaussian(variance=variance)
    if name in ("Bernoulli", "Poisson"):
        link = spec.get("invlink")
        if link not in LINKS:
            raise ValueError(f"unknown likelihood link {link!r} in saved model; supported: {', '.join(LINKS)}")
        return getattr(gpflow.likelihoods, name)(invlink=LINKS[link])
    raise ValueError(f"unknown likelihood spec {spec!r} in saved model")


# --- structures: what to build, without the trained values -------------------------------------------------

#: stationary kernels with (variance, lengthscales); RationalQuadratic adds alpha.
STATIONARY = ("SquaredExponential", "Matern12", "Matern32", "Matern52", "Exponential", "RationalQuadratic")
#: kernels with a variance only.
SCALAR_KERNELS = ("Linear", "Constant", "White")
FEATURE_MAPS = ("FourierFeatureMap", "ExponentialFeatureMap", "PolynomialFeatureMap")
ACTIVATIONS = ("linear", "relu", "tanh", "sigmoid", "softplus", "elu", "selu", "swish", "gelu")


def saved_integer(value: Any, what: str, minimum: int = 0) -> int:
    """``value``, a saved file's integer ≥ ``minimum`` (not a bool); a ``ValueError`` naming ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"saved model: {what} must be an integer ≥ {minimum}, got {value!r}")
    return value


def _choice(value: Any, choices: Sequence[str], what: str) -> str:
    if value not in choices:
        raise ValueError(f"saved model: unknown {what} {value!r}; expected one of {', '.join(map(str, choices))}")
    return str(value)


def _shape(value: Any, what: str) -> Tuple[int, ...]:
    if not isinstance(value, list) or len(value) > 2:
        raise ValueError(f"saved model: {what} must be a shape (a list of at most 2 integers), got {value!r}")
    return tuple(saved_integer(v, what, 1) for v in value)


def saved_fields(structure: Any, what: str, names: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(structure, Mapping):
        raise ValueError(f"saved model: the {what} description must be a JSON object, got {type(structure).__name__}")
    missing = [n for n in names if n not in structure]
    if missing:
        raise ValueError(f"saved model: the {what} description lacks {missing}")
    return structure


def _active_dims(kernel: gpflow.kernels.Kernel) -> Optional[List[int]]:
    dims = kernel.active_dims
    if isinstance(dims, slice):
        if dims == slice(None, None, None):
            return None
        raise TypeError(f"cannot save {type(kernel).__name__} with active_dims={dims}: give a list of columns")
    return [int(d) for d in np.asarray(dims).ravel()]


def _dims_from(structure: Mapping[str, Any]) -> Optional[List[int]]:
    dims = structure.get("active_dims")
    if dims is None:
        return None
    if not isinstance(dims, list) or not dims:
        raise ValueError(f"saved model: active_dims must be a non-empty list of columns, got {dims!r}")
    return [saved_integer(d, "an active dimension") for d in dims]


def kernel_structure(kernel: gpflow.kernels.Kernel) -> Dict[str, Any]:
    """The JSON-able structure of ``kernel``: classes, parameter shapes and fixed settings, no trained values.

    Supported: SquaredExponential, Matern12/32/52, Exponential, RationalQuadratic, Linear, Constant, White,
    Periodic, Sum, Product, and :class:`~gpflow_fed.kernels.URK` (Fourier, exponential or polynomial map; a
    ``Sequential`` of ``Dense`` layers as feature extractor; the :func:`~gpflow_fed.kernels.distribution_shifter`
    networks).

    :raises TypeError: any other kernel, feature map or network (persist such a model with
        ``tf.saved_model`` instead).
    """
    name = type(kernel).__name__
    if name in STATIONARY and type(kernel) is getattr(gpflow.kernels, name):
        shape = list(np.shape(kernel.lengthscales.numpy()))
        return {"class": name, "lengthscales": shape, "active_dims": _active_dims(kernel)}
    if name in SCALAR_KERNELS and type(kernel) is getattr(gpflow.kernels, name):
        return {"class": name, "active_dims": _active_dims(kernel)}
    if type(kernel) is gpflow.kernels.Periodic:
        return {"class": "Periodic", "base": kernel_structure(kernel.base_kernel)}
    if type(kernel) in (gpflow.kernels.Sum, gpflow.kernels.Product):
        return {"class": name, "kernels": [kernel_structure(k) for k in kernel.kernels]}
    from ..kernels import URK

    if type(kernel) is URK:
        return _urk_structure(kernel)
    raise TypeError(
        f"cannot save a {name} kernel: supported are {', '.join((*STATIONARY, *SCALAR_KERNELS))}, Periodic, Sum, "
        "Product and URK (export other models with tf.saved_model)"
    )


def _urk_structure(kernel: Any) -> Dict[str, Any]:
    feature_map = kernel.feature_map
    kind = type(feature_map).__name__
    if kind not in FEATURE_MAPS:
        raise TypeError(f"cannot save a URK with a {kind}: supported feature maps are {', '.join(FEATURE_MAPS)}")
    fmap: Dict[str, Any] = {"class": kind}
    if kind == "FourierFeatureMap":
        fmap.update(lengthscales=list(np.shape(feature_map.lengthscales.numpy())), spectral=feature_map.spectral)
        fmap["nu"] = feature_map.nu
    elif kind == "PolynomialFeatureMap":
        fmap["degree"] = int(feature_map.degree)
    return {
        "class": "URK",
        "input_dim": int(kernel.input_dim),
        "num_samples": int(kernel.num_samples),
        "seed": int(kernel.seed),
        "scaling": kernel.scaling,
        "feature_map": fmap,
        "feature_extractor": None if kernel.feature_extractor is None else _dense_stack(kernel.feature_extractor),
        "distribution_shifter": None if kernel.distribution_shifter is None else _shifter(kernel.distribution_shifter),
        "active_dims": _active_dims(kernel),
    }


def _dense_layer(layer: Any) -> Dict[str, Any]:
    activation = getattr(layer.activation, "__name__", None)
    if type(layer) is not tf_keras.layers.Dense or activation not in ACTIVATIONS:
        raise TypeError(f"cannot save a network layer {type(layer).__name__} (activation {activation})")
    return {"units": int(layer.units), "activation": activation, "use_bias": bool(layer.use_bias)}


def _dense_stack(network: Any) -> List[Dict[str, Any]]:
    if type(network) is not tf_keras.Sequential:
        raise TypeError(f"cannot save a feature extractor {type(network).__name__}: a Sequential of Dense layers is")
    return [_dense_layer(layer) for layer in network.layers]


def _shifter(network: Any) -> Dict[str, Any]:
    """The two :func:`~gpflow_fed.kernels.distribution_shifter` shapes: linear, or identity plus a tanh layer."""
    layers = [layer for layer in network.layers if not isinstance(layer, tf_keras.layers.InputLayer)]
    kinds = [type(layer).__name__ for layer in layers]
    if kinds == ["Dense"] and _dense_layer(layers[0])["activation"] == "linear":
        return {"hidden": 0}
    if kinds == ["Dense", "Dense", "Add"] and _dense_layer(layers[0])["activation"] == "tanh":
        return {"hidden": int(layers[0].units)}
    raise TypeError(f"cannot save a distribution shifter with layers {kinds}: build it with distribution_shifter()")


def build_kernel(structure: Any) -> gpflow.kernels.Kernel:
    """A kernel with the given :func:`kernel_structure` and placeholder values (the caller assigns the values).

    :raises ValueError: an unknown class or a malformed field, naming it.
    """
    name = saved_fields(structure, "kernel", ["class"])["class"]
    if name in STATIONARY:
        shape = _shape(saved_fields(structure, name, ["lengthscales"])["lengthscales"], "lengthscales")
        ell = skeleton_array(shape, "lengthscales", "ones")
        kernel = getattr(gpflow.kernels, name)(lengthscales=ell, active_dims=_dims_from(structure))
        return kernel
    if name in SCALAR_KERNELS:
        return getattr(gpflow.kernels, name)(active_dims=_dims_from(structure))
    if name == "Periodic":
        base = build_kernel(saved_fields(structure, name, ["base"])["base"])
        if not isinstance(base, gpflow.kernels.IsotropicStationary):
            raise ValueError("saved model: a Periodic kernel needs a stationary base kernel")
        return gpflow.kernels.Periodic(base)
    if name in ("Sum", "Product"):
        parts = saved_fields(structure, name, ["kernels"])["kernels"]
        if not isinstance(parts, list) or len(parts) < 2:
            raise ValueError(f"saved model: a {name} kernel needs a list of at least two kernels")
        return getattr(gpflow.kernels, name)([build_kernel(part) for part in parts])
    if name == "URK":
        return _build_urk(structure)
    raise ValueError(f"saved model: unknown kernel class {name!r}")


def _build_urk(structure: Mapping[str, Any]) -> gpflow.kernels.Kernel:
    from ..kernels import URK, distribution_shifter

    fields = ["input_dim", "num_samples", "seed", "scaling", "feature_map", "feature_extractor", "distribution_shifter"]
    s = saved_fields(structure, "URK", fields)
    input_dim = saved_integer(s["input_dim"], "URK input_dim", 1)
    fmap = saved_fields(s["feature_map"], "feature map", ["class"])
    kind = _choice(fmap["class"], FEATURE_MAPS, "feature map")
    options: Dict[str, Any] = {}
    if kind == "FourierFeatureMap":
        saved_fields(fmap, kind, ["lengthscales", "spectral", "nu"])
        nu = fmap["nu"]
        if not isinstance(nu, (int, float)) or not nu > 0:
            raise ValueError(f"saved model: Fourier feature map nu must be positive, got {nu!r}")
        shape = _shape(fmap["lengthscales"], "feature map lengthscales")
        options = dict(
            lengthscales=skeleton_array(shape, "feature map lengthscales", "ones"),
            spectral=_choice(fmap["spectral"], ("gaussian", "student_t"), "spectral"),
            nu=float(nu),
        )
    elif kind == "PolynomialFeatureMap":
        options = dict(degree=saved_integer(saved_fields(fmap, kind, ["degree"])["degree"], "polynomial degree", 1))
    names = {
        "FourierFeatureMap": "fourier",
        "ExponentialFeatureMap": "exponential",
        "PolynomialFeatureMap": "polynomial",
    }
    extractor = None if s["feature_extractor"] is None else _build_dense_stack(s["feature_extractor"])
    feature_dim = input_dim if extractor is None else extractor.layers[-1].units
    shifter = None
    if s["distribution_shifter"] is not None:
        hidden = saved_integer(
            saved_fields(s["distribution_shifter"], "shifter", ["hidden"])["hidden"], "shifter hidden"
        )
        q = feature_dim + 1 if kind == "PolynomialFeatureMap" else feature_dim
        shifter = distribution_shifter(q, hidden=hidden)
    return URK(
        input_dim,
        num_samples=saved_integer(s["num_samples"], "URK num_samples", 2),
        feature_map=names[kind],
        feature_extractor=extractor,
        distribution_shifter=shifter,
        seed=saved_integer(s["seed"], "URK seed"),
        scaling=_choice(s["scaling"], ("m-1", "m"), "URK scaling"),
        feature_map_options=options,
        active_dims=_dims_from(s),
    )


def _build_dense_stack(layers: Any) -> Any:
    if not isinstance(layers, list) or not layers:
        raise ValueError("saved model: a feature extractor must be a non-empty list of Dense layers")
    dtype = gpflow.default_float()
    built = []
    for layer in layers:
        f = saved_fields(layer, "Dense layer", ["units", "activation", "use_bias"])
        built.append(
            tf_keras.layers.Dense(
                saved_integer(f["units"], "Dense units", 1),
                activation=_choice(f["activation"], ACTIVATIONS, "activation"),
                use_bias=bool(f["use_bias"]),
                dtype=dtype,
            )
        )
    return tf_keras.Sequential(built)


def likelihood_structure(likelihood: gpflow.likelihoods.Likelihood) -> Dict[str, Any]:
    """The JSON-able structure of a Gaussian (with its variance floor), Bernoulli or Poisson likelihood.

    :raises TypeError: any other likelihood or link.
    """
    if type(likelihood) is gpflow.likelihoods.Gaussian:
        if not isinstance(likelihood.variance, gpflow.Parameter):
            raise TypeError("cannot save a Gaussian likelihood whose variance is a function of the inputs")
        return {"class": "Gaussian", "variance_lower_bound": float(likelihood.variance_lower_bound)}
    if type(likelihood) in (gpflow.likelihoods.Bernoulli, gpflow.likelihoods.Poisson):
        return {"class": type(likelihood).__name__, "invlink": _link_name(likelihood.invlink)}
    raise TypeError(f"cannot save a {type(likelihood).__name__} likelihood: supported are Gaussian, Bernoulli, Poisson")


def build_likelihood(structure: Any) -> gpflow.likelihoods.Likelihood:
    """A likelihood with the given :func:`likelihood_structure` (values assigned by the caller)."""
    name = _choice(
        saved_fields(structure, "likelihood", ["class"])["class"], ("Gaussian", "Bernoulli", "Poisson"), "likelihood"
    )
    if name == "Gaussian":
        bound = saved_fields(structure, name, ["variance_lower_bound"])["variance_lower_bound"]
        if not isinstance(bound, (int, float)) or not 0 <= bound < 1:
            raise ValueError(f"saved model: Gaussian variance_lower_bound must be in [0, 1), got {bound!r}")
        return gpflow.likelihoods.Gaussian(variance=1.0, variance_lower_bound=float(bound))
    link = _choice(saved_fields(structure, name, ["invlink"])["invlink"], tuple(LINKS), "likelihood link")
    return getattr(gpflow.likelihoods, name)(invlink=LINKS[link])


# --- variables by name --------------------------------------------------------------------------------------

Named = Dict[str, Tuple[tf.Variable, Optional[gpflow.Parameter]]]


def named_variables(module: tf.Module) -> Named:
    """Every variable of ``module`` under a stable name: ``{path: (variable, parameter or None)}``.

    The path is the chain of attribute names (``.kernel.lengthscales``; list and dict entries as ``[i]`` /
    ``[key]``). A ``gpflow.Parameter`` contributes its *unconstrained* variable (so a value round-trips
    bit for bit); a ``tf_keras`` layer or model contributes its ``weights`` in order (``.network.weights[0]``),
    whose internal attribute names are not stable. Each variable appears once, under the first path met in
    sorted attribute order, so two objects built the same way give the same names.
    """
    found: Named = {}
    seen_variables: set = set()
    seen_objects: set = set()

    def add(path: str, variable: tf.Variable, parameter: Optional[gpflow.Parameter]) -> None:
        if id(variable) not in seen_variables:
            seen_variables.add(id(variable))
            found[path] = (variable, parameter)

    def visit(obj: Any, path: str) -> None:
        if isinstance(obj, gpflow.Parameter):
            add(path, obj.unconstrained_variable, obj)
        elif isinstance(obj, tf.Variable):
            add(path, obj, None)
        elif isinstance(obj, tf_keras.layers.Layer):
            if id(obj) not in seen_objects:
                seen_objects.add(id(obj))
                for i, weight in enumerate(obj.weights):
                    add(f"{path}.weights[{i}]", weight, None)
        elif isinstance(obj, tf.Module):
            if id(obj) in seen_objects:
                return
            seen_objects.add(id(obj))
            for name in sorted(vars(obj)):
                if not name.startswith(("_self_", "_name_scope")):  # TensorFlow's tracking bookkeeping
                    visit(vars(obj)[name], f"{path}.{name}")
        elif isinstance(obj, (list, tuple)):
            for i, item in enumerate(obj):
                visit(item, f"{path}[{i}]")
        elif isinstance(obj, Mapping) or callable(getattr(obj, "keys", None)):  # dicts, tracked dict wrappers
            for key in sorted(obj.keys(), key=str):
                visit(obj[key], f"{path}[{key}]")

    visit(module, "")
    return found

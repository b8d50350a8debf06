"""A stable key map of a model's shared state, for exchanging GPflow parameters between parties.

GPflow's ``parameter_dict`` paths are unstable for Keras sub-networks (the same weight appears under
several private alias paths), so the wire format is an explicit map from stable keys to public attribute
paths. A path may point to a ``gpflow.Parameter``, a ``tf.Variable`` or a ``tf_keras`` layer/model, whose
weights travel as ``"<key>/0"``, ``"<key>/1"``, ... in ``get_weights()`` order.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

SPACES = ("constrained", "unconstrained")
_SEGMENT = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")


def resolve_path(module: Any, path: str) -> Any:
    """Follow an attribute path such as ``"kernel.kernels[0].lengthscales"`` from ``module``."""
    obj = module
    for segment in path.strip(".").split("."):
        match = _SEGMENT.match(segment)
        if match is None:
            raise KeyError(f"invalid path segment {segment!r} in {path!r}")
        name, indices = match.groups()
        if not hasattr(obj, name):
            raise KeyError(f"{type(obj).__name__} has no attribute {name!r} (path {path!r})")
        obj = getattr(obj, name)
        for index in re.findall(r"\[(\d+)\]", indices):
            obj = obj[int(index)]
    return obj


def _is_public(path: str) -> bool:
    return not any(part.startswith("_") for part in re.split(r"[.\[\]]", path.strip(".")) if part)


class SharedState:
    """The parameters a federation exchanges, under stable wire keys.

    :param paths: wire key → attribute path (a sequence of paths uses each path as its own key).
    :param space: ``"unconstrained"`` exchanges ``Parameter.unconstrained_variable`` values (averaging
        there keeps positive parameters positive); ``"constrained"`` exchanges the parameter values.

    Example::

        shared = SharedState.from_module(model, exclude=("q_mu", "q_sqrt"))
        values = shared.read(client_model)        # client → server
        shared.assign(server_model, values)       # server → client (all-or-nothing)
    """

    def __init__(self, paths: Mapping[str, str] | Sequence[str], space: str = "unconstrained") -> None:
        if space not in SPACES:
            raise ValueError(f"space must be one of {SPACES}, got {space!r}")
        if isinstance(paths, Mapping):
            items = [(str(k), str(v)) for k, v in paths.items()]
        else:
            items = [(str(p).strip("."), str(p)) for p in paths]
        if not items:
            raise ValueError("SharedState needs at least one path")
        self.paths: Dict[str, str] = dict(items)
        self.space = space

    @classmethod
    def from_module(
        cls,
        module: gpflow.Module,
        *,
        trainable_only: bool = True,
        exclude: Sequence[str] = (),
        space: str = "unconstrained",
    ) -> "SharedState":
        """All public parameter paths of ``module`` (private Keras alias paths are skipped), minus any path
        containing one of ``exclude``'s substrings."""
        paths: List[str] = []
        for path, variable in gpflow.utilities.parameter_dict(module).items():
            if not _is_public(path) or any(e in path for e in exclude):
                continue
            if trainable_only and not variable.trainable:
                continue
            paths.append(path)
        return cls(sorted(paths), space=space)

    @property
    def keys(self) -> Tuple[str, ...]:
        return tuple(self.paths)

    def _variables(self, module: Any) -> List[Tuple[str, Any]]:
        """(wire key, variable or Parameter) pairs, expanding Keras layers into their weights."""
        out: List[Tuple[str, Any]] = []
        for key, path in self.paths.items():
            obj = resolve_path(module, path)
            if isinstance(obj, tf_keras.layers.Layer):
                out.extend((f"{key}/{i}", w) for i, w in enumerate(obj.weights))
            elif isinstance(obj, (gpflow.Parameter, tf.Variable)):
                out.append((key, obj))
            else:
                raise TypeError(f"path {path!r} resolves to {type(obj).__name__}, not a parameter, variable or layer")
        return out

    def _backing(self, variable: Any) -> Any:
        if self.space == "unconstrained" and isinstance(variable, gpflow.Parameter):
            return variable.unconstrained_variable
        return variable

    def read(self, module: Any) -> Dict[str, np.ndarray]:
        """The shared values of ``module`` as ``{wire key: array}`` (copies)."""
        return {key: np.array(self._backing(v).numpy()) for key, v in self._variables(module)}

    def assign(self, module: Any, values: Mapping[str, Any]) -> None:
        """Assign ``values`` to ``module``; checks every key, shape and value first, then assigns all.

        :raises KeyError: missing or unexpected keys.
        :raises ValueError: a shape mismatch or a non-finite value.
        """
        targets = self._variables(module)
        expected = {k for k, _ in targets}
        given = set(values)
        if expected != given:
            raise KeyError(
                f"shared-state keys differ: missing {sorted(expected - given)}, unexpected {sorted(given - expected)}"
            )
        prepared = []
        for key, variable in targets:
            backing = self._backing(variable)
            value = np.asarray(values[key])
            if tuple(value.shape) != tuple(backing.shape):
                raise ValueError(f"shared-state key {key!r}: shape {value.shape}, expected {tuple(backing.shape)}")
            if not np.all(np.isfinite(value)):
                raise ValueError(f"shared-state key {key!r} holds non-finite values")
            if self.space == "constrained" and isinstance(variable, gpflow.Parameter):
                unconstrained = (
                    variable.transform.inverse(tf.constant(value, dtype=variable.dtype))
                    if variable.transform
                    else value
                )
                if not np.all(np.isfinite(np.asarray(unconstrained))):
                    raise ValueError(f"shared-state key {key!r}: value outside the parameter's support")
            prepared.append((backing, value))
        for backing, value in prepared:
            backing.assign(tf.cast(value, backing.dtype))

    def flatten(self, values: Mapping[str, np.ndarray]) -> np.ndarray:
        """Concatenate values into one vector, in key order (for DP clipping and norms)."""
        return np.concatenate([np.ravel(values[k]) for k in sorted(values)])

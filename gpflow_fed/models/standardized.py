"""StandardizedModel: a GP trained on standardised data that takes raw inputs and predicts in the target's units.

Federated training standardises every column with moments agreed across the parties
(:meth:`FederatedDataset.standardized <gpflow_fed.data.FederatedDataset.standardized>`): ``x' = (x − μ_X)/σ_X``,
``y' = (y − μ_Y)/σ_Y``. The model ``g`` learnt on those units predicts ``p(y' | x')``; this wrapper folds the
affine maps in, so that with ``x' = (x − μ_X)/σ_X``

* ``predict_f(x)``: mean ``μ_Y + σ_Y m'(x')``, variance ``σ_Y² v'(x')`` (covariances ``σ_Y σ_Yᵀ ⊙ Σ'``);
* ``predict_y(x)``: the same for ``g.predict_y``;
* ``predict_log_density((x, y))``: ``log p(y | x) = log p'(y' | x') − Σ_p log σ_Y,p`` (the Jacobian of
  ``y ↦ y'``), so densities are comparable with any model fitted on raw ``y``.

The moments are non-trainable ``tf.Variable`` s of the model, so ``tf.train.Checkpoint``, ``tf.saved_model``,
``gpflow.utilities.deepcopy`` and :meth:`save` / :meth:`load` carry them with the inner model: one object.
"""

from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Tuple, Union

import gpflow
import numpy as np
import tensorflow as tf
from check_shapes import check_shapes, inherit_check_shapes
from gpflow.base import MeanAndVariance
from gpflow.models.model import GPModel

from ..data.standardize import Standardizer
from .saving import build_model, load_model, model_constants, model_structure, register_model, save_model
from .serialization import saved_integer

__all__ = ["StandardizedModel"]


def _moment(value: Any, name: str, width: int, positive: bool) -> tf.Variable:
    array: np.ndarray = np.asarray(value, dtype=gpflow.default_float()).reshape(-1)
    if array.shape != (width,):
        raise ValueError(f"StandardizedModel: {name} must have {width} entries, got shape {np.shape(value)}")
    if not np.all(np.isfinite(array)) or (positive and np.any(array <= 0)):
        raise ValueError(f"StandardizedModel: {name} must be finite{' and positive' if positive else ''}")
    return tf.Variable(array, trainable=False, name=name)


class StandardizedModel(GPModel):
    """A GPflow model in the user's units around a model ``g`` trained on standardised data.

    ``kernel``, ``likelihood`` and ``mean_function`` are ``g``'s (they act in standardised units); the
    ``predict_*`` methods act in the data's units (module docstring). ``training_loss`` is ``g``'s (for a
    model holding its statistics; data passed in is standardised first), i.e. in standardised units, which
    differ from raw units by the constant ``N Σ_p log σ_Y,p``.

    :param model: ``g``, any GPflow model (e.g. what :func:`gpflow_fed.federated.run` returns).
    :param standardizer: the :class:`~gpflow_fed.data.Standardizer` whose units ``g`` was trained in
        (``X_mean``, ``X_std``: ``[D]``; ``Y_mean``, ``Y_std``: ``[P]``).
    :raises TypeError: ``model`` is not a GPflow model.
    :raises ValueError: moments of the wrong size, non-finite, or a non-positive scale.
    """

    def __init__(self, model: GPModel, standardizer: Any) -> None:
        if not isinstance(model, GPModel):
            raise TypeError(f"StandardizedModel wraps a gpflow.models.GPModel, got {type(model).__name__}")
        D = int(np.size(standardizer.X_mean))
        P = int(np.size(standardizer.Y_mean))
        super().__init__(model.kernel, model.likelihood, model.mean_function, num_latent_gps=model.num_latent_gps)
        self.model = model
        self.X_mean = _moment(standardizer.X_mean, "X_mean", D, positive=False)
        self.X_std = _moment(standardizer.X_std, "X_std", D, positive=True)
        self.Y_mean = _moment(standardizer.Y_mean, "Y_mean", P, positive=False)
        self.Y_std = _moment(standardizer.Y_std, "Y_std", P, positive=True)

    @property
    def input_dim(self) -> int:
        """D."""
        return int(self.X_mean.shape[0])

    @property
    def output_dim(self) -> int:
        """P."""
        return int(self.Y_mean.shape[0])

    @property
    def standardizer(self) -> Any:
        """The moments as a :class:`~gpflow_fed.data.Standardizer` (copies)."""
        return Standardizer(*(v.numpy().copy() for v in (self.X_mean, self.X_std, self.Y_mean, self.Y_std)))

    @check_shapes("X: [N, D]", "return: [N, D]")
    def standardize_inputs(self, X: Any) -> tf.Tensor:
        """``(X − μ_X)/σ_X``, the inputs ``g`` sees."""
        X = tf.convert_to_tensor(X, dtype=self.X_mean.dtype)
        return (X - self.X_mean) / self.X_std

    def _scale(self, mean: tf.Tensor, var: tf.Tensor, full_cov: bool, full_output_cov: bool) -> MeanAndVariance:
        sy = self.Y_std
        if full_cov and full_output_cov:  # [N, P, N, P]
            scale = sy[None, :, None, None] * sy[None, None, None, :]
        elif full_cov:  # [P, N, N]
            scale = tf.square(sy)[:, None, None]
        elif full_output_cov:  # [N, P, P]
            scale = sy[None, :, None] * sy[None, None, :]
        else:  # [N, P]
            scale = tf.square(sy)
        return self.Y_mean + sy * mean, scale * var

    @inherit_check_shapes
    def predict_f(self, Xnew: Any, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        """``q(f*)`` in the target's units at raw inputs ``Xnew``."""
        mean, var = self.model.predict_f(self.standardize_inputs(Xnew), full_cov, full_output_cov)
        return self._scale(mean, var, full_cov, full_output_cov)

    @inherit_check_shapes
    def predict_y(self, Xnew: Any, full_cov: bool = False, full_output_cov: bool = False) -> MeanAndVariance:
        """The predictive distribution of new observations in the target's units at raw inputs ``Xnew``."""
        mean, var = self.model.predict_y(self.standardize_inputs(Xnew), full_cov, full_output_cov)
        return self._scale(mean, var, full_cov, full_output_cov)

    @inherit_check_shapes
    def predict_log_density(
        self, data: Tuple[Any, Any], full_cov: bool = False, full_output_cov: bool = False
    ) -> tf.Tensor:
        """``log p(y | x)`` of raw ``(x, y)``: ``g``'s density of the standardised pair minus ``Σ_p log σ_Y,p``."""
        X, Y = data
        Y = tf.convert_to_tensor(Y, dtype=self.Y_mean.dtype)
        inner = self.model.predict_log_density(
            (self.standardize_inputs(X), (Y - self.Y_mean) / self.Y_std), full_cov, full_output_cov
        )
        return inner - tf.reduce_sum(tf.math.log(self.Y_std))

    def maximum_log_likelihood_objective(self, *data: Any) -> tf.Tensor:
        """``g``'s objective (standardised units); raw ``(X, Y)``, when ``g`` takes data, are standardised."""
        if not data:
            return self.model.maximum_log_likelihood_objective()
        (X, Y) = data[0]
        Y = tf.convert_to_tensor(Y, dtype=self.Y_mean.dtype)
        return self.model.maximum_log_likelihood_objective((self.standardize_inputs(X), (Y - self.Y_mean) / self.Y_std))

    def training_loss(self, *data: Any) -> tf.Tensor:
        """``−objective − log prior``, as GPflow's training mixins (see :meth:`maximum_log_likelihood_objective`)."""
        return -(self.maximum_log_likelihood_objective(*data) + self.log_prior_density())

    def save(self, path: Union[str, "os.PathLike[str]"]) -> str:
        """Write this model (inner model and moments) to one ``.npz`` file; see
        :func:`gpflow_fed.models.save_model`. Returns the path written."""
        return str(save_model(self, path))

    @staticmethod
    def load(path: Union[str, "os.PathLike[str]"]) -> "StandardizedModel":
        """Read a file written by :meth:`save` (only files the package wrote; nothing is unpickled).

        :raises ValueError: the file is not a StandardizedModel file, or is corrupt.
        """
        model = load_model(path)
        if not isinstance(model, StandardizedModel):
            raise ValueError(f"{path}: holds a {type(model).__name__}, not a StandardizedModel; use load_model")
        return model


def _standardized_structure(model: Any) -> Dict[str, Any]:
    return {"model": model_structure(model.model), "input_dim": model.input_dim, "output_dim": model.output_dim}


def _standardized_constants(model: Any) -> Dict[str, np.ndarray]:
    return model_constants(model.model)


def _standardized_build(s: Mapping[str, Any], constants: Mapping[str, np.ndarray]) -> Any:
    inner = build_model(s["model"], constants)
    D, P = saved_integer(s["input_dim"], "input_dim", 1), saved_integer(s["output_dim"], "output_dim", 1)
    if isinstance(s["model"], Mapping) and (s["model"].get("input_dim"), s["model"].get("output_dim")) != (D, P):
        raise ValueError("saved model: the standardiser's dimensions differ from its model's")
    return StandardizedModel(inner, Standardizer(np.zeros(D), np.ones(D), np.zeros(P), np.ones(P)))


register_model(
    "StandardizedModel",
    _standardized_structure,
    _standardized_constants,
    _standardized_build,
    ("model", "input_dim", "output_dim"),
)

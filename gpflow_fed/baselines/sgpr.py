"""Reference SGPR baselines for FSGP: centralized (pooled data) and local-only (each client alone).

Both train ``gpflow.models.SGPR`` with a ``tf_keras`` Adam on ``training_loss() / N`` (the negative of the
FSGP paper's eq. 9), the loop compiled once with ``tf.function``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import gpflow
import numpy as np
import tensorflow as tf

from ..data.dataset import FederatedDataset
from ..training.adam import CompiledAdam, per_point_loss
from ..metrics import evaluate_model
from ..training.stopping import Plateau
from ..validation import integer, positive_float

__all__ = ["BaselineResult", "centralized_sgpr", "local_only_sgpr", "train_adam"]


@dataclass
class BaselineResult:
    """A trained baseline.

    :param model: the model used for prediction (for local-only: the first client's; see ``models``).
    :param seconds: wall time of building and training (including ``tf.function`` tracing).
    :param steps: optimizer steps taken (summed over clients for local-only).
    :param metrics: test metrics (``test_rmse``, ``test_mae``, ``test_nlpd``) when the dataset has a test set;
        for local-only the average over the clients' models.
    :param models: every model (one per client for local-only).
    """

    model: gpflow.models.GPModel
    seconds: float
    steps: int
    metrics: Dict[str, float] = field(default_factory=dict)
    models: List[gpflow.models.GPModel] = field(default_factory=list)


def _check_training(steps: int, learning_rate: float) -> None:
    integer(steps, "steps", minimum=0)
    positive_float(learning_rate, "learning_rate")


def train_adam(
    model: gpflow.models.GPModel,
    num_data: int,
    steps: int,
    learning_rate: float,
    stopping: Optional[Plateau] = None,
) -> int:
    """Up to ``steps`` tf_keras Adam steps on ``model.training_loss() / num_data`` in one compiled loop (the
    :class:`~gpflow_fed.training.adam.CompiledAdam` FSGP clients run).

    :param stopping: end early once the per-step losses reach this plateau; the loop then runs in chunks of
        ``stopping.window`` steps with one Adam state, so the steps taken are the same as without it up to the
        stop. None: exactly ``steps`` steps.
    :return: the number of steps taken.
    :raises TypeError: a ``stopping`` that is not a Plateau.
    """
    _check_training(steps, learning_rate)
    if stopping is not None and not isinstance(stopping, Plateau):
        raise TypeError(f"stopping must be a Plateau or None, got {type(stopping).__name__}")
    if steps == 0:
        return 0
    scale = tf.constant(float(num_data), gpflow.default_float())
    trainer = CompiledAdam(model.trainable_variables, lambda: model.training_loss() / scale, learning_rate)
    if stopping is None:
        trainer.fit(int(steps), trainer.initial_state())
        return int(steps)
    losses: List[float] = []
    state = trainer.initial_state()
    while len(losses) < steps:
        chunk, state = trainer.fit(min(stopping.window, int(steps) - len(losses)), state)
        losses.extend(np.asarray(chunk).tolist())
        if stopping.reached(losses):
            break
    return len(losses)


def _sgpr(X: np.ndarray, Y: np.ndarray, kernel: gpflow.kernels.Kernel, inducing_variable: Any, noise: float) -> Any:
    return gpflow.models.SGPR(
        (X, Y),
        kernel=gpflow.utilities.deepcopy(kernel),
        inducing_variable=gpflow.utilities.deepcopy(inducing_variable),
        noise_variance=noise,
    )


def centralized_sgpr(
    dataset: FederatedDataset,
    kernel: gpflow.kernels.Kernel,
    inducing_variable: Any,
    noise_variance: float,
    steps: int,
    learning_rate: float,
    stopping: Optional[Plateau] = None,
) -> BaselineResult:
    """SGPR on the pooled data of every client (the oracle FSGP approximates), ``steps`` Adam steps (fewer
    where ``stopping``, a :class:`~gpflow_fed.federated.Plateau` of the loss, ends training first).

    :param kernel: initial kernel (copied); :param inducing_variable: initial Z (copied).
    """
    _check_training(steps, learning_rate)
    start = time.perf_counter()
    X, Y = dataset.pooled()
    model = _sgpr(X, Y, kernel, inducing_variable, noise_variance)
    taken = train_adam(model, X.shape[0], steps, learning_rate, stopping)
    seconds = time.perf_counter() - start
    metrics = evaluate_model(model, dataset.test) if dataset.test is not None else {}
    return BaselineResult(model=model, seconds=seconds, steps=taken, metrics=metrics, models=[model])


def local_only_sgpr(
    dataset: FederatedDataset,
    kernel: gpflow.kernels.Kernel,
    inducing_variable: Any,
    noise_variance: float,
    steps: int,
    learning_rate: float,
) -> BaselineResult:
    """Each client trains its own SGPR on its own data only (``steps`` Adam steps each); the test metrics
    are the average of the clients' models' metrics on the shared test set.

    Z must satisfy M ≤ N_k for every client only in the sense that SGPR stays well-posed; with M > N_k the
    bound is still defined (Kuu carries jitter).
    """
    _check_training(steps, learning_rate)
    start = time.perf_counter()
    models = []
    # one compiled loop on one worker model for every client (no retracing per client)
    worker = _sgpr(*dataset.clients[0], kernel, inducing_variable, noise_variance)
    trainer = CompiledAdam(worker.trainable_variables, lambda X, Y: per_point_loss(worker, X, Y), learning_rate)
    for X, Y in dataset.clients:
        model = _sgpr(X, Y, kernel, inducing_variable, noise_variance)
        if steps > 0:
            for variable, value in zip(worker.trainable_variables, model.trainable_variables):
                variable.assign(value)
            trainer.fit(int(steps), trainer.initial_state(), X, Y)
            for variable, value in zip(model.trainable_variables, worker.trainable_variables):
                variable.assign(value)
        models.append(model)
    seconds = time.perf_counter() - start
    metrics: Dict[str, float] = {}
    if dataset.test is not None:
        per_client = [evaluate_model(m, dataset.test) for m in models]
        metrics = {k: float(np.mean([m[k] for m in per_client])) for k in per_client[0]}
    return BaselineResult(
        model=models[0], seconds=seconds, steps=int(steps) * len(models), metrics=metrics, models=models
    )

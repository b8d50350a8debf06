"""FGP: the FSGP paper's federated exact-GP baseline.

Training (FSGP paper §4, after Yue & Kontar): FederatedAveraging on the per-client exact-GP objective
``(1/N_k) log N(y_k | 0, C_{N_kN_k} + σ² I)`` — each round ``max(⌈Kρ⌉, 1)`` sampled clients take P Adam
steps from the shared (θ, σ) and the server averages them weighted by ``N_k`` in GPflow's unconstrained
space (as :class:`~gpflow_fed.federated.algorithms.FSGP` does).

Prediction: a robust Bayesian committee machine (rBCM, :func:`~gpflow_fed.baselines.experts.rbcm`) of the
clients' exact GPs with the shared hyperparameters. **Privacy**: unlike FSGP's AggregatedSGPR, this
prediction cannot be made from a server-side summary: every client must answer every test-point query
with its own posterior mean and variance, which are functions of its private data, and pays
``O(N_k³)`` once plus ``O(N_k)`` per query.
"""

from __future__ import annotations

import time
from typing import List

import gpflow
import numpy as np
import tensorflow as tf

from ..data.dataset import FederatedDataset
from ..federated.runtimes.base import evaluate_model
from ..federated.sampling import sample_clients, validate_client_fraction
from ..validation import integer, positive_float
from .experts import COMBINATION_RULES, ExpertCommittee
from .sgpr import BaselineResult
from .shared_trainer import SharedAdamTrainer

__all__ = ["fgp"]


def fgp(
    dataset: FederatedDataset,
    kernel: gpflow.kernels.Kernel,
    noise_variance: float,
    rounds: int,
    local_steps: int,
    learning_rate: float,
    client_fraction: float = 1.0,
    *,
    rule: str = "rbcm",
    seed: int = 0,
) -> BaselineResult:
    """Train FGP by FedAvg over clients' exact-GP marginal likelihoods and return an rBCM committee.

    :param dataset: the clients' data (each client builds a ``gpflow.models.GPR`` on its own pair).
    :param kernel: initial θ (copied); :param noise_variance: initial σ².
    :param rounds: R ≥ 0; :param local_steps: P ≥ 1; :param learning_rate: λ > 0 (Adam, one per client).
    :param client_fraction: ρ ∈ (0, 1]. :param rule: the committee's combination rule (default ``"rbcm"``).
    :param seed: seeds the client sampling.
    :return: :class:`BaselineResult` whose model is an :class:`ExpertCommittee` of the client GPRs;
        ``steps`` counts local Adam steps summed over clients.
    :raises ValueError: negative rounds, non-positive steps/learning rate/noise, ρ outside (0, 1], unknown rule.
    """
    if not isinstance(dataset, FederatedDataset):
        raise TypeError(f"dataset must be a FederatedDataset, got {type(dataset).__name__}")
    integer(rounds, "rounds", minimum=0)
    integer(local_steps, "local_steps", minimum=1)
    positive_float(learning_rate, "learning_rate")
    positive_float(noise_variance, "noise_variance")
    validate_client_fraction(client_fraction)
    if rule not in COMBINATION_RULES:
        raise ValueError(f"rule must be one of {COMBINATION_RULES}, got {rule!r}")
    start = time.perf_counter()
    models: List[gpflow.models.GPR] = [
        gpflow.models.GPR(
            (tf.constant(X), tf.constant(Y)), kernel=gpflow.utilities.deepcopy(kernel), noise_variance=noise_variance
        )
        for X, Y in dataset.clients
    ]
    # one compiled loop for every client; each client keeps its own Adam state across rounds
    trainer = SharedAdamTrainer(
        lambda data: gpflow.models.GPR(data, kernel=gpflow.utilities.deepcopy(kernel), noise_variance=noise_variance),
        dataset.input_dim, dataset.output_dim, learning_rate, int(local_steps),
    )  # fmt: skip
    adam_states = [trainer.initial_adam() for _ in models]
    global_values = trainer.initial_values()
    sizes = np.asarray(dataset.client_sizes, dtype=float)
    rng = np.random.default_rng(seed)
    ids = list(range(len(models)))
    steps = 0
    for _ in range(int(rounds)):
        selected = sample_clients(ids, client_fraction, rng)
        updates = []
        for k in selected:
            X, Y = dataset.clients[k]
            update, adam_states[k] = trainer.train(X, Y, global_values, adam_states[k])
            updates.append(update)
            steps += int(local_steps)
        weights = sizes[selected] / sizes[selected].sum()
        global_values = [sum(w * u[i] for w, u in zip(weights, updates)) for i in range(len(global_values))]
    for model in models:
        for variable, value in zip(model.trainable_variables, global_values):
            variable.assign(value)
    committee = ExpertCommittee(models, rule=rule)
    seconds = time.perf_counter() - start
    metrics = evaluate_model(committee, dataset.test) if dataset.test is not None else {}
    return BaselineResult(model=committee, seconds=seconds, steps=steps, metrics=metrics, models=list(models))

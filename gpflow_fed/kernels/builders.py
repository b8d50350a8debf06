"""Builders of the thesis' networks (App. A.2, Fig. A.1): the fully connected feature extractor f, the small
distribution shifter h, and the deep URK of Fig. 3.1 (rightmost) that combines them."""

from __future__ import annotations

from typing import Sequence

import gpflow
from gpflow.keras import tf_keras

from .urk import URK

__all__ = ["deep_urk", "distribution_shifter", "mlp"]


def mlp(
    output_dim: int, hidden: Sequence[int] = (50,), *, seed: int = 0, activation: str = "relu"
) -> tf_keras.Sequential:
    """A fully connected network ``hidden… → output_dim`` in ``gpflow.default_float()``, seeded initialisers
    (every party that builds it with the same seed starts from the same weights)."""
    if output_dim < 1 or any(h < 1 for h in hidden):
        raise ValueError(f"layer sizes must be positive, got hidden={tuple(hidden)}, output_dim={output_dim}")
    dtype = gpflow.default_float()
    layers = [
        tf_keras.layers.Dense(
            h, activation=activation, dtype=dtype, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=seed + i)
        )
        for i, h in enumerate(hidden)
    ]
    layers.append(
        tf_keras.layers.Dense(
            output_dim, dtype=dtype, kernel_initializer=tf_keras.initializers.GlorotUniform(seed=seed + len(hidden))
        )
    )
    return tf_keras.Sequential(layers)


def distribution_shifter(omega_dim: int, hidden: int = 8, *, seed: int = 0) -> tf_keras.Model:
    """h: ``[m, Q] → [m, Q]`` initialised at the identity, so the untrained kernel is the SE kernel of the
    extracted features. With ``hidden > 0``, ``h(ω) = ω + W₂ tanh(W₁ω + b₁) + b₂`` (a small residual MLP,
    Fig. A.1 right; W₂ starts at zero); with ``hidden=0`` a linear map starting at the identity."""
    if omega_dim < 1 or hidden < 0:
        raise ValueError(f"omega_dim must be ≥ 1 and hidden ≥ 0, got {omega_dim}, {hidden}")
    dtype = gpflow.default_float()
    inputs = tf_keras.Input(shape=(omega_dim,), dtype=dtype)
    if hidden == 0:
        outputs = tf_keras.layers.Dense(omega_dim, dtype=dtype, kernel_initializer="identity")(inputs)
    else:
        init = tf_keras.initializers.GlorotUniform(seed=seed)
        h = tf_keras.layers.Dense(hidden, activation="tanh", dtype=dtype, kernel_initializer=init)(inputs)
        delta = tf_keras.layers.Dense(omega_dim, dtype=dtype, kernel_initializer="zeros")(h)
        outputs = tf_keras.layers.Add(dtype=dtype)([inputs, delta])
    return tf_keras.Model(inputs, outputs)


def deep_urk(
    input_dim: int,
    *,
    hidden: Sequence[int] = (50,),
    feature_dim: int = 5,
    num_samples: int = 50,
    shifter: bool = True,
    seed: int = 0,
) -> URK:
    """The thesis' UCI kernel: f = ``mlp(feature_dim, hidden)``, ω ~ N(0, I_{feature_dim}) shifted by a linear h
    (initialised at the identity), Fourier features of f(x), m samples."""
    extractor = mlp(feature_dim, hidden, seed=seed)
    h = distribution_shifter(feature_dim, hidden=0, seed=seed) if shifter else None
    return URK(input_dim, num_samples=num_samples, feature_extractor=extractor, distribution_shifter=h, seed=seed)

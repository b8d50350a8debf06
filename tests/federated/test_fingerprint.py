"""The settings fingerprint of an algorithm: what it reads, and that it is stable for equal constructions."""

import dataclasses

import gpflow
import numpy as np
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.federated.protocol.fingerprint import data_digest, describe_settings, settings_differences


@dataclasses.dataclass(frozen=True)
class Options:
    steps: int
    scale: np.ndarray


class Algo:
    def __init__(self, lr=0.1, lengthscale=1.0, trainable=True):
        self.rounds = 3
        self.learning_rate = lr
        self.kernel = gpflow.kernels.SquaredExponential(lengthscales=lengthscale)
        gpflow.set_trainable(self.kernel.variance, trainable)
        self.options = Options(2, np.arange(3.0))
        self.schedule = {"warmup": [1, 2], "decay": (0.5,)}
        self.optimizer = tf_keras.optimizers.Adam(lr)
        self.step = tf.Variable(0.0)
        self.callback = np.mean
        self.opaque = object()


def test_equal_constructions_give_equal_descriptions():
    a, b = describe_settings(Algo()), describe_settings(Algo())
    assert a == b and settings_differences(a, b) == []
    assert a["class"].endswith("test_fingerprint.Algo")
    assert a["kernel.lengthscales"].startswith("array[]:<f8:") and a["callback"] == "callable:numpy.mean"
    assert a["opaque"] == "type:builtins.object"  # unreadable objects: their type only, never an address


def test_each_kind_of_setting_is_compared():
    base = describe_settings(Algo())
    keys = [k for k, _, _ in settings_differences(base, describe_settings(Algo(lr=0.2)))]
    assert keys == ["learning_rate", "optimizer"]  # the float and the optimizer's config
    keys = [k for k, _, _ in settings_differences(base, describe_settings(Algo(lengthscale=2.0)))]
    assert keys == ["kernel.lengthscales"]
    keys = [k for k, _, _ in settings_differences(base, describe_settings(Algo(trainable=False)))]
    assert keys == ["kernel.variance"]
    changed = Algo()
    changed.options = Options(2, np.arange(3.0) + 1e-15)
    changed.schedule = {"warmup": [1, 2, 3], "decay": (0.5,)}
    keys = [k for k, _, _ in settings_differences(base, describe_settings(changed))]
    assert keys == ["options.scale", "schedule['warmup']", "schedule['warmup'][2]"]
    assert settings_differences({"a": "int:1"}, {}) == [("a", "int:1", "(absent)")]


def test_data_digest_is_keyed():
    X, Y = np.ones((3, 2)), np.zeros((3, 1))
    key = b"k" * 32
    assert data_digest(key, X, Y) == data_digest(key, X.copy(), Y.copy())
    assert data_digest(key, X, Y) != data_digest(b"j" * 32, X, Y)
    assert data_digest(key, X, Y) != data_digest(key, X.reshape(2, 3), Y)  # the shape is part of the digest
    Y2 = Y.copy()
    Y2[1, 0] = 1e-300
    assert data_digest(key, X, Y) != data_digest(key, X, Y2)

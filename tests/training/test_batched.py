"""The batched-training kit: size buckets bound the padding, padded rows repeat a real row under a zero mask, Adam for
many clients at once equals ``tf_keras`` Adam per client, and parameters read as given tensors only inside the block."""

import gpflow
import numpy as np
import pytest
import tensorflow as tf
from gpflow.keras import tf_keras

from gpflow_fed.training.batched import (
    PADDING_RATIO,
    StackedAdam,
    chunked,
    clients_per_chunk,
    padding_overhead,
    parameters_at,
    per_client,
    size_buckets,
    stack_padded,
)


@pytest.mark.parametrize("ratio", [1.0, PADDING_RATIO, 2.0])
def test_buckets_pad_each_client_to_at_most_ratio_times_its_size(ratio):
    sizes = [int(n) for n in np.random.default_rng(0).integers(1, 400, 300)] + [7, 7, 7]
    buckets = size_buckets(sizes, ratio)
    assert sorted(k for b in buckets for k in b.members) == list(range(len(sizes)))  # every client, once
    for bucket in buckets:
        assert bucket.length == max(sizes[k] for k in bucket.members)
        assert all(bucket.length <= ratio * sizes[k] for k in bucket.members)
        assert list(bucket.members) == sorted(bucket.members)  # cohort order within a bucket
    # the waste: at most (ratio − 1) / ratio of a bucket's rows are padding
    assert padding_overhead(sizes, ratio) <= ratio - 1 + 1e-12
    # at most ⌈log(N_max / N_min) / log(ratio)⌉ + 1 buckets (docstring), ratio 1: one per distinct size
    most = len(set(sizes)) if ratio == 1.0 else int(np.ceil(np.log(max(sizes) / min(sizes)) / np.log(ratio))) + 1
    assert len(buckets) <= most
    assert size_buckets([10] * 5) == size_buckets([10] * 5, 1.0) and len(size_buckets([10] * 5)) == 1
    assert padding_overhead([10] * 5) == 0.0
    with pytest.raises(ValueError, match="at least 1"):
        size_buckets(sizes, 0.5)
    with pytest.raises(ValueError, match="positive integer"):
        size_buckets([3, 0])


def test_a_bucket_over_the_budget_is_split_into_chunks_not_refused():
    (bucket,) = size_buckets([5] * 10)
    chunks = chunked(bucket, clients_per_chunk(1000, 300))  # 3 clients fit
    assert [len(c.members) for c in chunks] == [3, 3, 3, 1] and {c.length for c in chunks} == {5}
    assert [k for c in chunks for k in c.members] == list(range(10))
    assert clients_per_chunk(10, 300) == 1  # one client always goes, whatever the budget


def test_padded_rows_repeat_the_first_row_and_are_masked_out():
    a, b = np.arange(6.0).reshape(3, 2), np.arange(10.0, 14.0).reshape(2, 2)
    stacked, mask = stack_padded([a, b], 4)
    assert stacked.shape == (2, 4, 2) and stacked.dtype == gpflow.default_float()
    np.testing.assert_array_equal(stacked[0], [[0, 1], [2, 3], [4, 5], [0, 1]])
    np.testing.assert_array_equal(stacked[1], [[10, 11], [12, 13], [10, 11], [10, 11]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 0, 0]])
    with pytest.raises(ValueError, match="1 … 2 rows"):
        stack_padded([a], 2)


def test_stacked_adam_equals_a_tf_keras_adam_per_client_at_its_own_step():
    """Three clients at different step counts, five steps: the same values and moments as each one's own optimizer."""
    rng = np.random.default_rng(1)
    starts = [rng.normal(size=(2, 3)) for _ in range(3)]
    variables = [tf.Variable(s) for s in starts]
    optimizers = [tf_keras.optimizers.Adam(learning_rate=0.07) for _ in starts]
    for v, opt, extra in zip(variables, optimizers, (0, 2, 5)):  # earlier steps: clients at t = 0, 2 and 5
        opt.build([v])
        for _ in range(extra):
            opt.apply_gradients([(tf.constant(rng.normal(size=(2, 3))), v)])
    stacked = StackedAdam(optimizers[0])
    iterations = tf.constant([int(opt.iterations.numpy()) for opt in optimizers], tf.int64)
    values = [tf.constant(np.stack([v.numpy() for v in variables]))]
    first = [tf.constant(np.stack([opt.variables[1].numpy() for opt in optimizers]))]
    second = [tf.constant(np.stack([opt.variables[2].numpy() for opt in optimizers]))]
    for _ in range(5):
        grads = rng.normal(size=(3, 2, 3))
        for k, (v, opt) in enumerate(zip(variables, optimizers)):
            opt.apply_gradients([(tf.constant(grads[k]), v)])
        iterations, values, first, second = stacked.step(iterations, values, [tf.constant(grads)], first, second)
    for k, (v, opt) in enumerate(zip(variables, optimizers)):
        assert int(iterations[k]) == int(opt.iterations.numpy())
        np.testing.assert_array_equal(values[0][k].numpy(), v.numpy())
        np.testing.assert_array_equal(first[0][k].numpy(), opt.variables[1].numpy())
        np.testing.assert_array_equal(second[0][k].numpy(), opt.variables[2].numpy())
    with pytest.raises(ValueError, match="AMSGrad"):
        StackedAdam(tf_keras.optimizers.Adam(amsgrad=True))
    with pytest.raises(TypeError, match="tf_keras Adam"):
        StackedAdam(tf_keras.optimizers.SGD())


def test_parameters_read_each_clients_values_and_gradients_are_per_client():
    kernel = gpflow.kernels.SquaredExponential(variance=2.0, lengthscales=0.5)
    params = [kernel.variance, kernel.lengthscales]
    before = [p.unconstrained_variable.numpy() for p in params]
    values = [tf.constant([0.1, -0.3, 1.2], tf.float64), tf.constant([0.0, 0.4, -1.0], tf.float64)]
    X = tf.constant(np.linspace(-1, 1, 12).reshape(3, 4, 1))

    with tf.GradientTape() as tape:
        tape.watch(values)
        out = per_client(lambda x: tf.reduce_sum(kernel(x)), params, values, (X,))
        total = tf.reduce_sum(out)
    grads = tape.gradient(total, values)
    for k in range(3):  # each client's kernel at its own values, and only its own values move its output
        own = gpflow.kernels.SquaredExponential()
        own.variance.unconstrained_variable.assign(values[0][k])
        own.lengthscales.unconstrained_variable.assign(values[1][k])
        with tf.GradientTape() as own_tape:
            value = tf.reduce_sum(own(X[k]))
        expected = own_tape.gradient(
            value, [own.variance.unconstrained_variable, own.lengthscales.unconstrained_variable]
        )
        np.testing.assert_allclose(out[k].numpy(), value.numpy(), rtol=1e-13)
        np.testing.assert_allclose([g[k].numpy() for g in grads], [g.numpy() for g in expected], rtol=1e-12)
    # nothing was assigned, and outside the block the parameters are their variables again
    assert [p.unconstrained_variable.numpy() for p in params] == before
    assert all(isinstance(p.unconstrained_variable, tf.Variable) for p in params)
    with pytest.raises(ValueError, match="shape"):
        with parameters_at(params, [tf.zeros([2], tf.float64), tf.zeros([], tf.float64)]):
            pass
    assert all(isinstance(p.unconstrained_variable, tf.Variable) for p in params)

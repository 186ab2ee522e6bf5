"""Tests for :func:`tf_transformer.nn.modules.dropout_by_multiplier`: Keras' dropout as a multiplier."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import dropout_by_multiplier


def values_and_gradients(dropout_fn, x, upstream):
    """``dropout_fn(x)`` and its gradient w.r.t. ``x`` for the upstream gradient ``upstream``."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout_fn(x)
    return y, tape.gradient(y, x, output_gradients=tf.cast(upstream, y.dtype))


@pytest.mark.parametrize("dtype, policy", [(tf.float32, "float32"), (tf.bfloat16, "mixed_bfloat16")])
def test_equals_keras_dropout_call_after_call(dtype, policy):
    """Two Dropout layers in the same state: the layer's call and dropout_by_multiplier give the same values
    and gradients (the same mask and scale), twice in a row (each draws its generator's next seed), and the
    numpy restatement: x / (1 - rate) where kept, 0 elsewhere; the gradient upstream / (1 - rate) there.
    The layers compute in the inputs' dtype, as MultiheadAttention's dropout (its policy's)."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=(12, 7, 7)), dtype)
    upstream = rng.normal(size=(12, 7, 7)).astype(np.float32)
    keras_layer, ours = (keras.layers.Dropout(0.3, seed=5, dtype=policy) for _ in range(2))
    masks = []
    for _ in range(2):
        expected = values_and_gradients(lambda v: keras_layer(v, training=True), x, upstream)
        got = values_and_gradients(lambda v: dropout_by_multiplier(ours, v, True), x, upstream)
        for g, e in zip(got, expected):
            assert g.dtype == dtype
            np.testing.assert_array_equal(tf.cast(g, tf.float32).numpy(), tf.cast(e, tf.float32).numpy())
        y, d_x = (tf.cast(t, tf.float32).numpy() for t in got)
        kept = y != 0
        scale = float(tf.constant(1 / 0.7, dtype))
        rounded = tf.cast(tf.cast(upstream, dtype), tf.float32).numpy()
        np.testing.assert_allclose(y, np.where(kept, tf.cast(x, tf.float32).numpy() * scale, 0), rtol=1e-2)
        np.testing.assert_allclose(d_x, np.where(kept, rounded * scale, 0), rtol=1e-2, atol=1e-6)
        assert 0.6 < kept.mean() < 0.8
        masks.append(kept)
    assert not np.array_equal(*masks)  # a new seed each call


@pytest.mark.parametrize("training, rate", [(False, 0.3), (True, 0.0)])
def test_identity_without_training_or_rate(training, rate):
    x = tf.constant(np.arange(12.0, dtype=np.float32).reshape(3, 4))
    assert dropout_by_multiplier(keras.layers.Dropout(rate, seed=1), x, training) is x


def test_traced_gradient_is_one_mul():
    """In a function: the backward of the dropout is a Mul, no select."""
    layer = keras.layers.Dropout(0.3, seed=5)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = dropout_by_multiplier(layer, x, True)
        return tape.gradient(y, x, output_gradients=tf.ones_like(y))

    graph = gradient.get_concrete_function().graph
    backward = [op.type for op in graph.get_operations() if op.name.startswith("gradient_tape/")]
    assert "Mul" in backward and "SelectV2" not in backward

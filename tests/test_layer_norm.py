"""Tests for ``LayerNorm``, the blog's ``normalize`` (epsilon 1e-8)."""

import numpy as np
import keras
import tensorflow as tf

from tf_transformer.nn.modules import LayerNorm


def numpy_layer_norm(x, gamma, beta, epsilon=1e-8):
    x = np.asarray(x, np.float64)
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # population variance
    return gamma * (x - mean) / np.sqrt(var + epsilon) + beta


def test_initial_gamma_beta():
    layer = LayerNorm()
    layer(tf.zeros([2, 5]))
    assert [(w.name, tuple(w.shape)) for w in layer.weights] == [("gamma", (5,)), ("beta", (5,))]
    np.testing.assert_array_equal(layer.weights[0].numpy(), np.ones(5))
    np.testing.assert_array_equal(layer.weights[1].numpy(), np.zeros(5))
    assert layer.epsilon == 1e-8


def test_matches_numpy_at_init():
    x = np.random.default_rng(0).normal(loc=2.0, scale=3.0, size=(2, 3, 7)).astype("float32")
    out = LayerNorm()(x).numpy()
    np.testing.assert_allclose(out, numpy_layer_norm(x, 1.0, 0.0), rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-4)


def test_matches_numpy_with_gamma_beta():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(4, 6)).astype("float32")
    layer = LayerNorm()
    layer(x)
    gamma = rng.normal(size=6).astype("float32")
    beta = rng.normal(size=6).astype("float32")
    layer.set_weights([gamma, beta])
    np.testing.assert_allclose(layer(x).numpy(), numpy_layer_norm(x, gamma, beta), rtol=0, atol=1e-5)


def test_by_hand():
    np.testing.assert_allclose(LayerNorm()(tf.constant([[1.0, 3.0]])).numpy(), [[-1.0, 1.0]], atol=1e-6)


def test_zero_row_gives_beta():
    layer = LayerNorm()
    layer(tf.zeros([1, 4]))
    beta = np.array([0.5, -1.0, 2.0, 0.0], "float32")
    layer.set_weights([np.full(4, 3.0, "float32"), beta])
    out = layer(tf.zeros([2, 4])).numpy()
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, np.stack([beta, beta]))


def test_small_variance_input_epsilon_matters():
    """Rows with std ~1e-2 (variance ~1e-4): epsilon 1e-8 still normalizes to
    unit variance, Keras' default epsilon 1e-3 (10x the variance) shrinks the
    output about 3x."""
    x = np.random.default_rng(2).normal(scale=1e-2, size=(3, 16)).astype("float32")
    ours = LayerNorm()(x).numpy()
    np.testing.assert_allclose(ours, numpy_layer_norm(x, 1.0, 0.0), rtol=0, atol=1e-4)
    np.testing.assert_allclose(ours.std(-1), 1.0, atol=1e-3)

    keras_default = keras.layers.LayerNormalization()
    assert keras_default.epsilon == 1e-3
    theirs = keras_default(x).numpy()
    np.testing.assert_allclose(theirs, numpy_layer_norm(x, 1.0, 0.0, epsilon=1e-3), rtol=0, atol=1e-5)
    assert np.all(theirs.std(-1) < 0.5)
    assert np.max(np.abs(ours - theirs)) > 0.5

    # The difference is the epsilon only.
    keras_same_eps = keras.layers.LayerNormalization(epsilon=1e-8)(x).numpy()
    np.testing.assert_allclose(ours, keras_same_eps, rtol=0, atol=1e-4)


def test_mixed_float16_computes_in_float32():
    """Under mixed precision: float16 output, float32 gamma/beta, and the same
    values as the float64 restatement (inputs whose squares overflow float16)."""
    x = tf.constant([[1000.0, 1010.0, 990.0, 1000.0]], tf.float16)
    layer = LayerNorm(dtype="mixed_float16")
    out = layer(x)
    assert out.dtype == tf.float16
    assert layer.weights[0].dtype == "float32"
    assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_allclose(
        out.numpy().astype(np.float64), numpy_layer_norm(x.numpy(), 1.0, 0.0), rtol=0, atol=2e-3
    )


def test_get_config_round_trip():
    layer = LayerNorm(epsilon=1e-6, name="ln")
    config = layer.get_config()
    assert config["epsilon"] == 1e-6 and config["name"] == "ln"
    restored = LayerNorm.from_config(config)
    assert restored.get_config() == config
    assert keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer)).epsilon == 1e-6

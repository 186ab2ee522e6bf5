"""Tests for ``FeedForward``, the blog's ``feedforward(inputs, [d_ff, C])``."""

import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_transformer.nn.modules import FeedForward, aligned_width

UNITS, D_FF = 6, 10


def numpy_feedforward(x, inner_kernel, inner_bias, outer_kernel, outer_bias, gamma, beta, epsilon=1e-8):
    x = np.asarray(x, np.float64)
    hidden = np.maximum(x @ inner_kernel + inner_bias, 0.0)
    y = hidden @ outer_kernel + outer_bias + x
    mean = y.mean(axis=-1, keepdims=True)
    var = ((y - mean) ** 2).mean(axis=-1, keepdims=True)
    return gamma * (y - mean) / np.sqrt(var + epsilon) + beta


def randomize_weights(layer, seed):
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        value = rng.normal(scale=0.5, size=tuple(w.shape))
        if w.name == "gamma":
            value += 1.0
        w.assign(value.astype("float32"))


def test_weights_order_and_shapes():
    layer = FeedForward(d_ff=D_FF)
    layer(tf.zeros([1, 2, UNITS]))
    assert [(w.name, tuple(w.shape)) for w in layer.weights] == [
        ("inner_kernel", (UNITS, D_FF)),
        ("inner_bias", (D_FF,)),
        ("outer_kernel", (D_FF, UNITS)),
        ("outer_bias", (UNITS,)),
        ("gamma", (UNITS,)),
        ("beta", (UNITS,)),
    ]
    assert len(layer.trainable_weights) == 6


@pytest.mark.parametrize("randomize", [False, True])
def test_matches_numpy_restatement(randomize):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 5, UNITS)).astype("float32")
    x[1, 3:] = 0.0  # zero-padded rows too
    layer = FeedForward(d_ff=D_FF, residual_dropout_rate=0.3)
    layer(x)
    if randomize:
        randomize_weights(layer, seed=1)
    got = layer(x, training=False).numpy()
    expected = numpy_feedforward(x, *[w.numpy().astype(np.float64) for w in layer.weights])
    assert got.shape == x.shape
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5)


def test_relu_is_active():
    """The inner ReLU matters: without it the restatement would differ."""
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 4, UNITS)).astype("float32")
    layer = FeedForward(d_ff=D_FF)
    layer(x)
    randomize_weights(layer, seed=3)
    w = [v.numpy().astype(np.float64) for v in layer.weights]
    got = layer(x).numpy()
    linear = x @ w[0] + w[1]
    assert np.any(linear < 0)
    y = linear @ w[2] + w[3] + x
    mean, var = y.mean(-1, keepdims=True), y.var(-1, keepdims=True)
    no_relu = w[4] * (y - mean) / np.sqrt(var + 1e-8) + w[5]
    assert np.max(np.abs(got - no_relu)) > 1e-3


def test_residual_dropout_only_when_training():
    tf.random.set_seed(4)
    x = np.random.default_rng(4).normal(size=(2, 4, UNITS)).astype("float32")
    layer = FeedForward(d_ff=D_FF, residual_dropout_rate=0.5)
    layer(x)
    randomize_weights(layer, seed=5)
    np.testing.assert_array_equal(layer(x, training=False).numpy(), layer(x, training=False).numpy())
    assert np.max(np.abs(layer(x, training=True).numpy() - layer(x, training=False).numpy())) > 1e-3


def test_get_config_round_trip():
    x = np.random.default_rng(6).normal(size=(2, 3, UNITS)).astype("float32")
    layer = FeedForward(d_ff=D_FF, residual_dropout_rate=0.1, layer_norm_epsilon=1e-6, name="ff")
    layer(x)
    randomize_weights(layer, seed=7)
    config = layer.get_config()
    assert (config["d_ff"], config["residual_dropout_rate"], config["layer_norm_epsilon"], config["name"]) == (
        D_FF,
        0.1,
        1e-6,
        "ff",
    )
    restored = FeedForward.from_config(config)
    assert restored.get_config() == config
    restored(x)
    restored.set_weights(layer.get_weights())
    np.testing.assert_allclose(restored(x).numpy(), layer(x).numpy(), rtol=0, atol=1e-6)

    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(again, FeedForward) and again.get_config() == config


def test_mixed_float16_per_layer_dtype():
    x = tf.random.stateless_normal([2, 3, UNITS], seed=[8, 9], dtype=tf.float16)
    out = FeedForward(d_ff=D_FF, dtype="mixed_float16")(x)
    assert out.dtype == tf.float16


@pytest.mark.parametrize("width", [1, 10, 256, 500, 511, 512, 768, 1000, 1024, 1536, 2048, 2064, 4096])
def test_aligned_width_never_leaves_rows_a_multiple_of_2_kib_apart(width):
    aligned = aligned_width(width)
    row_bytes = 4 * width  # float32
    assert (4 * aligned) % 2048 != 0
    if row_bytes % 2048:
        assert aligned == width  # nothing added where the rows are spread already
    else:
        assert width < aligned <= width + 16


@pytest.mark.parametrize("aligned", [False, True])
def test_decoding_weights_pad_the_hidden_width_with_zeros(aligned):
    layer = FeedForward(d_ff=512)
    layer(tf.zeros([1, 2, UNITS]))
    randomize_weights(layer, seed=9)
    inner_kernel, inner_bias, outer_kernel, outer_bias = (w.numpy() for w in layer.decoding_weights(aligned))
    width = 528 if aligned else 512
    assert inner_kernel.shape == (UNITS, width) and inner_bias.shape == (width,)
    assert outer_kernel.shape == (width, UNITS) and outer_bias.shape == (UNITS,)
    np.testing.assert_array_equal(inner_kernel[:, :512], layer.inner_kernel.numpy())
    np.testing.assert_array_equal(inner_bias[:512], layer.inner_bias.numpy())
    np.testing.assert_array_equal(outer_kernel[:512], layer.outer_kernel.numpy())
    np.testing.assert_array_equal(outer_bias, layer.outer_bias.numpy())
    assert not inner_kernel[:, 512:].any() and not inner_bias[512:].any() and not outer_kernel[512:].any()


@pytest.mark.parametrize("aligned", [False, True])
def test_step_matches_numpy_restatement(aligned):
    rng = np.random.default_rng(10)
    x = rng.normal(size=(4, 1, UNITS)).astype("float32")  # a decoding step's rows
    layer = FeedForward(d_ff=512)
    layer(x)
    randomize_weights(layer, seed=11)
    got = layer.step(tf.constant(x), layer.decoding_weights(aligned)).numpy()
    expected = numpy_feedforward(x, *[w.numpy().astype(np.float64) for w in layer.weights])
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(got, layer(x, training=False).numpy(), rtol=0, atol=1e-5)


def test_decoding_weights_in_the_compute_dtype():
    layer = FeedForward(d_ff=512, dtype="mixed_bfloat16")
    out = layer(tf.zeros([1, 2, UNITS], tf.bfloat16))
    weights = layer.decoding_weights()
    assert {w.dtype for w in weights} == {tf.bfloat16}
    assert layer.step(tf.zeros([1, 2, UNITS], tf.bfloat16), weights).dtype == out.dtype

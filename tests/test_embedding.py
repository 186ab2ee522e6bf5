"""Tests for ``Embedding``, the blog's ``embedding(zero_pad, scale)``."""

import math

import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_transformer.nn.modules import Embedding

VOCAB = 7
UNITS = 4
IDS = np.array([[3, 0, 5, 1], [0, 0, 2, 3]], "int32")


def built_embedding(**kwargs):
    layer = Embedding(vocab_size=VOCAB, num_units=UNITS, **kwargs)
    layer(tf.constant(IDS))
    return layer


def test_weights():
    layer = built_embedding()
    assert len(layer.weights) == 1 and len(layer.trainable_weights) == 1
    assert layer.weights[0].name == "lookup_table"
    assert tuple(layer.lookup_table.shape) == (VOCAB, UNITS)
    # Glorot-uniform: the raw row 0 is a real (non-zero) variable row.
    assert np.any(layer.lookup_table.numpy()[0] != 0)


@pytest.mark.parametrize("scale", [True, False])
def test_pad_id_maps_to_exact_zero(scale):
    layer = built_embedding(scale=scale)
    out = layer(tf.constant(IDS)).numpy()
    assert out.shape == (2, 4, UNITS)
    np.testing.assert_array_equal(out[IDS == 0], 0.0)
    # No other id gives a zero row.
    assert np.all(np.any(out[IDS != 0] != 0, axis=-1))


def test_pad_row_gets_no_gradient():
    layer = built_embedding()
    weights = tf.random.stateless_normal([2, 4, UNITS], seed=[1, 2])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.constant(IDS)) * weights)
    (grad,) = tape.gradient(loss, layer.trainable_variables)
    grad = tf.convert_to_tensor(grad).numpy()  # IndexedSlices -> dense
    assert grad.shape == (VOCAB, UNITS)

    np.testing.assert_array_equal(grad[0], 0.0)  # id 0 used 3 times, still no gradient
    for used in (1, 2, 3, 5):
        assert np.all(grad[used] != 0), used
    for unused in (4, 6):
        np.testing.assert_array_equal(grad[unused], 0.0)

    # The gradient of a used row is sqrt(C) times the summed upstream weights.
    expected_row3 = math.sqrt(UNITS) * (weights[0, 0] + weights[1, 3]).numpy()
    np.testing.assert_allclose(grad[3], expected_row3, rtol=1e-6)


def test_scale_multiplies_by_sqrt_num_units():
    layer = built_embedding(zero_pad=True, scale=True)
    table = layer.lookup_table.numpy()
    out = layer(tf.constant(IDS)).numpy()
    expected = table[IDS] * np.float32(math.sqrt(UNITS))
    expected[IDS == 0] = 0.0
    np.testing.assert_allclose(out, expected, rtol=1e-6)


def test_no_zero_pad_no_scale_returns_raw_rows():
    layer = built_embedding(zero_pad=False, scale=False)
    table = layer.lookup_table.numpy()
    out = layer(tf.constant(IDS)).numpy()
    np.testing.assert_array_equal(out, table[IDS])
    assert np.any(out[IDS == 0] != 0)


def test_scale_without_zero_pad():
    layer = built_embedding(zero_pad=False, scale=True)
    table = layer.lookup_table.numpy()
    np.testing.assert_allclose(layer(tf.constant(IDS)).numpy(), table[IDS] * math.sqrt(UNITS), rtol=1e-6)


def test_get_config_round_trip():
    layer = built_embedding(zero_pad=False, scale=True, name="src_embedding")
    config = layer.get_config()
    assert {k: config[k] for k in ("vocab_size", "num_units", "zero_pad", "scale", "name")} == {
        "vocab_size": VOCAB,
        "num_units": UNITS,
        "zero_pad": False,
        "scale": True,
        "name": "src_embedding",
    }
    restored = Embedding.from_config(config)
    assert restored.get_config() == config
    restored(tf.constant(IDS))
    restored.set_weights(layer.get_weights())
    np.testing.assert_array_equal(restored(tf.constant(IDS)).numpy(), layer(tf.constant(IDS)).numpy())

    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(again, Embedding) and again.get_config() == config

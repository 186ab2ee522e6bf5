"""Tests for ``PositionalEncoding`` (paper sinusoid, or the blog's learned table)."""

import math

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import SINUSOID_POSITIONS, PositionalEncoding, sinusoid_rows


def paper_sinusoid(length, d):
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d))."""
    pe = np.zeros((length, d), np.float64)
    for i in range((d + 1) // 2):
        angle = np.arange(length, dtype=np.float64) / 10000.0 ** (2 * i / d)
        pe[:, 2 * i] = np.sin(angle)
        if 2 * i + 1 < d:
            pe[:, 2 * i + 1] = np.cos(angle)
    return pe


@pytest.mark.parametrize("d", [8, 7, 1, 2])
@pytest.mark.parametrize("length", [1, 13])
def test_sinusoid_matches_formula(d, length):
    out = PositionalEncoding(num_units=d)(tf.zeros([3, length], tf.int32))
    assert out.shape == (1, length, d)
    assert out.dtype == tf.float32
    np.testing.assert_allclose(out.numpy()[0], paper_sinusoid(length, d), rtol=0, atol=1e-6)


def test_sinusoid_first_values_by_hand():
    out = PositionalEncoding(num_units=4)(tf.zeros([1, 3], tf.int32)).numpy()[0]
    # pos 0: sin 0 = 0, cos 0 = 1.
    np.testing.assert_allclose(out[0], [0.0, 1.0, 0.0, 1.0], atol=1e-7)
    # pos 2, i = 1: 10000^(2/4) = 100.
    np.testing.assert_allclose(out[2], [math.sin(2), math.cos(2), math.sin(0.02), math.cos(0.02)], atol=1e-7)


@pytest.mark.parametrize("d", [16, 15])
def test_sinusoid_long_lengths(d):
    """Far past any training maxlen; accurate because built in float64
    (a float32 angle would be off by ~1e-4 at position 5000)."""
    length = 5000
    out = PositionalEncoding(num_units=d)(tf.zeros([1, length], tf.int32)).numpy()[0]
    assert out.shape == (length, d)
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(out, paper_sinusoid(length, d), rtol=0, atol=1e-6)


def test_sinusoid_depends_on_length_only():
    layer = PositionalEncoding(num_units=6)
    a = layer(tf.constant([[5, 2, 0]])).numpy()
    b = layer(tf.constant([[1, 1, 1], [9, 9, 9]])).numpy()
    np.testing.assert_array_equal(a, b)
    # A longer input's first rows equal the shorter table.
    c = layer(tf.zeros([1, 10], tf.int32)).numpy()
    np.testing.assert_allclose(c[:, :3], a, rtol=0, atol=1e-7)
    assert not layer.weights


def test_learned_table():
    maxlen, d = 5, 4
    layer = PositionalEncoding(num_units=d, kind="learned", maxlen=maxlen)
    out = layer(tf.zeros([2, 3], tf.int32))
    assert out.shape == (1, 3, d)
    assert len(layer.trainable_weights) == 1
    table = layer.trainable_weights[0]
    assert tuple(table.shape) == (maxlen, d)
    # Unscaled, not zero padded: row t of the table for position t.
    np.testing.assert_array_equal(out.numpy()[0], table.numpy()[:3])
    assert np.any(table.numpy()[0] != 0)


def test_learned_positions_beyond_maxlen_reuse_last_row():
    maxlen, d = 5, 4
    layer = PositionalEncoding(num_units=d, kind="learned", maxlen=maxlen)
    out = layer(tf.zeros([1, maxlen + 3], tf.int32)).numpy()[0]
    table = layer.trainable_weights[0].numpy()
    assert out.shape == (maxlen + 3, d)
    np.testing.assert_array_equal(out[:maxlen], table)
    for t in range(maxlen, maxlen + 3):
        np.testing.assert_array_equal(out[t], table[maxlen - 1])


def test_learned_table_gets_gradient():
    layer = PositionalEncoding(num_units=4, kind="learned", maxlen=6)
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(layer(tf.zeros([1, 3], tf.int32)) ** 2)
    (grad,) = tape.gradient(loss, layer.trainable_variables)
    grad = tf.convert_to_tensor(grad).numpy()
    assert np.all(np.any(grad[:3] != 0, axis=-1))
    np.testing.assert_array_equal(grad[3:], 0.0)


def test_bad_kind():
    with pytest.raises(ValueError, match="kind"):
        PositionalEncoding(num_units=4, kind="rotary")


@pytest.mark.parametrize("maxlen", [None, 0])
def test_learned_needs_maxlen(maxlen):
    with pytest.raises(ValueError, match="maxlen"):
        PositionalEncoding(num_units=4, kind="learned", maxlen=maxlen)


@pytest.mark.parametrize("kwargs", [{}, {"kind": "learned", "maxlen": 7}])
def test_get_config_round_trip(kwargs):
    layer = PositionalEncoding(num_units=4, **kwargs)
    x = tf.zeros([1, 3], tf.int32)
    out = layer(x)
    config = layer.get_config()
    assert config["num_units"] == 4
    assert config["kind"] == kwargs.get("kind", "sinusoid")
    assert config["maxlen"] == kwargs.get("maxlen")
    restored = PositionalEncoding.from_config(config)
    assert restored.get_config() == config
    restored(x)
    restored.set_weights(layer.get_weights())
    np.testing.assert_array_equal(restored(x).numpy(), out.numpy())


@pytest.mark.parametrize("length", [0, 1, SINUSOID_POSITIONS - 1, SINUSOID_POSITIONS, SINUSOID_POSITIONS + 3])
def test_sinusoid_rows_are_the_formula_below_and_beyond_the_precomputed_table(length):
    d = 6
    expected = paper_sinusoid(length, d)
    eager = sinusoid_rows(tf.constant(length), d)
    traced = tf.function(lambda n: sinusoid_rows(n, d))(tf.constant(length))  # length unknown when traced
    compiled = tf.function(lambda x: sinusoid_rows(tf.shape(x)[0], d), jit_compile=True)(tf.zeros([length]))
    for rows in (eager, traced, compiled):
        assert rows.shape == (length, d) and rows.dtype == tf.float64
        np.testing.assert_allclose(rows.numpy(), expected, rtol=0, atol=1e-12)
    if length <= SINUSOID_POSITIONS:  # XLA's sines and TensorFlow's differ in the last bits; the table is one
        np.testing.assert_array_equal(compiled.numpy(), eager.numpy())
        np.testing.assert_array_equal(traced.numpy(), eager.numpy())

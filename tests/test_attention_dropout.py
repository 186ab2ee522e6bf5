"""Tests for :func:`tf_transformer.nn.modules.attention_dropout`: the attention weights' dropout as a multiplier
of hashed numbers, made by one XLA computation over a rounded size."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn import fused, modules
from tf_transformer.nn.modules import attention_dropout
from tests.test_fused_norm import numpy_keep


def values_and_gradients(dropout_fn, x, upstream):
    """``dropout_fn(x)`` and its gradient w.r.t. ``x`` for the upstream gradient ``upstream``."""
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = dropout_fn(x)
    return y, tape.gradient(y, x, output_gradients=tf.cast(upstream, y.dtype))


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("shape", [(12, 7, 7), (8, 5, 9), (3, 1, 1)])
def test_restated_in_numpy_call_after_call(dtype, shape):
    """Values and gradients equal ``x * keep`` and ``upstream * keep`` for the numpy restatement of the hashed
    multiplier (0 or 1 / (1 - rate)) over the row-major index, with the seed a twin Dropout layer in the same state draws next, twice in
    a row (a new seed each call), whatever the size rounds up to."""
    rng = np.random.default_rng(0)
    x = tf.constant(rng.normal(size=shape), dtype)
    upstream = tf.cast(rng.normal(size=shape), dtype)
    ours, twin = (keras.layers.Dropout(0.3, seed=5) for _ in range(2))
    masks = []
    for _ in range(2):
        keep = numpy_keep(shape, 0.3, twin.seed_generator.next())
        multiplier = tf.cast(tf.cast(keep, dtype), tf.float32).numpy()  # the multiplier in the weights' dtype
        y, d_x = values_and_gradients(lambda v: attention_dropout(ours, v, True), x, upstream)
        assert y.dtype == d_x.dtype == dtype
        as_float = lambda t: tf.cast(t, tf.float32).numpy()
        np.testing.assert_array_equal(as_float(y), as_float(tf.cast(as_float(x) * multiplier, dtype)))
        np.testing.assert_array_equal(as_float(d_x), as_float(tf.cast(as_float(upstream) * multiplier, dtype)))
        masks.append(keep)
    if np.prod(shape) > 20:
        assert not np.array_equal(*masks)
        assert 0.55 < (masks[0] > 0).mean() < 0.85


@pytest.mark.parametrize("training, rate", [(False, 0.3), (True, 0.0)])
def test_identity_without_training_or_rate(training, rate):
    x = tf.constant(np.arange(12.0, dtype=np.float32).reshape(3, 4))
    assert attention_dropout(keras.layers.Dropout(rate, seed=1), x, training) is x


def test_mask_sizes_are_few_and_cover_the_weights(monkeypatch):
    """The mask is made for the weights' size rounded up: at least the size, at most a quarter more above
    the smallest one, and four sizes a doubling, so XLA compiles it for a few sizes only."""
    sizes = []
    real = fused.keep_of_size

    def recording(size, rate, seed, dtype):
        sizes.append(int(size))
        return real(size, rate, seed, dtype)

    monkeypatch.setattr(fused, "keep_of_size", recording)
    layer = keras.layers.Dropout(0.1, seed=3)
    weights = [(4, n, n) for n in range(40, 81)]  # 6,400 .. 26,244 elements: two doublings
    for shape in weights:
        attention_dropout(layer, tf.ones(shape), True)
    for shape, size in zip(weights, sizes):
        assert np.prod(shape) <= size <= max(4096, 1.25 * np.prod(shape) + 1024)
    assert len(set(sizes)) <= 4 * 2 + 1


def test_mask_size_is_the_least_of_four_a_doubling_at_least_the_size():
    """mask_size(n): at least n, at least 4,096, within a quarter above n, of the form k * 2^e with k in 4..7
    (three leading bits, zeros below), and the least such number (n itself when it has that form)."""
    def of_the_form(m):
        shift = m.bit_length() - 3
        return m >> shift in (4, 5, 6, 7) and m == (m >> shift) << shift

    rng = np.random.default_rng(1)
    for n in [0, 1, 4095, 4096, 4097, 5120, 5121, 7 << 20, (7 << 20) + 1, *rng.integers(1, 10 ** 9, 200)]:
        m = int(modules.mask_size(tf.constant(int(n), tf.int32)))
        assert m >= max(n, 4096) and of_the_form(m)
        assert n <= 4096 or m <= 1.25 * n
        shift = m.bit_length() - 3
        smaller = 7 << (shift - 1) if m >> shift == 4 else m - (1 << shift)  # the next smaller of the form
        assert of_the_form(smaller) and smaller < max(n, 4096)


def test_traced_gradient_is_one_mul_and_the_mask_one_xla_call():
    """In a function of unknown shapes: the backward is a Mul, no select and no random-number kernel; the
    mask is one call of the XLA computation."""
    layer = keras.layers.Dropout(0.3, seed=5)

    @tf.function(input_signature=[tf.TensorSpec([None, None, None], tf.float32)])
    def gradient(x):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = attention_dropout(layer, x, True)
        return tape.gradient(y, x, output_gradients=tf.ones_like(y))

    graph = gradient.get_concrete_function().graph
    types = [op.type for op in graph.get_operations()]
    backward = [op.type for op in graph.get_operations() if op.name.startswith("gradient_tape/")]
    assert "Mul" in backward and "SelectV2" not in backward
    assert not [t for t in types if "Random" in t]
    calls = [op for op in graph.get_operations() if op.type in ("StatefulPartitionedCall", "PartitionedCall")]
    assert len(calls) == 1 and "compiled_keep" in calls[0].get_attr("f").name
    assert gradient(tf.ones([2, 3, 4])).shape == (2, 3, 4)

"""Tests for the fused sub-layer tail (``tf_transformer.nn.fused``): residual dropout + add + layer norm."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.test_layer_norm import numpy_layer_norm
from tf_transformer.nn import fused
from tf_transformer.nn.modules import LayerNorm, residual_norm
from tf_transformer.train.step import precision_policy

# (policy, rtol and atol of values, rtol and atol of gradients): bfloat16 keeps 8 bits of mantissa (XLA may
# round the residual sum once less: one bfloat16 rounding of the output, 2^-8 relative, either way).
POLICIES = [("float32", (0, 1e-5), (1e-4, 1e-5)), ("mixed_bfloat16", (2 ** -7, 2e-2), (2e-2, 3e-2))]


def inputs(rows=40, units=16, seed=0):
    rng = np.random.default_rng(seed)
    outputs, residual = (rng.normal(loc=1.0, scale=2.0, size=(rows, units)).astype("float32") for _ in range(2))
    gamma, beta = rng.normal(size=units).astype("float32"), rng.normal(size=units).astype("float32")
    return outputs, residual, gamma, beta


def numpy_mix32(x):
    """lowbias32 (hash-prospector), restated in numpy: uint32 arrays, products wrapping mod 2^32."""
    x = np.asarray(x, np.uint32)
    x = x ^ (x >> np.uint32(16))
    x = x * np.uint32(0x7FEB352D)
    x = x ^ (x >> np.uint32(15))
    x = x * np.uint32(0x846CA68B)
    return x ^ (x >> np.uint32(16))


def numpy_keep(shape, rate, seed):
    """The dropout multiplier of ``fused.keep_multiplier`` restated: element i keeps where
    ``(mix32(mix32(i ^ a) ^ b) >> 8) / 2^24 >= rate``, a = mix32(s0 ^ mix32(s1)), b = mix32(a ^ 0x9E3779B9)."""
    s0, s1 = (np.array([int(v) % 2 ** 32], np.uint32) for v in np.asarray(seed))
    a = numpy_mix32(s0 ^ numpy_mix32(s1))
    b = numpy_mix32(a ^ np.uint32(0x9E3779B9))
    index = np.arange(int(np.prod(shape)), dtype=np.uint32).reshape(shape)
    uniform = (numpy_mix32(numpy_mix32(index ^ a) ^ b) >> np.uint32(8)).astype(np.float64) / 2 ** 24
    return np.where(uniform >= rate, 1 / (1 - rate), 0.0).astype(np.float32)


def test_values_equal_numpy_layer_norm():
    outputs, residual, gamma, beta = inputs()
    got = fused.residual_layer_norm(tf.constant(outputs), tf.constant(residual), tf.constant(gamma),
                                    tf.constant(beta), 1e-8)
    np.testing.assert_allclose(got.numpy(), numpy_layer_norm(outputs + residual, gamma, beta), rtol=0, atol=1e-5)


def test_gradients_equal_numpy_finite_differences():
    """The hand-derived backward against central differences of the numpy restatement (float64)."""
    outputs, residual, gamma, beta = inputs(rows=3, units=5)
    weights = np.arange(1.0, 6.0)  # the loss: sum(weights * tail), the same weights on every row
    tensors = [tf.constant(a) for a in (outputs, residual, gamma, beta)]
    with tf.GradientTape() as tape:
        tape.watch(tensors)
        y = fused.residual_layer_norm(*tensors, 1e-8)
        loss = tf.reduce_sum(y * weights.astype("float32"))
    d_outputs, d_residual, d_gamma, d_beta = (g.numpy() for g in tape.gradient(loss, tensors))

    x = outputs.astype(np.float64) + residual
    numeric = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = 1e-6
        numeric[index] = ((weights * numpy_layer_norm(x + step, gamma, beta)).sum()
                          - (weights * numpy_layer_norm(x - step, gamma, beta)).sum()) / 2e-6
    np.testing.assert_allclose(d_outputs, numeric, rtol=1e-3, atol=1e-4)
    np.testing.assert_array_equal(d_outputs, d_residual)
    np.testing.assert_allclose(d_gamma, (weights * numpy_layer_norm(x, 1.0, 0.0)).sum(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(d_beta, weights * 3, rtol=1e-6)


@pytest.mark.parametrize("compiled, units", [(False, 16), (True, 16), (True, 96)])  # 96: row_reduce's blocks
@pytest.mark.parametrize("rate", [0.0, 0.3])
@pytest.mark.parametrize("policy, tolerance, grad_tolerance", POLICIES)
def test_equals_unfused_values_and_gradients(policy, tolerance, grad_tolerance, rate, compiled, units):
    """residual_norm == the hashed mask of the seed the Dropout layer's generator gives (numpy), add,
    LayerNorm, values and gradients w.r.t. both inputs, gamma and beta; in plain ops and as XLA
    computations (``compiled``)."""
    outputs, residual, gamma, beta = inputs(units=units)
    with precision_policy(policy):
        layer_norm = LayerNorm()
        dropouts = [keras.layers.Dropout(rate, seed=7) for _ in range(2)]  # two generators in the same state
    layer_norm.build((None, units))
    layer_norm.set_weights([gamma, beta])
    dtype = layer_norm.compute_dtype
    results = []
    for fuse, dropout in zip((False, True), dropouts):
        o, r = tf.constant(outputs, dtype), tf.constant(residual, dtype)
        with tf.GradientTape() as tape:
            tape.watch([o, r])
            if fuse:
                y = residual_norm(layer_norm, dropout, o, r, training=True, compiled=compiled)
            else:  # the layer's next seed, as residual_norm draws it
                keep = numpy_keep(outputs.shape, rate, dropout.seed_generator.next()) if rate else 1.0
                y = layer_norm(o * tf.constant(keep, dtype) + r)
            loss = tf.reduce_sum(tf.cast(y, tf.float32) * tf.range(1.0, units + 1.0) / units)
        assert y.dtype == dtype
        results.append([y, *tape.gradient(loss, [o, r, *layer_norm.trainable_variables])])
    (y_unfused, *g_unfused), (y_fused, *g_fused) = results
    np.testing.assert_allclose(tf.cast(y_fused, tf.float32), tf.cast(y_unfused, tf.float32), *tolerance)
    rtol, grad_atol = grad_tolerance
    for name, a, b in zip(("outputs", "residual", "gamma", "beta"), g_fused, g_unfused):
        assert a.dtype == b.dtype, name
        np.testing.assert_allclose(tf.cast(a, tf.float32), tf.cast(b, tf.float32), rtol=rtol, atol=grad_atol,
                                   err_msg=name)


@pytest.mark.parametrize("shape", [(5, 96), (2, 3, 256), (4, 40), (3, 32), (2, 4000)])
@pytest.mark.parametrize("jit", [False, True])
def test_row_reduce_sums_and_maxima_of_rows(shape, jit):
    """row_reduce == numpy's sum and max over the last axis, keeping it, in plain ops and XLA; widths of 32-wide
    blocks (96, 256) and others (40, 32, and 4,000: too many blocks) alike."""
    x = np.random.default_rng(1).normal(size=shape).astype("float32")
    row_sum = tf.function(lambda x: fused.row_reduce(x), jit_compile=jit)
    row_max = tf.function(lambda x: fused.row_reduce(x, tf.maximum, tf.reduce_max), jit_compile=jit)
    np.testing.assert_allclose(row_sum(tf.constant(x)).numpy(), x.sum(-1, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(row_max(tf.constant(x)).numpy(), x.max(-1, keepdims=True))


def test_row_reduce_of_rows_whose_width_is_unknown_when_traced():
    row_sum = tf.function(lambda x: fused.row_reduce(x), input_signature=[tf.TensorSpec([None, None])])
    x = np.arange(12.0, dtype="float32").reshape(2, 6)
    np.testing.assert_array_equal(row_sum(tf.constant(x)).numpy(), x.sum(-1, keepdims=True))


def test_compiled_row_reduce_is_not_split_into_a_reduce_window():
    """XLA:CPU's optimized program of a row sum over 256 columns: one fused kernel, no reduce-window pass
    (the plain reduce_sum's has one: what row_reduce is for)."""
    x = tf.random.normal([64, 256])
    ours = tf.function(lambda x: fused.row_reduce(tf.exp(x)), jit_compile=True)
    plain = tf.function(lambda x: tf.reduce_sum(tf.exp(x), axis=-1, keepdims=True), jit_compile=True)
    ours_hlo, plain_hlo = (f.experimental_get_compiler_ir(x)(stage="optimized_hlo") for f in (ours, plain))
    assert "reduce-window" in plain_hlo
    assert "reduce-window" not in ours_hlo
    assert ours_hlo.count(" fusion(") == 1


def test_layer_norm_inside_xla_is_the_same_norm_without_a_reduce_window():
    """LayerNorm traced inside an XLA computation (the compiled decoding loops) takes row_reduce's means: the
    values of the plain layer, and no reduce-window kernel in XLA:CPU's program."""
    layer = LayerNorm()
    x = tf.constant(np.random.default_rng(2).normal(loc=3.0, size=(2, 5, 256)).astype("float32"))
    compiled = tf.function(lambda x: layer(x), jit_compile=True)
    np.testing.assert_allclose(compiled(x).numpy(), layer(x).numpy(), rtol=0, atol=2e-5)
    assert "reduce-window" not in compiled.experimental_get_compiler_ir(x)(stage="optimized_hlo")


def test_dropout_mask_deterministic_rate_and_scale():
    seed = tf.constant([3, 4])
    keep = fused.keep_multiplier([300, 64], 0.25, seed, tf.float32).numpy()
    np.testing.assert_array_equal(keep, fused.keep_multiplier([300, 64], 0.25, seed, tf.float32).numpy())
    np.testing.assert_array_equal(keep, numpy_keep([300, 64], 0.25, [3, 4]))
    assert not np.array_equal(keep, fused.keep_multiplier([300, 64], 0.25, tf.constant([3, 5]), tf.float32))
    assert set(np.unique(keep)) == {0.0, np.float32(1 / 0.75)}
    assert abs((keep > 0).mean() - 0.75) < 0.01


def test_hashed_uniform_numbers_look_uniform_and_independent():
    """The numbers of ``hashed_uniform``: in [0, 1), uniform (every tenth of the range, every row and column
    near its share), and uncorrelated between neighbours in a row or a column and between seeds one apart
    (as a ``SeedGenerator`` gives them: the second word + 1) or in the first word."""
    shape = [512, 256]
    u = fused.hashed_uniform(shape, tf.constant([7, 100])).numpy().astype(np.float64)
    assert u.dtype == np.float64 and u.min() >= 0 and u.max() < 1
    counts = np.histogram(u, bins=10, range=(0, 1))[0] / u.size
    np.testing.assert_allclose(counts, 0.1, atol=0.003)
    np.testing.assert_allclose(u.mean(0), 0.5, atol=0.06)  # 512 numbers a column: sd 0.0128
    np.testing.assert_allclose(u.mean(1), 0.5, atol=0.06)
    centered = u - 0.5
    for a, b in ((centered[:, 1:], centered[:, :-1]), (centered[1:], centered[:-1])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    for other in ([7, 101], [8, 100]):
        v = fused.hashed_uniform(shape, tf.constant(other)).numpy() - 0.5
        for lag in range(3):  # the same element and its neighbours in the other seed's numbers
            assert abs(np.corrcoef(centered.ravel()[lag:], v.ravel()[:v.size - lag])[0, 1]) < 0.01


@pytest.mark.parametrize("compiled", [False, True])
def test_dropout_same_mask_forward_and_backward(compiled):
    """Forward: layer_norm(outputs * keep + residual); backward: d_outputs = d_residual * keep, one keep."""
    outputs, residual, gamma, beta = inputs(rows=50, units=32)
    seed = tf.constant([11, 0])
    keep = fused.keep_multiplier(outputs.shape, 0.4, seed, tf.float32).numpy()
    o, r = tf.constant(outputs), tf.constant(residual)
    with tf.GradientTape() as tape:
        tape.watch([o, r])
        y = fused.residual_layer_norm(o, r, tf.constant(gamma), tf.constant(beta), 1e-8, rate=0.4, seed=seed,
                                      compiled=compiled)
        loss = tf.reduce_sum(y * y)
    d_outputs, d_residual = tape.gradient(loss, [o, r])
    np.testing.assert_allclose(y.numpy(), numpy_layer_norm(outputs * keep + residual, gamma, beta), atol=1e-5)
    np.testing.assert_array_equal(d_outputs.numpy(), d_residual.numpy() * keep)
    assert np.all(d_outputs.numpy()[keep == 0] == 0) and np.all(d_residual.numpy() != 0)


def test_no_dropout_without_training():
    outputs, residual, gamma, beta = inputs()
    layer_norm = LayerNorm()
    layer_norm.build((None, 16))
    dropout = keras.layers.Dropout(0.5, seed=1)
    y = residual_norm(layer_norm, dropout, tf.constant(outputs), tf.constant(residual), training=False)
    np.testing.assert_allclose(y.numpy(), numpy_layer_norm(outputs + residual, 1.0, 0.0), atol=1e-5)


def test_compiled_tail_compiles_once_per_row_count():
    """The XLA tail is traced (and compiled) once per shape and dtype, whichever layer norm calls it."""
    outputs, residual, gamma, beta = (tf.constant(a) for a in inputs(rows=24, units=8, seed=5))
    before = fused._compiled_tail.experimental_get_tracing_count()
    for _ in range(3):
        fused.residual_layer_norm(outputs, residual, gamma, beta, 1e-8, compiled=True)
    fused.residual_layer_norm(outputs[:16], residual[:16], gamma, beta, 1e-8, compiled=True)
    assert fused._compiled_tail.experimental_get_tracing_count() - before == 2


@pytest.mark.parametrize("compiled", [False, True])
def test_bias_joins_the_tail_in_values_and_gradients(compiled):
    """``bias=b`` == the tail of ``outputs + b`` (a dense layer's bias add), values and gradients; the bias's
    gradient is the rows' sum of the outputs' (numpy)."""
    outputs, residual, gamma, beta = inputs(rows=30, units=16, seed=9)
    bias = np.random.default_rng(10).normal(size=16).astype("float32")
    tensors = [tf.constant(a) for a in (outputs, residual, gamma, beta, bias)]
    seed = tf.constant([5, 6])
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(tensors)
        o, r, g, b, bi = tensors
        got = fused.residual_layer_norm(o, r, g, b, 1e-8, 0.2, seed, compiled=compiled, bias=bi)
        want = fused.residual_layer_norm(o + bi, r, g, b, 1e-8, 0.2, seed)
        weights = tf.range(1.0, 17.0)
        got_loss, want_loss = tf.reduce_sum(got * weights), tf.reduce_sum(want * weights)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-5)
    got_grads, want_grads = tape.gradient(got_loss, tensors), tape.gradient(want_loss, tensors)
    for name, a, e in zip(("outputs", "residual", "gamma", "beta", "bias"), got_grads, want_grads):
        np.testing.assert_allclose(a.numpy(), e.numpy(), rtol=1e-4, atol=1e-4, err_msg=name)
    np.testing.assert_allclose(got_grads[4].numpy(), got_grads[0].numpy().sum(0), rtol=1e-5, atol=1e-4)


def test_dropout_rows_restated_forward_and_backward():
    """``dropout_rows`` (the embeddings' dropout of bucketed packed rows) is ``x`` times the restated hashed
    multiplier of its seed, and its gradient ``dy`` times the same multiplier, in float32 and bfloat16."""
    rng = np.random.default_rng(4)
    seed = tf.constant([11, -3])
    keep = numpy_keep((64, 8), 0.3, seed)
    for dtype in (tf.float32, tf.bfloat16):
        x = tf.cast(rng.normal(size=(64, 8)), dtype)
        upstream = tf.cast(rng.normal(size=(64, 8)), dtype)
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fused.dropout_rows(x, 0.3, seed)
        d_x = tape.gradient(y, x, output_gradients=upstream)
        assert y.dtype == dtype and d_x.dtype == dtype
        for got, of in ((y, x), (d_x, upstream)):
            want = tf.cast(tf.cast(of, tf.float32) * keep, dtype)  # one rounding, as the product in dtype
            np.testing.assert_allclose(tf.cast(got, tf.float32).numpy(), tf.cast(want, tf.float32).numpy(),
                                       rtol=1e-6 if dtype == tf.float32 else 2 ** -7)

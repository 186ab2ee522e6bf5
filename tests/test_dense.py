"""``modules.dense``: x @ kernel + bias over the last axis, for every rank, against numpy."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import Embedding, Logits, SharedLogits, dense


@pytest.mark.parametrize("spec", [(None, 8), (None, 1, 8), (None, 2, 3, 8), (None, None, 8)])
@pytest.mark.parametrize("activation", [None, "relu"])
def test_dense_is_a_matrix_product_over_the_last_axis(spec, activation):
    """Every rank gives ``x @ kernel + bias`` (relu'd), as one ``MatMul`` of rows and a ``BiasAdd`` (the pattern
    oneDNN fuses; no ``AddV2``): with only the leading dim unknown (a decoding step's (N, 1, C)) the graph
    computes no shape at all, and never ``tensordot``'s plumbing (``Prod``, ``GatherV2``)."""
    rng = np.random.default_rng(0)
    kernel, bias = rng.normal(size=(8, 5)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    x = rng.normal(size=[3 if d is None else d for d in spec]).astype(np.float32)
    traced = tf.function(lambda x: dense(x, tf.constant(kernel), tf.constant(bias), activation),
                         input_signature=[tf.TensorSpec(spec, tf.float32)])
    expected = x @ kernel + bias
    np.testing.assert_allclose(traced(x).numpy(), np.maximum(expected, 0) if activation else expected,
                               rtol=1e-5, atol=1e-5)
    ops = [n.type for n in traced.get_concrete_function().graph.get_operations()]
    assert ops.count("MatMul") == 1 and ops.count("BiasAdd") == 1, sorted(ops)
    assert not {"Prod", "GatherV2", "AddV2"} & set(ops), sorted(ops)
    if all(d is not None for d in spec[1:]):
        assert "Shape" not in ops, sorted(ops)


@pytest.mark.parametrize("activation", [None, "relu"])
@pytest.mark.parametrize("transpose_kernel", [False, True])
@pytest.mark.parametrize("leading", [(6,), (2, 3)])
def test_rows_gradients_restated_with_the_bias_summed_by_a_matmul(activation, transpose_kernel, leading):
    """(M, C_in) rows, or (N, T, C_in) (the blog's layout), in training: the gradients of x, kernel and bias equal numpy's restatement of
    ``relu(x @ K + b)`` (``K`` the kernel or, ``transpose_kernel``, its transpose), and the bias's is a product
    by ones, no ``BiasAddGrad`` pass in the gradient graph."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(*leading, 4)).astype(np.float32)
    kernel = rng.normal(size=(5, 4) if transpose_kernel else (4, 5)).astype(np.float32)
    bias, upstream = rng.normal(size=5).astype(np.float32), rng.normal(size=(*leading, 5)).astype(np.float32)

    @tf.function
    def gradients(x, kernel, bias):
        with tf.GradientTape() as tape:
            tape.watch([x, kernel, bias])
            outputs = dense(x, kernel, bias, activation, transpose_kernel=transpose_kernel, training=True)
        return outputs, tape.gradient(outputs, [x, kernel, bias], output_gradients=tf.constant(upstream))

    outputs, (d_x, d_kernel, d_bias) = gradients(tf.constant(x), tf.constant(kernel), tf.constant(bias))
    k = kernel.T if transpose_kernel else kernel
    z = x @ k + bias
    d_z = upstream * (z > 0) if activation else upstream
    np.testing.assert_allclose(outputs.numpy(), np.maximum(z, 0) if activation else z, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_x.numpy(), d_z @ k.T, rtol=1e-5, atol=1e-5)
    rows, d_rows = x.reshape(-1, 4), d_z.reshape(-1, 5)  # the leading dims as one: what the kernel sees
    np.testing.assert_allclose(d_kernel.numpy(), (rows.T @ d_rows).T if transpose_kernel else rows.T @ d_rows,
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(d_bias.numpy(), d_rows.sum(axis=0), rtol=1e-5, atol=1e-5)
    ops = {n.type for n in gradients.get_concrete_function(
        tf.constant(x), tf.constant(kernel), tf.constant(bias)).graph.get_operations()}
    assert "BiasAddGrad" not in ops and "BiasAdd" in ops, sorted(ops)


def test_rows_in_bfloat16_keep_their_dtype_and_give_float32_weight_gradients():
    """Mixed precision's use: bfloat16 rows against float32 weights (cast inside); the outputs are bfloat16,
    the weights' gradients float32 and within bfloat16's rounding of the float32 ones."""
    rng = np.random.default_rng(2)
    x = tf.constant(rng.normal(size=(7, 4)), tf.float32)
    kernel, bias = tf.Variable(rng.normal(size=(4, 3)), dtype=tf.float32), tf.Variable(rng.normal(size=3), dtype=tf.float32)

    def gradients(rows):
        with tf.GradientTape() as tape:
            outputs = dense(rows, kernel, bias, "relu", training=True)
            loss = tf.reduce_sum(tf.cast(outputs, tf.float32) * tf.range(1.0, 4.0))
        return outputs, tape.gradient(loss, [kernel, bias])

    low, (d_kernel, d_bias) = gradients(tf.cast(x, tf.bfloat16))
    _, (want_kernel, want_bias) = gradients(x)
    assert low.dtype == tf.bfloat16 and d_kernel.dtype == tf.float32 and d_bias.dtype == tf.float32
    np.testing.assert_allclose(d_kernel.numpy(), want_kernel.numpy(), rtol=0.05, atol=0.05)
    np.testing.assert_allclose(d_bias.numpy(), want_bias.numpy(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("shared", [False, True])
def test_output_layers_write_the_gradient_out_in_training_only(shared):
    """``Logits`` (a ``keras.layers.Dense``) and ``SharedLogits`` give Dense's / the table's numbers either way; in
    training their rows' gradient has no ``BiasAddGrad``, and otherwise (a decoding step) the graph holds no
    custom-gradient ``IdentityN``."""
    embedding = Embedding(vocab_size=7, num_units=4)
    embedding.build()
    layer = SharedLogits(embedding) if shared else Logits(7)
    layer.build((None, 4))
    rng = np.random.default_rng(3)
    for weight in layer.weights:
        weight.assign(rng.normal(size=weight.shape).astype(np.float32))
    kernel = embedding.lookup_table.numpy().T if shared else layer.kernel.numpy()
    x = rng.normal(size=(5, 4)).astype(np.float32)

    @tf.function
    def run(x, training):
        with tf.GradientTape() as tape:
            logits = layer(x, training=training)
            loss = tf.reduce_sum(logits * tf.range(7.0))
        return logits, tape.gradient(loss, layer.bias)

    for training in (True, False):
        logits, d_bias = run(tf.constant(x), training)
        np.testing.assert_allclose(logits.numpy(), x @ kernel + layer.bias.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(d_bias.numpy(), 5 * np.arange(7.0), rtol=1e-6)
        ops = {n.type for n in run.get_concrete_function(tf.constant(x), training).graph.get_operations()}
        assert ("BiasAddGrad" in ops) != training and ("IdentityN" in ops) == training, (training, sorted(ops))

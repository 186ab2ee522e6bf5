"""Tests for :func:`tf_transformer.nn.modules.batched_matmul`: ``tf.matmul`` of equal batches with a plain gradient
(two matmuls, no broadcast reduction)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import batched_matmul

# (dtype, rtol/atol): bfloat16 keeps 8 bits of mantissa, and rounds the products' sums.
DTYPES = [(tf.float32, 1e-5), (tf.bfloat16, 3e-2)]


def operands(transpose_b, seed=0, batch=6, n=5, k=4, m=3):
    """(B, n, k) a, b of (B, k, m) (or (B, m, k) with ``transpose_b``) and an upstream gradient g of (B, n, m)."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(batch, n, k)).astype("float32")
    b = rng.normal(size=(batch, m, k) if transpose_b else (batch, k, m)).astype("float32")
    return a, b, rng.normal(size=(batch, n, m)).astype("float32")


def numpy_matmul_and_gradients(a, b, g, transpose_b):
    """c = a @ B with B = b (or b^T) and, for an upstream gradient g of c, g @ B^T and a^T @ g, in float64."""
    a, b, g = (x.astype(np.float64) for x in (a, b, g))
    b_ = np.swapaxes(b, 1, 2) if transpose_b else b
    d_b = np.einsum("bnk,bnm->bkm", a, g)
    return a @ b_, g @ np.swapaxes(b_, 1, 2), np.swapaxes(d_b, 1, 2) if transpose_b else d_b


def values_and_gradients(matmul, a, b, g, transpose_b):
    """``matmul(a, b, transpose_b=...)`` and its gradients w.r.t. a and b for the upstream gradient g."""
    with tf.GradientTape() as tape:
        tape.watch([a, b])
        c = matmul(a, b, transpose_b=transpose_b)
    return (c, *tape.gradient(c, [a, b], output_gradients=tf.cast(g, c.dtype)))


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("dtype, tolerance", DTYPES)
def test_equals_matmul_and_numpy(transpose_b, dtype, tolerance):
    """Values and both gradients equal tf.matmul's (its registered gradient) and the numpy restatement's."""
    a, b, g = operands(transpose_b)
    ta, tb = tf.constant(a, dtype), tf.constant(b, dtype)
    got = values_and_gradients(batched_matmul, ta, tb, g, transpose_b)
    reference = values_and_gradients(tf.matmul, ta, tb, g, transpose_b)
    rounded = [tf.cast(tf.cast(x, dtype), tf.float64).numpy() for x in (a, b, g)]
    expected = numpy_matmul_and_gradients(*rounded, transpose_b)
    for name, x, y, z in zip(("value", "d_a", "d_b"), got, reference, expected):
        assert x.dtype == dtype and x.shape == y.shape, name
        x, y = x.numpy().astype(np.float64), y.numpy().astype(np.float64)
        np.testing.assert_allclose(x, y, rtol=tolerance, atol=tolerance, err_msg=name)
        np.testing.assert_allclose(x, z, rtol=tolerance, atol=tolerance * np.abs(z).max(), err_msg=name)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_unknown_batch_dims_in_a_function(transpose_b):
    """Traced with every dim unknown (the packed attention's dynamic shapes): the same values and gradients,
    and the gradient graph has no broadcast reduction (BroadcastGradientArgs, Sum) and no custom gradient's
    pass-through (IdentityN, and ZerosLike of the inputs)."""
    a, b, g = operands(transpose_b, seed=1)
    signature = [tf.TensorSpec([None, None, None], tf.float32)] * 3

    def step(matmul):
        @tf.function(input_signature=signature)
        def run(a, b, g):
            return values_and_gradients(matmul, a, b, g, transpose_b)

        return run

    ours, stock = step(batched_matmul), step(tf.matmul)
    for x, y, z in zip(ours(a, b, g), stock(a, b, g), numpy_matmul_and_gradients(a, b, g, transpose_b)):
        np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(x.numpy(), z, rtol=1e-5, atol=1e-5)

    def op_types(run):
        return {op.type for op in run.get_concrete_function().graph.get_operations()}

    assert "BroadcastGradientArgs" in op_types(stock)  # what the test would miss if the stock one changed
    assert not {"BroadcastGradientArgs", "Sum", "IdentityN", "ZerosLike"} & op_types(ours)

"""Tests for :func:`tf_transformer.nn.modules.decoding_matmul`: incremental decoding's attention products, float32
with one query a row as ``BatchMatMulV3`` (TensorFlow's own kernel, which the oneDNN rewrite leaves alone), beam
search's k queries a row as one-row products against keys broadcast to them (``BatchMatMulV3`` as well)."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import decoding_matmul, row_products


def operands(n, transpose_b, dtype, seed=0, batch=8, k=16, m=5):
    """(B, n, k) a and b of (B, k, m), or (B, m, k) with ``transpose_b``, in ``dtype``; and both in float64."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(batch, n, k))
    b = rng.normal(size=(batch, m, k) if transpose_b else (batch, k, m))
    return tf.constant(a, dtype), tf.constant(b, dtype), a, b


def matmul_operand_shapes(n, transpose_b, dtype):
    """(op type, its operands' static shapes) of every matmul op in decoding_matmul's traced graph for (B, n, k)
    operands of ``dtype``."""
    a, b, _, _ = operands(n, transpose_b, dtype)
    graph = tf.function(lambda a, b: decoding_matmul(a, b, transpose_b=transpose_b)).get_concrete_function(a, b).graph
    return [(op.type, [tuple(x.shape) for x in op.inputs]) for op in graph.get_operations() if "MatMul" in op.type]


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("dtype, tolerance", [(tf.float32, 1e-5), (tf.bfloat16, 3e-2)])
@pytest.mark.parametrize("k, m", [(16, 5), (64, 100)])  # 4 * 64 * 100 multiply-adds a product: above 128 * 128
def test_equals_the_product_in_float64(n, transpose_b, dtype, tolerance, k, m):
    a, b, a64, b64 = operands(n, transpose_b, dtype, k=k, m=m)
    expected = a64 @ (np.swapaxes(b64, 1, 2) if transpose_b else b64)
    for product in (decoding_matmul(a, b, transpose_b=transpose_b),
                    tf.function(lambda a, b: decoding_matmul(a, b, transpose_b=transpose_b))(a, b)):
        assert product.dtype == dtype and product.shape == expected.shape
        np.testing.assert_allclose(tf.cast(product, tf.float64).numpy(), expected, rtol=tolerance,
                                   atol=tolerance * 4)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_float32_with_one_query_a_row_is_batch_matmul_v3(transpose_b):
    b_shape = (8, 5, 16) if transpose_b else (8, 16, 5)
    assert matmul_operand_shapes(1, transpose_b, tf.float32) == [("BatchMatMulV3", [(8, 1, 16), b_shape])]


@pytest.mark.parametrize("transpose_b", [False, True])
def test_float32_beam_queries_are_one_row_products_against_broadcast_keys(transpose_b):
    """As ``BatchMatMulV3`` too: TensorFlow's kernel, not oneDNN's, where oneDNN is on."""
    b_shape = (8, 1, 5, 16) if transpose_b else (8, 1, 16, 5)
    assert matmul_operand_shapes(4, transpose_b, tf.float32) == [("BatchMatMulV3", [(8, 4, 1, 16), b_shape])]


def test_bfloat16_keeps_tf_matmul():
    assert matmul_operand_shapes(1, True, tf.bfloat16) == [("BatchMatMulV2", [(8, 1, 16), (8, 5, 16)])]


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_bfloat16_queries_against_a_float32_cache_are_float32_products(n, transpose_b):
    """A bfloat16 model's queries (or attention weights) against its float32 cache (modules.decoding_dtype): the
    float32 product of the bfloat16 values, by float32's kernels (TensorFlow's ``BatchMatMulV3``)."""
    a, _, _, _ = operands(n, transpose_b, tf.bfloat16)
    _, b, _, b64 = operands(n, transpose_b, tf.float32)
    a64 = tf.cast(a, tf.float64).numpy()  # the values bfloat16 holds
    product = tf.function(lambda a, b: decoding_matmul(a, b, transpose_b=transpose_b))(a, b)
    assert product.dtype == tf.float32
    np.testing.assert_allclose(product.numpy(), a64 @ (np.swapaxes(b64, 1, 2) if transpose_b else b64), rtol=1e-5,
                               atol=1e-5)
    graph = tf.function(lambda a, b: decoding_matmul(a, b, transpose_b=transpose_b)).get_concrete_function(a, b).graph
    matmuls = [op for op in graph.get_operations() if "MatMul" in op.type]
    assert [(op.type, {x.dtype for x in op.inputs}) for op in matmuls] == [("BatchMatMulV3", {tf.float32})]


@pytest.mark.parametrize("n", [1, 4])
def test_compiles_under_xla_to_the_product_in_float64(n):
    a, b, a64, b64 = operands(n, True, tf.float32)
    compiled = tf.function(lambda a, b: decoding_matmul(a, b, transpose_b=True), jit_compile=True)(a, b)
    np.testing.assert_allclose(compiled.numpy(), a64 @ np.swapaxes(b64, 1, 2), rtol=1e-5, atol=4e-5)


@pytest.mark.parametrize("n", [1, 4, 30])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_row_products_equal_the_product_in_float64(n, transpose_b):
    a, b, a64, b64 = operands(n, transpose_b, tf.float32, k=64, m=100)
    product = row_products(a, b, transpose_b)
    assert product.shape == (8, n, 100)
    np.testing.assert_allclose(product.numpy(), a64 @ (np.swapaxes(b64, 1, 2) if transpose_b else b64), rtol=1e-5,
                               atol=1e-4)

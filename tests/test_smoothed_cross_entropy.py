"""Tests for :func:`tf_transformer.nn.model.smoothed_cross_entropy`: the label-smoothed loss with the logits'
gradient only."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.model import smoothed_cross_entropy

EPSILON, VOCAB = 0.1, 11


def numpy_loss_and_gradient(labels, logits, upstream, epsilon=EPSILON):
    """float64 restatement: q the smoothed one-hot, loss ``-(q * log_softmax(z)).sum(-1)``,
    its gradient w.r.t. z ``upstream * (softmax(z) - q)``."""
    z = logits.astype(np.float64)
    vocab = z.shape[-1]
    q = np.full(z.shape, epsilon / vocab)
    np.put_along_axis(q, labels[..., None], 1.0 - epsilon + epsilon / vocab, axis=-1)
    log_softmax = z - z.max(-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(-1, keepdims=True))
    return -(q * log_softmax).sum(-1), upstream[..., None] * (np.exp(log_softmax) - q)


def stock_loss(labels, logits, epsilon=EPSILON):
    """The former formula: TensorFlow's cross-entropy (its registered gradient) on the smoothed one-hot."""
    logits = tf.cast(logits, tf.float32)
    off = epsilon / tf.cast(logits.shape[-1], tf.float32)  # as before, in float32
    targets = tf.one_hot(labels, logits.shape[-1], on_value=1.0 - epsilon + off, off_value=off)
    return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)


def loss_and_gradient(loss_fn, labels, logits, upstream):
    """``loss_fn(labels, logits)`` and the gradient of ``sum(upstream * loss)`` w.r.t. ``logits``."""
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = loss_fn(labels, logits)
        total = tf.reduce_sum(loss * upstream)
    return loss, tape.gradient(total, logits)


@pytest.mark.parametrize("shape", [(7,), (3, 5)], ids=["2-D", "3-D"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_equals_stock_formula_and_numpy(shape, dtype):
    """Loss and the logits' gradient (of a weighted sum of the losses) equal the stock op's and the numpy
    restatement's, for (M, V) and (N, T, V) logits in float32 and bfloat16 (cast to float32 first)."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, VOCAB, size=shape).astype(np.int32)
    logits = tf.constant(rng.normal(scale=3.0, size=(*shape, VOCAB)).astype(np.float32), dtype)
    upstream = rng.uniform(0.5, 2.0, size=shape).astype(np.float32)
    loss, gradient = loss_and_gradient(smoothed_cross_entropy, labels, logits, upstream)
    stock, stock_gradient = loss_and_gradient(stock_loss, labels, logits, upstream)
    expected, expected_gradient = numpy_loss_and_gradient(labels, tf.cast(logits, tf.float32).numpy(), upstream)
    assert loss.dtype == tf.float32 and loss.shape == shape
    assert gradient.dtype == dtype and gradient.shape == logits.shape
    np.testing.assert_array_equal(loss.numpy(), stock.numpy())  # the same fused op
    np.testing.assert_array_equal(gradient.numpy(), stock_gradient.numpy())
    np.testing.assert_allclose(loss.numpy(), expected, rtol=1e-5)
    rounding = 1e-6 if dtype == tf.float32 else 1e-2 * np.abs(expected_gradient).max()
    np.testing.assert_allclose(tf.cast(gradient, tf.float32).numpy(), expected_gradient, rtol=1e-4, atol=rounding)


def test_traced_gradient_has_no_labels_gradient():
    """In a function with unknown shapes: the same loss and gradient as the stock formula, and the backward
    computes no log-softmax (the registered gradient's labels' term)."""
    rng = np.random.default_rng(1)
    labels = rng.integers(0, VOCAB, size=9).astype(np.int32)
    logits = rng.normal(size=(9, VOCAB)).astype(np.float32)
    upstream = np.ones(9, np.float32)

    def traced(loss_fn):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.int32), tf.TensorSpec([None, VOCAB], tf.float32)])
        def run(labels, logits):
            return loss_and_gradient(loss_fn, labels, logits, upstream[0])

        return run

    ours, stock = traced(smoothed_cross_entropy), traced(stock_loss)
    for x, y in zip(ours(labels, logits), stock(labels, logits)):
        np.testing.assert_array_equal(x.numpy(), y.numpy())

    def op_types(run):
        return {op.type for op in run.get_concrete_function().graph.get_operations()}

    assert "LogSoftmax" in op_types(stock)
    assert "LogSoftmax" not in op_types(ours)

"""Tests for the compiled training loss (``tf_transformer.nn.loss``) against a numpy restatement."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.loss import compiled_smoothed_cross_entropy
from tf_transformer.nn.model import smoothed_cross_entropy


def numpy_smoothed(labels, logits, epsilon):
    """(losses, d losses / d logits) of -sum(q * log_softmax(z)), q = (1 - epsilon) one_hot + epsilon / V, float64."""
    z = logits.astype(np.float64)
    vocab = z.shape[-1]
    q = np.full(z.shape, epsilon / vocab)
    q[np.arange(len(labels)), labels] += 1.0 - epsilon
    shifted = z - z.max(-1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return -(q * log_softmax).sum(-1), np.exp(log_softmax) - q


@pytest.mark.parametrize("dtype, tolerance", [(tf.float32, 1e-5), (tf.bfloat16, 2e-2)])
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_losses_hits_and_gradient_equal_numpy(dtype, tolerance, epsilon):
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=3.0, size=(13, 37)).astype("float32")
    labels = rng.integers(0, 37, size=13).astype("int32")
    labels[:4] = logits[:4].argmax(-1)  # some hits
    weights = rng.uniform(size=13).astype("float32")  # the upstream gradient of each row's loss
    z = tf.cast(tf.constant(logits), dtype)
    with tf.GradientTape() as tape:
        tape.watch(z)
        got = compiled_smoothed_cross_entropy(tf.constant(labels), z, epsilon)
        weighted = tf.reduce_sum(got.losses * weights)
    d_logits = tape.gradient(weighted, z)
    rounded = tf.cast(z, tf.float32).numpy()  # the logits the op saw
    losses, gradient = numpy_smoothed(labels, rounded, epsilon)
    np.testing.assert_allclose(got.losses.numpy(), losses, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(got.hits.numpy(), (rounded.argmax(-1) == labels).astype("float32"))
    assert got.hits.numpy()[:4].all() and got.losses.dtype == tf.float32 and d_logits.dtype == dtype
    np.testing.assert_allclose(tf.cast(d_logits, tf.float32).numpy(), gradient * weights[:, None],
                               rtol=tolerance, atol=tolerance)


def test_equals_the_op_by_op_loss_in_values_and_gradients():
    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(21, 50)).astype("float32"))
    labels = tf.constant(rng.integers(0, 50, size=21).astype("int64"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        compiled = tf.reduce_sum(compiled_smoothed_cross_entropy(labels, logits, 0.1).losses)
        op_by_op = tf.reduce_sum(smoothed_cross_entropy(labels, logits, 0.1))
    assert float(compiled) == pytest.approx(float(op_by_op), rel=1e-6)
    np.testing.assert_allclose(tape.gradient(compiled, logits).numpy(), tape.gradient(op_by_op, logits).numpy(),
                               atol=1e-6)


def test_a_label_tied_with_the_largest_logit_is_a_hit_and_large_logits_stay_finite():
    """hits: the label's logit is the largest (a tie counts, where argmax's first index would not); the
    log-sum-exp form keeps rows of logits in the hundreds finite and equal to numpy's."""
    logits = np.array([[1.0, 5.0, 5.0, -2.0], [300.0, -250.0, 299.0, 0.0], [0.0, 0.0, 0.0, 0.0]], np.float32)
    labels = np.array([2, 2, 3], np.int32)
    z = tf.constant(logits)
    with tf.GradientTape() as tape:
        tape.watch(z)
        got = compiled_smoothed_cross_entropy(tf.constant(labels), z, 0.1)
        total = tf.reduce_sum(got.losses)
    np.testing.assert_array_equal(got.hits.numpy(), [1.0, 0.0, 1.0])
    losses, gradient = numpy_smoothed(labels, logits, 0.1)
    np.testing.assert_allclose(got.losses.numpy(), losses, rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(total, z).numpy(), gradient, atol=1e-6)

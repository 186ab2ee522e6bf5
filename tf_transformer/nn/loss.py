"""The training loss on packed rows as two XLA computations: label-smoothed cross-entropy and its gradient.

The loss of :func:`~tf_transformer.nn.model.smoothed_cross_entropy` (the blog's
``softmax_cross_entropy(label_smoothing(one_hot(labels)), logits)``) of each row's
logits ``z`` (V,) and label ``y``, with ``q = (1 - epsilon) * one_hot(y) + epsilon / V``:

    loss = -sum(q * log_softmax(z)),    d loss / d z = softmax(z) - q

Op by op, TensorFlow writes the smoothed one-hot, the fused op's backprop and its
product with the upstream gradient: three (M, V) tensors beside the logits.
Here the forward reads the logits once and writes the (M,) losses and argmax
hits, the backward reads them once more and writes only the (M, V) gradient.
XLA compiles for every shape: for rows of a few distinct counts only (training's
bucketed :class:`~tf_transformer.nn.modules.Packing`).
"""

from typing import NamedTuple

import tensorflow as tf


class TokenLosses(NamedTuple):
    """Per-row results: ``losses`` (M,) float32 label-smoothed cross-entropy, ``hits`` (M,) float32 1/0 argmax hits."""

    losses: tf.Tensor
    hits: tf.Tensor


def smoothed_targets(labels, vocab, epsilon):
    """(...) int labels -> (..., V) float32 ``(1 - epsilon) * one_hot + epsilon / V``, the blog's
    ``label_smoothing(one_hot(labels))``, made by ``one_hot``'s on and off values (``vocab``: int or () tensor)."""
    off = epsilon / tf.cast(vocab, tf.float32)
    return tf.one_hot(labels, vocab, on_value=1.0 - epsilon + off, off_value=off)


def argmax_hits(labels, logits):
    """(...) float32: 1 where the argmax of ``logits`` (..., V) is the label."""
    return tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=labels.dtype), labels), tf.float32)


@tf.function(jit_compile=True)
def _smoothed_loss(labels, logits, epsilon):
    logits = tf.cast(logits, tf.float32)
    targets = smoothed_targets(labels, logits.shape[-1], epsilon)
    return -tf.reduce_sum(targets * tf.nn.log_softmax(logits), axis=-1), argmax_hits(labels, logits)


@tf.function(jit_compile=True)
def _smoothed_loss_gradient(upstream, labels, logits, epsilon):
    z = tf.cast(logits, tf.float32)
    d_logits = (tf.nn.softmax(z) - smoothed_targets(labels, z.shape[-1], epsilon)) * upstream[:, None]
    return tf.cast(d_logits, logits.dtype)


def compiled_smoothed_cross_entropy(labels, logits, epsilon=0.1):
    """Label-smoothed cross-entropy and argmax hits of each row, forward and backward each one XLA computation.

    Args:
      labels: (M,) int ids; logits: (M, V) float (cast to float32 inside); epsilon: python float.
    Returns:
      :class:`TokenLosses` of (M,) float32; the gradient reaches ``logits`` (in their dtype) through ``losses``.
    """

    @tf.custom_gradient
    def smoothed(logits):
        losses, hits = _smoothed_loss(labels, logits, epsilon)

        def gradient(d_losses, d_hits):  # hits are a count: no gradient
            return _smoothed_loss_gradient(d_losses, labels, logits, epsilon)

        return (losses, hits), gradient

    return TokenLosses(*smoothed(logits))

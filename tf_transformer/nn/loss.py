"""The training loss on packed rows as two XLA computations: label-smoothed cross-entropy and its gradient.

The loss of :func:`~tf_transformer.nn.model.smoothed_cross_entropy` (the blog's
``softmax_cross_entropy(label_smoothing(one_hot(labels)), logits)``) of each row's
logits ``z`` (V,) and label ``y``, with ``q = (1 - epsilon) * one_hot(y) + epsilon / V``:

    loss = -sum(q * log_softmax(z)),    d loss / d z = softmax(z) - q

Op by op, TensorFlow writes the smoothed one-hot, the fused op's backprop and its
product with the upstream gradient: three (M, V) tensors beside the logits.
Here the forward reads the logits once, for the row reductions of

    loss = lse(z) - (1 - epsilon) * z[y] - epsilon / V * sum(z),    lse(z) = log(sum(exp(z)))

(``sum(q) = 1``), and writes the (M,) losses, hits and ``lse``; the backward reads
the logits once more, ``softmax(z) = exp(z - lse)`` with the forward's ``lse`` (no
reduction again), and writes only the (M, V) gradient. A row is a hit where its
label's logit is the largest (``z[y] >= max(z)``, no ``argmax`` pass: a label
tied with the largest logit counts as a hit).
XLA compiles for every shape: for rows of a few distinct counts only (training's
bucketed :class:`~tf_transformer.nn.modules.Packing`).
"""

from typing import NamedTuple

import tensorflow as tf


class TokenLosses(NamedTuple):
    """Per-row results: ``losses`` (M,) float32 label-smoothed cross-entropy, ``hits`` (M,) float32 1 where the
    label's logit is the largest, else 0."""

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


@tf.function(autograph=False, jit_compile=True)
def _smoothed_loss(labels, logits, epsilon):
    """(M,) losses, hits and log-sum-exp of the rows of ``logits`` (the module docstring)."""
    z = tf.cast(logits, tf.float32)
    largest = tf.reduce_max(z, axis=-1)
    lse = largest + tf.math.log(tf.reduce_sum(tf.exp(z - largest[:, None]), axis=-1))
    label_logit = tf.gather(z, labels, axis=1, batch_dims=1)
    losses = lse - (1.0 - epsilon) * label_logit - epsilon / z.shape[-1] * tf.reduce_sum(z, axis=-1)
    return losses, tf.cast(label_logit >= largest, tf.float32), lse


@tf.function(autograph=False, jit_compile=True)
def _smoothed_loss_gradient(upstream, labels, logits, lse, epsilon):
    """(M, V) ``(softmax(z) - q) * upstream``, the softmax as ``exp(z - lse)`` of the forward's ``lse``."""
    z = tf.cast(logits, tf.float32)
    d_logits = (tf.exp(z - lse[:, None]) - smoothed_targets(labels, z.shape[-1], epsilon)) * upstream[:, None]
    return tf.cast(d_logits, logits.dtype)


def compiled_smoothed_cross_entropy(labels, logits, epsilon=0.1):
    """Label-smoothed cross-entropy and hits of each row, forward and backward each one XLA computation.

    Args:
      labels: (M,) int ids; logits: (M, V) float (cast to float32 inside); epsilon: python float.
    Returns:
      :class:`TokenLosses` of (M,) float32; the gradient reaches ``logits`` (in their dtype) through ``losses``.
    """

    @tf.custom_gradient
    def smoothed(logits):
        losses, hits, lse = _smoothed_loss(labels, logits, epsilon)

        def gradient(d_losses, d_hits):  # hits are a count: no gradient
            return _smoothed_loss_gradient(d_losses, labels, logits, lse, epsilon)

        return (losses, hits), gradient

    return TokenLosses(*smoothed(logits))

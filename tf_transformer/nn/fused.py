"""A sub-layer's tail as one computation: residual dropout, residual add and layer norm, with a fused gradient.

Each attention and feed-forward sub-layer ends with
``layer_norm(dropout(outputs) + residual)`` (steps 10-11 of
:class:`~tf_transformer.nn.modules.MultiheadAttention`). Left to autodiff, its
gradient is a long chain of small element-wise ops (the mean's broadcast, the
variance's, the rsqrt's, the dropout's select, the casts of mixed precision).
:func:`residual_layer_norm` computes the same numbers with the gradient derived
by hand: for ``x_hat = (x - mean) * r``, ``r = 1 / sqrt(var + epsilon)``, ``g = dy * gamma``,

    dx = r * (g - mean(g) - x_hat * mean(g * x_hat))

over the last axis, ``dgamma = sum(dy * x_hat)`` and ``dbeta = sum(dy)`` over the rows,
and the dropout's gradient ``dx * keep`` with the ``keep`` multiplier of the forward pass.

The dropout is Keras' (``tf.nn.experimental.stateless_dropout``): the same uniform numbers of the
same seed, kept where ``>= rate`` and scaled by ``1 / (1 - rate)``, so for a seed drawn from a
``keras.layers.Dropout``'s ``seed_generator`` the mask is the layer's own (runs stay deterministic,
and the generator's state, checkpointed, advances as before).

Plain TensorFlow ops, not an XLA island: the packed rows' count changes with every batch, and XLA
compiles for each shape (``bench/fused_norm.py``'s ``fused-xla``, measured several times slower).
"""

import tensorflow as tf


def keep_multiplier(shape, rate, seed, dtype):
    """Keras' dropout mask of ``seed`` as a multiplier: ``1 / (1 - rate)`` where kept, 0 where dropped.

    Args:
      shape: the (..., C) shape; rate: python float in (0, 1); seed: (2,) int tensor; dtype: the inputs'.
    Returns:
      a ``shape`` tensor of ``dtype``.
    """
    uniform = tf.random.stateless_uniform(shape, tf.cast(seed, tf.int32), dtype=dtype)
    return tf.where(uniform >= rate, tf.constant(1.0 / (1.0 - rate), dtype), tf.constant(0.0, dtype))


def normalize(x, epsilon):
    """Layer norm's statistics over the last axis: ``x`` (..., C) float32 -> (x_hat (..., C),
    rsqrt_variance (..., 1)), ``x_hat = (x - mean) * rsqrt_variance``, with the population variance."""
    centered = x - tf.reduce_mean(x, axis=-1, keepdims=True)
    rsqrt_variance = tf.math.rsqrt(tf.reduce_mean(tf.square(centered), axis=-1, keepdims=True) + epsilon)
    return centered * rsqrt_variance, rsqrt_variance


def layer_norm_gradient(dy, x_hat, rsqrt_variance, gamma):
    """The gradient of ``x_hat * gamma + beta`` w.r.t. the layer norm's input and weights.

    Args:
      dy: (..., C) float32 gradient of the output; x_hat: (..., C) float32 normalized input;
      rsqrt_variance: (..., 1) float32 ``1 / sqrt(var + epsilon)``; gamma: (C,) float32.
    Returns:
      (dx (..., C), dgamma (C,), dbeta (C,)), float32.
    """
    rows = list(range(dy.shape.rank - 1))
    g = dy * gamma
    mean_g = tf.reduce_mean(g, axis=-1, keepdims=True)
    mean_g_x_hat = tf.reduce_mean(g * x_hat, axis=-1, keepdims=True)
    dx = rsqrt_variance * (g - mean_g - x_hat * mean_g_x_hat)
    return dx, tf.reduce_sum(dy * x_hat, axis=rows), tf.reduce_sum(dy, axis=rows)


def residual_layer_norm(outputs, residual, gamma, beta, epsilon, rate=0.0, seed=None):
    """``layer_norm(dropout(outputs) + residual)`` with a hand-derived gradient (the module docstring).

    The dropout and the residual add run in the inputs' dtype, the layer norm in float32 (as
    :class:`~tf_transformer.nn.modules.LayerNorm`), the output in the inputs' dtype.

    Args:
      outputs, residual: (..., C) of one float dtype.
      gamma, beta: (C,) float32 tensors.
      epsilon: python float, added to the variance.
      rate: dropout rate of ``outputs``; 0 or ``seed`` None: no dropout.
      seed: (2,) int tensor, the dropout's stateless seed.
    Returns:
      (..., C) in the inputs' dtype.
    """
    dtype = outputs.dtype
    keep = keep_multiplier(tf.shape(outputs), rate, seed, dtype) if rate and seed is not None else None

    @tf.custom_gradient
    def tail(outputs, residual, gamma, beta):
        x = tf.cast((outputs if keep is None else outputs * keep) + residual, tf.float32)
        x_hat, rsqrt_variance = normalize(x, epsilon)

        def gradient(dy):
            with tf.name_scope("layer_norm_gradient"):  # where bench/step_profile.py finds layer norm's ops
                dx, dgamma, dbeta = layer_norm_gradient(tf.cast(dy, tf.float32), x_hat, rsqrt_variance, gamma)
                d_residual = tf.cast(dx, dtype)
                return (d_residual if keep is None else d_residual * keep), d_residual, dgamma, dbeta

        return tf.cast(x_hat * gamma + beta, dtype), gradient

    return tail(outputs, residual, gamma, beta)

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

The dropout keeps an element where its uniform number is ``>= rate`` and scales it by
``1 / (1 - rate)``, as Keras' (``tf.nn.experimental.stateless_dropout``); the seed is drawn from the
``keras.layers.Dropout``'s ``seed_generator`` (runs stay deterministic, and the generator's state,
checkpointed, advances as before). The uniform numbers are not TensorFlow's Philox stream but a keyed
integer hash of each element's index (:func:`hashed_uniform`): a handful of integer ops per element
that XLA fuses into the tail's own pass, where TensorFlow's Philox kernel was a pass of its own for each
tail, and nothing to keep for the backward pass, which recomputes them. The attention weights' dropout
takes the same numbers from one small XLA computation (:func:`keep_of_size`).

``compiled=True`` runs the forward and the backward pass each as one XLA-compiled function (the
element-wise chain fused into a few passes over the rows, the backward recomputing ``x_hat`` and the
dropout's numbers rather than keeping them). XLA compiles for every shape, so this is for rows whose
count comes in a few values: training's bucketed :class:`~tf_transformer.nn.modules.Packing`; plain
TensorFlow ops otherwise (each batch's own count of packed rows would compile again,
``bench/fused_norm.py``'s ``fused-xla``), with the same dropout numbers. Inside XLA (these computations,
and the compiled decoding loops' :class:`~tf_transformer.nn.modules.LayerNorm`), the row means are
:func:`row_reduce`'s: one kernel each, where XLA:CPU makes two of a plain mean.
"""

import tensorflow as tf
from tensorflow.python.ops import control_flow_util  # whether a graph is inside XLA: no public API says


# lowbias32 (Chris Wellons' hash-prospector): x ^= x >> 16; x *= M1; x ^= x >> 15; x *= M2; x ^= x >> 16.
HASH_SHIFTS, HASH_MULTIPLIERS = (16, 15, 16), (0x7FEB352D, 0x846CA68B)
UNIFORM_BITS = 24  # the uniform numbers' bits: floats in [0, 1) on a grid of 2^-24, exact in float32


def mix32(x):
    """The lowbias32 integer hash, a bijection of uint32 whose output bits each flip with about half of any
    input bit's flips: (...) uint32 -> (...) uint32."""
    for i, shift in enumerate(HASH_SHIFTS):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, tf.constant(shift, tf.uint32)))
        if i < len(HASH_MULTIPLIERS):
            x = x * tf.constant(HASH_MULTIPLIERS[i], tf.uint32)
    return x


def hashed_uniform(shape, seed):
    """Dropout's uniform numbers for ``seed``: a float32 ``shape`` tensor in [0, 1).

    Element ``i`` (row-major index) gets ``mix32(mix32(i ^ a) ^ b) >> 8`` times ``2^-24``, with the keys
    ``a = mix32(seed[0] ^ mix32(seed[1]))``, ``b = mix32(a ^ 0x9E3779B9)``: two keyed rounds, so the
    numbers of two seeds are not shifted copies of one stream. Integer ops only, the same in plain
    TensorFlow and inside an XLA computation (where they fuse with their consumer).

    Args:
      shape: the shape (a list or a 1-D int tensor) of fewer than 2^31 elements; seed: (2,) int tensor.
    """
    keys = tf.bitcast(tf.cast(seed, tf.int32), tf.uint32)
    a = mix32(tf.bitwise.bitwise_xor(keys[0], mix32(keys[1])))
    b = mix32(tf.bitwise.bitwise_xor(a, tf.constant(0x9E3779B9, tf.uint32)))
    index = tf.bitcast(tf.reshape(tf.range(tf.reduce_prod(shape), dtype=tf.int32), shape), tf.uint32)
    bits = mix32(tf.bitwise.bitwise_xor(mix32(tf.bitwise.bitwise_xor(index, a)), b))
    grid = tf.bitwise.right_shift(bits, tf.constant(32 - UNIFORM_BITS, tf.uint32))
    return tf.cast(grid, tf.float32) * (1.0 / (1 << UNIFORM_BITS))


def keep_of_uniform(uniform, rate, dtype):
    """Dropout's multiplier of its ``uniform`` numbers: ``1 / (1 - rate)`` where ``>= rate``, else 0, in ``dtype``."""
    return tf.where(uniform >= rate, tf.constant(1.0 / (1.0 - rate), dtype), tf.constant(0.0, dtype))


def keep_multiplier(shape, rate, seed, dtype):
    """A sub-layer tail's dropout mask of ``seed`` as a multiplier: ``1 / (1 - rate)`` where
    :func:`hashed_uniform` is ``>= rate`` (kept), 0 where it is not (dropped).

    Args:
      shape: the (..., C) shape; rate: python float in (0, 1); seed: (2,) int tensor; dtype: the inputs'.
    Returns:
      a ``shape`` tensor of ``dtype``.
    """
    return keep_of_uniform(hashed_uniform(shape, seed), rate, dtype)


@tf.function(autograph=False, jit_compile=True)
def _compiled_dropout(x, seed, rate):
    """``x`` times :func:`keep_multiplier` of ``seed``: one XLA computation."""
    return x * keep_multiplier(tf.shape(x), rate, seed, x.dtype)


def dropout_rows(x, rate, seed):
    """Dropout of (M, C) rows whose count comes in a few values (a bucketed packing's): ``x`` times
    :func:`keep_multiplier` of ``seed``, one XLA computation forward and one backward, which recomputes the
    mask (the gradient is ``dy`` times the same multiplier). ``seed``: (2,) int tensor; rate in (0, 1)."""
    seed = tf.cast(seed, tf.int32)

    @tf.custom_gradient
    def dropout(x):
        return _compiled_dropout(x, seed, rate), lambda dy: _compiled_dropout(dy, seed, rate)

    return dropout(x)


@tf.function(autograph=False, jit_compile=True)
def _compiled_keep(size, seed, rate, dtype):
    """:func:`keep_multiplier` of shape (``size``,), one XLA computation; ``size`` is a compile-time constant to
    XLA (a shape), so it compiles once per value."""
    return keep_multiplier(tf.reshape(size, [1]), rate, seed, dtype)


def keep_of_size(size, rate, seed, dtype):
    """:func:`keep_multiplier` of shape (``size``,) by one XLA computation, compiled once per ``size``: for
    sizes that come in a few values (rounded up by the caller), whose first elements are those of every
    shorter size (element ``i``'s number depends on ``i`` and the seed only).

    Args:
      size: () int32 tensor; rate: python float in (0, 1); seed: (2,) int tensor; dtype: the multiplier's.
    Returns:
      (size,) ``dtype``: ``1 / (1 - rate)`` where kept, 0 where dropped.
    """
    return _compiled_keep(tf.cast(size, tf.int32), tf.cast(seed, tf.int32), rate, dtype)


# XLA:CPU rewrites a reduction over more than this many elements into a reduce-window kernel and a
# reduce (its tree-reduction rewrite), and the reduce-window kernel reads its input from memory, where
# the ops making that input had to write it out first.
XLA_REDUCE_WIDTH = 32
# row_reduce combines at most this many blocks (rows of up to 512): LLVM's compile time grows steeply
# with the chain (a 4,000-wide row's 125 blocks, in a decoding loop: over 20 minutes).
MAX_BLOCKS = 16


def row_reduce(x, combine=tf.add, reduce=tf.reduce_sum):
    """``reduce`` over the last axis, in the form XLA:CPU computes in one pass: ``x`` (..., C) -> (..., 1).

    The (..., 32) column blocks of ``x`` are combined element-wise first (``combine``: ``tf.add`` for a
    sum, ``tf.maximum`` for a max), which XLA fuses with the ops that make ``x``, and only the 32 columns
    left are reduced (not rewritten: :data:`XLA_REDUCE_WIDTH`). A ``C`` unknown when tracing, not a
    multiple of 32, or of more than :data:`MAX_BLOCKS` blocks is reduced as it is. The same numbers as
    ``reduce(x, axis=-1, keepdims=True)`` up to the order of the additions.
    """
    width, columns = XLA_REDUCE_WIDTH, x.shape[-1]
    if columns is None or columns % width or not 2 <= columns // width <= MAX_BLOCKS:
        return reduce(x, axis=-1, keepdims=True)
    blocks = columns // width
    combined = x[..., :width]
    for block in range(1, blocks):
        combined = combine(combined, x[..., block * width:(block + 1) * width])
    return reduce(combined, axis=-1, keepdims=True)


def in_xla():
    """True while tracing inside an XLA-compiled function (``jit_compile=True``), its loops and branches
    included."""
    return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def _row_mean(x):
    """The mean over the last axis, (..., C) -> (..., 1): by :func:`row_reduce` inside XLA, where a plain
    reduction is two kernels and a pass through memory; outside, one op."""
    if not in_xla() or x.shape[-1] is None:
        return tf.reduce_mean(x, axis=-1, keepdims=True)
    return row_reduce(x) * (1.0 / x.shape[-1])


def normalize(x, epsilon):
    """Layer norm's statistics over the last axis: ``x`` (..., C) float32 -> (x_hat (..., C),
    rsqrt_variance (..., 1)), ``x_hat = (x - mean) * rsqrt_variance``, with the population variance."""
    centered = x - _row_mean(x)
    rsqrt_variance = tf.math.rsqrt(_row_mean(tf.square(centered)) + epsilon)
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
    mean_g = _row_mean(g)
    mean_g_x_hat = _row_mean(g * x_hat)
    dx = rsqrt_variance * (g - mean_g - x_hat * mean_g_x_hat)
    return dx, tf.reduce_sum(dy * x_hat, axis=rows), tf.reduce_sum(dy, axis=rows)


def _norm_inputs(outputs, residual, keep, bias=None):
    """``dropout(outputs + bias) + residual`` in float32: (..., C) of the inputs' dtype -> (..., C) float32."""
    outputs = outputs if bias is None else outputs + bias
    return tf.cast((outputs if keep is None else outputs * keep) + residual, tf.float32)


def _tail_gradient(dy, x_hat, rsqrt_variance, gamma, keep, dtype):
    """The gradients of a tail's inputs (outputs, residual, gamma, beta) from ``dy`` (..., C) of its output."""
    with tf.name_scope("layer_norm_gradient"):  # where bench/step_profile.py finds layer norm's ops
        dx, dgamma, dbeta = layer_norm_gradient(tf.cast(dy, tf.float32), x_hat, rsqrt_variance, gamma)
        d_residual = tf.cast(dx, dtype)
        return (d_residual if keep is None else d_residual * keep), d_residual, dgamma, dbeta


def _seeded_keep(outputs, rate, seed):
    """:func:`keep_multiplier` for ``outputs`` (its shape and dtype), or None without a ``seed`` (no dropout)."""
    return None if seed is None else keep_multiplier(tf.shape(outputs), rate, seed, outputs.dtype)


@tf.function(autograph=False, jit_compile=True)
def _compiled_tail(outputs, residual, bias, seed, gamma, beta, epsilon, rate):
    """The tail's output, one XLA computation (``seed``: the dropout's, or None: no dropout)."""
    keep = _seeded_keep(outputs, rate, seed)
    x_hat, _ = normalize(_norm_inputs(outputs, residual, keep, bias), epsilon)
    return tf.cast(x_hat * gamma + beta, outputs.dtype)


@tf.function(autograph=False, jit_compile=True)
def _compiled_tail_gradient(dy, outputs, residual, bias, seed, gamma, epsilon, rate):
    """:func:`_tail_gradient` of :func:`_compiled_tail`, one XLA computation recomputing ``x_hat`` and the
    dropout's mask, and the bias's gradient, the rows' sum of the outputs': (outputs, residual, gamma, beta,
    bias)."""
    keep = _seeded_keep(outputs, rate, seed)
    x_hat, rsqrt_variance = normalize(_norm_inputs(outputs, residual, keep, bias), epsilon)
    gradients = _tail_gradient(dy, x_hat, rsqrt_variance, gamma, keep, outputs.dtype)
    return (*gradients, tf.reduce_sum(gradients[0], axis=0))


def residual_layer_norm(outputs, residual, gamma, beta, epsilon, rate=0.0, seed=None, compiled=False, bias=None):
    """``layer_norm(dropout(outputs + bias) + residual)`` with a hand-derived gradient (the module docstring).

    The dropout and the residual add run in the inputs' dtype, the layer norm in float32 (as
    :class:`~tf_transformer.nn.modules.LayerNorm`), the output in the inputs' dtype.

    Args:
      outputs, residual: (..., C) of one float dtype.
      gamma, beta: (C,) float32 tensors.
      epsilon: python float, added to the variance.
      rate: dropout rate of ``outputs``; 0 or ``seed`` None: no dropout.
      seed: (2,) int tensor, the dropout's stateless seed.
      compiled: forward and backward as XLA computations (for rows of a few distinct counts only).
      bias: optional (C,) of the inputs' dtype, the bias of the dense layer that made ``outputs``
        (``outputs`` then without it): compiled, its add and its gradient (the rows' sum, otherwise
        a ``BiasAddGrad`` pass of its own) join the tail's.
    Returns:
      (..., C) in the inputs' dtype.
    """
    dtype = outputs.dtype
    dropout = bool(rate) and seed is not None
    if compiled:
        seed = tf.cast(seed, tf.int32) if dropout else None
        bias = tf.zeros(outputs.shape[-1:], dtype) if bias is None else bias  # one signature; adding 0 is exact

        @tf.custom_gradient
        def compiled_tail(outputs, residual, gamma, beta, bias):
            def gradient(dy):
                return _compiled_tail_gradient(dy, outputs, residual, bias, seed, gamma, epsilon, rate)

            return _compiled_tail(outputs, residual, bias, seed, gamma, beta, epsilon, rate), gradient

        return compiled_tail(outputs, residual, gamma, beta, bias)

    if bias is not None:
        outputs = tf.nn.bias_add(outputs, bias)
    keep = _seeded_keep(outputs, rate, seed if dropout else None)

    @tf.custom_gradient
    def tail(outputs, residual, gamma, beta):
        x_hat, rsqrt_variance = normalize(_norm_inputs(outputs, residual, keep), epsilon)

        def gradient(dy):
            return _tail_gradient(dy, x_hat, rsqrt_variance, gamma, keep, dtype)

        return tf.cast(x_hat * gamma + beta, dtype), gradient

    return tail(outputs, residual, gamma, beta)

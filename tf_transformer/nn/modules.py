"""The blog's building blocks, as Keras layers.

Every piece keeps the name it has in the original TF1 ``modules.py`` that the
blog (``shared/seeds/000``) walks through:

==========================  ===========================================
original TF1 function       here
==========================  ===========================================
``normalize``               :class:`LayerNorm`
``embedding``               :class:`Embedding` (``zero_pad``, ``scale``)
``positional_encoding``     :class:`PositionalEncoding`
``multihead_attention``     :class:`MultiheadAttention`
``feedforward``             :class:`FeedForward`
``label_smoothing``         :func:`label_smoothing`
``noam_scheme``             :class:`NoamSchedule`
==========================  ===========================================

Shapes use the blog's letters: ``N`` batch, ``T_q``/``T_k`` query/key length,
``C`` = ``num_units``, ``h`` = ``num_heads``.
"""

import inspect
import math
from typing import NamedTuple

import keras
import tensorflow as tf
from tensorflow.compiler.tf2xla.python.xla import dynamic_update_slice

from tf_transformer.nn import fused

# Step 4 of the blog: masked scores are replaced by this "very small number".
# In float32 it rounds to -4294967296.0; it overflows 16-bit floats, so masks are
# always applied to float32 scores (see MultiheadAttention.call).
MASK_VALUE = -(2.0**32) + 1
# How MultiheadAttention initializes its projection kernels: "glorot" over each (C_in, C) matrix
# (the blog's tf.layers.dense), or "per_head", Glorot over the per-head kernel shapes of Keras 2's
# (tf_keras, tf-models') MultiHeadAttention, which for C=256, h=4 starts Q/K/V 5.8x and W^O 1.6x smaller.
ATTENTION_INITS = ("glorot", "per_head")
# Columns added to a decoding kernel whose float32 rows are a multiple of 2 KiB apart (:func:`aligned_width`).
ALIGNMENT_PAD = 16
# Packed self-attention at inference (the growing loops' encoder) pads each of this many groups of a batch's
# sequences, sorted by length, to its own longest (:class:`LengthGroups`).
LENGTH_GROUPS = 4


def _register(cls):
    return keras.saving.register_keras_serializable(package="tf_transformer")(cls)


def _constructor_config(layer):
    """The options of ``type(layer).__init__``, each kept by the layer as an attribute of its name:
    the layer's part of ``get_config``."""
    parameters = inspect.signature(type(layer).__init__).parameters.values()
    return {p.name: getattr(layer, p.name) for p in parameters
            if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


def key_masks_from_inputs(x):
    """The blog's mask rule: ``sign(abs(reduce_sum(x, -1)))``.

    Args:
      x: (N, T, C) layer input.
    Returns:
      (N, T) float mask, 0 where the row of ``x`` sums to zero. Known defect:
      once positions are added no row is zero, so nothing is masked, and a real
      row whose components happen to sum to 0 is masked.
    """
    return tf.sign(tf.abs(tf.reduce_sum(x, axis=-1)))


def masks_from_embedding(embedded):
    """The default mask rule: ``sign(reduce_sum(abs(e), -1))`` of the token
    embedding *before* positions are added.

    The ``<PAD>`` row of :class:`Embedding` is exactly zero and no other row
    is, so this is 1 for real tokens and 0 for padding, in every block.

    Args:
      embedded: (N, T, C) zero-padded token embedding.
    Returns:
      (N, T) mask in the embedding's dtype.
    """
    return tf.sign(tf.reduce_sum(tf.abs(embedded), axis=-1))


# A bucketed Packing's least row count when none is given: every batch of fewer real rows compiles once.
LEAST_ROWS = 64


class Packing:
    """Where the real (non-pad) positions of a padded batch are, to run position-wise layers on them alone.

    Training with ``mask_source: embedding``: pad positions never reach a real
    one (key masks hide them, query masks zero them), so the Q/K/V and W^O
    projections, the feed-forward and the layer norms need only the M real
    rows, (M, C) instead of (N, T, C). Attention gathers its projections into
    heads of the (N, T) positions (:meth:`unpack_heads`; a pad holds a copy of a
    row: a masked key, and a query whose output is never packed) and packs its
    output again (:meth:`pack_heads`; "remove padding", as FasterTransformer
    does). Rows are in row-major order, as ``boolean_mask``.

    ``bucketed`` (training): the M real rows are followed by dummy rows up to
    :func:`bucketed_rows` (M), so the packed row count comes in a few values
    and XLA-compiled parts (the sub-layer tails, :func:`residual_norm`) compile
    a few times per run, not once per batch. A dummy row reads position (0, 0)
    when packed; unpacked, the pads hold the first dummy row instead of zeros
    (they are masked keys, and pad queries' outputs are never packed). A loss
    on packed rows keeps its first :attr:`real` rows: a dummy row then gets a zero
    gradient and adds nothing to any real one. A count is compiled the first
    time a batch brings it (0.2-1 s of CPU); the partial batches that end an
    epoch (each length bucket's last) bring new ones, which ``least_rows``
    gathers into one: training passes half a replica's ``batch_tokens``
    (:func:`~tf_transformer.train.step.least_packed_rows`), below its full
    batches' real rows.

    Args:
      masks: (N, T) 0/1 masks of the real positions.
      bucketed: pad the packed rows to a bucketed count (above).
      least_rows: (bucketed) the least packed row count, :func:`bucketed_rows`' ``least_rows``.

    Example:
      >>> packing = Packing(tf.constant([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
      >>> rows = packing.pack(tf.ones([2, 3, 4]))  # (3, 4)
      >>> packing.unpack(rows).shape
      TensorShape([2, 3, 4])
    """

    def __init__(self, masks, bucketed=False, least_rows=LEAST_ROWS):
        self.masks = masks
        self.bucketed, self.least_rows = bucketed, least_rows
        self.indices = tf.where(tf.not_equal(masks, 0))  # (M, 2) int64
        self.shape = tf.shape(masks, out_type=tf.int64)
        self._per_graph = {}
        real = tf.shape(self.indices, out_type=tf.int64)[0]
        # (N, T): each position's packed row; a pad's is the first dummy row (bucketed), else the first row.
        self.position_rows = tf.tensor_scatter_nd_update(
            tf.fill(tf.shape(masks), real if bucketed else tf.constant(0, tf.int64)), self.indices, tf.range(real))
        if bucketed:
            # No dummy row of an empty batch (N = 0): it would read a position that is not there.
            rows = tf.where(tf.size(masks) > 0, bucketed_rows(real, least_rows=least_rows), 0)
            self.indices = tf.concat([self.indices, tf.zeros([rows - real, 2], tf.int64)], axis=0)
        self.real = real  # () int64: the real rows, first

    def attention_bias(self, num_heads, causality):
        """Steps 4-5 of attention to these positions as keys, as one float32 bias added to the scores:
        (h*N, 1, T) (key masks), or (h*N, T, T) with ``causality``; 0 where a key is seen,
        :data:`MASK_VALUE` where it is masked.

        Built once per batch (memoized here) and shared by every layer attending to these keys,
        instead of a ``SelectV2`` forward and backward in each. For a float32 score ``s`` with
        ``-256 < s < 128``, ``s + MASK_VALUE`` rounds to ``MASK_VALUE`` exactly (its ulp there is
        256 or 512), so the softmax equals the blog's ``where(mask, MASK_VALUE, s)``, rows of only
        masked keys included (uniform). Its gradient reaches the scores unmasked: the softmax's
        gradient there is already 0 (the weights of masked keys are 0).
        """
        return self._memoized(("attention_bias", num_heads, causality),
                              lambda: _attention_bias(self.masks, num_heads, causality))

    def length_groups(self, count):
        """:class:`LengthGroups` of these sequences in ``count`` groups (built once per graph)."""
        return self._memoized(("length_groups", count), lambda: LengthGroups(self, count))

    def _memoized(self, key, build):
        """``build()`` once per ``key`` and graph (Keras builds a layer by calling it in a scratch graph of its
        own), shared by every layer asking for it."""
        key = (*key, id(tf.compat.v1.get_default_graph()))
        if key not in self._per_graph:
            self._per_graph[key] = build()
        return self._per_graph[key]

    def pack(self, x):
        """(N, T, ...) -> (M, ...): the real positions' rows.

        Bucketed, its gradient is a gather too, the pads reading the first dummy row's gradient (0 in
        training: a loss keeps the real rows, and no real row reads a dummy one), where ``gather_nd``'s
        own is a ``ScatterNd`` into zeros, a slower pass on a CPU.
        """
        if not self.bucketed:
            return tf.gather_nd(x, self.indices)

        @tf.custom_gradient
        def pack(x):
            return tf.gather_nd(x, self.indices), lambda d_rows: tf.gather(d_rows, self.position_rows)

        return pack(x)

    def unpack(self, rows):
        """(M, C) -> (N, T, C), zeros at the pad positions (bucketed: the first dummy row).

        Bucketed, its gradient is :meth:`pack`'s gather of the real rows, the dummy rows' gradient set to
        0: the pads' gradients, which ``tf.gather``'s own (an ``UnsortedSegmentSum``) would add
        into the first dummy row, are 0 (masked keys get no attention, pad queries' outputs are dropped).
        """
        if not self.bucketed:
            shape = tf.concat([self.shape, tf.shape(rows, out_type=tf.int64)[1:]], 0)
            return tf.ensure_shape(tf.scatter_nd(self.indices, rows, shape), [None, None, rows.shape[-1]])

        @tf.custom_gradient
        def unpack(rows):
            def gradient(d_padded):
                return self._zero_dummy_rows(tf.gather_nd(d_padded, self.indices))

            return tf.gather(rows, self.position_rows), gradient

        return unpack(rows)

    def _head_indices(self, parts, num_heads, batch_major=False):
        """Where :meth:`unpack_heads` and :meth:`pack_heads` read: for ``parts`` projections of ``num_heads``
        heads, ``s = parts * h`` slots of C/h channels a row, slot ``j = part * h + head``,

        - ``unpack`` (parts, h*N, T) int32: the heads' row of position (n, t) reads row
          ``position_rows[n, t] * s + j`` of the packed rows as (M*s, C/h); head-major (:func:`split_heads`,
          row ``head * N + n`` of the part), or ``batch_major`` (a decoding cache's, row ``n * h + head``);
        - ``pack`` (M, s) int32: slot ``j`` of packed row ``m`` (at position (n, t)) is row
          ``(j * N + n) * T + t`` of the heads as (s*N*T, C/h) (``batch_major``: ``((part * N + n) * h + head)
          * T + t``).

        Built once per batch and graph (memoized) for every layer with the same ``parts`` and layout."""
        def build():
            h = num_heads
            slots = tf.reshape(tf.range(parts * h, dtype=tf.int32), [parts, h])
            position_rows = tf.cast(self.position_rows, tf.int32)  # (N, T)
            n, t = tf.unstack(tf.shape(position_rows))
            positions = tf.cast(self.indices, tf.int32)  # (M, 2)
            if batch_major:
                unpack = position_rows[None, :, None, :] * (parts * h) + slots[:, None, :, None]  # (parts, N, h, T)
                pack = (slots // h * n)[None] + positions[:, :1, None]  # (M, parts, h): part * N + n
                pack = (pack * h + slots[None] % h) * t + positions[:, 1:, None]  # (M, parts, h)
                unpack = tf.reshape(unpack, [parts, h * n, t])
            else:
                unpack = _head_major_rows(position_rows, parts, h)
                pack = (positions[:, :1] * t + positions[:, 1:]) + tf.reshape(slots, [1, -1]) * (n * t)  # (M, s)
            return unpack, tf.reshape(pack, [-1, parts * h])

        return self._memoized(("heads", parts, num_heads, batch_major), build)

    def _with_a_row(self, rows):
        """(M, C) ``rows``, and a row of zeros when there is none (M = 0 of N > 0 sequences: the pads read row 0)."""
        if self.bucketed:  # a dummy row is there whenever a position is
            return rows
        return tf.pad(rows, [[0, tf.cast(tf.equal(self.real, 0), tf.int32)], [0, 0]])  # otherwise forwards rows

    def unpack_heads(self, rows, parts, num_heads, batch_major=False):
        """Blog step 2 of the unpacked rows: :meth:`unpack` of ``parts`` projections side by side, then
        :func:`split_heads` of each, as one gather of C/h-channel slices (no scatter, no transpose, forward or
        back).

        Args:
          rows: (M, parts*C) packed rows, ``parts`` projections of ``num_heads`` heads side by side.
          batch_major: the heads in a decoding cache's layout (row ``n * h + head``), not head-major.
        Returns:
          (parts, h*N, T, C/h); pads hold the first dummy row (bucketed), else the first row: masked keys,
          and queries whose outputs are never packed. The gradient is a gather of the real rows too, the dummy
          rows' set to 0 (as :meth:`unpack`'s).
        """
        unpack, pack = self._head_indices(parts, num_heads, batch_major)
        width, depth = rows.shape[-1], rows.shape[-1] // (parts * num_heads)

        @tf.custom_gradient
        def unpack_heads(rows):
            def gradient(d_heads):
                d_rows = tf.reshape(tf.gather(tf.reshape(d_heads, [-1, depth]), pack), [-1, width])
                return self._zero_dummy_rows(d_rows)

            return tf.gather(tf.reshape(self._with_a_row(rows), [-1, depth]), unpack), gradient

        return unpack_heads(rows)

    def pack_heads(self, heads, num_heads):
        """Blog step 9 and :meth:`pack`: :func:`combine_heads` of head-major ``heads`` (h*N, T, C/h), then the
        real positions' rows, (M, C), as one gather of C/h-channel slices; its gradient is one gather too, the
        pads reading the first dummy row's gradient (bucketed: 0, as :meth:`pack`'s), else 0 by the masks."""
        unpack, pack = self._head_indices(1, num_heads)
        depth = heads.shape[-1]

        @tf.custom_gradient
        def pack_heads(heads):
            def gradient(d_rows):
                d_heads = tf.reshape(tf.gather(tf.reshape(self._with_a_row(d_rows), [-1, depth]), unpack),
                                     tf.shape(heads))
                if self.bucketed:
                    return d_heads
                return d_heads * _tile_masks(self.masks, num_heads, d_heads.dtype)[:, :, None]

            return tf.reshape(tf.gather(tf.reshape(heads, [-1, depth]), pack), [-1, num_heads * depth]), gradient

        return pack_heads(heads)

    def _zero_dummy_rows(self, rows):
        """(M, C) rows with the dummy ones (after the :attr:`real` rows) set to 0; ``rows`` itself when there are
        none (not bucketed)."""
        if not self.bucketed:
            return rows
        dummy = tf.range(self.real, tf.shape(rows, out_type=tf.int64)[0])[:, None]
        return tf.tensor_scatter_nd_update(rows, dummy, tf.zeros([tf.shape(dummy)[0], rows.shape[-1]], rows.dtype))


def _attention_bias(masks, num_heads, causality=False):
    """(N, T) 0/1 key masks -> float32 (h*N, 1, T) bias of steps 4-5, (h*N, T, T) with ``causality``: 0 where a
    key is seen, :data:`MASK_VALUE` where it is masked (:meth:`Packing.attention_bias`)."""
    seen = tf.not_equal(_tile_masks(masks, num_heads, tf.float32), 0)[:, None, :]  # (h*N, 1, T)
    if causality:
        length = tf.shape(masks)[1]
        tril = tf.cast(tf.linalg.band_part(tf.ones([length, length]), -1, 0), tf.bool)
        seen = tf.logical_and(seen, tril[None])
    return tf.where(seen, 0.0, MASK_VALUE)


def _head_major_rows(position_rows, parts, num_heads):
    """(N, T) int32 packed row of each position -> (parts, h*N, T) int32: where head ``j`` of part ``p`` at (n, t)
    reads the packed rows as (M*parts*h, C/h) slices, ``position_rows[n, t] * parts*h + p*h + j``, head-major
    (row ``j * N + n``, :func:`split_heads`' order)."""
    slots = tf.reshape(tf.range(parts * num_heads, dtype=tf.int32), [parts, num_heads])
    index = position_rows[None, None] * (parts * num_heads) + slots[:, :, None, None]  # (parts, h, N, T)
    shape = tf.shape(position_rows)
    return tf.reshape(index, [parts, num_heads * shape[0], shape[1]])


class LengthGroups:
    """A :class:`Packing`'s sequences in groups of similar extent, for self-attention at inference: each group's
    heads padded to its own longest sequence, not the batch's, so that a batch of 10-30 pieces and one of 100
    does a fraction of the score products (N * T^2 otherwise; scores and weights in the blog's steps 3-9).

    The sequences, sorted by extent (last real position + 1; stable), fall in ``count`` groups of
    ceil(N / count) (the last ones may have fewer, or none). Inference only: no gradients of their own.

    Args:
      packing: a :class:`Packing` (not ``bucketed``).
      count: a Python int, the groups.
    """

    def __init__(self, packing, count):
        masks = tf.cast(tf.not_equal(packing.masks, 0), tf.int32)  # (N, T)
        n, t = tf.unstack(tf.shape(masks))
        extents = tf.reduce_max(masks * tf.range(1, t + 1)[None], axis=1)  # (N,)
        order = tf.argsort(extents, stable=True)
        size = (n + count - 1) // count
        self.packing = packing
        self.members = [order[g * size:(g + 1) * size] for g in range(count)]  # (n_g,) sequences of group g
        self.widths = [tf.reduce_max(tf.concat([tf.gather(extents, m), [0]], 0)) for m in self.members]  # T_g
        self.masks = [tf.gather(masks, m)[:, :w] for m, w in zip(self.members, self.widths)]  # (n_g, T_g)
        # Each sequence's group and its place there, for pack_heads.
        rank = tf.scatter_nd(order[:, None], tf.range(n), [n])
        self._group, self._slot = rank // tf.maximum(size, 1), rank % tf.maximum(size, 1)
        self._sizes = tf.stack([tf.size(m) for m in self.members])  # (count,)

    def unpack_heads(self, rows, parts, num_heads):
        """(M, parts*C) packed rows of ``parts`` projections -> per group (parts, h*n_g, T_g, C/h), as
        :meth:`Packing.unpack_heads` (head-major) of the group's sequences; pads read a real row (masked)."""
        h, depth = num_heads, rows.shape[-1] // (parts * num_heads)
        table = tf.reshape(self.packing._with_a_row(rows), [-1, depth])
        position_rows = tf.cast(self.packing.position_rows, tf.int32)
        return [tf.gather(table, _head_major_rows(tf.gather(position_rows, members)[:, :width], parts, h))
                for members, width in zip(self.members, self.widths)]

    def attention_bias(self, num_heads):
        """Per group, step 4's key masks as a float32 bias (h*n_g, 1, T_g) (:meth:`Packing.attention_bias`)."""
        return [_attention_bias(m, num_heads) for m in self.masks]

    def pack_heads(self, heads, num_heads):
        """Per group (h*n_g, T_g, C/h) head-major outputs -> the (M, C) packed rows (:meth:`Packing.pack_heads`)."""
        depth, widths = heads[0].shape[-1], tf.stack(self.widths)
        offsets = tf.cumsum(num_heads * self._sizes * widths, exclusive=True)  # where each group's rows start
        positions = tf.cast(self.packing.indices, tf.int32)  # (M, 2): sequence, position
        group = tf.gather(self._group, positions[:, 0])
        n_g, width = tf.gather(self._sizes, group), tf.gather(widths, group)
        first = tf.gather(offsets, group) + tf.gather(self._slot, positions[:, 0]) * width + positions[:, 1]  # head 0
        index = first[:, None] + tf.range(num_heads)[None] * (n_g * width)[:, None]  # (M, h)
        table = tf.concat([tf.reshape(x, [-1, depth]) for x in heads], axis=0)
        return tf.reshape(tf.gather(table, index), [-1, num_heads * depth])


def bucketed_rows(real, per_octave=32, least_step=8, least_rows=LEAST_ROWS):
    """The packed row count of :class:`Packing`'s ``bucketed`` for ``real`` real rows: the least multiple
    above ``real`` of ``step = max(2^(floor(log2(real + 1)) - log2(per_octave)), least_step)``, and at
    least ``least_rows``; so at least one dummy row, ``per_octave`` counts per doubling, and one count for
    every batch of fewer than ``least_rows`` real rows (small batches compile once).
    () int64 -> () int64."""
    above = real + 1
    octave = tf.cast(tf.math.floor(tf.math.log(tf.cast(above, tf.float64)) / math.log(2.0)), tf.int64)
    step = tf.bitwise.left_shift(tf.constant(1, tf.int64), tf.maximum(octave - int(math.log2(per_octave)), 0))
    step = tf.maximum(step, least_step)
    return tf.maximum((above + step - 1) // step * step, least_rows)


def dense(x, kernel, bias, activation=None, transpose_kernel=False, training=False):
    """``activation(x @ kernel + bias)``: (..., C_in) -> (..., C_out), in ``x``'s dtype (``kernel`` and
    ``bias`` cast to it); ``transpose_kernel``: ``kernel`` is (C_out, C_in) (a shared embedding table).

    Rows ((M, C_in): packed batches, the output layer) go through one ``MatMul`` + ``BiasAdd``
    (+ ``Relu``), the pattern TensorFlow's graph rewriter fuses into one oneDNN matmul on a CPU, with
    the gradient written out when ``training`` (:func:`_dense_rows`; otherwise no custom-gradient node
    in an inference graph); other ranks through a reshape to rows and back, with the shapes known when
    tracing kept static (a decoding step's (N, 1, C_in): no shape op at all; a ``tensordot`` of unknown
    shape makes a dozen), so that a decoding step's bias and ReLU are fused into its matmuls too.
    """
    # Cast to the input's dtype: the cached-decoding entry points also run outside
    # Keras' __call__, where mixed-precision variables are not autocast.
    kernel, bias = tf.cast(kernel, x.dtype), tf.cast(bias, x.dtype)
    rows = x if x.shape.rank == 2 else tf.reshape(x, [-1, x.shape[-1]])
    outputs = (_dense_rows if training else _affine_rows)(rows, kernel, bias, activation, transpose_kernel)
    return outputs if x.shape.rank == 2 else tf.reshape(outputs, [-1, *inner_dims(x)[:-1], outputs.shape[-1]])


def column_sums(x):
    """(M, C) -> (C,): the sum of ``x``'s rows, as one ``(1, M) x (M, C)`` matmul by ones."""
    return tf.matmul(tf.ones([1, tf.shape(x)[0]], x.dtype), x)[0]


def _affine_rows(x, kernel, bias, activation, transpose_kernel):
    """``activation(x @ kernel + bias)`` of (M, C_in) rows: ``MatMul`` + ``BiasAdd`` (+ ``Relu``), the pattern
    oneDNN fuses (:func:`dense`'s arguments)."""
    outputs = tf.nn.bias_add(tf.matmul(x, kernel, transpose_b=transpose_kernel), bias)
    return tf.nn.relu(outputs) if activation == "relu" else outputs


def _dense_rows(x, kernel, bias, activation, transpose_kernel):
    """:func:`dense` of (M, C_in) rows, whose gradient sums the bias's over the rows by a matmul
    (:func:`column_sums`), not ``BiasAddGrad``: that kernel's reduction takes 2.2-2.8x the time of the
    product by ones on a Zen 5 EPYC in bfloat16, 1.4-3.0x in float32 (docs/benchmarks.md). The other
    gradients are autodiff's: ``ReluGrad`` and the two products."""

    @tf.custom_gradient
    def forward(x, kernel, bias):
        outputs = _affine_rows(x, kernel, bias, activation, transpose_kernel)

        def gradient(d_outputs):
            d = tf.raw_ops.ReluGrad(gradients=d_outputs, features=outputs) if activation == "relu" else d_outputs
            d_kernel = tf.matmul(d, x, transpose_a=True) if transpose_kernel else tf.matmul(x, d, transpose_a=True)
            return tf.matmul(d, kernel, transpose_b=not transpose_kernel), d_kernel, column_sums(d)

        return outputs, gradient

    return forward(x, kernel, bias)


def inner_dims(x):
    """The dims of ``x`` after the first, for a ``tf.reshape`` to ``[-1, *inner_dims(x)]``: ints where known
    when tracing, scalar int32 tensors where not (a decoding step's (N, 1, C): no shape op at all)."""
    inner = x.shape[1:]
    if inner.is_fully_defined():
        return list(inner)
    shape = tf.shape(x)
    return [shape[i + 1] if d is None else d for i, d in enumerate(inner)]


def batched_matmul(a, b, transpose_b=False):
    """``tf.matmul(a, b, transpose_b=transpose_b)`` of batches of equal size, with a plain gradient.

    (B, n, k) x (B, k, m) -> (B, n, m), or with ``transpose_b`` (B, n, k) x (B, m, k) -> (B, n, m).

    ``BatchMatMul`` (V1: no broadcasting of the batch dims), whose registered gradient is the two
    matmuls ``g b^T`` and ``a^T g`` (``g b`` and ``g^T a`` with ``transpose_b``) by matmul's
    adjoint flags. ``tf.matmul`` makes a ``BatchMatMulV2``, whose gradient cannot tell from dynamic
    shapes that the batch dims are equal and adds a broadcast reduction (Shape, StridedSlice,
    BroadcastGradientArgs, Sum, Reshape) to each input's gradient; a ``tf.custom_gradient`` would
    add an ``IdentityN`` and, in the traced gradient, a dead ``ZerosLike`` of each input.
    """
    return tf.raw_ops.BatchMatMul(x=a, y=b, adj_y=transpose_b)


def tensorflow_matmul(a, b, transpose_b=False):
    """``tf.matmul(a, b, transpose_b=transpose_b)`` (batch dims broadcast) as ``BatchMatMulV3``: TensorFlow's own
    kernel, which its oneDNN graph rewrite leaves alone where oneDNN is on (``BatchMatMulV2`` becomes oneDNN's
    ``_MklBatchMatMulV2``). Where oneDNN is off it is the kernel ``tf.matmul`` runs."""
    return tf.raw_ops.BatchMatMulV3(x=a, y=b, Tout=a.dtype, adj_y=transpose_b)


def decoding_dtype(dtype):
    """The dtype of incremental decoding's keys and values (the self-attention caches, the encoder output
    projected for encoder-decoder attention) for a model computing in ``dtype``: for bfloat16 (a CPU's reduced
    precision) float32 outside XLA, where :func:`decoding_matmul` multiplies them in float32; else ``dtype``
    (float16, a GPU's, keeps its products in float16)."""
    dtype = tf.as_dtype(dtype)
    return tf.float32 if dtype == tf.bfloat16 and not fused.in_xla() else dtype


def decoding_matmul(a, b, transpose_b=False):
    """``tf.matmul(a, b, transpose_b=transpose_b)`` for incremental decoding's attention (a step's queries
    against the cache): (B, n, k) x (B, k, m) -> (B, n, m), or (B, n, k) x (B, m, k) with ``transpose_b``.

    float32 with one query a row (``n`` 1: self-attention, and greedy decoding's encoder-decoder
    attention) runs as :func:`tensorflow_matmul`, TensorFlow's own kernel, not oneDNN's: it takes 0.4-0.9x the time
    there (docs/benchmarks.md), and it keeps no oneDNN primitive per shape, where the growing loop's
    shapes (rows, cached positions) change at every step. A bfloat16 model's caches are float32 outside XLA
    (:func:`decoding_dtype`): its queries and attention weights are cast to float32 here (one row each), and
    its products take the same kernels, 1.1-1.6x as fast there as oneDNN's bfloat16 kernel (Zen 4 EPYC, one
    thread; docs/benchmarks.md). XLA keeps ``tf.matmul`` of the model's dtype.

    Beam search's k queries a sentence against its source (``n`` = k > 1), outside XLA: :func:`row_products`
    (4 queries of 64 channels against more than 64 source positions cross its threshold).
    """
    if b.dtype != tf.float32 or fused.in_xla():
        return tf.matmul(a, b, transpose_b=transpose_b)
    a = tf.cast(a, tf.float32)  # a bfloat16 model's queries or attention weights against its float32 cache
    if a.shape[1] != 1:
        return row_products(a, b, transpose_b)
    return tensorflow_matmul(a, b, transpose_b)


def row_products(a, b, transpose_b=False):
    """``tf.matmul(a, b, transpose_b=transpose_b)`` of (B, n, k) ``a`` as B * n one-row products, each against
    its batch entry's ``b`` broadcast (no copy): (B, n, 1, k) x (B, 1, k, m) -> (B, n, m), or against (B, m, k)
    with ``transpose_b``. Inference only (a broadcast's gradient sums a (B, n, k, m) product).

    TensorFlow's batched matmul on a CPU (``LaunchBatchMatMul``) runs a batch of products of more than
    128 * 128 multiply-adds (n * k * m) one product at a time, each split over the threads, about 10 µs
    apiece; smaller ones, and one-row products, in one pass over the batch: 256 of (4, 64) x (64, 100) take
    4.7 ms as they are, 0.5 ms as 1,024 one-row products (one thread, docs/benchmarks.md). Its callers use it
    in float32, as :func:`tensorflow_matmul`: oneDNN's kernel, where it is on, took 1.3-1.9x that kernel's time
    on these products (Zen 4 EPYC, one thread; docs/benchmarks.md).
    """
    return tf.squeeze(tensorflow_matmul(a[:, :, None], b[:, None], transpose_b), axis=2)


def prefix_matmul(a, b, transpose_b=False):
    """:func:`decoding_matmul` of one query a row, (B, 1, k) x (B, m, k)^T or (B, 1, m) x (B, m, k), as
    products and a sum (in float32), into which XLA fuses the gather that made ``b`` (a beam cache's
    prefix, :meth:`MultiheadAttention.call_cached`), where a matrix product would read it written out."""
    a32, b32 = tf.cast(a, tf.float32), tf.cast(b, tf.float32)
    if transpose_b:
        product = tf.reduce_sum(a32 * b32, axis=-1)
    else:
        product = tf.reduce_sum(tf.transpose(a32, [0, 2, 1]) * b32, axis=1)
    return tf.cast(product[:, None, :], a.dtype)


def split_heads(x, num_heads):
    """Blog step 2: ``concat(split(x, h, axis=2), axis=0)``.

    (N, T, C) -> (h*N, T, C/h), head-major: rows [k*N, (k+1)*N) are head k and
    hold channels [k*C/h, (k+1)*C/h). Computed as one reshape-transpose-reshape,
    the same layout as the blog's split/concat (tested against it) at about
    1.4x the training speed: h slices and a concat are h+1 copies, forward and
    backward.
    """
    shape = tf.shape(x)
    n, t, c = shape[0], shape[1], x.shape[-1]
    heads = tf.reshape(x, [n, t, num_heads, c // num_heads])
    return tf.reshape(tf.transpose(heads, [2, 0, 1, 3]), [num_heads * n, t, c // num_heads])


def combine_heads(x, num_heads):
    """Blog step 9, the inverse of :func:`split_heads`: ``concat(split(x, h, axis=0), axis=2)``,
    (h*N, T, C/h) -> (N, T, C)."""
    shape = tf.shape(x)
    n, t, d = shape[0] // num_heads, shape[1], x.shape[-1]
    heads = tf.reshape(x, [num_heads, n, t, d])
    return tf.reshape(tf.transpose(heads, [1, 2, 0, 3]), [n, t, num_heads * d])


def _tile_masks(masks, num_heads, dtype):
    """(N, T) 0/1 masks -> (h*N, T), repeated head-major like :func:`split_heads`."""
    return tf.tile(tf.cast(masks, dtype), [num_heads, 1])


# The attention weights' dropout masks are made for their size rounded up to one of these: 4,096 and then
# four sizes a doubling, k * 2^e for k in 4..7 (at most a quarter more numbers than needed), so that XLA
# compiles the mask's computation for a few dozen sizes in all.
MASK_SIZES = tuple(sorted({k << e for e in range(10, 29) for k in (4, 5, 6, 7)} | {2 ** 31 - 1}))


def mask_size(size):
    """The least of :data:`MASK_SIZES` at least ``size``: () int32 -> () int32 (a lookup, a few ops)."""
    sizes = tf.constant(MASK_SIZES, tf.int32)
    return tf.gather(sizes, tf.searchsorted(sizes, tf.reshape(size, [1]), side="left"))[0]


def attention_dropout(dropout, weights, training):
    """Step 8 in packed training: the dropout of the attention weights, as ``weights`` times a multiplier.

    The multiplier of element ``i`` (row-major) is :func:`fused.keep_multiplier`'s, the hashed numbers of
    the sub-layer tails, for a seed drawn from the ``keras.layers.Dropout``'s own generator (runs stay
    deterministic); it is made by one XLA computation over the weights' size rounded up
    (:func:`mask_size`, :func:`fused.keep_of_size`) and cut to their shape, where Keras' dropout
    ran TensorFlow's Philox kernel, a compare and a select over every weight (a step 1.011-1.024x faster,
    ``docs/benchmarks.md``). Its gradient is one ``Mul`` by the same multiplier.

    Args:
      dropout: a ``keras.layers.Dropout``; weights: (h*N, T_q, T_k) float (any shape of fewer than 2^31
        elements); training: bool, enables the dropout.
    Returns:
      like ``weights``.
    """
    if not (training and dropout.rate):
        return weights
    size = tf.size(weights)
    keep = fused.keep_of_size(mask_size(size), dropout.rate, dropout.seed_generator.next(), weights.dtype)
    return weights * tf.reshape(keep[:size], tf.shape(weights))


def packed_dropout(dropout, rows):
    """Training's dropout of a bucketed packing's (M, C) rows (the embeddings'): :func:`fused.dropout_rows`, one
    XLA computation each way, at the ``keras.layers.Dropout``'s rate with a seed from its own generator (runs
    stay deterministic; the numbers are the hashed ones of :func:`fused.keep_multiplier`, not Keras' Philox
    stream, which was a pass of its own over the padded positions, forward and back). (M, C) -> (M, C)."""
    if not dropout.rate:
        return rows
    return fused.dropout_rows(rows, dropout.rate, dropout.seed_generator.next())


def dense_before_tail(x, kernel, bias, compiled):
    """A dense layer whose outputs go to :func:`residual_norm`: ``(x @ kernel, bias)`` for a ``compiled`` tail to
    add the bias (and sum its gradient in its own pass), else ``(dense(x, kernel, bias), None)``.
    (M, C_in) -> ((M, C_out), (C_out,) or None), in ``x``'s dtype."""
    if compiled:
        return tf.matmul(x, tf.cast(kernel, x.dtype)), tf.cast(bias, x.dtype)
    return dense(x, kernel, bias), None


def residual_norm(layer_norm, dropout, outputs, residual, training, compiled=False, bias=None):
    """A sub-layer's tail on packed rows, ``layer_norm(dropout(outputs) + residual)``, fused
    (:meth:`LayerNorm.call` with a residual): the dropout's rate is the ``keras.layers.Dropout``
    layer's and its seed is drawn from the layer's own generator (the mask:
    :func:`fused.keep_multiplier`).

    Args:
      layer_norm: a :class:`LayerNorm`; dropout: a ``keras.layers.Dropout``;
      outputs, residual: (M, C); training: bool, enables the dropout.
      compiled: the tail as XLA computations (rows of a bucketed :class:`Packing`).
      bias: optional (C,), added to ``outputs`` first (:func:`dense_before_tail`).
    Returns:
      (M, C).
    """
    seed = dropout.seed_generator.next() if training and dropout.rate else None
    return layer_norm(outputs, residual=residual, rate=dropout.rate, seed=seed, compiled=compiled, bias=bias)


@_register
class LayerNorm(keras.layers.Layer):
    """The blog's ``normalize``: layer norm over the last axis.

    ``gamma * (x - mean) / sqrt(var + epsilon) + beta`` with the population
    variance and ``epsilon=1e-8`` (Keras' own layer defaults to 1e-3).
    Computed in float32 whatever the compute dtype.

    Shapes: (..., C) -> (..., C).

    Example:
      >>> LayerNorm()(tf.constant([[1.0, 3.0]])).numpy().round(4)
      array([[-1.,  1.]], dtype=float32)
    """

    def __init__(self, epsilon=1e-8, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        dim = input_shape[-1]
        # Not autocast: the norm is computed in float32, so mixed precision reads them in float32, without
        # a round trip through the compute dtype (two casts each, forward and backward).
        self.gamma = self.add_weight(name="gamma", shape=(dim,), initializer="ones", autocast=False)
        self.beta = self.add_weight(name="beta", shape=(dim,), initializer="zeros", autocast=False)

    def call(self, inputs, residual=None, rate=0.0, seed=None, compiled=False, bias=None):
        """``inputs`` (..., C) normalized; with a ``residual``, ``dropout(inputs) + residual`` normalized as
        one computation with a fused gradient (:func:`~tf_transformer.nn.fused.residual_layer_norm`:
        dropout at ``rate`` of the stateless ``seed``, XLA-compiled if ``compiled``, ``inputs + bias``)."""
        gamma, beta = tf.cast(self.gamma, tf.float32), tf.cast(self.beta, tf.float32)
        if residual is not None:
            return fused.residual_layer_norm(inputs, residual, gamma, beta, self.epsilon, rate, seed, compiled, bias)
        normalized, _ = fused.normalize(tf.cast(inputs, tf.float32), self.epsilon)
        return tf.cast(normalized * gamma + beta, inputs.dtype)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


@_register
class Embedding(keras.layers.Layer):
    """The blog's ``embedding(inputs, vocab_size, num_units, zero_pad, scale)``.

    A Glorot-uniform table (vocab_size, C). With ``zero_pad`` the table used is
    ``concat(zeros[1, C], lookup_table[1:])``, so id 0 (``<PAD>``) always maps
    to an exact zero vector and row 0 of the variable never gets a gradient
    (computed as a 0/1 mask on the looked-up rows, which gives the same values).
    With ``scale`` the output is multiplied by sqrt(C).

    Shapes: (N, T) int ids -> (N, T, C).

    Example:
      >>> emb = Embedding(vocab_size=10, num_units=4)
      >>> emb(tf.constant([[5, 0]])).shape
      TensorShape([1, 2, 4])
    """

    def __init__(self, vocab_size, num_units, zero_pad=True, scale=True, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.num_units = num_units
        self.zero_pad = zero_pad
        self.scale = scale

    def build(self, input_shape=None):
        self.lookup_table = self.add_weight(
            name="lookup_table",
            shape=(self.vocab_size, self.num_units),
            initializer="glorot_uniform",
        )

    def call(self, inputs):
        outputs = tf.nn.embedding_lookup(self.lookup_table, inputs)
        if self.zero_pad:
            # The blog's concat((zeros, lookup_table[1:])), row by row: the same
            # values and the same (zero) gradient for row 0, without copying the
            # whole table on every call and its dense gradient.
            outputs = outputs * tf.cast(tf.not_equal(inputs, 0), outputs.dtype)[..., None]
        if self.scale:
            outputs = outputs * (self.num_units**0.5)
        return outputs

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "num_units": self.num_units,
            "zero_pad": self.zero_pad,
            "scale": self.scale,
        }


class SharedLogits(keras.layers.Layer):
    """The output layer of ``shared_embeddings``: logits from the embedding table, transposed.

    ``logits = states @ lookup_table^T + bias``, the paper's section 3.4 (the same weight
    matrix for both embeddings and the pre-softmax projection), without the sqrt(C)
    scale the embedding applies to its inputs. The table stays the embedding's weight;
    this layer owns only the bias.

    Shapes: (..., C) -> (..., V).
    """

    def __init__(self, embedding, **kwargs):
        super().__init__(**kwargs)
        # Not tracked as a sub-layer (object.__setattr__ skips Keras' tracking): the table is the
        # embedding's weight, and would otherwise be listed twice in the model's weights.
        object.__setattr__(self, "_embedding", embedding)

    def build(self, input_shape=None):
        self.bias = self.add_weight(name="bias", shape=(self._embedding.vocab_size,), initializer="zeros")

    def decoding_weights(self, transposed=True):
        """:class:`DenseWeights` for decoding steps, made once per decoding call: in the compute dtype, and with
        ``transposed`` the table transposed to (C, V), a plain product (TensorFlow's product by a transposed
        (V, C) kernel takes 2.3x the time at 64 rows on one thread, AVX2 EPYC, docs/benchmarks.md)."""
        table, bias = (tf.cast(w, self.compute_dtype) for w in (self._embedding.lookup_table, self.bias))
        return DenseWeights(tf.transpose(table), bias) if transposed else DenseWeights(table, bias, True)

    def call(self, states, training=None):
        """``training``: the rows' gradient written out (:func:`dense`)."""
        flat = tf.reshape(states, [-1, states.shape[-1]])
        logits = dense(flat, self._embedding.lookup_table, self.bias, transpose_kernel=True, training=training)
        return tf.reshape(logits, [-1, *inner_dims(states)[:-1], self._embedding.vocab_size])


@_register
class Logits(keras.layers.Dense):
    """The output layer without ``shared_embeddings``: ``keras.layers.Dense`` (its weights, their names and
    its config), whose (M, C) rows go through :func:`dense` (in training, the bias's gradient by a matmul).

    Shapes: (..., C) -> (..., V).
    """

    def decoding_weights(self, transposed=True):
        """:class:`DenseWeights` for decoding steps, in the compute dtype; ``transposed`` changes nothing (it is
        :meth:`SharedLogits.decoding_weights`' option): this kernel is (C, V) already."""
        return DenseWeights(tf.cast(self.kernel, self.compute_dtype), tf.cast(self.bias, self.compute_dtype))

    def call(self, inputs, training=None):
        if inputs.shape.rank == 2 and self.use_bias and self.activation is keras.activations.linear:
            return dense(inputs, self.kernel, self.bias, training=training)
        return super().call(inputs)


def sinusoid_table(length, num_units):
    """The paper's positional encoding, built in float64 for any length.

    ``PE(pos, 2i) = sin(pos / 10000^(2i/C))``, ``PE(pos, 2i+1) = cos(pos / 10000^(2i/C))``.

    Args:
      length: scalar int (may be a tensor), number of positions.
      num_units: C.
    Returns:
      (length, C) float64 tensor.
    """
    position = tf.cast(tf.range(length), tf.float64)[:, None]
    i = tf.range(num_units)
    exponent = tf.cast(2 * (i // 2), tf.float64) / num_units
    angles = position / tf.pow(tf.constant(10000.0, tf.float64), exponent)[None, :]
    return tf.where(i % 2 == 0, tf.sin(angles), tf.cos(angles))


# PositionalEncoding slices the first SINUSOID_POSITIONS rows of a table computed once per width.
SINUSOID_POSITIONS = 1024
_SINUSOID_TABLES = {}


def sinusoid_rows(length, num_units):
    """:func:`sinusoid_table` ``(length, num_units)``, the same float64 numbers, sliced from a table of
    :data:`SINUSOID_POSITIONS` rows computed once per ``num_units`` (eagerly, shared by every layer and
    captured by every graph as one constant); longer lengths are computed as before. Two float64 sines
    and cosines of every position at every call cost a one-sentence ``translate`` about 0.35 ms (XLA
    folds them for its static lengths, so the compiled loop gains nothing but the same numbers).
    """
    if num_units not in _SINUSOID_TABLES:
        with tf.init_scope():
            _SINUSOID_TABLES[num_units] = sinusoid_table(SINUSOID_POSITIONS, num_units)
    table = _SINUSOID_TABLES[num_units]
    return tf.cond(length <= SINUSOID_POSITIONS, lambda: table[:length], lambda: sinusoid_table(length, num_units))


@_register
class PositionalEncoding(keras.layers.Layer):
    """Position information added to the token embedding.

    ``kind="sinusoid"``: the paper's fixed table (:func:`sinusoid_table`),
    computed for the input's length, so inputs of any length work.
    ``kind="learned"``: the blog's published setting, an :class:`Embedding`
    of ``maxlen`` positions (no zero pad, no scale). Positions past ``maxlen``
    reuse the last row instead of failing (the original indexed out of range).

    Shapes: (N, T) ids -> (1, T, C), to be added to the (N, T, C) embedding.

    Example:
      >>> PositionalEncoding(num_units=8)(tf.zeros([2, 5], tf.int32)).shape
      TensorShape([1, 5, 8])
    """

    def __init__(self, num_units, kind="sinusoid", maxlen=None, **kwargs):
        super().__init__(**kwargs)
        if kind not in ("sinusoid", "learned"):
            raise ValueError(f"kind must be 'sinusoid' or 'learned', got {kind!r}")
        if kind == "learned" and not maxlen:
            raise ValueError("kind='learned' needs maxlen, the number of positions to learn")
        self.num_units = num_units
        self.kind = kind
        self.maxlen = maxlen
        if kind == "learned":
            self.table = Embedding(maxlen, num_units, zero_pad=False, scale=False, name="table",
                                   dtype=self.dtype_policy)

    def build(self, input_shape=None):
        if self.kind == "learned":
            self.table.build()

    def call(self, inputs):
        length = tf.shape(inputs)[1]
        if self.kind == "sinusoid":
            outputs = sinusoid_rows(length, self.num_units)
        else:
            positions = tf.minimum(tf.range(length), self.maxlen - 1)
            outputs = self.table(positions)
        return tf.cast(outputs, self.compute_dtype)[None]

    def get_config(self):
        return {
            **super().get_config(),
            "num_units": self.num_units,
            "kind": self.kind,
            "maxlen": self.maxlen,
        }


def write_at(tensor, new, position, axis=1):
    """``tensor`` with its positions from ``position`` on along ``axis`` (1: (R, L, ...) columns)
    replaced by ``new`` (the same shape but T there): XLA's ``DynamicUpdateSlice``, written in
    place inside a compiled loop."""
    starts = [0] * tensor.shape.rank
    starts[axis] = position
    return dynamic_update_slice(tensor, new, starts)


def _extend_cache(cache, new, position=None):
    """A self-attention cache with the new positions' :meth:`MultiheadAttention.project_keys`
    dict ``new``: appended (``position`` None), or written over a preallocated cache's
    positions from ``position`` on (:func:`write_at`: shapes stay static); a beam cache's
    hypotheses hold the new position in their own rows (``ancestry``)."""
    if position is None:
        return {name: tf.concat([cache[name], new[name]], axis=1) for name in cache}
    extended = {name: write_at(cache[name], new[name], position) for name in new}
    if "ancestry" not in cache:
        return extended
    shape = tf.shape(cache["ancestry"])
    return {**extended, "ancestry": write_at(cache["ancestry"], _own_ancestry(shape[0], shape[1], 1), position, axis=2)}


def _own_ancestry(sentences, beam_size, length):
    """(sentences, k, length) int32 ancestry of ``length`` positions that each hypothesis holds in its own
    rows: hypothesis j's, j."""
    return tf.broadcast_to(tf.range(beam_size)[:, None], [sentences, beam_size, length])


def _gather_hypotheses(ancestry, rows):
    """A beam cache's (A, k, L) ``ancestry`` of the hypotheses ``rows`` ((M,) int32, M a multiple of k)."""
    shape = tf.shape(ancestry)
    return tf.reshape(tf.gather(tf.reshape(ancestry, [-1, shape[2]]), rows), [-1, shape[1], shape[2]])


@_register
class MultiheadAttention(keras.layers.Layer):
    """The blog's ``multihead_attention(queries, keys, num_units, num_heads,
    dropout_rate, is_training, causality)``, step by step.

    1. ``Q = dense(queries)``, ``K = dense(keys)``, ``V = dense(keys)``, ReLU
       by default (``qkv_activation``), with bias.
    2. Heads: ``concat(split(X, h, axis=2), axis=0)`` -> (h*N, T, C/h).
    3. Scores ``Q_ K_^T / sqrt(C/h)``.
    4. Key masks: scores of masked keys become ``-2**32 + 1``.
    5. ``causality``: scores above the diagonal become ``-2**32 + 1``.
    6. Softmax over keys.
    7. Query masks multiply the attention weights.
    8. Dropout on the weights (training only).
    9. ``weights @ V_``, heads concatenated back to (N, T_q, C).
    10. Optional W^O (``output_projection``, the paper's), then the residual
        ``+ queries``.
    11. :class:`LayerNorm` (epsilon 1e-8).

    With ``key_masks``/``query_masks`` left ``None`` the masks are recomputed
    from the raw inputs as in the blog (:func:`key_masks_from_inputs`, defect
    included). The model's default passes masks computed once from the token
    embedding instead.

    Kernels start Glorot-uniform (``attention_init="glorot"``, the blog's), or
    ``"per_head"``: Glorot over the per-head kernel shapes of Keras 2's
    ``MultiHeadAttention`` ((C_in, h, C/h) for Q/K/V, (h, C/h, C) for W^O),
    smaller, so attention starts near uniform and each block near the
    identity; on the embedded corpus it lowered the training loss after 600
    steps from 5.37 to 4.81.

    Trainable weights, in ``layer.weights`` order: Q kernel, Q bias, K kernel,
    K bias, V kernel, V bias, [W^O kernel, W^O bias], gamma, beta.

    Call args:
      queries: (N, T_q, C).
      keys: (N, T_k, C_k).
      training: bool, enables dropout.
      key_masks: optional (N, T_k) 0/1.
      query_masks: optional (N, T_q) 0/1.
    Returns:
      (N, T_q, C). Incremental decoding, against keys projected earlier, is
      :meth:`call_cached`.

    Example:
      >>> attention = MultiheadAttention(num_units=8, num_heads=2, causality=True)
      >>> x = tf.random.normal([3, 5, 8])
      >>> attention(x, x).shape
      TensorShape([3, 5, 8])
    """

    def __init__(
        self,
        num_units=None,
        num_heads=8,
        dropout_rate=0.0,
        causality=False,
        qkv_activation="relu",
        output_projection=False,
        residual_dropout_rate=0.0,
        layer_norm_epsilon=1e-8,
        attention_init="glorot",
        **kwargs,
    ):
        super().__init__(**kwargs)
        if qkv_activation not in ("relu", None):
            raise ValueError(f"qkv_activation must be 'relu' or None, got {qkv_activation!r}")
        if attention_init not in ATTENTION_INITS:
            raise ValueError(f"attention_init must be one of {', '.join(ATTENTION_INITS)}, got {attention_init!r}")
        self.attention_init = attention_init
        self.num_units = num_units
        self.num_heads = num_heads
        self.dropout_rate = dropout_rate
        self.causality = causality
        self.qkv_activation = qkv_activation
        self.output_projection = output_projection
        self.residual_dropout_rate = residual_dropout_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        # Sub-layers share this layer's dtype policy, so mixed precision reaches them.
        policy = self.dtype_policy
        self.dropout = keras.layers.Dropout(dropout_rate, dtype=policy)
        self.residual_dropout = keras.layers.Dropout(residual_dropout_rate, dtype=policy)
        self.layer_norm = LayerNorm(layer_norm_epsilon, name="layer_norm", dtype=policy)

    def build(self, queries_shape, keys_shape=None):
        keys_shape = keys_shape or queries_shape
        query_dim, key_dim = queries_shape[-1], keys_shape[-1]
        units = self.num_units or query_dim
        if units % self.num_heads:
            raise ValueError(f"num_units={units} is not divisible by num_heads={self.num_heads}")
        if units != query_dim:
            raise ValueError(
                f"the residual `outputs += queries` needs num_units == the queries' last "
                f"dimension, got num_units={units} and queries of width {query_dim}"
            )
        self.units = units

        def dense_weights(name, fan_in, per_head_fans):
            initializer = "glorot_uniform"
            if self.attention_init == "per_head":
                limit = math.sqrt(6.0 / sum(per_head_fans))
                initializer = keras.initializers.RandomUniform(-limit, limit)
            kernel = self.add_weight(name=f"{name}_kernel", shape=(fan_in, units), initializer=initializer)
            bias = self.add_weight(name=f"{name}_bias", shape=(units,), initializer="zeros")
            return kernel, bias

        # per_head: Glorot's fans of Keras 2's MultiHeadAttention kernels, (C_in, h, C/h) for Q/K/V
        # and (h, C/h, C) for W^O: fan_in + fan_out = C_in * (h + C/h) and h * (C/h + C).
        h, depth = self.num_heads, units // self.num_heads
        self.query_kernel, self.query_bias = dense_weights("query", query_dim, (query_dim * h, query_dim * depth))
        self.key_kernel, self.key_bias = dense_weights("key", key_dim, (key_dim * h, key_dim * depth))
        self.value_kernel, self.value_bias = dense_weights("value", key_dim, (key_dim * h, key_dim * depth))
        if self.output_projection:
            self.output_kernel, self.output_bias = dense_weights("output", units, (h * depth, h * units))
        self.layer_norm.build((None, None, units))

    def _project(self, x, names, activation=None, together=True):
        """Step 1 for the projections ``names`` (of ``query``, ``key``, ``value``, ``output``) of one
        input; ``together``, as one matmul: ``x @ [W_a | W_b ...] + [b_a | b_b ...]``, split back.

        In training, self-attention projects Q, K and V of its input together, encoder-decoder
        attention K and V of the encoder output: one (M, C) x (C, 3C) product instead of three of
        (C, C), and one bias add and activation. The weights stay separate variables (the blog's).

        Args:
          x: (..., C_in); names: tuple of weight names.
          together: False: one matmul per name instead (inference): no concatenation of the kernels,
            which a SavedModel call or a decoding step would repeat every time, and no split.
        Returns:
          list of (..., C), one per name.
        """
        if len(names) == 1 or not together:
            return [self._joined_dense(x, (name,), activation) for name in names]
        return tf.split(self._joined_dense(x, names, activation), len(names), axis=-1)

    def _joined_dense(self, x, names, activation=None, training=False):
        """``activation(x @ [W_a | W_b ...] + [b_a | b_b ...])`` of the projections ``names``, one matmul:
        (..., C_in) -> (..., k*C); one name: its own weights, not concatenated."""
        kernels = [getattr(self, f"{name}_kernel") for name in names]
        biases = [getattr(self, f"{name}_bias") for name in names]
        kernel = kernels[0] if len(names) == 1 else tf.concat(kernels, axis=1)
        bias = biases[0] if len(names) == 1 else tf.concat(biases, axis=0)
        return dense(x, kernel, bias, activation, training=training)

    # Heads (step 2) in two layouts of (h*N, T, C/h) rows, with the same numbers:
    # the blog's head-major rows (split_heads) for whole sequences, and for the
    # caches of incremental decoding batch-major rows, n*h + j for head j of row
    # n, where one new position splits into heads and combines back by reshapes
    # alone, with no copy at every step.

    def _split(self, x, decoding):
        """(N, T, C) -> (h*N, T, C/h), head-major, or batch-major when ``decoding``."""
        if not decoding:
            return split_heads(x, self.num_heads)
        depth = x.shape[-1] // self.num_heads
        if x.shape[1] == 1:  # one position: a reshape of static shape
            return tf.reshape(x, [-1, 1, depth])
        if x.shape[1] is not None:  # beam search's k queries a sentence: no shape op
            heads = tf.reshape(x, [-1, x.shape[1], self.num_heads, depth])
            return tf.reshape(tf.transpose(heads, [0, 2, 1, 3]), [-1, x.shape[1], depth])
        shape = tf.shape(x)
        heads = tf.transpose(tf.reshape(x, [shape[0], shape[1], self.num_heads, depth]), [0, 2, 1, 3])
        return tf.reshape(heads, [-1, shape[1], depth])

    def _combine(self, x, decoding):
        """The inverse of :meth:`_split`: (h*N, T, C/h) -> (N, T, C)."""
        if not decoding:
            return combine_heads(x, self.num_heads)
        length, depth = x.shape[1], x.shape[-1]
        if length == 1:
            return tf.reshape(x, [-1, 1, self.num_heads * depth])
        if length is not None:  # no shape op
            heads = tf.reshape(x, [-1, self.num_heads, length, depth])
            return tf.reshape(tf.transpose(heads, [0, 2, 1, 3]), [-1, length, self.num_heads * depth])
        shape = tf.shape(x)
        heads = tf.transpose(tf.reshape(x, [-1, self.num_heads, shape[1], depth]), [0, 2, 1, 3])
        return tf.reshape(heads, [-1, shape[1], self.num_heads * depth])

    def _tile(self, masks, decoding):
        """(N, T) 0/1 masks -> (h*N, T) float32 rows in :meth:`_split`'s layout."""
        if not decoding:
            return _tile_masks(masks, self.num_heads, tf.float32)
        # Batch-major: (N, h*T), sentence n's masks h times in a row, is (h*N, T) with rows n*h..n*h+h-1 its
        # copies (tf.repeat's result, without its two dozen ops).
        tiled = tf.tile(tf.cast(masks, tf.float32), [1, self.num_heads])
        if masks.shape[1] is not None:
            return tf.reshape(tiled, [-1, masks.shape[1]])
        shape = tf.shape(masks)
        return tf.reshape(tiled, [shape[0] * self.num_heads, shape[1]])

    def project_keys(self, keys, key_masks=None, decoding=False, packing=None, training=None):
        """Steps 1-2 for the keys, and step 4's masks: all that attending to ``keys`` needs.

        Incremental decoding computes it once per sentence for encoder-decoder
        attention, and one position at a time for a self-attention cache (see
        :meth:`call_cached`); it passes ``decoding=True``.

        Args:
          keys: (N, T_k, C_k).
          key_masks: optional (N, T_k) 0/1; None: the blog's rule on ``keys``.
          decoding: the layout of the heads: False, the blog's head-major rows;
            True, batch-major rows (the layout of a ``cache``).
          packing: a :class:`Packing` when ``keys`` are its (M_k, C_k) real rows.
          training: True: K and V in one matmul (:meth:`_project`'s ``together``), else one each.
        Returns:
          dict: ``key``, ``value``: (h*N, T_k, C/h) head-split K_ and V_ (V is
          projected from the keys, as in the blog); ``key_masks``: (N, T_k) in their dtype, or
          ``decoding``, (h*N, T_k) float32 in the rows of the heads, repeated once here rather
          than at every step.
        """
        K, V = self._project(keys, ("key", "value"), self.qkv_activation, together=training is True)
        return self._memory(K, V, keys, key_masks, decoding, packing)

    def _memory(self, K, V, keys, key_masks, decoding, packing):
        """Step 2 for projected (M_k or N*T_k rows, C) ``K`` and ``V`` of ``keys``, and step 4's
        masks: :meth:`project_keys`' dict; packed rows (``packing``) go to heads by one gather each
        (:meth:`Packing.unpack_heads`)."""
        if key_masks is None:
            key_masks = key_masks_from_inputs(keys)
        key_masks = self._tile(key_masks, decoding) if decoding else tf.cast(key_masks, K.dtype)
        if decoding:
            K, V = (tf.cast(x, self.cache_dtype) for x in (K, V))
        if packing is None:
            return {"key": self._split(K, decoding), "value": self._split(V, decoding), "key_masks": key_masks}
        K_, V_ = (packing.unpack_heads(x, 1, self.num_heads, batch_major=decoding)[0] for x in (K, V))
        return {"key": K_, "value": V_, "key_masks": key_masks}

    @property
    def cache_dtype(self):
        """The dtype of this layer's decoding keys and values (a cache's, and the projected keys' of
        :meth:`project_keys` when ``decoding``): :func:`decoding_dtype` of its compute dtype."""
        return decoding_dtype(self.compute_dtype)

    def empty_cache(self, rows, length=0):
        """A self-attention cache (a ``decoding`` :meth:`project_keys` dict) of ``rows``
        sequences: of no position (``length`` 0), or preallocated for ``length`` positions,
        all masked until :meth:`call_cached` writes them (``position``); keys and values of
        :attr:`cache_dtype`."""
        heads = tf.zeros([rows * self.num_heads, length, (self.num_units or self.units) // self.num_heads],
                         self.cache_dtype)
        return {"key": heads, "value": heads, "key_masks": tf.zeros([rows * self.num_heads, length], tf.float32)}

    def empty_beam_cache(self, sentences, beam_size, length):
        """:meth:`empty_cache` of ``sentences * beam_size`` hypotheses preallocated for ``length``
        positions, that beam search does not reorder (parent pointers): each hypothesis writes its
        new position in its own rows, and ``ancestry`` ((sentences, k, L) int32) says which of its
        sentence's k hypotheses' rows hold each position of its prefix (its own at first), taken
        from its parent's at every step (:meth:`follow_parents`). :meth:`call_cached` attends to the
        prefix through it (:meth:`_prefix`)."""
        cache = self.empty_cache(sentences * beam_size, length)
        return {**cache, "ancestry": _own_ancestry(sentences, beam_size, length)}

    def gather_cache(self, cache, rows):
        """Batch rows ``rows`` ((M,) int32) of a cache (a ``decoding`` :meth:`project_keys`
        dict): beam search reorders its hypotheses' self-attention caches with it; a beam cache's
        rows are those of whole sentences, each sentence's k hypotheses in order."""
        head_rows = tf.reshape(rows[:, None] * self.num_heads + tf.range(self.num_heads)[None, :], [-1])
        gathered = {name: tf.gather(cache[name], head_rows) for name in cache if name != "ancestry"}
        if "ancestry" in cache:
            gathered["ancestry"] = _gather_hypotheses(cache["ancestry"], rows)
        return gathered

    def follow_parents(self, cache, parents):
        """A beam cache (:meth:`empty_beam_cache`) for beam search's new hypotheses, hypothesis j continuing
        ``parents[j]`` ((A*k,) int32, a row of the same sentence): they take their parents' ancestry, the
        keys and values stay where they are."""
        return {**cache, "ancestry": _gather_hypotheses(cache["ancestry"], parents)}

    def _prefix(self, cache):
        """A beam cache's keys, values and masks as :meth:`empty_cache`'s of each hypothesis' own prefix:
        position p of hypothesis i from the rows of hypothesis ``ancestry[i, p]`` of its sentence: a
        gather that XLA fuses into :func:`prefix_matmul`'s products (where reordering the cache by the
        parents wrote it out, and the loop copied it back, every step)."""
        ancestry, h = cache["ancestry"], self.num_heads
        shape = tf.shape(ancestry)  # (A, k, L)
        rows = ancestry + (tf.range(shape[0]) * shape[1])[:, None, None]
        position = (rows[:, :, None, :] * h + tf.range(h)[:, None]) * shape[2] + tf.range(shape[2])  # (A, k, h, L)
        position = tf.reshape(position, [-1, shape[2]])
        return {name: tf.gather(tf.reshape(cache[name], [-1, *cache[name].shape[2:]]), position)
                for name in ("key", "value", "key_masks")}

    def _weights(self, Q, memory, query_masks, causality, decoding, matmul, packing=None):
        """Steps 2-7 for the projected queries ``Q`` ((N, T_q, C), or the (M_q, C) rows of
        ``packing``) against projected keys (a :meth:`project_keys` dict).

        ``query_masks``: (N, T_q) 0/1; ``matmul``: step 3's product, the caller's for step 9 too.
        Returns (h*N, T_q, T_k) float32 attention weights.
        """
        h = self.num_heads
        # Packed rows go to heads by one gather (not decoding: packings are training's and the encoder's).
        Q_ = self._split(Q, decoding) if packing is None else packing.unpack_heads(Q, 1, h)[0]

        # Step 3: scaled dot product, (h*N, T_q, T_k). Masks and softmax in float32.
        outputs = matmul(Q_, memory["key"], transpose_b=True) / math.sqrt(self.units // h)
        outputs = tf.cast(outputs, tf.float32)

        # Step 4: key masking.
        key_masks = memory["key_masks"] if decoding else self._tile(memory["key_masks"], False)  # (h*N, T_k)
        key_masks = key_masks[:, None, :]
        outputs = tf.where(tf.equal(key_masks, 0), MASK_VALUE, outputs)

        # Step 5: causality, lower-triangular (diagonal kept).
        if causality:
            diag_vals = tf.ones(tf.shape(outputs)[1:])  # (T_q, T_k); the blog's ones_like(outputs[0]) fails for N = 0
            tril = tf.linalg.band_part(diag_vals, -1, 0)
            outputs = tf.where(tf.equal(tril, 0)[None], MASK_VALUE, outputs)

        # Step 6: softmax over keys.
        outputs = tf.nn.softmax(outputs)

        # Step 7: query masking multiplies the weights.
        return outputs * self._tile(query_masks, decoding)[:, :, None]

    def call(self, queries, keys, training=None, key_masks=None, query_masks=None, query_packing=None,
             key_packing=None):
        """See the class docstring: (N, T_q, C) outputs.

        ``query_packing``/``key_packing`` (:class:`Packing`, training): ``queries`` and ``keys``
        are the (M, C) real rows of those packings, and so is the output.
        """
        outputs, _ = self._attend(queries, keys, training, key_masks, query_masks, None, query_packing, key_packing)
        return outputs

    def call_cached(self, queries, cache, keys=None, query_masks=None, key_masks=None, position=None):
        """Incremental decoding (inference): :meth:`call` against keys projected earlier.

        Args:
          queries: (N, T_q, C), the new positions.
          cache: a :meth:`project_keys` dict (``decoding=True``) of the keys projected so far.
          keys: None (encoder-decoder attention: the cache is every key), or (N, T_k, C) new
            keys (causal self-attention, one new position at a time), whose projections are
            appended to the cache.
          query_masks, key_masks: as :meth:`call`, of ``queries`` and of the new ``keys``.
          position: None, or a scalar int32: ``cache`` is preallocated (:meth:`empty_cache`) and
            the new keys are written at this position instead of appended, so every shape
            stays static (XLA). Its positions not written yet are masked.
        Returns:
          ((N, T_q, C) outputs, the cache the queries attended to: ``cache`` with ``keys``).
        """
        return self._attend(queries, keys, False, key_masks, query_masks, cache, None, None, position)

    def _attend(self, queries, keys, training, key_masks, query_masks, cache, query_packing, key_packing,
                position=None):
        """Steps 1-11 of :meth:`call` (``cache`` None) or :meth:`call_cached`: (outputs, memory), the
        (N, T_q, C) outputs and the :meth:`project_keys` dict the queries attended to."""
        if keys is None and cache is None:
            raise ValueError("MultiheadAttention needs keys, a cache of projected keys, or both")
        decoding = cache is not None
        if (query_packing is not None and key_packing is not None and not decoding
                and (key_packing is query_packing or not self.causality)):  # causal: T_q = T_k
            return self._attend_packed(queries, keys, training, query_packing, key_packing), None
        if query_masks is None:
            query_masks = key_masks_from_inputs(queries)  # step 7's rule, on the raw queries
        if keys is queries and key_packing is query_packing:
            # Self-attention: step 1's Q, K and V of the one input, in one matmul when training.
            Q, K, V = self._project(queries, ("query", "key", "value"), self.qkv_activation, together=training is True)
            memory = self._memory(K, V, keys, key_masks, decoding, key_packing)
        else:
            (Q,) = self._project(queries, ("query",), self.qkv_activation)
            memory = None if keys is None else self.project_keys(keys, key_masks, decoding, key_packing, training)
        if decoding:
            memory = cache if memory is None else _extend_cache(cache, memory, position)
        attended, matmul = memory, decoding_matmul if decoding else tf.matmul
        if decoding and "ancestry" in memory:  # a beam cache: each hypothesis' prefix, gathered (parent pointers)
            attended, matmul = self._prefix(memory), prefix_matmul
        # A cache holds no position after the new one: causality holds by construction.
        outputs = self._weights(Q, attended, query_masks, self.causality and not decoding, decoding, matmul,
                                query_packing)

        # Step 8: dropout on the attention weights.
        outputs = self.dropout(tf.cast(outputs, attended["value"].dtype), training=training)

        # Step 9: weighted sum and restore shape (in the queries' dtype: a cache may be float32, decoding_dtype).
        outputs = tf.cast(matmul(outputs, attended["value"]), queries.dtype)
        outputs = (self._combine(outputs, decoding) if query_packing is None
                   else query_packing.pack_heads(outputs, self.num_heads))

        # Step 10: (paper) output projection W^O, then the residual connection.
        if self.output_projection:
            (outputs,) = self._project(outputs, ("output",))
        outputs = self.residual_dropout(outputs, training=training)
        outputs = outputs + queries

        # Step 11: layer norm.
        return self.layer_norm(outputs), memory

    def _packed_heads(self, x, names, packing, training):
        """Steps 1-2 of packed rows ``x`` ((M, C_in), ``packing``'s) for the projections ``names``:
        one matmul (:meth:`_project`'s), then one gather of all of them to heads
        (:meth:`Packing.unpack_heads`), instead of a split, an unpack and a head split each.
        Returns a list of (h*N, T, C/h)."""
        rows = self._joined_dense(x, names, self.qkv_activation, training is True)  # (M, k*C)
        return tf.unstack(packing.unpack_heads(rows, len(names), self.num_heads), num=len(names), axis=0)

    def _attend_packed(self, queries, keys, training, query_packing, key_packing):
        """:meth:`_attend` in packed training: ``queries`` and ``keys`` are the (M, C) rows of
        ``query_packing`` and ``key_packing`` (not None), and so is the output.

        The same numbers at the real positions, with less work around the matmuls: steps 1-2
        by :meth:`_packed_heads`; steps 4-5 as the keys' :meth:`Packing.attention_bias`, one
        tensor of the batch added to the scores; no step 7, whose query masks are 1 at every
        real row (the pad rows are dropped by the final pack); steps 10-11's residual dropout, add
        and layer norm as one computation with a fused gradient (:func:`residual_norm`).

        At inference outside XLA (the growing loops' packed encoder), self-attention without causality takes the
        batch's sequences in :data:`LENGTH_GROUPS` groups of similar length (:class:`LengthGroups`), each group's
        heads padded to its own longest.
        """
        h = self.num_heads
        inference = training is not True and not fused.in_xla()
        # Inference in float32 (the packed encoder of the growing loops): one-row products, as many sentences'
        # heads are padded to their group's longest (above batched matmul's threshold from 17 positions of 64
        # channels).
        matmul = row_products if inference and queries.dtype == tf.float32 else batched_matmul
        if keys is queries and key_packing is query_packing and inference and not self.causality:
            groups = query_packing.length_groups(LENGTH_GROUPS)
            rows = self._joined_dense(queries, ("query", "key", "value"), self.qkv_activation)
            outputs = groups.pack_heads([self._scaled_attention(*tf.unstack(heads, num=3), bias, matmul, training)
                                         for heads, bias in zip(groups.unpack_heads(rows, 3, h),
                                                                groups.attention_bias(h))], h)
        else:
            if keys is queries and key_packing is query_packing:
                Q_, K_, V_ = self._packed_heads(queries, ("query", "key", "value"), query_packing, training)
            else:
                (Q_,) = self._packed_heads(queries, ("query",), query_packing, training)
                K_, V_ = self._packed_heads(keys, ("key", "value"), key_packing, training)
            bias = key_packing.attention_bias(h, self.causality)
            outputs = query_packing.pack_heads(self._scaled_attention(Q_, K_, V_, bias, matmul, training), h)
        compiled, bias = query_packing.bucketed, None
        if self.output_projection:
            outputs, bias = dense_before_tail(outputs, self.output_kernel, self.output_bias, compiled)
        return residual_norm(self.layer_norm, self.residual_dropout, outputs, queries, training, compiled, bias)

    def _scaled_attention(self, Q_, K_, V_, bias, matmul, training):
        """Steps 3-9 of heads (h*N, T, C/h) against keys with a float32 ``bias`` of steps 4-5 (0 or
        :data:`MASK_VALUE`, broadcast to the scores), products by ``matmul``: (h*N, T_q, C/h)."""
        # Step 3 by a Mul: its gradient is one Mul, RealDiv's also computes the (constant) divisor's.
        scores = tf.cast(matmul(Q_, K_, transpose_b=True) * (1 / math.sqrt(self.units // self.num_heads)), tf.float32)
        weights = tf.nn.softmax(scores + bias)  # steps 4-6
        outputs = attention_dropout(self.dropout, tf.cast(weights, V_.dtype), training)  # step 8
        return matmul(outputs, V_)

    def attention_weights(self, queries, keys, key_masks=None, query_masks=None):
        """Inference attention weights of every head (steps 1-7, no dropout).

        Args: as :meth:`call`.
        Returns:
          (N, h, T_q, T_k) float32; each row sums to 1 over the unmasked keys
          (0 for a masked query).
        """
        if query_masks is None:
            query_masks = key_masks_from_inputs(queries)
        (Q,) = self._project(queries, ("query",), self.qkv_activation)
        weights = self._weights(Q, self.project_keys(keys, key_masks), query_masks, self.causality, False, tf.matmul)
        shape = tf.shape(weights)
        return tf.transpose(tf.reshape(weights, [self.num_heads, -1, shape[1], shape[2]]), [1, 0, 2, 3])

    def get_config(self):
        return {**super().get_config(), **_constructor_config(self)}


def aligned_width(width):
    """A matmul kernel's width (output columns) for decoding: ``width``, or ``width + ALIGNMENT_PAD``
    when its float32 rows are a multiple of 2 KiB apart (``width`` a multiple of 512).

    Eigen's matmul (TensorFlow's on a CPU without oneDNN's rewrite) packs the kernel's rows for
    every call; rows 4 KiB apart fall into the same cache sets, so a (256, 1024) kernel takes 1.9x
    the time of a (256, 1040) one on one thread at 64-256 rows, 1.5-1.8x at 4-8 (AVX2 EPYC,
    docs/benchmarks.md), and (512, 2048) 2.0x at 64. One cache line more a row spreads them; the extra
    columns are zeros, so a padded feed-forward computes the same sums.
    """
    return width + ALIGNMENT_PAD if width % 512 == 0 else width


class DenseWeights(NamedTuple):
    """A dense layer's weights as decoding steps multiply them (:func:`dense`'s arguments): ``kernel``
    (C_in, C_out), or (C_out, C_in) with ``transpose_kernel``, and ``bias`` (C_out,)."""

    kernel: tf.Tensor
    bias: tf.Tensor
    transpose_kernel: bool = False


class FeedForwardWeights(NamedTuple):
    """:class:`FeedForward`'s weights as a decoding step uses them (:meth:`FeedForward.decoding_weights`):
    ``inner_kernel`` (C, F), ``inner_bias`` (F,), ``outer_kernel`` (F, C), ``outer_bias`` (C,), with F
    ``d_ff`` or its :func:`aligned_width`."""

    inner_kernel: tf.Tensor
    inner_bias: tf.Tensor
    outer_kernel: tf.Tensor
    outer_bias: tf.Tensor


@_register
class FeedForward(keras.layers.Layer):
    """The blog's ``feedforward(inputs, num_units=[d_ff, C])``.

    Position-wise ``C -> d_ff (ReLU) -> C`` (the original's conv1d with kernel
    size 1, which is a dense layer), residual, :class:`LayerNorm`; on packed (M, C)
    rows the residual dropout, add and layer norm are fused (:func:`residual_norm`).
    Weights: inner kernel, inner bias, outer kernel, outer bias, gamma, beta.

    Shapes: (N, T, C) -> (N, T, C).

    Example:
      >>> FeedForward(d_ff=16)(tf.random.normal([2, 3, 8])).shape
      TensorShape([2, 3, 8])
    """

    def __init__(self, d_ff, residual_dropout_rate=0.0, layer_norm_epsilon=1e-8, **kwargs):
        super().__init__(**kwargs)
        self.d_ff = d_ff
        self.residual_dropout_rate = residual_dropout_rate
        self.layer_norm_epsilon = layer_norm_epsilon
        self.residual_dropout = keras.layers.Dropout(residual_dropout_rate, dtype=self.dtype_policy)
        self.layer_norm = LayerNorm(layer_norm_epsilon, name="layer_norm", dtype=self.dtype_policy)

    def build(self, input_shape):
        units = input_shape[-1]
        self.inner_kernel = self.add_weight(name="inner_kernel", shape=(units, self.d_ff), initializer="glorot_uniform")
        self.inner_bias = self.add_weight(name="inner_bias", shape=(self.d_ff,), initializer="zeros")
        self.outer_kernel = self.add_weight(name="outer_kernel", shape=(self.d_ff, units), initializer="glorot_uniform")
        self.outer_bias = self.add_weight(name="outer_bias", shape=(units,), initializer="zeros")
        self.layer_norm.build(input_shape)

    def call(self, inputs, training=None, packing=None):
        """``packing``: the :class:`Packing` whose (M, C) rows ``inputs`` are, if packed."""
        if inputs.shape.rank != 2:  # the blog's (N, T, C) keep its unfused steps
            return self.step(inputs, self.decoding_weights(aligned=False), training)
        outputs = dense(inputs, self.inner_kernel, self.inner_bias, "relu", training=training is True)
        compiled = packing is not None and packing.bucketed  # packed rows (training)
        outputs, bias = dense_before_tail(outputs, self.outer_kernel, self.outer_bias, compiled)
        return residual_norm(self.layer_norm, self.residual_dropout, outputs, inputs, training, compiled, bias)

    def decoding_weights(self, aligned=True):
        """:class:`FeedForwardWeights` for :meth:`step`: in the compute dtype, and with ``aligned`` the hidden
        width padded with zeros to :func:`aligned_width` (the same outputs, faster products where ``d_ff`` is a
        multiple of 512). Decoding makes them once per call (not per step); :meth:`call` its own, unaligned."""
        pad = aligned_width(self.d_ff) - self.d_ff if aligned else 0
        weights = FeedForwardWeights(
            tf.pad(self.inner_kernel, [[0, 0], [0, pad]]) if pad else self.inner_kernel,
            tf.pad(self.inner_bias, [[0, pad]]) if pad else self.inner_bias,
            tf.pad(self.outer_kernel, [[0, pad], [0, 0]]) if pad else self.outer_kernel,
            self.outer_bias)
        return FeedForwardWeights(*(tf.cast(w, self.compute_dtype) for w in weights))

    def step(self, inputs, weights, training=False):
        """The unpacked sub-layer with :meth:`decoding_weights` ``weights``: (..., C) -> (..., C), a decoding
        step's rows or :meth:`call`'s (N, T, C) (``training`` as its: the residual dropout, the inner
        product's gradient written out)."""
        outputs = dense(inputs, weights.inner_kernel, weights.inner_bias, "relu", training=training is True)
        outputs = dense(outputs, weights.outer_kernel, weights.outer_bias)
        outputs = self.residual_dropout(outputs, training=training)
        return self.layer_norm(outputs + inputs)

    def get_config(self):
        return {**super().get_config(), **_constructor_config(self)}


def label_smoothing(inputs, epsilon=0.1):
    """The blog's ``label_smoothing``: ``(1 - epsilon) * inputs + epsilon / V``.

    Args:
      inputs: (..., V) one-hot (or any distribution) over V classes.
    Returns:
      (..., V) smoothed targets.
    """
    V = tf.cast(tf.shape(inputs)[-1], inputs.dtype)
    return ((1 - epsilon) * inputs) + (epsilon / V)


@_register
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The 2019 original's ``noam_scheme``.

    ``lr = init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5)`` with
    ``step = iterations + 1``: a linear rise to ``init_lr`` at
    ``step == warmup_steps``, then decay as ``1/sqrt(step)``. The paper's
    schedule is ``init_lr = (num_units * warmup_steps) ** -0.5``.

    Example:
      >>> round(float(NoamSchedule(1e-3, warmup_steps=10)(9)), 6)
      0.001
    """

    def __init__(self, init_lr, warmup_steps=4000):
        self.init_lr = init_lr
        self.warmup_steps = warmup_steps

    def __call__(self, step):
        step = tf.cast(step, tf.float32) + 1.0
        warmup = float(self.warmup_steps)
        return self.init_lr * warmup**0.5 * tf.minimum(step * warmup**-1.5, step**-0.5)

    def get_config(self):
        return {"init_lr": self.init_lr, "warmup_steps": self.warmup_steps}

"""An independent restatement of the blog version's TF1 graph (Kyubyong/transformer
commit 0537d9e, ``modules.py`` + ``train.py``), written with plain TF ops from
``shared/reference/original-tf-transformer.md``. It never calls ``tf_transformer``
code: the tests compare the project against it.

Weights come from a built project model, looked up by variable path the way the
original's ``tf.get_variable`` looked them up by variable scope
(:func:`weights_by_path`, :func:`get_variable`):

=================================  =========================================
blog scope (TF1)                   project variable path (model name dropped)
=================================  =========================================
``enc_embed/lookup_table``         ``enc_embedding/lookup_table``
``enc_pe/lookup_table``            ``enc_positions/table/lookup_table``
``dec_embed/lookup_table``         ``dec_embedding/lookup_table``
``dec_pe/lookup_table``            ``dec_positions/table/lookup_table``
``num_blocks_i`` (encoder)         ``encoder_block_i/{self_attention,feedforward}``
``num_blocks_i`` (decoder)         ``decoder_block_i/{self_attention,vanilla_attention,feedforward}``
``.../dense{,_1,_2}/{kernel,bias}``  ``.../{query,key,value}_{kernel,bias}``
``.../conv1d{,_1}/{kernel,bias}``  ``feedforward/{inner,outer}_{kernel,bias}``
``.../ln/{gamma,beta}``            ``.../layer_norm/{gamma,beta}``
``dense/{kernel,bias}`` (logits)   ``logits/{kernel,bias}``
=================================  =========================================

Everything is inference (``is_training=False``): dropout is the identity.
Plain functions, no pytest.
"""

import tensorflow as tf

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3  # the blog's <PAD> <UNK> <S> </S>


# ---------------------------------------------------------------------------
# Variables
# ---------------------------------------------------------------------------


def weights_by_path(model):
    """``{path: tensor}`` for every variable of a built model, its own name
    (``transformer``, ``transformer_1``, ...) dropped from the path."""
    variables = {}
    for v in model.weights:
        path = v.path.split("/", 1)[1]
        assert path not in variables, f"duplicate variable path {path}"
        variables[path] = tf.convert_to_tensor(v)
    return variables


def get_variable(variables, name, shape):
    """The restatement's ``tf.get_variable``: the variable at ``name``, checked
    to have the blog's ``shape``."""
    if name not in variables:
        raise KeyError(f"no variable {name!r}; have {sorted(variables)}")
    value = variables[name]
    assert tuple(value.shape) == tuple(shape), (name, tuple(value.shape), tuple(shape))
    return value


# ---------------------------------------------------------------------------
# modules.py
# ---------------------------------------------------------------------------


def normalize(inputs, gamma, beta, epsilon=1e-8):
    """The blog's ``normalize``: layer norm over the last axis, population variance."""
    mean, variance = tf.nn.moments(inputs, [-1], keepdims=True)
    normalized = (inputs - mean) / ((variance + epsilon) ** (0.5))
    outputs = gamma * normalized + beta
    return outputs


def embedding(inputs, vocab_size, num_units, zero_pad=True, scale=True, scope="embedding", variables=None):
    """The blog's ``embedding``: lookup in a [vocab_size, num_units] table whose
    row 0 is replaced by zeros (``zero_pad``), times sqrt(num_units) (``scale``)."""
    lookup_table = get_variable(variables, f"{scope}/lookup_table", [vocab_size, num_units])
    if zero_pad:
        lookup_table = tf.concat((tf.zeros(shape=[1, num_units]), lookup_table[1:, :]), 0)
    outputs = tf.nn.embedding_lookup(lookup_table, inputs)
    if scale:
        outputs = outputs * (num_units ** 0.5)
    return outputs


def learned_positions(inputs, maxlen, num_units, scope, variables):
    """The blog's published positional setting (``hp.sinusoid=False``):
    ``embedding(tile(range(T)), vocab_size=maxlen, zero_pad=False, scale=False)``.
    (N, T) ids -> (N, T, C). T > maxlen is an index error, as in the original."""
    positions = tf.tile(tf.expand_dims(tf.range(tf.shape(inputs)[1]), 0), [tf.shape(inputs)[0], 1])
    return embedding(positions, vocab_size=maxlen, num_units=num_units, zero_pad=False, scale=False,
                     scope=scope, variables=variables)


def blog_multihead_attention(
    weights,
    queries,
    keys,
    num_heads,
    causality=False,
    output_projection=False,
    qkv_activation="relu",
    key_masks=None,
    query_masks=None,
):
    """The blog's TF1 ``multihead_attention`` restated with plain TF ops.

    ``weights`` is ``layer.weights``: Q kernel, Q bias, K kernel, K bias,
    V kernel, V bias, [W^O kernel, W^O bias], gamma, beta. No dropout
    (``is_training=False``). ``key_masks``/``query_masks`` replace the blog's
    recomputed masks when given.
    """
    weights = [tf.convert_to_tensor(w) for w in weights]
    if output_projection:
        qk, qb, kk, kb, vk, vb, ok, ob, gamma, beta = weights
    else:
        qk, qb, kk, kb, vk, vb, gamma, beta = weights
    queries = tf.convert_to_tensor(queries, tf.float32)
    keys = tf.convert_to_tensor(keys, tf.float32)
    num_units = queries.shape[-1]

    def dense(x, kernel, bias, activation):
        # tf.layers.dense on a 3D input: x @ kernel + bias over the last axis.
        y = tf.einsum("ntc,cu->ntu", x, kernel) + bias
        return tf.nn.relu(y) if activation == "relu" else y

    # Linear projections
    Q = dense(queries, qk, qb, qkv_activation)  # (N, T_q, C)
    K = dense(keys, kk, kb, qkv_activation)  # (N, T_k, C)
    V = dense(keys, vk, vb, qkv_activation)  # (N, T_k, C)

    # Split and concat
    Q_ = tf.concat(tf.split(Q, num_heads, axis=2), axis=0)  # (h*N, T_q, C/h)
    K_ = tf.concat(tf.split(K, num_heads, axis=2), axis=0)  # (h*N, T_k, C/h)
    V_ = tf.concat(tf.split(V, num_heads, axis=2), axis=0)  # (h*N, T_k, C/h)

    # Multiplication
    outputs = tf.matmul(Q_, tf.transpose(K_, [0, 2, 1]))  # (h*N, T_q, T_k)

    # Scale
    outputs = outputs / (K_.get_shape().as_list()[-1] ** 0.5)

    # Key Masking
    if key_masks is None:
        key_masks = tf.sign(tf.abs(tf.reduce_sum(keys, axis=-1)))  # (N, T_k)
    key_masks = tf.cast(key_masks, tf.float32)
    key_masks = tf.tile(key_masks, [num_heads, 1])  # (h*N, T_k)
    key_masks = tf.tile(tf.expand_dims(key_masks, 1), [1, tf.shape(queries)[1], 1])  # (h*N, T_q, T_k)

    paddings = tf.ones_like(outputs) * (-(2**32) + 1)
    outputs = tf.where(tf.equal(key_masks, 0), paddings, outputs)  # (h*N, T_q, T_k)

    # Causality = Future blinding
    if causality:
        diag_vals = tf.ones_like(outputs[0, :, :])  # (T_q, T_k)
        tril = tf.linalg.LinearOperatorLowerTriangular(diag_vals).to_dense()  # (T_q, T_k)
        masks = tf.tile(tf.expand_dims(tril, 0), [tf.shape(outputs)[0], 1, 1])  # (h*N, T_q, T_k)

        paddings = tf.ones_like(masks) * (-(2**32) + 1)
        outputs = tf.where(tf.equal(masks, 0), paddings, outputs)  # (h*N, T_q, T_k)

    # Activation
    outputs = tf.nn.softmax(outputs)  # (h*N, T_q, T_k)

    # Query Masking
    if query_masks is None:
        query_masks = tf.sign(tf.abs(tf.reduce_sum(queries, axis=-1)))  # (N, T_q)
    query_masks = tf.cast(query_masks, tf.float32)
    query_masks = tf.tile(query_masks, [num_heads, 1])  # (h*N, T_q)
    query_masks = tf.tile(tf.expand_dims(query_masks, -1), [1, 1, tf.shape(keys)[1]])  # (h*N, T_q, T_k)
    outputs *= query_masks  # broadcasting. (N, T_q, C)

    # Dropout: is_training=False -> identity.

    # Weighted sum
    outputs = tf.matmul(outputs, V_)  # (h*N, T_q, C/h)

    # Restore shape
    outputs = tf.concat(tf.split(outputs, num_heads, axis=0), axis=2)  # (N, T_q, C)

    if output_projection:
        outputs = dense(outputs, ok, ob, None)
    assert outputs.shape[-1] == num_units

    # Residual connection
    outputs += queries

    # Normalize
    return normalize(outputs, gamma, beta)


def attention_weights(variables, scope, queries_width, keys_width, num_units):
    """The list ``blog_multihead_attention`` takes, from the attention at ``scope``:
    Q, K, V dense kernels and biases (no W^O in the blog), then ln gamma, beta."""
    return [
        get_variable(variables, f"{scope}/query_kernel", [queries_width, num_units]),
        get_variable(variables, f"{scope}/query_bias", [num_units]),
        get_variable(variables, f"{scope}/key_kernel", [keys_width, num_units]),
        get_variable(variables, f"{scope}/key_bias", [num_units]),
        get_variable(variables, f"{scope}/value_kernel", [keys_width, num_units]),
        get_variable(variables, f"{scope}/value_bias", [num_units]),
        get_variable(variables, f"{scope}/layer_norm/gamma", [num_units]),
        get_variable(variables, f"{scope}/layer_norm/beta", [num_units]),
    ]


def feedforward(inputs, num_units, scope, variables):
    """The blog's ``feedforward(inputs, num_units=[d_ff, C])``: two conv1d with
    kernel size 1 (inner ReLU, outer linear, both with bias), residual, normalize.
    The project's dense kernels [in, out] are the conv1d kernels [1, in, out]."""
    inner, outer = num_units
    channels = inputs.get_shape().as_list()[-1]
    # Inner layer
    kernel = get_variable(variables, f"{scope}/inner_kernel", [channels, inner])
    bias = get_variable(variables, f"{scope}/inner_bias", [inner])
    outputs = tf.nn.conv1d(inputs, tf.reshape(kernel, [1, channels, inner]), stride=1, padding="VALID") + bias
    outputs = tf.nn.relu(outputs)
    # Readout layer
    kernel = get_variable(variables, f"{scope}/outer_kernel", [inner, outer])
    bias = get_variable(variables, f"{scope}/outer_bias", [outer])
    outputs = tf.nn.conv1d(outputs, tf.reshape(kernel, [1, inner, outer]), stride=1, padding="VALID") + bias
    # Residual connection
    outputs += inputs
    # Normalize
    return normalize(outputs,
                     get_variable(variables, f"{scope}/layer_norm/gamma", [outer]),
                     get_variable(variables, f"{scope}/layer_norm/beta", [outer]))


def label_smoothing(inputs, epsilon=0.1):
    """The blog's ``label_smoothing``: ``(1 - epsilon) * inputs + epsilon / V``."""
    K = inputs.get_shape().as_list()[-1]  # number of channels
    return ((1 - epsilon) * inputs) + (epsilon / K)


# ---------------------------------------------------------------------------
# train.py: the Graph
# ---------------------------------------------------------------------------


def _record_masks(record, name, queries, keys):
    """Keeps the masks the blog's attention at ``name`` computes from its raw
    inputs (``sign(abs(reduce_sum(x, -1)))``), for tests to inspect."""
    if record is not None:
        record.append((name,
                       tf.sign(tf.abs(tf.reduce_sum(queries, axis=-1))).numpy(),
                       tf.sign(tf.abs(tf.reduce_sum(keys, axis=-1))).numpy()))


def decoder_inputs_from(y):
    """``concat(ones_like(y[:, :1]) * 2, y[:, :-1])``: <S> then y shifted right."""
    return tf.concat((tf.ones_like(y[:, :1]) * BOS_ID, y[:, :-1]), -1)


def embed_with_positions(variables, ids, vocab_size, num_units, maxlen, side):
    """The start of the blog's encoder and decoder (``side`` "enc" or "dec"): the scaled,
    zero-padded embedding plus the learned position table."""
    # Embedding
    outputs = embedding(ids, vocab_size=vocab_size, num_units=num_units, scale=True,
                        scope=f"{side}_embedding", variables=variables)
    # Positional Encoding (learned)
    return outputs + learned_positions(ids, maxlen, num_units, scope=f"{side}_positions/table", variables=variables)


def blog_encoder(variables, x, source_vocab_size, num_blocks, num_units, num_heads, d_ff, maxlen, record=None):
    """(N, T_x) source ids -> (N, T_x, C), the blog's encoder at inference."""
    enc = embed_with_positions(variables, x, source_vocab_size, num_units, maxlen, "enc")
    # Dropout: identity at inference.
    # Blocks
    for i in range(num_blocks):
        scope = f"encoder_block_{i}"
        # Multihead Attention
        _record_masks(record, f"{scope}/self_attention", enc, enc)
        enc = blog_multihead_attention(attention_weights(variables, f"{scope}/self_attention",
                                                         num_units, num_units, num_units),
                                       queries=enc, keys=enc, num_heads=num_heads, causality=False)
        # Feed Forward
        enc = feedforward(enc, num_units=[d_ff, num_units], scope=f"{scope}/feedforward", variables=variables)
    return enc


def blog_decoder(variables, decoder_inputs, enc, target_vocab_size, num_blocks, num_units, num_heads, d_ff,
                 maxlen, record=None):
    """(N, T_y) decoder input ids and the encoder output -> (N, T_y, V) logits."""
    dec = embed_with_positions(variables, decoder_inputs, target_vocab_size, num_units, maxlen, "dec")
    # Blocks
    for i in range(num_blocks):
        scope = f"decoder_block_{i}"
        # Multihead Attention ( self-attention)
        _record_masks(record, f"{scope}/self_attention", dec, dec)
        dec = blog_multihead_attention(attention_weights(variables, f"{scope}/self_attention",
                                                         num_units, num_units, num_units),
                                       queries=dec, keys=dec, num_heads=num_heads, causality=True)
        # Multihead Attention ( vanilla attention)
        _record_masks(record, f"{scope}/vanilla_attention", dec, enc)
        dec = blog_multihead_attention(attention_weights(variables, f"{scope}/vanilla_attention",
                                                         num_units, enc.shape[-1], num_units),
                                       queries=dec, keys=enc, num_heads=num_heads, causality=False)
        # Feed Forward
        dec = feedforward(dec, num_units=[d_ff, num_units], scope=f"{scope}/feedforward", variables=variables)
    # Final linear projection (tf.layers.dense with bias)
    kernel = get_variable(variables, "logits/kernel", [num_units, target_vocab_size])
    bias = get_variable(variables, "logits/bias", [target_vocab_size])
    return tf.einsum("ntc,cv->ntv", dec, kernel) + bias


def blog_logits(variables, x, y, source_vocab_size, target_vocab_size, num_blocks, num_units, num_heads, d_ff,
                maxlen, record=None):
    """The blog's ``Graph`` at inference: (N, T_x) sources and (N, T_y) targets
    -> (N, T_y, V) logits. The decoder inputs are built from ``y`` here.
    ``record``: an optional list that receives ``(scope, query_masks, key_masks)``
    for every attention, as the blog computes them."""
    x = tf.convert_to_tensor(x, tf.int32)
    y = tf.convert_to_tensor(y, tf.int32)
    enc = blog_encoder(variables, x, source_vocab_size, num_blocks, num_units, num_heads, d_ff, maxlen, record)
    return blog_decoder(variables, decoder_inputs_from(y), enc, target_vocab_size, num_blocks, num_units,
                        num_heads, d_ff, maxlen, record)


def blog_loss(y, logits, epsilon=0.1):
    """The blog's training loss: label-smoothed softmax cross-entropy, summed
    over non-pad targets and divided by their count."""
    y = tf.convert_to_tensor(y, tf.int32)
    logits = tf.convert_to_tensor(logits, tf.float32)
    istarget = tf.cast(tf.not_equal(y, PAD_ID), tf.float32)
    y_smoothed = label_smoothing(tf.one_hot(y, depth=logits.get_shape().as_list()[-1]), epsilon)
    loss = tf.nn.softmax_cross_entropy_with_logits(labels=y_smoothed, logits=logits)
    return tf.reduce_sum(loss * istarget) / (tf.reduce_sum(istarget))

"""Tests for ``MultiheadAttention``, checked against an independent restatement
of the blog's TF1 ``multihead_attention`` (Kyubyong/transformer, commit 0537d9e).
"""

import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_transformer.nn import modules
from tf_transformer.nn.modules import MultiheadAttention

from blog_reference import blog_multihead_attention

NUM_UNITS = 8
NUM_HEADS = 2
ATOL = 1e-5


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


def randomize_weights(layer, seed=0):
    """Give every weight (biases, gamma, beta included) non-trivial values."""
    rng = np.random.default_rng(seed)
    for w in layer.weights:
        value = rng.normal(scale=0.5, size=tuple(w.shape))
        if w.name == "gamma":
            value = 1.0 + value
        w.assign(value.astype("float32"))


def padded_inputs(rng, batch, length, width, lengths, sum_zero_rows=()):
    """Random rows, rows at positions >= lengths[n] exactly zero (zero-padded
    embeddings). ``sum_zero_rows``: (n, t) rows replaced by a non-zero vector
    whose components sum to 0 (the blog's mask defect)."""
    x = rng.normal(size=(batch, length, width)).astype("float32")
    for n, valid in enumerate(lengths):
        x[n, valid:] = 0.0
    for n, t in sum_zero_rows:
        # Quarters are exact in float32, so the row sums to exactly 0 in any order.
        row = rng.integers(-4, 5, size=width) / 4.0
        row[0] = 1.5
        row[-1] = -row[:-1].sum()
        x[n, t] = row
        assert np.sum(x[n, t]) == 0.0 and np.any(x[n, t] != 0)
    return x


def make_layer(queries, keys, **kwargs):
    kwargs.setdefault("num_units", NUM_UNITS)
    kwargs.setdefault("num_heads", NUM_HEADS)
    layer = MultiheadAttention(**kwargs)
    layer(queries, keys, training=False)  # build
    return layer


# ---------------------------------------------------------------------------
# Parity with the blog's function
# ---------------------------------------------------------------------------

# (name, T_q, T_k, query lengths, key lengths, sum-zero key rows, self-attention)
CASES = [
    ("self", 5, 5, [5, 3, 1], [5, 3, 1], (), True),
    ("self_all_pad_row", 5, 5, [4, 0, 2], [4, 0, 2], (), True),
    ("self_sum_zero_row", 5, 5, [5, 4, 2], [5, 4, 2], ((0, 1), (1, 0)), True),
    ("cross", 4, 6, [4, 2, 3], [6, 5, 2], (), False),
    ("cross_all_pad_keys", 4, 6, [3, 4, 1], [0, 6, 3], ((1, 2),), False),
    ("cross_longer_queries", 6, 3, [6, 2, 5], [3, 1, 2], (), False),
]


@pytest.mark.parametrize("qkv_activation", ["relu", None])
@pytest.mark.parametrize("output_projection", [False, True])
@pytest.mark.parametrize("causality", [False, True])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_matches_blog_multihead_attention(case, causality, output_projection, qkv_activation):
    name, t_q, t_k, q_lengths, k_lengths, sum_zero_rows, self_attention = case
    rng = np.random.default_rng([ord(c) for c in name])
    batch = len(q_lengths)
    if self_attention:
        queries = padded_inputs(rng, batch, t_q, NUM_UNITS, q_lengths, sum_zero_rows)
        keys = queries
    else:
        queries = padded_inputs(rng, batch, t_q, NUM_UNITS, q_lengths)
        # Keys narrower than queries: the key/value kernels are (C_k, C).
        keys = padded_inputs(rng, batch, t_k, 6, k_lengths, sum_zero_rows)

    tf.random.set_seed(1)
    layer = make_layer(
        queries,
        keys,
        causality=causality,
        output_projection=output_projection,
        qkv_activation=qkv_activation,
        dropout_rate=0.1,  # must be inactive at training=False
    )
    randomize_weights(layer, seed=len(name))

    got = layer(queries, keys, training=False).numpy()
    expected = blog_multihead_attention(
        layer.weights,
        queries,
        keys,
        NUM_HEADS,
        causality=causality,
        output_projection=output_projection,
        qkv_activation=qkv_activation,
    ).numpy()

    assert got.shape == (batch, t_q, NUM_UNITS)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)


def test_matches_blog_with_explicit_masks():
    """Masks passed in are used by the layer exactly as the blog uses its own."""
    rng = np.random.default_rng(3)
    queries = rng.normal(size=(2, 4, NUM_UNITS)).astype("float32")
    keys = rng.normal(size=(2, 5, NUM_UNITS)).astype("float32")
    key_masks = np.array([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], "float32")
    query_masks = np.array([[1, 0, 1, 1], [1, 1, 1, 0]], "float32")
    layer = make_layer(queries, keys, causality=True)
    randomize_weights(layer, seed=5)

    got = layer(queries, keys, training=False, key_masks=key_masks, query_masks=query_masks)
    expected = blog_multihead_attention(
        layer.weights, queries, keys, NUM_HEADS, causality=True, key_masks=key_masks, query_masks=query_masks
    )
    np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=ATOL)


def test_restatement_catches_head_order():
    """Sanity check of the test itself: the restatement is sensitive to a
    wrong head layout, so parity above is a real check (masks differ per batch
    element, so tiling masks the wrong way would be visible too)."""
    rng = np.random.default_rng(4)
    x = padded_inputs(rng, 3, 5, NUM_UNITS, [5, 2, 4])
    layer = make_layer(x, x)
    randomize_weights(layer, seed=6)
    blog = blog_multihead_attention(layer.weights, x, x, NUM_HEADS).numpy()
    # Same math with a single head gives a different answer.
    one_head = blog_multihead_attention(layer.weights, x, x, 1).numpy()
    assert np.max(np.abs(blog - one_head)) > 1e-3


# ---------------------------------------------------------------------------
# Masks
# ---------------------------------------------------------------------------


def test_explicit_key_masks_replace_recomputed_masks():
    rng = np.random.default_rng(7)
    queries = rng.normal(size=(2, 3, NUM_UNITS)).astype("float32")
    keys = rng.normal(size=(2, 5, NUM_UNITS)).astype("float32")  # no zero rows at all
    key_masks = np.array([[1, 1, 1, 0, 0], [1, 0, 1, 1, 0]], "float32")
    layer = make_layer(queries, keys)
    randomize_weights(layer, seed=8)
    base = layer(queries, keys, training=False, key_masks=key_masks).numpy()

    # Changing masked (non-zero) keys leaves the output unchanged.
    changed = keys.copy()
    changed[0, 3:] = rng.normal(size=(2, NUM_UNITS)) * 10
    changed[1, 1] = rng.normal(size=NUM_UNITS) * 10
    changed[1, 4] = rng.normal(size=NUM_UNITS) * 10
    out = layer(queries, changed, training=False, key_masks=key_masks).numpy()
    np.testing.assert_allclose(out, base, rtol=0, atol=1e-6)

    # Changing an unmasked key changes the output of its batch element.
    changed = keys.copy()
    changed[1, 2] = rng.normal(size=NUM_UNITS) * 10
    out = layer(queries, changed, training=False, key_masks=key_masks).numpy()
    assert np.max(np.abs(out[1] - base[1])) > 1e-3
    np.testing.assert_allclose(out[0], base[0], rtol=0, atol=1e-6)

    # Without explicit masks those keys (non-zero rows) are attended to.
    default = layer(queries, keys, training=False).numpy()
    assert np.max(np.abs(default - base)) > 1e-3


def test_explicit_key_masks_can_unmask_zero_rows():
    """All-ones masks given explicitly: zero-padded keys are attended to,
    unlike with the blog's recomputed masks."""
    rng = np.random.default_rng(9)
    x = padded_inputs(rng, 2, 4, NUM_UNITS, [4, 2])
    layer = make_layer(x, x)
    randomize_weights(layer, seed=10)
    ones = np.ones((2, 4), "float32")
    default = layer(x, x, training=False).numpy()
    explicit = layer(x, x, training=False, key_masks=ones, query_masks=ones).numpy()
    np.testing.assert_allclose(explicit[0], default[0], rtol=0, atol=1e-6)  # nothing padded there
    assert np.max(np.abs(explicit[1] - default[1])) > 1e-3


def numpy_layer_norm(x, gamma, beta, epsilon=1e-8):
    x = np.asarray(x, np.float64)
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return gamma * (x - mean) / np.sqrt(var + epsilon) + beta


@pytest.mark.parametrize("output_projection", [False, True])
def test_explicit_query_masks_zero_the_attention_of_masked_queries(output_projection):
    """A masked query keeps only the residual: output = LN(query [+ W^O bias])."""
    rng = np.random.default_rng(11)
    queries = rng.normal(size=(2, 3, NUM_UNITS)).astype("float32")
    keys = rng.normal(size=(2, 4, NUM_UNITS)).astype("float32")
    query_masks = np.array([[1, 0, 1], [0, 1, 1]], "float32")
    layer = make_layer(queries, keys, output_projection=output_projection)
    randomize_weights(layer, seed=12)
    out = layer(queries, keys, training=False, query_masks=query_masks).numpy()

    gamma, beta = (w.numpy() for w in layer.weights[-2:])
    residual = queries.astype("float64")
    if output_projection:
        residual = residual + layer.weights[7].numpy()  # W^O bias
    for n, t in [(0, 1), (1, 0)]:
        np.testing.assert_allclose(out[n, t], numpy_layer_norm(residual[n, t], gamma, beta), rtol=0, atol=ATOL)
    # An unmasked query does get attention.
    assert np.max(np.abs(out[0, 0] - numpy_layer_norm(residual[0, 0], gamma, beta))) > 1e-3


@pytest.mark.parametrize("causality", [False, True])
def test_fully_masked_key_row_is_finite(causality):
    rng = np.random.default_rng(13)
    queries = rng.normal(size=(2, 3, NUM_UNITS)).astype("float32")
    keys = rng.normal(size=(2, 4, NUM_UNITS)).astype("float32")
    key_masks = np.array([[0, 0, 0, 0], [1, 1, 0, 1]], "float32")
    layer = make_layer(queries, keys, causality=causality)
    randomize_weights(layer, seed=14)
    out = layer(queries, keys, training=False, key_masks=key_masks).numpy()
    assert not np.any(np.isnan(out))
    assert np.all(np.isfinite(out))

    # Same with keys that are all zero rows and the blog's recomputed masks.
    zero_keys = keys.copy()
    zero_keys[0] = 0.0
    out = layer(queries, zero_keys, training=False).numpy()
    assert np.all(np.isfinite(out))


# ---------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("output_projection", [False, True])
def test_weights_order_names_and_shapes(output_projection):
    queries = tf.zeros([1, 3, NUM_UNITS])
    keys = tf.zeros([1, 4, 6])
    layer = make_layer(queries, keys, output_projection=output_projection)

    expected = [
        ("query_kernel", (NUM_UNITS, NUM_UNITS)),
        ("query_bias", (NUM_UNITS,)),
        ("key_kernel", (6, NUM_UNITS)),
        ("key_bias", (NUM_UNITS,)),
        ("value_kernel", (6, NUM_UNITS)),
        ("value_bias", (NUM_UNITS,)),
    ]
    if output_projection:
        expected += [("output_kernel", (NUM_UNITS, NUM_UNITS)), ("output_bias", (NUM_UNITS,))]
    expected += [("gamma", (NUM_UNITS,)), ("beta", (NUM_UNITS,))]

    assert len(layer.weights) == (10 if output_projection else 8)
    assert len(layer.trainable_weights) == len(layer.weights)
    assert not layer.non_trainable_weights
    assert [(w.name, tuple(w.shape)) for w in layer.weights] == expected
    # Biases and beta start at zero, gamma at one (blog initialisers).
    for w in layer.weights:
        if w.name.endswith("bias") or w.name == "beta":
            np.testing.assert_array_equal(w.numpy(), 0.0)
        elif w.name == "gamma":
            np.testing.assert_array_equal(w.numpy(), 1.0)


def test_num_units_defaults_to_queries_width():
    x = tf.random.normal([2, 3, 12], seed=1)
    layer = MultiheadAttention(num_heads=3)
    assert layer(x, x).shape == (2, 3, 12)
    assert tuple(layer.weights[0].shape) == (12, 12)


# ---------------------------------------------------------------------------
# Dropout
# ---------------------------------------------------------------------------


def test_dropout_only_when_training():
    tf.random.set_seed(15)
    rng = np.random.default_rng(15)
    x = rng.normal(size=(2, 6, NUM_UNITS)).astype("float32")
    layer = make_layer(x, x, dropout_rate=0.5)
    randomize_weights(layer, seed=16)

    inference_1 = layer(x, x, training=False).numpy()
    inference_2 = layer(x, x, training=False).numpy()
    np.testing.assert_array_equal(inference_1, inference_2)
    # Default (training=None outside fit) is inference too.
    np.testing.assert_array_equal(layer(x, x).numpy(), inference_1)

    trained = layer(x, x, training=True).numpy()
    assert np.all(np.isfinite(trained))
    assert np.max(np.abs(trained - inference_1)) > 1e-3


def test_no_dropout_when_rate_is_zero():
    rng = np.random.default_rng(17)
    x = rng.normal(size=(2, 4, NUM_UNITS)).astype("float32")
    layer = make_layer(x, x, dropout_rate=0.0)
    randomize_weights(layer, seed=18)
    np.testing.assert_allclose(
        layer(x, x, training=True).numpy(), layer(x, x, training=False).numpy(), rtol=0, atol=1e-6
    )


# ---------------------------------------------------------------------------
# Serialization
# ---------------------------------------------------------------------------


def test_get_config_round_trip():
    rng = np.random.default_rng(19)
    queries = rng.normal(size=(2, 3, NUM_UNITS)).astype("float32")
    keys = rng.normal(size=(2, 5, 6)).astype("float32")
    layer = make_layer(
        queries,
        keys,
        dropout_rate=0.2,
        causality=True,
        qkv_activation=None,
        output_projection=True,
        residual_dropout_rate=0.1,
        layer_norm_epsilon=1e-6,
        name="my_attention",
    )
    randomize_weights(layer, seed=20)
    config = layer.get_config()
    for key, value in {
        "num_units": NUM_UNITS,
        "num_heads": NUM_HEADS,
        "dropout_rate": 0.2,
        "causality": True,
        "qkv_activation": None,
        "output_projection": True,
        "residual_dropout_rate": 0.1,
        "layer_norm_epsilon": 1e-6,
        "name": "my_attention",
    }.items():
        assert config[key] == value, key

    restored = MultiheadAttention.from_config(config)
    assert restored.get_config() == config
    restored(queries, keys, training=False)  # build
    restored.set_weights(layer.get_weights())
    np.testing.assert_allclose(
        restored(queries, keys, training=False).numpy(),
        layer(queries, keys, training=False).numpy(),
        rtol=0,
        atol=1e-6,
    )


def test_keras_serialization_round_trip():
    layer = MultiheadAttention(num_units=NUM_UNITS, num_heads=4, causality=True)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert isinstance(restored, MultiheadAttention)
    assert restored.get_config() == layer.get_config()


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


def test_num_units_not_divisible_by_num_heads():
    x = tf.ones([1, 2, 6])
    with pytest.raises(ValueError, match="divisible"):
        MultiheadAttention(num_units=6, num_heads=4)(x, x)


def test_num_units_must_equal_queries_width():
    queries = tf.ones([1, 2, 6])
    keys = tf.ones([1, 3, 8])
    with pytest.raises(ValueError, match="num_units"):
        MultiheadAttention(num_units=8, num_heads=2)(queries, keys)


def test_bad_qkv_activation():
    with pytest.raises(ValueError, match="qkv_activation"):
        MultiheadAttention(num_units=8, num_heads=2, qkv_activation="tanh")


# ---------------------------------------------------------------------------
# Mixed precision
# ---------------------------------------------------------------------------


@pytest.fixture
def mixed_float16_policy():
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy(previous)


def _padded_self_attention_inputs():
    x = padded_inputs(np.random.default_rng(21), 2, 4, NUM_UNITS, [4, 2])
    reference = make_layer(x, x, causality=True)
    randomize_weights(reference, seed=22)
    return x, reference


def test_mixed_float16_global_policy_masks_stay_finite(mixed_float16_policy):
    """-2**32+1 overflows float16; the layer must still mask in float32."""
    x, reference = _padded_self_attention_inputs()
    layer = MultiheadAttention(num_units=NUM_UNITS, num_heads=NUM_HEADS, causality=True)
    x16 = tf.constant(x, tf.float16)
    layer(x16, x16)
    layer.set_weights(reference.get_weights())
    out = layer(x16, x16, training=False)
    assert out.dtype == tf.float16
    assert np.all(np.isfinite(out.numpy()))
    np.testing.assert_allclose(
        out.numpy().astype("float32"), reference(x, x, training=False).numpy(), rtol=0, atol=2e-2
    )


def test_mixed_float16_per_layer_dtype():
    x, _ = _padded_self_attention_inputs()
    layer = MultiheadAttention(num_units=NUM_UNITS, num_heads=NUM_HEADS, causality=True, dtype="mixed_float16")
    x16 = tf.constant(x, tf.float16)
    out = layer(x16, x16, training=False)
    assert out.dtype == tf.float16
    assert np.all(np.isfinite(out.numpy()))


# ---------------------------------------------------------------------------
# Head split/concat: the fast reshape form keeps the blog's layout exactly
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch,length,width,heads", [(3, 5, 8, 2), (1, 1, 12, 3), (4, 7, 16, 8), (0, 3, 8, 4)])
def test_split_heads_matches_the_blogs_split_and_concat(batch, length, width, heads):
    from tf_transformer.nn.modules import combine_heads, split_heads

    x = tf.constant(np.random.default_rng(batch).normal(size=(batch, length, width)).astype("float32"))
    blog_split = tf.concat(tf.split(x, heads, axis=2), axis=0)  # the blog's step 2
    np.testing.assert_array_equal(split_heads(x, heads).numpy(), blog_split.numpy())
    blog_combined = tf.concat(tf.split(blog_split, heads, axis=0), axis=2)  # the blog's step 9
    np.testing.assert_array_equal(combine_heads(blog_split, heads).numpy(), blog_combined.numpy())
    np.testing.assert_array_equal(combine_heads(split_heads(x, heads), heads).numpy(), x.numpy())


@pytest.mark.parametrize("static", [True, False])
@pytest.mark.parametrize("batch,length", [(3, 4), (2, 1), (0, 4)])
def test_decodings_batch_major_heads_and_masks_restated(batch, length, static):
    """Incremental decoding's layout (a cache's): row n*h + j is sentence n's head j, with the new positions'
    shape known when tracing (one position, beam search's k queries) or not."""
    heads, depth = 4, 3
    layer = MultiheadAttention(num_units=heads * depth, num_heads=heads)
    rng = np.random.default_rng(length)
    x = rng.normal(size=(batch, length, heads * depth)).astype("float32")
    masks = rng.integers(0, 2, size=(batch, length)).astype("float32")
    shape = [None, length] if static else [None, None]

    @tf.function(input_signature=[tf.TensorSpec(shape + [heads * depth]), tf.TensorSpec(shape)])
    def layout(x, masks):
        split = layer._split(x, decoding=True)
        return split, layer._combine(split, decoding=True), layer._tile(masks, decoding=True)

    split, combined, tiled = (t.numpy() for t in layout(x, masks))
    expected = np.stack([x[:, :, j * depth:(j + 1) * depth] for j in range(heads)], axis=1)  # (N, h, T, d)
    np.testing.assert_array_equal(split, expected.reshape(batch * heads, length, depth))
    np.testing.assert_array_equal(combined, x)
    np.testing.assert_array_equal(tiled, np.repeat(masks, heads, axis=0))


def test_packing_keeps_the_real_rows_in_row_major_order():
    masks = tf.constant([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    x = tf.reshape(tf.range(3 * 4 * 2, dtype=tf.float32) + 1.0, [3, 4, 2])
    packing = modules.Packing(masks)
    rows = packing.pack(x)
    np.testing.assert_array_equal(rows.numpy(), tf.boolean_mask(x, masks > 0).numpy())
    np.testing.assert_array_equal(packing.unpack(rows).numpy(), (x * masks[:, :, None]).numpy())


@pytest.mark.parametrize("least", [None, 512])
@pytest.mark.parametrize("real", [0, 1, 7, 8, 31, 255, 256, 257, 511, 512, 900, 1023, 1024, 4000])
def test_bucketed_rows_restated(real, least):
    """At least one dummy row, a multiple of the octave's step (32 steps per doubling, at least 8 rows), at
    least ``least_rows`` rows (64 unless given)."""
    step = max(2 ** ((real + 1).bit_length() - 1 - 5), 8)
    floor = least or 64
    want = max(-(-(real + 1) // step) * step, floor)
    options = {} if least is None else {"least_rows": least}
    assert int(modules.bucketed_rows(tf.constant(real, tf.int64), **options)) == want
    assert real < want <= max(real + max(real / 32, 8) + 1, floor)


def test_bucketed_packing_adds_dummy_rows_that_read_the_first_position():
    masks = tf.constant([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    x = tf.reshape(tf.range(3 * 4 * 2, dtype=tf.float32) + 1.0, [3, 4, 2])
    packing = modules.Packing(masks, bucketed=True)
    rows = packing.pack(x)
    assert rows.shape == (64, 2)  # 5 real rows, bucketed to the least count
    np.testing.assert_array_equal(rows[:5].numpy(), tf.boolean_mask(x, masks > 0).numpy())
    np.testing.assert_array_equal(rows[5:].numpy(), np.tile(x[0, 0].numpy(), [59, 1]))
    assert int(packing.real) == 5
    unpacked = packing.unpack(rows + 100.0 * tf.range(64.0)[:, None]).numpy()  # tell the rows apart
    np.testing.assert_array_equal(unpacked[masks.numpy() > 0], rows[:5].numpy() + 100.0 * np.arange(5.0)[:, None])
    np.testing.assert_array_equal(unpacked[masks.numpy() == 0], np.tile(rows[5].numpy() + 500.0, [7, 1]))
    empty = modules.Packing(tf.zeros([0, 4]), bucketed=True)
    assert empty.pack(tf.zeros([0, 4, 2])).shape == (0, 2) and empty.unpack(tf.zeros([0, 2])).shape == (0, 4, 2)
    floored = modules.Packing(masks, bucketed=True, least_rows=96)  # training's least count: dummy rows up to it
    np.testing.assert_array_equal(floored.pack(x).numpy(), np.concatenate([rows.numpy(), rows[5:37].numpy()]))


def test_bucketed_heads_are_unpack_then_split_heads_and_combine_heads_then_pack():
    """``unpack_heads`` of k projections side by side equals, for each, ``unpack`` then ``split_heads``;
    ``pack_heads`` equals ``combine_heads`` then ``pack``; in values and in gradients (the dummy rows' 0),
    each one gather, forward and backward, where the restatement transposes; and for no sentence."""
    masks = tf.constant([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    packing = modules.Packing(masks, bucketed=True)
    rng = np.random.default_rng(5)
    rows = tf.constant(rng.normal(size=(64, 3 * NUM_UNITS)), tf.float32)
    heads = tf.constant(rng.normal(size=(NUM_HEADS * 3, 4, NUM_UNITS // NUM_HEADS)), tf.float32)
    unpack_weights = tf.constant(rng.normal(size=(3, NUM_HEADS * 3, 4, NUM_UNITS // NUM_HEADS)), tf.float32)
    pack_weights = tf.constant(rng.normal(size=(64, NUM_UNITS)), tf.float32)

    @tf.function
    def both(rows, heads, fused):
        with tf.GradientTape(persistent=True) as tape:
            tape.watch([rows, heads])
            if fused:
                unpacked, packed = packing.unpack_heads(rows, 3, NUM_HEADS), packing.pack_heads(heads, NUM_HEADS)
            else:
                unpacked = tf.stack([modules.split_heads(packing.unpack(part), NUM_HEADS)
                                     for part in tf.split(rows, 3, axis=-1)])
                packed = packing.pack(modules.combine_heads(heads, NUM_HEADS))
        return (unpacked, packed, tape.gradient(unpacked, rows, output_gradients=unpack_weights),
                tape.gradient(packed, heads, output_gradients=pack_weights))

    got, want = both(rows, heads, True), both(rows, heads, False)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), w.numpy())
    assert not np.any(got[2].numpy()[int(packing.real):])  # the dummy rows' gradient
    ops = [n.type for n in both.get_concrete_function(rows, heads, True).graph.get_operations()]
    assert ops.count("GatherV2") == 4 and "Transpose" not in ops, sorted(ops)
    empty = modules.Packing(tf.zeros([0, 4]), bucketed=True)
    assert empty.unpack_heads(tf.zeros([0, 2 * NUM_UNITS]), 2, NUM_HEADS).shape == (2, 0, 4, NUM_UNITS // NUM_HEADS)
    assert empty.pack_heads(tf.zeros([0, 4, NUM_UNITS // NUM_HEADS]), NUM_HEADS).shape == (0, NUM_UNITS)


@pytest.mark.parametrize("batch_major", [False, True])
def test_unbucketed_heads_by_gather_restated(batch_major):
    """Without dummy rows (inference's packing), ``unpack_heads`` puts each real position's C/h-channel
    slices where a loop over (part, head, n, t) puts them, head-major (row head * N + n) or ``batch_major``
    (row n * h + head, a decoding cache's); its gradient is the real positions' only. ``pack_heads``
    (head-major) is the inverse at the real positions, its gradient 0 at the pads. And N > 0 sequences of
    no real position (M = 0) give their shapes, not an out-of-range gather."""
    masks = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], np.float32)
    packing = modules.Packing(tf.constant(masks))
    n, t, h, d, parts = 3, 4, NUM_HEADS, NUM_UNITS // NUM_HEADS, 3
    real = list(zip(*np.nonzero(masks)))  # row-major, as the packed rows
    rng = np.random.default_rng(8)
    rows = rng.normal(size=(len(real), parts * NUM_UNITS)).astype(np.float32)
    d_heads = rng.normal(size=(parts, h * n, t, d)).astype(np.float32)
    heads_in = rng.normal(size=(h * n, t, d)).astype(np.float32)
    d_rows = rng.normal(size=(len(real), NUM_UNITS)).astype(np.float32)

    def row(part_n, head):  # the heads' row of (n, head)
        return part_n * h + head if batch_major else head * n + part_n

    rows_t, heads_t = tf.constant(rows), tf.constant(heads_in)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([rows_t, heads_t])
        unpacked = packing.unpack_heads(rows_t, parts, h, batch_major=batch_major)
        packed = packing.pack_heads(heads_t, h)
    d_rows_got = tape.gradient(unpacked, rows_t, output_gradients=tf.constant(d_heads)).numpy()
    d_heads_got = tape.gradient(packed, heads_t, output_gradients=tf.constant(d_rows)).numpy()
    want_unpacked, want_d_rows = np.zeros_like(d_heads), np.zeros_like(rows)
    want_packed, want_d_heads = np.zeros_like(d_rows), np.zeros_like(heads_in)
    for m, (i, j) in enumerate(real):
        for head in range(h):
            for part in range(parts):
                columns = slice((part * h + head) * d, (part * h + head + 1) * d)
                want_unpacked[part, row(i, head), j] = rows[m, columns]
                want_d_rows[m, columns] = d_heads[part, row(i, head), j]
            want_packed[m, head * d:(head + 1) * d] = heads_in[head * n + i, j]
            want_d_heads[head * n + i, j] = d_rows[m, head * d:(head + 1) * d]
    at_real = np.array([[masks[i, j] > 0 for j in range(t)] for i in range(n)])
    at_real = np.repeat(at_real, h, axis=0) if batch_major else np.tile(at_real, [h, 1])  # (h*N, T)
    np.testing.assert_array_equal(unpacked.numpy()[:, at_real], want_unpacked[:, at_real])
    np.testing.assert_array_equal(d_rows_got, want_d_rows)
    np.testing.assert_array_equal(packed.numpy(), want_packed)
    np.testing.assert_array_equal(d_heads_got, want_d_heads)

    nothing = modules.Packing(tf.zeros([2, 3]))
    assert nothing.unpack_heads(tf.zeros([0, 2 * NUM_UNITS]), 2, h, batch_major).shape == (2, 2 * h, 3, d)
    assert nothing.pack_heads(tf.zeros([2 * h, 3, d]), h).shape == (0, NUM_UNITS)


def test_length_groups_sort_sequences_by_extent_and_pad_each_group_to_its_longest():
    """:class:`modules.LengthGroups`: the sequences sorted by extent (last real position + 1, ties in batch
    order) in groups of ceil(N / count); a group's heads are its sequences' real rows, head-major, padded to
    its own longest, not the batch's; ``pack_heads`` puts every group's outputs back in the packed rows."""
    masks = np.array([[1, 1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1], [1, 0, 1, 1, 0, 0],
                      [1, 1, 0, 0, 0, 0]], np.float32)  # extents 3, 1, 6, 4 (a masked position inside), 2
    packing = modules.Packing(tf.constant(masks))
    groups = packing.length_groups(2)  # of 3 and 2 sequences
    assert [m.numpy().tolist() for m in groups.members] == [[1, 4, 0], [3, 2]]
    assert [int(w) for w in groups.widths] == [3, 6]
    h, d, parts = NUM_HEADS, NUM_UNITS // NUM_HEADS, 2
    real = list(zip(*np.nonzero(masks)))
    rows = np.random.default_rng(9).normal(size=(len(real), parts * NUM_UNITS)).astype(np.float32)
    heads = groups.unpack_heads(tf.constant(rows), parts, h)
    assert [tuple(x.shape) for x in heads] == [(parts, h * 3, 3, d), (parts, h * 2, 6, d)]
    biases = groups.attention_bias(h)
    for x, bias, members in zip(heads, biases, groups.members):
        for slot, n in enumerate(members.numpy()):
            for head in range(h):
                for t in range(x.shape[2]):
                    seen = t < masks.shape[1] and masks[n, t] > 0
                    assert bias[head * len(members) + slot, 0, t] == (0.0 if seen else modules.MASK_VALUE)
                    if seen:
                        m = real.index((n, t))
                        for part in range(parts):
                            columns = slice((part * h + head) * d, (part * h + head + 1) * d)
                            np.testing.assert_array_equal(x[part, head * len(members) + slot, t], rows[m, columns])
    # pack_heads is unpack_heads' inverse at the real positions (the first part's C columns back).
    np.testing.assert_array_equal(groups.pack_heads([x[0] for x in heads], h).numpy(), rows[:, :NUM_UNITS])
    empty = modules.Packing(tf.zeros([0, 4])).length_groups(3)
    assert [tuple(x.shape) for x in empty.unpack_heads(tf.zeros([0, NUM_UNITS]), 1, h)] == [(1, 0, 0, d)] * 3
    assert empty.pack_heads([tf.zeros([0, 0, d])] * 3, h).shape == (0, NUM_UNITS)


@pytest.mark.parametrize("count", [1, 2, 4, 8])
def test_grouped_self_attention_at_inference_gives_the_padded_outputs(monkeypatch, count):
    """The packed encoder's self-attention at inference (:data:`modules.LENGTH_GROUPS` groups of sequences; 8:
    more groups than sequences) equals the padded layer at the real positions, a sequence with a sum-zero
    (masked) position inside included; its products are of each group's width, not the batch's."""
    monkeypatch.setattr(modules, "LENGTH_GROUPS", count)
    rng = np.random.default_rng(17)
    lengths = [7, 1, 3, 5, 2]
    queries = padded_inputs(rng, 5, 7, NUM_UNITS, lengths, sum_zero_rows=[(3, 1)])
    masks = tf.cast(tf.reduce_any(queries != 0, axis=-1), tf.float32)
    layer = make_layer(queries, queries, num_heads=2, causality=False, output_projection=True,
                       qkv_activation="relu")
    randomize_weights(layer, seed=19)
    padded = layer(queries, queries, key_masks=masks, query_masks=masks)
    packing = modules.Packing(masks)
    rows = packing.pack(queries)
    run = tf.function(lambda rows: layer(rows, rows, training=False, key_masks=masks, query_masks=masks,
                                         query_packing=packing, key_packing=packing))
    np.testing.assert_allclose(run(rows).numpy(), tf.boolean_mask(padded, masks > 0).numpy(), atol=ATOL)
    widths = sorted({op.inputs[0].shape[1] for op in run.get_concrete_function(rows).graph.get_operations()
                     if op.type == "BatchMatMulV3"})
    assert len(widths) <= count and max(widths) >= 7 and (count == 1 or min(widths) < 7)


@pytest.mark.parametrize("causality", [False, True])
def test_packed_rows_give_the_padded_outputs_at_real_positions(causality):
    rng = np.random.default_rng(3)
    queries = padded_inputs(rng, 3, 5, NUM_UNITS, [5, 2, 4])
    keys = padded_inputs(rng, 3, 6, NUM_UNITS, [1, 6, 3])
    query_masks = tf.cast(tf.reduce_any(queries != 0, axis=-1), tf.float32)
    key_masks = tf.cast(tf.reduce_any(keys != 0, axis=-1), tf.float32)
    layer = make_layer(queries, keys, num_heads=2, causality=causality, output_projection=True,
                       qkv_activation=None)
    padded = layer(queries, keys, key_masks=key_masks, query_masks=query_masks)
    query_packing, key_packing = modules.Packing(query_masks), modules.Packing(key_masks)
    packed = layer(query_packing.pack(queries), key_packing.pack(keys), key_masks=key_masks,
                   query_masks=query_masks, query_packing=query_packing, key_packing=key_packing)
    np.testing.assert_allclose(packed.numpy(), tf.boolean_mask(padded, query_masks > 0).numpy(), atol=1e-5)


@pytest.mark.parametrize("training, products", [(False, {("BatchMatMulV3", 4)}), (True, {("BatchMatMul", 3)})])
def test_packed_attention_multiplies_one_row_products_at_inference_and_batches_in_training(training, products):
    """Inference (the growing loops' packed encoder): :func:`modules.row_products`, rank-4 operands whose
    products are one row each (``BatchMatMulV3``, which oneDNN's rewrite leaves alone); training:
    ``batched_matmul``, whose gradient is two plain batched products."""
    rng = np.random.default_rng(5)
    queries = padded_inputs(rng, 3, 5, NUM_UNITS, [5, 2, 4])
    masks = tf.cast(tf.reduce_any(queries != 0, axis=-1), tf.float32)
    layer = make_layer(queries, queries, num_heads=2, causality=False, output_projection=True, qkv_activation=None)
    packing = modules.Packing(masks)
    rows = packing.pack(queries)
    attend = tf.function(lambda rows: layer(rows, rows, training=training, key_masks=masks, query_masks=masks,
                                            query_packing=packing, key_packing=packing))
    graph = attend.get_concrete_function(rows).graph
    assert {(op.type, op.inputs[0].shape.rank) for op in graph.get_operations() if "MatMul" in op.type
            and "Batch" in op.type} == products


def test_per_head_init_spans_glorot_of_the_per_head_kernel_shapes():
    """``attention_init="per_head"``: each kernel spans Glorot's range for the per-head shape that
    Keras 2's MultiHeadAttention gives it ((C, h, C/h) for Q/K/V, (h, C/h, C) for W^O), computed
    here by Keras' own initializer; "glorot" spans the blog's range for the (C, C) matrix."""
    units, heads = 256, 4
    depth = units // heads
    x = tf.zeros([1, 2, units])
    ours = MultiheadAttention(units, heads, output_projection=True, attention_init="per_head")
    ours(x, x)
    blog = MultiheadAttention(units, heads, output_projection=True, attention_init="glorot")
    blog(x, x)
    shapes = {"query": (units, heads, depth), "key": (units, heads, depth), "value": (units, heads, depth),
              "output": (heads, depth, units)}
    for name, shape in shapes.items():
        # Uniform samples: the largest |w| of 65k draws is within 0.1% of the range's limit.
        limit = float(np.abs(np.asarray(keras.initializers.GlorotUniform(seed=0)(shape))).max())
        assert float(tf.reduce_max(tf.abs(getattr(ours, f"{name}_kernel")))) == pytest.approx(limit, rel=0.01)
        assert float(tf.reduce_max(tf.abs(getattr(blog, f"{name}_kernel")))) == pytest.approx(
            np.sqrt(6 / (2 * units)), rel=0.01)
    with pytest.raises(ValueError, match="attention_init must be one of glorot, per_head"):
        MultiheadAttention(units, heads, attention_init="xavier")


@pytest.mark.parametrize("self_attention", [True, False])
def test_one_matmul_projections_equal_separate_ones_in_values_and_gradients(self_attention):
    """Self-attention projects Q, K and V in one matmul, encoder-decoder attention K and V, on packed
    rows: the outputs and every weight's gradient equal the blog's restatement, which projects each
    separately (blog_multihead_attention), at the real positions."""
    rng = np.random.default_rng(31)
    lengths = [5, 3, 1]
    queries = tf.constant(padded_inputs(rng, 3, 5, NUM_UNITS, lengths))
    keys = queries if self_attention else tf.constant(padded_inputs(rng, 3, 6, NUM_UNITS, [6, 2, 4]))
    query_masks = tf.sequence_mask(lengths, 5, tf.float32)
    key_masks = query_masks if self_attention else tf.sequence_mask([6, 2, 4], 6, tf.float32)
    layer = make_layer(queries, keys, qkv_activation=None, output_projection=True, causality=self_attention)
    randomize_weights(layer, seed=33)
    query_packing, key_packing = modules.Packing(query_masks), modules.Packing(key_masks)
    packed_queries = query_packing.pack(queries)
    packed_keys = packed_queries if self_attention else key_packing.pack(keys)
    with tf.GradientTape(persistent=True) as tape:
        got = layer(packed_queries, packed_keys, training=False, key_masks=key_masks, query_masks=query_masks,
                    query_packing=query_packing, key_packing=query_packing if self_attention else key_packing)
        expected = query_packing.pack(blog_multihead_attention(
            layer.weights, queries, keys, NUM_HEADS, causality=self_attention, output_projection=True,
            qkv_activation=None, key_masks=key_masks, query_masks=query_masks))
        # One random direction, so every output element reaches the gradient.
        direction = tf.constant(rng.normal(size=expected.shape), tf.float32)
        got_loss, expected_loss = tf.reduce_sum(got * direction), tf.reduce_sum(expected * direction)
    np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)
    for variable, g, e in zip(layer.weights, tape.gradient(got_loss, layer.weights),
                              tape.gradient(expected_loss, layer.weights)):
        np.testing.assert_allclose(g.numpy(), e.numpy(), atol=1e-4, err_msg=variable.name)


@pytest.mark.parametrize("qkv_activation", [None, "relu"])
@pytest.mark.parametrize("self_attention", [True, False])
def test_inference_projects_q_k_v_each_and_gives_trainings_numbers(qkv_activation, self_attention):
    """Training projects self-attention's Q, K and V (encoder-decoder attention's K and V) with one
    matmul of the concatenated kernels, inference (training not True: evaluation, decoding, the
    export) with one matmul each (no concatenation at every call or step): with no dropout, the same
    outputs and the same cache of projected keys and values, against the blog's restatement (each
    projected separately)."""
    rng = np.random.default_rng(41)
    lengths, key_lengths = [4, 2], ([4, 2] if self_attention else [5, 3])
    queries = tf.constant(padded_inputs(rng, 2, 4, NUM_UNITS, lengths))
    keys = queries if self_attention else tf.constant(padded_inputs(rng, 2, 5, NUM_UNITS, key_lengths))
    layer = make_layer(queries, keys, qkv_activation=qkv_activation, output_projection=True, causality=self_attention)
    randomize_weights(layer, seed=43)
    masks = tf.sequence_mask(lengths, 4, tf.float32)
    key_masks = masks if self_attention else tf.sequence_mask(key_lengths, 5, tf.float32)
    expected = blog_multihead_attention(layer.weights, queries, keys, NUM_HEADS, causality=self_attention,
                                        output_projection=True, qkv_activation=qkv_activation,
                                        key_masks=key_masks, query_masks=masks)
    for training in (True, None, False):
        got = layer(queries, keys, training=training, key_masks=key_masks, query_masks=masks)
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=ATOL, err_msg=f"training={training}")
    # Cached decoding (one matmul each): self-attention appends one position at a time, encoder-decoder
    # attention reads keys projected once (project_keys); the whole call's numbers at every position.
    cache = layer.empty_cache(2) if self_attention else layer.project_keys(keys, key_masks, decoding=True)
    for t in range(4):
        new = dict(keys=queries[:, t:t + 1], key_masks=masks[:, t:t + 1]) if self_attention else {}
        out, cache = layer.call_cached(queries[:, t:t + 1], cache, query_masks=masks[:, t:t + 1], **new)
        np.testing.assert_allclose(out.numpy()[:, 0] * masks.numpy()[:, t:t + 1], expected.numpy()[:, t] *
                                   masks.numpy()[:, t:t + 1], atol=ATOL, err_msg=f"position {t}")


@pytest.mark.parametrize("dtype, outside_xla", [(tf.bfloat16, tf.float32), (tf.float16, tf.float16)])
@pytest.mark.parametrize("self_attention", [True, False])
def test_decoding_caches_are_float32_for_bfloat16_outside_xla_else_of_the_layers_dtype(self_attention, dtype,
                                                                                       outside_xla):
    """modules.decoding_dtype: a bfloat16 layer's cached keys and values are float32 outside XLA (their products
    by float32's kernels), bfloat16 inside; a float16 layer's (a GPU's) float16 in both; either way the outputs
    are of the layer's dtype and are the whole call's numbers at every position, and the blog's restated in
    float32 on the same weights and inputs (within the dtype's rounding)."""
    rng = np.random.default_rng(47)
    lengths, key_lengths = [4, 2], ([4, 2] if self_attention else [5, 3])
    queries32 = padded_inputs(rng, 2, 4, NUM_UNITS, lengths)
    keys32 = queries32 if self_attention else padded_inputs(rng, 2, 5, NUM_UNITS, key_lengths)
    layer = MultiheadAttention(num_units=NUM_UNITS, num_heads=NUM_HEADS, causality=self_attention, dtype=dtype.name)
    queries, keys = tf.constant(queries32, dtype), tf.constant(keys32, dtype)
    layer(queries, keys, training=False)
    randomize_weights(layer, seed=48)
    masks = tf.sequence_mask(lengths, 4, tf.float32)
    key_masks = masks if self_attention else tf.sequence_mask(key_lengths, 5, tf.float32)
    expected = layer(queries, keys, training=False, key_masks=key_masks, query_masks=masks).numpy().astype(np.float32)
    restated = blog_multihead_attention([tf.cast(w, tf.float32) for w in layer.weights], tf.cast(queries, tf.float32),
                                        tf.cast(keys, tf.float32), NUM_HEADS, causality=self_attention,
                                        output_projection=layer.output_projection,
                                        qkv_activation=layer.qkv_activation, key_masks=key_masks,
                                        query_masks=masks).numpy()

    dtypes = set()  # of the caches' keys and values, as traced

    def decode():
        cache = layer.empty_cache(2) if self_attention else layer.project_keys(keys, key_masks, decoding=True)
        outputs = []
        for t in range(4):
            new = dict(keys=queries[:, t:t + 1], key_masks=masks[:, t:t + 1]) if self_attention else {}
            dtypes.update({cache["key"].dtype, cache["value"].dtype})
            out, cache = layer.call_cached(queries[:, t:t + 1], cache, query_masks=masks[:, t:t + 1], **new)
            outputs.append(out)
        return tf.concat(outputs, axis=1)

    for run, cache_dtype in ((decode, outside_xla), (tf.function(decode, jit_compile=True), dtype)):
        dtypes.clear()
        outputs = run()
        assert outputs.dtype == dtype and dtypes == {cache_dtype}
        real = masks.numpy()[..., None]
        np.testing.assert_allclose(outputs.numpy().astype(np.float32) * real, expected * real, atol=6e-2)
        np.testing.assert_allclose(outputs.numpy().astype(np.float32) * real, restated * real, atol=6e-2)


# ---------------------------------------------------------------------------
# Packed training attention (_attend_packed): one unpack for Q/K/V, one mask bias per batch, no step 7
# ---------------------------------------------------------------------------


def test_a_float32_score_plus_the_mask_value_rounds_to_the_mask_value():
    """What lets Packing.attention_bias add MASK_VALUE instead of selecting it: for scores in
    [-256, 128] the sum rounds to MASK_VALUE exactly, so masked scores equal the blog's."""
    scores = tf.constant(np.concatenate([np.linspace(-256, 128, 10001), [0.0, -1e-30, 1e-30, 127.9, -255.9]]),
                         tf.float32)
    np.testing.assert_array_equal((scores + modules.MASK_VALUE).numpy(),
                                  np.full(scores.shape, np.float32(modules.MASK_VALUE)))
    # A row of masked keys only: the same uniform softmax as tf.where's.
    row = tf.constant([[3.0, -7.5, 100.0, -200.0]])
    np.testing.assert_array_equal(tf.nn.softmax(row + modules.MASK_VALUE).numpy(),
                                  tf.nn.softmax(tf.fill([1, 4], modules.MASK_VALUE)).numpy())


@pytest.mark.parametrize("causality", [False, True])
def test_attention_bias_is_the_blogs_key_and_causal_masks(causality):
    masks = tf.constant([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    bias = modules.Packing(masks).attention_bias(2, causality).numpy()
    seen = np.tile(masks.numpy(), [2, 1])[:, None, :] != 0  # (h*N, 1, T), head-major
    if causality:
        seen = seen & np.tril(np.ones([3, 3], bool))[None]
    np.testing.assert_array_equal(bias, np.where(seen, 0.0, np.float32(modules.MASK_VALUE)))


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
@pytest.mark.parametrize("self_attention", [True, False])
def test_packed_attention_equals_the_padded_layer_in_values_and_gradients(policy, self_attention, bucketed):
    """The packed path (_attend_packed) against the padded one (tf.where masks, step 7, one head split
    each) on the same weights: the outputs at the real positions and every weight's and input's
    gradient, in float32 and in mixed bfloat16 (within bfloat16's rounding); ``bucketed``: with dummy
    rows (weighed 0) and the XLA-compiled tail."""
    from tf_transformer.train.step import precision_policy

    rng = np.random.default_rng(41)
    lengths, key_lengths = [5, 3, 1], [6, 2, 4]
    queries = tf.constant(padded_inputs(rng, 3, 5, NUM_UNITS, lengths))
    keys = queries if self_attention else tf.constant(padded_inputs(rng, 3, 6, NUM_UNITS, key_lengths))
    query_masks = tf.sequence_mask(lengths, 5, tf.float32)
    key_masks = query_masks if self_attention else tf.sequence_mask(key_lengths, 6, tf.float32)
    with precision_policy(policy):
        layer = make_layer(queries, keys, qkv_activation="relu", output_projection=True,
                           causality=self_attention)
    randomize_weights(layer, seed=43)
    query_packing = modules.Packing(query_masks, bucketed)
    key_packing = query_packing if self_attention else modules.Packing(key_masks, bucketed)
    rows = int(tf.shape(query_packing.indices)[0])
    assert rows == (64 if bucketed else 9)  # 9 real rows, bucketed to the least count
    real = np.arange(rows) < int(query_packing.real)  # the dummy rows weighed 0
    direction = tf.constant(rng.normal(size=(rows, NUM_UNITS)) * real[:, None], tf.float32)
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([queries, keys])
        packed_queries = query_packing.pack(queries)
        packed_keys = packed_queries if self_attention else key_packing.pack(keys)
        got = tf.cast(layer(packed_queries, packed_keys, training=False, key_masks=key_masks,
                            query_masks=query_masks, query_packing=query_packing, key_packing=key_packing),
                      tf.float32)
        padded = layer(queries, keys, training=False, key_masks=key_masks, query_masks=query_masks)
        expected = query_packing.pack(tf.cast(padded, tf.float32))
        got_loss, expected_loss = tf.reduce_sum(got * direction), tf.reduce_sum(expected * direction)
    tolerance = 1e-5 if policy == "float32" else 0.03
    np.testing.assert_allclose(got.numpy()[real], expected.numpy()[real], atol=tolerance)
    sources = layer.trainable_weights + [queries] + ([] if self_attention else [keys])
    for source, g, e in zip(sources, tape.gradient(got_loss, sources), tape.gradient(expected_loss, sources)):
        g, e = tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(e).numpy()
        np.testing.assert_allclose(g, e, atol=tolerance * max(1.0, float(np.abs(e).max())),
                                   err_msg=getattr(source, "path", "inputs"))

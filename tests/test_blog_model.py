"""The whole Transformer in the blog-exact mode against an independent restatement
of the blog version's TF1 graph (``blog_reference.py``): same logits, same loss.
"""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.hparams import load_hparams
from tf_transformer.nn.model import Transformer, masked_loss, shift_right

from blog_reference import blog_logits, blog_loss, decoder_inputs_from, weights_by_path
from helpers import padded_ids

SOURCE_VOCAB, TARGET_VOCAB = 30, 40
SIZES = dict(num_blocks=2, num_units=16, num_heads=4, d_ff=32, maxlen=12)
# The blog's architecture options; dropout on, to show inference ignores it.
BLOG_OPTIONS = dict(qkv_activation="relu", output_projection=False, positional_encoding="learned",
                    mask_source="inputs", dropout_rate=0.1, residual_dropout_rate=0.0, attention_init="glorot")
ATOL = 1e-5

# Padded batches: row r is real for lengths[r] tokens, then <PAD>.
X_LENGTHS = [12, 7, 1, 4]   # one row as long as maxlen: every position row is used
Y_LENGTHS = [9, 3, 5, 0]    # one all-<PAD> target row: decoder inputs <S> then pads
T_X, T_Y = 12, 9


def build(model):
    ids = tf.constant([[5, 6]], tf.int32)
    model((ids, ids), training=False)
    return model


def randomize_all_weights(model, seed):
    """Every variable random: biases, beta and gamma too (gamma around 1), so
    no term of the graph is trivially zero or one."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = rng.normal(scale=0.5, size=tuple(weight.shape))
        if weight.path.endswith("gamma"):
            value += 1.0
        weight.assign(value.astype(np.float32))


def blog_model(seed=0, **overrides):
    tf.random.set_seed(seed)
    model = build(Transformer(SOURCE_VOCAB, TARGET_VOCAB, **{**SIZES, **BLOG_OPTIONS, **overrides}))
    randomize_all_weights(model, seed)
    return model


def reference_logits(model, x, y, record=None):
    config = model.get_config()
    return blog_logits(weights_by_path(model), x, y, config["source_vocab_size"], config["target_vocab_size"],
                       config["num_blocks"], config["num_units"], config["num_heads"], config["d_ff"],
                       config["maxlen"], record=record).numpy()


def project_logits(model, x, y):
    return model((tf.constant(x), shift_right(tf.constant(y))), training=False).numpy()


def max_difference_at_real_positions(a, b, lengths):
    return max(float(np.abs(a[r, :n] - b[r, :n]).max()) for r, n in enumerate(lengths) if n)


# ---------------------------------------------------------------------------
# Sanity of the restatement itself
# ---------------------------------------------------------------------------


def test_reference_reads_every_variable_of_the_model():
    """The restatement maps every project variable (none left unused), so a
    weight the project adds or ignores would show up here."""
    model = blog_model()
    variables = weights_by_path(model)
    used = set()

    class Recording(dict):
        def __contains__(self, name):
            used.add(name)
            return dict.__contains__(self, name)

    blog_logits(Recording(variables), padded_ids(1, X_LENGTHS, T_X, SOURCE_VOCAB),
                padded_ids(2, Y_LENGTHS, T_Y, TARGET_VOCAB), SOURCE_VOCAB, TARGET_VOCAB,
                SIZES["num_blocks"], SIZES["num_units"], SIZES["num_heads"], SIZES["d_ff"], SIZES["maxlen"])
    assert used == set(variables)
    assert len(variables) == len(model.weights) == 4 + 2 * (8 + 6) + 2 * (8 + 8 + 6) + 2


def test_decoder_inputs_are_bos_then_target_shifted_right():
    y = np.array([[7, 8, 3, 0], [9, 3, 0, 0]], np.int32)
    np.testing.assert_array_equal(decoder_inputs_from(tf.constant(y)).numpy(), [[2, 7, 8, 3], [2, 9, 3, 0]])
    np.testing.assert_array_equal(shift_right(tf.constant(y)).numpy(), decoder_inputs_from(tf.constant(y)).numpy())


def test_reference_is_sensitive_to_every_part():
    """The parity below is a real check: each part of the restated graph moves
    the logits (a restatement that ignored a weight would not)."""
    model = blog_model(seed=3)
    x, y = padded_ids(1, X_LENGTHS, T_X, SOURCE_VOCAB), padded_ids(2, Y_LENGTHS, T_Y, TARGET_VOCAB)
    base = reference_logits(model, x, y)
    for suffix in ("enc_positions/table/lookup_table", "encoder_block_1/feedforward/inner_bias",
                   "decoder_block_0/vanilla_attention/key_kernel", "decoder_block_1/self_attention/layer_norm/beta",
                   "logits/bias"):
        weight = next(w for w in model.weights if w.path.endswith(suffix))
        saved = weight.numpy()
        weight.assign(saved + 0.1)
        assert np.abs(reference_logits(model, x, y) - base).max() > 1e-3, suffix
        weight.assign(saved)
    # Row 0 of the token tables is the zero <PAD> row: its stored value never matters.
    weight = model.enc_embedding.lookup_table
    project = project_logits(model, x, y)
    weight.assign(tf.tensor_scatter_nd_update(weight, [[0]], [tf.fill([SIZES["num_units"]], 9.0)]))
    np.testing.assert_array_equal(reference_logits(model, x, y), base)
    np.testing.assert_array_equal(project_logits(model, x, y), project)


# ---------------------------------------------------------------------------
# Parity: blog-exact mode == the blog's graph
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1])
def test_blog_mode_logits_and_loss_match_the_blog_graph(seed):
    model = blog_model(seed=seed)
    x = padded_ids(10 + seed, X_LENGTHS, T_X, SOURCE_VOCAB)
    y = padded_ids(20 + seed, Y_LENGTHS, T_Y, TARGET_VOCAB)

    got = project_logits(model, x, y)
    expected = reference_logits(model, x, y)
    assert got.shape == (len(X_LENGTHS), T_Y, TARGET_VOCAB)
    assert np.all(np.isfinite(got))
    assert np.abs(expected).max() > 1.0  # not a degenerate comparison
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)

    loss = float(masked_loss(tf.constant(y), tf.constant(got), 0.1))
    np.testing.assert_allclose(loss, float(blog_loss(y, expected, 0.1)), rtol=1e-6, atol=ATOL)
    # Same loss on the same logits, to 1e-6.
    np.testing.assert_allclose(loss, float(blog_loss(y, got, 0.1)), rtol=1e-6)


def test_blog_mode_matches_with_unequal_lengths_and_encode_decode_split():
    """T_x != T_y, both shorter than maxlen; encode()/decode() give the same as call()."""
    model = blog_model(seed=5)
    x = padded_ids(30, [5, 2, 3], 5, SOURCE_VOCAB)
    y = padded_ids(31, [7, 7, 1], 7, TARGET_VOCAB)
    memory, source_masks, _ = model.encode(tf.constant(x), training=False)
    assert source_masks is None  # the blog recomputes masks in each layer
    got = model.decode(shift_right(tf.constant(y)), memory, source_masks, training=False).numpy()
    np.testing.assert_allclose(got, reference_logits(model, x, y), rtol=0, atol=ATOL)


def test_loss_matches_the_blog_loss_on_random_logits():
    rng = np.random.default_rng(7)
    y = padded_ids(8, Y_LENGTHS, T_Y, TARGET_VOCAB)
    y[0, 2] = 3  # </S> and <UNK> are ordinary targets
    y[1, 0] = 1
    logits = (rng.normal(size=(len(Y_LENGTHS), T_Y, TARGET_VOCAB)) * 4).astype(np.float32)
    for epsilon in (0.1, 0.0):
        np.testing.assert_allclose(float(masked_loss(tf.constant(y), tf.constant(logits), epsilon)),
                                   float(blog_loss(y, logits, epsilon)), rtol=1e-6)


def test_blog_preset_builds_the_blog_exact_model():
    hp = load_hparams(preset="blog", overrides=[f"{key}={value}" for key, value in SIZES.items()])
    assert (hp.qkv_activation, hp.output_projection, hp.positional_encoding, hp.mask_source) == (
        "relu", False, "learned", "inputs")
    assert hp.residual_dropout_rate == 0.0 and hp.layer_norm_epsilon == 1e-8 and hp.label_smoothing == 0.1
    tf.random.set_seed(0)
    model = build(Transformer.from_hparams(hp, SOURCE_VOCAB, TARGET_VOCAB))
    for key, value in {**SIZES, "qkv_activation": "relu", "output_projection": False,
                       "positional_encoding": "learned", "mask_source": "inputs"}.items():
        assert model.get_config()[key] == value, key
    randomize_all_weights(model, seed=11)

    x = padded_ids(12, X_LENGTHS, T_X, SOURCE_VOCAB)
    y = padded_ids(13, Y_LENGTHS, T_Y, TARGET_VOCAB)
    got = project_logits(model, x, y)
    expected = reference_logits(model, x, y)
    np.testing.assert_allclose(got, expected, rtol=0, atol=ATOL)
    np.testing.assert_allclose(float(masked_loss(tf.constant(y), tf.constant(got), hp.label_smoothing)),
                               float(blog_loss(y, expected, hp.label_smoothing)), rtol=1e-6, atol=ATOL)


# ---------------------------------------------------------------------------
# The default mode: masks from the embedding (the fix)
# ---------------------------------------------------------------------------


def default_mode_twin(model):
    """The same weights under mask_source="embedding", other options the blog's."""
    twin = build(Transformer(SOURCE_VOCAB, TARGET_VOCAB, **{**SIZES, **BLOG_OPTIONS, "mask_source": "embedding"}))
    assert [w.path.split("/", 1)[1] for w in twin.weights] == [w.path.split("/", 1)[1] for w in model.weights]
    twin.set_weights(model.get_weights())
    return twin


def test_default_masks_differ_from_the_blog_on_padded_batches():
    """With padding the blog masks nothing (positions make pad rows non-zero);
    the default masks pads in every block, so real positions differ."""
    model = blog_model(seed=2)
    twin = default_mode_twin(model)
    x = padded_ids(40, X_LENGTHS, T_X, SOURCE_VOCAB)
    y = padded_ids(41, Y_LENGTHS, T_Y, TARGET_VOCAB)
    record = []
    expected = reference_logits(model, x, y, record)
    for name, query_masks, key_masks in record:  # the blog's defect: nothing is masked
        assert query_masks.min() == 1 and key_masks.min() == 1, name
    np.testing.assert_allclose(project_logits(model, x, y), expected, rtol=0, atol=ATOL)
    # Rows 1 and 2 (padded source and target) differ at real positions; row 0
    # has no padding on either side, so both rules give all-ones masks there.
    default = project_logits(twin, x, y)
    assert max_difference_at_real_positions(default[1:3], expected[1:3], Y_LENGTHS[1:3]) > 1e-3
    np.testing.assert_allclose(default[0], expected[0], rtol=0, atol=ATOL)


def test_default_masks_equal_the_blog_without_padding_unless_a_row_sums_to_zero():
    """Without padding the default's masks are all ones. The blog's are
    sign(abs(sum(row))) of each layer's input: all ones too, unless some row
    sums to exactly zero. So the two agree on an unpadded batch exactly when no
    layer input row sums to 0 (checked here, not assumed), and a real token
    whose embedding + position sums to 0 makes them differ even without pads."""
    model = blog_model(seed=4)
    twin = default_mode_twin(model)
    x = padded_ids(50, [T_X] * 3, T_X, SOURCE_VOCAB)
    y = padded_ids(51, [T_Y] * 3, T_Y, TARGET_VOCAB)
    assert (x != 0).all() and (y != 0).all()

    record = []
    expected = reference_logits(model, x, y, record)
    assert len(record) == 3 * SIZES["num_blocks"]
    for name, query_masks, key_masks in record:
        assert query_masks.min() == 1 and key_masks.min() == 1, name
    np.testing.assert_allclose(project_logits(twin, x, y), expected, rtol=0, atol=ATOL)
    np.testing.assert_allclose(project_logits(model, x, y), expected, rtol=0, atol=ATOL)

    # Now make the first encoder input row of token x[0, 0] at position 0 sum to
    # exactly 0 (small integers: exact in float32 whatever the summation order):
    # sqrt(16) * embedding row + position row.
    rng = np.random.default_rng(52)
    units = SIZES["num_units"]
    token_row = rng.integers(-4, 5, size=units) / 4.0  # times sqrt(16) = 4: integers
    position_row = rng.integers(-3, 4, size=units).astype(np.float64)
    position_row[-1] -= (4.0 * token_row + position_row).sum()
    assert (4.0 * token_row + position_row).sum() == 0 and (4.0 * token_row + position_row).any()
    token = x[0, 0]
    for m in (model, twin):
        table = m.enc_embedding.lookup_table.numpy()
        table[token] = token_row
        m.enc_embedding.lookup_table.assign(table)
        positions = m.enc_positions.table.lookup_table.numpy()
        positions[0] = position_row
        m.enc_positions.table.lookup_table.assign(positions)

    record = []
    expected = reference_logits(model, x, y, record)
    name, query_masks, key_masks = record[0]
    assert name == "encoder_block_0/self_attention"
    assert query_masks[0, 0] == 0 and key_masks[0, 0] == 0  # the blog masks a real token
    assert query_masks.sum() == key_masks.sum() == query_masks.size - 1
    # The blog-exact mode follows the blog, defect included; the default does not.
    np.testing.assert_allclose(project_logits(model, x, y), expected, rtol=0, atol=ATOL)
    assert np.abs(project_logits(twin, x, y)[0] - expected[0]).max() > 1e-3

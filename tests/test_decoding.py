"""Greedy decoding: the reference (full recompute) and the cached decoder against it."""

import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.infer import decode
from tf_transformer.infer.decode import generate, greedy_decode, length_limits
from tf_transformer.nn.model import Transformer
from tf_transformer.nn.modules import MultiheadAttention


def make_model(mask_source="embedding"):
    tf.random.set_seed(1)
    model = Transformer(30, 25, num_blocks=2, num_units=16, num_heads=2, d_ff=32, dropout_rate=0.1,
                        residual_dropout_rate=0.0, qkv_activation="relu", output_projection=False,
                        attention_init="glorot", positional_encoding="sinusoid", mask_source=mask_source)
    ids = tf.constant([[5, 6]])
    model((ids, ids))
    return model


SOURCE = np.array([[5, 9, 7, 3, 0], [8, 3, 0, 0, 0], [11, 12, 13, 14, 3]], np.int32)


def favour_token(model, token):
    """Makes ``token`` the argmax everywhere by biasing the output layer."""
    bias = np.zeros(25, np.float32)
    bias[token] = 1e4
    model.logits_layer.bias.assign(bias)


@pytest.mark.parametrize("mask_source", ["embedding", "inputs"])
def test_each_token_is_the_argmax_given_the_prefix(mask_source):
    """The defining property of greedy decoding, checked with one teacher-forced
    pass of the whole model over the decoded sequence."""
    model = make_model(mask_source)
    if mask_source == "inputs":
        # With gamma=1, beta=0 (untrained) every LayerNorm output row sums to ~0
        # in float32, so the blog's sign(abs(sum(x))) masks rows at random: the
        # original's defect. Trained-like values make the rule well defined.
        rng = np.random.default_rng(0)
        for weight in model.weights:
            if weight.path.endswith(("gamma", "beta")):
                weight.assign(rng.normal(scale=0.5, size=weight.shape).astype(np.float32))
    tokens = greedy_decode(model, SOURCE, max_length=8)
    decoder_inputs = np.concatenate([np.full([3, 1], BOS_ID), tokens[:, :-1]], axis=1)
    logits = model((tf.constant(SOURCE), tf.constant(decoder_inputs)), training=False).numpy()
    for row in range(3):
        ends = np.flatnonzero(tokens[row] == EOS_ID)
        length = ends[0] + 1 if ends.size else tokens.shape[1]
        np.testing.assert_array_equal(tokens[row, :length], logits[row, :length].argmax(-1))
        assert (tokens[row, length:] == PAD_ID).all()


@pytest.mark.parametrize("mask_source", ["embedding", "inputs"])
def test_packed_start_projects_the_padded_memory(mask_source):
    """``start_decoding(pack=True)``, the growing loops' encoder on the real source tokens only, gives the
    padded encoder's keys and values at every real position (``inputs``: no packing, the same)."""
    model = make_model(mask_source)
    padded, packed = (model.start_decoding(tf.constant(SOURCE), 4, pack=pack)["memory"] for pack in (False, True))
    real = np.repeat(SOURCE != PAD_ID, 2, axis=0)  # 2 heads, batch-major rows n*h + j
    for padded_block, packed_block in zip(padded, packed):
        np.testing.assert_array_equal(padded_block["key_masks"], packed_block["key_masks"])
        for name in ("key", "value"):
            np.testing.assert_allclose(packed_block[name].numpy()[real], padded_block[name].numpy()[real], atol=1e-5)
            assert packed_block[name].shape == padded_block[name].shape


def test_stops_as_soon_as_every_sentence_has_ended():
    model = make_model()
    favour_token(model, EOS_ID)
    np.testing.assert_array_equal(greedy_decode(model, SOURCE), [[EOS_ID]] * 3)


def test_default_length_limit_is_source_length_plus_50():
    """Each sentence's own length (its non-<PAD> ids) + 50, not the padded batch's width."""
    model = make_model()
    favour_token(model, 7)
    tokens = greedy_decode(model, SOURCE)
    lengths = (SOURCE != PAD_ID).sum(axis=1)
    assert tokens.shape == (3, lengths.max() + 50)
    for row, length in zip(tokens, lengths):
        assert (row[:length + 50] == 7).all() and (row[length + 50:] == PAD_ID).all()
    assert greedy_decode(model, SOURCE, max_length=4).shape == (3, 4)
    assert (greedy_decode(model, SOURCE, max_length=4) == 7).all()


def test_a_translation_does_not_depend_on_its_batch():
    """translate.py --trace decodes with greedy_decode: a sentence alone and beside longer ones
    (more padding) gets the same output."""
    model = make_model()
    favour_token(model, 7)
    batched = greedy_decode(model, SOURCE)
    for source, row in zip(SOURCE, batched):
        alone = greedy_decode(model, source[source != PAD_ID][None])[0]
        np.testing.assert_array_equal(row[:len(alone)], alone)
        assert (row[len(alone):] == PAD_ID).all()


def test_on_step_sees_the_growing_output():
    model = make_model()
    seen = []
    tokens = greedy_decode(model, SOURCE, max_length=5, on_step=lambda step, t: seen.append((step, t.copy())))
    assert [step for step, _ in seen] == list(range(len(seen)))
    for step, partial in seen:
        np.testing.assert_array_equal(partial, tokens[:, : step + 1])


# ---------------------------------------------------------------------------
# Cached decoding (decode.generate) against the reference
# ---------------------------------------------------------------------------

# The two attention variants: the blog's (ReLU Q/K/V, no W^O, learned positions,
# a table shorter than the decoded length) and the paper's.
VARIANTS = {
    "blog": dict(qkv_activation="relu", output_projection=False, positional_encoding="learned", maxlen=8),
    "paper": dict(qkv_activation=None, output_projection=True, positional_encoding="sinusoid"),
}
SOURCE_VOCAB, TARGET_VOCAB = 30, 25
# Sources of different lengths, </S>-terminated, <PAD>-padded.
SOURCES = np.array([[5, 9, 7, 12, 3, 0, 0], [8, 3, 0, 0, 0, 0, 0], [11, 12, 13, 14, 15, 16, 3],
                    [3, 0, 0, 0, 0, 0, 0]], np.int32)
MAX_LENGTH = 10


@functools.cache
def build_model(mask_source="embedding", variant="paper"):
    """One model per configuration, shared by the tests (each sets its weights with
    :func:`randomize`), so that generate() is traced once per configuration."""
    tf.random.set_seed(0)
    model = Transformer(SOURCE_VOCAB, TARGET_VOCAB, num_blocks=2, num_units=16, num_heads=4, d_ff=32,
                        dropout_rate=0.1, residual_dropout_rate=0.0, attention_init="glorot",
                        mask_source=mask_source, **VARIANTS[variant])
    ids = tf.constant([[5, 6]])
    model((ids, ids))
    return model


def randomize(model, seed, eos_rate=0.1):
    """Every weight random (gamma around 1, beta and biases too: trained-like values, so
    the blog's sign(abs(sum(x))) masks are well defined), then the </S> logit biased to
    win at about ``eos_rate`` of the positions: some sentences end, others run to the limit."""
    rng = np.random.default_rng(seed)
    for weight in model.weights:
        value = rng.normal(scale=0.5, size=tuple(weight.shape))
        weight.assign((value + weight.path.endswith("gamma")).astype(np.float32))
    decoder_inputs = rng.integers(4, TARGET_VOCAB, size=(8, MAX_LENGTH)).astype(np.int32)
    x = np.tile(SOURCES, [2, 1])
    logits = model((tf.constant(x), tf.constant(decoder_inputs)), training=False).numpy()
    gap = logits.max(axis=-1) - logits[..., EOS_ID]
    bias = model.logits_layer.bias.numpy()
    bias[EOS_ID] += np.quantile(gap, eos_rate)
    model.logits_layer.bias.assign(bias)


def log_probs_under_model(model, x, ids):
    """Each hypothesis' log-probability by one teacher-forced pass of the whole model.

    Args: x (N, T_x); ids (N, T) hypotheses, <PAD> after </S>.
    Returns: (N,) float64 sum of log p(token | prefix) up to and including the first
      </S> (every token when there is none), and (N,) their lengths.
    """
    ids = np.asarray(ids)
    decoder_inputs = np.concatenate([np.full([len(ids), 1], BOS_ID), ids[:, :-1]], axis=1).astype(np.int32)
    logits = model((tf.constant(x), tf.constant(decoder_inputs)), training=False).numpy().astype(np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    token_log_probs = np.take_along_axis(log_probs, ids[..., None], axis=-1)[..., 0]
    ends = [np.flatnonzero(row == EOS_ID) for row in ids]
    lengths = np.array([end[0] + 1 if end.size else ids.shape[1] for end in ends])
    counted = np.arange(ids.shape[1])[None] < lengths[:, None]
    return (token_log_probs * counted).sum(-1), lengths


# Every pair of the three settings' values once (4 runs, not 8: each compiles and traces loops of its own).
@pytest.mark.parametrize("mask_source,variant,jit_compile", [("embedding", "paper", False), ("embedding", "blog", True),
                                                             ("inputs", "paper", True), ("inputs", "blog", False)])
def test_cached_greedy_gives_the_reference_tokens(mask_source, variant, jit_compile):
    model = build_model(mask_source, variant)
    ended, cut = 0, 0
    for seed in range(3):
        randomize(model, seed)
        expected = greedy_decode(model, SOURCES, max_length=MAX_LENGTH)
        ids, scores = generate(model, SOURCES, max_length=MAX_LENGTH, jit_compile=jit_compile)
        assert ids.dtype == tf.int32 and ids.shape[:2] == (len(SOURCES), 1) and scores.shape == (len(SOURCES), 1)
        np.testing.assert_array_equal(ids.numpy()[:, 0], expected)
        finished = (expected == EOS_ID).any(axis=1)
        ended, cut = ended + finished.sum(), cut + (~finished).sum()
    # Both stops were exercised: </S> before the limit, and the limit itself.
    assert ended and cut


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_the_decoding_weights_give_the_reference_tokens(shared_embeddings, jit_compile):
    """d_ff 512: the growing loop's steps multiply zero-padded feed-forward kernels (528 wide) and, with
    shared embeddings, the table transposed once; XLA's the weights as they are. Both give the tokens of
    the whole model's teacher-forced passes."""
    tf.random.set_seed(1)
    model = Transformer(TARGET_VOCAB if shared_embeddings else SOURCE_VOCAB, TARGET_VOCAB, num_blocks=1,
                        num_units=16, num_heads=4, d_ff=512, attention_init="glorot",
                        shared_embeddings=shared_embeddings)
    model((tf.constant([[5, 6]]), tf.constant([[5, 6]])))
    sources = np.minimum(SOURCES, TARGET_VOCAB - 1)

    def shapes(context):
        return context["feedforward"][0].inner_kernel.shape[-1], tuple(context["logits"].kernel.shape)

    growing = shapes(model.start_decoding(tf.constant(sources), 4))
    xla = tf.function(lambda x: shapes(model.start_decoding(x, 4)), jit_compile=True)(tf.constant(sources))
    assert growing == (528, (16, TARGET_VOCAB))
    assert xla == (512, (TARGET_VOCAB, 16) if shared_embeddings else (16, TARGET_VOCAB))
    for seed in range(2):
        randomize(model, seed)
        expected = greedy_decode(model, sources, max_length=MAX_LENGTH)
        ids, _ = generate(model, sources, max_length=MAX_LENGTH, jit_compile=jit_compile)
        np.testing.assert_array_equal(ids.numpy()[:, 0], expected)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
@pytest.mark.parametrize("compiled", [False, True])
def test_argmax_takes_the_first_of_equal_maxima_and_scores_its_log_softmax(compiled, dtype):
    """Both forms of greedy decoding's choice against numpy's argmax (the first of equal maxima) and
    a float64 log-softmax, on rows with ties at the maximum, inside XLA for the compiled form."""
    rng = np.random.default_rng(4)
    logits = rng.normal(size=(6, 4000)).astype(np.float32) * 3
    logits[1, [7, 3000]] = logits[2, [0, 3999]] = logits[3, [5, 6, 7]] = 20.0  # ties at the maximum
    logits = tf.cast(logits, dtype).numpy().astype(np.float32)  # the values the bfloat16 form sees
    run = tf.function(lambda z: decode._argmax(tf.cast(z, dtype), compiled), jit_compile=compiled)
    picked, scores = run(tf.constant(logits))
    np.testing.assert_array_equal(picked.numpy(), np.argmax(logits, axis=-1))
    z = logits.astype(np.float64)
    log_softmax = z - z.max(axis=-1, keepdims=True)
    log_softmax -= np.log(np.exp(log_softmax).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(scores.numpy(), log_softmax.max(axis=-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_greedy_score_is_the_log_probability_of_the_tokens(jit_compile):
    model = build_model()
    randomize(model, seed=4)
    ids, scores = generate(model, SOURCES, max_length=MAX_LENGTH, jit_compile=jit_compile)
    expected, _ = log_probs_under_model(model, SOURCES, ids.numpy()[:, 0])
    assert scores.dtype == tf.float32
    np.testing.assert_allclose(scores.numpy()[:, 0], expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_cached_greedy_stops_when_every_sentence_has_ended_or_at_the_limit(jit_compile):
    model = build_model()
    randomize(model, seed=0)
    favour_token(model, EOS_ID)
    ids, _ = generate(model, SOURCES, jit_compile=jit_compile)
    np.testing.assert_array_equal(ids.numpy(), [[[EOS_ID]]] * len(SOURCES))
    favour_token(model, 7)  # never </S>: every sentence runs to its limit
    np.testing.assert_array_equal(generate(model, SOURCES, max_length=4, jit_compile=jit_compile)[0].numpy(),
                                  np.full([len(SOURCES), 1, 4], 7))
    # By default each sentence's own length + 50 (also what hparams' max_decode_length 0 means),
    # so that a translation does not depend on the batch it is in.
    limits = (SOURCES != PAD_ID).sum(axis=1) + 50
    expected = np.where(np.arange(limits.max())[None, None] < limits[:, None, None], 7, PAD_ID)
    for max_length in (None, 0):
        ids, _ = generate(model, SOURCES, max_length=max_length, jit_compile=jit_compile)
        np.testing.assert_array_equal(ids.numpy(), expected)
    # max_length_factor (Marian's): at most ceil(factor * length) tokens too; max_length still wins.
    lengths = (SOURCES != PAD_ID).sum(axis=1)
    for factor, max_length, limits in ((1.5, None, np.minimum(lengths + 50, np.ceil(1.5 * lengths))),
                                       (60.0, None, lengths + 50), (1.5, 3, np.full(len(SOURCES), 3))):
        ids, _ = generate(model, SOURCES, max_length=max_length, max_length_factor=factor, jit_compile=jit_compile)
        np.testing.assert_array_equal((ids.numpy()[:, 0] == 7).sum(axis=1), limits)
        np.testing.assert_array_equal((greedy_decode(model, SOURCES, max_length, max_length_factor=factor) == 7)
                                      .sum(axis=1), limits)


def test_done_rows_leave_the_growing_loop_once_they_are_a_share_of_it(monkeypatch):
    """The growing loop's rows at each step: a done sentence stays (its tokens <PAD>) until the done ones are
    1 / GREEDY_LEAVE of the rows, then they all leave; the tokens are each sentence's limit of them."""
    model = build_model.__wrapped__()  # not the shared model: its loops are traced already
    randomize(model, seed=4)
    favour_token(model, 7)  # never </S>: every sentence runs to its limit
    sources = np.where(np.arange(8)[None] <= np.arange(8)[:, None], 5, PAD_ID).astype(np.int32)  # 1..8 ids
    rows = []
    decode_step = type(model).decode_step

    def recorded(self, ids, *args, **kwargs):
        ids = tf.numpy_function(lambda a: (rows.append(len(a)), a)[1], [ids], tf.int32, stateful=True)
        return decode_step(self, tf.ensure_shape(ids, [None, None]), *args, **kwargs)

    monkeypatch.setattr(type(model), "decode_step", recorded)
    ids, _ = generate(model, sources, max_length_factor=1.0)  # limits 1..8
    np.testing.assert_array_equal((ids.numpy()[:, 0] == 7).sum(axis=1), np.arange(1, 9))
    expected, limits = [], list(range(1, 9))
    for t in range(8):  # restated: after step t the rows whose limit is t + 1 are done
        expected.append(len(limits))
        if sum(limit <= t + 1 for limit in limits) * decode.GREEDY_LEAVE >= len(limits):
            limits = [limit for limit in limits if limit > t + 1]
    assert rows == expected == [8, 8, 6, 6, 4, 3, 2, 1]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_empty_batch(jit_compile):
    model = build_model()
    ids, scores = generate(model, np.zeros([0, 4], np.int32), jit_compile=jit_compile)
    assert ids.shape[:2] == (0, 1) and scores.shape == (0, 1)


def restated_vanilla_weights(block, dec, memory, real_source, real_target):
    """Steps 1-7 of the paper variant's encoder-decoder attention, restated in numpy:
    head j (channels j*C/h to (j+1)*C/h) of softmax(Q K^T / sqrt(C/h)) over the real
    source tokens, zero rows for <PAD> decoder positions. (N, h, T_y, T_x)."""
    masks = tf.constant(real_target.astype(np.float32))
    queries = block.self_attention(dec, dec, training=False, key_masks=masks, query_masks=masks).numpy()
    attention = block.vanilla_attention
    Q = queries @ attention.query_kernel.numpy() + attention.query_bias.numpy()
    K = memory @ attention.key_kernel.numpy() + attention.key_bias.numpy()
    heads, depth = attention.num_heads, Q.shape[-1] // attention.num_heads
    weights = []
    for j in range(heads):
        channels = slice(j * depth, (j + 1) * depth)
        scores = Q[..., channels] @ K[..., channels].transpose(0, 2, 1) / np.sqrt(depth)
        scores = np.where(real_source[:, None, :], scores, -np.inf)
        exp = np.exp(scores - scores.max(-1, keepdims=True))
        weights.append(exp / exp.sum(-1, keepdims=True) * real_target[:, :, None])
    return np.stack(weights, axis=1)


def test_attention_weights_are_the_encoder_decoder_attention_of_every_block():
    model = build_model()
    randomize(model, seed=1)
    decoder_inputs = np.array([[BOS_ID, 5, 6], [BOS_ID, 7, 0], [BOS_ID, 8, 9], [BOS_ID, 0, 0]], np.int32)
    weights = model.attention_weights(tf.constant(SOURCES), tf.constant(decoder_inputs))
    assert len(weights) == 2
    real_source, real_target = SOURCES != PAD_ID, decoder_inputs != PAD_ID
    memory, source_masks, _ = model.encode(tf.constant(SOURCES), training=False)
    dec = model.dec_embedding(decoder_inputs) + model.dec_positions(decoder_inputs)
    target_masks = tf.constant(real_target.astype(np.float32))
    for block, got in zip(model.decoder_blocks, weights):
        assert got.dtype == tf.float32 and got.shape == (4, 4, 3, SOURCES.shape[1])  # (N, h, T_y, T_x)
        got = got.numpy()
        np.testing.assert_allclose(got, restated_vanilla_weights(block, dec, memory.numpy(), real_source, real_target),
                                   atol=1e-5)
        # Rows are distributions over the real source tokens; a <PAD> decoder position attends to nothing.
        np.testing.assert_allclose(got.sum(-1), np.broadcast_to(real_target[:, None, :], got.shape[:3]), atol=1e-5)
        assert np.abs(got[:, 0] - got[:, 1]).max() > 1e-3  # heads differ
        dec = block(dec, memory, training=False, source_masks=source_masks, target_masks=target_masks)


@pytest.fixture
def mixed_bfloat16():
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    yield
    keras.mixed_precision.set_global_policy("float32")


@pytest.mark.slow
@pytest.mark.parametrize("jit_compile", [False, True])
def test_decoding_under_mixed_bfloat16(mixed_bfloat16, jit_compile):
    model = make_model()
    for beam_size in (1, 3):
        ids, scores = generate(model, SOURCE, beam_size=beam_size, max_length=6, jit_compile=jit_compile)
        assert scores.dtype == tf.float32 and np.isfinite(scores.numpy()).all()
        assert ids.shape[:2] == (3, 1) and ((ids.numpy() >= 0) & (ids.numpy() < 25)).all()
    # Greedy: every id is an argmax of the model's logits for its prefix, up to bfloat16's rounding (the
    # loops and the full recompute multiply other shapes, whose bfloat16 results may differ in the last bit,
    # and this tiny random model has near ties, so its ids are not compared with greedy_decode's here).
    ids, _ = generate(model, SOURCE, max_length=6, jit_compile=jit_compile)
    ids = ids.numpy()[:, 0]
    prefixes = np.concatenate([np.full([len(ids), 1], BOS_ID, np.int32), ids[:, :-1]], axis=1)
    logits = model((tf.constant(SOURCE), tf.constant(prefixes)), training=False).numpy().astype(np.float64)
    chosen = np.take_along_axis(logits, ids[..., None], -1)[..., 0]
    decoded = np.cumsum(np.cumsum(ids == EOS_ID, axis=1), axis=1) <= 1  # up to the first </S>
    margin = logits.max(-1) - chosen
    assert decoded.sum() > len(ids) and (margin[decoded] <= 0.05 * np.abs(logits).max()).all()


def test_attention_weights_run_each_decoder_self_attention_once(monkeypatch):
    model = build_model()
    calls = []
    call = MultiheadAttention.call

    def counted(layer, *args, **kwargs):
        calls.append(layer)
        return call(layer, *args, **kwargs)

    monkeypatch.setattr(MultiheadAttention, "call", counted)
    decoder_inputs = np.array([[BOS_ID, 5, 6], [BOS_ID, 7, 0], [BOS_ID, 8, 9], [BOS_ID, 0, 0]], np.int32)
    model.attention_weights(tf.constant(SOURCES), tf.constant(decoder_inputs))
    for block in model.decoder_blocks:
        assert sum(layer is block.self_attention for layer in calls) == 1


@pytest.mark.parametrize("factor", [1e9, 3.4e38])
def test_a_huge_length_factor_never_overflows_the_limit(factor):
    """Issue 24: factor x length past 2^31 used to wrap to a negative limit; the + 50 limit binds instead."""
    x = tf.constant([[5, 6, EOS_ID, PAD_ID], [5, 6, 7, EOS_ID]])
    np.testing.assert_array_equal(length_limits(x, None, factor), [3 + 50, 4 + 50])
    np.testing.assert_array_equal(length_limits(x, None, 2.0), [6, 8])


def _while_bodies(concrete):
    """The body functions of the while loops of a traced function, by their ``body`` attribute."""
    graph_def = concrete.graph.as_graph_def()
    functions = {f.signature.name: f for f in graph_def.library.function}
    nodes = [*graph_def.node, *(n for f in functions.values() for n in f.node_def)]
    names = {n.attr["body"].func.name for n in nodes if n.op.endswith("While")}
    return [functions[name] for name in names]


@pytest.mark.parametrize("kind", ["greedy", "beam"])
def test_a_growing_loop_step_computes_no_shapes_it_can_know(kind):
    """A greedy step's dense layers, heads and masks reshape with static shapes: no ``tensordot`` of unknown
    shape (Shape, Prod, GatherV2, Pack, ConcatV2 a layer) and no ``tf.repeat`` of the masks, which the
    executor would run at every step (about 0.2 µs a node); beam search's k is a tensor, but no
    ``tensordot`` there either. The weights stay captured handles (a loop invariant): read before the loop,
    they would be loop variables, three nodes a step each instead of one read. The results are the
    compiled loop's (and the reference's: test_cached_greedy_gives_the_reference_tokens)."""
    model = make_model()
    (body,) = _while_bodies(decode._traced(model, kind).get_concrete_function())
    ops = [n.op for n in body.node_def]
    assert "Prod" not in ops and 0 < ops.count("ReadVariableOp") <= len(model.weights), sorted(ops)
    if kind == "greedy":
        assert "Shape" not in ops, sorted(ops)
        assert not [n.name for n in body.node_def if "Repeat" in n.name]
    ids, _ = generate(model, tf.constant(SOURCE), beam_size=1 if kind == "greedy" else 2)
    compiled, _ = generate(model, tf.constant(SOURCE), beam_size=1 if kind == "greedy" else 2, jit_compile=True)
    np.testing.assert_array_equal(ids, compiled)

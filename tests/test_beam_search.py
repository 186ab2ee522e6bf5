"""Beam search (decode.generate with beam_size > 1): scores, n-best lists, the
greedy path, and generate() inside a caller's tf.function."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.infer.decode import _block_maxima_and_log_sum_exp, generate, greedy_decode, top_k_of_rows

from test_decoding import SOURCES, TARGET_VOCAB, build_model, favour_token, log_probs_under_model, randomize


def gnmt_scores(model, x, ids, alpha):
    """The GNMT score of each hypothesis, restated: log p / ((5 + length) / 6) ** alpha,
    the length counting </S>."""
    log_probs, lengths = log_probs_under_model(model, x, ids)
    return log_probs / ((5.0 + lengths) / 6.0) ** alpha


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_nbest_lists_are_sorted_distinct_and_scored_as_restated(alpha, jit_compile):
    model = build_model()
    randomize(model, seed=2)
    ids, scores = generate(model, SOURCES, beam_size=4, length_penalty=alpha, max_length=8, nbest=4,
                           jit_compile=jit_compile)
    ids, scores = ids.numpy(), scores.numpy()
    assert ids.shape[:2] == (len(SOURCES), 4) and scores.shape == (len(SOURCES), 4)
    assert scores.dtype == np.float32
    assert (np.diff(scores, axis=1) <= 0).all()
    for hypotheses in ids:
        assert len({tuple(h) for h in hypotheses}) == 4
        for h in hypotheses:  # <PAD> after </S>, and only there
            end = np.flatnonzero(h == EOS_ID)
            if end.size:
                assert (h[end[0] + 1:] == 0).all()
    x = np.repeat(SOURCES, 4, axis=0)
    expected = gnmt_scores(model, x, ids.reshape(-1, ids.shape[-1]), alpha).reshape(scores.shape)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-4)


def test_a_beam_as_wide_as_every_prefix_finds_the_exact_nbest():
    """With beam_size = V^(L-1) no prefix is ever dropped, so beam search is exhaustive
    search: its n-best list must be the n best of every hypothesis of up to L tokens,
    enumerated and scored here by teacher-forced passes (the </S>-ended ones of every
    length and those cut at L). This checks the finished/alive bookkeeping, the length
    penalty across lengths and the early stop."""
    model = build_model()
    randomize(model, seed=3, eos_rate=0.2)
    max_length, alpha, nbest = 3, 0.6, 5
    x = SOURCES[:2]
    ids, scores = generate(model, x, beam_size=TARGET_VOCAB ** (max_length - 1), length_penalty=alpha,
                         max_length=max_length, nbest=nbest)
    every = np.array(list(itertools.product(range(TARGET_VOCAB), repeat=max_length)), np.int32)
    for row in range(len(x)):
        all_scores = gnmt_scores(model, np.repeat(x[row:row + 1], len(every), axis=0), every, alpha)
        # A sequence and one that differs only after its </S> are the same hypothesis.
        hypotheses = {}
        for sequence, score in zip(every, all_scores):
            end = np.flatnonzero(sequence == EOS_ID)
            key = tuple(sequence[:end[0] + 1]) if end.size else tuple(sequence)
            hypotheses[key] = score
        best = sorted(hypotheses.items(), key=lambda item: -item[1])[:nbest]
        got = [tuple(h[:np.flatnonzero(h == EOS_ID)[0] + 1]) if (h == EOS_ID).any() else tuple(h)
               for h in ids.numpy()[row]]
        assert got == [key for key, _ in best]
        np.testing.assert_allclose(scores.numpy()[row], [score for _, score in best], rtol=1e-5, atol=1e-4)


def reference_beam_search(model, source, k, alpha, limit, nbest, patience):
    """tensor2tensor's beam search for one sentence, restated over full teacher-forced passes of the
    model: ``(finished [(tokens, score)] best first, steps taken)``. Each step the alive
    hypotheses' 2k best extensions; those ending in </S> compete for the k finished slots by
    log p / ((5 + length) / 6) ** alpha, the k best others stay alive (cut at the limit). Done
    when the nbest-th finished score beats what the best alive one could still reach, or
    (patience > 0) once max(nbest, ceil(patience * k)) hypotheses ended among the k best
    extensions of their steps."""
    def penalty(length):
        return ((5.0 + length) / 6.0) ** alpha

    alive, finished, ended = [((), 0.0)], [], 0
    for t in range(limit):
        prefixes = np.array([(BOS_ID,) + tokens for tokens, _ in alive], np.int32)
        logits = model((tf.constant(np.repeat(source[None], len(alive), axis=0)), tf.constant(prefixes)),
                       training=False).numpy()[:, -1].astype(np.float64)
        log_probs = logits - logits.max(-1, keepdims=True)
        log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
        candidates = sorted(((log_p + log_probs[i, v], tokens + (v,)) for i, (tokens, log_p) in enumerate(alive)
                             for v in range(log_probs.shape[1])), reverse=True)[:2 * k]
        ended += sum(tokens[-1] == EOS_ID for _, tokens in candidates[:k])
        finished += [(tokens, log_p / penalty(t + 1)) for log_p, tokens in candidates if tokens[-1] == EOS_ID]
        alive = [(tokens, log_p) for log_p, tokens in candidates if tokens[-1] != EOS_ID][:k]
        if t + 1 >= limit:
            finished += [(tokens, log_p / penalty(t + 1)) for tokens, log_p in alive]
        finished = sorted(finished, key=lambda item: -item[1])[:k]
        exact = len(finished) >= nbest and finished[nbest - 1][1] >= alive[0][1] / max(penalty(t + 2), penalty(limit))
        if t + 1 >= limit or exact or (patience > 0 and ended >= max(nbest, math.ceil(patience * k))):
            return finished[:nbest], t + 1


PATIENCE_SEEDS, PATIENCES = (5, 6), (0.0, 0.5, 1.0, 2.0)
PATIENCE_BEAM, PATIENCE_ALPHA, PATIENCE_LIMIT, PATIENCE_NBEST = 3, 0.6, 9, 3


def memoized(model):
    """``model`` called as reference_beam_search calls it, each distinct (sources, prefixes) pair computed once
    (the model's weights must not change while it is used)."""
    outputs = {}

    def call(inputs, training):
        key = tuple((tensor.shape, tensor.numpy().tobytes()) for tensor in inputs) + (training,)
        if key not in outputs:
            outputs[key] = model(inputs, training=training)
        return outputs[key]
    return call


@pytest.fixture(scope="module")
def restated_patience_stops():
    """reference_beam_search's (n-best, steps) for each seed, row of SOURCES and patience, computed once for
    both jit_compile values (randomize(model, seed) sets the same weights each time). The rules differ only
    in the step they stop at, so their passes of the model are shared."""
    model = build_model()
    expected = {}
    for seed in PATIENCE_SEEDS:
        randomize(model, seed=seed, eos_rate=0.4)
        passes = memoized(model)
        for row, source in enumerate(SOURCES):
            for patience in PATIENCES:
                expected[seed, row, patience] = reference_beam_search(
                    passes, source, PATIENCE_BEAM, PATIENCE_ALPHA, PATIENCE_LIMIT, PATIENCE_NBEST, patience)
    return expected


@pytest.mark.parametrize("jit_compile", [False, True])
def test_patience_stops_a_sentence_once_enough_hypotheses_ended_as_restated(jit_compile, restated_patience_stops):
    """Each rule (patience 0: the exact one; 0.5, 1, 2: CTranslate2's) against the restatement, a sentence
    at a time: the same steps taken, n-best hypotheses and scores."""
    model = build_model()
    k, alpha, limit, nbest = PATIENCE_BEAM, PATIENCE_ALPHA, PATIENCE_LIMIT, PATIENCE_NBEST
    steps_differ = 0
    for seed in PATIENCE_SEEDS:
        randomize(model, seed=seed, eos_rate=0.4)
        for row, source in enumerate(SOURCES):
            steps_of = {}
            for patience in PATIENCES:
                ids, scores = generate(model, source[None], beam_size=k, length_penalty=alpha, max_length=limit,
                                       nbest=nbest, jit_compile=jit_compile, patience=patience)
                expected, steps_of[patience] = restated_patience_stops[seed, row, patience]
                assert ids.shape[-1] == steps_of[patience]
                for hypothesis, (tokens, score) in zip(ids.numpy()[0], expected):
                    np.testing.assert_array_equal(hypothesis[:len(tokens)], tokens)
                    assert (hypothesis[len(tokens):] == PAD_ID).all()
                np.testing.assert_allclose(scores.numpy()[0], [score for _, score in expected], rtol=1e-5, atol=1e-4)
            steps_differ += steps_of[1.0] < steps_of[0.0]
    assert steps_differ  # patience 1 stops earlier somewhere, or the test would not tell the rules apart


# Each model and each loop once: that the XLA loop gives the growing loop's results is asserted by
# test_the_xla_loop_gives_the_growing_loops_results_also_inside_a_tf_function.
@pytest.mark.slow
@pytest.mark.parametrize("mask_source,variant,jit_compile", [("embedding", "paper", False), ("inputs", "blog", True)])
def test_beam_search_finds_a_hypothesis_at_least_as_likely_as_greedy(mask_source, variant, jit_compile):
    """Log-probabilities (alpha 0) of both outputs, computed by the full model."""
    model = build_model(mask_source, variant)
    better = 0
    for seed in range(3):
        randomize(model, seed)
        greedy = generate(model, SOURCES, max_length=8, jit_compile=jit_compile)[0].numpy()[:, 0]
        beam, _ = generate(model, SOURCES, beam_size=4, length_penalty=0.0, max_length=8, jit_compile=jit_compile)
        greedy_log_probs, _ = log_probs_under_model(model, SOURCES, greedy)
        beam_log_probs, _ = log_probs_under_model(model, SOURCES, beam.numpy()[:, 0])
        assert (beam_log_probs >= greedy_log_probs - 1e-4).all()
        better += (beam_log_probs > greedy_log_probs + 1e-3).sum()
    assert better  # the search did more than greedy somewhere


@pytest.mark.parametrize("jit_compile", [False, True])
def test_beam_search_stops_early_and_at_the_limit(jit_compile):
    model = build_model()
    randomize(model, seed=0)
    favour_token(model, EOS_ID)  # </S> first with certainty: nothing else can win
    ids, scores = generate(model, SOURCES, beam_size=3, jit_compile=jit_compile)
    np.testing.assert_array_equal(ids.numpy(), [[[EOS_ID]]] * len(SOURCES))
    favour_token(model, 7)  # never </S>: every hypothesis runs to its sentence's limit, length + 50
    ids, scores = generate(model, SOURCES, beam_size=3, nbest=2, jit_compile=jit_compile)
    limits = (SOURCES != PAD_ID).sum(axis=1) + 50
    assert ids.shape == (len(SOURCES), 2, limits.max())
    for row, limit in enumerate(limits):
        assert (ids.numpy()[row, :, :limit] != PAD_ID).all() and (ids.numpy()[row, :, limit:] == PAD_ID).all()
        assert (ids.numpy()[row, 0, :limit] == 7).all()
    assert np.isfinite(scores.numpy()).all()


@pytest.mark.slow
def test_decode_inside_a_tf_function_with_a_tensor_beam_size():
    model = build_model()
    randomize(model, seed=5)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([], tf.int32)])
    def translate(x, beam_size):
        return generate(model, x, beam_size=beam_size, length_penalty=0.6, max_length=tf.constant(8))

    for x in (SOURCES, SOURCES[1:3, :4], SOURCES[:0]):
        for beam_size in (1, 3):
            ids, scores = translate(x, beam_size)
            expected_ids, expected_scores = generate(model, x, beam_size=beam_size, max_length=8)
            np.testing.assert_array_equal(ids.numpy(), expected_ids.numpy())
            np.testing.assert_allclose(scores.numpy(), expected_scores.numpy(), rtol=1e-6)
    # Beam size 1 takes the greedy path: the reference's tokens.
    np.testing.assert_array_equal(translate(SOURCES, 1)[0].numpy()[:, 0], greedy_decode(model, SOURCES, max_length=8))
    assert translate.experimental_get_tracing_count() == 1
    with pytest.raises(tf.errors.InvalidArgumentError, match="beam_size must be at least 1"):
        translate(SOURCES, 0)


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("beam_size,nbest", [(0, 1), (2, 3), (2, 0)])
def test_bad_beam_size_or_nbest(beam_size, nbest, jit_compile):
    with pytest.raises(ValueError, match="beam_size|nbest"):
        generate(build_model(), SOURCES, beam_size=beam_size, nbest=nbest, jit_compile=jit_compile)


@pytest.mark.parametrize("jit_compile", [False, True])
def test_empty_batch(jit_compile):
    ids, scores = generate(build_model(), np.zeros([0, 5], np.int32), beam_size=4, nbest=2, jit_compile=jit_compile)
    assert ids.shape[:2] == (0, 2) and scores.shape == (0, 2)


@pytest.mark.parametrize("width,k", [(1000, 8), (1000, 1), (100, 40), (33, 33), (25, 10)])
def test_top_k_of_rows_is_top_k(width, k):
    """Several blocks of 32 and a partial last one; k above the number of blocks; k == width."""
    values = np.random.default_rng(width + k).normal(size=(6, width)).astype(np.float32)
    got_values, got_ids = top_k_of_rows(tf.constant(values), k)
    expected_values, expected_ids = tf.math.top_k(values, k)
    np.testing.assert_array_equal(got_ids.numpy(), expected_ids.numpy())
    np.testing.assert_array_equal(got_values.numpy(), expected_values.numpy())


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("width,group,k", [(1000, 4, 8), (100, 3, 6), (25, 4, 8), (25, 1, 8), (64, 2, 128)])
def test_top_k_of_rows_of_groups_with_offsets_is_the_k_best_of_each_group(width, group, k, jit_compile):
    """Beam search's form: the k best of values + each row's offset over each group of rows as one row
    of group * width values, restated in numpy (a stable descending sort of the flattened groups)."""
    rng = np.random.default_rng(width + group + k)
    values = rng.normal(size=(3 * group, width)).astype(np.float32)
    offsets = rng.normal(size=3 * group).astype(np.float32)
    shifted = (values + offsets[:, None]).reshape(3, group * width)
    expected_ids = np.argsort(-shifted, axis=1, kind="stable")[:, :k]
    run = tf.function(lambda v, o: top_k_of_rows(v, k, o, group=group), jit_compile=jit_compile)
    got_values, got_ids = run(tf.constant(values), tf.constant(offsets))
    np.testing.assert_array_equal(got_ids.numpy(), expected_ids)
    np.testing.assert_array_equal(got_values.numpy(), np.take_along_axis(shifted, expected_ids, axis=1))


@pytest.mark.parametrize("width", [4000, 100, 32, 7])
def test_block_maxima_and_log_sum_exp_restated(width):
    """Beam search's block maxima and log-sum-exp of logits, from one softmax (the largest logit less the log
    of its probability, read in the block of the largest probability), against numpy's in float64: rows of
    30 and 300 units' spread (probabilities near 1/V and near 1; far below the largest logit they underflow,
    and a block of nothing else has the maximum -inf), the largest logit tied in two blocks, a partial last
    block (its maximum over its real columns)."""
    rng = np.random.default_rng(width)
    logits = rng.normal(size=(6, width)) * np.array([1.0, 30.0, 0.1, 5.0, 1.0, 300.0])[:, None]
    logits[4, [0, width - 1]] = logits[4].max() + 1.0  # a tie, in two blocks when width > 32
    logits = logits.astype(np.float32)
    maxima, log_sum_exp = _block_maxima_and_log_sum_exp(tf.constant(logits))
    want_maxima = np.array([[row[i:i + 32].max() for i in range(0, width, 32)] for row in logits], np.float64)
    shifted = logits.astype(np.float64) - logits.max(axis=1, keepdims=True)
    want = logits.max(axis=1) + np.log(np.exp(shifted).sum(axis=1))
    np.testing.assert_allclose(log_sum_exp.numpy(), want, rtol=1e-6, atol=1e-5)
    underflow = want_maxima - want[:, None] < -103.0  # float32's least probability is about exp(-103)
    np.testing.assert_allclose(maxima.numpy()[~underflow], want_maxima[~underflow], rtol=1e-6, atol=1e-5)
    assert np.isneginf(maxima.numpy()[underflow]).all() and (underflow.any() or width <= 32)


def test_top_k_of_rows_of_bfloat16_values_with_their_maxima_is_that_of_the_values_in_float32():
    """A bfloat16 model's beam search: its logits' blocks searched in bfloat16 and cast once gathered, with
    block maxima of float32 (:func:`_block_maxima_and_log_sum_exp`'s), give the float32 values' k best."""
    logits = tf.cast(tf.constant(np.random.default_rng(3).normal(size=(8, 100)) * 4.0, tf.float32), tf.bfloat16)
    offsets = np.random.default_rng(4).normal(size=8).astype(np.float32)
    maxima, _ = _block_maxima_and_log_sum_exp(logits)
    got_values, got_ids = top_k_of_rows(logits, 6, tf.constant(offsets), group=4, maxima=maxima)
    # numpy's restatement: the bfloat16 values exactly in float32, plus offsets, sorted within each group of 4 rows
    shifted = (logits.numpy().astype(np.float32) + offsets[:, None]).reshape(2, 4 * 100)
    expected_ids = np.argsort(-shifted, axis=1, kind="stable")[:, :6]
    assert got_values.dtype == tf.float32
    np.testing.assert_array_equal(got_ids.numpy(), expected_ids)
    np.testing.assert_array_equal(got_values.numpy(), np.take_along_axis(shifted, expected_ids, axis=1))


def test_top_k_of_rows_gives_real_columns_when_dead_rows_tie_at_minus_infinity():
    """A group of 4 rows of 5 values (one padded block each) whose only live row is the last (the
    others' offsets -inf, as dead hypotheses): its 5 values come first, then -inf ties, whose ids
    must stay inside the group (the live row's padding ranks first among them)."""
    values = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32)
    offsets = np.array([-np.inf] * 3 + [0.0], np.float32)
    got_values, got_ids = top_k_of_rows(tf.constant(values), 8, tf.constant(offsets), group=4)
    got_values, got_ids = got_values.numpy()[0], got_ids.numpy()[0]
    np.testing.assert_array_equal(got_ids[:5], 15 + np.argsort(-values[3]))
    np.testing.assert_array_equal(got_values[:5], np.sort(values[3])[::-1])
    assert np.isneginf(got_values[5:]).all() and (got_ids < 20).all()


@pytest.mark.parametrize("jit_compile", [False, True])
@pytest.mark.parametrize("beam_size", [1, 3])
def test_a_translation_does_not_depend_on_its_batch(beam_size, jit_compile):
    """Each sentence has its own default length limit, and padding does not reach the
    outputs (default masks), so alone or batched with longer sentences it decodes the same."""
    model = build_model()
    ended = []
    for seed in (6, 7):
        randomize(model, seed, eos_rate=0.08)  # long outputs: some run to their limit
        batched, batched_scores = generate(model, SOURCES, beam_size=beam_size, jit_compile=jit_compile)
        for row, source in enumerate(SOURCES):
            alone, alone_scores = generate(model, source[source != PAD_ID][None], beam_size=beam_size,
                                           jit_compile=jit_compile)
            width = alone.shape[-1]
            np.testing.assert_array_equal(alone.numpy()[0], batched.numpy()[row, :, :width])
            assert (batched.numpy()[row, :, width:] == PAD_ID).all()
            np.testing.assert_allclose(alone_scores.numpy()[0], batched_scores.numpy()[row], rtol=1e-5)
            ended.append((alone.numpy()[0, 0] == EOS_ID).any())
    assert any(ended) and not all(ended)  # both </S> and the limit were hit


@pytest.mark.parametrize("beam_size", [1, 3])
def test_the_xla_loop_gives_the_growing_loops_results_also_inside_a_tf_function(beam_size):
    """The compiled loop (preallocated caches written in place) against the growing one, eagerly
    and called from a caller's tf.function (as the export's compiled signature calls it), with
    nbest hypotheses and a batch whose sentences stop at different steps."""
    model = build_model()
    randomize(model, seed=6, eos_rate=0.15)  # some rows end, at different steps, others hit the limit
    nbest = beam_size
    expected_ids, expected_scores = generate(model, SOURCES, beam_size=beam_size, nbest=nbest)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def translate(x):
        return generate(model, x, beam_size=beam_size, nbest=nbest, jit_compile=True)

    for ids, scores in (generate(model, SOURCES, beam_size=beam_size, nbest=nbest, jit_compile=True),
                        translate(SOURCES)):
        np.testing.assert_array_equal(ids.numpy(), expected_ids.numpy())
        np.testing.assert_allclose(scores.numpy(), expected_scores.numpy(), rtol=1e-5, atol=1e-5)
    lengths = [np.flatnonzero(row == EOS_ID) for row in expected_ids.numpy()[:, 0]]
    assert len({int(end[0]) if end.size else -1 for end in lengths}) > 1  # rows ended at different steps


def test_the_growing_loop_runs_the_first_step_on_one_row_a_sentence(monkeypatch):
    """The k hypotheses of a sentence are all <S> at step 0: the decoder runs there on one row a sentence
    (its caches of N rows), then on k rows a sentence; the tests above check the translations."""
    model = build_model.__wrapped__()  # not the shared model: its loops are traced already
    randomize(model, seed=2)
    rows = []
    decode_step = type(model).decode_step

    def recorded(self, ids, *args, **kwargs):
        ids = tf.numpy_function(lambda a: (rows.append(a.shape), a)[1], [ids], tf.int32, stateful=True)
        return decode_step(self, tf.ensure_shape(ids, [None, None]), *args, **kwargs)

    monkeypatch.setattr(type(model), "decode_step", recorded)
    generate(model, SOURCES, beam_size=3, max_length=5)
    assert rows[0] == (len(SOURCES), 1) and rows[1] == (len(SOURCES), 3)

"""The compiled loop with row buckets (decode.generate(jit_compile=True, buckets=b)): the batch moves
down to smaller buckets as sentences finish; the translations are the growing loop's."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.infer.decode import MAX_BUCKETS, compiled_decoder, generate

from test_decoding import build_model, randomize

# Sentences of different lengths (</S> = 3), so that they finish at different steps.
rng = np.random.default_rng(7)
LENGTHS = [1, 2, 3, 5, 7, 9, 4, 6, 8, 2, 3, 1, 7]
SOURCES = np.zeros([len(LENGTHS), max(LENGTHS)], np.int32)
for i, n in enumerate(LENGTHS):
    SOURCES[i, :n - 1] = rng.integers(4, 30, size=n - 1)
    SOURCES[i, n - 1] = 3


@pytest.mark.parametrize("buckets", [3, MAX_BUCKETS])  # an odd count and the most; beam search runs 2 and 4
def test_greedy_bucketed_gives_the_growing_loops_ids_and_scores(buckets):
    model = build_model()
    finished_early = 0
    for seed in range(2):
        randomize(model, seed, eos_rate=0.3)
        ids, scores = generate(model, SOURCES, max_length=12)
        got, got_scores = generate(model, SOURCES, max_length=12, jit_compile=True, buckets=buckets)
        np.testing.assert_array_equal(got.numpy(), ids.numpy())
        np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-4)
        lengths = (ids.numpy()[:, 0] != 0).sum(axis=1)
        finished_early += int((lengths < lengths.max()).sum())
    assert finished_early  # rows did leave for smaller buckets


# Each bucket count and each beam once (every combination compiles loops of its own).
@pytest.mark.parametrize("buckets,beam_size,nbest", [(2, 4, 1), (4, 3, 3)])
def test_beam_bucketed_gives_the_growing_loops_hypotheses_and_scores(buckets, beam_size, nbest):
    model = build_model()
    for seed in range(2):
        randomize(model, seed, eos_rate=0.3)
        ids, scores = generate(model, SOURCES, beam_size=beam_size, nbest=nbest, max_length=12)
        got, got_scores = generate(model, SOURCES, beam_size=beam_size, nbest=nbest, max_length=12,
                                   jit_compile=True, buckets=buckets)
        np.testing.assert_array_equal(got.numpy(), ids.numpy())
        np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-4)


def test_one_sentence_and_an_empty_batch():
    model = build_model()
    randomize(model, 1, eos_rate=0.3)
    for x in (SOURCES[4:5], SOURCES[:0]):
        for beam_size in (1, 3):
            ids, scores = generate(model, x, beam_size=beam_size, max_length=12)
            got, got_scores = generate(model, x, beam_size=beam_size, max_length=12, jit_compile=True, buckets=3)
            np.testing.assert_array_equal(got.numpy(), ids.numpy())
            np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-4)


def test_inside_a_callers_function_with_an_unknown_batch_size():
    model = build_model()
    randomize(model, 0, eos_rate=0.3)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32)])
    def run(x):
        return generate(model, x, max_length=12, jit_compile=True, buckets=3)

    np.testing.assert_array_equal(run(SOURCES)[0].numpy(), generate(model, SOURCES, max_length=12)[0].numpy())


@pytest.mark.parametrize("buckets", [0, -1, MAX_BUCKETS + 1, 2.5, "2", True])
def test_bad_buckets_name_the_value_and_the_valid_ones(buckets):
    with pytest.raises(ValueError, match=rf"buckets={buckets!r}: must be an int from 1 .* to {MAX_BUCKETS}"):
        compiled_decoder(build_model(), buckets=buckets)


def test_one_sentence_runs_the_one_bucket_loop():
    """Every smaller bucket of one sentence has that one row: its compiled loop is the one-bucket one, and
    the bucketed loop is not even traced."""
    model = build_model.__wrapped__()  # a model of its own: no loop traced yet
    randomize(model, 2, eos_rate=0.3)
    for beam_size in (1, 3):
        got, got_scores = generate(model, SOURCES[4:5], beam_size=beam_size, max_length=12, jit_compile=True, buckets=3)
        ids, scores = generate(model, SOURCES[4:5], beam_size=beam_size, max_length=12)
        np.testing.assert_array_equal(got.numpy(), ids.numpy())
        np.testing.assert_allclose(got_scores.numpy(), scores.numpy(), rtol=1e-4, atol=1e-4)
        assert compiled_decoder(model, beam_size, 1, 12, buckets=3).experimental_get_tracing_count() == 0
        assert compiled_decoder(model, beam_size, 1, 12, buckets=1).experimental_get_tracing_count() == 1
    generate(model, SOURCES[:2], max_length=12, jit_compile=True, buckets=3)
    assert compiled_decoder(model, 1, 1, 12, buckets=3).experimental_get_tracing_count() == 1

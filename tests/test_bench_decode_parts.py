"""bench/decode_parts.py: the tails choose what numpy chooses, a beam's parents stay in its sentence, and every
part of a step runs compiled and is timed."""

import math
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import decode_parts  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.nn.model import Transformer  # noqa: E402

TINY = load_hparams("small").replace(num_blocks=1, num_units=16, num_heads=2, d_ff=32, precision="float32")


def _log_softmax(logits):
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def test_greedy_tail_is_the_argmax_and_its_log_probability():
    logits = np.random.default_rng(0).normal(size=(5, 70)).astype(np.float32)
    ids, consumed = decode_parts.tail(tf.constant(logits), beam_size=1)
    expected = logits.argmax(axis=-1)
    np.testing.assert_array_equal(ids.numpy(), expected)
    np.testing.assert_allclose(consumed.numpy(), _log_softmax(logits)[np.arange(5), expected].sum(), rtol=1e-5)


def test_beam_tail_takes_the_2k_best_log_probabilities():
    logits = np.random.default_rng(1).normal(size=(6, 70)).astype(np.float32)
    ids, consumed = decode_parts.tail(tf.constant(logits), beam_size=3)
    best = np.sort(_log_softmax(logits), axis=-1)[:, ::-1][:, :6]
    np.testing.assert_array_equal(ids.numpy(), logits.argmax(axis=-1))
    np.testing.assert_allclose(consumed.numpy(), best.sum(), rtol=1e-5)


def test_parents_stay_in_their_sentence():
    np.testing.assert_array_equal(decode_parts.rows_of_sentence(8, 4).numpy(), [0, 0, 0, 0, 4, 4, 4, 4])


@pytest.mark.parametrize("beam_size, parts", [
    (1, {"step", "step+tail", "projection", "start"}),
    (2, {"step", "step+tail", "step+tail+reorder", "projection", "start"}),
])
def test_every_part_runs_compiled_and_is_timed(beam_size, parts):
    model = Transformer.from_hparams(TINY, 30, 30)
    model((tf.ones([1, 3], tf.int32), tf.ones([1, 3], tf.int32)))  # builds the weights
    figures = decode_parts.measure(model, rows=4, length=5, steps=2, repeats=1, beam_size=beam_size)
    assert set(figures) == parts
    assert all(math.isfinite(ms) and ms >= 0 for ms in figures.values())

"""Scoring given translations: the model's log-probability of a target given its source (forced decoding).

As OpenNMT-tf's ``score`` and Marian's scorer: the target is read teacher-forced, as in
training, and each of its tokens (``</S>`` included) gets ``log p(y_t | y_<t, x)``;
a pair's scores are their sum (``total``), their mean (``per_token``) and the sum divided by
beam search's GNMT length penalty (``normalised``,
:func:`~tf_transformer.infer.decode.gnmt_penalty`), the scale of ``translate.py --nbest``'s
beam scores: scoring the beam's own hypothesis gives its beam score back.

The source follows the input rules of :mod:`tf_transformer.infer.translate` (cut to
``maxlen`` tokens); the target is read whole, as decoding may produce it, and may be
empty (``</S>`` alone). Unlike translation, a source without words is scored too (the
model reads ``</S>`` alone): filtering wants those pairs' scores.
"""

from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import PAD_ID
from tf_transformer.infer.decode import gnmt_penalty
from tf_transformer.infer.translate import source_ids
from tf_transformer.nn.model import shift_right


class Scores(NamedTuple):
    """:func:`score_ids`' result for N pairs."""

    total: tf.Tensor  # (N,) float32: the sum of the target tokens' log-probabilities
    tokens: tf.Tensor  # (N,) int32: the target tokens, </S> included
    normalised: tf.Tensor  # (N,) float32: total / gnmt_penalty(tokens, length_penalty)


class PairScore(NamedTuple):
    """One pair's scores (:func:`score_pairs`)."""

    total: float
    per_token: float
    normalised: float
    tokens: int


def token_log_probs(model, x, y):
    """Forced decoding: the log-probability of every target token.

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated, ``<PAD>``-padded.
      y: (N, T_y) int32 target ids, ``</S>``-terminated, ``<PAD>``-padded.
    Returns:
      (N, T_y) float32 ``log p(y_t | y_<t, x)``, 0 at ``<PAD>``.
    """
    encoded = model.encode(x, training=False)
    logits = model.decode(shift_right(y), encoded.memory, encoded.source_masks, training=False)
    log_probs = tf.gather(tf.nn.log_softmax(tf.cast(logits, tf.float32)), y, batch_dims=2)
    return tf.where(tf.equal(y, PAD_ID), 0.0, log_probs)


def score_ids(model, x, y, length_penalty):
    """:class:`Scores` of N pairs of ids (as :func:`token_log_probs` takes them); graph code (the
    export's ``score`` signature). ``length_penalty``: GNMT alpha, a float or a () float32 tensor."""
    tokens = tf.reduce_sum(tf.cast(tf.not_equal(y, PAD_ID), tf.int32), axis=1)
    total = tf.reduce_sum(token_log_probs(model, x, y), axis=1)
    return Scores(total, tokens, total / gnmt_penalty(tokens, length_penalty))


def target_ids(tokenizer, sentences):
    """The ids of (N,) string targets to score: invalid UTF-8 replaced, not cut, then ``</S>``
    ((N, None) int32 RaggedTensor; ``source_batch(tokenizer, sentences, maxlen=None)`` is the padded
    batch, which the export's ``score`` signature takes). Graph code."""
    return source_ids(tokenizer, sentences, maxlen=None)


@tf.function(autograph=False, reduce_retracing=True)
def _score_batch(model, x, y, length_penalty):
    return score_ids(model, x, y, length_penalty)


def score_pairs(sources, targets, source_tokenizer, target_tokenizer, model, *, batch_size=32, length_penalty=0.6):
    """Scores lists of source and target strings pair by pair, in batches of similar length.

    Returns:
      a list of :class:`PairScore`, in input order.
    Raises:
      ValueError: the lists differ in length.
    """
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources but {len(targets)} targets")
    if not sources:
        return []
    x = source_ids(source_tokenizer, tf.constant(sources, tf.string), model.config.maxlen)
    y = target_ids(target_tokenizer, tf.constant(targets, tf.string))
    order = np.argsort(x.row_lengths().numpy() + y.row_lengths().numpy(), kind="stable")
    results = [None] * len(sources)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        scores = _score_batch(model, tf.gather(x, rows).to_tensor(), tf.gather(y, rows).to_tensor(),
                              tf.constant(length_penalty, tf.float32))
        for row, total, tokens, normalised in zip(rows, *(s.numpy() for s in scores)):
            results[row] = PairScore(float(total), float(total / tokens), float(normalised), int(tokens))
    return results

"""Translating with a loaded model: batches of sentences in, translations out, and attention pictures.

Input rules, the same here, in ``translate.py`` and in the export (:mod:`tf_transformer.infer.export`):

* a source is cut to its first ``maxlen - 1`` tokens, then ``</S>``: at most
  ``maxlen`` tokens, as in training;
* a source without any token (empty, or only whitespace) translates to the
  empty string, score 0, without running the model;
* invalid UTF-8 bytes become U+FFFD.

:func:`translate` and :func:`translate_nbest` take the decoding options in the
same order, by keyword: ``batch_size, max_length, beam_size, length_penalty``
(``nbest``), ``trace``, ``max_length_factor``, ``jit_compile`` (as
:func:`~tf_transformer.infer.decode.generate`'s); :func:`translate_nbest` also
``sampling`` (:func:`~tf_transformer.infer.decode.sample` instead of search) and
``alignment_block`` (word alignments, :mod:`tf_transformer.infer.align`) and ``once`` (a process that
decodes one short batch decodes it untraced).
"""

from typing import NamedTuple, Optional


import numpy as np
import tensorflow as tf

from tf_transformer import figures
from tf_transformer.data import data_load
from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.errors import UserError
from tf_transformer.infer import align, decode

# translate_nbest(once=True) decodes one batch of sources of at most this many tokens (``</S>`` included) op by
# op: tracing the decoding loop costs 1-3 s, an untraced step 40-100 ms (README command 1's model on the AVX2
# EPYC, one sentence of 31 tokens: greedy 1.07 s untraced against 1.75 s traced, beam 4 2.42 against 3.37).
UNTRACED_SOURCE_TOKENS = 32


class Sources(NamedTuple):
    """A batch of sources by the input rules above (:func:`source_batch`)."""

    ids: tf.Tensor  # (N, T) int32: a row's tokens, ``</S>``, then ``<PAD>`` up to the longest row
    lengths: tf.Tensor  # (N,) int32: a row's tokens and its ``</S>``; 1: no token


def source_batch(tokenizer, sentences, maxlen):
    """The model's input for a batch of sentences, by the input rules above, as a padded tensor: a graph of
    a few dense ops (a ragged cut and concatenation: 4x the nodes, which a one-sentence call of the export
    runs every time).

    Graph code: the export runs it inside its signatures.

    Args:
      tokenizer: the source tokenizer.
      sentences: (N,) string tensor.
      maxlen: most tokens of a source, ``</S>`` included; None: no cut (the targets that
        :mod:`tf_transformer.infer.score` scores).
    Returns:
      :class:`Sources`; row n is ``</S>`` alone when sentence n has no token.
    """
    sentences = tf.strings.unicode_transcode(sentences, "UTF-8", "UTF-8", errors="replace",
                                             replacement_char=0xFFFD)
    tokens = tokenizer.tokenize(sentences)
    ids, lengths = tf.cast(tokens.to_tensor(), tf.int32), tf.cast(tokens.row_lengths(), tf.int32)
    if maxlen is not None:
        ids, lengths = ids[:, : maxlen - 1], tf.minimum(lengths, maxlen - 1)
    ids = tf.pad(ids, [[0, 0], [0, 1]], constant_values=PAD_ID)  # a column for the longest row's </S>
    ids = tf.where(tf.range(tf.shape(ids)[1])[None] == lengths[:, None], EOS_ID, ids)
    return Sources(ids, lengths + 1)


def source_ids(tokenizer, sentences, maxlen):
    """:func:`source_batch` as a (N, None) int32 RaggedTensor: each row's tokens and ``</S>``."""
    batch = source_batch(tokenizer, sentences, maxlen)
    return tf.RaggedTensor.from_tensor(batch.ids, lengths=batch.lengths)


class Hypothesis(NamedTuple):
    """One translation of :func:`translate_nbest`."""

    text: str
    score: float  # the decoder's: beam search's length-penalised log-probability, else the plain one
    alignment: Optional[str] = None  # Pharaoh word links (with alignment_block), else None


def translate_nbest(sentences, source_tokenizer, target_tokenizer, model, *, batch_size=32, max_length=None,
                    beam_size=1, length_penalty=0.6, nbest=1, trace=None, max_length_factor=0.0, jit_compile=False,
                    sampling=None, alignment_block=None, patience=0.0, once=False):
    """Translates a list of strings; returns, in input order, each one's ``nbest`` best
    :class:`Hypothesis` (text, score, alignment), best first.

    Sentences are batched by length (sorted, then restored). ``trace``, if
    given, is called with one line of text per greedy decoding step (it needs
    ``beam_size=1``); tracing keeps the input order. ``sampling``: a
    :class:`~tf_transformer.infer.decode.Sampling` draws one translation per sentence instead
    (``nbest=1``; a sentence's draw does not depend on its batch: its key is its input index).
    ``alignment_block``: a decoder block's index; each hypothesis then has its word
    alignment (:func:`~tf_transformer.infer.align.alignments`). ``patience``: beam search's
    (:func:`~tf_transformer.infer.decode.generate`). ``once``: the caller decodes once in its process (as
    translate.py does); one batch of sources of at most :data:`UNTRACED_SOURCE_TOKENS` tokens is then decoded
    op by op, without tracing the decoding loop first (``generate``'s and ``sample``'s ``traced``).
    """
    if trace is not None and beam_size != 1:
        raise ValueError("a trace shows greedy decoding: it needs beam_size=1")
    if sampling is not None and (nbest != 1 or trace is not None or jit_compile):
        raise ValueError("sampling draws one translation per sentence, without a compiled loop or a step trace: "
                         "it needs nbest=1, no trace and no jit_compile")
    sources = source_ids(source_tokenizer, tf.constant(sentences, tf.string), model.config.maxlen)
    lengths = sources.row_lengths().numpy()
    starts = None if alignment_block is None else (align.word_starts(source_tokenizer),
                                                   align.word_starts(target_tokenizer))
    results = [[Hypothesis("", 0.0, None if starts is None else "")] * nbest for _ in sentences]
    # By length, so batches hold sentences of similar length; a trace keeps the input order, to read it down.
    order = np.arange(len(lengths)) if trace else np.argsort(lengths, kind="stable")
    order = [int(i) for i in order if lengths[i] > 1]  # `</S>` alone: no words
    traced = not (once and len(order) <= batch_size and max(lengths[order], default=0) <= UNTRACED_SOURCE_TOKENS)
    for start in range(0, len(order), batch_size):
        rows = order[start:start + batch_size]
        x = tf.gather(sources, rows).to_tensor()
        if trace is not None:
            ids, scores = _reference_greedy(model, x, max_length, max_length_factor, rows, target_tokenizer, trace)
        else:
            ids, scores = (decode.sample(model, x, sampling, rows, max_length, max_length_factor, traced)
                           if sampling is not None else
                           decode.generate(model, x, beam_size=beam_size, length_penalty=length_penalty,
                                           max_length=max_length, nbest=nbest, jit_compile=jit_compile,
                                           max_length_factor=max_length_factor, patience=patience,
                                           traced=traced))
            ids, scores = ids.numpy(), scores.numpy()
        texts = target_tokenizer.to_texts(ids.reshape([-1, ids.shape[-1]]))
        aligned = [None] * len(texts) if starts is None else align.alignments(model, x, ids, alignment_block, starts)
        for i, row in enumerate(rows):
            results[row] = [Hypothesis(texts[i * nbest + k], float(scores[i, k]), aligned[i * nbest + k])
                            for k in range(nbest)]
    return results


def _reference_greedy(model, x, max_length, max_length_factor, rows, target_tokenizer, trace):
    """The reference greedy decoder, reporting each step to ``trace``: ((B, 1, T) ids, (B, 1) zero scores)."""

    def on_step(step, tokens):
        for row, ids in zip(rows, tokens):
            pieces = " ".join(target_tokenizer.id_to_token(i) for i in ids)
            trace(f"[{row}] step {step}: <S> {pieces}")

    ids = decode.greedy_decode(model, x, max_length, on_step, max_length_factor)
    return ids[:, None, :], np.zeros([len(rows), 1], np.float32)


def translate(sentences, source_tokenizer, target_tokenizer, model, *, batch_size=32, max_length=None,
              beam_size=1, length_penalty=0.6, trace=None, max_length_factor=0.0, jit_compile=False, patience=0.0):
    """Translates a list of strings in batches; returns the best translations in input order
    (:func:`translate_nbest` with ``nbest=1``).

    ``trace``, if given, is called with one line of text per decoding step.
    """
    return [hypotheses[0][0] for hypotheses in translate_nbest(
        sentences, source_tokenizer, target_tokenizer, model, batch_size=batch_size, max_length=max_length,
        beam_size=beam_size, length_penalty=length_penalty, trace=trace, max_length_factor=max_length_factor,
        jit_compile=jit_compile, patience=patience)]


def attention_of(model, tokenizers, x, output):
    """Every decoder block's encoder-decoder attention while the model reads ``output`` for ``x``.

    Args:
      x: (1, T_x) source ids; output: T_y output ids (``</S>``-terminated, or cut at the limit).
    Returns:
      ((L, h, T_y, T_x) weights, T_x source tokens, T_y output tokens). Row t is the attention
      while producing output token t, so rows are labelled by the output.
    """
    source_tokenizer, target_tokenizer = tokenizers
    decoder_inputs = tf.constant([[BOS_ID] + list(output[:-1])], tf.int32)
    weights = np.stack([block[0].numpy() for block in model.attention_weights(x, decoder_inputs)])
    return (weights, [source_tokenizer.id_to_token(i) for i in x[0].numpy()],
            [target_tokenizer.id_to_token(i) for i in output])


def attention_sample(model, tokenizers, source, translation):
    """:func:`attention_of` while the model reads the text ``translation`` of the text ``source``."""
    x = data_load.tokenize_with_eos(tokenizers[0], [source]).to_tensor()
    output = data_load.tokenize_with_eos(tokenizers[1], [translation])[0].numpy().tolist()
    return attention_of(model, tokenizers, x, output)


def attention_figure(sentence, source_tokenizer, target_tokenizer, model, translation_ids, path):
    """Plots the encoder-decoder attention of every head of every decoder block for one sentence.

    Args:
      translation_ids: the decoder's output for ``sentence`` (``</S>``-terminated or cut at the limit).
    Returns:
      the :class:`matplotlib.figure.Figure` (:func:`~tf_transformer.figures.plot_attention`: blocks
      down, heads across, source tokens on x, output tokens on y), also written to ``path`` as PNG.
    """
    x = source_batch(source_tokenizer, tf.constant([sentence]), model.config.maxlen).ids
    output = [int(i) for i in translation_ids]
    if EOS_ID in output:
        output = output[: output.index(EOS_ID) + 1]
    return figures.plot_attention(*attention_of(model, (source_tokenizer, target_tokenizer), x, output),
                                   path=path, title=f"encoder-decoder attention: {sentence}")


def plot_sentence_attention(sentence, source_tokenizer, target_tokenizer, model, path, *, max_length=None,
                            beam_size=1, length_penalty=0.6, max_length_factor=0.0):
    """Translates one sentence and writes :func:`attention_figure` of it to ``path``.

    Raises:
      UserError: the sentence has no words.
    """
    x = source_batch(source_tokenizer, tf.constant([sentence]), model.config.maxlen).ids
    if x.shape[1] == 1:
        raise UserError(f"cannot plot the attention of {sentence!r} into {path}: the sentence has no words")
    ids, _ = decode.generate(model, x, beam_size=beam_size, length_penalty=length_penalty, max_length=max_length,
                               max_length_factor=max_length_factor)
    return attention_figure(sentence, source_tokenizer, target_tokenizer, model, ids[0, 0].numpy(), path)

"""Word alignments of translations from the encoder-decoder attention, in Pharaoh format (``0-0 1-2 ...``).

As OpenNMT and Marian report them, and fairseq with ``--print-alignment``: after decoding,
the model reads each translation again teacher-forced (one pass, as OpenNMT-py's
``report_align`` does) and the encoder-decoder attention of one decoder block, averaged
over its heads, gives each output token's distribution over the source tokens. A target
token is aligned to the source token it attends most (``</S>`` on either side left out);
tokens are merged to words as the texts show them (SentencePiece pieces by their ``▁``
word-start mark; a word vocabulary's tokens are words), and two words are aligned when
any of their tokens are (as Zenkel et al. 2019 and awesome-align merge subwords). Links
are ``SOURCE-TARGET`` word indices from 0, sorted, each once; a translation without
words has none (an empty string).

The block: by default the last (``-1``), as OpenNMT-tf's ``alignment_layer`` and fairseq's
``alignment_layer`` default; an earlier block often aligns better in larger models (Garg
et al. 2019 found the penultimate of six best), so it can be chosen. The blocks after it
are not run.
"""

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.nn.model import shift_right

# The decoder block whose attention gives the alignments, as a Python index: the last.
DEFAULT_BLOCK = -1
# SentencePiece's mark of a piece that starts a word.
WORD_START = "\u2581"


@tf.function(reduce_retracing=True)
def head_average(model, x, output, block):
    """(N, T_x) source ids, (N, T_y) output ids (``</S>``-terminated, ``<PAD>`` after) and a block
    index -> (N, T_y, T_x) float32: the block's encoder-decoder attention averaged over its heads;
    row t is the attention while producing output token t."""
    return tf.reduce_mean(model.block_attention(x, shift_right(output), block), axis=1)


def word_starts(tokenizer):
    """(V,) bool: which token ids start a word (every id of a word vocabulary)."""
    if tokenizer.kind == "word":
        return np.ones([tokenizer.vocab_size], bool)
    return np.array([tokenizer.id_to_token(i).startswith(WORD_START) for i in range(tokenizer.vocab_size)])


def word_indices(ids, starts):
    """(T,) token ids -> (T,) int word index of each token (the first token starts word 0 whatever it is)."""
    return np.maximum(np.cumsum(starts[np.asarray(ids, np.int64)]) - 1, 0)


def word_links(weights, source_words, target_words):
    """Sorted (source word, target word) pairs, each once.

    Args:
      weights: (T_y, T_x) attention of the T_y target tokens over the T_x source tokens
        (both without ``</S>``).
      source_words: (T_x,) and target_words: (T_y,) word index of each token.
    """
    if weights.shape[0] == 0 or weights.shape[1] == 0:
        return []
    best = np.argmax(weights, axis=1)
    return sorted({(int(source_words[i]), int(target_words[t])) for t, i in enumerate(best)})


def pharaoh(links):
    """[(i, j)] -> ``"i-j i-j ..."``."""
    return " ".join(f"{i}-{j}" for i, j in links)


def alignments(model, x, ids, block, starts):
    """Pharaoh word alignments of decoded hypotheses.

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated, ``<PAD>``-padded.
      ids: (N, k, T) int32 numpy hypotheses (:func:`~tf_transformer.infer.decode.generate`'s ids).
      block: the decoder block, a Python index (0 to L - 1, or -L to -1).
      starts: (source, target) :func:`word_starts` tables.
    Returns:
      N * k strings, hypothesis j of sentence n at n * k + j.
    """
    n, k, _ = ids.shape
    rows = np.asarray(ids).reshape([n * k, -1])
    sources = np.repeat(np.asarray(x), k, axis=0)
    weights = head_average(model, tf.constant(sources), tf.constant(rows), int(block)).numpy()
    return [pharaoh(_links(w, source, output, starts)) for w, source, output in zip(weights, sources, rows)]


def _links(weights, source, output, starts):
    """:func:`word_links` of one hypothesis: its (T_y, T_x) weights, (T_x,) source ids, (T_y,) output ids."""
    source = source[source != PAD_ID][:-1]  # without </S>
    shown = np.cumsum(output == EOS_ID) == 0  # the tokens the text shows: before </S>, no <PAD> or <S>
    shown &= (output != PAD_ID) & (output != BOS_ID)
    return word_links(weights[shown][:, : len(source)], word_indices(source, starts[0]),
                      word_indices(output[shown], starts[1]))

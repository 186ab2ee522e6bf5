"""Word alignments of translations from the encoder-decoder attention, in Pharaoh format (``0-0 1-2 ...``).

As OpenNMT and Marian report them: after decoding, the model reads each translation
again teacher-forced (one pass per batch) and the encoder-decoder attention of one
decoder block, averaged over its heads, gives each output token's distribution over the
source tokens. A target token is aligned to the source token it attends most (``</S>``
on either side left out); tokens are merged to words as the texts show them
(SentencePiece pieces by their ``▁`` word-start mark; a word vocabulary's tokens are
words), and two words are aligned when any of their tokens are (the usual merge of
subword alignments, as awesome-align's). Links are ``SOURCE-TARGET`` word indices from
0, sorted, each once; a translation without words has none (an empty string).

The block: by default the last (``-1``); another can be chosen (in deeper models a block
below the last often aligns better). The blocks after it are not run.
"""

import weakref

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.nn.model import shift_right

# SentencePiece's mark of a piece that starts a word.
WORD_START = "\u2581"


def best_sources(model, x, output, block):
    """For each output token, the source token its block's head-averaged attention weighs most.

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated, ``<PAD>``-padded.
      output: (N, T_y) int32 output ids (``</S>``-terminated or cut, ``<PAD>`` after).
      block: a decoder block, a Python index (0 to L - 1, or -L to -1).
    Returns:
      (N, T_y) int32 numpy source positions, ``</S>`` and ``<PAD>`` left out (0 when the source
      has no other token). Row t is the attention while producing output token t.
    """
    functions = _TRACED.setdefault(model, {})
    if block not in functions:
        model_ref = weakref.ref(model)  # the cache must not keep the model alive

        def run(x, output):
            weights = tf.reduce_mean(model_ref().block_attention(x, shift_right(output), block), axis=1)
            real = (x != PAD_ID) & (x != EOS_ID)
            return tf.argmax(tf.where(real[:, None, :], weights, -1.0), axis=-1, output_type=tf.int32)
        functions[block] = tf.function(run, input_signature=[tf.TensorSpec([None, None], tf.int32)] * 2,
                                       autograph=False)
    return functions[block](x, output).numpy()


# One traced best_sources per model and block, for inputs of any shape.
_TRACED = weakref.WeakKeyDictionary()


def word_starts(tokenizer):
    """(V,) bool: which token ids start a word (every id of a word vocabulary)."""
    if tokenizer.kind == "word":
        return np.ones([tokenizer.vocab_size], bool)
    return np.array([tokenizer.id_to_token(i).startswith(WORD_START) for i in range(tokenizer.vocab_size)])


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
    output = np.asarray(ids).reshape([n * k, -1])
    sources = np.repeat(np.asarray(x), k, axis=0)
    best = best_sources(model, sources, output, int(block))
    return [pharaoh(links) for links in word_links(best, sources, output, starts)]


def word_links(best, sources, output, starts):
    """Each hypothesis' sorted (source word, target word) pairs, each once: a target word is aligned to the
    words of the source tokens that its tokens attend most (:func:`best_sources`).

    Args:
      best: (N, T_y) :func:`best_sources`; sources: (N, T_x) and output: (N, T_y) ids.
      starts: (source, target) :func:`word_starts` tables.
    Returns:
      N lists of (int, int).
    """
    source_words = np.take_along_axis(word_indices(sources, starts[0]), best, axis=1)
    # The tokens the text shows: before </S>, no <PAD> or <S>.
    shown = (np.cumsum(output == EOS_ID, axis=1) == 0) & (output != PAD_ID) & (output != BOS_ID)
    target_words = word_indices(output, starts[1], shown)
    return [sorted(set(zip(source_words[row][shown[row]].tolist(), target_words[row][shown[row]].tolist())))
            for row in range(len(output))]


def word_indices(ids, starts, counted=True):
    """(..., T) token ids -> (..., T) int word index of each token: the count of word starts up to it, less
    one (a first token that starts no word is in word 0 all the same); ``counted``: a mask of the tokens
    that count (the others start no word)."""
    return np.maximum(np.cumsum(starts[np.asarray(ids, np.int64)] & counted, axis=-1) - 1, 0)

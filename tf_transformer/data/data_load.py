"""Turning sentence pairs into training batches (the original's ``data_load.py``).

1. :func:`encode_pairs` tokenizes the whole corpus once, with the tokenizers'
   graph ops, appends ``</S>`` to every source and target (the decoder input
   ``<S>`` + target is made by :func:`~tf_transformer.nn.model.shift_right`), and
   drops pairs longer than ``maxlen``, counting them.
2. :func:`make_dataset` shuffles every epoch and batches with ``tf.data``:
   either buckets of similar length holding at most ``batch_tokens`` tokens
   per side, padding included (tensor2tensor's and OpenNMT's batching), or
   ``batch_size`` pairs (the blog); then prefetches.
3. :class:`BatchStats` measures how much of the batches is padding.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import EOS_ID, UNK_ID

# Bucket edges grow by 10% from 8 tokens, as tensor2tensor's `_bucket_boundaries`.
MIN_BUCKET_LENGTH, BUCKET_STEP = 8, 1.1
_TOKENIZE_CHUNK = 8192


@dataclasses.dataclass
class Examples:
    """Token ids of a corpus, ``</S>``-terminated.

    Attributes:
      sources: (N, None) int32 RaggedTensor.
      targets: (N, None) int32 RaggedTensor.
      too_long: pairs dropped because a side had more than ``maxlen`` tokens.
    """

    sources: tf.RaggedTensor
    targets: tf.RaggedTensor
    too_long: int = 0

    def __len__(self):
        return int(self.sources.nrows())

    def unk_shares(self):
        """(source, target): the share of ``<UNK>`` among each side's tokens (``</S>`` not counted; 0 when
        there are none): the text the tokenizer cannot cover."""
        def share(ids):
            tokens = int(tf.size(ids.flat_values)) - int(ids.nrows())
            return int(tf.reduce_sum(tf.cast(ids.flat_values == UNK_ID, tf.int32))) / max(tokens, 1)

        return share(self.sources), share(self.targets)

    def pair_lengths(self):
        """(N,) int numpy: each pair's :func:`pair_length`, its longer side."""
        return np.maximum(self.sources.row_lengths().numpy(), self.targets.row_lengths().numpy())


def tokenize_with_eos(tokenizer, sentences):
    """list of N str -> (N, None) int32 RaggedTensor of ids, each row ending with ``</S>``."""
    chunks = [tokenizer.tokenize(tf.constant(sentences[i:i + _TOKENIZE_CHUNK], tf.string))
              for i in range(0, len(sentences), _TOKENIZE_CHUNK)]
    ids = tf.concat(chunks, axis=0) if len(chunks) > 1 else chunks[0]
    eos = tf.fill([ids.nrows(), 1], tf.constant(EOS_ID, tf.int32))
    return tf.concat([ids, eos], axis=1)


def encode_pairs(pairs, source_tokenizer, target_tokenizer, maxlen):
    """Sentence pairs -> :class:`Examples`, keeping pairs of at most ``maxlen`` tokens per side
    (``</S>`` included)."""
    sources = tokenize_with_eos(source_tokenizer, [s for s, _ in pairs])
    targets = tokenize_with_eos(target_tokenizer, [t for _, t in pairs])
    keep = tf.where((sources.row_lengths() <= maxlen) & (targets.row_lengths() <= maxlen))[:, 0]
    return Examples(tf.gather(sources, keep), tf.gather(targets, keep), len(pairs) - int(tf.size(keep)))


def bucket_boundaries(maxlen):
    """Upper bounds (exclusive) of the length buckets: 8, 9, ..., growing 10% each, up to ``maxlen + 1``."""
    boundaries, length = [], MIN_BUCKET_LENGTH
    while length <= maxlen:
        boundaries.append(length)
        length = max(length + 1, int(length * BUCKET_STEP))
    return boundaries + [maxlen + 1]


def _as_tensors(x, y):
    return tf.identity(x), tf.identity(y)


def pair_length(x, y):
    """A pair's bucketing length: its longer side, in tokens (scalar int32)."""
    return tf.maximum(tf.shape(x)[0], tf.shape(y)[0])


def batch_sizes(hp):
    """(upper bounds of the length buckets, pairs per batch in each): with ``batch_tokens``, a batch
    of the bucket's longest pairs fills the budget; else one bucket of ``batch_size`` pairs."""
    if not hp.batch_tokens:
        return [hp.maxlen + 1], [hp.batch_size]
    boundaries = bucket_boundaries(hp.maxlen)
    longest = [hp.maxlen if hp.pad_to_maxlen else min(b - 1, hp.maxlen) for b in boundaries]
    return boundaries, [hp.batch_tokens // n for n in longest]


def count_batches(length_counts, hp):
    """The batches :func:`batch_by_length` makes of pairs whose lengths (:func:`pair_length`) have the
    histogram ``length_counts`` (``length_counts[n]`` pairs of length n), whatever their order: each
    bucket ends with one partial batch."""
    boundaries, sizes = batch_sizes(hp)
    counts, low = np.asarray(length_counts), 0
    batches = 0
    for boundary, size in zip(boundaries, sizes):
        batches += -(-int(counts[low:boundary].sum()) // size)
        low = boundary
    return batches


def batch_by_length(dataset, hp):
    """A dataset of (x, y) pairs of 1-D int32 ids -> batches, as :func:`make_dataset` describes."""
    shape = [hp.maxlen] if hp.pad_to_maxlen else [None]
    if not hp.batch_tokens:
        return dataset.padded_batch(hp.batch_size, padded_shapes=(shape, shape))
    boundaries, sizes = batch_sizes(hp)
    return dataset.bucket_by_sequence_length(
        pair_length,
        bucket_boundaries=boundaries,
        # The last bucket (longer than maxlen) stays empty; it needs a size all the same.
        bucket_batch_sizes=sizes + [1],
        padded_shapes=(shape, shape))


def make_dataset(examples, hp, shuffle=True, seed=None):
    """``tf.data`` batches of ``(x, y)`` for one epoch (iterate again for the next).

    Uses ``hp.batch_tokens``, ``hp.batch_size``, ``hp.maxlen`` and
    ``hp.pad_to_maxlen``. With ``batch_tokens > 0`` every batch of N pairs padded
    to T tokens has N * T <= batch_tokens, on each side.

    Yields:
      x: (N, T_x) int32 source ids; y: (N, T_y) int32 target ids; ``<PAD>``-padded
      to the batch's longest sentence on that side, or to ``maxlen``.
    """
    dataset = tf.data.Dataset.from_tensor_slices((examples.sources, examples.targets))
    if shuffle:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.map(_as_tensors)  # rows of a RaggedTensor come as ragged specs; batching wants tensors
    return batch_by_length(dataset, hp).prefetch(tf.data.AUTOTUNE)


class BatchStats:
    """Counts pairs, tokens and padded positions of the batches it is shown.

    Example:
      >>> stats = BatchStats()
      >>> stats.add(np.array([[4, 3, 0]]), np.array([[5, 3]]))
      >>> stats.summary(maxlen=4)["padding"]
      0.2
    """

    def __init__(self):
        self.batches = self.pairs = self.tokens = self.target_tokens = self.positions = 0

    def add(self, x, y):
        """One batch: (N, T_x) and (N, T_y) ids, ``<PAD>`` = 0."""
        target_tokens = int(np.count_nonzero(y))
        self.batches += 1
        self.pairs += int(x.shape[0])
        self.target_tokens += target_tokens
        self.tokens += int(np.count_nonzero(x)) + target_tokens
        self.positions += int(np.size(x)) + int(np.size(y))

    def summary(self, maxlen=None):
        """dict with ``batches``, ``pairs``, ``tokens`` (non-pad, both sides),
        ``padding`` (fraction of padded positions, both sides) and, when
        ``maxlen`` is given, ``padding_at_maxlen``: the fraction that padding
        every sentence to ``maxlen`` would give."""
        stats = {"batches": self.batches, "pairs": self.pairs, "tokens": self.tokens,
                 "padding": 1.0 - self.tokens / self.positions if self.positions else 0.0}
        if maxlen is not None and self.pairs:
            stats["padding_at_maxlen"] = 1.0 - self.tokens / (2 * self.pairs * maxlen)
        return stats


def padding_stats(batches, maxlen=None):
    """:meth:`BatchStats.summary` of one pass over ``batches`` (a dataset or a list of (x, y))."""
    stats = BatchStats()
    for x, y in batches:
        stats.add(x, y)
    return stats.summary(maxlen)

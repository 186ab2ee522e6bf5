"""The training benchmark's batches (``bench/train.py``): the trainer's own of a real corpus, or synthetic ones,
and the FLOPs of a training step on them."""

import dataclasses

import numpy as np

from tf_transformer.data import corpus, data_load
from tf_transformer.data.tokenizer import train_tokenizers
from tf_transformer.data.vocab import EOS_ID, PAD_ID
from tf_transformer.hparams import load_hparams
from tf_transformer.train.step import epoch_batches

VOCAB = {"small": 8000, "base": 32000}  # the synthetic batches' vocabulary of each size (the issue's)
PAIRS, MIN_TOKENS, MAX_TOKENS = 64, 5, 24
REAL_BATCH_TOKENS = (1024, 4096)  # the small preset's batch_tokens, and batches of about 4000 tokens
DISTINCT_BATCHES = 8


# ---- batches --------------------------------------------------------------------

@dataclasses.dataclass
class BatchSet:
    """The batches every contender of a group trains on: one list, taken in the same order by all.

    Attributes:
      name: ``"real 1024"`` (the pipeline's batches at batch_tokens 1024) or ``"synthetic"``.
      batches: list of (x, y): (N, T_x) and (N, T_y) int32 numpy ids, ``<PAD>`` (0) only at row ends.
      vocab: the vocabulary of both sides.
      origin: where they come from, one line.
      batch_tokens: the pipeline's ``batch_tokens`` (at most that many positions a side); 0: synthetic.
    """

    name: str
    batches: list
    vocab: int
    origin: str
    batch_tokens: int = 0

    @property
    def longest(self):
        """The most positions of a batch side (keras-hub's position table needs that many)."""
        return max(max(x.shape[1], y.shape[1]) for x, y in self.batches)

    @property
    def padding(self):
        """The share of padded positions, both sides."""
        return data_load.padding_stats(self.batches)["padding"]

    def describe(self):
        """One line: the name, origin, batch count and padding."""
        stats = data_load.padding_stats(self.batches)
        return (f"{self.name} batches: {self.origin}; {stats['batches']} distinct batches of "
                f"{stats['pairs'] / stats['batches']:.0f} pairs on average, {stats['padding']:.1%} padding")


def synthetic_batches(vocab, count=DISTINCT_BATCHES, seed=0):
    """``count`` (x, y) batches of (PAIRS, MAX_TOKENS) int32 numpy ids: real tokens from [4, vocab),
    ``</S>`` last, then ``<PAD>``; lengths uniform in [MIN_TOKENS, MAX_TOKENS]."""
    rng = np.random.default_rng(seed)

    def side():
        ids = rng.integers(4, vocab, size=(PAIRS, MAX_TOKENS)).astype(np.int32)
        lengths = rng.integers(MIN_TOKENS, MAX_TOKENS + 1, size=PAIRS)
        for row, length in enumerate(lengths):
            ids[row, length - 1] = EOS_ID
            ids[row, length:] = PAD_ID
        return ids

    return [(side(), side()) for _ in range(count)]


def synthetic_batch_set(size):
    """The :class:`BatchSet` of :func:`synthetic_batches` at the vocabulary of ``size`` (small, base)."""
    return BatchSet("synthetic", synthetic_batches(VOCAB[size]), VOCAB[size],
                    f"{PAIRS} pairs of {MIN_TOKENS}-{MAX_TOKENS} random tokens a side padded to {MAX_TOKENS}, "
                    f"vocabulary {VOCAB['small']} (small) or {VOCAB['base']} (base)")


def real_batch_sets(data, count, batch_tokens=REAL_BATCH_TOKENS):
    """The trainer's own batches of a corpus, one :class:`BatchSet` per ``batch_tokens``.

    As the trainer does at the ``small`` preset: a tokenizer trained on the
    training pairs (:func:`~tf_transformer.data.tokenizer.train_tokenizers`), the
    pairs encoded and those longer than ``maxlen`` dropped
    (:func:`~tf_transformer.data.data_load.encode_pairs`); then the first ``count``
    batches of epoch 0 of :func:`~tf_transformer.train.step.epoch_batches`, in its
    shuffled order, as numpy.

    Args:
      data: a corpus directory or an embedded corpus name (:func:`~tf_transformer.data.corpus.corpus_splits`).
    Raises:
      UserError: ``data`` holds no training split.
    """
    hp = load_hparams("small")
    pairs = corpus.corpus_splits(data)["train"].read().pairs
    tokenizers = train_tokenizers(hp, pairs)
    examples = data_load.encode_pairs(pairs, *tokenizers, hp.maxlen)
    vocab = tokenizers[1].vocab_size  # one joint model: the same on both sides
    origin = f"{data}, {len(examples)} pairs, {hp.tokenizer} vocabulary {vocab}"
    return [BatchSet(f"real {tokens}", pipeline_batches(examples, hp.replace(batch_tokens=tokens), count), vocab,
                     f"{origin}, batch_tokens {tokens}", tokens) for tokens in batch_tokens]


def pipeline_batches(examples, hp, count):
    """The first ``count`` batches of epoch 0 of :func:`~tf_transformer.train.step.epoch_batches`, as numpy (x, y)."""
    return [(x.numpy(), y.numpy()) for x, y in epoch_batches(examples, hp, 0).take(count)]


# ---- FLOPs ----------------------------------------------------------------------

def train_flops(batch, source_length, target_length, targets, num_units, d_ff, num_blocks, vocab):
    """Model FLOPs of one training step of the encoder-decoder on a batch of one shape, counting matmuls only.

    A matmul of (m, k) by (k, n) is ``2*m*n*k`` FLOPs; the backward pass costs
    twice the forward (a gradient for each operand), so a step is ``3 * F``.
    With B pairs of S source and T target positions, C = ``num_units``,
    d_ff, L blocks a side, V the target vocabulary and M the targets projected::

      encoder block:  8*B*S*C^2          Q, K, V, W^O projections
                    + 4*B*S^2*C          scores Q K^T and weights @ V (all heads together)
                    + 4*B*S*C*d_ff       feed-forward C -> d_ff -> C
      decoder block:  8*B*T*C^2 + 4*B*T^2*C                  causal self-attention (full T x T)
                    + 4*B*T*C^2 + 4*B*S*C^2 + 4*B*T*S*C      attention over the encoder (Q, W^O on T; K, V on S)
                    + 4*B*T*C*d_ff                           feed-forward
      output:         2*M*C*V            the projection to the vocabulary

      F = L * (encoder block + decoder block) + output

    Embeddings, softmax, layer norm and the optimizer are not matmuls and are
    left out. Every argument but the sizes may be a numpy array (one value per
    pair). :func:`batch_flops` applies it to each pair at its real lengths.
    """
    B, S, T, C = batch, source_length, target_length, num_units
    encoder = 8 * B * S * C**2 + 4 * B * S**2 * C + 4 * B * S * C * d_ff
    decoder = (8 * B * T * C**2 + 4 * B * T**2 * C
               + 4 * B * T * C**2 + 4 * B * S * C**2 + 4 * B * T * S * C
               + 4 * B * T * C * d_ff)
    output = 2 * targets * C * vocab
    return 3 * (num_blocks * (encoder + decoder) + output)


def real_lengths(ids):
    """(N, T) ids, ``<PAD>`` only at row ends -> (N,) int64 non-pad tokens of each row."""
    return np.count_nonzero(np.asarray(ids) != PAD_ID, axis=1).astype(np.int64)


def batch_flops(batches, hp, vocab):
    """Model FLOPs of the real work of training on ``batches`` (a list of (x, y)): :func:`train_flops` of
    each pair alone at its own non-pad source and target lengths (attention on the real lengths, the
    projection of the real targets), so no padded position counts, however much there is."""
    total = 0
    for x, y in batches:
        sources, targets = real_lengths(x), real_lengths(y)
        total += int(np.sum(train_flops(1, sources, targets, targets, hp.num_units, hp.d_ff, hp.num_blocks,
                                        vocab)))
    return total

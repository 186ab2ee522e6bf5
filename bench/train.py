"""Training throughput: non-pad target tokens per second, every contender on the same batches, one run.

Batches (``--batches real|synthetic|both``, default both, real first):

* real: the batches users train on, made by our own pipeline from a real
  corpus (``--data``, the embedded ``ding-de-en`` by default): a SentencePiece
  tokenizer trained as the trainer trains it, the pairs encoded and filtered
  at ``maxlen``, then the first batches of epoch 0 of
  :func:`tf_transformer.train.step.epoch_batches` at the ``small`` preset, in
  its shuffled order (length buckets, 8-9% padding), at the preset's
  ``batch_tokens`` 1024 and at 4096; the vocabulary is the tokenizer's;
* synthetic: 64 pairs, source and target lengths drawn uniformly from 5-24
  tokens (``</S>`` included), padded to 24 (about 40% padding), vocabulary
  8000 at the small size and 32000 at the base size.

Every contender of a group gets the same list of batches, in the same order.

Contenders:

* ours: :class:`tf_transformer.nn.model.Transformer` through the trainer's own
  ``make_train_step(model, make_optimizer(hp), hp)`` (:mod:`tf_transformer.train.step`),
  at the ``small`` preset (3+3 blocks, 256 units, 4 heads, d_ff 1024) and, on
  synthetic batches, at the blog's base size (``small`` with 6+6 blocks, 512
  units, 8 heads, d_ff 2048), each in float32 and mixed_bfloat16, and on
  synthetic batches also with XLA (``jit_compile``; XLA compiles once per
  batch shape, and the trainer pads real batches to bucket shapes for it,
  which would change the batches);
* keras-hub: ``TokenAndPositionEmbedding`` + ``TransformerEncoder`` and
  ``TransformerDecoder`` blocks + a dense output (:class:`bench.peers.KerasHubTransformer`),
  dropout 0.1, the same Adam (``make_optimizer``) and label-smoothed
  cross-entropy (:func:`~tf_transformer.nn.model.masked_loss`);
* tf-models: ``Seq2SeqTransformer`` (:func:`bench.peers.tf_models_transformer`,
  tf_keras), the same loss, a tf_keras Adam with the same settings; its
  embedding is shared with the output projection (one vocabulary) and the
  projection runs on every target position, pad included (more work than
  :func:`batch_flops` counts, which it is not credited for);

the peers without XLA, float32 and mixed_bfloat16 (tf-models through tf_keras'
policy). A peer that does not import is skipped with the pip command
(``bench/requirements.txt``, ``bench/requirements-no-deps.txt``). On a CPU
without bfloat16 instructions (neither ``avx512_bf16`` nor ``amx_bf16``) the
mixed_bfloat16 contenders are skipped (``--bf16 force`` runs them: emulated,
many times slower). "x best peer" is ours over the faster peer on the same
batches, at the same size and precision.

Each contender is timed with ``time.perf_counter`` over many steps after
warm-up steps (the first traces and compiles), never one step alone;
contenders of one group take turns (``--rounds``) and keep their best turn, so
that other processes on the machine slow them alike. Each group (one batch
set, one size, XLA on or off) runs in a fresh process that reports each
figure as it is measured; a contender gets ``--timeout`` seconds of its own
(build, warm-up and turns): one that runs over, or fails, is reported as such,
and the others keep their figures (those not measured yet go on in a new
process).

It also measures a matmul peak in the same run (large float32, and bfloat16
where the CPU has bfloat16 instructions, ``tf.matmul`` in a ``tf.function``,
at the start and in every round, the highest kept) and reports model FLOP
utilisation of the real work (:func:`batch_flops`: the non-pad tokens only)
against the peak of the contender's compute precision.

    python bench/train.py                 # everything (tens of minutes on 2 cores)
    python bench/train.py --quick         # fewer steps, no XLA: a rough figure in a few minutes
    python bench/train.py --batches real --data /work/data/debian-de-en --only "small float32"
    python bench/train.py --steps 40 --json /tmp/train-bench.json
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import queue
import shlex
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.peers import (KerasHubTransformer, keras_hub_missing, keras_hub_train_step, plain_step,  # noqa: E402
                         tf_keras_policy, tf_models_missing, tf_models_optimizer, tf_models_transformer)
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import corpus, data_load  # noqa: E402
from tf_transformer.data.tokenizer import train_tokenizers  # noqa: E402
from tf_transformer.data.vocab import EOS_ID, PAD_ID  # noqa: E402
from tf_transformer.errors import UserError  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.nn.model import Transformer  # noqa: E402
from tf_transformer.train.precision import BF16_FLAGS, matmul_gflops  # noqa: E402
from tf_transformer.train.step import epoch_batches, make_optimizer, make_train_step, precision_policy  # noqa: E402

VOCAB = {"small": 8000, "base": 32000}  # the synthetic batches' vocabulary of each size (the issue's)
PAIRS, MIN_TOKENS, MAX_TOKENS = 64, 5, 24
REAL_BATCH_TOKENS = (1024, 4096)  # the small preset's batch_tokens, and batches of about 4000 tokens
BASE_SIZE = {"num_blocks": 6, "num_units": 512, "num_heads": 8, "d_ff": 2048}
PRECISIONS = ("float32", "mixed_bfloat16")
WARMUP_STEPS = 2
DISTINCT_BATCHES = 8
INSTALL = "pip install -r bench/requirements.txt && pip install --no-deps -r bench/requirements-no-deps.txt"
PEAK_SIZE = 2048  # the matmul peak multiplies two PEAK_SIZE x PEAK_SIZE matrices
QUICK_TIMEOUT = 180  # --quick: seconds each contender may spend, at most


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


# ---- contenders -----------------------------------------------------------------

def our_step(hp, batch_set):
    """The trainer's compiled step for a fresh model of ``hp``: (x, y) -> (loss, accuracy)."""
    keras.utils.set_random_seed(hp.seed)
    model = Transformer.from_hparams(hp, batch_set.vocab, batch_set.vocab)
    return make_train_step(model, make_optimizer(hp), hp)


def keras_hub_step(hp, batch_set):
    """keras-hub's encoder-decoder (:class:`bench.peers.KerasHubTransformer`, positions up to the longest
    batch side) and our Adam (``make_optimizer``)."""
    keras.utils.set_random_seed(hp.seed)
    model = KerasHubTransformer(hp, batch_set.vocab, batch_set.vocab, batch_set.longest)
    return keras_hub_train_step(model, make_optimizer(hp), hp)


def tf_models_step(hp, batch_set):
    """tf-models' ``Seq2SeqTransformer`` (:func:`bench.peers.tf_models_transformer`; it shifts the targets
    itself) and a tf_keras Adam with our settings; build and warm it up under :func:`bench.peers.tf_keras_policy`."""
    import tf_keras

    tf_keras.utils.set_random_seed(hp.seed)
    model = tf_models_transformer(hp, batch_set.vocab)
    return plain_step(lambda x, y: model({"inputs": x, "targets": y}, training=True), model,
                      tf_models_optimizer(hp), hp)


def step_matmuls(n, s, t, sources, targets, hp, vocab):
    """Every matmul of our step's forward pass on one batch, as (batch, rows, inner, columns).

    ``n`` pairs padded to ``s`` source and ``t`` target positions, ``sources``
    and ``targets`` of them real tokens (ints or scalar tensors). As our model
    computes them: the position-wise layers (Q/K/V fused, W^O, feed-forward, the
    output layer) on the packed real tokens, attention scores and weights @ V
    on the padded (n * heads) x positions, as :func:`train_flops` counts them.
    """
    c, f, h = hp.num_units, hp.d_ff, hp.num_heads
    d = c // h

    def attention(q, kv):  # batched over n * heads
        return [(n * h, q, d, kv), (n * h, q, kv, d)]

    encoder = [(1, sources, c, 3 * c), *attention(s, s), (1, sources, c, c), (1, sources, c, f), (1, sources, f, c)]
    decoder = [(1, targets, c, 3 * c), *attention(t, t), (1, targets, c, c),
               (1, targets, c, c), (1, sources, c, 2 * c), *attention(t, s), (1, targets, c, c),
               (1, targets, c, f), (1, targets, f, c)]
    return (encoder + decoder) * hp.num_blocks + [(1, targets, c, vocab)]


def matmul_bound_step(hp, batch_set):
    """The matmuls of our step alone, forward and backward, at our shapes on each batch: (x, y) -> a scalar.

    Each (m, k) @ (k, n) of :func:`step_matmuls` runs with its two gradient
    matmuls (the gradient @ weights^T, inputs^T @ the gradient), on operands
    cut from three buffers, in the compute dtype of the policy it is built under.
    No other op of a step runs (embeddings, softmax, masks, layer norm,
    dropout, loss, optimizer), so its speed is the most any implementation of
    these matmuls with TensorFlow's kernels reaches on this CPU: a bound.
    """
    dtype = keras.mixed_precision.global_policy().compute_dtype
    largest = max(b * max(m * k, k * cols, m * cols)
                  for x, y in batch_set.batches
                  for b, m, k, cols in step_matmuls(*x.shape, y.shape[1], int(np.count_nonzero(x)),
                                                  int(np.count_nonzero(y)), hp, batch_set.vocab))
    # Inputs, weights and gradients in buffers of their own, as a step's are distinct tensors.
    inputs, weights, gradients = [tf.Variable(tf.random.stateless_uniform([largest], [hp.seed, i], -1.0, 1.0,
                                                                          dtype=dtype), trainable=False)
                                  for i in range(3)]

    def operand(buffer, b, rows, columns):  # b: 1 (a position-wise matmul) or a tensor (n * heads, attention)
        flat = buffer[:b * rows * columns]
        return tf.reshape(flat, [rows, columns] if isinstance(b, int) else [b, rows, columns])

    @tf.function(reduce_retracing=True)
    def step(x, y):
        n, s, t = tf.shape(x)[0], tf.shape(x)[1], tf.shape(y)[1]
        sources, targets = tf.math.count_nonzero(x, dtype=tf.int32), tf.math.count_nonzero(y, dtype=tf.int32)
        corners = []
        for b, m, k, cols in step_matmuls(n, s, t, sources, targets, hp, batch_set.vocab):
            a, w, g = operand(inputs, b, m, k), operand(weights, b, k, cols), operand(gradients, b, m, cols)
            for product in (tf.matmul(a, w), tf.matmul(g, w, transpose_b=True), tf.matmul(a, g, transpose_a=True)):
                corners.append(tf.cast(tf.reshape(product, [-1])[0], tf.float32))
        return tf.add_n(corners)

    return step


BOUND = "matmuls"  # not a contender: the bound of matmul_bound_step
BUILDERS = {"ours": our_step, "keras-hub": keras_hub_step, "tf-models": tf_models_step, BOUND: matmul_bound_step}
PEERS = ("keras-hub", "tf-models")


@dataclasses.dataclass
class Contender:
    """One model and training step to time, on its group's batches."""

    name: str  # ours | keras-hub | tf-models (a key of BUILDERS)
    size: str  # small | base
    hp: object  # HParams: size, precision, jit_compile
    steps: int  # timed steps in all
    batches: BatchSet
    warmup_steps: int = WARMUP_STEPS
    step: object = None

    def build(self):
        """The contender's step(x, y), built (and later warmed up) under its precision policy."""
        return BUILDERS[self.name](self.hp, self.batches)

    def policy(self):
        """The global dtype policy its layers take when built: Keras 3's, or tf_keras' for tf-models."""
        return (tf_keras_policy if self.name == "tf-models" else precision_policy)(self.hp.precision)

    @property
    def label(self):
        return Result.of(self).label


@dataclasses.dataclass
class Result:
    """One contender's figures: its best round, or why it has none."""

    contender: str
    size: str
    precision: str
    xla: bool
    batches: str  # the BatchSet's name
    vocab: int
    steps: int = 0  # timed steps of the best round
    seconds: float = None
    target_tokens_per_sec: float = None  # None: no figure, see note
    flops_per_sec: float = None  # batch_flops (the real work) per second
    rounds: int = 0  # rounds measured
    note: str = None  # skipped, failed or timed out, and why; or fewer rounds than planned
    best_peer: str = None  # the faster of keras-hub and tf-models on the same batches, size and precision
    vs_best_peer: float = None
    mfu: float = None

    @property
    def label(self):
        """``"name size precision XLA on|off batches"``, e.g. ``"ours small float32 XLA off real 1024"``."""
        return f"{self.contender} {self.size} {self.precision} XLA {'on' if self.xla else 'off'} {self.batches}"

    @classmethod
    def of(cls, contender, note=None):
        """An empty result of ``contender``."""
        return cls(contender.name, contender.size, contender.hp.precision, contender.hp.jit_compile,
                   contender.batches.name, contender.batches.vocab, note=note)

    def add_round(self, measured):
        """Counts the round ``measured`` (a Result of one round) and keeps it when it is faster."""
        if self.target_tokens_per_sec is None or measured.target_tokens_per_sec > self.target_tokens_per_sec:
            self.steps, self.seconds = measured.steps, measured.seconds
            self.target_tokens_per_sec, self.flops_per_sec = measured.target_tokens_per_sec, measured.flops_per_sec
        self.rounds += 1


# ---- measuring, in a group's own process ----------------------------------------

@dataclasses.dataclass
class Event:
    """What a group's process reports, as it happens.

    kind: ``start`` (contender ``index`` of the group begins its build and warm-up, or a round),
    ``result`` (its ``result`` of one round), ``failed`` (it raised: ``error``), ``peaks`` (the matmul
    ``peaks`` of a round, GFLOP/s by compute dtype), ``done``; and, on the parent's side of the pipe,
    ``died`` (the process ended early) and ``timeout`` (nothing came in time), ``error`` saying which.
    """

    kind: str
    index: int = None
    result: Result = None
    peaks: dict = None
    error: str = None


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def warm_up(contender, tensors):
    """Builds the model and its step under the contender's precision and runs its warm-up steps on the first
    of ``tensors`` (the first traces, and with XLA compiles); returns the step."""
    started = time.perf_counter()
    with contender.policy():  # layers keep the policy they were built with (tf-models' build in their first call)
        contender.step = contender.build()
        for i in range(contender.warmup_steps):
            outputs = contender.step(*tensors[i % len(tensors)])
        _first(outputs).numpy()
    print(f"  {contender.label:<48} built, traced, {contender.warmup_steps} warm-up step(s): "
          f"{time.perf_counter() - started:.0f}s", flush=True)
    return contender.step


def timed_steps(step, batches):
    """Seconds for ``step`` over ``batches``, one after the other."""
    started = time.perf_counter()
    for x, y in batches:
        outputs = step(x, y)
    _first(outputs).numpy()  # steps run in order (each reads the last one's weights): the last ends them all
    return time.perf_counter() - started


def time_round(contender, tensors, indices):
    """One round of ``contender``: its steps on ``tensors[i] for i in indices`` -> a :class:`Result` of it."""
    seconds = timed_steps(contender.step, [tensors[i] for i in indices])
    chunk = [contender.batches.batches[i] for i in indices]
    tokens = sum(int(np.count_nonzero(y)) for _, y in chunk)
    return dataclasses.replace(Result.of(contender), steps=len(indices), seconds=seconds,
                               target_tokens_per_sec=tokens / seconds,
                               flops_per_sec=batch_flops(chunk, contender.hp, contender.batches.vocab) / seconds)


def per_round(contender, rounds):
    """Timed steps of ``contender`` in each of ``rounds`` rounds (at least 2)."""
    return max(2, contender.steps // rounds)


def measure_group(group, rounds, report):
    """Times the contenders of ``group`` in turns on their one :class:`BatchSet`, telling ``report``
    each :class:`Event` as it happens.

    Every contender is built and warmed up on the first batches; then each of
    ``rounds`` rounds measures the matmul peaks again and runs every contender
    still standing for its :func:`per_round` steps, all on the same batches in
    the same order, so that load from other processes falls on all of them
    alike. A contender that raises is reported ``failed`` and leaves the turns;
    the others go on.
    """
    tensors = [(tf.constant(x), tf.constant(y)) for x, y in group[0].batches.batches]

    def attempt(index, work, *args):
        """``work(*args)``, or None after reporting contender ``index`` failed."""
        try:
            return work(*args)
        except Exception as e:  # one contender's failure, whatever it is, must not stop the others
            group[index].step = None
            report(Event("failed", index, error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
            return None

    standing = []
    for index, contender in enumerate(group):
        report(Event("start", index))
        if attempt(index, warm_up, contender, tensors) is not None:
            standing.append(index)
    offset = max(c.warmup_steps for c in group)
    for _ in range(rounds):
        report(Event("peaks", peaks=measure_peaks(peak_dtypes(group))))
        for index in list(standing):
            report(Event("start", index))
            indices = [(offset + i) % len(tensors) for i in range(per_round(group[index], rounds))]
            result = attempt(index, time_round, group[index], tensors, indices)
            if result is None:
                standing.remove(index)
            else:
                report(Event("result", index, result=result))
        offset += max(per_round(c, rounds) for c in group)
    for contender in group:
        contender.step = None  # let the models go
    report(Event("done"))


def has_bf16(cpu_flags=None):
    """Whether the CPU runs bfloat16 matmuls natively (one of :data:`BF16_FLAGS`); ``cpu_flags`` defaults to
    /proc/cpuinfo's."""
    return bool(set(cpu_speed_flags(cpu_flags).split()) & set(BF16_FLAGS))


def peak_dtype(precision, bf16):
    """The compute dtype whose matmul peak a precision's MFU is held to: bfloat16's for mixed_bfloat16 on a
    CPU with bfloat16 instructions (``bf16``); else float32's, the CPU's own peak (emulated bfloat16 runs on
    the float32 units)."""
    return "bfloat16" if precision == "mixed_bfloat16" and bf16 else "float32"


def peak_dtypes(contenders, bf16=None):
    """The compute dtypes whose peaks the MFU of ``contenders`` needs (float32 always); ``bf16``:
    :func:`has_bf16` by default."""
    bf16 = has_bf16() if bf16 is None else bf16
    return sorted({"float32"} | {peak_dtype(c.hp.precision, bf16) for c in contenders})


def measure_peaks(dtypes):
    """{dtype name: GFLOP/s of :func:`matmul_peak`} for each name in ``dtypes``."""
    return {name: matmul_peak(tf.as_dtype(name)) for name in dtypes}


def merge_peaks(peaks, measured):
    """Keeps in ``peaks`` the highest of each dtype's peaks; returns ``peaks``."""
    for name, value in measured.items():
        peaks[name] = max(peaks.get(name, 0.0), value)
    return peaks


def matmul_peak(dtype, size=PEAK_SIZE, repeats=10):
    """GFLOP/s of a (size, size) @ (size, size) ``tf.matmul`` in a ``tf.function``, best of 3 runs of
    ``repeats`` calls (:func:`tf_transformer.train.precision.matmul_gflops`)."""
    return matmul_gflops(dtype, (size, size, size), calls=repeats, repeats=3)


def _group_child(group, rounds, outbox):
    measure_group(group, rounds, outbox.put)


# ---- running groups, in the parent process ----------------------------------------

def start_group(group, rounds):
    """Starts :func:`measure_group` of ``group`` in a fresh (spawned) process.

    Returns:
      ``(next_event, stop)``: ``next_event(timeout)`` -> the process's next
      :class:`Event` (``died`` when it ended without one), raising
      ``queue.Empty`` after ``timeout`` seconds without one; ``stop(finished)``
      waits for a finished process to exit and ends an unfinished one.
    """
    context = multiprocessing.get_context("spawn")
    outbox = context.Queue()
    child = context.Process(target=_group_child, args=(group, rounds, outbox))
    child.start()

    def next_event(timeout):
        deadline = time.perf_counter() + timeout
        while True:
            try:
                return outbox.get(timeout=min(1.0, max(0.0, deadline - time.perf_counter())))
            except queue.Empty:
                if not child.is_alive():
                    try:  # what it sent just before it ended
                        return outbox.get(timeout=1.0)
                    except queue.Empty:
                        return Event("died", error=f"failed: its process ended (exit status {child.exitcode})")
                if time.perf_counter() >= deadline:
                    raise

    def stop(finished):
        child.join(timeout=30 if finished else 0)
        if child.is_alive():
            child.terminate()
            child.join()

    return next_event, stop


def follow(next_event, members, results, budget, peaks):
    """Reads the events of one group process into ``results`` until it is done (True), or until the
    contender at work has spent ``budget`` seconds in it or the process ended (False: that contender's
    note says so; before any contender started, every member's).

    A contender's seconds run from each of its ``start`` events to the next
    event: its build and warm-up, its turns, and the matmul peak measured
    after the last turn of a round when it is the last in the group. The
    process's start (imports) has a budget of its own.

    Args:
      next_event: ``timeout -> Event``, raising ``queue.Empty`` after ``timeout`` seconds without one.
      members: the index in ``results`` of each contender of the process (events give its place there).
      results: one :class:`Result` per contender of the whole group, updated in place.
      budget: seconds each contender may spend.
      peaks: GFLOP/s by compute dtype, the highest kept.
    """
    current, spent, mark = None, {}, time.perf_counter()
    while True:
        try:
            event = next_event(max(0.0, budget - spent.get(current, 0.0)))
        except queue.Empty:
            event = Event("timeout", error=f"timed out: over its {budget:.0f}s (build, warm-up and rounds)")
        now = time.perf_counter()
        spent[current], mark = spent.get(current, 0.0) + now - mark, now
        if event.kind == "start":
            current = event.index
        elif event.kind == "result":
            results[members[event.index]].add_round(event.result)
        elif event.kind == "failed":
            set_note(results[members[event.index]], f"failed: {event.error}")
        elif event.kind == "peaks":
            merge_peaks(peaks, event.peaks)
        elif event.kind == "done":
            return True
        else:  # timeout or died: the contender at work is to blame
            for index in members if current is None else [members[current]]:
                set_note(results[index], event.error)
            return False


def set_note(result, note):
    """Notes why ``result`` stopped, and says so at once."""
    result.note = note
    print(f"  {result.label:<48} {note}", flush=True)


def run_group(group, rounds, budget, peaks, start=start_group):
    """Measures ``group`` with :func:`measure_group` in a fresh process: memory comes back after each group,
    and a contender that hangs or is very slow cannot stall the run.

    Each contender may spend ``budget`` seconds. When one runs over or its
    process dies, that process is stopped and the contenders without a figure
    or a note go on in a new one; figures already measured are kept. A group
    whose contenders have fewer than ``2 * rounds`` steps runs one round.

    Args:
      start: ``(contenders, rounds) -> (next_event, stop)``, as :func:`start_group`.
      peaks: GFLOP/s by compute dtype, the highest kept.
    Returns:
      one :class:`Result` per contender, in order.
    """
    rounds = rounds if all(c.steps >= 2 * rounds for c in group) else 1
    results = [Result.of(c) for c in group]
    members = list(range(len(group)))
    while members:
        next_event, stop = start([group[i] for i in members], rounds)
        finished = False
        try:
            finished = follow(next_event, members, results, budget, peaks)
        finally:
            stop(finished)
        members = [] if finished else [i for i in members if not results[i].rounds and results[i].note is None]
    for result in results:
        if 0 < result.rounds < rounds and result.note is None:
            result.note = f"{result.rounds} of {rounds} rounds"
        if result.rounds:
            print(f"  {result.label:<48} best of {result.rounds} round(s) of {result.steps} steps: "
                  f"{result.target_tokens_per_sec:7.0f} target tokens/s ({result.seconds / result.steps:.2f}s a step)",
                  flush=True)
    return results


# ---- what runs ------------------------------------------------------------------------

def contender_groups(steps, quick, real_sets=(), synthetic=True):
    """Lists of :class:`Contender` timed together (one batch set, size and XLA setting), in the order they run:
    the small size on each real batch set (with the bound of :func:`matmul_bound_step` taking its turns),
    then the small and base sizes on synthetic batches.

    Batches of more tokens take fewer steps (``steps * 1024 / batch_tokens``), as
    do XLA on a CPU and the base size (a fifth), at least 2 (6 without
    ``quick``). The peers run without XLA only (keras-hub's and tf-models'
    training examples do not compile), ours with XLA on synthetic batches only.
    ``quick``: one warm-up step, no XLA groups.
    """
    small = load_hparams("small").replace(lr_schedule="constant")
    base = small.replace(**BASE_SIZE)
    least = 2 if quick else 6
    slow_steps = max(least, steps // 5)  # XLA on a CPU, and the base size, are several times slower
    warmup = 1 if quick else WARMUP_STEPS

    def group(size, hp, batches, steps, names=PEERS + ("ours",), warmup=warmup):
        return [Contender(name, size, hp.replace(precision=p), steps, batches, warmup)
                for p in PRECISIONS for name in names]

    groups = [group("small", small, batch_set,
                    max(min(least, steps), steps * REAL_BATCH_TOKENS[0] // batch_set.batch_tokens),
                    names=PEERS + ("ours", BOUND))
              for batch_set in real_sets]
    if synthetic:
        small_set, base_set = synthetic_batch_set("small"), synthetic_batch_set("base")
        groups += [group("small", small, small_set, steps), group("base", base, base_set, slow_steps)]
        if not quick:
            groups.insert(len(real_sets) + 1, group("small", small.replace(jit_compile=True), small_set, slow_steps,
                                                    names=("ours",), warmup=WARMUP_STEPS))
            groups.append(group("base", base.replace(jit_compile=True), base_set, 2, names=("ours",),
                                warmup=WARMUP_STEPS))
    return groups


def selected_groups(groups, only):
    """``groups`` with only the contenders whose label contains ``only`` (all when None); empty groups dropped."""
    groups = [[c for c in group if not only or only in c.label] for group in groups]
    return [group for group in groups if group]


def missing_peers():
    """{peer: why it does not import} for the peers that do not."""
    why = {"keras-hub": keras_hub_missing(), "tf-models": tf_models_missing()}
    return {name: reason for name, reason in why.items() if reason}


def bf16_skip_reason(mode, cpu_flags=None):
    """Why the mixed_bfloat16 contenders are left out, or None when they run: ``mode`` (``--bf16``) off, or
    auto on a CPU without bfloat16 instructions (:func:`has_bf16`; TensorFlow would emulate them, many times
    slower than float32). ``cpu_flags`` defaults to /proc/cpuinfo's."""
    if mode == "off":
        return "skipped: --bf16 off"
    if mode == "auto" and not has_bf16(cpu_flags):
        return (f"skipped: the CPU has neither {' nor '.join(BF16_FLAGS)} (bfloat16 would be emulated, many "
                f"times slower than float32); --bf16 force runs it")
    return None


def skip_reasons(missing, bf16_reason):
    """``contender -> why it is skipped`` (None: it runs): a peer that does not import (``missing``: {peer:
    why}), and every mixed_bfloat16 contender when ``bf16_reason`` is set."""
    def reason(contender):
        if contender.name in missing:
            return f"skipped: {contender.name} does not import"
        return bf16_reason if contender.hp.precision == "mixed_bfloat16" else None

    return reason


def measure_all(groups, skip, rounds, budget, peaks, run=run_group):
    """Results of every contender of ``groups``, in order: the skipped ones noted (``skip``: contender ->
    reason or None), the others measured a group at a time by ``run`` (:func:`run_group`)."""
    results = []
    for group in groups:
        runnable = [c for c in group if skip(c) is None]
        measured = iter(run(runnable, rounds, budget, peaks) if runnable else [])
        results += [Result.of(c, skip(c)) if skip(c) else next(measured) for c in group]
    return results


# ---- reporting ------------------------------------------------------------------------

def compare(results, peaks, bf16):
    """Sets each measured result's MFU (against the peak of :func:`peak_dtype`) and, for ours and the matmul
    bound (:func:`matmul_bound_step`), the best peer on the same batches at the same size and precision, and
    the ratio to it."""
    def key(r):
        return r.batches, r.size, r.precision

    best = {}
    for r in results:
        if r.contender in PEERS and r.target_tokens_per_sec:
            if key(r) not in best or r.target_tokens_per_sec > best[key(r)].target_tokens_per_sec:
                best[key(r)] = r
    for r in results:
        if r.target_tokens_per_sec is None:
            continue
        r.mfu = r.flops_per_sec / 1e9 / peaks[peak_dtype(r.precision, bf16)]
        peer = best.get(key(r))
        if r.contender in ("ours", BOUND) and peer:
            r.best_peer, r.vs_best_peer = peer.contender, r.target_tokens_per_sec / peer.target_tokens_per_sec


def table(results):
    """A markdown table of :func:`compare`'d results; a result without figures shows its note."""
    header = ("contender", "size", "precision", "XLA", "steps a round", "target tokens/s", "x best peer", "MFU",
              "note")
    rows = []
    for r in results:
        figures = ((str(r.steps), f"{r.target_tokens_per_sec:,.0f}", f"{r.mfu:.1%}")
                   if r.target_tokens_per_sec is not None else ("-", "-", "-"))
        ratio = "-" if r.vs_best_peer is None else f"{r.vs_best_peer:.2f}x ({r.best_peer})"
        rows.append((r.contender, r.size, r.precision, "on" if r.xla else "off", figures[0], figures[1], ratio,
                     figures[2], r.note or ""))
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    lines = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in [header] + rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def tables(results, batch_sets, cpu):
    """One :func:`table` per batch set name, in the results' order, each under a line naming the batches and one
    naming the CPU (model and speed flags)."""
    out = []
    for name in dict.fromkeys(r.batches for r in results):
        heading = next(s.describe() for s in batch_sets if s.name == name)
        out += [f"{heading}\nCPU: {cpu}\n", table([r for r in results if r.batches == name]), ""]
    return "\n".join(out)


def parser():
    """The command line's parser."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", choices=("real", "synthetic", "both"), default="both",
                   help="real: the trainer's batches of --data; synthetic: random lengths padded to 24; "
                        "both, real first (default: %(default)s)")
    p.add_argument("--data", default=corpus.DEFAULT_CORPUS,
                   help="corpus directory or embedded corpus of the real batches (default: %(default)s)")
    p.add_argument("--steps", type=int, default=30,
                   help="timed steps of each small non-XLA run on 1024-token or synthetic batches; 4096-token "
                        "batches take a quarter, XLA and base-size runs a fifth, at least 6 (default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3,
                   help="contenders of one group take turns this many times; the best turn counts "
                        "(default: %(default)s)")
    p.add_argument("--quick", action="store_true",
                   help=f"--steps 6 --rounds 2 (4096-token and base-size batches: 2 steps, 1 round), one warm-up "
                        f"step, --timeout {QUICK_TIMEOUT} at most, no XLA runs: a rough figure")
    p.add_argument("--only", help="run only the contenders whose 'name size precision XLA on|off batches' label "
                                  "contains this, e.g. 'small float32 XLA off real'")
    p.add_argument("--bf16", choices=("auto", "force", "off"), default="auto",
                   help="mixed_bfloat16 contenders: auto runs them where the CPU has avx512_bf16 or amx_bf16, "
                        "force runs them anyway (emulated: many times slower) (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=600,
                   help="seconds each contender may spend (build, trace, warm-up, its turns) before its group's "
                        "process is stopped; it is reported as timed out, the others keep their figures "
                        "(default: %(default)s)")
    p.add_argument("--json", help="also write the figures here")
    return p


def planned_groups(args, steps):
    """The groups ``args`` ask for (:func:`contender_groups`, :func:`selected_groups`), real batches made first.

    Raises:
      UserError: ``--data`` holds no corpus, or ``--only`` selects nothing.
    """
    real = real_batch_sets(args.data, WARMUP_STEPS + steps) if args.batches != "synthetic" else []
    groups = selected_groups(contender_groups(steps, args.quick, real, args.batches != "real"), args.only)
    if not groups:
        raise UserError(f"--only {args.only}: no contender's label contains it")
    return groups


def print_report(results, batch_sets, peaks, bf16, cpu, command):
    """The tables (:func:`tables`) and what their columns mean."""
    print("\n" + tables(results, batch_sets, cpu))
    emulated = "" if bf16 else " (mixed_bfloat16 against the float32 peak: the CPU has no bfloat16 instructions)"
    print(f"small = 3+3 blocks, 256 units, 4 heads, d_ff 1024; base = 6+6 blocks, 512 units, 8 heads, d_ff 2048. "
          f"x best peer: ours over the faster of keras-hub and tf-models on the same batches, size and precision. "
          f"MFU: model FLOPs of the real work (non-pad tokens only) over the highest matmul peak measured in this "
          f"run: {peak_line(peaks)}{emulated}.\ncommand: {command}")


def main(argv=None):
    args_parser = parser()
    args = args_parser.parse_args(argv)
    steps, rounds = (6, 2) if args.quick else (args.steps, args.rounds)
    timeout = min(args.timeout, QUICK_TIMEOUT) if args.quick else args.timeout
    if steps < 1 or rounds < 1:
        args_parser.error(f"--steps {steps} --rounds {rounds}: both must be at least 1")
    if not timeout > 0:
        args_parser.error(f"--timeout {args.timeout}: must be positive")
    command = shlex.join(["python", "bench/train.py"] + (sys.argv[1:] if argv is None else list(argv)))
    cpu = f"{cpu_model()} ({cpu_speed_flags()}), {os.cpu_count()} CPUs"
    print(f"{cpu}, TensorFlow {tf.__version__}, Keras {keras.__version__}", flush=True)
    try:
        groups = planned_groups(args, steps)
    except UserError as e:
        args_parser.error(str(e))
    batch_sets = list({id(group[0].batches): group[0].batches for group in groups}.values())
    for batch_set in batch_sets:
        print(batch_set.describe())
    missing, bf16_reason, bf16 = missing_peers(), bf16_skip_reason(args.bf16), has_bf16()
    for name, reason in missing.items():
        print(f"{name} skipped: it does not import ({reason}); {INSTALL}")
    if bf16_reason:
        print(f"mixed_bfloat16 contenders {bf16_reason}")
    skip = skip_reasons(missing, bf16_reason)
    peaks = measure_peaks(peak_dtypes([c for group in groups for c in group if skip(c) is None], bf16))
    print("matmul peak at the start: " + peak_line(peaks), flush=True)

    results = measure_all(groups, skip, rounds, timeout, peaks)
    compare(results, peaks, bf16)
    print_report(results, batch_sets, peaks, bf16, cpu, command)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "cpu": cpu_model(), "cpu_flags": cpu_speed_flags(),
                       "cores": os.cpu_count(), "peak_gflops": peaks, "skipped": missing,
                       "bf16_skipped": bf16_reason, "batch_sets": [batch_set_json(s) for s in batch_sets],
                       "results": [dataclasses.asdict(r) for r in results]}, f, indent=2)


def peak_line(peaks):
    """``"float32 X GFLOP/s, bfloat16 Y GFLOP/s"`` for the peaks measured."""
    return ", ".join(f"{name} {value:.0f} GFLOP/s" for name, value in sorted(peaks.items(), reverse=True))


def batch_set_json(batch_set):
    """What the JSON says of a :class:`BatchSet`."""
    return {"name": batch_set.name, "origin": batch_set.origin, "vocab": batch_set.vocab,
            "batches": len(batch_set.batches), "padding": batch_set.padding}


if __name__ == "__main__":
    main()

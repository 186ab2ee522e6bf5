"""The training benchmark's contenders (``bench/train.py``): ours, keras-hub's and tf-models' Transformers and
their training steps, the matmul bound, and a contender's figures (:class:`Result`)."""

import contextlib
import dataclasses

import keras
import numpy as np
import tensorflow as tf

from bench.peers import (KerasHubTransformer, keras_hub_train_step, plain_step,
                         tf_keras_policy, tf_models_optimizer, tf_models_transformer)
from bench.train_batches import BatchSet
from bench.train_torch import TORCH, TORCH_COMPILE, TORCH_CONTENDERS, torch_compile_step, torch_step
from tf_transformer.nn.model import Transformer
from tf_transformer.train.step import make_optimizer, make_train_step, precision_policy

WARMUP_STEPS = 2


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
BUILDERS = {"ours": our_step, "keras-hub": keras_hub_step, "tf-models": tf_models_step, BOUND: matmul_bound_step,
            TORCH: torch_step, TORCH_COMPILE: torch_compile_step}
PEERS = ("keras-hub", "tf-models")


@dataclasses.dataclass
class Contender:
    """One model and training step to time, on its group's batches."""

    name: str  # ours | keras-hub | tf-models | torch | torch-compile (a key of BUILDERS)
    size: str  # small | base
    hp: object  # HParams: size, precision, jit_compile
    steps: int  # timed steps in all
    batches: BatchSet
    warmup_steps: int = WARMUP_STEPS
    step: object = None
    warmup_seconds: float = None  # its build, trace or compile, and warm-up steps, once measured

    def build(self):
        """The contender's step(x, y), built (and later warmed up) under its precision policy."""
        return BUILDERS[self.name](self.hp, self.batches)

    def policy(self):
        """The global dtype policy its layers take when built: Keras 3's, or tf_keras' for tf-models; none for
        torch (its step autocasts)."""
        if self.name in TORCH_CONTENDERS:
            return contextlib.nullcontext()
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
    warmup_seconds: float = None  # build, trace or compile, and warm-up steps
    best_torch: str = None  # the faster of torch and torch-compile on the same batches, size and precision
    vs_torch: float = None  # ours over it

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
        self.warmup_seconds = self.warmup_seconds or measured.warmup_seconds
        self.rounds += 1

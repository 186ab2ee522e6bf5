"""The fused sub-layer tail (:mod:`tf_transformer.nn.fused`) against the unfused one, on whole training steps.

For the ``small`` preset (constant learning rate) and the ``debian`` preset's sizes (one block, no dropout),
in float32 and mixed bfloat16: the trainer's step (:func:`bench.train_contenders.our_step`) of each variant
on the same real batches (:func:`bench.train_batches.real_batch_sets`, ``ding-de-en``, 1024-token
batches), built and warmed up on every batch (each batch shape traced), then timed in alternating rounds
in this one process (A, B, A, B, ...): the best round's target tokens per second of wall time and of CPU
time (``time.process_time``, less sensitive to other processes on the machine), and their ratios.

Variants: ``unfused``, the sub-layers' tail as Keras' ``Dropout``, an add and :class:`LayerNorm`
(``modules.residual_norm`` replaced while the step is built and traced); ``fused``, the library's;
``fused-xla``, the same computation as two XLA islands (:func:`_xla_tail`), compiled for each batch shape
during the warm-up (in training, each new number of real tokens would compile again).

Measured 2026-11-26 on the 2-core AMD EPYC (avx2 avx512f avx512_bf16, shared with other jobs: compare the CPU
time ratios), 8 batches, best of 3 rounds: ``fused`` 1.042x (small float32), 1.004x (small mixed bfloat16),
1.032x (debian float32), 1.030x (debian mixed bfloat16) the CPU-time tokens/s of ``unfused``; ``fused-xla``
0.148x (small float32), its first pass 308 s against 38 s: not used.

    python bench/fused_norm.py --rounds 5
    python bench/fused_norm.py --batches 8 --presets debian --precisions float32 --variants fused
"""

import argparse
import contextlib
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.train_batches import real_batch_sets  # noqa: E402
from bench.train_contenders import our_step  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.nn import fused, modules  # noqa: E402
from tf_transformer.train.step import precision_policy  # noqa: E402


def unfused_residual_norm(layer_norm, dropout, outputs, residual, training):
    """The tail before fusing: Keras' dropout, the residual add, :class:`LayerNorm` (autodiff's gradient)."""
    return layer_norm(dropout(outputs, training=training) + residual)


def _xla_tail(rate, epsilon):
    """The fused tail as two XLA islands (``tf.function(jit_compile=True)``): a forward that writes only
    its output, and a backward that recomputes the dropout mask (from the seed) and the statistics and
    writes only the four gradients. (outputs, residual, gamma, beta, seed) -> output."""
    def inputs_of_norm(outputs, residual, seed):
        keep = fused.keep_multiplier(tf.shape(outputs), rate, seed, outputs.dtype) if rate else 1
        return keep, tf.cast(outputs * keep + residual, tf.float32)

    @tf.function(jit_compile=True)
    def forward(outputs, residual, gamma, beta, seed):
        x_hat, _ = fused.normalize(inputs_of_norm(outputs, residual, seed)[1], epsilon)
        return tf.cast(x_hat * gamma + beta, outputs.dtype)

    @tf.function(jit_compile=True)
    def backward(dy, outputs, residual, gamma, seed):
        keep, x = inputs_of_norm(outputs, residual, seed)
        dx, dgamma, dbeta = fused.layer_norm_gradient(tf.cast(dy, tf.float32), *fused.normalize(x, epsilon), gamma)
        d_residual = tf.cast(dx, outputs.dtype)
        return d_residual * keep, d_residual, dgamma, dbeta

    def tail(outputs, residual, gamma, beta, seed):
        @tf.custom_gradient
        def island(outputs, residual, gamma, beta):
            return forward(outputs, residual, gamma, beta, seed), lambda dy: backward(dy, outputs, residual,
                                                                                      gamma, seed)
        return island(outputs, residual, gamma, beta)

    return tail


def xla_residual_norm(layer_norm, dropout, outputs, residual, training):
    """:func:`modules.residual_norm` with the tail compiled by XLA (:func:`_xla_tail`)."""
    rate = dropout.rate if training else 0.0
    seed = dropout.seed_generator.next() if rate else tf.zeros([2], tf.int64)
    gamma, beta = (tf.cast(w, tf.float32) for w in (layer_norm.gamma, layer_norm.beta))
    return _xla_tail(rate, layer_norm.epsilon)(outputs, residual, gamma, beta, seed)


VARIANTS = {"unfused": unfused_residual_norm, "fused": modules.residual_norm, "fused-xla": xla_residual_norm}


@contextlib.contextmanager
def variant(name):
    """``modules.residual_norm`` is variant ``name``'s inside the block."""
    original = modules.residual_norm
    modules.residual_norm = VARIANTS[name]
    try:
        yield
    finally:
        modules.residual_norm = original


def run(step, tensors):
    """(wall seconds, CPU seconds) of ``step`` over every batch of ``tensors``."""
    wall, cpu = time.perf_counter(), time.process_time()
    for x, y in tensors:
        loss, _ = step(x, y)
    loss.numpy()
    return time.perf_counter() - wall, time.process_time() - cpu


def compare(hp, batch_set, rounds, names=tuple(VARIANTS)):
    """{variant: (best tokens/s of wall time, of CPU time)} of ``hp``'s step for the variants ``names``
    (``unfused`` first), alternating rounds."""
    tensors = [(tf.constant(x), tf.constant(y)) for x, y in batch_set.batches]
    tokens = sum(int(np.count_nonzero(y)) for _, y in batch_set.batches)
    steps = {}
    with precision_policy(hp.precision):
        for name in names:
            with variant(name):
                steps[name] = our_step(hp, batch_set)
                warmup = run(steps[name], tensors)[0]  # traces (and compiles) every batch shape with this variant
                print(f"  {name}: first pass over the batches (tracing, compiling) {warmup:.1f} s", flush=True)
        best = {name: [0.0, 0.0] for name in names}
        for _ in range(rounds):
            for name, step in steps.items():
                seconds = run(step, tensors)
                best[name] = [max(b, tokens / s) for b, s in zip(best[name], seconds)]
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=24)
    p.add_argument("--presets", nargs="+", default=["small", "debian"])
    p.add_argument("--precisions", nargs="+", default=["float32", "mixed_bfloat16"])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS),
                   help="compared with unfused, always run (default: all)")
    args = p.parse_args(argv)
    names = ["unfused"] + [name for name in args.variants if name != "unfused"]
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {cpu_model()} ({cpu_speed_flags()}), "
          f"{os.cpu_count()} CPUs; TensorFlow {tf.__version__}")
    (batch_set,) = real_batch_sets("ding-de-en", args.batches, (1024,))
    print(batch_set.describe(), flush=True)
    for preset in args.presets:
        for precision in args.precisions:
            hp = load_hparams(preset).replace(lr_schedule="constant", precision=precision)
            best = compare(hp, batch_set, args.rounds, names)
            (uw, uc) = best["unfused"]
            print(f"{preset} {precision}, target tokens/s of wall time (of CPU time): " + "; ".join(
                f"{name} {w:,.0f} ({c:,.0f}), {w / uw:.3f}x ({c / uc:.3f}x)" for name, (w, c) in best.items()),
                flush=True)


if __name__ == "__main__":
    main()

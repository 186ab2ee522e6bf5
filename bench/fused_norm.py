"""The fused sub-layer tail (:mod:`tf_transformer.nn.fused`) against the unfused one, on whole training steps.

For the ``small`` preset (constant learning rate) and the ``debian`` preset's sizes (one block, no dropout),
in float32 and mixed bfloat16: the trainer's step (:func:`bench.train_contenders.our_step`) of each variant
on the same real batches (:func:`bench.train_batches.real_batch_sets`, ``ding-de-en``, 1024-token
batches), built and warmed up on every batch (each batch shape traced), then timed in alternating rounds
in this one process (A, B, A, B, ...): the best round's target tokens per second of wall time and of CPU
time (``time.process_time``, less sensitive to other processes on the machine), and their ratios.

Variants (the tail's form, and whether training packs its rows to bucketed counts, :class:`Packing`'s
``bucketed``): ``unfused``, Keras' ``Dropout``, an add and :class:`LayerNorm`, unbucketed; ``fused``, the
fused tail in plain TensorFlow ops (:func:`~tf_transformer.nn.fused.residual_layer_norm`), unbucketed (the
library until 2026-11-26); ``bucketed-fused``, the same on bucketed rows (what the dummy rows cost);
``compiled``, the library's: bucketed rows and the tail as two XLA computations (``compiled=True``).
``modules.residual_norm`` and ``modules.Packing`` are replaced while each variant's step is built and traced.

Measured 2026-11-26 on the 2-core AMD EPYC (avx2 avx512f avx512_bf16, shared with other jobs: compare the CPU
time ratios), 8 batches, best of 3 rounds: ``fused`` 1.042x (small float32), 1.004x (small mixed bfloat16),
1.032x (debian float32), 1.030x (debian mixed bfloat16) the CPU-time tokens/s of ``unfused``. An XLA tail
without bucketing (its dropout's numbers drawn inside XLA, compiled for each batch's row count) was 0.148x
(small float32), its first pass 308 s against 38 s.

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
from tf_transformer.nn import modules  # noqa: E402
from tf_transformer.train.step import precision_policy  # noqa: E402


def unfused_residual_norm(layer_norm, dropout, outputs, residual, training, compiled=False):
    """The tail before fusing: Keras' dropout, the residual add, :class:`LayerNorm` (autodiff's gradient)."""
    return layer_norm(dropout(outputs, training=training) + residual)


def plain_residual_norm(layer_norm, dropout, outputs, residual, training, compiled=False):
    """:func:`modules.residual_norm` in plain TensorFlow ops whatever the rows."""
    return LIBRARY_RESIDUAL_NORM(layer_norm, dropout, outputs, residual, training, compiled=False)


class UnbucketedPacking(modules.Packing):
    """:class:`modules.Packing` that never pads the rows to a bucketed count."""

    def __init__(self, masks, bucketed=False):
        super().__init__(masks, bucketed=False)


LIBRARY_RESIDUAL_NORM, LIBRARY_PACKING = modules.residual_norm, modules.Packing
# name: (the sub-layers' tail, the packing)
VARIANTS = {"unfused": (unfused_residual_norm, UnbucketedPacking),
            "fused": (plain_residual_norm, UnbucketedPacking),
            "bucketed-fused": (plain_residual_norm, LIBRARY_PACKING),
            "compiled": (LIBRARY_RESIDUAL_NORM, LIBRARY_PACKING)}


@contextlib.contextmanager
def variant(name):
    """``modules.residual_norm`` and ``modules.Packing`` are variant ``name``'s inside the block."""
    modules.residual_norm, modules.Packing = VARIANTS[name]
    try:
        yield
    finally:
        modules.residual_norm, modules.Packing = LIBRARY_RESIDUAL_NORM, LIBRARY_PACKING


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

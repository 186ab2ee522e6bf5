"""Training throughput: non-pad target tokens per second, every contender on the same batches, one run.

Contenders:

* ours: :class:`tf_transformer.model.Transformer` through the trainer's own
  ``make_train_step(model, make_optimizer(hp), hp)`` (:mod:`tf_transformer.training`),
  at the ``small`` preset (3+3 blocks, 256 units, 4 heads, d_ff 1024) and at
  the blog's base size (``small`` with 6+6 blocks, 512 units, 8 heads, d_ff
  2048), each in float32 and mixed_bfloat16, each without and with XLA
  (``jit_compile``);
* keras-hub: ``TokenAndPositionEmbedding`` + 3 ``TransformerEncoder`` + 3
  ``TransformerDecoder`` + a dense output at the small size, dropout 0.1, the
  same Adam (``make_optimizer``) and label-smoothed cross-entropy
  (:func:`~tf_transformer.model.masked_loss`), float32 and mixed_bfloat16.
  Skipped with a message when keras-hub is not installed
  (``pip install -r bench/requirements.txt``).

Every contender trains on the same synthetic batches: 64 pairs, source and
target lengths drawn uniformly from 5-24 tokens (``</S>`` included), vocabulary
8000, padded to 24. Each is timed with ``time.perf_counter`` over many steps
after warm-up steps (the first traces and compiles), never one step alone;
contenders of one size take turns (``--rounds``) and keep their best turn, so
that other processes on the machine slow them alike. Each group (one size, XLA
on or off) runs in a fresh process, stopped after ``--timeout`` seconds.

It also measures a matmul peak in the same run (large float32 and bfloat16
``tf.matmul`` in a ``tf.function``, at the start and in every round, the
highest kept) and reports model FLOP utilisation (:func:`train_flops`) against
the peak of the contender's compute precision.

    python bench/train.py                 # everything (a few minutes on 2 cores)
    python bench/train.py --quick         # fewer steps, a rough figure
    python bench/train.py --steps 40 --json /tmp/train-bench.json
"""

import argparse
import dataclasses
import json
import multiprocessing
import os
import platform
import queue
import shlex
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.peers import KerasHubTransformer, keras_hub_missing  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.model import Transformer, masked_loss, shift_right  # noqa: E402
from tf_transformer.training import make_optimizer, make_train_step, precision_policy  # noqa: E402
from tf_transformer.vocab import EOS_ID, PAD_ID  # noqa: E402

VOCAB = 8000
PAIRS, MIN_TOKENS, MAX_TOKENS = 64, 5, 24
BASE_SIZE = {"num_blocks": 6, "num_units": 512, "num_heads": 8, "d_ff": 2048}
WARMUP_STEPS = 2
DISTINCT_BATCHES = 8
PEAK_SIZE = 2048  # the matmul peak multiplies two PEAK_SIZE x PEAK_SIZE matrices


@dataclasses.dataclass
class Result:
    contender: str
    size: str
    precision: str
    xla: bool
    steps: int
    seconds: float
    target_tokens_per_sec: float  # None: it did not finish within --timeout
    flops_per_sec: float
    vs_keras_hub: float = None
    mfu: float = None


def synthetic_batches(count=DISTINCT_BATCHES, seed=0):
    """``count`` (x, y) batches of (PAIRS, MAX_TOKENS) int32 ids: real tokens from [4, VOCAB),
    ``</S>`` last, then ``<PAD>``; lengths uniform in [MIN_TOKENS, MAX_TOKENS]."""
    rng = np.random.default_rng(seed)

    def side():
        ids = rng.integers(4, VOCAB, size=(PAIRS, MAX_TOKENS)).astype(np.int32)
        lengths = rng.integers(MIN_TOKENS, MAX_TOKENS + 1, size=PAIRS)
        for row, length in enumerate(lengths):
            ids[row, length - 1] = EOS_ID
            ids[row, length:] = PAD_ID
        return tf.constant(ids)

    return [(side(), side()) for _ in range(count)]


def train_flops(batch, source_length, target_length, targets, num_units, d_ff, num_blocks, vocab):
    """Model FLOPs of one training step of the encoder-decoder, counting matmuls only.

    A matmul of (m, k) by (k, n) is ``2*m*n*k`` FLOPs; the backward pass costs
    twice the forward (a gradient for each operand), so a step is ``3 * F``.
    With B pairs padded to S source and T target positions, C = ``num_units``,
    d_ff, L blocks a side, V the target vocabulary and M the non-pad targets::

      encoder block:  8*B*S*C^2          Q, K, V, W^O projections
                    + 4*B*S^2*C          scores Q K^T and weights @ V (all heads together)
                    + 4*B*S*C*d_ff       feed-forward C -> d_ff -> C
      decoder block:  8*B*T*C^2 + 4*B*T^2*C                  causal self-attention (full T x T)
                    + 4*B*T*C^2 + 4*B*S*C^2 + 4*B*T*S*C      attention over the encoder (Q, W^O on T; K, V on S)
                    + 4*B*T*C*d_ff                           feed-forward
      output:         2*M*C*V            the projection to the vocabulary, for the M real targets

      F = L * (encoder block + decoder block) + output

    Padded positions count everywhere except the output projection, which a
    model need only compute for real targets (ours does; one that projects
    every position does more work than this count). Embeddings, softmax,
    layer norm and the optimizer are not matmuls and are left out. The same
    formula serves every contender of the same size, so at equal size the
    MFU ratio is the throughput ratio.
    """
    B, S, T, C = batch, source_length, target_length, num_units
    encoder = 8 * B * S * C**2 + 4 * B * S**2 * C + 4 * B * S * C * d_ff
    decoder = (8 * B * T * C**2 + 4 * B * T**2 * C
               + 4 * B * T * C**2 + 4 * B * S * C**2 + 4 * B * T * S * C
               + 4 * B * T * C * d_ff)
    output = 2 * targets * C * vocab
    return 3 * (num_blocks * (encoder + decoder) + output)


def batch_flops(batches, hp):
    return sum(train_flops(int(x.shape[0]), int(x.shape[1]), int(y.shape[1]), int(np.count_nonzero(y)),
                           hp.num_units, hp.d_ff, hp.num_blocks, VOCAB) for x, y in batches)


def our_step(hp):
    """The trainer's compiled step for a fresh model of ``hp``: (x, y) -> (loss, accuracy)."""
    keras.utils.set_random_seed(hp.seed)
    model = Transformer.from_hparams(hp, VOCAB, VOCAB)
    return make_train_step(model, make_optimizer(hp), hp)


def keras_hub_step(hp):
    """The same step as ours, written plainly: tape, masked label-smoothed loss, Adam."""
    keras.utils.set_random_seed(hp.seed)
    model = KerasHubTransformer(hp, VOCAB, VOCAB, MAX_TOKENS)
    optimizer = make_optimizer(hp)  # the same Adam as ours
    spec = tf.TensorSpec([None, None], tf.int32)

    @tf.function(input_signature=[spec, spec])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            logits = model((x, shift_right(y)), training=True)
            loss = masked_loss(y, logits, hp.label_smoothing)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    return train_step


@dataclasses.dataclass
class Contender:
    name: str  # ours | keras-hub
    size: str  # small | base
    hp: object  # HParams: size, precision, jit_compile
    build: object  # hp -> step(x, y)
    steps: int  # timed steps in all
    step: object = None
    setup_seconds: float = 0.0

    @property
    def label(self):
        return f"{self.name} {self.size} {self.hp.precision} XLA {'on' if self.hp.jit_compile else 'off'}"


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def warm_up(contender, batches):
    """Builds the model and its step under the contender's precision and runs WARMUP_STEPS steps
    (the first traces, and with XLA compiles)."""
    started = time.perf_counter()
    with precision_policy(contender.hp.precision):  # layers keep the policy they were built with
        contender.step = contender.build(contender.hp)
        for i in range(WARMUP_STEPS):
            outputs = contender.step(*batches[i % len(batches)])
        _first(outputs).numpy()
    contender.setup_seconds = time.perf_counter() - started


def timed_steps(step, batches):
    """Seconds for ``step`` over ``batches``, one after the other."""
    started = time.perf_counter()
    for x, y in batches:
        outputs = step(x, y)
    _first(outputs).numpy()  # steps run in order (each reads the last one's weights): the last ends them all
    return time.perf_counter() - started


def measure_group(group, batches, rounds, peaks):
    """Times contenders in turns: ``rounds`` rounds, each running every contender for its
    ``steps / rounds`` steps (at least 2), so that load from other processes falls on all of them
    alike; a contender's figure is its best round. Each round also measures the matmul peaks again,
    keeping the highest in ``peaks``. Returns a list of :class:`Result`."""
    for contender in group:
        warm_up(contender, batches)
    best = {id(c): None for c in group}
    offset = WARMUP_STEPS
    for _ in range(rounds):
        update_peaks(peaks)
        for contender in group:
            per_round = max(2, contender.steps // rounds)
            chunk = [batches[(offset + i) % len(batches)] for i in range(per_round)]
            seconds = timed_steps(contender.step, chunk)
            tokens = sum(int(np.count_nonzero(y)) for _, y in chunk)
            result = Result(contender.name, contender.size, contender.hp.precision, contender.hp.jit_compile,
                            per_round, seconds, tokens / seconds, batch_flops(chunk, contender.hp) / seconds)
            if best[id(contender)] is None or result.target_tokens_per_sec > best[id(contender)].target_tokens_per_sec:
                best[id(contender)] = result
        offset += max(c.steps // rounds for c in group)
    results = [best[id(c)] for c in group]
    for contender, result in zip(group, results):
        print(f"  {contender.label:<34} best of {rounds} rounds of {result.steps} steps: "
              f"{result.target_tokens_per_sec:7.0f} target tokens/s ({result.seconds / result.steps:.2f}s a step; "
              f"build, trace, {WARMUP_STEPS} warm-up steps: {contender.setup_seconds:.0f}s)", flush=True)
        contender.step = None  # let the model go before the next group
    return results


def update_peaks(peaks):
    """Measures both matmul peaks again; ``peaks`` keeps the highest of each seen so far."""
    for name, dtype in (("float32", tf.float32), ("bfloat16", tf.bfloat16)):
        peaks[name] = max(peaks.get(name, 0.0), matmul_peak(dtype))


def matmul_peak(dtype, size=PEAK_SIZE, repeats=10):
    """GFLOP/s of a (size, size) @ (size, size) ``tf.matmul`` in a ``tf.function``, best of 3 runs."""
    a = tf.random.normal([size, size], dtype=tf.float32)
    b = tf.random.normal([size, size], dtype=tf.float32)
    a, b = tf.cast(a, dtype), tf.cast(b, dtype)
    matmul = tf.function(lambda a, b: tf.matmul(a, b)[0, 0])
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            last = matmul(a, b)
        last.numpy()
        best = min(best, (time.perf_counter() - started) / repeats)
    return 2 * size**3 / best / 1e9


def contender_groups(steps, quick):
    """Lists of :class:`Contender` timed together (same size and XLA setting), in the order they run."""
    small = load_hparams("small").replace(lr_schedule="constant")
    base = small.replace(**BASE_SIZE)
    slow_steps = max(6, steps // 5)  # XLA on a CPU, and the base size, are several times slower a step
    precisions = ("float32", "mixed_bfloat16")
    groups = [
        [Contender(name, "small", small.replace(precision=p), build, steps)
         for p in precisions for name, build in (("keras-hub", keras_hub_step), ("ours", our_step))],
        [Contender("ours", "small", small.replace(precision=p, jit_compile=True), our_step, slow_steps)
         for p in precisions],
        [Contender("ours", "base", base.replace(precision=p), our_step, slow_steps) for p in precisions],
    ]
    if not quick:
        groups.append([Contender("ours", "base", base.replace(precision=p, jit_compile=True), our_step, 2)
                       for p in precisions])
    return groups


def selected_groups(steps, quick, only, skip_keras_hub):
    """:func:`contender_groups` without the contenders left out; empty groups dropped."""
    groups = [[c for c in group
               if not (c.name == "keras-hub" and skip_keras_hub) and not (only and only not in c.label)]
              for group in contender_groups(steps, quick)]
    return [group for group in groups if group]


def _group_child(index, steps, quick, only, skip_keras_hub, rounds, outbox):
    group = selected_groups(steps, quick, only, skip_keras_hub)[index]
    rounds = rounds if all(c.steps >= 2 * rounds for c in group) else 1
    peaks = {}
    results = measure_group(group, synthetic_batches(), rounds, peaks)
    outbox.put(([dataclasses.asdict(r) for r in results], peaks))


def run_group(index, group, steps, quick, only, skip_keras_hub, rounds, timeout, peaks):
    """Measures one group in a fresh process (memory back after each group, and a hung or very slow
    compile cannot stall the run): its results, or results without figures after ``timeout`` seconds."""
    context = multiprocessing.get_context("spawn")
    outbox = context.Queue()
    child = context.Process(target=_group_child, args=(index, steps, quick, only, skip_keras_hub, rounds, outbox))
    child.start()
    try:
        found, child_peaks = outbox.get(timeout=timeout)
    except queue.Empty:
        found = None
    child.join(timeout=30)
    if child.is_alive():
        child.terminate()
        child.join()
    if found is None:
        print(f"  {', '.join(c.label for c in group)}: no result within --timeout {timeout:.0f}s", flush=True)
        return [Result(c.name, c.size, c.hp.precision, c.hp.jit_compile, 0, timeout, None, None) for c in group]
    for name, value in child_peaks.items():
        peaks[name] = max(peaks.get(name, 0.0), value)
    return [Result(**r) for r in found]


def table(results, peaks, timeout):
    hub = {r.precision: r.target_tokens_per_sec for r in results if r.contender == "keras-hub"}
    header = ("contender", "size", "precision", "XLA", "steps a round", "target tokens/s", "x keras-hub", "MFU")
    rows = []
    for r in results:
        if r.target_tokens_per_sec is None:
            rows.append((r.contender, r.size, r.precision, "on" if r.xla else "off", "-",
                         f"none in {timeout:.0f}s", "-", "-"))
            continue
        peak = peaks["bfloat16" if r.precision == "mixed_bfloat16" else "float32"]
        r.mfu = r.flops_per_sec / 1e9 / peak
        if r.size == "small" and hub.get(r.precision):
            r.vs_keras_hub = r.target_tokens_per_sec / hub[r.precision]
        rows.append((r.contender, r.size, r.precision, "on" if r.xla else "off", str(r.steps),
                     f"{r.target_tokens_per_sec:,.0f}",
                     "-" if r.vs_keras_hub is None else f"{r.vs_keras_hub:.2f}x", f"{r.mfu:.1%}"))
    widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
    lines = ["| " + " | ".join(str(c).ljust(w) for c, w in zip(row, widths)) + " |" for row in [header] + rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=30,
                        help="timed steps of each small non-XLA run; XLA and base-size runs take a fifth, at "
                             "least 6 (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="contenders of one size take turns this many times; the best turn counts "
                             "(default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="--steps 6 --rounds 2, --timeout 300 at most, no base-size XLA run: a rough figure")
    parser.add_argument("--only", help="run only the contenders whose 'name size precision XLA on|off' label "
                                       "contains this, e.g. 'small float32 XLA off'")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds a group of contenders (one size, XLA on or off) may take, compiling "
                             "included, before it is stopped and reported without figures (default: %(default)s)")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    steps, rounds = (6, 2) if args.quick else (args.steps, args.rounds)
    timeout = min(args.timeout, 300) if args.quick else args.timeout
    if steps < 1 or rounds < 1:
        parser.error(f"--steps {steps} --rounds {rounds}: both must be at least 1")
    command = shlex.join(["python", "bench/train.py"] + (sys.argv[1:] if argv is None else list(argv)))

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}; batches of {PAIRS} pairs, {MIN_TOKENS}-{MAX_TOKENS} tokens a side, "
          f"vocabulary {VOCAB}", flush=True)
    peaks = {}
    update_peaks(peaks)
    print(f"matmul peak ({PEAK_SIZE}x{PEAK_SIZE}) at the start: float32 {peaks['float32']:.0f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16']:.0f} GFLOP/s", flush=True)

    missing = keras_hub_missing()
    if missing:
        print(f"keras-hub skipped: it does not import ({missing}); pip install -r bench/requirements.txt")
    results = []
    for index, group in enumerate(selected_groups(steps, args.quick, args.only, bool(missing))):
        results += run_group(index, group, steps, args.quick, args.only, bool(missing), rounds, timeout, peaks)

    print()
    print(table(results, peaks, timeout))
    print(f"\nsmall = 3+3 blocks, 256 units, 4 heads, d_ff 1024; base = 6+6 blocks, 512 units, 8 heads, d_ff 2048. "
          f"MFU against the highest matmul peak of the compute precision measured in this run: float32 "
          f"{peaks['float32']:.0f} GFLOP/s, bfloat16 {peaks['bfloat16']:.0f} GFLOP/s.\ncommand: {command}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "peak_gflops": peaks,
                       "results": [dataclasses.asdict(r) for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()

"""Training throughput: non-pad target tokens per second, every contender on the same batches, one run.

Contenders:

* ours: :class:`tf_transformer.model.Transformer` through the trainer's own
  ``make_train_step(model, make_optimizer(hp), hp)`` (:mod:`tf_transformer.training`),
  at the ``small`` preset (3+3 blocks, 256 units, 4 heads, d_ff 1024) and at
  the blog's base size (``small`` with 6+6 blocks, 512 units, 8 heads, d_ff
  2048), each in float32 and mixed_bfloat16, each without and with XLA
  (``jit_compile``);
* keras-hub: ``TokenAndPositionEmbedding`` + ``TransformerEncoder`` and
  ``TransformerDecoder`` blocks + a dense output (:class:`bench.peers.KerasHubTransformer`),
  dropout 0.1, the same Adam (``make_optimizer``) and label-smoothed
  cross-entropy (:func:`~tf_transformer.model.masked_loss`);
* tf-models: ``Seq2SeqTransformer`` (:func:`bench.peers.tf_models_transformer`,
  tf_keras), the same loss, a tf_keras Adam with the same settings; its
  embedding is shared with the output projection (one vocabulary) and the
  projection runs on every target position, pad included (more work than
  :func:`train_flops` counts, which it is not credited for);

the peers at both sizes, float32 and mixed_bfloat16 (tf-models through
tf_keras' policy), without XLA. A peer that does not import is skipped with
the pip command (``bench/requirements.txt``, ``bench/requirements-no-deps.txt``).
"x best peer" is ours over the faster peer at the same size and precision.

Every contender trains on the same synthetic batches: 64 pairs, source and
target lengths drawn uniformly from 5-24 tokens (``</S>`` included), padded
to 24, vocabulary 8000 at the small size and 32000 at the base size. Each is
timed with ``time.perf_counter`` over many steps
after warm-up steps (the first traces and compiles), never one step alone;
contenders of one size take turns (``--rounds``) and keep their best turn, so
that other processes on the machine slow them alike. Each group (one size, XLA
on or off) runs in a fresh process, stopped after ``--timeout`` seconds.

It also measures a matmul peak in the same run (large float32 and bfloat16
``tf.matmul`` in a ``tf.function``, at the start and in every round, the
highest kept) and reports model FLOP utilisation (:func:`train_flops`) against
the peak of the contender's compute precision.

    python bench/train.py                 # everything (about 15 minutes on 2 cores)
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

from bench.peers import (KerasHubTransformer, keras_hub_missing, keras_hub_train_step, plain_step,  # noqa: E402
                         tf_keras_policy, tf_models_missing, tf_models_optimizer, tf_models_transformer)
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.model import Transformer  # noqa: E402
from tf_transformer.cpu import cpu_speed_flags  # noqa: E402
from tf_transformer.training import make_optimizer, make_train_step, precision_policy  # noqa: E402
from tf_transformer.vocab import EOS_ID, PAD_ID  # noqa: E402

VOCAB = {"small": 8000, "base": 32000}  # the vocabulary of each size
PAIRS, MIN_TOKENS, MAX_TOKENS = 64, 5, 24
BASE_SIZE = {"num_blocks": 6, "num_units": 512, "num_heads": 8, "d_ff": 2048}
WARMUP_STEPS = 2
DISTINCT_BATCHES = 8
INSTALL = "pip install -r bench/requirements.txt && pip install --no-deps -r bench/requirements-no-deps.txt"
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
    vocab: int = None
    best_peer: str = None  # the faster of keras-hub and tf-models at this size and precision
    vs_best_peer: float = None
    mfu: float = None


def synthetic_batches(vocab, count=DISTINCT_BATCHES, seed=0):
    """``count`` (x, y) batches of (PAIRS, MAX_TOKENS) int32 ids: real tokens from [4, vocab),
    ``</S>`` last, then ``<PAD>``; lengths uniform in [MIN_TOKENS, MAX_TOKENS]."""
    rng = np.random.default_rng(seed)

    def side():
        ids = rng.integers(4, vocab, size=(PAIRS, MAX_TOKENS)).astype(np.int32)
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


def batch_flops(batches, hp, vocab):
    return sum(train_flops(int(x.shape[0]), int(x.shape[1]), int(y.shape[1]), int(np.count_nonzero(y)),
                           hp.num_units, hp.d_ff, hp.num_blocks, vocab) for x, y in batches)


def our_step(hp, vocab):
    """The trainer's compiled step for a fresh model of ``hp``: (x, y) -> (loss, accuracy)."""
    keras.utils.set_random_seed(hp.seed)
    model = Transformer.from_hparams(hp, vocab, vocab)
    return make_train_step(model, make_optimizer(hp), hp)


def keras_hub_step(hp, vocab):
    """keras-hub's encoder-decoder (:class:`bench.peers.KerasHubTransformer`) and our Adam (``make_optimizer``)."""
    keras.utils.set_random_seed(hp.seed)
    model = KerasHubTransformer(hp, vocab, vocab, MAX_TOKENS)
    return keras_hub_train_step(model, make_optimizer(hp), hp)


def tf_models_step(hp, vocab):
    """tf-models' ``Seq2SeqTransformer`` (:func:`bench.peers.tf_models_transformer`; it shifts the targets
    itself) and a tf_keras Adam with our settings; build and warm it up under :func:`bench.peers.tf_keras_policy`."""
    import tf_keras

    tf_keras.utils.set_random_seed(hp.seed)
    model = tf_models_transformer(hp, vocab)
    return plain_step(lambda x, y: model({"inputs": x, "targets": y}, training=True), model,
                      tf_models_optimizer(hp), hp)


@dataclasses.dataclass
class Contender:
    name: str  # ours | keras-hub | tf-models
    size: str  # small | base
    hp: object  # HParams: size, precision, jit_compile
    steps: int  # timed steps in all
    warmup_steps: int = WARMUP_STEPS
    step: object = None
    setup_seconds: float = 0.0

    @property
    def vocab(self):
        return VOCAB[self.size]

    def build(self):
        """The contender's step(x, y), built (and later warmed up) under its precision policy."""
        return BUILDERS[self.name](self.hp, self.vocab)

    def policy(self):
        """The global dtype policy its layers take when built: Keras 3's, or tf_keras' for tf-models."""
        return (tf_keras_policy if self.name == "tf-models" else precision_policy)(self.hp.precision)

    @property
    def label(self):
        return f"{self.name} {self.size} {self.hp.precision} XLA {'on' if self.hp.jit_compile else 'off'}"


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def warm_up(contender, batches):
    """Builds the model and its step under the contender's precision and runs its warm-up steps
    (the first traces, and with XLA compiles)."""
    started = time.perf_counter()
    with contender.policy():  # layers keep the policy they were built with (tf-models' build in their first call)
        contender.step = contender.build()
        for i in range(contender.warmup_steps):
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
    offset = max(c.warmup_steps for c in group)
    for _ in range(rounds):
        update_peaks(peaks)
        for contender in group:
            per_round = max(2, contender.steps // rounds)
            chunk = [batches[(offset + i) % len(batches)] for i in range(per_round)]
            seconds = timed_steps(contender.step, chunk)
            tokens = sum(int(np.count_nonzero(y)) for _, y in chunk)
            result = Result(contender.name, contender.size, contender.hp.precision, contender.hp.jit_compile,
                            per_round, seconds, tokens / seconds,
                            batch_flops(chunk, contender.hp, contender.vocab) / seconds, contender.vocab)
            if best[id(contender)] is None or result.target_tokens_per_sec > best[id(contender)].target_tokens_per_sec:
                best[id(contender)] = result
        offset += max(c.steps // rounds for c in group)
    results = [best[id(c)] for c in group]
    for contender, result in zip(group, results):
        print(f"  {contender.label:<40} best of {rounds} rounds of {result.steps} steps: "
              f"{result.target_tokens_per_sec:7.0f} target tokens/s ({result.seconds / result.steps:.2f}s a step; "
              f"build, trace, {contender.warmup_steps} warm-up steps: {contender.setup_seconds:.0f}s)", flush=True)
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


BUILDERS = {"ours": our_step, "keras-hub": keras_hub_step, "tf-models": tf_models_step}
PEERS = ("keras-hub", "tf-models")


def contender_groups(steps, quick):
    """Lists of :class:`Contender` timed together (same size and XLA setting), in the order they run.

    The peers run without XLA only (keras-hub's and tf-models' training examples do not compile).
    ``quick``: one warm-up step, no XLA groups, base size 2 steps."""
    small = load_hparams("small").replace(lr_schedule="constant")
    base = small.replace(**BASE_SIZE)
    slow_steps = max(2 if quick else 6, steps // 5)  # XLA on a CPU, and the base size, are several times slower
    precisions = ("float32", "mixed_bfloat16")
    names = PEERS + ("ours",)
    warmup = 1 if quick else WARMUP_STEPS
    groups = [
        [Contender(name, "small", small.replace(precision=p), steps, warmup) for p in precisions for name in names],
        [Contender(name, "base", base.replace(precision=p), slow_steps, warmup) for p in precisions for name in names],
    ]
    if not quick:
        groups.insert(1, [Contender("ours", "small", small.replace(precision=p, jit_compile=True), slow_steps)
                          for p in precisions])
        groups.append([Contender("ours", "base", base.replace(precision=p, jit_compile=True), 2)
                       for p in precisions])
    return groups


def selected_groups(steps, quick, only, skipped):
    """:func:`contender_groups` without the contenders left out (``only``, peers named in ``skipped``);
    empty groups dropped."""
    groups = [[c for c in group if c.name not in skipped and not (only and only not in c.label)]
              for group in contender_groups(steps, quick)]
    return [group for group in groups if group]


def _group_child(index, steps, quick, only, skipped, rounds, outbox):
    group = selected_groups(steps, quick, only, skipped)[index]
    rounds = rounds if all(c.steps >= 2 * rounds for c in group) else 1
    peaks = {}
    results = measure_group(group, synthetic_batches(group[0].vocab), rounds, peaks)
    outbox.put(([dataclasses.asdict(r) for r in results], peaks))


def run_group(index, group, steps, quick, only, skipped, rounds, timeout, peaks):
    """Measures one group in a fresh process (memory back after each group, and a hung or very slow
    compile cannot stall the run): its results, or results without figures after ``timeout`` seconds."""
    context = multiprocessing.get_context("spawn")
    outbox = context.Queue()
    child = context.Process(target=_group_child, args=(index, steps, quick, only, skipped, rounds, outbox))
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
        return [Result(c.name, c.size, c.hp.precision, c.hp.jit_compile, 0, timeout, None, None, c.vocab)
                for c in group]
    for name, value in child_peaks.items():
        peaks[name] = max(peaks.get(name, 0.0), value)
    return [Result(**r) for r in found]


def missing_peers():
    """{peer: why it does not import} for the peers that do not."""
    why = {"keras-hub": keras_hub_missing(), "tf-models": tf_models_missing()}
    return {name: reason for name, reason in why.items() if reason}


def compare(results, peaks):
    """Sets each result's MFU (against the peak of its compute precision) and, for ours, the best peer
    of the same size and precision and the ratio to it."""
    best = {}
    for r in results:
        if r.contender in PEERS and r.target_tokens_per_sec:
            key = r.size, r.precision
            if key not in best or r.target_tokens_per_sec > best[key].target_tokens_per_sec:
                best[key] = r
    for r in results:
        if r.target_tokens_per_sec is None:
            continue
        r.mfu = r.flops_per_sec / 1e9 / peaks["bfloat16" if r.precision == "mixed_bfloat16" else "float32"]
        peer = best.get((r.size, r.precision))
        if r.contender == "ours" and peer:
            r.best_peer, r.vs_best_peer = peer.contender, r.target_tokens_per_sec / peer.target_tokens_per_sec


def table(results, timeout):
    """A markdown table of :func:`compare`'d results."""
    header = ("contender", "size", "precision", "XLA", "steps a round", "target tokens/s", "x best peer", "MFU")
    rows = []
    for r in results:
        xla = "on" if r.xla else "off"
        if r.target_tokens_per_sec is None:
            rows.append((r.contender, r.size, r.precision, xla, "-", f"none in {timeout:.0f}s", "-", "-"))
            continue
        ratio = "-" if r.vs_best_peer is None else f"{r.vs_best_peer:.2f}x ({r.best_peer})"
        rows.append((r.contender, r.size, r.precision, xla, str(r.steps), f"{r.target_tokens_per_sec:,.0f}",
                     ratio, f"{r.mfu:.1%}"))
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
                        help="--steps 6 --rounds 2 (base size: 2 steps, 1 round), one warm-up step, --timeout 300 at "
                             "most, no XLA runs: a rough figure")
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

    print(f"{platform.processor() or platform.machine()} ({cpu_speed_flags()}), {os.cpu_count()} CPUs, TensorFlow {tf.__version__}, "
          f"Keras {keras.__version__}; batches of {PAIRS} pairs, {MIN_TOKENS}-{MAX_TOKENS} tokens a side, "
          f"vocabulary {VOCAB['small']} (small) or {VOCAB['base']} (base)", flush=True)
    peaks = {}
    update_peaks(peaks)
    print(f"matmul peak ({PEAK_SIZE}x{PEAK_SIZE}) at the start: float32 {peaks['float32']:.0f} GFLOP/s, "
          f"bfloat16 {peaks['bfloat16']:.0f} GFLOP/s", flush=True)

    missing = missing_peers()
    for name, reason in missing.items():
        print(f"{name} skipped: it does not import ({reason}); {INSTALL}")
    results = []
    for index, group in enumerate(selected_groups(steps, args.quick, args.only, tuple(missing))):
        results += run_group(index, group, steps, args.quick, args.only, tuple(missing), rounds, timeout, peaks)
    compare(results, peaks)

    print()
    print(table(results, timeout))
    print(f"\nsmall = 3+3 blocks, 256 units, 4 heads, d_ff 1024, vocabulary {VOCAB['small']}; base = 6+6 blocks, "
          f"512 units, 8 heads, d_ff 2048, vocabulary {VOCAB['base']}. x best peer: ours over the faster of "
          f"keras-hub and tf-models at the same size and precision. MFU against the highest matmul peak of the "
          f"compute precision measured in this run: float32 {peaks['float32']:.0f} GFLOP/s, bfloat16 "
          f"{peaks['bfloat16']:.0f} GFLOP/s.\ncommand: {command}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "cpu_flags": cpu_speed_flags(), "peak_gflops": peaks, "skipped": missing,
                       "results": [dataclasses.asdict(r) for r in results]}, f, indent=2)


if __name__ == "__main__":
    main()

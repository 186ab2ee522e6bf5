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

* torch and torch-compile, on real batches (:mod:`bench.train_torch`): our
  configuration built from ``torch.nn`` (post-norm encoder and decoder layers,
  the same parameter count, loss and Adam), eager and through
  ``torch.compile`` (its compile time in the warm-up, noted in the table),
  mixed_bfloat16 as ``torch.autocast``; skipped when torch does not import
  (``pip install -r bench/requirements-torch.txt``); "x torch" is ours over
  the faster form;

the peers without XLA, float32 and mixed_bfloat16 (tf-models through tf_keras'
policy). A peer that does not import is skipped with the pip command
(``bench/requirements.txt``, ``bench/requirements-no-deps.txt``). On a CPU
without bfloat16 instructions (neither ``avx512_bf16`` nor ``amx_bf16``) the
mixed_bfloat16 contenders are skipped (``--bf16 force`` runs them: emulated,
many times slower). "x best peer" is ours over the faster peer on the same
batches, at the same size and precision.

Each contender is timed with ``time.perf_counter`` over many steps after
warm-up steps (the first traces and compiles; then one step on every batch of
the set, so a shape first seen in a turn does not compile there: ours compiles
its XLA parts once per bucketed row count), never one step alone;
contenders of one group take turns (``--rounds``) and keep their best turn, so
that other processes on the machine slow them alike. Each group (one batch
set, one size, XLA on or off) runs in a fresh process that reports each
figure as it is measured; a contender gets ``--timeout`` seconds of its own
(build, warm-up and turns): one that runs over, or fails, is reported as such,
and the others keep their figures (those not measured yet go on in a new
process).

Every group's process takes TensorFlow's CPU tensors from its BFC allocator, as
the commands do (:func:`tf_transformer.allocator.reuse_cpu_memory`; ``TF_CPU_ALLOCATOR_USE_BFC=false``
in the environment: ``malloc`` for every contender): one process setting, the
same for ours, the peers and the bound; the report's first line names it.

It also measures a matmul peak in the same run (large float32, and bfloat16
where the CPU has bfloat16 instructions, ``tf.matmul`` in a ``tf.function``,
at the start and in every round, the highest kept) and reports model FLOP
utilisation of the real work (:func:`batch_flops`: the non-pad tokens only)
against the peak of the contender's compute precision.

    python bench/train.py                 # everything (tens of minutes on 2 cores)
    python bench/train.py --quick         # fewer steps, no XLA: a rough figure in a few minutes
    python bench/train.py --batches real --data /work/data/debian-de-en --only "small float32"
    python bench/train.py --steps 40 --json /tmp/train-bench.json

This file plans the groups and reports; the batches and their FLOPs are in ``bench/train_batches.py``, the
contenders in ``bench/train_contenders.py``, the timing (a group's process, the matmul peak, the parent that
follows the groups) in ``bench/train_timing.py``.
"""

import argparse
import dataclasses
import json
import os
import shlex
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.allocator import allocator_setting, reuse_cpu_memory  # noqa: E402
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)
reuse_cpu_memory()  # as the commands do; the groups' processes inherit it

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.peers import keras_hub_missing, tf_models_missing  # noqa: E402
from bench.train_batches import REAL_BATCH_TOKENS, real_batch_sets, synthetic_batch_set  # noqa: E402
from bench.train_contenders import BOUND, PEERS, WARMUP_STEPS, Contender, Result  # noqa: E402
from bench.train_torch import INSTALL_TORCH, TORCH_CONTENDERS, torch_missing  # noqa: E402
from bench.train_timing import has_bf16, measure_peaks, peak_dtype, peak_dtypes, run_group  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.errors import UserError  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.train.precision import BF16_FLAGS  # noqa: E402

BASE_SIZE = {"num_blocks": 6, "num_units": 512, "num_heads": 8, "d_ff": 2048}
PRECISIONS = ("float32", "mixed_bfloat16")
INSTALL = "pip install -r bench/requirements.txt && pip install --no-deps -r bench/requirements-no-deps.txt"
QUICK_TIMEOUT = 180  # --quick: seconds each contender may spend, at most


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

    # torch in a group (a process) of its own: TensorFlow's thread pools, busy after a TensorFlow contender's
    # turn, slowed torch's OpenMP threads several times over in one process on 2 cores.
    groups = [group("small", small, batch_set,
                    max(min(least, steps), steps * REAL_BATCH_TOKENS[0] // batch_set.batch_tokens), names=names)
              for batch_set in real_sets for names in (PEERS + ("ours", BOUND), TORCH_CONTENDERS)]
    if synthetic:
        small_set, base_set = synthetic_batch_set("small"), synthetic_batch_set("base")
        groups += [group("small", small, small_set, steps), group("base", base, base_set, slow_steps)]
        if not quick:
            groups.insert(2 * len(real_sets) + 1, group("small", small.replace(jit_compile=True), small_set, slow_steps,
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


def missing_torch():
    """{torch contender: why torch does not import}, empty when it does."""
    reason = torch_missing()
    return dict.fromkeys(TORCH_CONTENDERS, reason) if reason else {}


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

    def fastest(names):
        best = {}
        for r in results:
            if r.contender in names and r.target_tokens_per_sec:
                if key(r) not in best or r.target_tokens_per_sec > best[key(r)].target_tokens_per_sec:
                    best[key(r)] = r
        return best

    best, best_torch = fastest(PEERS), fastest(TORCH_CONTENDERS)
    for r in results:
        if r.target_tokens_per_sec is None:
            continue
        r.mfu = r.flops_per_sec / 1e9 / peaks[peak_dtype(r.precision, bf16)]
        peer = best.get(key(r))
        if r.contender in ("ours", BOUND) and peer:
            r.best_peer, r.vs_best_peer = peer.contender, r.target_tokens_per_sec / peer.target_tokens_per_sec
        torch = best_torch.get(key(r))
        if r.contender == "ours" and torch:
            r.best_torch, r.vs_torch = torch.contender, r.target_tokens_per_sec / torch.target_tokens_per_sec


def table(results):
    """A markdown table of :func:`compare`'d results; a result without figures shows its note."""
    header = ("contender", "size", "precision", "XLA", "steps a round", "target tokens/s", "x best peer", "x torch",
              "MFU", "note")
    rows = []
    for r in results:
        figures = ((str(r.steps), f"{r.target_tokens_per_sec:,.0f}", f"{r.mfu:.1%}")
                   if r.target_tokens_per_sec is not None else ("-", "-", "-"))
        ratio = "-" if r.vs_best_peer is None else f"{r.vs_best_peer:.2f}x ({r.best_peer})"
        vs_torch = "-" if r.vs_torch is None else f"{r.vs_torch:.2f}x ({r.best_torch})"
        note = r.note or ""
        if r.contender in TORCH_CONTENDERS and r.warmup_seconds is not None:
            what = "build, compile" if r.contender.endswith("compile") else "build"
            note = "; ".join(filter(None, [f"{what} and warm-up {r.warmup_seconds:.0f}s", note]))
        rows.append((r.contender, r.size, r.precision, "on" if r.xla else "off", figures[0], figures[1], ratio,
                     vs_torch, figures[2], note))
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
          f"x best peer: ours over the faster of keras-hub and tf-models on the same batches, size and precision; "
          f"x torch: ours over the faster torch form (eager or torch.compile, bench/train_torch.py), the same. "
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
    print(f"{cpu}, TensorFlow {tf.__version__}, Keras {keras.__version__}, {allocator_setting()}", flush=True)
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
    torch_reason = missing_torch()
    if torch_reason:
        print(f"torch skipped: it does not import ({torch_reason[TORCH_CONTENDERS[0]]}); {INSTALL_TORCH}")
    missing_all = {**missing, **torch_reason}
    if bf16_reason:
        print(f"mixed_bfloat16 contenders {bf16_reason}")
    skip = skip_reasons(missing_all, bf16_reason)
    peaks = measure_peaks(peak_dtypes([c for group in groups for c in group if skip(c) is None], bf16))
    print("matmul peak at the start: " + peak_line(peaks), flush=True)

    results = measure_all(groups, skip, rounds, timeout, peaks)
    compare(results, peaks, bf16)
    print_report(results, batch_sets, peaks, bf16, cpu, command)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "cpu": cpu_model(), "cpu_flags": cpu_speed_flags(),
                       "cores": os.cpu_count(), "allocator": allocator_setting(), "peak_gflops": peaks,
                       "skipped": missing, "torch_skipped": torch_reason,
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

"""Where a SavedModel call's time goes: op types, the CPU time a thread setting spends, a batch at a time.

The export (``--export-dir``: a version folder, or the folder of versions: the largest) is loaded with
``tf.saved_model.load``, as TF Serving loads it, in this process at one thread setting
(``--intra-op-threads``/``--inter-op-threads``, as TF Serving's ``--tensorflow_intra_op_parallelism`` and
``--tensorflow_inter_op_parallelism``; 0: TensorFlow's default, one thread per core each). For each beam size
of ``--beam-sizes``, ``--batches`` batches of ``--sentences`` of ``--data``'s dev sentences
(:func:`bench.serving.dev_pairs`' order) go through ``--signature`` (``beam_size`` fed): once to warm up, then
timed ``--repeats`` times (the best: sentences/s, and process CPU seconds over wall seconds: above 1 is what
the other threads spend, whether or not it shortens the call), then once under the TensorFlow profiler
(:func:`bench.xplane.profiled`, summed by :func:`bench.xplane.op_profile`). It prints the op types of most
self time, each with its share of the summed op self time, ms and calls a batch and µs a call, the matmuls'
share (op types named ``...MatMul...``), and the summed op self time over the profiled wall time (under 1: the
executor, thread pools and Python between the ops; over 1: ops on several threads at once), and the profiled
run's wall time over the unprofiled best: the profiler's own cost, about 1-2.5 µs an op or XLA kernel, by
which it inflates the many small ones (an XLA beam step's ~90 kernels: 1.2-1.5x the wall time there).

So it says whether a call is bound by its matrix products or by the many small ops around them, and what a
second thread buys. An XLA-compiled signature (``translate_xla``) shows its kernels as ``XLA kernel`` ops.

    python bench/serving_profile.py --export-dir runs/debian/export --data ~/.cache/tf-transformer/debian-de-en
    python bench/serving_profile.py --export-dir runs/debian/export --data ~/.cache/tf-transformer/debian-de-en \\
        --intra-op-threads 1 --inter-op-threads 1 --beam-sizes 1
"""

import argparse
import json
import os
import re
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import tensorflow as tf  # noqa: E402

from bench.c_loader import version_folder  # noqa: E402
from bench.serving import dev_corpus, dev_pairs, dev_splits  # noqa: E402
from bench.xplane import op_profile, profiled  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.options import MAX_BEAM_SIZE  # noqa: E402


def run_batches(signature, batches, beam_size):
    """Every batch through ``signature`` at ``beam_size``, each waited for: (wall seconds, process CPU seconds)."""
    beam = tf.constant(beam_size, tf.int32)
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        signature(inputs=batch, beam_size=beam)["translations"].numpy()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(signature, batches, beam_size, repeats, logdir):
    """The figures of one beam size (a JSON dict): sentences/s and CPU/wall (best of ``repeats`` timed runs),
    and the :class:`OpProfile` of a profiled one."""
    run_batches(signature, batches, beam_size)  # warm-up: traces, compiles, fills the allocator
    wall, cpu = min(run_batches(signature, batches, beam_size) for _ in range(repeats))
    events, profiled_wall = profiled(lambda: run_batches(signature, batches, beam_size), logdir)
    profile = op_profile(events, len(batches))
    sentences = sum(int(batch.shape[0]) for batch in batches)
    return {"beam_size": beam_size, "sentences_per_s": round(sentences / wall, 1),
            "cpu_over_wall": round(cpu / wall, 2),
            "matmul_share": round(profile.matmul_share, 3), "op_ms_per_batch": round(profile.op_ms_per_batch, 1),
            "op_time_over_wall": round(1e-3 * profile.op_ms_per_batch * len(batches) / profiled_wall, 2),
            "profiled_over_unprofiled_wall": round(profiled_wall / wall, 2),
            "types": [row._asdict() for row in profile.types]}


def report(figures, top):
    """The printed lines of one beam size's figures."""
    lines = [f"beam {figures['beam_size']}: {figures['sentences_per_s']:.1f} sentences/s, CPU/wall "
             f"{figures['cpu_over_wall']:.2f}; profiled ({figures['profiled_over_unprofiled_wall']:.2f}x the wall "
             f"time unprofiled): op self time {figures['op_ms_per_batch']:.1f} ms a batch, "
             f"{figures['op_time_over_wall']:.2f} of the profiled wall time, "
             f"matmuls {100 * figures['matmul_share']:.1f}% of it",
             f"  {'op type':<28} {'share':>6} {'ms/batch':>9} {'calls/batch':>11} {'us/call':>8}"]
    for row in figures["types"][:top]:
        lines.append(f"  {row['type']:<28} {100 * row['share']:5.1f}% {row['ms_per_batch']:9.1f} "
                     f"{row['calls_per_batch']:11.1f} {row['us_per_call']:8.1f}")
    return lines


def refusal(message):
    """What a signature's ``InvalidArgumentError`` says went wrong: its assertion's own text (``assertion failed:
    [TEXT] ...``), else the message's last line."""
    found = re.search(r"assertion failed: \[([^\]]*)\]", message)
    return found.group(1) if found else message.strip().splitlines()[-1]


def positive_ints(text):
    """``--beam-sizes``' comma-separated list: [int, ...], each at least 1."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated whole numbers of at least 1, e.g. 1,4")
    return values


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--export-dir", required=True, help="the SavedModel (a version folder, or the folder of versions)")
    p.add_argument("--data", help="corpus directory whose dev sentences are translated: the model's own (required)")
    p.add_argument("--signature", default="translate",
                   help="a signature with inputs and beam_size (default: %(default)s)")
    p.add_argument("--beam-sizes", type=positive_ints, default=[1, 4], help="comma-separated (default: 1,4)")
    p.add_argument("--sentences", type=int, default=64, help="sentences a batch (default: %(default)s)")
    p.add_argument("--batches", type=int, default=4, help="batches a run (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs, the best counts (default: %(default)s)")
    p.add_argument("--top", type=int, default=15, help="op types printed (default: %(default)s)")
    p.add_argument("--intra-op-threads", type=int, default=0, help="0: TensorFlow's default")
    p.add_argument("--inter-op-threads", type=int, default=0, help="0: TensorFlow's default")
    p.add_argument("--json", help="also write the figures here")
    return p


def dev_batches(p, data, sentences, count):
    """``count`` batches of ``sentences`` dev sentences of the corpus ``data`` (:func:`bench.serving.dev_pairs`'
    order): a list of (B,) string tensors."""
    sources = [source for source, _ in dev_pairs(dev_splits(p, data))[: sentences * count]]
    return [tf.constant(sources[i:i + sentences]) for i in range(0, len(sources), sentences)]


def loaded_signature(p, path, name):
    """The signature ``name`` of the SavedModel at ``path``, which must take ``inputs`` and ``beam_size``."""
    signatures = tf.saved_model.load(path).signatures
    if name not in signatures or "beam_size" not in signatures[name].structured_input_signature[1]:
        p.error(f"--signature {name}: {path} has no signature of that name with inputs and beam_size "
                f"(it has: {', '.join(sorted(signatures))})")
    return signatures[name]


def checked_args(p, argv):
    """The parsed flags, each count at least 1 and the beam sizes at most :data:`MAX_BEAM_SIZE`."""
    args = p.parse_args(argv)
    args.data = dev_corpus(p, args.data, "--export-dir")
    for flag in ("sentences", "batches", "repeats", "top"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag} {getattr(args, flag)}: at least 1")
    if max(args.beam_sizes) > MAX_BEAM_SIZE:
        p.error(f"--beam-sizes {','.join(map(str, args.beam_sizes))}: at most {MAX_BEAM_SIZE}, the exports' limit")
    return args


def main(argv=None):
    p = parser()
    args = checked_args(p, argv)
    path = version_folder(args.export_dir)
    if args.intra_op_threads:  # 0 leaves TensorFlow's default (and a process whose TensorFlow already started)
        tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
    if args.inter_op_threads:
        tf.config.threading.set_inter_op_parallelism_threads(args.inter_op_threads)
    batches = dev_batches(p, args.data, args.sentences, args.batches)
    signature = loaded_signature(p, path, args.signature)

    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    command = shlex.join(["python", "bench/serving_profile.py", *(sys.argv[1:] if argv is None else argv)])
    print(f"{date}; {cpu_model()} ({cpu_speed_flags()}), {os.cpu_count()} CPUs, TensorFlow {tf.__version__}; {path}, "
          f"signature {args.signature}; threads: intra-op {args.intra_op_threads or 'default'}, inter-op "
          f"{args.inter_op_threads or 'default'}; {len(batches)} batch(es) of up to {args.sentences} dev sentences "
          f"of {args.data}")
    results = []
    with tempfile.TemporaryDirectory() as logdir:
        for beam_size in args.beam_sizes:
            try:
                figures = measure(signature, batches, beam_size, args.repeats, os.path.join(logdir, str(beam_size)))
            except tf.errors.InvalidArgumentError as error:  # e.g. translate_xla's beam sizes: 1 or the exported one
                p.error(f"--beam-sizes: {args.signature} refused beam size {beam_size}: {refusal(error.message)}")
            results.append(figures)
            print("\n".join(report(figures, args.top)), flush=True)
    print(f"command: {command}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": date, "command": command, "cpu": cpu_model(), "flags": cpu_speed_flags(),
                       "signature": args.signature, "intra_op_threads": args.intra_op_threads,
                       "inter_op_threads": args.inter_op_threads, "results": results}, f, indent=2)


if __name__ == "__main__":
    main()

"""The export through TensorFlow's C API (no Python in the path) beside the same export through Python's
``tf.saved_model.load``, in one run: one sentence's latency and a batch's throughput.

The C side is ``tools/c_loader``'s ``tf_translate``, built here by
``tools/c_loader/build.py`` with the system's C compiler: it loads TensorFlow
Text's op libraries (``TF_LoadLibrary``) and the SavedModel
(``TF_LoadSessionFromSavedModel``, tag ``serve``), as a model server does,
and times the signature itself (``--time``). The Python side loads the same
export with ``tf.saved_model.load`` (after ``import tensorflow_text``) and calls
the same signature. Both get the same sentences (the first ``--batch-size`` dev
sentences, :func:`bench.serving.dev_pairs`' order), the same thread pools (``--threads``: 1 = one thread per pool, as TF
Serving's ``--tensorflow_intra_op_parallelism=1 --tensorflow_inter_op_parallelism=1``;
0 = TensorFlow's default pools) and the same method:

1. **one sentence**: ``--latency-runs`` calls, each the next of those sentences,
   after ``--warmup`` untimed ones: wall p50 and p99, CPU p50 (ms);
2. **the batch**: all of them in one call, best of ``--repeats`` after a warm-up:
   sentences/s (wall and CPU).

C (in its own process) and Python take turns, ``--rounds`` times, so that other
work on the machine slows them alike; each figure is the best round's. The
translations of the batch are compared. The export: ``--export-dir`` (a version folder, or the folder of
versions: the largest), else the model of ``bench/serving.py`` (``--model-dir``'s
trained model, or the small configuration with random weights and ``</S>``
masked, ``--tokens`` new tokens per sentence) exported to a temporary folder.

    python bench/c_loader.py --export-dir runs/small/export
    python bench/c_loader.py --threads 0 --signature translate --beam-size 1
    python bench/c_loader.py --export-dir EXPORT --signature translate_xla --warmup 64
"""

import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import tensorflow as tf  # noqa: E402

from bench.decode import best_times  # noqa: E402
from bench.serving import dev_corpus, dev_pairs, dev_splits, latencies, model_under_test  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.infer import export  # noqa: E402
from tf_transformer.cpu import cpu_model  # noqa: E402

# The CPU flags printed with the figures: `grep -o -E 'amx_bf16|avx512_bf16|avx512f|avx2' /proc/cpuinfo | sort -u`.
FLAGS = re.compile(r"amx_bf16|avx512_bf16|avx512f|avx2")
ONE = re.compile(r"# one sentence: p50 ([\d.]+) ms, p99 ([\d.]+) ms, CPU p50 ([\d.]+) ms over \d+ calls")
BATCH = re.compile(r"# batch of (\d+): best ([\d.]+) s, [\d.]+ sentences/s, CPU best ([\d.]+) s over \d+ runs")


def c_build():
    """tools/c_loader/build.py as a module."""
    spec = importlib.util.spec_from_file_location("c_loader_build", os.path.join(ROOT, "tools", "c_loader", "build.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The grep's lines, joined by spaces ("none" without any)."""
    try:
        with open(cpuinfo) as f:
            return " ".join(sorted(set(FLAGS.findall(f.read())))) or "none"
    except OSError:
        return "unknown"


def version_folder(export_dir):
    """The SavedModel folder: ``export_dir`` itself, or its largest numeric sub-folder holding one
    (:func:`~tf_transformer.infer.export.saved_model_folder`)."""
    folder = export.saved_model_folder(export_dir)
    if folder is None:
        raise SystemExit(f"{os.path.basename(sys.argv[0])}: no SavedModel in {export_dir} (no saved_model.pb, no "
                         "version folder holding one)")
    return folder


def run_c(program, op_libraries, path, sentences, args):
    """tf_translate's figures: (argv as shown, translations, {p50_ms, p99_ms, cpu_p50_ms, batch_s, batch_cpu_s})."""
    options = ["--threads", str(args.threads), "--signature", args.signature,
               *(["--beam-size", str(args.beam_size)] if args.beam_size is not None else []),
               "--time", str(args.latency_runs), "--warmup", str(args.warmup), "--batch-runs", str(args.repeats)]
    argv = [program, "--op-library", op_libraries, *options, path]
    result = subprocess.run(argv, input="".join(s + "\n" for s in sentences), capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"bench/c_loader.py: tf_translate failed (exit status {result.returncode}):\n"
                         + result.stderr[-3000:])
    lines = result.stdout.split("\n")[:-1]
    translations, timing = lines[:len(sentences)], "\n".join(lines[len(sentences):])
    one, batch = ONE.search(timing), BATCH.search(timing)
    if not one or not batch:
        raise SystemExit(f"bench/c_loader.py: no timing in tf_translate's output:\n{timing}")
    shown = shlex.join(["tf_translate", "--op-library", "TENSORFLOW_TEXT/python/ops", *options, "EXPORT"])
    return shown + f" < {len(sentences)} sentences", translations, {
        "p50_ms": float(one[1]), "p99_ms": float(one[2]), "cpu_p50_ms": float(one[3]),
        "batch_s": float(batch[2]), "batch_cpu_s": float(batch[3])}


def python_signature(path, args):
    """The signature of the export loaded by tf.saved_model.load, in this process."""
    import tensorflow_text  # noqa: F401  (registers the SentencePiece ops)

    return tf.saved_model.load(path).signatures[args.signature]


def run_python(signature, sentences, args):
    """The same through the signature loaded by Python: (translations, figures as run_c's)."""
    extra = {"beam_size": tf.constant(args.beam_size, tf.int32)} if args.beam_size is not None else {}

    def translate(batch):
        return [t.decode("utf-8") for t in signature(inputs=tf.constant(batch), **extra)["translations"].numpy()]

    p50, p99, cpu50 = latencies({"python": lambda s: translate([s])}, sentences, args.latency_runs,
                                warmup=args.warmup)["python"]
    seconds, results = best_times({"python": lambda: translate(sentences)}, args.repeats)
    wall, cpu = seconds["python"]
    return results["python"], {"p50_ms": p50, "p99_ms": p99, "cpu_p50_ms": cpu50, "batch_s": wall, "batch_cpu_s": cpu}


def best(rounds):
    """Each figure's best (smallest) of the rounds."""
    return {key: min(r[key] for r in rounds) for key in rounds[0]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--export-dir", help="the SavedModel (a version folder, or the folder of versions)")
    parser.add_argument("--model-dir", help="without --export-dir: a trained model directory, exported here "
                                            "(default: bench/serving.py's random small model)")
    parser.add_argument("--data", help="corpus directory whose dev sentences are translated: the model's own, "
                                       "needed with --export-dir or --model-dir "
                                       f"(default: the embedded {corpus.DEFAULT_CORPUS})")
    parser.add_argument("--signature", default="serving_default")
    parser.add_argument("--beam-size", type=int, help="fed to a signature that takes beam_size (default: its own)")
    parser.add_argument("--threads", type=int, default=1, help="1: one thread per pool; 0: TensorFlow's default")
    parser.add_argument("--batch-size", type=int, default=64, help="the batch: this many dev sentences")
    parser.add_argument("--latency-runs", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=3, help="untimed one-sentence calls first")
    parser.add_argument("--repeats", type=int, default=3, help="timed batch calls (the best is kept)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of C and Python (the best is kept)")
    parser.add_argument("--tokens", type=int, default=24, help="new tokens per sentence of the random model")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    trained_by = (args.export_dir and "--export-dir") or (args.model_dir and "--model-dir")
    args.data = dev_corpus(parser, args.data, trained_by)
    command = shlex.join(["python", "bench/c_loader.py", *(sys.argv[1:] if argv is None else argv)])
    if args.threads < 0 or min(args.batch_size, args.latency_runs, args.repeats, args.rounds) < 1:
        parser.error("--threads is 0 or more; --batch-size, --latency-runs, --repeats and --rounds at least 1")
    splits = dev_splits(parser, args.data)
    sentences = [source for source, _ in dev_pairs(splits)][: args.batch_size]
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(args.threads)

    build = c_build()
    with tempfile.TemporaryDirectory() as scratch:
        if args.export_dir:
            path, description = version_folder(args.export_dir), f"export {args.export_dir}"
        else:
            loaded, description = model_under_test(args, splits["train"].read().pairs if not args.model_dir else None)
            path = export.export_saved_model(loaded, os.path.join(scratch, "export"), xla=True)
        program = build.build(os.path.join(scratch, "tf_translate"))
        signature, c_rounds, py_rounds = python_signature(path, args), [], []
        for _ in range(args.rounds):
            shown, c_translations, figures = run_c(program, build.op_library_dir(), path, sentences, args)
            c_rounds.append(figures)
            py_translations, figures = run_python(signature, sentences, args)
            py_rounds.append(figures)
    c, py = best(c_rounds), best(py_rounds)

    same = sum(a == b for a, b in zip(c_translations, py_translations))
    n = len(sentences)
    rows = [("C API (tf_translate)", c), ("Python tf.saved_model.load", py)]
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"CPU: {cpu_model()}; flags: {cpu_flags()}; {os.cpu_count()} cores")
    print(f"command: {command}")
    print(f"C program: {shown}")
    print(f"model: {description}; signature {args.signature}"
          + (f", beam_size {args.beam_size}" if args.beam_size is not None else "") + "; threads per pool: "
          + (str(args.threads) if args.threads else "TensorFlow's default"))
    print(f"\n| path | one sentence p50 ms | p99 ms | CPU p50 ms | batch of {n} sentences/s | CPU sentences/s |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, f in rows:
        print(f"| {name} | {f['p50_ms']:.2f} | {f['p99_ms']:.2f} | {f['cpu_p50_ms']:.2f} | {n / f['batch_s']:.1f} "
              f"| {n / f['batch_cpu_s']:.1f} |")
    ratios = {"p50": py["p50_ms"] / c["p50_ms"], "cpu_p50": py["cpu_p50_ms"] / c["cpu_p50_ms"],
              "batch": py["batch_s"] / c["batch_s"], "batch_cpu": py["batch_cpu_s"] / c["batch_cpu_s"]}
    print(f"| C / Python speed | {ratios['p50']:.2f}x | | {ratios['cpu_p50']:.2f}x | {ratios['batch']:.2f}x "
          f"| {ratios['batch_cpu']:.2f}x |")
    print(f"\nthe batch's translations, C and Python the same: {same} of {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "cpu": cpu_model(),
                       "flags": cpu_flags(), "command": command, "c_program": shown, "model": description,
                       "signature": args.signature, "beam_size": args.beam_size, "threads": args.threads,
                       "sentences": n, "c": c, "python": py, "ratios": ratios, "same_translations": same}, f, indent=2)
    return 0 if same == n else 1


if __name__ == "__main__":
    sys.exit(main())

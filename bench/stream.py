"""Corpora larger than memory: the streamed input pipeline (tf_transformer/data/shards.py) at 150k to 5M pairs.

For each size, a synthetic corpus is written on the fly (nothing is downloaded): sentences of the
embedded corpus' lengths made of its words, drawn with their frequencies. Then, with the ``small``
preset and ``input_pipeline=stream``:

1. **first run** of ``train.py`` in a fresh model directory: trains the tokenizer, prepares the
   shards (the log's time) and trains 200 steps (stopped by SIGTERM once ``ckpt-200`` is saved).
   Its peak resident memory is sampled every 0.1 s from ``/proc/PID/status``: over the whole
   process (``VmHWM``, preparation included) and during the training steps (``VmRSS`` after the
   ``corpus:`` log line);
2. **restart** in the same directory: seconds from the process start until its first step is saved
   (``save_every_steps=1``: the checkpoint after the last one the first run saved, which may be past
   ``ckpt-200``: a SIGTERM saves where the run stands), with nothing tokenized again;
3. **pipeline / step**: batches per second of one worker's streamed epoch (the first 2000 batches,
   nothing consuming them) against the ``small`` model's training steps per second on those batches.

    nice -n 19 python bench/stream.py --pairs 150000,1000000,5000000 --work /tmp/stream-bench
"""

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import numpy as np  # noqa: E402

from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.model_dir import checkpoint_files, run_files

STEPS = 200


def embedded_words(side):
    """(words of the embedded corpus' training side, in running order; sentence lengths in words)."""
    with gzip.open(os.path.join(corpus.EMBEDDED[corpus.DEFAULT_CORPUS], f"train.{side}.gz"), "rt") as f:
        sentences = [line.split() for line in f]
    return np.array([w for s in sentences for w in s]), np.array([len(s) for s in sentences])


def write_synthetic(directory, pairs, seed=0, block=100_000):
    """``directory/train.{de,en}`` and a 500-pair dev split, ``pairs`` lines, a block at a time."""
    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    sides = {side: embedded_words(side) for side in ("de", "en")}
    files = {side: open(os.path.join(directory, f"train.{side}"), "w") for side in sides}
    try:
        for start in range(0, pairs, block):
            n = min(block, pairs - start)
            picks = rng.integers(0, len(sides["de"][1]), n)  # one embedded pair's lengths per synthetic pair
            for side, (words, lengths) in sides.items():
                counts = lengths[picks]
                tokens = words[rng.integers(0, len(words), int(counts.sum()))]
                cuts = np.cumsum(counts)[:-1]
                files[side].writelines(" ".join(s) + "\n" for s in np.split(tokens, cuts))
    finally:
        for f in files.values():
            f.close()
    for side in sides:
        with gzip.open(os.path.join(corpus.EMBEDDED[corpus.DEFAULT_CORPUS], f"dev.{side}.gz"), "rt") as f, \
                open(os.path.join(directory, f"dev.{side}"), "w") as out:
            out.writelines(line for _, line in zip(range(500), f))


def command(data, model_dir, settings):
    args = [sys.executable, os.path.join(ROOT, "train.py"), "--preset", "small", "--data", data,
            "--model-dir", model_dir, "--no-export", "--no-progress", "--samples", "0"]
    for setting in ["input_pipeline=stream", "eval_every_epochs=0", *settings]:
        args += ["--set", setting]
    return args


def status_kb(pid, field):
    try:
        with open(f"/proc/{pid}/status") as f:
            return int(re.search(rf"^{field}:\s+(\d+)", f.read(), re.M).group(1))
    except (OSError, AttributeError):
        return 0


def run_until_checkpoint(data, model_dir, settings, step):
    """Runs train.py until ``ckpt-{step}`` exists, then SIGTERM. Returns figures and the log."""
    started = time.monotonic()
    process = subprocess.Popen(command(data, model_dir, settings), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    lines, timed, marks = [], [], {}

    def read():
        for line in process.stdout:
            lines.append(line)
            timed.append(f"{time.monotonic() - started:7.1f}s  {line}")
            if line.startswith("corpus:"):
                marks["corpus"] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak_hwm = peak_training = 0
    index = os.path.join(model_dir, f"ckpt-{step}.index")
    while process.poll() is None:
        peak_hwm = max(peak_hwm, status_kb(process.pid, "VmHWM"))
        if "corpus" in marks:
            peak_training = max(peak_training, status_kb(process.pid, "VmRSS"))
        if os.path.exists(index):
            marks.setdefault("checkpoint", time.monotonic())
            process.send_signal(signal.SIGTERM)
            break
        time.sleep(0.1)
    process.wait()
    reader.join()
    log = "".join(lines)
    if "checkpoint" not in marks:
        raise SystemExit(f"train.py ended (exit {process.returncode}) before ckpt-{step}:\n{log[-3000:]}")
    return {"seconds": marks["checkpoint"] - started, "peak_mb": peak_hwm / 1024,
            "training_peak_mb": peak_training / 1024, "timed_log": "".join(timed)}, log


def pipeline_over_step(model_dir, batches=2000, steps=20):
    """(streamed batches/s, small-model steps/s) measured in this process, taking turns."""
    import keras

    from tf_transformer.data import shards
    from tf_transformer.hparams import load_hparams
    from tf_transformer.model_dir import checkpoint_files, run_files
    from tf_transformer.train.step import epoch_batches, make_optimizer, make_train_step, precision_policy, resolve_precision

    hp = load_hparams(config=os.path.join(model_dir, "hparams.yaml"))
    directory = shards.shards_directory(model_dir)
    examples = shards.ShardedExamples(directory, shards.read_manifest(directory))
    dataset = epoch_batches(examples, hp, epoch=0)
    started = time.perf_counter()
    taken = [batch for batch in dataset.take(batches)]
    pipeline_rate = len(taken) / (time.perf_counter() - started)
    tokenizers = run_files.load_tokenizers(model_dir, hp)
    policy, _ = resolve_precision(hp.precision)
    with precision_policy(policy):
        keras.utils.set_random_seed(hp.seed)
        model = checkpoint_files.build_model(hp, *tokenizers)
        optimizer = make_optimizer(hp)
        optimizer.build(model.trainable_variables)
        step = make_train_step(model, optimizer, hp)
        for x, y in taken[:3]:
            step(x, y)
        started = time.perf_counter()
        for x, y in taken[3:3 + steps]:
            loss, _ = step(x, y)
        float(loss)
        step_rate = steps / (time.perf_counter() - started)
    return pipeline_rate, step_rate


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", default="150000,1000000,5000000", help="comma-separated corpus sizes")
    parser.add_argument("--work", default="/tmp/stream-bench", help="scratch folder (corpora, model directories)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args(argv)
    print(f"CPU: {cpu_model()}; flags: {cpu_speed_flags()}; {os.cpu_count()} CPUs")
    rows = []
    for pairs in [int(p) for p in args.pairs.split(",")]:
        data, model_dir = os.path.join(args.work, f"data-{pairs}"), os.path.join(args.work, f"model-{pairs}")
        shutil.rmtree(model_dir, ignore_errors=True)
        started = time.monotonic()
        if not os.path.exists(os.path.join(data, "dev.en")):
            write_synthetic(data, pairs)
        generated = time.monotonic() - started
        first, log = run_until_checkpoint(data, model_dir, [f"save_every_steps={STEPS}", *args.set], STEPS)
        tokenizer = float(re.search(r"tokenizer: \S+, trained in ([\d.]+)s", log).group(1))
        prepared = float(re.search(r"tokenized into \d+ shard\(s\) in \S+ in ([\d.]+)s", log).group(1))
        print("".join(line for line in log.splitlines(True) if line.startswith(("tokenizer:", "shards:"))), end="")
        loads = [os.getloadavg()[0]]
        # A SIGTERM saves where the run stands (it may be past ckpt-200): the restart's first step is the next.
        saved = int(checkpoint_files.find_checkpoints(model_dir)[-1].rsplit("-", 1)[1])
        restart, log = run_until_checkpoint(data, model_dir, ["save_every_steps=1", *args.set], saved + 1)
        loads.append(os.getloadavg()[0])
        print(f"restart's log, seconds from its start ({restart['seconds']:.1f} s to ckpt-{saved + 1}):\n"
              + restart["timed_log"], end="")
        assert "tokenized into" not in log and "trained in" not in log, log
        pipeline_rate, step_rate = pipeline_over_step(model_dir)
        loads.append(os.getloadavg()[0])
        row = {"pairs": pairs, "generate_s": round(generated, 1), "tokenizer_s": tokenizer,
               "prepare_s": prepared, "first_run_peak_mb": round(first["peak_mb"]),
               "training_peak_mb": round(first["training_peak_mb"]),
               "restart_first_step_s": round(restart["seconds"], 1),
               "restart_peak_mb": round(restart["peak_mb"]),
               "pipeline_batches_per_s": round(pipeline_rate, 1), "step_per_s": round(step_rate, 2),
               "pipeline_over_step": round(pipeline_rate / step_rate, 1),
               "load_after_first_run_restart_pipeline": [round(x, 2) for x in loads]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("| pairs | tokenizer s | prepare s | peak MB (whole first run) | peak MB (200 steps) | restart: first "
          "step s | restart peak MB | pipeline batches/s | small steps/s | pipeline / step |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['pairs']:,} | {r['tokenizer_s']} | {r['prepare_s']} | {r['first_run_peak_mb']} | "
              f"{r['training_peak_mb']} | {r['restart_first_step_s']} | {r['restart_peak_mb']} | "
              f"{r['pipeline_batches_per_s']} | {r['step_per_s']} | **{r['pipeline_over_step']}x** |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "cpu_flags": cpu_speed_flags(), "cores": os.cpu_count(), "rows": rows}, f,
                      indent=2)


if __name__ == "__main__":
    main()

"""Translation quality for the same training time: this project's default preset against keras-hub at equal size.

For each ``--data`` corpus, one contender after the other (so that both train
under comparable machine load; the 1-minute load average is printed at the
start and end of every training):

* **ours**: ``train.py`` with the default preset and ``--set
  train_minutes=M`` in a subprocess, into ``OUT/<corpus>/ours`` (its log in
  ``OUT/<corpus>/ours.log``); the test split is then scored here with the
  run's best checkpoint by dev BLEU, greedy and beam 4;
* **keras-hub**: :class:`bench.peers.KerasHubTransformer` at the same size
  (blocks, units, heads, d_ff, dropout, maxlen from ours' ``hparams.yaml``),
  trained in this process for the same M minutes of training steps on the same
  examples in the same batch order (the SentencePiece model of ours' run
  directory, :func:`tf_transformer.train.run.prepare_examples`,
  :func:`tf_transformer.train.step.epoch_batches`), with the same Adam and noam
  schedule (:func:`~tf_transformer.train.step.make_optimizer`), the same
  label-smoothed loss (:func:`~tf_transformer.nn.model.masked_loss`) and the same
  precision (:func:`~tf_transformer.train.step_speed.choose_precision`). It has no
  dev-based checkpoint selection: its final weights are scored, greedy only
  (uncached, :func:`~tf_transformer.infer.decode.greedy_decode`).

Both contenders' translations are scored by :func:`tf_transformer.train.scores.evaluate`
(sacreBLEU BLEU and chrF, signatures printed), under the training precision.

Time counts the same way for both: from the start of each epoch's loop over
the batches (input pipeline, steps, and for ours its checkpoint saves every
``save_every_steps``) to the first step at which M minutes have passed; the
first step's tracing is inside the budget for both, dev evaluations outside.
With ``--contenders keras-hub`` alone and no earlier ours run in ``OUT``, the
SentencePiece model is trained here by the trainer's own function and seed
(:func:`~tf_transformer.train.run.prepare_examples`). No beam search for the peer:
keras-hub's ``BeamSampler`` has no length penalty and keeps extending beams
that have ended, so its "beam 4" would not be ours.

    python bench/quality.py --data ding-de-en --minutes 8 --json quality-ding.json
    python bench/quality.py --data /tmp/corpus-all --minutes 8 --json quality-all.json
    python bench/quality.py --data ding-de-en --minutes 0.3 --out /tmp/q --overwrite   # a smoke run
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.peers import KerasHubTransformer, keras_hub_missing, keras_hub_train_step  # noqa: E402
from tf_transformer.data import corpus, data_load  # noqa: E402
from tf_transformer.errors import UserError, report_user_errors  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.infer.decode import EXTRA_LENGTH, greedy_decode
from tf_transformer.infer.load import load_for_inference
from tf_transformer.infer.translate import source_ids, translate  # noqa: E402
from tf_transformer.model_dir import checkpoint_files, run_files
from tf_transformer.nn.model import Encoded  # noqa: E402
from tf_transformer.train.run import prepare_examples  # noqa: E402
from tf_transformer.train.scores import BestCheckpoint, Scores, evaluate
from tf_transformer.train.step import count_batches, epoch_batches, make_optimizer, precision_policy
from tf_transformer.train.step_speed import choose_precision  # noqa: E402

CONTENDERS = ("ours", "keras-hub")
BEAM_SIZE = 4
DECODE_BATCH = 64  # sentences per decoding batch, as train.py's evaluations
READ_EVERY_STEPS = 20  # the peer's loss is read from the device this often, as train.py does
_NOISE = re.compile(r"^(I0000 |WARNING: All log messages)")  # TensorFlow's start-up lines, kept in the log only
_DONE = re.compile(r"^done: step (\d+)(?:.*test BLEU ([\d.]+))?")


@dataclasses.dataclass
class Row:
    """One contender on one corpus."""

    corpus: str
    contender: str
    minutes: float  # the training-step budget
    steps: int
    epochs: float  # steps / batches per epoch
    target_tokens: int  # non-pad target tokens of the batches trained on
    weights: str  # which weights were scored
    greedy: Scores
    beam: Scores = None  # beam 4, where available
    seconds: float = None  # wall-clock: ours' whole train.py run (evaluations included); keras-hub's steps
    scoring_seconds: float = None  # translating and scoring the test split (greedy, and beam where given)
    load: tuple = ()  # 1-minute load average at the start and end of the training
    train_py_test_bleu: float = None  # ours: the test BLEU train.py itself printed (beam 4, best checkpoint)

    def to_dict(self):
        row = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("greedy", "beam")}
        for name, scores in (("greedy", self.greedy), ("beam", self.beam)):
            row[f"bleu_{name}"] = None if scores is None else round(scores.bleu, 2)
            row[f"chrf_{name}"] = None if scores is None else round(scores.chrf, 2)
        return row


# ---- the machine ------------------------------------------------------------------

def machine():
    """CPU model, cores and library versions, for the table's caption."""
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    return {"cpu": model, "cores": os.cpu_count(), "gpus": gpus, "tensorflow": tf.__version__,
            "keras": keras.__version__}


def load_average():
    """The 1-minute load average."""
    return round(os.getloadavg()[0], 2)


# ---- the data -----------------------------------------------------------------------

def corpus_name(data):
    """A short name for a ``--data`` value: the embedded corpus' name, or the directory's."""
    return data if data in corpus.EMBEDDED else os.path.basename(os.path.normpath(data))


def read_splits(data):
    """``corpus.corpus_splits(data)``, which must hold a test split."""
    splits = corpus.corpus_splits(data)
    if "test" not in splits:
        raise UserError(f"--data {data}: no test split (test.de/test.en or test.tsv); the table scores it")
    return splits


def epochs_and_tokens(examples, hp, steps):
    """(epochs, non-pad target tokens) of the first ``steps`` training batches, replayed
    with :func:`~tf_transformer.train.step.epoch_batches` (the order depends only on the seed)."""
    per_epoch = count_batches(examples, hp)
    stats, epoch = data_load.BatchStats(), 0
    while stats.batches < steps:
        for x, y in epoch_batches(examples, hp, epoch).take(steps - stats.batches):
            stats.add(x, y)
        epoch += 1
    return steps / per_epoch, stats.target_tokens


# ---- ours -----------------------------------------------------------------------------

def train_ours(data, model_dir, minutes, log_path):
    """Runs ``train.py`` (default preset, ``train_minutes``) to completion, its output shown
    and kept in ``log_path``. Returns (steps, its test BLEU or None, seconds, (load before, load after))."""
    data = data if data in corpus.EMBEDDED else os.path.abspath(data)  # train.py runs in the repository
    command = [sys.executable, os.path.join(REPO, "train.py"), "--data", data,
               "--model-dir", os.path.abspath(model_dir), "--no-progress", "--no-export", "--set", f"train_minutes={minutes:g}"]
    print(f"ours: {shlex.join(command)}", flush=True)
    load_before, started, steps, test_bleu = load_average(), time.monotonic(), None, None
    with open(log_path, "w", encoding="utf-8") as log, subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}) as process:
        for line in process.stdout:
            log.write(line)
            if not _NOISE.match(line):
                print(f"  | {line}", end="", flush=True)
            found = _DONE.match(line)
            if found:
                steps, test_bleu = int(found.group(1)), found.group(2) and float(found.group(2))
    if process.returncode != 0 or steps is None:
        raise UserError(f"train.py failed (exit code {process.returncode}); its output is in {log_path}")
    return steps, test_bleu, time.monotonic() - started, (load_before, load_average())


def load_best(model_dir):
    """The run's model with its best checkpoint by dev BLEU (the latest when none was kept).

    Returns:
      (:class:`~tf_transformer.infer.load.LoadedModel`, description of the weights).
    """
    loaded = load_for_inference(model_dir)
    best = BestCheckpoint(model_dir, tf.train.Checkpoint(model=loaded.model))
    if best.path is None:
        return loaded, "latest checkpoint (no best kept)"
    checkpoint_files.restore_model(loaded.model, best.path)
    return loaded, f"best dev BLEU {best.bleu:.2f} at step {best.record['step']}"


def score_ours(model_dir, test_pairs, policy):
    """Test scores of ours' best checkpoint: (greedy Scores, beam-4 Scores, weights), built and
    run under ``policy`` as train.py's own test scoring is."""
    sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
    with precision_policy(policy):
        loaded, weights = load_best(model_dir)
        hp = loaded.hp
        scores = [evaluate(sources, references, lambda batch, beam=beam: translate(
            batch, *loaded.tokenizers, loaded.model, batch_size=DECODE_BATCH, max_length=hp.max_decode_length or None,
            beam_size=beam, length_penalty=hp.length_penalty)) for beam in (1, BEAM_SIZE)]
    return scores[0], scores[1], weights


# ---- the keras-hub peer ----------------------------------------------------------------------

class PeerDecoder:
    """The peer seen through the interface :func:`~tf_transformer.infer.decode.greedy_decode` reads:
    ``encode`` passes the source through and ``decode`` runs the whole peer (encoder included)
    on it, so decoding is uncached and re-encodes at every step."""

    def __init__(self, model):
        self.model = model

    def encode(self, x, training=None):
        """(N, T_x) ids -> (the same ids as "memory", no masks)."""
        return Encoded(x, None)

    def decode(self, decoder_inputs, memory, source_masks=None, training=None):
        """(N, T_y) decoder inputs, (N, T_x) source ids -> (N, T_y, V) logits."""
        return self.model((memory, decoder_inputs), training=training)


def peer_translate_fn(model, tokenizers, maxlen):
    """``list[str] -> list[str]``: greedy translations by the peer, batched by source length,
    with the input rules of :func:`tf_transformer.infer.translate.source_ids` (empty source: empty output)."""
    source_tokenizer, target_tokenizer = tokenizers
    decoder = PeerDecoder(model)
    # keras' softmax warns about the first step's one-position attention; harmless.
    warnings.filterwarnings("ignore", message="You are using a softmax over axis")

    def translate_batch(sentences):
        sources = source_ids(source_tokenizer, tf.constant(sentences, tf.string), maxlen)
        lengths = sources.row_lengths().numpy()
        order = [int(i) for i in np.argsort(lengths, kind="stable") if lengths[i] > 1]
        results = [""] * len(sentences)
        for start in range(0, len(order), DECODE_BATCH):
            rows = order[start:start + DECODE_BATCH]
            ids = greedy_decode(decoder, tf.gather(sources, rows).to_tensor())
            for row, text in zip(rows, target_tokenizer.to_texts(ids)):
                results[row] = text
        return results

    return translate_batch


def train_peer(hp, examples, tokenizers, minutes, policy):
    """Trains the peer until ``minutes`` of training steps have passed (or ``hp.num_epochs``).

    Time counts the loop over the batches (input pipeline and steps), as train.py's
    ``train_minutes`` does; the stop comes after the first step at which it is reached.

    Returns:
      (model, steps, target tokens, seconds of training steps).
    """
    budget, spent, steps, epoch = minutes * 60.0, 0.0, 0, 0
    stats = data_load.BatchStats()
    with precision_policy(policy):
        keras.utils.set_random_seed(hp.seed)
        # Positions up to maxlen + 50: decoding may run to the source length + 50 (learned rows past maxlen
        # are never trained, like any position past the longest training sentence).
        model = KerasHubTransformer(hp, tokenizers[0].vocab_size, tokenizers[1].vocab_size,
                                    hp.maxlen + EXTRA_LENGTH)
        ids = tf.constant(np.full([1, 2], 4, np.int32))
        model((ids, ids), training=False)  # variables first, so that the step traces once
        optimizer = make_optimizer(hp)
        optimizer.build(model.trainable_variables)
        step = keras_hub_train_step(model, optimizer, hp)
        while spent < budget and epoch < hp.num_epochs:
            window, losses, started = [], [], time.monotonic()
            for x, y in epoch_batches(examples, hp, epoch):
                window.append(step(x, y))
                stats.add(x, y)
                steps += 1
                if len(window) == READ_EVERY_STEPS:
                    losses, window = losses + list(tf.stack(window).numpy()), []
                if spent + time.monotonic() - started >= budget:
                    break
            losses += list(tf.stack(window).numpy()) if window else []  # the last step has run
            spent += time.monotonic() - started
            epoch += 1
            print(f"  keras-hub: epoch {epoch}, step {steps}, loss {np.mean(losses):.4f}, "
                  f"{spent:.0f}s of {budget:.0f}s", flush=True)
    return model, steps, stats.target_tokens, spent


# ---- one corpus ---------------------------------------------------------------------------------

def check_run_directory(ours_dir, overwrite):
    """True when ``ours_dir`` holds files to delete first (train.py would resume from them).

    Raises:
      UserError: it does, without ``--overwrite``.
    """
    if not (os.path.isdir(ours_dir) and os.listdir(ours_dir)):
        return False
    if not overwrite:
        raise UserError(f"{ours_dir} exists: train.py would resume it; remove it or pass --overwrite")
    return True


def run_corpus(data, minutes, out, contenders, overwrite):
    """Trains and scores the contenders on one corpus; returns a list of :class:`Row`."""
    splits, name = read_splits(data), corpus_name(data)
    ours_dir = os.path.join(out, name, "ours")
    test_pairs = splits["test"].read().pairs
    rows = []
    if "ours" in contenders:
        if check_run_directory(ours_dir, overwrite):
            shutil.rmtree(ours_dir)
        os.makedirs(ours_dir, exist_ok=True)
        steps, test_bleu, seconds, load = train_ours(data, ours_dir, minutes, os.path.join(out, name, "ours.log"))
    hp = load_hparams(config=os.path.join(ours_dir, run_files.HPARAMS_FILE)) \
        if os.path.exists(os.path.join(ours_dir, run_files.HPARAMS_FILE)) else load_hparams()
    policy, reason = choose_precision(hp)
    print(f"precision: {policy} ({reason})", flush=True)
    # Ours' SentencePiece model when its directory has one, else one trained the same way (same seed).
    tokenizers, examples, _ = prepare_examples(splits, hp, ours_dir, lambda line: print(f"  {line}", flush=True))
    if "ours" in contenders:
        started = time.monotonic()
        greedy, beam, weights = score_ours(ours_dir, test_pairs, policy)
        rows.append(Row(name, "ours", minutes, steps, *epochs_and_tokens(examples, hp, steps), weights,
                        greedy, beam, seconds, time.monotonic() - started, load, test_bleu))
        print_row(rows[-1])
    if "keras-hub" in contenders:
        load_before = load_average()
        print(f"keras-hub: training for {minutes:g} minutes of steps; load average {load_before}", flush=True)
        model, steps, tokens, seconds = train_peer(hp, examples, tokenizers, minutes, policy)
        load = (load_before, load_average())
        print(f"keras-hub: {steps} steps in {seconds:.0f}s; load average {load[1]}", flush=True)
        sources, references = [s for s, _ in test_pairs], [t for _, t in test_pairs]
        started = time.monotonic()
        with precision_policy(policy):
            greedy = evaluate(sources, references, peer_translate_fn(model, tokenizers, hp.maxlen))
        epochs = steps / count_batches(examples, hp)
        rows.append(Row(name, "keras-hub", minutes, steps, epochs, tokens, f"final weights (step {steps})",
                        greedy, None, seconds, time.monotonic() - started, load))
        print_row(rows[-1])
    return rows


# ---- output ---------------------------------------------------------------------------------------

def print_row(row):
    beam = "" if row.beam is None else f"\n  beam {BEAM_SIZE}: {row.beam.format()}"
    if row.train_py_test_bleu is not None:
        beam += f" (train.py's own test scoring: BLEU {row.train_py_test_bleu:.1f})"
    print(f"{row.corpus} {row.contender}: {row.steps} steps, {row.epochs:.2f} epochs, {row.target_tokens} target "
          f"tokens, {row.weights}; load average {row.load[0]} -> {row.load[1]}; test split scored in "
          f"{row.scoring_seconds:.0f}s\n  greedy: {row.greedy.format()}"
          f"{beam}", flush=True)


def table(rows):
    """A Markdown table of the rows."""
    header = ("corpus", "contender", "budget", "steps", "epochs", "target tokens", "weights scored",
              "BLEU greedy", "chrF greedy", f"BLEU beam {BEAM_SIZE}", f"chrF beam {BEAM_SIZE}")
    lines = [header] + [(r.corpus, r.contender, f"{r.minutes:g} min", str(r.steps), f"{r.epochs:.2f}",
                         f"{r.target_tokens:,}", r.weights, f"{r.greedy.bleu:.2f}", f"{r.greedy.chrf:.2f}",
                         "-" if r.beam is None else f"{r.beam.bleu:.2f}",
                         "-" if r.beam is None else f"{r.beam.chrf:.2f}") for r in rows]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    text = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    text.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(text)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="bench/quality.py", description=__doc__.split("\n")[0])
    parser.add_argument("--data", action="append", required=True,
                        help=f"a corpus directory with train, dev and test splits, or an embedded corpus "
                             f"({', '.join(corpus.EMBEDDED)}); repeatable, run in order")
    parser.add_argument("--minutes", type=float, required=True,
                        help="training-step budget of each contender, in minutes")
    parser.add_argument("--out", default=os.path.join("runs", "quality"),
                        help="ours' model directories go to OUT/<corpus>/ours (default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true", help="delete an existing OUT/<corpus>/ours first")
    parser.add_argument("--contenders", default=",".join(CONTENDERS),
                        help="comma-separated, from: %(default)s")
    parser.add_argument("--json", help="also write the table, signatures, machine and command here")
    args = parser.parse_args(argv)
    if not args.minutes > 0:
        parser.error(f"--minutes {args.minutes:g}: must be above 0")
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in args.contenders if c not in CONTENDERS]
    if unknown or not args.contenders:
        parser.error(f"--contenders: unknown {', '.join(unknown) or '(none given)'}; choose from "
                     f"{', '.join(CONTENDERS)}")
    return args


def write_json(path, command, host, minutes, rows):
    """The table, signatures, machine and command as JSON."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    signatures = {"bleu": rows[0].greedy.bleu_signature, "chrf": rows[0].greedy.chrf_signature}
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"command": command, "machine": host, "minutes": minutes, "signatures": signatures,
                   "rows": [r.to_dict() for r in rows]}, f, indent=2)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = shlex.join(["python", "bench/quality.py"] + (sys.argv[1:] if argv is None else list(argv)))
    missing = keras_hub_missing() if "keras-hub" in args.contenders else None
    if missing:
        raise UserError(f"keras-hub does not import ({missing}); pip install -r bench/requirements.txt, "
                        f"or --contenders ours")
    names = [corpus_name(data) for data in args.data]
    for data, name in zip(args.data, names):  # every corpus checked before hours of training
        read_splits(data)
        if names.count(name) > 1:
            given = " and ".join(d for d, n in zip(args.data, names) if n == name)
            raise UserError(f"--data: {given} have the same name {name}; their runs would share "
                            f"{os.path.join(args.out, name)}")
        if "ours" in args.contenders:
            check_run_directory(os.path.join(args.out, name, "ours"), args.overwrite)
    host = machine()
    print(f"{host['cpu']}, {host['cores']} cores{', GPUs: ' + ', '.join(host['gpus']) if host['gpus'] else ''}; "
          f"TensorFlow {host['tensorflow']}, Keras {host['keras']}", flush=True)
    rows = []
    for data in args.data:
        rows += run_corpus(data, args.minutes, args.out, args.contenders, args.overwrite)
        if args.json:  # after each corpus, so that a later failure keeps the finished ones
            write_json(args.json, command, host, args.minutes, rows)
    print()
    print(table(rows))
    print(f"\nsacreBLEU signatures: BLEU {rows[0].greedy.bleu_signature}; chrF {rows[0].greedy.chrf_signature}\n"
          f"budget: {args.minutes:g} minutes of training steps per contender (dev evaluations not counted); "
          f"ours is scored with its best checkpoint by dev BLEU, keras-hub (no dev-based selection) with its "
          f"final weights, greedy only (uncached).\nmachine: {host['cpu']}, {host['cores']} cores\n"
          f"command: {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

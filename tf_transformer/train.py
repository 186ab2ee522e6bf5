"""Training: ``python train.py [--preset NAME] [--set key=value ...] [--data DIR | --source F --target F | --tsv F]``.

Trains the tokenizer (or reuses the one in the model directory), batches the
corpus by length and trains with a compiled step (:mod:`tf_transformer.training`)
under the precision and ``tf.distribute`` strategy asked for. Along the way it

* holds the model directory's lock (:mod:`tf_transformer.locks`): a second
  ``train.py`` or export on it stops at once, naming the process that holds it;
* checks everything it can before the first step: hyper-parameters, every
  split's files, that the model and export directories can be written;
* saves checkpoints every ``save_every_steps`` steps and at each epoch end, and
  resumes from the newest readable one when run again, found from the files
  themselves when the ``checkpoint`` state file is missing or damaged
  (:mod:`tf_transformer.checkpoints`); it never starts over from step 0 in a
  directory that holds checkpoints unless ``--restart`` sets them aside;
  Ctrl-C or SIGTERM saves and stops (exit code 130 or 143), and after training
  (final evaluation, test scoring, export) stops at once with the same codes;
* stops with one line when the loss or the weights become NaN or Inf
  (:class:`Diverged`), before any checkpoint, best checkpoint or export holds them;
* every ``eval_every_epochs`` epochs and at the end, translates the dev split
  and scores it (BLEU and chrF with sacrebleu's signatures), keeps the best
  checkpoint by dev BLEU in ``MODEL_DIR/best/`` and writes sample translations
  to ``MODEL_DIR/samples-stepN.txt``;
* shows a progress bar (loss, learning rate, tokens/s, ETA) and writes
  TensorBoard summaries to ``MODEL_DIR/logs/``;
* at the end scores the test split with the best checkpoint and exports it as a
  SavedModel to ``MODEL_DIR/export/``.

Without data arguments it trains on the embedded Ding corpus.

``--strategy multi_worker`` runs one process per ``TF_CONFIG`` task; only the
chief (task ``chief``, else worker 0) writes checkpoints, summaries, samples and
the export and evaluates; the workers agree on stopping every 20 steps and at
epoch ends, so a signal to any of them stops all at the same step.
``--deterministic`` turns on TensorFlow's op determinism: a resumed run then
ends with exactly the weights of an uninterrupted one.
"""

import argparse
import contextlib
import dataclasses
import math
import os
import shutil
import signal
import sys
import tempfile
import time

import keras
import numpy as np
import tensorflow as tf

from tf_transformer import (average, corpus, data_load, datasets, evaluation, model_dir as run_files, plots, schedules,
                            training)
from tf_transformer.checkpoints import Interrupted, Position, StopRequest, TrainingCheckpoints, tokenizer_check
from tf_transformer.datasets.debian import DownloadError
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.files import check_writable_directory
from tf_transformer.locks import DirectoryLock
from tf_transformer.hparams import load_hparams, preset_names
from tf_transformer.progress import Progress
from tf_transformer.summaries import LOG_DIR, Summaries
from tf_transformer.tokenizer import train_tokenizers
from tf_transformer.training import learning_rate, make_train_step  # noqa: F401 (re-exported for old callers)
from tf_transformer.translate import attention_of, translate

# Loss and accuracy are read from the device once per this many steps (and at each epoch end).
READ_EVERY_STEPS = 20
# Without a dev split, this many training pairs are translated and scored instead.
EVAL_PAIRS_FROM_TRAIN = 500


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="train.py", description=__doc__.split("\n")[0])
    parser.add_argument("--preset", help=f"hyper-parameter preset: {', '.join(preset_names())}")
    parser.add_argument("--config", help="a YAML file of hyper-parameters applied over the preset")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one hyper-parameter, e.g. --set num_blocks=2 (repeatable)")
    parser.add_argument("--data", default=corpus.DEFAULT_CORPUS,
                        help=f"a corpus directory (train/dev/test.LANG, .tsv or IWSLT files), an embedded "
                             f"corpus: {', '.join(corpus.EMBEDDED)}, or {datasets.BUILT_ON_FIRST_USE}: built from "
                             f"Debian's archive into $TF_TRANSFORMER_DATA (default {datasets.DATA_HOME}) on first "
                             f"use, the embedded corpus when the archive cannot be reached (default: %(default)s)")
    parser.add_argument("--source-lang", default="de", help="source file suffix in --data (default: %(default)s)")
    parser.add_argument("--target-lang", default="en", help="target file suffix in --data (default: %(default)s)")
    parser.add_argument("--source", help="training source text, one sentence per line (instead of --data)")
    parser.add_argument("--target", help="training target text, line-aligned with --source")
    parser.add_argument("--tsv", help="training pairs as one source<TAB>target file (instead of --data)")
    parser.add_argument("--model-dir", help="where checkpoints, vocabularies and hparams go (default: runs/PRESET)")
    parser.add_argument("--strategy", default="default", choices=training.STRATEGIES,
                        help="default: one device; mirrored: all local GPUs (or CPU devices); multi_worker: the "
                             "cluster in TF_CONFIG (default: %(default)s)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (log lines only)")
    parser.add_argument("--export-dir", help="where the SavedModel goes (default: MODEL_DIR/export)")
    parser.add_argument("--no-export", action="store_true", help="do not export a SavedModel at the end")
    parser.add_argument("--save-every-secs", type=float, default=0.0,
                        help="also save a checkpoint once this many seconds passed since the last one "
                             "(default: off; save_every_steps and epoch ends always save)")
    parser.add_argument("--samples", type=int, default=3, help="dev translations to print at the end")
    parser.add_argument("--deterministic", action="store_true",
                        help="make every TensorFlow op deterministic (slower): a resumed run then ends with "
                             "exactly the weights of an uninterrupted one")
    parser.add_argument("--restart", action="store_true",
                        help="start over from step 0: what earlier runs wrote in --model-dir (checkpoints, "
                             "tokenizer, hparams.yaml, logs; not export/) is moved to MODEL_DIR/previous-TIME/")
    args = parser.parse_args(argv)
    if (args.source is None) != (args.target is None):
        parser.error("--source and --target go together")
    if args.source and args.tsv:
        parser.error("give either --source/--target or --tsv")
    return args


def check_args(args):
    """Refuses flag values that would fail later, each with one line naming the flag."""
    if args.samples < 0:
        raise UserError(f"--samples {args.samples}: must be 0 or more")
    if not (math.isfinite(args.save_every_secs) and args.save_every_secs >= 0):
        raise UserError(f"--save-every-secs {args.save_every_secs}: must be a finite number, 0 (off) or more")
    if args.restart and args.strategy == "multi_worker":
        raise UserError("--restart with --strategy multi_worker: set the old run aside by hand "
                        "(or use another --model-dir), then start the workers")


def corpus_from_args(args, log=print):
    """The splits to read: {"train": Split, ...}; dev and test only come with --data.
    ``--data debian-de-en`` (not a directory) is built on first use; when Debian's archive
    cannot be reached, one line says so and the embedded corpus is used instead."""
    if args.source:
        return {"train": corpus.Split(args.source, args.target)}
    if args.tsv:
        return {"train": corpus.Split(args.tsv)}
    data = args.data
    if data == datasets.BUILT_ON_FIRST_USE and not os.path.isdir(data):
        try:
            data = datasets.ensure_built(data, log=log)
        except DownloadError as e:
            log(f"warning: cannot build {data} ({e}); training on the embedded corpus {corpus.DEFAULT_CORPUS} "
                f"instead")
            data = corpus.DEFAULT_CORPUS
    return corpus.corpus_splits(data, args.source_lang, args.target_lang)


def prepare_tokenizers(model_dir, hp, pairs, log):
    """The model directory's tokenizers, or new ones trained on ``pairs``."""
    tokenizers = run_files.load_tokenizers(model_dir, hp)
    if tokenizers is not None:
        return tokenizers
    started = time.monotonic()
    tokenizers = train_tokenizers(hp, pairs)
    log(f"tokenizer: {hp.tokenizer}, trained in {time.monotonic() - started:.1f}s")
    return tokenizers


def prepare_examples(splits, hp, model_dir, log):
    """Reads the training split, prepares tokenizers, tokenizes and filters; logs what was dropped.

    Returns:
      (tokenizers, examples, train_pairs).
    """
    train_split = splits["train"].read()
    run_files.check_compatible(model_dir, hp)
    tokenizers = prepare_tokenizers(model_dir, hp, train_split.pairs, log)
    examples = data_load.encode_pairs(train_split.pairs, *tokenizers, hp.maxlen)
    if not len(examples):
        raise UserError(f"{train_split.origin}: no sentence pair of at most maxlen={hp.maxlen} tokens "
                        f"(</S> included); raise it with --set maxlen=N")
    log(f"corpus: {len(examples)} pairs from {train_split.origin} ({train_split.blank} with a blank side and "
        f"{examples.too_long} longer than maxlen={hp.maxlen} dropped); vocabulary: "
        f"{tokenizers[0].vocab_size} source, {tokenizers[1].vocab_size} target")
    return tokenizers, examples, train_split.pairs


def eval_pairs(splits, train_pairs, tokenizers, maxlen, log):
    """The pairs every evaluation scores: the dev split, else the first training pairs
    that training kept (at most ``maxlen`` tokens a side)."""
    if "dev" in splits:
        return splits["dev"].read().pairs
    pairs = train_pairs[:4 * EVAL_PAIRS_FROM_TRAIN]
    lengths = [data_load.tokenize_with_eos(tokenizer, [pair[side] for pair in pairs]).row_lengths().numpy()
               for side, tokenizer in enumerate(tokenizers)]
    pairs = [pair for pair, n, m in zip(pairs, *lengths) if max(n, m) <= maxlen][:EVAL_PAIRS_FROM_TRAIN]
    log(f"no dev split: evaluations score {len(pairs)} training pairs instead (BLEU on seen data)")
    return pairs


def attention_sample(model, tokenizers, source, translation):
    """:func:`~tf_transformer.translate.attention_of` while the model reads ``translation`` of ``source``."""
    x = data_load.tokenize_with_eos(tokenizers[0], [source]).to_tensor()
    output = data_load.tokenize_with_eos(tokenizers[1], [translation])[0].numpy().tolist()
    return attention_of(model, tokenizers, x, output)


@dataclasses.dataclass
class Result:
    """What :func:`train` did: the model (with the best checkpoint's weights when one
    was kept), the last step, the last dev and the test :class:`~tf_transformer.evaluation.Scores`
    (None where not computed), and the paths it wrote."""

    model: keras.Model
    step: int
    dev: evaluation.Scores = None
    test: evaluation.Scores = None
    checkpoint: str = None
    best_checkpoint: str = None
    samples: str = None
    export: str = None


class Diverged(UserError):
    """The loss or the weights became NaN or Inf; nothing was saved from them."""


def all_finite(variables):
    """Whether every value of ``variables`` is finite (one device sync)."""
    return bool(tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in variables]))


class _Window:
    """The loss/accuracy tensors of the steps since the last read from the device."""

    def __init__(self, stats):
        self.losses, self.accuracies = [], []
        self.stats, self.tokens, self.started = stats, stats.target_tokens, time.monotonic()

    def add(self, loss, accuracy):
        self.losses.append(loss)
        self.accuracies.append(accuracy)

    def read(self):
        """(per-step losses, per-step accuracies, target tokens/s) as numpy; one device sync."""
        losses, accuracies = tf.stack(self.losses).numpy(), tf.stack(self.accuracies).numpy()
        seconds = max(time.monotonic() - self.started, 1e-9)
        return losses, accuracies, (self.stats.target_tokens - self.tokens) / seconds


class _Run:
    """One call of :func:`train`; the methods are its phases."""

    def __init__(self, hp, splits, model_dir, strategy, log, save_every_secs):
        self.hp, self.splits, self.model_dir = hp, splits, model_dir
        self.strategy = strategy or tf.distribute.get_strategy()
        self.chief = training.is_chief(self.strategy)
        self.workers = training.workers(self.strategy)  # read once: the step loop asks every step
        self._log, self.save_every_secs = log, save_every_secs
        self.progress = self.summaries = self.scratch = None
        self.evaluated_at = self.dev_scores = self.samples_path = self.last_finite = None
        self.last_save = time.monotonic()
        self.train_seconds, self.epoch_started, self.out_of_time = 0.0, None, False

    def log(self, line):
        if self._log is not None:
            self._log(line)
        elif self.progress is not None:
            self.progress.write(line)
        else:
            print(line, flush=True)

    # ---- setup ----------------------------------------------------------------

    def prepare(self):
        hp = self.hp
        self.tokenizers, self.examples, train_pairs = prepare_examples(self.splits, hp, self.model_dir, self.log)
        self.eval_set = eval_pairs(self.splits, train_pairs, self.tokenizers, hp.maxlen, self.log)
        self.test_pairs = self.splits["test"].read().pairs if "test" in self.splits else None  # its errors now
        if self.chief:
            run_files.save_run_files(self.model_dir, hp, *self.tokenizers)
        self.steps_per_epoch = training.count_batches(self.examples, hp)

    def build(self):
        hp = self.hp
        keras.utils.set_random_seed(hp.seed)
        with self.strategy.scope():
            self.model = run_files.build_model(hp, *self.tokenizers)
            self.optimizer = training.make_optimizer(hp)
            self.optimizer.build(self.model.trainable_variables)
        # Loss scaling skips the steps whose gradients overflow: a non-finite loss there is no divergence.
        self.loss_scaled = isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)
        # Non-chief workers save too (saving may need every worker) but into a directory they delete.
        self.scratch = None if self.chief else tempfile.mkdtemp(prefix="tf-transformer-worker-")
        self.checkpoints = TrainingCheckpoints(
            self.model_dir, self.model, self.optimizer, run_files.tokenizer_fingerprint(*self.tokenizers),
            hp.keep_checkpoints, write_directory=self.scratch, architecture=run_files.architecture_record(hp))
        restored = self.checkpoints.restore_latest(
            self.log, tokenizer_check(self.model_dir, hp, self.tokenizers))
        # plan_end: the plan's last step, also in Python so that the step loop does not read the device
        self.schedule, self.planner, self.plan_end = schedules.schedule_of(self.optimizer), None, 0
        if self.schedule is not None:  # the learning-rate plan: saved with the checkpoints, and restored on
            # attaching when the restored one has it (attached later, checkpoints without one still match)
            self.checkpoints.attach("lr_plan", self.schedule.plan_variables())
        self.position = self.checkpoints.position if restored else Position()
        if restored:
            p = self.position
            self.log(f"resumed from {restored} (step {p.step}, epoch {p.epoch + 1}, batch {p.batch})")
        if self.schedule is not None:
            self.planner = schedules.plan_for_run(self.schedule, self.position.step,
                                                  self.steps_per_epoch * hp.num_epochs, 60.0 * hp.train_minutes)
            self.plan_end = int(self.schedule.planned_steps.numpy())
            if self.planner is None:
                self.log_plan("kept from the checkpoint" if hp.train_minutes else "num_epochs x batches per epoch")
        self.train_step = make_train_step(self.model, self.optimizer, hp, self.strategy)
        self.agree = training.any_worker(self.strategy)
        self.summaries = Summaries(os.path.join(self.model_dir, LOG_DIR) if self.chief else None)
        self.best = evaluation.BestCheckpoint(self.model_dir, self.checkpoints.checkpoint) if self.chief else None

    # ---- training ---------------------------------------------------------------

    def save(self, position):
        """Saves a checkpoint at ``position``, unless the weights are no longer finite (:class:`Diverged`)."""
        if not all_finite(self.model.trainable_variables):
            raise self.diverged(position.step, "the weights are no longer finite (NaN or Inf)")
        self.last_save = time.monotonic()
        return self.checkpoints.save(position)

    def diverged(self, step, what):
        """The :class:`Diverged` error of ``what`` happening at ``step``, with the last finite loss and a hint."""
        last = "no finite loss before" if self.last_finite is None else \
            f"last finite loss {self.last_finite[1]:.4f} at step {self.last_finite[0]}"
        kept = self.checkpoints.latest
        kept = f"kept {kept}, the last checkpoint, whose weights are finite" if kept else "no checkpoint was saved"
        return Diverged(f"training diverged at step {step}: {what} ({last}); {kept}; nothing was saved from "
                        f"non-finite weights. Run again with a lower learning_rate (now {self.hp.learning_rate:g}) "
                        f"or a clip_norm (e.g. --set clip_norm=1.0) to resume from there, or with --restart")

    def check_losses(self, losses, first):
        """Raises :class:`Diverged` at the first non-finite loss of steps ``first``, ``first + 1``, ...
        (not under loss scaling, which skips such steps); remembers the last finite one."""
        finite = np.isfinite(losses)
        if not finite.all() and not self.loss_scaled:
            bad = int(np.argmin(finite))
            raise self.diverged(first + bad, f"loss {losses[bad]}")
        if finite.any():
            last = int(np.flatnonzero(finite)[-1])
            self.last_finite = (first + last, float(losses[last]))

    def train_epoch(self, stop):
        """Trains from ``self.position`` to the end of its epoch, or until the ``train_minutes``
        budget is spent (:attr:`out_of_time`); returns (mean loss, mean accuracy, stats)."""
        hp, start = self.hp, self.position
        step, batch, save_due = start.step, start.batch, False
        stats = data_load.BatchStats()
        window, epoch_losses, epoch_accuracies = _Window(stats), [], []
        for x, y in training.epoch_batches(self.examples, hp, start.epoch, start.batch):
            if save_due:  # the losses so far are read first: a checkpoint never follows a NaN loss
                if window.losses:
                    epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
                    window = _Window(stats)
                self.save(Position(step, start.epoch, batch))
                save_due = False
            loss, accuracy = self.train_step(x, y)
            window.add(loss, accuracy)
            stats.add(x, y)
            step, batch = step + 1, batch + 1
            if self.planner is not None:
                self.plan(step, loss)
            if len(window.losses) == READ_EVERY_STEPS:
                epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
                window = _Window(stats)
            save_due = ((hp.save_every_steps and step % hp.save_every_steps == 0) or
                        (self.save_every_secs and time.monotonic() - self.last_save >= self.save_every_secs))
            if self.stop_due(stop, step):
                raise Interrupted(stop.signum or signal.SIGTERM, self.save(Position(step, start.epoch, batch)))
            if self.budget_spent(step):
                self.out_of_time = True
                self.end_plan(step)
                self.position = Position(step, start.epoch, batch)
                break
        if window.losses:
            epoch_losses, epoch_accuracies = self.report(window, step, epoch_losses, epoch_accuracies)
        if not self.out_of_time:
            self.position = Position(step, start.epoch + 1, 0)
        return np.mean(epoch_losses) if epoch_losses else float("nan"), \
            np.mean(epoch_accuracies) if epoch_accuracies else float("nan"), stats

    def budget_clock(self):
        """Seconds of training steps in this run so far (what ``train_minutes`` counts)."""
        return self.train_seconds + time.monotonic() - self.epoch_started

    def budget_spent(self, step):
        """Whether ``train_minutes`` of training steps have passed in this run, or the learning-rate
        plan is done. Workers of a cluster decide together every ``READ_EVERY_STEPS`` steps, as for signals."""
        if not self.hp.train_minutes:
            return False
        if 0 < self.plan_end <= step:
            return True
        spent = self.budget_clock() >= 60.0 * self.hp.train_minutes
        if self.workers == 1:
            return spent
        return step % READ_EVERY_STEPS == 0 and self.agree(spent)

    def plan(self, step, loss):
        """Fixes the learning-rate plan once the planner has timed its steps (the workers agree on it)."""
        planned = self.planner.observe(step, self.budget_clock, sync=loss.numpy)
        if planned is None:
            return
        if self.workers > 1:
            planned = schedules.mean_over_workers(self.strategy, planned)
        self.schedule.planned_steps.assign(planned)
        self.plan_end = planned
        self.progress.set_total(planned)
        self.log_plan(f"{self.planner.rate:.1f} steps/s over {self.planner.measure_steps} steps, "
                      f"train_minutes={self.hp.train_minutes:g}")
        self.planner = None

    def log_plan(self, reason):
        s = self.schedule
        self.log(f"learning-rate plan: warm-up then {s.decay} decay to {s.floor:g} from step "
                 f"{int(s.start_step.numpy())} to step {int(s.planned_steps.numpy())} ({reason})")

    def end_plan(self, step):
        """Where the budget ends a run, its plan ends too (a run resumed with a fresh budget then plans anew);
        logs the last step's learning rate."""
        if not self.plan_end:
            return
        self.log(f"learning-rate plan ended at step {step}: last learning rate {float(self.schedule(step - 1)):.3g}")
        self.plan_end = min(step, self.plan_end)
        self.schedule.planned_steps.assign(self.plan_end)

    def stop_due(self, stop, step=None):
        """Whether to save and stop now. Workers of a cluster decide together every
        ``READ_EVERY_STEPS`` steps and at epoch ends (``step`` None), so that they
        all stop at the same step even when only some of them got the signal."""
        if self.workers == 1:
            return stop.signum is not None
        return (step is None or step % READ_EVERY_STEPS == 0) and self.agree(stop.signum is not None)

    def report(self, window, step, epoch_losses, epoch_accuracies):
        """Reads a window from the device: progress bar, per-step TensorBoard scalars."""
        losses, accuracies, tokens_per_sec = window.read()
        lr = float(tf.convert_to_tensor(self.optimizer.learning_rate))
        first = step - len(losses) + 1
        self.check_losses(losses, first)
        for i, (loss, accuracy) in enumerate(zip(losses, accuracies)):
            self.summaries.scalars(first + i, **{"train/loss": loss, "train/accuracy": accuracy})
        self.summaries.scalars(step, **{"train/learning_rate": lr, "train/target_tokens_per_sec": tokens_per_sec})
        self.progress.update(len(losses), loss=float(np.mean(losses)), lr=lr, tokens_per_sec=tokens_per_sec)
        return epoch_losses + list(losses), epoch_accuracies + list(accuracies)

    def log_epoch(self, loss, accuracy, stats, seconds):
        """One line per epoch (per tenth of the run when there are more than ten), and one for the
        part of an epoch that ``train_minutes`` cut short."""
        hp, done = self.hp, self.position.epoch
        if not self.out_of_time and done % max(1, hp.num_epochs // 10) and done != hp.num_epochs:
            return
        padding = stats.summary(hp.maxlen)
        epoch = f"epoch {done + 1}/{hp.num_epochs} (to batch {self.position.batch})" if self.out_of_time else \
            f"epoch {done}/{hp.num_epochs}"
        self.log(f"{epoch}: loss {loss:.4f}, accuracy {accuracy:.3f}, "
                 f"{stats.batches} steps in {seconds:.2f}s ({stats.target_tokens / max(seconds, 1e-9):.0f} "
                 f"target tokens/s, {padding['padding']:.0%} padding, {padding.get('padding_at_maxlen', 0):.0%} "
                 f"if padded to maxlen); train step traced {self.train_step.traces} time(s)")

    def train(self, stop):
        hp = self.hp
        eval_every = hp.eval_every_epochs
        while self.position.epoch < hp.num_epochs:
            self.epoch_started = time.monotonic()
            loss, accuracy, stats = self.train_epoch(stop)
            seconds = time.monotonic() - self.epoch_started
            self.train_seconds += seconds
            self.log_epoch(loss, accuracy, stats, seconds)
            self.save(self.position)
            if self.out_of_time:
                p = self.position
                self.log(f"train_minutes={hp.train_minutes:g} spent: stopped at step {p.step} "
                         f"(epoch {p.epoch + 1}, batch {p.batch}) after {self.train_seconds / 60:.1f} minutes of "
                         f"training")
                return
            if eval_every and self.position.epoch % eval_every == 0 and self.position.epoch < hp.num_epochs:
                self.evaluate()
            if self.stop_due(stop):
                raise Interrupted(stop.signum or signal.SIGTERM, self.checkpoints.latest)

    # ---- evaluation -----------------------------------------------------------------

    def translate(self, sentences):
        hp = self.hp
        return translate(sentences, *self.tokenizers, self.model, batch_size=64,
                         max_length=hp.max_decode_length or None, beam_size=hp.beam_size,
                         length_penalty=hp.length_penalty)

    def evaluate(self):
        """Scores the dev split at the current step (chief only): log, summaries, samples, best checkpoint."""
        if not self.chief:
            return None
        step = self.position.step
        sources, references = [s for s, _ in self.eval_set], [t for _, t in self.eval_set]
        started = time.monotonic()
        scores = evaluation.evaluate(sources, references, self.translate)
        self.log(f"dev at step {step} ({len(sources)} sentences, {time.monotonic() - started:.1f}s): "
                 f"{scores.format()}")
        self.samples_path = os.path.join(self.model_dir, f"samples-step{step}.txt")
        evaluation.write_samples(self.samples_path, sources, references, scores.hypotheses,
                                 header=f"dev, step {step}: {scores.format()}")
        self.summaries.scalars(step, **{"dev/bleu": scores.bleu, "dev/chrf": scores.chrf})
        self.summaries.text(step, "dev/samples", evaluation.format_samples(sources, references, scores.hypotheses))
        self.summaries.attention_image(step, "dev/attention",
                                       *attention_sample(self.model, self.tokenizers, sources[0], scores.hypotheses[0]))
        self.summaries.flush()
        if self.summaries.log_dir:
            plots.write_training_curves(self.model_dir)  # MODEL_DIR/curves.png: loss, learning rate, dev BLEU
        if self.best.update(scores, step):
            self.log(f"best dev BLEU so far: {scores.bleu:.2f}, kept as {self.best.path}")
        self.evaluated_at, self.dev_scores = step, scores
        return scores

    def finish(self, samples):
        """The end of a complete run (chief): last dev evaluation, samples, the best checkpoint's
        weights into the model, the test split scored with them."""
        result = Result(self.model, self.position.step, checkpoint=self.checkpoints.manager.latest_checkpoint)
        if not self.chief:
            return result
        if self.evaluated_at != self.position.step:
            self.evaluate()
        result.dev, result.samples = self.dev_scores, self.samples_path
        for source, translation in list(zip((s for s, _ in self.eval_set), self.dev_scores.hypotheses))[:samples]:
            self.log(f"  {source}  ->  {translation}")
        averaged = self.average() if self.hp.average_last else None
        if averaged:  # the model holds the average's weights
            result.best_checkpoint = averaged
        elif self.best.path:
            tf.train.Checkpoint(model=self.model).restore(self.best.path).expect_partial()
            result.best_checkpoint = self.best.path
            self.log(f"best checkpoint: {self.best.path} (dev BLEU {self.best.bleu:.2f})")
        if self.test_pairs is not None:
            result.test = self.score_test("average of the last checkpoints" if averaged else "best checkpoint")
        return result

    def average(self):
        """``average_last``: the average of the last checkpoints into the model and MODEL_DIR/average/
        when it beats the best dev BLEU; returns its checkpoint path, else None."""
        sources, references = [s for s, _ in self.eval_set], [t for _, t in self.eval_set]
        path, scores = average.average_if_better(
            self.model_dir, self.hp.average_last, self.model, self.hp, self.tokenizers,
            lambda: evaluation.evaluate(sources, references, self.translate), self.best.bleu)
        if scores is not None:
            self.log(f"average of the last {self.hp.average_last} checkpoints: dev {scores.format()}; "
                     + (f"kept as {path}" if path else f"not better than dev BLEU {self.best.bleu:.2f}, dropped"))
        return path

    def score_test(self, weights):
        """Scores the test split with the model's weights now, ``weights`` saying which they are."""
        pairs = self.test_pairs
        scores = evaluation.evaluate([s for s, _ in pairs], [t for _, t in pairs], self.translate)
        self.log(f"test ({len(pairs)} sentences, {weights}): {scores.format()}")
        self.summaries.scalars(self.position.step, **{"test/bleu": scores.bleu, "test/chrf": scores.chrf})
        return scores

    def export(self, export_dir, checkpoint):
        """Exports ``checkpoint`` (default: the latest) from the model directory, in float32.

        Raises:
          UserError: it failed; the message says how to export later.
        """
        from tf_transformer.export import export_saved_model  # late: it pulls in TF Serving's API

        try:
            path = export_saved_model(self.model_dir, export_dir, checkpoint=checkpoint)
        except (UserError, OSError, tf.errors.OpError) as e:
            later = f"python -m tf_transformer.export --model-dir {self.model_dir} --export-dir {export_dir}"
            raise UserError(f"training is complete but the export to {export_dir} failed "
                            f"({run_files.first_line(e)}); export it later with: {later}"
                            + (f" --checkpoint {checkpoint}" if checkpoint else "")) from None
        self.log(f"exported SavedModel: {path} ({checkpoint or 'latest checkpoint'})")
        return path

    def set_aside(self):
        """``--restart``: moves what earlier runs wrote into ``MODEL_DIR/previous-TIME/``."""
        moved = run_files.set_aside(self.model_dir)
        self.log(f"--restart: earlier runs set aside in {moved}" if moved else "--restart: nothing to set aside")

    def close(self):
        if self.progress is not None:
            self.progress.close()
        if self.summaries is not None:
            self.summaries.close()
        if self.scratch:
            shutil.rmtree(self.scratch, ignore_errors=True)


def summary_lines(result, model_dir):
    """Where a finished run put everything, for the last lines of the log."""
    scores = [f"{name} BLEU {scores.bleu:.1f}" for name, scores in (("dev", result.dev), ("test", result.test))
              if scores is not None]
    lines = [f"done: step {result.step}" + "".join(", " + s for s in scores),
             f"  checkpoints: {result.checkpoint} (latest), {result.best_checkpoint} (best dev BLEU)",
             f"  samples:     {result.samples}",
             f"  TensorBoard: tensorboard --logdir {os.path.join(model_dir, LOG_DIR)}",
             f"  curves:      {os.path.join(model_dir, plots.CURVES_FILE)} (loss, learning rate, dev BLEU)"]
    if result.export:
        lines.append(f"  SavedModel:  {result.export} (translate.py --server/--rest once TF Serving serves it)")
    return lines


def train(hp, splits, model_dir, strategy=None, log=None, progress=False, save_every_secs=0.0, samples=3,
          export=True, export_dir=None, restart=False):
    """Trains (or resumes) a model; see the module docstring.

    Args:
      hp: :class:`~tf_transformer.hparams.HParams`.
      splits: ``{"train": Split, "dev": ..., "test": ...}`` (dev and test optional).
      model_dir: the model directory.
      strategy: a ``tf.distribute`` strategy (default: the current one, one device).
      log: ``callable(str)`` for log lines (default: print, above the progress bar).
      progress: draw a progress bar on standard error.
      save_every_secs: also save when this many seconds passed since the last save (0: off).
      samples: dev translations logged at the end.
      export, export_dir: export a SavedModel at the end, to ``export_dir``
        (default ``MODEL_DIR/export``).
      restart: set what earlier runs wrote aside (:func:`~tf_transformer.model_dir.set_aside`)
        and start from step 0.
    Returns:
      :class:`Result`.
    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint was saved first.
      Diverged: the loss or the weights became non-finite.
      UserError: bad data, a model directory in use by another process, of another
        architecture or tokenizer, no readable checkpoint, an unwritable directory,
        a failed export at the end.
    """
    run = _Run(hp, splits, model_dir, strategy, log, save_every_secs)
    export_dir = (export_dir or os.path.join(model_dir, run_files.EXPORT_SUBDIR)) if export and run.chief else None
    # Non-chief workers of a cluster only read the model directory; the chief writes and locks it.
    with DirectoryLock(model_dir, "--model-dir", remove_if_unused=True) if run.chief else contextlib.nullcontext():
        if export_dir:
            check_writable_directory(export_dir, "--export-dir")
        if restart:
            run.set_aside()
        try:
            return _train_locked(run, samples, export_dir, progress)
        finally:
            run.close()


def _train_locked(run, samples, export_dir, progress):
    """:func:`train` once the model directory is locked: prepare, build, train, finish, export."""
    hp = run.hp
    policy, reason = training.resolve_precision(hp.precision)
    run.log(f"precision: {policy} ({reason}); strategy: {training.describe_strategy(run.strategy)}")
    with StopRequest() as stop:  # from here on a signal means "save and stop"
        with training.precision_policy(policy):
            run.prepare()
            run.build()
            # The bar's length: the plan's, else num_epochs' unless a budget ends the run first (no ETA
            # until a plan is fixed)
            total = run.plan_end or (None if hp.train_minutes else run.steps_per_epoch * hp.num_epochs)
            run.progress = Progress(total, initial_step=run.position.step, disable=not (progress and run.chief))
            run.train(stop)
            run.progress.close()
            stop.at_once("final evaluation", run.checkpoints.latest)  # everything is saved: stop at once
            result = run.finish(samples)
        if export_dir:  # outside the policy scope: the export computes in float32
            stop.at_once("export", run.checkpoints.latest)
            result.export = run.export(export_dir, result.best_checkpoint)
    if run.chief:
        for line in summary_lines(result, run.model_dir):
            run.log(line)
    return result


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_args(args)
    if args.deterministic:
        tf.config.experimental.enable_op_determinism()
    strategy = training.make_strategy(args.strategy)  # before any other op: multi_worker needs that
    hp = load_hparams(args.preset, args.config, args.set)
    model_dir = args.model_dir or os.path.join("runs", args.preset or "default")
    try:
        train(hp, corpus_from_args(args), model_dir, strategy, progress=not args.no_progress,
              save_every_secs=args.save_every_secs, samples=args.samples, export=not args.no_export,
              export_dir=args.export_dir, restart=args.restart)
    except Interrupted as e:
        print(f"interrupted: {e}", file=sys.stderr)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Training (the command line: ``python train.py``, :mod:`tf_transformer.cli.train`).

:func:`train` trains the tokenizer (or reuses the one in the model directory),
batches the corpus by length and trains with a compiled step
(:mod:`tf_transformer.train.step`) under the precision and ``tf.distribute``
strategy asked for. Along the way it

* holds the model directory's lock (:mod:`tf_transformer.locks`): a second
  ``train.py`` or export on it stops at once, naming the process that holds it;
* checks everything it can before the first step: hyper-parameters, every
  split's files, that the model and export directories can be written;
* saves checkpoints every ``save_every_steps`` steps and at each epoch end, and
  resumes from the newest readable one when run again, found from the files
  themselves when the ``checkpoint`` state file is missing or damaged
  (:mod:`tf_transformer.train.checkpoints`); it never starts over from step 0 in a
  directory that holds checkpoints unless ``restart`` sets them aside;
  Ctrl-C or SIGTERM saves and stops (exit code 130 or 143), and after training
  (final evaluation, test scoring, export) stops at once with the same codes;
* stops with one line when the loss or the weights become NaN or Inf
  (:class:`~tf_transformer.train.loop.Diverged`), before any checkpoint, best
  checkpoint or export holds them;
* every ``eval_every_epochs`` epochs and at the end, translates the dev split
  and scores it (BLEU and chrF with sacrebleu's signatures), keeps the best
  checkpoint by dev BLEU in ``MODEL_DIR/best/`` and writes sample translations
  to ``MODEL_DIR/samples-stepN.txt``;
* shows a progress bar (loss, learning rate, tokens/s, ETA) and writes
  TensorBoard summaries to ``MODEL_DIR/logs/``;
* at the end scores the test split with the best checkpoint and exports it as a
  SavedModel to ``MODEL_DIR/export/``.

The pieces, each with its inputs given: :func:`prepare_data` (tokenizers,
examples, the pairs to score), :func:`build_state` (model, optimizer, restored
checkpoints), :class:`~tf_transformer.train.loop.StepLoop` (the steps),
:class:`~tf_transformer.train.evaluate.Evaluator` (dev and test scoring, samples,
the best checkpoint) and :func:`export_at_end`.

With the ``multi_worker`` strategy one process runs per ``TF_CONFIG`` task; only
the chief (task ``chief``, else worker 0) writes checkpoints, summaries, samples
and the export and evaluates; the workers agree on stopping every 20 steps and
at epoch ends, so a signal to any of them stops all at the same step.
"""

import contextlib
import dataclasses
import itertools
import os
import shutil
import tempfile
import time
from typing import NamedTuple

import keras
import tensorflow as tf

from tf_transformer.data import data_load, shards
from tf_transformer.data.tokenizer import tokenizer_fingerprint, train_tokenizers
from tf_transformer.errors import UserError, first_line
from tf_transformer.files import check_writable_directory
from tf_transformer.infer.export import export_model_dir
from tf_transformer.locks import DirectoryLock
from tf_transformer.model_dir import checkpoint_files, checks, run_files
from tf_transformer.train import scores as evaluation, step as training
from tf_transformer.train.average import kept_weights
from tf_transformer.train.checkpoints import Position, StopRequest, TrainingCheckpoints, tokenizer_check
from tf_transformer.train.evaluate import EVAL_PAIRS_FROM_TRAIN, Evaluator, Final, eval_pairs
from tf_transformer.train.loop import LearningRatePlan, StepLoop
from tf_transformer.train.step_speed import choose_precision
from tf_transformer.train.xla_cache import use_persistent_cache
from tf_transformer.progress import Progress
from tf_transformer.train.summaries import CURVES_FILE, LOG_DIR, Summaries


def prepare_tokenizers(model_dir, hp, pairs, log):
    """The model directory's tokenizers, or new ones trained on ``pairs``."""
    tokenizers = run_files.load_tokenizers(model_dir, hp)
    if tokenizers is not None:
        return tokenizers
    started = time.monotonic()
    tokenizers = train_tokenizers(hp, pairs)
    log(f"tokenizer: {hp.tokenizer}, trained in {time.monotonic() - started:.1f}s")
    return tokenizers


class PreparedExamples(NamedTuple):
    """What :func:`prepare_examples` read: the (source, target) tokenizers, the encoded training
    pairs (:func:`~tf_transformer.data.data_load.encode_pairs`) and the text pairs they came from."""

    tokenizers: tuple
    examples: data_load.Examples  # or shards.ShardedExamples (streamed)
    train_pairs: list


def prepare_examples(splits, hp, model_dir, log):
    """Reads the training split, prepares tokenizers, tokenizes and filters; logs what was dropped.

    Returns:
      :class:`PreparedExamples`.
    """
    train_split = splits["train"].read()
    checks.check_compatible(model_dir, hp)
    tokenizers = prepare_tokenizers(model_dir, hp, train_split.pairs, log)
    examples = data_load.encode_pairs(train_split.pairs, *tokenizers, hp.maxlen)
    if not len(examples):
        raise UserError(f"{train_split.origin}: no sentence pair of at most maxlen={hp.maxlen} tokens "
                        f"(</S> included); raise it with --set maxlen=N")
    log(f"corpus: {len(examples)} pairs from {train_split.origin} ({train_split.blank} with a blank side and "
        f"{examples.too_long} longer than maxlen={hp.maxlen} dropped); vocabulary: "
        f"{tokenizers[0].vocab_size} source, {tokenizers[1].vocab_size} target")
    return PreparedExamples(tokenizers, examples, train_split.pairs)


def prepare_streamed(split, hp, model_dir, chief, worker, workers, log):
    """:func:`prepare_examples` for a corpus streamed from shards (:mod:`tf_transformer.data.shards`): the
    tokenizers are trained on the split read a block at a time, the chief prepares the shards when they
    are missing or stale, and this worker gets its own shards.

    Returns:
      :class:`PreparedExamples` whose examples are :class:`~tf_transformer.data.shards.ShardedExamples` and
      whose text pairs are the split's first ones (what evaluations score without a dev split).
    """
    checks.check_compatible(model_dir, hp)
    stream = split.stream()
    tokenizers = prepare_tokenizers(model_dir, hp, stream, log)
    manifest = shards.open_shards(model_dir, split, tokenizers, hp, chief, log)
    examples = shards.ShardedExamples(shards.shards_directory(model_dir), manifest, worker, workers)
    own = examples.own_shards()
    log(f"corpus: {len(examples)} pairs from {stream.origin}, streamed from {len(manifest.shards)} shard(s) in "
        f"{examples.directory} ({manifest.blank} with a blank side and {manifest.too_long} longer than "
        f"maxlen={hp.maxlen} dropped); worker {worker + 1}/{workers} reads shard(s) {','.join(map(str, own))} "
        f"({sum(manifest.shards[i].pairs for i in own)} pairs); vocabulary: {tokenizers[0].vocab_size} source, "
        f"{tokenizers[1].vocab_size} target")
    first_pairs = list(itertools.islice(stream, 4 * EVAL_PAIRS_FROM_TRAIN))
    return PreparedExamples(tokenizers, examples, first_pairs)


@dataclasses.dataclass
class TrainingData:
    """What a run trains on and scores (:func:`prepare_data`)."""

    tokenizers: tuple
    examples: data_load.Examples  # or shards.ShardedExamples (streamed)
    dev_pairs: list
    test_pairs: list | None
    steps_per_epoch: int
    local_batches: bool = False  # each worker feeds its own part of the global batch (streamed shards)


def prepare_data(splits, hp, model_dir, chief, log, worker=0, workers=1):
    """Reads every split (so that their errors come now; the training split streamed when
    ``hp.input_pipeline`` says so), prepares the tokenizers and examples, and (chief) writes
    hparams.yaml and the tokenizer files into ``model_dir``. ``worker``: this worker's index among ``workers``."""
    streamed = shards.wants_streaming(hp, splits["train"])
    if streamed:
        tokenizers, examples, train_pairs = prepare_streamed(splits["train"], hp, model_dir, chief, worker, workers,
                                                             log)
    else:
        tokenizers, examples, train_pairs = prepare_examples(splits, hp, model_dir, log)
    dev_pairs = eval_pairs(splits, train_pairs, tokenizers, hp.maxlen, log)
    test_pairs = splits["test"].read().pairs if "test" in splits else None
    if chief:
        run_files.save_run_files(model_dir, hp, *tokenizers)
    return TrainingData(tokenizers, examples, dev_pairs, test_pairs, training.count_updates(examples, hp),
                        local_batches=streamed and workers > 1)


@dataclasses.dataclass
class TrainingState:
    """The model and optimizer of a run, with its checkpoints restored (:func:`build_state`)."""

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    checkpoints: TrainingCheckpoints
    position: Position


def build_state(hp, tokenizers, model_dir, strategy, scratch, log, init_from=None):
    """Builds the model and optimizer under ``strategy`` (seeded by ``hp.seed``) and restores the newest
    readable checkpoint of ``model_dir``; without one, the weights training kept in ``init_from``
    (:func:`initial_weights`).

    Args:
      scratch: where a non-chief worker saves (a directory it deletes), None for the chief.
      init_from: a model directory whose weights a new run starts from (None: random weights).
    """
    keras.utils.set_random_seed(hp.seed)
    with strategy.scope():
        model = checkpoint_files.build_model(hp, *tokenizers)
        optimizer = training.make_optimizer(hp)
        training.build_optimizer(optimizer, model.trainable_variables)
    checkpoints = TrainingCheckpoints(
        model_dir, model, optimizer, tokenizer_fingerprint(*tokenizers), hp.keep_checkpoints,
        write_directory=scratch, architecture=checks.architecture_record(hp))
    restored = checkpoints.restore_latest(log, tokenizer_check(model_dir, hp, tokenizers))
    position = checkpoints.position if restored else Position()
    if restored:
        log(f"resumed from {restored} (step {position.step}, epoch {position.epoch + 1}, batch {position.batch})"
            + (f"; --init-from {init_from} only starts a new run" if init_from else ""))
    elif init_from:
        initial_weights(model, hp, tokenizers, init_from, log)
    return TrainingState(model, optimizer, checkpoints, position)


def initial_weights(model, hp, tokenizers, init_from, log):
    """Restores into ``model`` the weights training kept in the model directory ``init_from``
    (:func:`~tf_transformer.train.average.kept_weights`), checked like a resume's; the optimizer and the
    schedule stay fresh (step 0).

    Raises:
      UserError: no checkpoint there, or one of another architecture or tokenizer.
    """
    weights = kept_weights(init_from)
    path = weights.checkpoint or (checkpoint_files.find_checkpoints(weights.model_dir) or [None])[-1]
    if path is None:
        raise UserError(f"--init-from {init_from}: no checkpoint there; train it first")
    checks.check_architecture(path, hp, "the hyper-parameters say", "fine-tune with its own architecture")
    checks.check_tokenizer(weights.model_dir, hp, path, tokenizers)
    status = checkpoint_files.restore_model(model, path)
    try:
        status.assert_existing_objects_matched()
    except AssertionError as e:
        raise UserError(f"--init-from {init_from}: {path} does not hold this model's weights ({first_line(e)})") \
            from None
    log(f"initialised from {init_from}: {weights.description}; a new run with a fresh optimizer and learning-rate "
        f"schedule from step 0")


def coverage_line(tokenizers, examples, dev_pairs, maxlen):
    """How much of the corpus the tokenizer of ``--init-from`` cannot cover: the ``<UNK>`` share of each side
    of the training pairs (in memory) or of the pairs scored on dev (streamed), one log line."""
    if isinstance(examples, data_load.Examples):
        where = "training"
    else:
        examples, where = data_load.encode_pairs(dev_pairs, *tokenizers, maxlen), "dev"
    source, target = examples.unk_shares()
    line = (f"tokenizer coverage (kept from --init-from): {source:.2%} of the source and {target:.2%} of the "
            f"target tokens of the {where} pairs are <UNK>")
    return line + ("; text it cannot cover is lost to fine-tuning" if max(source, target) >= 0.01 else "")


@dataclasses.dataclass
class Result:
    """What :func:`train` did: the model (with the best checkpoint's weights when one
    was kept), the last step, the last dev and the test :class:`~tf_transformer.train.scores.Scores`
    (None where not computed), the paths it wrote, and the dev BLEU of the kept weights
    (``best_checkpoint``'s: the best checkpoint, or the average of the last ones)."""

    model: keras.Model
    step: int
    dev: evaluation.Scores = None
    test: evaluation.Scores = None
    checkpoint: str = None
    best_checkpoint: str = None
    samples_file: str = None
    export: str = None
    best_dev_bleu: float = None


def export_at_end(model_dir, export_dir, checkpoint, log):
    """Exports ``checkpoint`` (default: the latest) from the model directory, in float32.

    Raises:
      UserError: it failed; the message says how to export later.
    """
    try:
        path = export_model_dir(model_dir, export_dir, checkpoint=checkpoint, log=log)
    except (UserError, OSError, tf.errors.OpError) as e:
        later = f"python -m tf_transformer.cli.export --model-dir {model_dir} --export-dir {export_dir}"
        raise UserError(f"training is complete but the export to {export_dir} failed "
                        f"({first_line(e)}); export it later with: {later}"
                        + (f" --checkpoint {checkpoint}" if checkpoint else "")) from None
    log(f"exported SavedModel: {path} ({checkpoint or 'latest checkpoint'})")
    return path


def summary_lines(result, model_dir):
    """Where a finished run put everything, for the last lines of the log."""
    scores = []
    if result.dev is not None:
        scores.append(f"dev BLEU {result.dev.bleu:.1f}")
        if result.best_dev_bleu is not None and result.best_checkpoint:
            scores[-1] += f" (last checkpoint), {result.best_dev_bleu:.1f} (kept weights)"
    if result.test is not None:
        scores.append(f"test BLEU {result.test.bleu:.1f}")
    lines = [f"done: step {result.step}" + "".join(", " + s for s in scores),
             f"  checkpoints: {result.checkpoint} (latest), {result.best_checkpoint} (best dev BLEU)",
             f"  samples:     {result.samples_file}",
             f"  TensorBoard: tensorboard --logdir {os.path.join(model_dir, LOG_DIR)}",
             f"  curves:      {os.path.join(model_dir, CURVES_FILE)} (loss, learning rate, dev BLEU)"]
    if result.export:
        lines.append(f"  SavedModel:  {result.export} (translate.py --server/--rest once TF Serving serves it)")
    return lines


def _printer(log, progress=None):
    """Where log lines go: ``log`` when given, else above the progress bar, else standard output."""
    if log is not None:
        return log
    if progress is not None:
        return progress.write
    return lambda line: print(line, flush=True)


def train(hp, splits, model_dir, strategy=None, log=None, progress=False, save_every_secs=0.0, samples=3,
          export=True, export_dir=None, restart=False, init_from=None):
    """Trains (or resumes) a model; see the module docstring.

    Args:
      hp: :class:`~tf_transformer.hparams.HParams`.
      splits: ``{"train": Split, "dev": ..., "test": ...}`` (dev and test optional).
      model_dir: the model directory.
      strategy: a ``tf.distribute`` strategy (default: the current one, one device).
      log: ``callable(str)`` for log lines (default: print, above the progress bar).
      progress: draw a progress bar on standard error.
      save_every_secs: also save when this many seconds passed since the last save (0: off).
      samples: how many dev translations to log at the end.
      export, export_dir: export a SavedModel at the end, to ``export_dir``
        (default ``MODEL_DIR/export``).
      restart: set what earlier runs wrote aside (:func:`~tf_transformer.model_dir.run_files.set_aside`)
        and start from step 0.
      init_from: fine-tuning: a model directory whose kept weights and tokenizer a new run in ``model_dir``
        starts from (:func:`initial_weights`), its architecture hyper-parameters the same as ``hp``'s; a
        ``model_dir`` with checkpoints resumes them instead.
    Returns:
      :class:`Result`.
    Raises:
      Interrupted: SIGINT/SIGTERM arrived; a checkpoint was saved first.
      Diverged: the loss or the weights became non-finite.
      UserError: bad data, a model directory in use by another process, of another
        architecture or tokenizer, no readable checkpoint, an unwritable directory,
        a failed export at the end.
    """
    strategy = strategy or tf.distribute.get_strategy()
    chief = training.is_chief(strategy)
    export_dir = (export_dir or os.path.join(model_dir, run_files.EXPORT_SUBDIR)) if export and chief else None
    # Non-chief workers of a cluster only read the model directory; the chief writes and locks it.
    with DirectoryLock(model_dir, "--model-dir", remove_if_unused=True) if chief else contextlib.nullcontext():
        if export_dir:
            check_writable_directory(export_dir, "--export-dir")
        if restart:
            moved = run_files.set_aside(model_dir)
            _printer(log)(f"--restart: earlier runs set aside in {moved}" if moved
                          else "--restart: nothing to set aside")
        if init_from:
            start_from(init_from, model_dir, hp, chief)
        # Non-chief workers save too (saving may need every worker) but into a directory they delete.
        scratch = None if chief else tempfile.mkdtemp(prefix="tf-transformer-worker-")
        try:
            result = _train_locked(hp, splits, model_dir, strategy, chief, scratch, log, progress,
                                   save_every_secs, samples, export_dir, init_from)
        finally:
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
    return result


def start_from(init_from, model_dir, hp, chief):
    """Checks a fine-tuning run (``--init-from``) and gives ``model_dir`` the tokenizer of ``init_from``
    (the chief, where ``model_dir`` has none).

    Raises:
      UserError: ``init_from`` is ``model_dir``, or was trained with other architecture hyper-parameters.
    """
    if os.path.isdir(init_from) and os.path.isdir(model_dir) and os.path.samefile(init_from, model_dir):
        raise UserError(f"--init-from {init_from}: is the --model-dir; fine-tuning writes a new run: give another "
                        f"--model-dir (or drop --init-from to resume this one)")
    checks.check_same_architecture(init_from, hp)
    if chief:
        run_files.copy_tokenizer_files(init_from, model_dir, hp)


def _train_locked(hp, splits, model_dir, strategy, chief, scratch, log, progress, save_every_secs, samples,
                  export_dir, init_from=None):
    """:func:`train` once the model directory is locked: prepare, build, train, finish, export."""
    say = _printer(log)
    use_persistent_cache()  # before the first XLA compile of the process
    with StopRequest() as stop:  # from here on a signal means "save and stop"
        data = prepare_data(splits, hp, model_dir, chief, say, training.worker_index(strategy),
                            training.workers(strategy))
        if init_from:
            say(coverage_line(data.tokenizers, data.examples, data.dev_pairs, hp.maxlen))
        policy, reason = choose_precision(hp)  # after the data: a mistake there is said without measuring first
        say(f"precision: {policy} ({reason}); strategy: {training.describe_strategy(strategy)}")
        with training.precision_policy(policy):
            state = build_state(hp, data.tokenizers, model_dir, strategy, scratch, say, init_from)
            plan = LearningRatePlan(state.optimizer, state.checkpoints, state.position.step,
                                    data.steps_per_epoch * hp.num_epochs, hp.train_minutes, say)
            train_step = training.make_train_step(state.model, state.optimizer, hp, strategy, data.local_batches)
            # The bar's length: the plan's, else num_epochs' unless a budget ends the run first (no ETA
            # until a plan is fixed)
            total = plan.end or (None if hp.train_minutes else data.steps_per_epoch * hp.num_epochs)
            with Progress(total, initial_step=state.position.step, disable=not (progress and chief)) as bar, \
                    Summaries(os.path.join(model_dir, LOG_DIR) if chief else None) as summaries:
                say = _printer(log, bar)
                evaluator = Evaluator(hp, state.model, data.tokenizers, model_dir, data.dev_pairs, data.test_pairs,
                                      summaries, evaluation.BestCheckpoint(model_dir, state.checkpoints.checkpoint),
                                      say) if chief else None
                loop = StepLoop(hp, data.examples, state.model, state.optimizer, train_step, state.checkpoints,
                                state.position, plan, strategy, summaries, bar, say, save_every_secs,
                                evaluate=evaluator.evaluate if evaluator else None)
                position = loop.run(stop)
                bar.close()
                stop.at_once("final evaluation", state.checkpoints.latest)  # everything is saved: stop at once
                final = evaluator.finish(position.step, samples) if evaluator is not None else Final()
        exported = None
        if export_dir:  # outside the policy scope: the export computes in float32
            stop.at_once("export", state.checkpoints.latest)
            exported = export_at_end(model_dir, export_dir, final.best_checkpoint, say)
    result = Result(state.model, position.step, dev=final.dev, test=final.test,
                    checkpoint=state.checkpoints.manager.latest_checkpoint, best_checkpoint=final.best_checkpoint,
                    samples_file=final.samples_file, export=exported, best_dev_bleu=final.best_dev_bleu)
    if chief:
        for line in summary_lines(result, model_dir):
            say(line)
    return result

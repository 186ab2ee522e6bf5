"""Checkpoints that never lose work.

:class:`TrainingCheckpoints` keeps, with ``tf.train.CheckpointManager``, the
last ``hp.keep_checkpoints`` checkpoints of everything a run needs to go on
exactly where it stopped:

* the model's weights and the optimizer (moments, ``iterations``, loss scale);
* the dropout random state (Keras ``SeedGenerator`` variables, which
  ``tf.train.Checkpoint`` does not reach through the model on its own);
* the data position: ``epoch`` and ``batch_in_epoch``, the batches of the epoch
  already trained on, and ``step``, the training steps so far. Each epoch's
  order is fixed by the seed and the epoch (see
  :func:`tf_transformer.train.step.epoch_batches`), so resuming re-runs the input
  pipeline up to that batch and skips it: two integers, exact, instead of a
  ``tf.data`` iterator checkpoint, which would store the whole shuffle buffer
  (the corpus, again, in every checkpoint);
* ``tokenizer_fingerprint``, the sha256 of the tokenizer files.

TensorFlow writes a checkpoint's files before it names it in the ``checkpoint``
state file, so a run killed at any moment leaves its last complete checkpoint.
Checkpoints are found from the state file and from their own files
(:func:`tf_transformer.model_dir.checkpoint_files.restore_newest`): a missing or damaged state
file is reported and written anew, a damaged checkpoint (truncated, corrupted,
missing files) is reported by name and the one before it is used. Each
checkpoint also records the architecture hyper-parameters, which a restore
compares before reading any weight. :class:`StopRequest` turns SIGINT/SIGTERM
into "save and stop after this step", and after training into "stop now".
"""

import copy
import dataclasses
import functools
import glob
import os
import shutil
import signal
import threading
import time

import tensorflow as tf

from tf_transformer.errors import UserError, first_line
from tf_transformer.files import disk_error, is_disk_problem
from tf_transformer.model_dir import checkpoint_files, checks


class _Trace:
    """The traced write of a :class:`Checkpoint` (not trackable, so not saved)."""

    function = None


class Checkpoint(tf.train.Checkpoint):
    """``tf.train.Checkpoint`` whose writes run one traced function.

    An eager write gathers, reads and serializes every variable in Python, one op at a time: 0.1-0.3 s even for
    the toy model's ~270 variables and optimizer slots, most of a toy epoch, which saves at its end. Traced once
    (about a second), a write is one graph call (~0.01 s) of the same ops, writing the same files. The trace holds
    the objects saved and the options (its callbacks aside) of the write that made it: :meth:`forget_trace` after
    adding an object or to change the options. ``tf.train.CheckpointManager.save``
    writes through ``_write`` (TensorFlow 2.21), which this overrides; the manager's bookkeeping (its callbacks)
    runs after the traced write, as in ``tf.train.Checkpoint``'s own.
    """

    def __init__(self, **parts):
        super().__init__(**parts)
        self._trace = _Trace()

    def forget_trace(self):
        self._trace.function = None

    def _traced_write(self, prefix, options, cpu):
        # The save writes one file per task of the tensors' devices: under the full name of this task's CPU
        # the object graph's bare "/cpu:0" is no task of its own (as in an eager write).
        with tf.device(cpu):
            return tf.train.Checkpoint._write(self, prefix, options)

    def _write(self, file_prefix, options=None):
        options = copy.copy(options) if options is not None else tf.train.CheckpointOptions()
        callbacks, options.experimental_write_callbacks = options.experimental_write_callbacks or [], None
        if self._trace.function is None:
            with tf.device("/cpu:0"):
                cpu = tf.constant(0).device  # e.g. /job:localhost/replica:0/task:0/device:CPU:0
            self._trace.function = tf.function(functools.partial(self._traced_write, options=options, cpu=cpu),
                                               autograph=False)
        tf.io.gfile.makedirs(os.path.dirname(file_prefix))  # as the eager write does
        path = self._trace.function(tf.constant(file_prefix)).numpy().decode()
        for callback in callbacks:
            callback(path)
        return path


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training stands: ``step`` steps done, ``batch`` batches into epoch ``epoch`` (0-based)."""

    step: int = 0
    epoch: int = 0
    batch: int = 0


class TrainingCheckpoints:
    """The checkpoints of one training run.

    Args:
      directory: the model directory, where checkpoints are restored from and saved.
      model, optimizer: built (their variables exist).
      fingerprint: :func:`tf_transformer.model_dir.checks.tokenizer_fingerprint`.
      keep: checkpoints kept (``hp.keep_checkpoints``).
      write_directory: save there instead (non-chief workers of a cluster
        save too, into a directory that they delete).
      architecture: :func:`tf_transformer.model_dir.checks.architecture_record`, stored in every
        checkpoint saved (restoring does not need it: older checkpoints lack it).
    Attributes:
      checkpoint: the :class:`Checkpoint` that saves (the best checkpoint uses it too).
    """

    def __init__(self, directory, model, optimizer, fingerprint, keep, write_directory=None, architecture=None):
        self.directory, self.keep, self.write_directory = directory, keep, write_directory
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.batch_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch_in_epoch")
        parts = dict(model=model, optimizer=optimizer, step=self.step, epoch=self.epoch,
                     batch_in_epoch=self.batch_in_epoch, dropout_seeds=list(model.non_trainable_variables),
                     tokenizer_fingerprint=tf.Variable(fingerprint, trainable=False, name="tokenizer_fingerprint"))
        self._restorer = tf.train.Checkpoint(**parts)
        if architecture is not None:
            parts["architecture"] = tf.Variable(architecture, trainable=False, name="architecture")
        self.checkpoint = Checkpoint(**parts)
        if write_directory is None:
            checkpoint_files.set_aside_unreadable_state_file(directory)
        self._open_managers()

    def _open_managers(self):
        """(Re)reads the state file: the managers rotate the checkpoints it lists."""
        self.manager = tf.train.CheckpointManager(self.checkpoint, self.directory, max_to_keep=self.keep)
        self._writer = self.manager
        if self.write_directory is not None:
            self._writer = tf.train.CheckpointManager(self.checkpoint, self.write_directory, max_to_keep=1)

    @property
    def position(self):
        """The :class:`Position` held by the variables (the last saved or restored one)."""
        return Position(int(self.step.numpy()), int(self.epoch.numpy()), int(self.batch_in_epoch.numpy()))

    @property
    def latest(self):
        """The path of the last checkpoint saved (in the write directory) or restored."""
        return self._writer.latest_checkpoint or self.manager.latest_checkpoint

    def save(self, position):
        """Saves everything at ``position``; the checkpoint is numbered by its step. Returns its path."""
        self.step.assign(position.step)
        self.epoch.assign(position.epoch)
        self.batch_in_epoch.assign(position.batch)
        return save_checkpoint(self._writer, position.step)

    def restore_latest(self, log, check=None):
        """Restores the newest readable checkpoint (:func:`~tf_transformer.model_dir.checkpoint_files.restore_newest`).

        When the state file does not list every checkpoint on disk (it is missing
        or damaged), it is written anew, listing them, so that rotation goes on.

        Args:
          log: ``callable(str)``.
          check: optional ``callable(path)`` run before restoring (e.g. the
            tokenizer check); its :class:`UserError` stops everything.
        Returns:
          the path restored, or None when the directory has no checkpoint.
        Raises:
          UserError: there are checkpoints but none is readable (all are named),
            or one does not match the model being trained.
        """
        path = checkpoint_files.restore_newest(self.directory, self._restore, log, check)
        if path is not None and checkpoint_files.unlisted_checkpoints(self.directory) and self.write_directory is None:
            candidates = checkpoint_files.find_checkpoints(self.directory)
            paths = [p for p in candidates if p != path] + [path]
            now = time.time()  # the managers rotate only the checkpoints listed with a timestamp
            tf.compat.v1.train.update_checkpoint_state(
                self.directory, path, paths, all_model_checkpoint_timestamps=[now] * len(paths),
                last_preserved_timestamp=now - 1.0)  # only the newer ones are rotated
            self._open_managers()
            log(f"{os.path.join(self.directory, 'checkpoint')} written anew, listing {len(candidates)} checkpoint(s)")
        return path

    def attach(self, name, trackable):
        """Adds ``trackable`` to what is saved, under ``name``; when a checkpoint was restored already, its
        values for ``name`` are restored now (deferred restoration), and a checkpoint without them leaves it."""
        setattr(self.checkpoint, name, trackable)
        self.checkpoint.forget_trace()
        setattr(self._restorer, name, trackable)

    def _restore(self, path):
        # expect_partial: the checkpoint's architecture record is read by the check, not restored.
        status = self._restorer.restore(path).expect_partial()
        try:
            status.assert_existing_objects_matched()
        except AssertionError as e:
            raise UserError(f"{path}: does not match the model being trained ({first_line(e)}); "
                            f"use another --model-dir") from None


def save_checkpoint(manager, number):
    """``manager.save(checkpoint_number=number)``; returns the path saved.

    A disk that is full or read-only stops everything with one line naming the folder and its free
    space; what the failed save wrote is removed, and the checkpoints before it are whole (TensorFlow
    names a checkpoint in the state file only after its files are complete).

    Raises:
      UserError: the disk refused the checkpoint.
    """
    try:
        return manager.save(checkpoint_number=number)
    except (tf.errors.OpError, OSError) as e:
        if not is_disk_problem(e):
            raise
        _remove_partial(manager.directory, number)
        latest = manager.latest_checkpoint
        kept = f"the latest checkpoint, {latest}, is intact" if latest else "no checkpoint was written"
        raise disk_error(e, "checkpoint", manager.directory,
                         f"{kept}; free some space and run the same command again to resume") from None


def _remove_partial(directory, number):
    """Removes what a failed save of checkpoint ``number`` left: its temporary folder, and its files
    when it has no index (the index is written last)."""
    prefix = os.path.join(directory, f"ckpt-{number}")
    for path in glob.glob(glob.escape(prefix) + "_temp*"):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.remove(path)
    if not os.path.exists(prefix + ".index"):
        for path in glob.glob(glob.escape(prefix) + ".data-*"):
            os.remove(path)


def tokenizer_check(model_dir, hp, tokenizers):
    """A ``check`` for :meth:`TrainingCheckpoints.restore_latest`: the checkpoint's
    tokenizer fingerprint must match the tokenizer files in ``model_dir``, and its
    architecture record the hyper-parameters of this run."""

    def check(path):
        checks.check_tokenizer(model_dir, hp, path, tokenizers)
        checks.check_architecture(path, hp, "this run's hyper-parameters say",
                                     "use the values it was trained with, another --model-dir, or --restart "
                                     "(which sets the old run aside)")

    return check


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint; ``exit_code`` is 128 + the signal number.

    ``phase``: None while training (``checkpoint`` was saved at the step it stopped), else
    what was stopped after training ended (e.g. ``"export"``; ``checkpoint`` is the latest).
    """

    def __init__(self, signum, checkpoint, phase=None):
        self.signum = signum
        self.exit_code = 128 + signum
        self.checkpoint = checkpoint
        name = signal.Signals(signum).name
        if phase is None:
            message = f"stopped by {name}; saved {checkpoint}, run the same command again to resume"
        else:
            message = (f"stopped by {name} during the {phase}; training is complete (latest checkpoint "
                       f"{checkpoint}): run the same command again to evaluate, score the test split and export")
        super().__init__(message)


class StopRequest:
    """While active (``with StopRequest() as stop:``), SIGINT and SIGTERM set
    :attr:`signum` instead of killing the process; the training loop saves and
    stops when it sees it. A second SIGINT raises ``KeyboardInterrupt`` at once.
    After :meth:`at_once`, a signal raises :class:`Interrupted` at once instead.
    The previous handlers come back on exit. Outside the main thread (where
    Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._previous = {}
        self._phase = None

    def at_once(self, phase, checkpoint):
        """From now on (``phase``, e.g. ``"export"``, with nothing left unsaved) a signal raises
        ``Interrupted(signum, checkpoint, phase)`` at once; so does one already received."""
        self._phase = (phase, checkpoint)
        if self.signum is not None:
            raise Interrupted(self.signum, checkpoint, phase)

    def _handle(self, signum, frame):
        if self._phase is not None:
            phase, checkpoint = self._phase
            raise Interrupted(signum, checkpoint, phase)
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
        return self

    def __exit__(self, *exc_info):
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

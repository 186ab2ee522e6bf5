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
  :func:`tf_transformer.training.epoch_batches`), so resuming re-runs the input
  pipeline up to that batch and skips it: two integers, exact, instead of a
  ``tf.data`` iterator checkpoint, which would store the whole shuffle buffer
  (the corpus, again, in every checkpoint);
* ``tokenizer_fingerprint``, the sha256 of the tokenizer files.

TensorFlow writes a checkpoint's files before it names it in the ``checkpoint``
state file, so a run killed at any moment leaves its last complete checkpoint.
A damaged one (truncated, corrupted, missing files) is reported by name and the
one before it is used. :class:`StopRequest` turns SIGINT/SIGTERM into "save and
stop after this step".
"""

import dataclasses
import signal
import threading

import tensorflow as tf

from tf_transformer import model_dir as run_files
from tf_transformer.errors import UserError


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
      fingerprint: :func:`tf_transformer.model_dir.tokenizer_fingerprint`.
      keep: checkpoints kept (``hp.keep_checkpoints``).
      write_directory: save there instead (non-chief workers of a cluster
        save too, into a directory that they delete).
    """

    def __init__(self, directory, model, optimizer, fingerprint, keep, write_directory=None):
        self.step = tf.Variable(0, dtype=tf.int64, trainable=False, name="step")
        self.epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="epoch")
        self.batch_in_epoch = tf.Variable(0, dtype=tf.int64, trainable=False, name="batch_in_epoch")
        self.checkpoint = tf.train.Checkpoint(
            model=model, optimizer=optimizer, step=self.step, epoch=self.epoch,
            batch_in_epoch=self.batch_in_epoch, dropout_seeds=list(model.non_trainable_variables),
            tokenizer_fingerprint=tf.Variable(fingerprint, trainable=False, name="tokenizer_fingerprint"))
        self.manager = tf.train.CheckpointManager(self.checkpoint, directory, max_to_keep=keep)
        self._writer = self.manager
        if write_directory is not None:
            self._writer = tf.train.CheckpointManager(self.checkpoint, write_directory, max_to_keep=1)

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
        return self._writer.save(checkpoint_number=position.step)

    def restore_latest(self, log, check=None):
        """Restores the newest readable checkpoint.

        A checkpoint that cannot be read is reported through ``log`` with its
        files named, and the one before it is tried.

        Args:
          log: ``callable(str)``.
          check: optional ``callable(path)`` run before restoring (e.g. the
            tokenizer check); its :class:`UserError` stops everything.
        Returns:
          the path restored, or None when the directory has no checkpoint.
        Raises:
          UserError: there are checkpoints but none is readable (all are named).
        """
        candidates = list(reversed(self.manager.checkpoints))
        for path in candidates:
            try:
                if check is not None:
                    check(path)
                status = self.checkpoint.restore(path)
            except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated data file
                log(f"warning: checkpoint {path} is unreadable ({_first_line(e)}); "
                    f"trying the one before it")
                continue
            try:
                status.assert_existing_objects_matched()
            except AssertionError as e:
                raise UserError(f"{path}: does not match the model being trained ({_first_line(e)}); "
                                f"use another --model-dir") from None
            return path
        if candidates:
            raise UserError(f"no readable checkpoint in {self.manager.directory} (tried {', '.join(candidates)}); "
                            f"move them away to start over")
        return None


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def tokenizer_check(model_dir, hp, tokenizers):
    """A ``check`` for :meth:`TrainingCheckpoints.restore_latest`: the checkpoint's
    tokenizer fingerprint must match the tokenizer files in ``model_dir``."""
    return lambda path: run_files.check_tokenizer(model_dir, hp, path, tokenizers)


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint; ``exit_code`` is 128 + the signal number."""

    def __init__(self, signum, checkpoint):
        self.signum = signum
        self.exit_code = 128 + signum
        self.checkpoint = checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name}; saved {checkpoint}, "
                         f"run the same command again to resume")


class StopRequest:
    """While active (``with StopRequest() as stop:``), SIGINT and SIGTERM set
    :attr:`signum` instead of killing the process; the training loop saves and
    stops when it sees it. A second SIGINT raises ``KeyboardInterrupt`` at once.
    The previous handlers come back on exit. Outside the main thread (where
    Python cannot install handlers) it does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.signum = None
        self._previous = {}

    def _handle(self, signum, frame):
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

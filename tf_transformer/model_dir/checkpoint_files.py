"""The checkpoints of a model directory: finding them, restoring the newest readable one, and the model
they fill.

Every reader (the trainer, ``translate.py``, the export) finds checkpoints the
same way, :func:`restore_newest`: from the ``checkpoint`` state file and from
the ``ckpt-N.index`` files themselves, so a missing or damaged state file loses
nothing, and newest first, so a damaged checkpoint is reported and the one
before it used.
"""

import os
import re

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import SPECIALS
from tf_transformer.errors import UserError, first_line
from tf_transformer.model_dir.run_files import PREVIOUS_PREFIX
from tf_transformer.nn.model import Transformer

_CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


def find_checkpoints(directory):
    """The checkpoints of ``directory``, oldest first: those the ``checkpoint`` state file lists
    and every ``ckpt-N.index`` file (a damaged or missing state file loses none).

    Returns:
      paths ``DIRECTORY/ckpt-N``, ordered by N.
    """
    names = sorted(_listed_checkpoints(directory) | _checkpoint_files(directory), key=_checkpoint_number)
    return [os.path.join(directory, name) for name in names]


def unlisted_checkpoints(directory):
    """The names of the checkpoints on disk that the state file does not list (it is missing or damaged)."""
    return sorted(_checkpoint_files(directory) - _listed_checkpoints(directory), key=_checkpoint_number)


def _checkpoint_files(directory):
    return {m.group(0)[: -len(".index")] for m in map(_CHECKPOINT_INDEX.match, _listdir(directory)) if m}


def _listed_checkpoints(directory):
    return {os.path.basename(p) for p in _state_file_paths(directory) if p}


def _state_file_paths(directory):
    """The checkpoints the ``checkpoint`` state file lists; none when it is missing or damaged."""
    try:
        state = tf.train.get_checkpoint_state(directory) if os.path.isdir(directory) else None
    except (tf.errors.OpError, UnicodeDecodeError, ValueError):
        return []
    return [*state.all_model_checkpoint_paths, state.model_checkpoint_path] if state else []


def set_aside_unreadable_state_file(directory):
    """Renames a ``checkpoint`` state file that TensorFlow cannot even decode (its checkpoint
    manager would fail on it) to ``checkpoint.damaged``; the checkpoints are found from their files."""
    path = os.path.join(directory, "checkpoint")
    if os.path.isfile(path) and not _state_file_paths(directory):
        try:
            tf.train.get_checkpoint_state(directory)
        except (tf.errors.OpError, UnicodeDecodeError, ValueError):
            os.replace(path, path + ".damaged")


def _listdir(directory):
    """The names in ``directory`` (none when it is not a folder). Raises UserError: it cannot be read."""
    try:
        return os.listdir(directory) if os.path.isdir(directory) else []
    except PermissionError as e:
        raise UserError(f"{directory}: cannot be read ({e.strerror}); give a model directory you can read") from None


def _checkpoint_number(name):
    number = name.rsplit("-", 1)[-1]
    return int(number) if number.isdigit() else -1


def restore_newest(directory, restore, log, check=None):
    """Restores the newest readable checkpoint of ``directory`` (:func:`find_checkpoints`).

    A checkpoint that cannot be read is reported through ``log`` with its
    files named, and the one before it is tried; checkpoints the state file does
    not list (it is missing or damaged) are reported once.

    Args:
      restore: ``callable(path)`` that restores it (raising on a damaged one).
      log: ``callable(str)``.
      check: optional ``callable(path)`` run before restoring (tokenizer, architecture);
        its :class:`UserError` stops everything.
    Returns:
      the path restored, or None when the directory has no checkpoint.
    Raises:
      UserError: there are checkpoints but none is readable (all are named), or one
        does not fit the model (its shapes differ).
    """
    candidates, unlisted = find_checkpoints(directory), unlisted_checkpoints(directory)
    if unlisted:
        log(f"warning: {os.path.join(directory, 'checkpoint')} (the state file) does not list {', '.join(unlisted)}: it is "
            f"missing or damaged; using the checkpoint files themselves")
    for path in reversed(candidates):
        try:
            if check is not None:
                check(path)
            restore(path)
        except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated data file
            if is_shape_mismatch(e):
                raise UserError(f"{path}: its weights have other shapes than the model built from the "
                                f"hyper-parameters ({first_line(e)}); use the values it was trained with") from None
            log(f"warning: checkpoint {path} is unreadable ({first_line(e)}); trying the one before it")
            continue
        return path
    if candidates:
        raise UserError(f"no readable checkpoint in {directory} (tried {', '.join(reversed(candidates))}); "
                        f"train.py --restart sets them aside in {directory}/{PREVIOUS_PREFIX}TIME/ and starts over")
    return None


def is_shape_mismatch(error):
    """Whether a restore error says that a checkpoint's weights have other shapes than the model's."""
    return isinstance(error, ValueError) and "shape" in str(error).lower()


def build_model(hp, source_tokenizer, target_tokenizer):
    """A :class:`Transformer` with its variables created (so a checkpoint can fill them)."""
    model = Transformer.from_hparams(hp, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    ids = tf.constant(np.full([1, 2], len(SPECIALS), np.int32))  # the first word id: any id builds the weights
    model((ids, ids), training=False)
    return model


def restore_model(model, path):
    """Restores ``model``'s weights from the checkpoint ``path`` (a training checkpoint also holds
    the optimizer and the data position, which are left alone); returns the load status."""
    return tf.train.Checkpoint(model=model).restore(path).expect_partial()

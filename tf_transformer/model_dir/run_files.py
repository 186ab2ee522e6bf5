"""What a model directory holds, and reading it back.

::

  MODEL_DIR/
    hparams.yaml          resolved hyper-parameters (flat; `--config` reads it)
    sentencepiece.model   the joint subword model (tokenizer: sentencepiece), or
    source.vocab.tsv      the source vocabulary, one `word<TAB>count` per id, and
    target.vocab.tsv      the target vocabulary (tokenizer: word)
    checkpoint, ckpt-N.*  tf.train.CheckpointManager files, N = the training step
                          (tf_transformer.train.checkpoints: weights, optimizer, data position)
    best/                 the checkpoint with the best dev BLEU, and best.yaml (its scores)
    average/              the average of the last checkpoints (tf_transformer.train.average), itself a model
                          directory: translate.py --model-dir MODEL_DIR/average reads it
    samples-stepN.txt     dev translations at step N
    logs/                 TensorBoard event files
    export/<version>/     the SavedModel for TF Serving (tf_transformer.infer.export)
    previous-TIME/        what `train.py --restart` set aside
    .lock                 held by the process writing here (tf_transformer.locks)

Every file is written atomically, so a killed run leaves the previous version.
Each checkpoint also stores the sha256 of the tokenizer it was trained with, so
a replaced tokenizer file is caught before it silently shifts every id, and
the architecture hyper-parameters it was built with, so that a checkpoint is
never read into a model of other shapes.

Every reader (the trainer, ``translate.py``, the export) finds checkpoints the
same way, :func:`restore_newest`: from the ``checkpoint`` state file and from
the ``ckpt-N.index`` files themselves, so a missing or damaged state file loses
nothing, and newest first, so a damaged checkpoint is reported and the one
before it used.
"""

import json
import os
import re
import sys
import time
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.data.tokenizer import SubwordTokenizer, WordTokenizer
from tf_transformer.data.vocab import SPECIALS, WordVocab
from tf_transformer.errors import UserError
from tf_transformer.files import write_atomic
from tf_transformer.hparams import ARCHITECTURE_KEYS, HParams, load_hparams
from tf_transformer.nn.model import Transformer

HPARAMS_FILE = "hparams.yaml"
SENTENCEPIECE_FILE = "sentencepiece.model"
SOURCE_VOCAB_FILE = "source.vocab.tsv"
TARGET_VOCAB_FILE = "target.vocab.tsv"
EXPORT_SUBDIR = "export"
PREVIOUS_PREFIX = "previous-"
# The checkpoint key of the tokenizer's sha256 (see `tokenizer_fingerprint`).
_FINGERPRINT_KEY = "tokenizer_fingerprint/.ATTRIBUTES/VARIABLE_VALUE"
# The checkpoint key of the architecture record (see `architecture_record`).
_ARCHITECTURE_KEY = "architecture/.ATTRIBUTES/VARIABLE_VALUE"
_CHECKPOINT_INDEX = re.compile(r"^ckpt-(\d+)\.index$")


def _path(model_dir, name):
    return os.path.join(model_dir, name)


def check_compatible(model_dir, hp):
    """Refuses to reuse a model directory trained with other architecture hyper-parameters.

    Raises:
      UserError: naming every differing key with both values.
    """
    saved_path = _path(model_dir, HPARAMS_FILE)
    if not os.path.exists(saved_path) or not find_checkpoints(model_dir):
        return
    saved, current = load_hparams(config=saved_path).to_dict(), hp.to_dict()
    differing = [f"{k}: {saved[k]!r} in {saved_path}, {current[k]!r} now"
                 for k in ARCHITECTURE_KEYS if saved[k] != current[k]]
    if differing:
        raise UserError(
            f"{model_dir} holds a checkpoint of a different architecture ({'; '.join(differing)}); "
            f"use another --model-dir, or the same values"
        )


def tokenizer_files(hp):
    """The files that hold the tokenizers of ``hp.tokenizer``."""
    if hp.tokenizer == "sentencepiece":
        return [SENTENCEPIECE_FILE]
    return [SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE]


def save_run_files(model_dir, hp, source_tokenizer, target_tokenizer):
    """Writes hparams.yaml and the tokenizer files, each atomically."""
    os.makedirs(model_dir, exist_ok=True)
    hp.save(_path(model_dir, HPARAMS_FILE))
    if hp.tokenizer == "sentencepiece":
        write_atomic(_path(model_dir, SENTENCEPIECE_FILE), source_tokenizer.model_proto)
    else:
        source_tokenizer.vocab.save(_path(model_dir, SOURCE_VOCAB_FILE))
        target_tokenizer.vocab.save(_path(model_dir, TARGET_VOCAB_FILE))


def load_tokenizers(model_dir, hp):
    """The saved (source, target) tokenizers of kind ``hp.tokenizer``, or None when absent."""
    paths = [_path(model_dir, name) for name in tokenizer_files(hp)]
    if not all(os.path.exists(p) for p in paths):
        return None
    if hp.tokenizer == "sentencepiece":
        with open(paths[0], "rb") as f:
            proto = f.read()
        try:
            joint = SubwordTokenizer(proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError on a damaged model
            raise UserError(f"{paths[0]}: not a readable SentencePiece model ({e})") from None
        return joint, joint
    return WordTokenizer(WordVocab.load(paths[0])), WordTokenizer(WordVocab.load(paths[1]))


def tokenizer_fingerprint(source_tokenizer, target_tokenizer):
    """The sha256 of both tokenizers, as a checkpoint stores it (``tokenizer_fingerprint``)."""
    return source_tokenizer.fingerprint() + "/" + target_tokenizer.fingerprint()


def check_tokenizer(model_dir, hp, checkpoint_path, tokenizers):
    """Refuses a checkpoint trained with another tokenizer than the one in ``model_dir``.

    Raises:
      UserError: naming the tokenizer file(s) and the checkpoint.
    """
    try:
        saved = tf.train.load_variable(checkpoint_path, _FINGERPRINT_KEY)
    except (tf.errors.NotFoundError, ValueError):
        return  # written before fingerprints were stored
    if saved.decode() != tokenizer_fingerprint(*tokenizers):
        files = " and ".join(_path(model_dir, name) for name in tokenizer_files(hp))
        raise UserError(
            f"{files} is not the tokenizer that {checkpoint_path} was trained with (their sha256 differ); "
            f"put the original file(s) back, or train in a new --model-dir")


def architecture_record(hp):
    """The architecture hyper-parameters (``ARCHITECTURE_KEYS``) as the JSON text a checkpoint stores."""
    return json.dumps({key: getattr(hp, key) for key in ARCHITECTURE_KEYS}, sort_keys=True)


def check_architecture(checkpoint_path, hp, source, advice):
    """Refuses a checkpoint built with other architecture hyper-parameters than ``hp``.

    Args:
      source: who gives ``hp``, for the message (e.g. ``"MODEL_DIR/hparams.yaml says"``).
      advice: what to do about it, for the message.
    Raises:
      UserError: e.g. ``ckpt-3 has num_units 32, hparams.yaml says 64; ...``.
    """
    try:
        saved = json.loads(tf.train.load_variable(checkpoint_path, _ARCHITECTURE_KEY).decode())
    except (tf.errors.NotFoundError, ValueError):
        return  # written before the record was stored: the restore compares the shapes
    differing = [key for key in ARCHITECTURE_KEYS if key in saved and saved[key] != getattr(hp, key)]
    if differing:
        has = " and ".join(f"{key} {saved[key]}" for key in differing)
        says = " and ".join(f"{key} {getattr(hp, key)}" for key in differing)
        raise UserError(f"{checkpoint_path} has {has}, {source} {says}; {advice}")


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
    path = _path(directory, "checkpoint")
    if os.path.isfile(path) and not _state_file_paths(directory):
        try:
            tf.train.get_checkpoint_state(directory)
        except (tf.errors.OpError, UnicodeDecodeError, ValueError):
            os.replace(path, path + ".damaged")


def _listdir(directory):
    return os.listdir(directory) if os.path.isdir(directory) else []


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
        log(f"warning: {_path(directory, 'checkpoint')} (the state file) does not list {', '.join(unlisted)}: it is "
            f"missing or damaged; using the checkpoint files themselves")
    for path in reversed(candidates):
        try:
            if check is not None:
                check(path)
            restore(path)
        except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated data file
            if _is_shape_mismatch(e):
                raise UserError(f"{path}: its weights have other shapes than the model built from the "
                                f"hyper-parameters ({first_line(e)}); use the values it was trained with") from None
            log(f"warning: checkpoint {path} is unreadable ({first_line(e)}); trying the one before it")
            continue
        return path
    if candidates:
        raise UserError(f"no readable checkpoint in {directory} (tried {', '.join(reversed(candidates))}); "
                        f"train.py --restart sets them aside in {directory}/{PREVIOUS_PREFIX}TIME/ and starts over")
    return None


def _is_shape_mismatch(error):
    return isinstance(error, ValueError) and "shape" in str(error).lower()


def first_line(error):
    """The first line of an exception's message (its type's name when empty)."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def set_aside(model_dir):
    """Moves what earlier runs wrote in ``model_dir`` (all but ``export/``, hidden files and
    earlier ``previous-*``) into a new ``model_dir/previous-YYYYmmdd-HHMMSS/``.

    Returns:
      the new folder, or None when there was nothing to move.
    """
    names = [name for name in _listdir(model_dir)
             if not name.startswith((".", PREVIOUS_PREFIX)) and name != EXPORT_SUBDIR]
    if not names:
        return None
    target = _path(model_dir, PREVIOUS_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    while os.path.exists(target):
        target += "-1"
    os.makedirs(target)
    for name in names:
        os.rename(_path(model_dir, name), os.path.join(target, name))
    return target


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


class LoadedModel(NamedTuple):
    """A trained model read back from its directory (:func:`load_for_inference`)."""

    hp: HParams
    source_tokenizer: SubwordTokenizer | WordTokenizer
    target_tokenizer: SubwordTokenizer | WordTokenizer
    model: Transformer

    @property
    def tokenizers(self):
        """(source_tokenizer, target_tokenizer)."""
        return self.source_tokenizer, self.target_tokenizer


def load_for_inference(model_dir, checkpoint=None, log=None):
    """Reads a trained model directory: :func:`restore_newest` with the same checks as the trainer.

    Args:
      checkpoint: restore this checkpoint prefix instead (no fallback).
      log: ``callable(str)`` for warnings (default: standard error).
    Returns:
      :class:`LoadedModel`, its model holding the checkpoint's weights.
    Raises:
      UserError: the directory, its hparams, tokenizer or checkpoint are missing or
        unreadable, the tokenizer is not the one the checkpoint was trained with, or
        hparams.yaml describes other shapes than the checkpoint's.
    """
    hparams_path = _path(model_dir, HPARAMS_FILE)
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise UserError(f"--model-dir {model_dir}: is a file, expected a directory that train.py wrote")
    if not os.path.exists(hparams_path):
        raise UserError(f"{model_dir}: no {HPARAMS_FILE} there; is it a directory that train.py wrote?")
    hp = load_hparams(config=hparams_path)
    tokenizers = load_tokenizers(model_dir, hp)
    if tokenizers is None:
        raise UserError(f"{model_dir}: missing {' or '.join(tokenizer_files(hp))}")
    model = build_model(hp, *tokenizers)

    def check(path):
        check_tokenizer(model_dir, hp, path, tokenizers)
        check_architecture(path, hp, f"{hparams_path} says",
                           f"put back the {HPARAMS_FILE} it was trained with (those keys as in the checkpoint)")

    def restore(path):
        status = restore_model(model, path)
        try:  # the file also holds the optimizer; every variable of the model must be in it
            status.assert_existing_objects_matched()
        except AssertionError as e:
            raise UserError(f"{path}: does not hold this model's weights ({first_line(e)})") from None

    log = log or (lambda line: print(line, file=sys.stderr))
    if checkpoint is not None:
        _restore_given(checkpoint, check, restore)
    elif restore_newest(model_dir, restore, log, check) is None:
        raise UserError(f"{model_dir}: no checkpoint yet; train first with train.py --model-dir {model_dir}")
    return LoadedModel(hp, tokenizers[0], tokenizers[1], model)


def _restore_given(checkpoint, check, restore):
    """Restores one named checkpoint, or fails with one line."""
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise UserError(f"--checkpoint {checkpoint}: no such checkpoint (expected {checkpoint}.index)")
    try:
        check(checkpoint)
        restore(checkpoint)
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise UserError(f"--checkpoint {checkpoint}: unreadable ({first_line(e)})") from None

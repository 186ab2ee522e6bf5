"""Checkpoint averaging (the command line: ``python -m tf_transformer.cli.average --model-dir DIR --last K``).

As NMT toolkits do (tensor2tensor's ``avg_checkpoints``, OpenNMT, fairseq),
the weights of the last ``K`` checkpoints of a model directory are averaged,
element by element; the average usually translates a little better than any
one of them.

What is written: ``MODEL_DIR/average/`` (or ``--output``), a model directory of
its own, so every reader takes it unchanged::

  MODEL_DIR/average/
    hparams.yaml, tokenizer file(s)   copies of MODEL_DIR's
    checkpoint, ckpt-N.*              the averaged model, N = the newest step averaged
    average.yaml                      which checkpoints were averaged

``translate.py --model-dir MODEL_DIR/average`` translates with it, and
``python -m tf_transformer.cli.export --model-dir MODEL_DIR/average`` (or
``--model-dir MODEL_DIR --checkpoint MODEL_DIR/average/ckpt-N``) exports it.
The training checkpoints are left alone, so a resumed run goes on from the
latest one, not from the average.

Only the model's weights are averaged and written (and the tokenizer
fingerprint, which the readers check): an average of Adam moments does not
belong to the averaged weights, and the average is for translating, not for
training on. The directory is built in a hidden sibling and renamed into
place, so a reader sees the previous average or the new one, whole, never a
half-written one (for an instant, between the two renames, none).
"""

import os
import shutil
import tempfile
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import yaml

from tf_transformer.data.tokenizer import tokenizer_fingerprint
from tf_transformer.errors import UserError
from tf_transformer.files import replace_directory, write_atomic
from tf_transformer.infer.load import load_for_inference
from tf_transformer.model_dir import checkpoint_files, checks, run_files
from tf_transformer.train.scores import Scores

AVERAGE_DIR = "average"
AVERAGE_RECORD = "average.yaml"
_MODEL_PREFIX = "model/"


class Average(NamedTuple):
    """What :func:`average_checkpoints` wrote: the averaged checkpoint, and the checkpoints averaged."""

    checkpoint: str
    averaged: list


class AverageTrial(NamedTuple):
    """What :func:`average_if_better` did: the averaged checkpoint kept (None when none was), and its
    dev :class:`~tf_transformer.train.scores.Scores` (None when there were too few checkpoints to average)."""

    checkpoint: str | None
    scores: Scores | None


def last_checkpoints(model_dir, last):
    """The paths of the last ``last`` checkpoints of ``model_dir``, oldest first.

    Raises:
      UserError: no such directory, ``last`` below 1, or fewer checkpoints than ``last``.
    """
    if not os.path.isdir(model_dir):
        raise UserError(f"--model-dir {model_dir}: no such directory")
    if last < 1:
        raise UserError(f"--last {last}: must be at least 1")
    paths = checkpoint_files.find_checkpoints(model_dir)  # the trainer's list: a damaged state file loses none
    if len(paths) < last:
        raise UserError(f"{model_dir}: {len(paths)} checkpoint(s), fewer than --last {last} "
                        f"(train longer, or keep more with keep_checkpoints)")
    return paths[-last:]


def check_shapes(paths):
    """Refuses checkpoints whose model variables differ in name or shape.

    Raises:
      UserError: naming the variable and the two checkpoints.
    """
    def shapes(path):
        return {name: shape for name, shape in tf.train.list_variables(path) if name.startswith(_MODEL_PREFIX)}

    first = shapes(paths[0])
    for path in paths[1:]:
        other = shapes(path)
        for name in sorted(set(first) | set(other)):
            if first.get(name) != other.get(name):
                raise UserError(f"{name}: shape {first.get(name, 'absent')} in {paths[0]} but "
                                f"{other.get(name, 'absent')} in {path}; only checkpoints of one model average")


def average_weights(model, paths):
    """The element-wise mean of ``model.weights`` over the checkpoints ``paths``.

    Each checkpoint is restored into ``model`` in turn (which keeps the last
    one's weights) and summed in float64. Weights that are not floating point
    (counters, seeds) take the newest checkpoint's value.

    Returns:
      a list of numpy arrays, in ``model.weights`` order, of their shapes and dtypes.
    Raises:
      UserError: a checkpoint does not fit ``model``, or their shapes differ.
    """
    check_shapes(paths)
    sums = None
    for path in paths:
        try:
            checkpoint_files.restore_model(model, path).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            raise UserError(f"{path}: does not fit the model of its hparams.yaml "
                            f"({(str(e).strip().splitlines() or [type(e).__name__])[0]})") from None
        values = [np.asarray(w.numpy(), np.float64) for w in model.weights]
        sums = values if sums is None else [s + v for s, v in zip(sums, values)]
    newest = [w.numpy() for w in model.weights]
    return [(total / len(paths)).astype(value.dtype) if np.issubdtype(value.dtype, np.floating) else value
            for total, value in zip(sums, newest)]


def current_average(model_dir):
    """``MODEL_DIR/average`` when it averages ``model_dir``'s newest checkpoint (what ``average_last``
    kept at the end of training, and exported), else None: an average of older checkpoints is stale."""
    record_path = os.path.join(model_dir, AVERAGE_DIR, AVERAGE_RECORD)
    newest = checkpoint_files.find_checkpoints(model_dir)
    if not newest or not os.path.isfile(record_path):
        return None
    with open(record_path, encoding="utf-8") as f:
        averaged = (yaml.safe_load(f) or {}).get("averaged") or [None]
    return os.path.join(model_dir, AVERAGE_DIR) if averaged[-1] == os.path.abspath(newest[-1]) else None


def write_average(output, hp, tokenizers, model, paths):
    """Writes ``model`` (holding the averaged weights) as the model directory ``output``,
    numbered by the newest checkpoint's step; see the module docstring. Returns the checkpoint path."""
    parent = os.path.dirname(os.path.abspath(output))
    os.makedirs(parent, exist_ok=True)
    temporary = tempfile.mkdtemp(dir=parent, prefix=".tmp-average-")
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)  # mkdtemp makes it 0700; give it the usual permissions
        run_files.save_run_files(temporary, hp, *tokenizers)
        checkpoint = tf.train.Checkpoint(model=model, tokenizer_fingerprint=tf.Variable(
            tokenizer_fingerprint(*tokenizers), trainable=False))
        step = int(paths[-1].rsplit("-", 1)[-1])
        saved = tf.train.CheckpointManager(checkpoint, temporary, max_to_keep=1).save(checkpoint_number=step)
        record = {"averaged": [os.path.abspath(p) for p in paths], "step": step}
        write_atomic(os.path.join(temporary, AVERAGE_RECORD), yaml.safe_dump(record, sort_keys=False))
        replace_directory(temporary, output)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return os.path.join(output, os.path.basename(saved))


def _averaged_into(model, model_dir, hp, tokenizers, paths):
    """Checks every checkpoint's tokenizer, then assigns their average to ``model``."""
    for path in paths:
        checks.check_tokenizer(model_dir, hp, path, tokenizers)
    for w, value in zip(model.weights, average_weights(model, paths)):
        w.assign(value)


def average_checkpoints(model_dir, last, output=None):
    """Averages the last ``last`` checkpoints of ``model_dir`` into ``output``
    (default ``MODEL_DIR/average``), a model directory that translate.py and the export read.

    Returns:
      :class:`Average`.
    Raises:
      UserError: a missing directory, fewer checkpoints than ``last``, checkpoints of
        different shapes or tokenizers.
    """
    paths = last_checkpoints(model_dir, last)
    check_shapes(paths)  # before the latest is restored: a mismatch is named, not a restore error
    loaded = load_for_inference(model_dir)
    _averaged_into(loaded.model, model_dir, loaded.hp, loaded.tokenizers, paths)
    output = output or os.path.join(model_dir, AVERAGE_DIR)
    return Average(write_average(output, loaded.hp, loaded.tokenizers, loaded.model, paths), paths)


def average_if_better(model_dir, last, model, hp, tokenizers, score, bar):
    """For the end of a training run: the average of the last ``last`` checkpoints,
    kept in ``MODEL_DIR/average`` when its dev BLEU beats ``bar``.

    Args:
      model: the run's model (built like the checkpoints'); it ends with the average's
        weights when kept, else with the weights it had.
      tokenizers: (source, target).
      score: ``() -> Scores`` of ``model`` as it is now (the dev split).
      bar: the dev BLEU to beat (the best checkpoint's); None: the average is kept.
    Returns:
      :class:`AverageTrial`.
    """
    paths = checkpoint_files.find_checkpoints(model_dir)[-last:]
    if len(paths) < last:
        return AverageTrial(None, None)
    before = [w.numpy() for w in model.weights]
    _averaged_into(model, model_dir, hp, tokenizers, paths)
    scores = score()
    if bar is not None and not scores.bleu > bar:
        for w, value in zip(model.weights, before):
            w.assign(value)
        return AverageTrial(None, scores)
    return AverageTrial(write_average(os.path.join(model_dir, AVERAGE_DIR), hp, tokenizers, model, paths), scores)

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

Nothing else is ever replaced (:func:`check_output`): ``--output`` must be a new
path or a previous average of the same model directory, never the model
directory, its ``export/``, a folder that holds it, or a file. Averaging holds
the model directory's lock (:class:`~tf_transformer.locks.DirectoryLock`), so it
never reads checkpoints that a trainer is rotating away; a damaged checkpoint
among the last ``K`` is named and the one before it is averaged instead.
"""

import contextlib
import os
import shutil
import sys
import tempfile
from typing import NamedTuple

import numpy as np
import tensorflow as tf
import yaml

from tf_transformer.data.tokenizer import tokenizer_fingerprint
from tf_transformer.errors import UserError, first_line
from tf_transformer.files import disk_error, is_disk_problem, replace_directory, write_atomic
from tf_transformer.infer.load import load_for_inference
from tf_transformer.locks import DirectoryLock
from tf_transformer.model_dir import checkpoint_files, checks, run_files
from tf_transformer.model_dir.layout import AVERAGE_DIR
from tf_transformer.train.scores import BEST_DIR, Scores

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


def check_request(model_dir, last):
    """Refuses a missing model directory and ``last`` below 1, or fewer checkpoints than ``last``.

    Raises:
      UserError: naming the flag.
    """
    if not os.path.isdir(model_dir):
        what = "is a file, expected a directory that train.py wrote" if os.path.exists(model_dir) else \
            "no such directory"
        raise UserError(f"--model-dir {model_dir}: {what}")
    if last < 1:
        raise UserError(f"--last {last}: must be at least 1")
    paths = checkpoint_files.find_checkpoints(model_dir)  # the trainer's list: a damaged state file loses none
    if len(paths) < last:
        raise UserError(f"{model_dir}: {len(paths)} checkpoint(s), fewer than --last {last} "
                        f"(train longer, or keep more with keep_checkpoints)")


def check_output(model_dir, output):
    """Refuses an ``--output`` whose replacement would destroy anything but a previous average of
    ``model_dir``: the model directory itself, a folder holding it, its ``export/`` (or a folder in
    it), a file, or an existing directory that is not such an average.

    Raises:
      UserError: naming ``--output`` and what it is.
    """
    target, model = os.path.realpath(output), os.path.realpath(model_dir)
    exports = os.path.join(model, run_files.EXPORT_SUBDIR)
    if target == model:
        problem = "is the model directory itself"
    elif model.startswith(target.rstrip(os.sep) + os.sep):
        problem = f"holds the model directory {model_dir}"
    elif target == exports or target.startswith(exports + os.sep):
        problem = "is in the model directory's export/ (the exported versions)"
    elif os.path.exists(target) and not os.path.isdir(target):
        problem = "is a file"
    elif os.path.exists(target) and not _is_average_of(target, model):
        problem = f"exists and is not an average of {model_dir} (it holds no {AVERAGE_RECORD} naming its checkpoints)"
    else:
        return
    raise UserError(f"--output {output}: {problem}; averaging replaces its output whole, so give a new "
                    f"directory (default: MODEL_DIR/{AVERAGE_DIR})")


def _is_average_of(directory, model):
    """Whether ``directory`` holds an average written from the checkpoints of the model directory ``model``."""
    averaged = averaged_checkpoints(directory)
    return bool(averaged) and all(os.path.realpath(os.path.dirname(p)) == model for p in averaged)


def averaged_checkpoints(directory):
    """The checkpoint paths that the average in ``directory`` was made from (its ``average.yaml``),
    oldest first; [] when it has no readable record."""
    try:
        with open(os.path.join(directory, AVERAGE_RECORD), encoding="utf-8") as f:
            averaged = (yaml.safe_load(f) or {}).get("averaged") or []
    except (OSError, ValueError, yaml.YAMLError, AttributeError):
        return []
    return averaged if isinstance(averaged, list) and all(isinstance(p, str) for p in averaged) else []


def check_shapes(paths):
    """Refuses checkpoints whose model variables differ in name or shape. A checkpoint whose index
    cannot be read is passed over here (:func:`mean_of_last` names it).

    Raises:
      UserError: naming the variable and the two checkpoints.
    """
    def shapes(path):
        try:
            return {name: tuple(shape) for name, shape in _variables(path) if name.startswith(_MODEL_PREFIX)}
        except _Damaged:
            return None

    readable = [(path, found) for path in paths if (found := shapes(path)) is not None]
    for path, other in readable[1:]:
        first_path, first = readable[0]
        for name in sorted(set(first) | set(other)):
            if first.get(name) != other.get(name):
                raise UserError(f"{name}: shape {list(first[name]) if name in first else 'absent'} in {first_path} "
                                f"but {list(other[name]) if name in other else 'absent'} in {path}; only "
                                f"checkpoints of one model average")


class _Damaged(Exception):
    """A checkpoint whose files cannot be read (truncated, corrupted, missing)."""


def _variables(path):
    """``tf.train.list_variables(path)``; a checkpoint whose index cannot be read is :class:`_Damaged`."""
    try:
        return tf.train.list_variables(path)
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise _Damaged(first_line(e)) from None


def _checked(check, path):
    """Runs ``check(path)``; a checkpoint file it cannot read is :class:`_Damaged`."""
    try:
        if check is not None:
            check(path)
    except (tf.errors.OpError, IndexError) as e:
        raise _Damaged(first_line(e)) from None


def _read_into(model, path):
    """Restores the checkpoint ``path`` into ``model``.

    Raises:
      _Damaged: its files cannot be read.
      UserError: it holds another model (a variable missing).
    """
    try:
        checkpoint_files.restore_model(model, path).assert_existing_objects_matched()
        return
    except AssertionError as e:
        problem = first_line(e)
    except (tf.errors.OpError, ValueError, IndexError) as e:  # IndexError: a truncated data file
        if not checkpoint_files.is_shape_mismatch(e):
            raise _Damaged(first_line(e)) from None
        problem = first_line(e)
    raise UserError(f"{path}: does not fit the model of its hparams.yaml ({problem})")


class Mean(NamedTuple):
    """What :func:`mean_of_last` read: the checkpoints averaged (oldest first), and the element-wise
    mean of ``model.weights`` over them (None when fewer than asked for could be read)."""

    paths: list
    values: list | None


def mean_of_last(model, paths, last, log, check=None):
    """The element-wise mean of ``model.weights`` over the newest ``last`` readable checkpoints of
    ``paths``. A checkpoint whose files cannot be read is named in a ``log`` line and the one before
    it taken instead.

    Each checkpoint is restored into ``model`` in turn (which keeps the oldest one's weights) and
    summed in float64. Weights that are not floating point (counters, seeds) take the newest
    checkpoint's value.

    Args:
      check: optional ``callable(path)`` run before restoring (the tokenizer check); its
        :class:`UserError` stops everything.
    Returns:
      :class:`Mean`, its values numpy arrays in ``model.weights`` order, of their shapes and dtypes.
    Raises:
      UserError: a checkpoint does not fit ``model``, or their shapes differ.
    """
    chosen, sums, newest = [], None, None
    for path in reversed(paths):
        if len(chosen) == last:
            break
        try:
            _variables(path)
            check_shapes([path] + chosen[-1:])  # before restoring: a mismatch is named, not a restore error
            _checked(check, path)
            _read_into(model, path)
        except _Damaged as e:
            log(f"warning: checkpoint {path} is unreadable ({e}); averaging the one before it instead")
            continue
        values = [np.asarray(w.numpy(), np.float64) for w in model.weights]
        newest = newest or [w.numpy() for w in model.weights]
        sums = values if sums is None else [s + v for s, v in zip(sums, values)]
        chosen.append(path)
    if len(chosen) < last:
        return Mean(chosen[::-1], None)
    return Mean(chosen[::-1], [(total / last).astype(value.dtype) if np.issubdtype(value.dtype, np.floating)
                               else value for total, value in zip(sums, newest)])


def current_average(model_dir):
    """``MODEL_DIR/average`` when it averages ``model_dir``'s newest checkpoint (what ``average_last``
    kept at the end of training, and exported), else None: an average of older checkpoints is stale."""
    newest = checkpoint_files.find_checkpoints(model_dir)
    averaged = averaged_checkpoints(os.path.join(model_dir, AVERAGE_DIR))
    if not newest or not averaged:
        return None
    return os.path.join(model_dir, AVERAGE_DIR) if averaged[-1] == os.path.abspath(newest[-1]) else None


class KeptWeights(NamedTuple):
    """The weights a finished run kept (:func:`kept_weights`): load them with
    ``load_for_inference(model_dir, checkpoint)``."""

    model_dir: str  # the model directory, or its average/
    checkpoint: str | None  # a checkpoint prefix; None: the directory's newest
    description: str  # which weights, for a log line


def kept_weights(model_dir):
    """The weights training kept of ``model_dir``: the current average of its last checkpoints
    (:func:`current_average`), else its best checkpoint by dev BLEU (``best/``), else its newest."""
    average = current_average(model_dir)
    if average:
        return KeptWeights(average, None, f"the average of its last checkpoints, {average}")
    best = tf.train.latest_checkpoint(os.path.join(model_dir, BEST_DIR))
    if best:
        return KeptWeights(model_dir, best, f"its best checkpoint by dev BLEU, {best}")
    return KeptWeights(model_dir, None, "its newest checkpoint (training kept no average or best checkpoint)")


def write_average(output, hp, tokenizers, model, paths):
    """Writes ``model`` (holding the averaged weights) as the model directory ``output``,
    numbered by the newest checkpoint's step; see the module docstring. Returns the checkpoint path.

    Raises:
      UserError: the output cannot be written (read-only, no space left): nothing is left behind.
    """
    try:
        return _write_average(output, hp, tokenizers, model, paths)
    except (OSError, tf.errors.OpError) as e:
        if not is_disk_problem(e):
            raise
        raise disk_error(e, "--output", output, "nothing was written; free some space (or give another "
                         "--output) and average again") from None


def _write_average(output, hp, tokenizers, model, paths):
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


def _averaged_into(model, model_dir, hp, tokenizers, last, log):
    """Assigns the :func:`mean_of_last` ``last`` checkpoints of ``model_dir`` (each checked against its
    tokenizer) to ``model``. Returns the checkpoints averaged, or None when fewer than ``last`` read
    (``model`` then holds the oldest readable one's weights)."""
    mean = mean_of_last(model, checkpoint_files.find_checkpoints(model_dir), last, log,
                        check=lambda path: checks.check_tokenizer(model_dir, hp, path, tokenizers))
    if mean.values is None:
        return None
    for w, value in zip(model.weights, mean.values):
        w.assign(value)
    return mean.paths


def average_checkpoints(model_dir, last, output=None, log=None):
    """Averages the last ``last`` readable checkpoints of ``model_dir`` into ``output``
    (default ``MODEL_DIR/average``), a model directory that translate.py and the export read,
    holding the model directory's lock meanwhile.

    Args:
      log: ``callable(str)`` for warnings (a damaged checkpoint passed over); default standard error.
    Returns:
      :class:`Average`.
    Raises:
      UserError: a missing directory, an ``output`` that is not new or a previous average
        (:func:`check_output`), another process writing in ``model_dir``, fewer readable checkpoints
        than ``last``, checkpoints of different shapes or tokenizers, an output that cannot be written.
    """
    log = log or (lambda line: print(line, file=sys.stderr))
    check_request(model_dir, last)
    output = output or os.path.join(model_dir, AVERAGE_DIR)
    check_output(model_dir, output)
    with _reading(model_dir, output):
        check_shapes(checkpoint_files.find_checkpoints(model_dir)[-last:])  # named before the newest is restored
        loaded = load_for_inference(model_dir, log=log)
        paths = _averaged_into(loaded.model, model_dir, loaded.hp, loaded.tokenizers, last, log)
        if paths is None:
            raise UserError(f"{model_dir}: fewer than --last {last} readable checkpoints (the others are "
                            f"damaged, named above)")
        return Average(write_average(output, loaded.hp, loaded.tokenizers, loaded.model, paths), paths)


def _reading(model_dir, output):
    """The model directory's lock, so that no trainer rotates checkpoints away while they are read.
    A directory no one may write in (read-only) needs no lock, unless the output goes there.

    Raises:
      UserError: another process writes in ``model_dir``; or it is read-only and ``output`` is inside it.
    """
    if os.access(model_dir, os.W_OK):
        return DirectoryLock(model_dir, "--model-dir")
    model = os.path.realpath(model_dir)
    if os.path.realpath(output).startswith(model + os.sep):
        raise UserError(f"--model-dir {model_dir}: cannot write there (read-only); give --output DIR elsewhere")
    return contextlib.nullcontext()


def average_if_better(model_dir, last, model, hp, tokenizers, score, bar, log=None):
    """For the end of a training run: the average of the last ``last`` checkpoints,
    kept in ``MODEL_DIR/average`` when its dev BLEU beats ``bar``.

    Args:
      model: the run's model (built like the checkpoints'); it ends with the average's
        weights when kept, else with the weights it had.
      tokenizers: (source, target).
      score: ``() -> Scores`` of ``model`` as it is now (the dev split).
      bar: the dev BLEU to beat (the best checkpoint's); None: the average is kept.
      log: ``callable(str)`` for a damaged checkpoint passed over (default: standard error).
    Returns:
      :class:`AverageTrial`.
    """
    log = log or (lambda line: print(line, file=sys.stderr))
    before = [w.numpy() for w in model.weights]
    paths = _averaged_into(model, model_dir, hp, tokenizers, last, log)
    scores = None if paths is None else score()
    if paths is None or (bar is not None and not scores.bleu > bar):
        for w, value in zip(model.weights, before):
            w.assign(value)
        return AverageTrial(None, scores)
    return AverageTrial(write_average(os.path.join(model_dir, AVERAGE_DIR), hp, tokenizers, model, paths), scores)

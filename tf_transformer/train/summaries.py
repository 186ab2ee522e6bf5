"""TensorBoard summaries of a training run: scalars, text and attention images, written and read back.

:class:`Summaries` wraps one ``tf.summary.create_file_writer``. Built with
``log_dir=None`` (a non-chief worker, or summaries turned off) every method
does nothing, so callers need no ``if``. :func:`read_scalars` reads the scalars
back from the event files, :func:`write_training_curves` draws them;
:meth:`Summaries.write_curves` draws a run's own without reading its files again.
"""

import glob
import os

import numpy as np
import tensorflow as tf
from tensorflow.core.util import event_pb2

from tf_transformer.errors import UserError
from tf_transformer.figures import CURVES, figure_to_png, plot_attention, plot_curves
from tf_transformer.model_dir.layout import CURVES_FILE, LOG_DIR

CURVE_TAGS = frozenset(tag for tag, _ in CURVES)  # the scalars the training curves draw


class Summaries:
    """Writes event files under ``log_dir`` (``tensorboard --logdir LOG_DIR`` reads them).

    Example::

      with Summaries(os.path.join(model_dir, "logs")) as summaries:
          summaries.scalars(step, loss=2.3, learning_rate=1e-3)
          summaries.text(step, "dev/samples", lines)
    """

    def __init__(self, log_dir):
        self.log_dir = log_dir
        # The curves' points so far, tag -> {step: value}: the earlier runs' event files in log_dir are read once,
        # here; this run's points are kept as they are written (re-reading every file at each evaluation took
        # time in proportion to the steps so far).
        self._curves = _earlier_curves(log_dir) if log_dir else {}
        self._writer = tf.summary.create_file_writer(log_dir) if log_dir else None

    def scalars(self, step, **values):
        """One scalar summary per keyword, tagged with its name (``loss=2.3`` -> tag ``loss``).

        ``None`` values are skipped. Use ``**{"dev/bleu": 23.4}`` for grouped tags.
        """
        if self._writer is None:
            return
        with self._writer.as_default(step=int(step)):
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(name, float(value))
                    if name in CURVE_TAGS:  # as read back: float32, a later value of a step replacing an earlier
                        self._curves.setdefault(name, {})[int(step)] = float(np.float32(value))

    def curves(self):
        """The :data:`CURVE_TAGS` scalars of ``log_dir``'s runs so far, this one's included, as
        :func:`read_scalars` would read them: dict tag -> (steps, values), sorted by step."""
        return _series(self._curves)

    def write_curves(self):
        """Draws :meth:`curves` as :func:`write_training_curves` does into ``MODEL_DIR/curves.png`` (the model
        directory holds ``log_dir``), without reading the event files. Returns the path, or None without a
        ``log_dir``."""
        if self._writer is None:
            return None
        return _plot_run_curves(self.curves(), os.path.dirname(self.log_dir))

    def text(self, step, name, lines):
        """Lines of text, shown verbatim (a Markdown code block) in TensorBoard's Text tab."""
        if self._writer is None:
            return
        # Four leading spaces make a Markdown code block: no line is reflowed or read as markup.
        block = "\n".join("    " + line for line in lines)
        with self._writer.as_default(step=int(step)):
            tf.summary.text(name, block)

    def attention_image(self, step, name, weights, source_tokens, target_tokens):
        """An attention heatmap per head (:func:`~tf_transformer.figures.plot_attention`) as one image.

        Args:
          weights: (h, T_y, T_x) attention weights of one block, or (L, h, T_y, T_x) of L blocks.
          source_tokens, target_tokens: T_x and T_y labels.
        """
        if self._writer is None:
            return
        figure = plot_attention(weights, source_tokens, target_tokens, title=f"{name}, step {int(step)}")
        image = tf.io.decode_png(figure_to_png(figure), channels=3)
        with self._writer.as_default(step=int(step)):
            tf.summary.image(name, image[None])

    def flush(self):
        if self._writer is not None:
            self._writer.flush()

    def close(self):
        if self._writer is not None:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def read_scalars(log_dir, tags=None):
    """The scalar summaries of every event file in ``log_dir``, merged by step.

    A resumed run writes a new event file and logs again the steps after its
    checkpoint: for a step logged twice the later value (by wall time) wins. A
    file cut short by a killed run is read up to the damage.

    Args:
      tags: the tags to read (default: every scalar tag).
    Returns:
      dict tag -> (steps, values): two (n,) lists sorted by step.
    Raises:
      UserError: ``log_dir`` holds no event file.
    """
    return _series(_read_points(log_dir, tags))


def _read_points(log_dir, tags=None):
    """:func:`read_scalars`' points before sorting: dict tag -> {step: value}, the later value of a step by wall
    time. Raises UserError without an event file."""
    paths = sorted(glob.glob(os.path.join(log_dir, "events.out.tfevents.*")))
    if not paths:
        raise UserError(f"{log_dir}: no TensorBoard event files (events.out.tfevents.*) there; "
                        f"train.py writes them into MODEL_DIR/{LOG_DIR}")
    points = {}  # tag -> {step: (wall_time, value)}
    for path in paths:
        try:
            for record in tf.data.TFRecordDataset(path):
                event = event_pb2.Event.FromString(record.numpy())
                for value in event.summary.value:
                    scalar = _scalar(value) if tags is None or value.tag in tags else None
                    if scalar is None:
                        continue
                    by_step = points.setdefault(value.tag, {})
                    if event.step not in by_step or by_step[event.step][0] <= event.wall_time:
                        by_step[event.step] = (event.wall_time, scalar)
        except tf.errors.DataLossError:
            pass  # the rest of this file is damaged
    return {tag: {step: value for step, (_, value) in by_step.items()} for tag, by_step in points.items()}


def _series(points):
    """dict tag -> {step: value} as dict tag -> (steps, values), two lists sorted by step."""
    return {tag: _sorted_series(by_step) for tag, by_step in points.items()}


def _sorted_series(by_step):
    """{step: value} as (steps, values), sorted by step."""
    steps = sorted(by_step)
    return steps, [by_step[step] for step in steps]


def _scalar(value):
    """A summary value's number: a TF1 ``simple_value`` or a TF2 scalar tensor; None for anything else."""
    if value.WhichOneof("value") == "simple_value":
        return value.simple_value
    tensor = value.tensor
    if value.WhichOneof("value") != "tensor" or tensor.tensor_shape.dim or tensor.dtype == tf.string.as_datatype_enum:
        return None
    return float(tf.make_ndarray(tensor))


def write_training_curves(model_dir, path=None):
    """Draws the run's loss, learning rate and dev BLEU by step (:func:`~tf_transformer.figures.plot_curves`).

    Reads every event file of ``MODEL_DIR/logs``; writes ``path`` (default
    ``MODEL_DIR/curves.png``) atomically.

    Returns:
      the path written.
    Raises:
      UserError: no event file yet.
    """
    return _plot_run_curves(read_scalars(os.path.join(model_dir, LOG_DIR), CURVE_TAGS), model_dir, path)


def _plot_run_curves(series, model_dir, path=None):
    """:func:`~tf_transformer.figures.plot_curves` of ``series`` into ``path`` (default ``MODEL_DIR/curves.png``);
    returns the path."""
    path = path or os.path.join(model_dir, CURVES_FILE)
    plot_curves(series, path, title=f"training run {model_dir}")
    return path


def _earlier_curves(log_dir):
    """The :data:`CURVE_TAGS` points of the event files already in ``log_dir``: tag -> {step: value}."""
    try:
        return _read_points(log_dir, CURVE_TAGS)
    except UserError:  # no event file yet: a new run
        return {}

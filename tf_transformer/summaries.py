"""TensorBoard summaries of a training run: scalars, text and attention images.

:class:`Summaries` wraps one ``tf.summary.create_file_writer``. Built with
``log_dir=None`` (a non-chief worker, or summaries turned off) every method
does nothing, so callers need no ``if``.
"""

import tensorflow as tf

from tf_transformer.plotting import figure_to_png, plot_attention

LOG_DIR = "logs"  # the summaries' directory inside a model directory


class Summaries:
    """Writes event files under ``log_dir`` (``tensorboard --logdir LOG_DIR`` reads them).

    Example::

      with Summaries(os.path.join(model_dir, "logs")) as summaries:
          summaries.scalars(step, loss=2.3, learning_rate=1e-3)
          summaries.text(step, "dev/samples", lines)
    """

    def __init__(self, log_dir):
        self.log_dir = log_dir
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

    def text(self, step, name, lines):
        """Lines of text, shown verbatim (a Markdown code block) in TensorBoard's Text tab."""
        if self._writer is None:
            return
        # Four leading spaces make a Markdown code block: no line is reflowed or read as markup.
        block = "\n".join("    " + line for line in lines)
        with self._writer.as_default(step=int(step)):
            tf.summary.text(name, block)

    def attention_image(self, step, name, weights, source_tokens, target_tokens):
        """An attention heatmap per head (:func:`~tf_transformer.plotting.plot_attention`) as one image.

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

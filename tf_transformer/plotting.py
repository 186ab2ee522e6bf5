"""Attention heatmaps: one panel per head, target tokens down, source tokens across.

Drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas (no
pyplot, no display, no global figure list), so it is safe in training loops,
threads and headless machines. Used by TensorBoard summaries
(:mod:`tf_transformer.summaries`) and ``translate.py --plot-attention``.
"""

import io
import math

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tf_transformer.files import write_atomic

MAX_COLUMNS = 4  # heads per row of the grid
_CELL_INCHES = 0.25  # side of one attention weight, shrunk for long sentences
_MAX_WIDTH_INCHES = 24.0


def plot_attention(weights, source_tokens, target_tokens, path=None, title=None):
    """Draws one heatmap per head in a grid of at most :data:`MAX_COLUMNS` columns.

    Args:
      weights: (h, T_y, T_x) attention weights, or (T_y, T_x) for one head;
        row t is where target position t looks in the source.
      source_tokens: T_x labels for the columns.
      target_tokens: T_y labels for the rows.
      path: optional file to write the PNG to (atomically).
      title: optional figure title.
    Returns:
      the :class:`~matplotlib.figure.Figure` (its ``axes`` are the h heads, then
      the shared colour bar).
    Raises:
      ValueError: the weights are not 2-D/3-D or the labels do not match their shape.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if weights.ndim == 2:
        weights = weights[None]
    if weights.ndim != 3:
        raise ValueError(f"weights must be (heads, T_y, T_x), got shape {weights.shape}")
    heads, target_length, source_length = weights.shape
    if len(source_tokens) != source_length or len(target_tokens) != target_length:
        raise ValueError(f"weights of shape {weights.shape} need {source_length} source and {target_length} "
                         f"target tokens, got {len(source_tokens)} and {len(target_tokens)}")

    columns = min(heads, MAX_COLUMNS)
    rows = math.ceil(heads / columns)
    cell = min(_CELL_INCHES, _MAX_WIDTH_INCHES / (columns * max(source_length, 1)))
    # Room for the tick labels: about 1.5 inches beside and below each panel.
    figure = Figure(figsize=(columns * (cell * source_length + 1.5) + 1.0, rows * (cell * target_length + 1.5)),
                    layout="constrained")
    FigureCanvasAgg(figure)
    image = None
    for head in range(heads):
        axes = figure.add_subplot(rows, columns, head + 1)
        image = axes.imshow(weights[head], vmin=0.0, vmax=1.0, cmap="viridis", interpolation="nearest",
                              aspect="auto")  # the figure size keeps cells about square
        axes.set_xticks(range(source_length), labels=source_tokens, rotation=90, fontsize=7)
        axes.set_yticks(range(target_length), labels=target_tokens, fontsize=7)
        axes.set_title(f"head {head + 1}", fontsize=8)
    figure.colorbar(image, ax=figure.axes, shrink=0.6, aspect=30)
    if title:
        figure.suptitle(title, fontsize=9)
    if path:
        write_atomic(path, figure_to_png(figure))
    return figure


def figure_to_png(figure, dpi=100):
    """The figure rendered by Agg as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()

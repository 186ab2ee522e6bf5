"""Figures: attention heatmaps, the positional-encoding table, training curves.

Drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas (no
pyplot, no display, no global figure list), so it is safe in training loops,
threads and headless machines. Used by TensorBoard summaries
(:mod:`tf_transformer.train.summaries`, which also reads back the curves' data),
``translate.py --plot-attention`` and ``python -m tf_transformer.cli.plots``.
"""

import io

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from tf_transformer.files import write_atomic

_CELL_INCHES = 0.25  # side of one attention weight, shrunk for long sentences
_MAX_PANELS_WIDTH_INCHES = 24.0  # all heads' cells side by side, before the labels


def _new_figure(width, height, **kwargs):
    figure = Figure(figsize=(width, height), layout="constrained", **kwargs)
    FigureCanvasAgg(figure)
    return figure


def _finish(figure, path):
    if path:
        write_atomic(path, figure_to_png(figure))
    return figure


def _label_inches(tokens, fontsize):
    """About the room the longest token takes as a tick label, plus the axis label beside it."""
    return 0.6 * fontsize / 72 * max(map(len, tokens), default=1) + 0.5


def plot_attention(weights, source_tokens, target_tokens, path=None, title=None):
    """Draws one heatmap per head and decoder block: blocks down, heads across.

    Only the outer panels carry tick labels (source tokens under the bottom
    row, target tokens left of the first column); all panels share one colour
    scale, from 0 to the largest weight.

    Args:
      weights: (L, h, T_y, T_x) attention weights of L blocks, (h, T_y, T_x)
        of one block, or (T_y, T_x) of one head; row t is where target
        position t looks in the source.
      source_tokens: T_x labels for the columns.
      target_tokens: T_y labels for the rows.
      path: optional file to write the PNG to (atomically).
      title: optional figure title.
    Returns:
      the :class:`~matplotlib.figure.Figure`; its ``axes`` are the L * h panels
      row by row (block 1's heads first), then the colour bar.
    Raises:
      ValueError: the weights are not 2-D to 4-D or the labels do not match their shape.
    """
    weights = np.asarray(weights, dtype=np.float32)
    if not 2 <= weights.ndim <= 4:
        raise ValueError(f"weights must be (blocks, heads, T_y, T_x), got shape {weights.shape}")
    blocks_given = weights.ndim == 4
    weights = weights.reshape((1,) * (4 - weights.ndim) + weights.shape)  # as one block of heads
    blocks, heads, target_length, source_length = weights.shape
    if len(source_tokens) != source_length or len(target_tokens) != target_length:
        raise ValueError(f"weights of shape {weights.shape} need {source_length} source and {target_length} "
                         f"target tokens, got {len(source_tokens)} and {len(target_tokens)}")

    cell = min(_CELL_INCHES, _MAX_PANELS_WIDTH_INCHES / (heads * max(source_length, 1)))
    fontsize = float(np.clip(0.75 * 72 * cell, 5, 9))  # a label about as tall as a cell
    figure = _new_figure(heads * (cell * source_length + 0.15) + _label_inches(target_tokens, fontsize) + 1.2,
                         blocks * (cell * target_length + 0.25) + _label_inches(source_tokens, fontsize) + 0.6)
    vmax = max(float(weights.max()), 1e-6)  # one scale for all panels, as bright as the strongest weight
    panels = figure.subplots(blocks, heads, squeeze=False)
    for (block, head), axes in np.ndenumerate(panels):
        # The figure's size keeps the cells about square; "auto" lets them fill the panel.
        image = axes.imshow(weights[block, head], vmin=0.0, vmax=vmax, cmap="viridis", interpolation="nearest",
                            aspect="auto")
        # Ticks on the outer panels only: a tick is a few artists, and L * h panels of T ticks each took
        # most of a 6-block, 8-head image's 14 s.
        if block == blocks - 1:
            axes.set_xticks(range(source_length), labels=source_tokens, rotation=90, fontsize=fontsize)
        else:
            axes.set_xticks([])
        if head == 0:
            axes.set_yticks(range(target_length), labels=target_tokens, fontsize=fontsize)
        else:
            axes.set_yticks([])
        if block == 0:
            axes.set_title(f"head {head + 1}", fontsize=9)
        if head == 0 and blocks_given:
            axes.set_ylabel(f"decoder block {block + 1}", fontsize=9)
    figure.colorbar(image, ax=panels, shrink=0.8, aspect=30)
    if title:
        figure.suptitle(title, fontsize=10)
    return _finish(figure, path)


def plot_positional_encoding(table, path=None, title=None):
    """Draws a positional-encoding table as the blog does: positions down, dimensions across.

    The blog's figure (seed 001): 12 x 8 inches, ``viridis``, "Token Position"
    downwards from 0, "Embedding Dimensions" across, a colour bar.

    Args:
      table: (T, C) encoding of positions 0..T-1.
    Returns:
      the :class:`~matplotlib.figure.Figure` (``axes[0].images[0]`` holds ``table``).
    """
    table = np.asarray(table)
    length, units = table.shape
    figure = _new_figure(12, 8)
    axes = figure.add_subplot()
    # Cell (t, c) covers [c, c + 1] x [t, t + 1], position 0 at the top, as the blog's pcolormesh.
    image = axes.imshow(table, cmap="viridis", vmin=-1.0, vmax=1.0, aspect="auto", interpolation="nearest",
                        extent=(0, units, length, 0))
    axes.set_xlabel("Embedding Dimensions", fontsize=12)
    axes.set_ylabel("Token Position", fontsize=12)
    axes.tick_params(labelsize=11)
    figure.colorbar(image, ax=axes).ax.tick_params(labelsize=11)
    axes.set_title(title or f"sinusoid positional encoding: {length} positions x {units} dimensions", fontsize=13)
    return _finish(figure, path)


# (tag, panel title) of each panel of :func:`plot_curves`, left to right.
CURVES = (("train/loss", "training loss"), ("train/learning_rate", "learning rate"), ("dev/bleu", "dev BLEU"))


def plot_curves(series, path=None, title=None):
    """Draws the training curves, one panel per tag of :data:`CURVES`, against the step.

    The per-step loss is drawn faintly, with its running mean over about a
    hundredth of the run on top.

    Args:
      series: dict tag -> (steps, values), two (n,) arrays sorted by step; a
        missing or empty tag gives an empty panel.
    Returns:
      the :class:`~matplotlib.figure.Figure`; ``axes[i].lines[0]`` holds the
      i-th tag's (step, value) points.
    """
    figure = _new_figure(15, 4.5)
    for axes, (tag, name) in zip(figure.subplots(1, len(CURVES)), CURVES):
        steps, values = (np.asarray(a) for a in series.get(tag, ([], [])))
        axes.set_title(name, fontsize=12)
        axes.set_xlabel("step", fontsize=11)
        axes.grid(alpha=0.3)
        if not len(steps):
            axes.text(0.5, 0.5, f"no {tag} yet", transform=axes.transAxes, ha="center", va="center")
            continue
        if tag == "train/loss":
            axes.plot(steps, values, linewidth=0.6, alpha=0.35, color="C0", label="per step")
            window = len(values) // 100
            if window > 1:
                mean = np.convolve(values, np.ones(window) / window, mode="valid")
                axes.plot(steps[window - 1:], mean, color="C0", label=f"mean of {window} steps")
                axes.legend(fontsize=9)
        else:
            axes.plot(steps, values, marker="o" if len(steps) <= 50 else None, color="C1" if "dev" in tag else "C2")
        if tag == "train/learning_rate":
            axes.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    if title:
        figure.suptitle(title, fontsize=12)
    return _finish(figure, path)


def figure_to_png(figure, dpi=100):
    """The figure rendered by Agg as PNG bytes."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()

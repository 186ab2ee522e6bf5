"""Tests for ``tf_transformer.train.summaries`` and ``tf_transformer.figures``: event files read back."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.figures import plot_attention
from tf_transformer.train.summaries import Summaries

SOURCE_TOKENS = ["ich", "mochte", "ein", "bier", "</S>"]
TARGET_TOKENS = ["i", "want", "a", "beer"]


def attention_weights(heads, seed=0):
    """(heads, T_y, T_x) rows that sum to 1."""
    logits = np.random.default_rng(seed).normal(size=(heads, len(TARGET_TOKENS), len(SOURCE_TOKENS)))
    return np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)


def read_events(log_dir):
    """Every summary value in ``log_dir``'s event files: list of (step, tag, plugin, tensor)."""
    values = []
    for path in glob.glob(os.path.join(log_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                values.append((event.step, value.tag, value.metadata.plugin_data.plugin_name,
                               tf.make_ndarray(value.tensor)))
    return values


def test_scalars_text_and_image_are_readable_back(tmp_path):
    log_dir = str(tmp_path / "logs")
    weights = attention_weights(heads=2)
    with Summaries(log_dir) as summaries:
        summaries.scalars(3, loss=2.5, learning_rate=1e-3, accuracy=None, **{"dev/bleu": 12.0})
        summaries.scalars(4, loss=2.0)
        summaries.text(4, "dev/samples", ["source: ich mochte ein bier", "hypothesis: i *want* a beer"])
        summaries.attention_image(4, "attention/encoder-decoder", weights, SOURCE_TOKENS, TARGET_TOKENS)
    assert glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    events = read_events(log_dir)

    scalars = {(step, tag): float(tensor) for step, tag, plugin, tensor in events if plugin == "scalars"}
    assert scalars == {(3, "loss"): 2.5, (3, "learning_rate"): pytest.approx(1e-3), (3, "dev/bleu"): 12.0,
                       (4, "loss"): 2.0}

    [(step, tensor)] = [(step, tensor) for step, tag, plugin, tensor in events if plugin == "text"]
    text = tensor.item().decode()
    assert step == 4
    # Each line verbatim, as a Markdown code block (so "*want*" is not turned into emphasis).
    assert text.split("\n") == ["    source: ich mochte ein bier", "    hypothesis: i *want* a beer"]

    [(step, tag, tensor)] = [(step, tag, tensor) for step, tag, plugin, tensor in events if plugin == "images"]
    assert (step, tag) == (4, "attention/encoder-decoder")
    width, height, png = tensor  # tf.summary.image stores width, height, then the encoded image
    image = tf.io.decode_png(png).numpy()
    assert png.startswith(b"\x89PNG")
    assert image.shape[:2] == (int(height), int(width))
    assert image.shape[2] in (3, 4)
    assert image.std() > 0  # something was drawn


def test_log_dir_none_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    summaries = Summaries(None)
    summaries.scalars(1, loss=1.0)
    summaries.text(1, "samples", ["a"])
    summaries.attention_image(1, "attention", attention_weights(1), SOURCE_TOKENS, TARGET_TOKENS)
    summaries.flush()
    summaries.close()
    assert os.listdir(tmp_path) == []


def image_axes(figure):
    return [axes for axes in figure.axes if axes.images]


def test_plot_attention_one_block_in_a_row_and_png(tmp_path):
    heads = 6
    weights = attention_weights(heads)
    path = str(tmp_path / "attention.png")
    figure = plot_attention(weights, SOURCE_TOKENS, TARGET_TOKENS, path)
    panels = image_axes(figure)
    assert len(panels) == heads
    assert len(figure.axes) == heads + 1  # and one shared colour bar
    for head, axes in enumerate(panels):
        rows, cols, start, _ = axes.get_subplotspec().get_geometry()
        assert (rows, cols, start) == (1, heads, head)
        np.testing.assert_allclose(axes.images[0].get_array(), weights[head], rtol=1e-6)
        assert [t.get_text() for t in axes.get_xticklabels()] == SOURCE_TOKENS
        # Source tokens under every panel, target tokens left of the first only.
        assert [t.get_text() for t in axes.get_yticklabels()] == (TARGET_TOKENS if head == 0 else [])
        assert axes.get_title() == f"head {head + 1}"

    with open(path, "rb") as f:
        png = f.read()
    assert png.startswith(b"\x89PNG")
    height, width = tf.io.decode_png(png).shape[:2]
    fig_width, fig_height = figure.get_size_inches() * 100  # figure_to_png's default dpi
    assert abs(height - fig_height) < 1 and abs(width - fig_width) < 1  # Agg rounds to whole pixels
    assert os.listdir(tmp_path) == ["attention.png"]


def test_plot_attention_one_head_and_bad_labels():
    weights = attention_weights(1)[0]  # (T_y, T_x)
    figure = plot_attention(weights, SOURCE_TOKENS, TARGET_TOKENS)
    assert len(image_axes(figure)) == 1
    with pytest.raises(ValueError, match="need 5 source and 4 target tokens, got 4 and 4"):
        plot_attention(weights, SOURCE_TOKENS[:-1], TARGET_TOKENS)
    with pytest.raises(ValueError, match="blocks, heads, T_y, T_x"):
        plot_attention(np.zeros([1, 1, 1, 4, 5]), SOURCE_TOKENS, TARGET_TOKENS)

"""Tests for ``tf_transformer.cli.plots``, the curves of ``tf_transformer.train.summaries`` and the figures of
``tf_transformer.figures``: the drawn data is the model's table, the scalars written by :class:`Summaries`,
and every attention head."""

import glob
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.toy_model import TOY, toy_model_dir
from tf_transformer.cli import plots
from tf_transformer.figures import CURVES, plot_attention, plot_curves, plot_positional_encoding
from tf_transformer.nn.modules import PositionalEncoding, sinusoid_table
from tf_transformer.train import summaries as summaries_module
from tf_transformer.train.summaries import CURVE_TAGS, LOG_DIR, Summaries, read_scalars, write_training_curves

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(capsys, *argv):
    """plots.main in this process: (exit code, stdout lines, stderr lines)."""
    code = plots.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err.splitlines()


def test_positional_encoding_draws_the_models_table_positions_down(tmp_path, capsys):
    path = tmp_path / "pe.png"
    assert run(capsys, "positional-encoding", "--length", "30", "--units", "16", "--output", str(path))[:2] == \
        (0, [str(path)])
    assert path.read_bytes().startswith(PNG_MAGIC)

    figure = plot_positional_encoding(sinusoid_table(30, 16).numpy())
    axes = figure.axes[0]
    drawn = axes.images[0].get_array()
    # What the model adds to its embeddings, one row per position.
    added = PositionalEncoding(num_units=16)(tf.zeros([1, 30], tf.int32))[0].numpy()
    np.testing.assert_allclose(drawn, added, atol=1e-6)
    assert drawn.shape == (30, 16)
    assert axes.get_ylim() == (30, 0)  # position 0 at the top, as the blog draws it
    assert axes.get_xlim() == (0, 16)
    assert (axes.get_xlabel(), axes.get_ylabel()) == ("Embedding Dimensions", "Token Position")


def write_run(log_dir, loss, learning_rate, bleu):
    """One training run's summaries (a Summaries writer): dicts step -> value, plus a text and an image."""
    with Summaries(log_dir) as summaries:
        for step, value in loss.items():
            summaries.scalars(step, **{"train/loss": value, "train/accuracy": 0.5})
        for step, value in learning_rate.items():
            summaries.scalars(step, **{"train/learning_rate": value})
        for step, value in bleu.items():
            summaries.scalars(step, **{"dev/bleu": value})
            summaries.text(step, "dev/samples", ["a -> b"])
            summaries.attention_image(step, "dev/attention", np.full([1, 2, 2], 0.5), ["a", "b"], ["c", "d"])


def test_curves_plot_the_scalars_of_a_resumed_run_merged_by_step(tmp_path, capsys):
    model_dir = tmp_path / "run"
    log_dir = str(model_dir / LOG_DIR)
    rng = np.random.default_rng(0)
    first = {step: float(v) for step, v in zip(range(1, 7), rng.uniform(2, 8, 6))}
    write_run(log_dir, first, {3: 1e-4, 6: 2e-4}, {3: 1.5, 6: 2.5})
    # Resumed from the checkpoint at step 4: steps 5 and 6 again, with new values, then 7 and 8.
    resumed = {step: float(v) for step, v in zip(range(5, 9), rng.uniform(2, 8, 4))}
    write_run(log_dir, resumed, {8: 3e-4}, {6: 4.0, 8: 5.0})
    assert len(glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))) == 2

    scalars = read_scalars(log_dir)
    loss = {**first, **resumed}
    assert set(scalars) == {"train/loss", "train/accuracy", "train/learning_rate", "dev/bleu"}  # no text, image
    assert scalars["train/loss"][0] == sorted(loss)
    np.testing.assert_allclose(scalars["train/loss"][1], [loss[step] for step in sorted(loss)], rtol=1e-6)

    figure = plot_curves(read_scalars(log_dir, {tag for tag, _ in CURVES}))
    expected = {"train/loss": loss, "train/learning_rate": {3: 1e-4, 6: 2e-4, 8: 3e-4},
                "dev/bleu": {3: 1.5, 6: 4.0, 8: 5.0}}
    for axes, (tag, name) in zip(figure.axes, CURVES):
        assert axes.get_title() == name
        steps, values = axes.lines[0].get_xydata().T
        assert steps.tolist() == sorted(expected[tag])
        np.testing.assert_allclose(values, [expected[tag][step] for step in sorted(expected[tag])], rtol=1e-6)

    path = write_training_curves(str(model_dir))
    assert path == str(model_dir / "curves.png")
    assert (model_dir / "curves.png").read_bytes().startswith(PNG_MAGIC)
    out = tmp_path / "c.png"
    assert run(capsys, "curves", str(model_dir), "--output", str(out))[:2] == (0, [str(out)])
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_a_resumed_runs_curves_are_its_event_files_without_reading_them_at_each_evaluation(tmp_path, monkeypatch):
    model_dir = tmp_path / "run"
    log_dir = str(model_dir / LOG_DIR)
    rng = np.random.default_rng(1)
    write_run(log_dir, {step: float(v) for step, v in zip(range(1, 7), rng.uniform(2, 8, 6))}, {3: 1e-4}, {3: 1.5})
    with Summaries(log_dir) as summaries:  # resumed from step 4: steps 5 and 6 logged again, then 7
        read_at_evaluation = []

        def read_scalars_recorded(*args):
            read_at_evaluation.append(args)

        monkeypatch.setattr(summaries_module, "read_scalars", read_scalars_recorded)
        for step in range(5, 8):
            summaries.scalars(step, **{"train/loss": rng.uniform(2, 8), "train/accuracy": 0.5})
        summaries.scalars(7, **{"train/learning_rate": 3e-4, "dev/bleu": 4.0, "dev/chrf": 30.0})
        path = summaries.write_curves()
        assert path == str(model_dir / "curves.png") and read_at_evaluation == []
        in_memory = summaries.curves()
    monkeypatch.undo()
    from_files = read_scalars(log_dir, CURVE_TAGS)
    assert set(in_memory) == set(from_files) == CURVE_TAGS
    for tag in CURVE_TAGS:
        assert in_memory[tag][0] == from_files[tag][0]
        assert in_memory[tag][1] == from_files[tag][1]  # float32, as the event files hold them
    assert in_memory["train/loss"][0] == list(range(1, 8))
    assert (model_dir / "curves.png").read_bytes().startswith(PNG_MAGIC)
    assert Summaries(None).write_curves() is None and Summaries(None).curves() == {}


def test_curves_read_a_cut_event_file_up_to_the_damage_and_show_missing_tags(tmp_path):
    log_dir = str(tmp_path / LOG_DIR)
    write_run(log_dir, {step: float(step) for step in range(1, 101)}, {}, {})
    [path] = glob.glob(os.path.join(log_dir, "events.out.tfevents.*"))
    with open(path, "r+b") as f:  # a run killed while writing
        f.truncate(os.path.getsize(path) // 2 + 3)  # mid-record
    steps, values = read_scalars(log_dir)["train/loss"]
    assert 10 < len(steps) < 100 and steps == list(range(1, len(steps) + 1)) and values == steps

    figure = plot_curves(read_scalars(log_dir, {tag for tag, _ in CURVES}))
    assert [len(axes.lines) for axes in figure.axes] == [1, 0, 0]  # no learning rate, no BLEU
    assert [text.get_text() for text in figure.axes[2].texts] == ["no dev/bleu yet"]


def test_attention_draws_every_block_and_head_with_outer_labels():
    blocks, heads, source, target = 2, 3, ["ich", "mochte", "ein", "bier", "</S>"], ["i", "want", "beer", "</S>"]
    logits = np.random.default_rng(1).normal(size=(blocks, heads, len(target), len(source)))
    weights = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    figure = plot_attention(weights, source, target, title="t")
    panels = [axes for axes in figure.axes if axes.images]
    assert len(panels) == blocks * heads and len(figure.axes) == blocks * heads + 1  # and one colour bar
    for index, axes in enumerate(panels):
        block, head = divmod(index, heads)
        np.testing.assert_allclose(axes.images[0].get_array(), weights[block, head], rtol=1e-6)
        x_labels = [t.get_text() for t in axes.get_xticklabels()]
        y_labels = [t.get_text() for t in axes.get_yticklabels()]
        assert x_labels == (source if block == blocks - 1 else [])
        assert y_labels == (target if head == 0 else [])
        # Inner panels carry no tick marks either: one tick per token on the outer ones, none inside.
        assert list(axes.get_xticks()) == (list(range(len(source))) if block == blocks - 1 else [])
        assert list(axes.get_yticks()) == (list(range(len(target))) if head == 0 else [])
        assert axes.get_title() == (f"head {head + 1}" if block == 0 else "")
        assert axes.get_ylabel() == (f"decoder block {block + 1}" if head == 0 else "")


@pytest.mark.parametrize("argv, message", [
    (["curves", "{tmp}/missing"], "missing: no such model directory"),
    (["curves", "{tmp}"], "no TensorBoard event files"),
    (["curves", "{tmp}", "--output", "{tmp}/c.pdf"], "c.pdf: give a file name ending in .png"),
    (["positional-encoding", "--output", "{tmp}/no/pe.png"], "its directory does not exist"),
    (["positional-encoding", "--units", "0"], "--units 0: must be at least 1"),
    (["attention", "--model-dir", "{tmp}", "ein bier"], "no hparams.yaml there"),
])
def test_bad_arguments_give_one_error_line(tmp_path, capsys, argv, message):
    code, out, err = run(capsys, *[arg.format(tmp=tmp_path) for arg in argv])
    assert (code, out, len(err)) == (2, [], 1)
    assert err[0].startswith("error: ") and message in err[0]


@pytest.mark.slow  # trains the shared toy model when it runs first
def test_attention_command_translates_and_draws_every_block(tmp_path_factory, tmp_path, capsys):
    model_dir = toy_model_dir(tmp_path_factory)
    path = tmp_path / "attention.png"
    assert run(capsys, "attention", "--model-dir", model_dir, list(TOY)[0], "--output", str(path))[:2] == \
        (0, [str(path)])
    assert path.read_bytes().startswith(PNG_MAGIC)
    code, _, err = run(capsys, "attention", "--model-dir", model_dir, "  ", "--output", str(path))
    assert code == 2 and "has no words" in err[0]

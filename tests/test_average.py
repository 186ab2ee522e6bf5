"""Checkpoint averaging (:mod:`tf_transformer.train.average`): exact means, a model directory that
translate.py reads, one-line errors, and the end-of-run average that is kept only when better."""

import os
import re
import shutil
import types

import numpy as np
import pytest
import tensorflow as tf

from helpers import fill, read_only, small_disk
from tests.test_reliability import hold_lock, release
from tests.toy_model import TOY
from tf_transformer.cli import average as average_cli
from tf_transformer.cli import translate as translate_cli
from tf_transformer.data import corpus
from tf_transformer.data.tokenizer import train_tokenizers
from tf_transformer.hparams import load_hparams
from tf_transformer.infer.load import load_for_inference
from tf_transformer.infer.translate import translate
from tf_transformer.model_dir import checkpoint_files, checks, run_files
from tf_transformer.train import average
from tf_transformer.train.run import train

TINY = ["num_blocks=1", "num_units=8", "num_heads=2", "d_ff=8", "average_last=3"]


def save(directory, model, tokenizers, step, keep=10):
    """Saves ``model`` as train.py's checkpoints do (model and tokenizer fingerprint) as ckpt-``step``."""
    checkpoint = tf.train.Checkpoint(model=model, tokenizer_fingerprint=tf.Variable(
        checks.tokenizer_fingerprint(*tokenizers), trainable=False))
    return tf.train.CheckpointManager(checkpoint, directory, max_to_keep=keep).save(checkpoint_number=step)


def tiny_model_dir(path, *overrides):
    """A model directory of a tiny word-level model: (hp, tokenizers, model), nothing saved but the run files."""
    hp = load_hparams("toy", overrides=TINY + list(overrides))
    tokenizers = train_tokenizers(hp, list(TOY.items()))
    run_files.save_run_files(str(path), hp, *tokenizers)
    return hp, tokenizers, checkpoint_files.build_model(hp, *tokenizers)


def with_known_weights(directory, model, tokenizers, steps):
    """Saves ``model`` once per step with seeded normal weights; returns the checkpoint paths."""
    paths = []
    for step in steps:
        rng = np.random.default_rng(step)
        for w in model.weights:
            w.assign(rng.normal(size=w.shape).astype(np.float32))
        paths.append(save(directory, model, tokenizers, step))
    return paths


def model_values(path):
    """{checkpoint key: value} of the model's variables in a checkpoint, read without any model."""
    return {name: tf.train.load_variable(path, name) for name, _ in tf.train.list_variables(path)
            if name.startswith("model/")}


def test_the_average_of_known_weights_is_exact(tmp_path):
    _, tokenizers, model = tiny_model_dir(tmp_path)
    paths = with_known_weights(str(tmp_path), model, tokenizers, [10, 20, 30, 40])
    averaged, used = average.average_checkpoints(str(tmp_path), last=3)
    assert used == paths[1:] and averaged == os.path.join(str(tmp_path), "average", "ckpt-40")
    got, inputs = model_values(averaged), [model_values(p) for p in paths[1:]]
    assert set(got) == set(inputs[0]) and len(got) == len(model.weights)
    for name, value in got.items():
        expected = np.mean(np.stack([v[name] for v in inputs]).astype(np.float64), axis=0).astype(np.float32)
        np.testing.assert_array_equal(value, expected, err_msg=name)
    # The training checkpoints are untouched, and nothing temporary is left.
    assert tf.train.latest_checkpoint(str(tmp_path)) == paths[-1]
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.slow  # trains the shared toy model when it runs first; traces two decoders
def test_a_model_averaged_from_identical_checkpoints_translates_identically(toy_loaded, tmp_path, capsys):
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    tokenizers = (source_tokenizer, target_tokenizer)
    run_files.save_run_files(str(tmp_path), hp, *tokenizers)
    for step in (1, 2, 3):
        save(str(tmp_path), model, tokenizers, step)
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    output = os.path.join(str(tmp_path), "average")
    assert out == [f"averaged 3 checkpoints (steps 1, 2, 3) into {output}/ckpt-3; "
                   f"translate with: translate.py --model-dir {output}"]

    averaged = load_for_inference(output)[3]  # as translate.py and the export load it
    for a, b in zip(averaged.weights, model.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    sentences = list(TOY) + ["ich mochte ein"]
    assert (translate(sentences, *tokenizers, averaged)
            == translate(sentences, *tokenizers, model))
    # The export's --checkpoint check (the tokenizer fingerprint) passes for the average too.
    checks.check_tokenizer(str(tmp_path), hp, os.path.join(output, "ckpt-3"), tokenizers)

    # Averaging again replaces the average, whole.
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "2", "--output", output]) == 0
    assert "steps 2, 3" in capsys.readouterr().out
    assert sorted(os.listdir(output)) == sorted(["average.yaml", "checkpoint", "ckpt-3.data-00000-of-00001",
                                                 "ckpt-3.index", "hparams.yaml", "sentencepiece.model"])


def error_line(capsys, *argv):
    assert average_cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


def test_cli_errors_are_one_line(tmp_path, capsys):
    missing = str(tmp_path / "missing")
    assert error_line(capsys, "--model-dir", missing, "--last", "2") == \
        f"error: --model-dir {missing}: no such directory\n"
    hp, tokenizers, model = tiny_model_dir(tmp_path)
    with_known_weights(str(tmp_path), model, tokenizers, [5, 6])
    assert "2 checkpoint(s), fewer than --last 3" in error_line(capsys, "--model-dir", str(tmp_path), "--last", "3")
    assert "--last 0: must be at least 1" in error_line(capsys, "--model-dir", str(tmp_path), "--last", "0")
    # A checkpoint of a wider feed-forward layer among them.
    wider = checkpoint_files.build_model(hp.replace(d_ff=16), *tokenizers)
    save(str(tmp_path), wider, tokenizers, 7)
    err = error_line(capsys, "--model-dir", str(tmp_path), "--last", "2")
    assert re.fullmatch(rf"error: model/\S+/inner_bias/\S+: shape \[8\] in {tmp_path}/ckpt-6 but \[16\] in "
                        rf"{tmp_path}/ckpt-7; only checkpoints of one model average\n", err), err


def test_average_if_better_keeps_only_a_better_average(tmp_path):
    hp, tokenizers, model = tiny_model_dir(tmp_path)
    paths = with_known_weights(str(tmp_path), model, tokenizers, [1, 2, 3])
    before = [w.numpy() for w in model.weights]
    scored = []

    def score(bleu):
        return lambda: scored.append([w.numpy() for w in model.weights]) or types.SimpleNamespace(bleu=bleu)

    path, scores = average.average_if_better(str(tmp_path), 3, model, hp, tokenizers, score(20.0), bar=20.0)
    assert (path, scores.bleu) == (None, 20.0) and not os.path.exists(tmp_path / "average")
    for kept, old, mean in zip(model.weights, before, scored[0]):  # scored with the average, then put back
        np.testing.assert_array_equal(kept.numpy(), old)
        assert not np.array_equal(mean, old)

    path, scores = average.average_if_better(str(tmp_path), 3, model, hp, tokenizers, score(21.0), bar=20.0)
    assert path == os.path.join(str(tmp_path), "average", "ckpt-3")
    for name, value in model_values(path).items():
        np.testing.assert_allclose(value, np.mean([tf.train.load_variable(p, name) for p in paths], axis=0),
                                   rtol=1e-6, atol=1e-7)
    assert average.average_if_better(str(tmp_path), 4, model, hp, tokenizers, score(99.0), None) == (None, None)


@pytest.mark.slow  # a short training run with its dev evaluations
def test_training_with_average_last_averages_at_the_end(tmp_path):
    hp = load_hparams("toy", overrides=["num_epochs=4", "eval_every_epochs=0", "average_last=3"])
    lines = []
    result = train(hp, corpus.corpus_splits("toy"), str(tmp_path), log=lines.append, samples=0,
                         export=False)
    line = [line for line in lines if line.startswith("average of the last 3 checkpoints: dev BLEU ")]
    assert len(line) == 1, lines
    if "kept as" in line[0]:
        assert result.best_checkpoint == os.path.join(str(tmp_path), "average", "ckpt-4")
    else:
        assert "dropped" in line[0] and result.best_checkpoint.startswith(os.path.join(str(tmp_path), "best"))


def test_translate_uses_the_average_only_while_it_averages_the_newest_checkpoint(tmp_path, capsys):
    hp, tokenizers, model = tiny_model_dir(tmp_path)
    with_known_weights(str(tmp_path), model, tokenizers, [1, 2, 3])
    assert average.current_average(str(tmp_path)) is None  # no average yet
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "2"]) == 0
    assert average.current_average(str(tmp_path)) == os.path.join(str(tmp_path), "average")
    capsys.readouterr()
    assert translate_cli.main(["--model-dir", str(tmp_path), "--beam-size", "1", "ich"]) == 0
    assert capsys.readouterr().err.startswith(f"translating with {os.path.join(str(tmp_path), 'average')}: ")
    with_known_weights(str(tmp_path), model, tokenizers, [4])  # training went on: the average is stale
    assert average.current_average(str(tmp_path)) is None
    assert translate_cli.main(["--model-dir", str(tmp_path), "--beam-size", "1", "ich"]) == 0
    assert "translating with" not in capsys.readouterr().err


# ---- issue 24: averaging that cannot destroy anything -------------------------------

def tree(root):
    """{relative path: (size, mtime_ns)} of every file below ``root``."""
    found = {}
    for directory, _, files in os.walk(root):
        for name in files:
            path = os.path.join(directory, name)
            status = os.stat(path)
            found[os.path.relpath(path, root)] = (status.st_size, status.st_mtime_ns)
    return found


def test_an_output_that_would_replace_anything_but_an_average_is_refused_and_nothing_is_touched(tmp_path, capsys):
    parent = tmp_path / "runs"
    model_dir = parent / "model"
    hp, tokenizers, model = tiny_model_dir(model_dir)
    with_known_weights(str(model_dir), model, tokenizers, [1, 2])
    (model_dir / "export" / "1").mkdir(parents=True)
    (model_dir / "export" / "1" / "saved_model.pb").write_bytes(b"an export")
    (model_dir / "notes.txt").write_text("a user's own file")
    (parent / "sibling").mkdir()
    (parent / "sibling" / "ckpt-9.index").write_bytes(b"another model")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "thesis.tex").write_text("months of work")
    before = tree(tmp_path)
    for output, problem in ((model_dir, "is the model directory itself"),
                            (model_dir / "export", "export/"),
                            (model_dir / "export" / "2", "export/"),
                            (parent, "holds the model directory"),
                            (tmp_path, "holds the model directory"),
                            (model_dir / "hparams.yaml", "is a file"),
                            (tmp_path / "mine", "is not an average of")):
        err = error_line(capsys, "--model-dir", str(model_dir), "--last", "2", "--output", str(output))
        assert err.startswith(f"error: --output {output}: ") and problem in err, err
    assert tree(tmp_path) == before
    # An average of another model directory is not this one's to replace either.
    other = tmp_path / "other"
    _, other_tokenizers, other_model = tiny_model_dir(other)
    with_known_weights(str(other), other_model, other_tokenizers, [1, 2])
    assert average_cli.main(["--model-dir", str(other), "--last", "2"]) == 0
    err = error_line(capsys, "--model-dir", str(model_dir), "--last", "2", "--output", str(other / "average"))
    assert "is not an average of" in err
    # A new directory, and then this model's own earlier average, are written.
    for _ in range(2):
        assert average_cli.main(["--model-dir", str(model_dir), "--last", "2", "--output",
                                 str(tmp_path / "avg")]) == 0
    assert tree(tmp_path / "mine") == {"thesis.tex": before[os.path.join("mine", "thesis.tex")]}


def damage_data(prefix):
    """Truncates a checkpoint's data file (``Read less bytes than requested``)."""
    data = prefix + ".data-00000-of-00001"
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)


def damage_index(prefix):
    """Overwrites a checkpoint's index with garbage (``not an sstable``)."""
    with open(prefix + ".index", "wb") as f:
        f.write(b"garbage" * 20)


def lose_data(prefix):
    os.remove(prefix + ".data-00000-of-00001")


@pytest.mark.parametrize("damage", [damage_data, damage_index, lose_data])
def test_a_damaged_checkpoint_among_the_last_is_named_and_the_one_before_averaged(tmp_path, capsys, damage):
    _, tokenizers, model = tiny_model_dir(tmp_path)
    paths = with_known_weights(str(tmp_path), model, tokenizers, [10, 20, 30, 40])
    damage(paths[2])
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "2"]) == 0
    out, err = capsys.readouterr()
    assert "steps 20, 40" in out
    assert f"warning: checkpoint {paths[2]} is unreadable" in err and "Traceback" not in err
    got, inputs = model_values(os.path.join(str(tmp_path), "average", "ckpt-40")), [model_values(p)
                                                                                   for p in (paths[1], paths[3])]
    for name, value in got.items():
        expected = np.mean(np.stack([v[name] for v in inputs]).astype(np.float64), axis=0).astype(np.float32)
        np.testing.assert_array_equal(value, expected, err_msg=name)
    # Too few readable ones: one line, nothing written.
    damage(paths[0])
    shutil.rmtree(os.path.join(str(tmp_path), "average"))
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "3"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == f"error: {tmp_path}: fewer than --last 3 readable checkpoints (the others are damaged, " \
                        f"named above)" and len(lines) == 3 and all("unreadable" in line for line in lines[:2])
    assert not os.path.exists(os.path.join(str(tmp_path), "average"))


def test_averaging_holds_the_model_directory_lock(tmp_path, capsys):
    _, tokenizers, model = tiny_model_dir(tmp_path)
    with_known_weights(str(tmp_path), model, tokenizers, [1, 2])
    holder = hold_lock(str(tmp_path))  # as a trainer rotating its checkpoints holds it
    try:
        err = error_line(capsys, "--model-dir", str(tmp_path), "--last", "2")
        assert f"in use by process {holder.pid}" in err
    finally:
        release(holder)
    assert not os.path.exists(os.path.join(str(tmp_path), "average"))


def test_a_read_only_model_directory_averages_elsewhere_and_says_so_for_itself(tmp_path, capsys):
    model_dir = tmp_path / "model"
    _, tokenizers, model = tiny_model_dir(model_dir)
    with_known_weights(str(model_dir), model, tokenizers, [1, 2])
    with read_only(model_dir):
        err = error_line(capsys, "--model-dir", str(model_dir), "--last", "2")
        assert "cannot write there (read-only); give --output DIR elsewhere" in err
        assert average_cli.main(["--model-dir", str(model_dir), "--last", "2", "--output",
                                 str(tmp_path / "avg")]) == 0
    assert os.path.exists(tmp_path / "avg" / "ckpt-2.index")


def test_a_full_disk_is_one_line_with_the_free_space_and_leaves_nothing(tmp_path, capsys):
    model_dir = tmp_path / "model"
    _, tokenizers, model = tiny_model_dir(model_dir)
    with_known_weights(str(model_dir), model, tokenizers, [1, 2])
    with small_disk(tmp_path / "disk", 256) as disk:
        fill(disk, 8 << 10)
        output = os.path.join(disk, "avg")
        err = error_line(capsys, "--model-dir", str(model_dir), "--last", "2", "--output", output)
        assert err.startswith(f"error: --output {output}: cannot write it (No space left on device; ")
        assert " free there); nothing was written" in err
        assert os.listdir(disk) == ["ballast"]


def test_a_damaged_average_record_is_no_average_and_no_traceback(tmp_path):
    _, tokenizers, model = tiny_model_dir(tmp_path)
    with_known_weights(str(tmp_path), model, tokenizers, [1, 2])
    assert average_cli.main(["--model-dir", str(tmp_path), "--last", "2"]) == 0
    assert average.current_average(str(tmp_path)) == os.path.join(str(tmp_path), "average")
    for garbage in ("averaged: [\n", "[1, 2]\n", "averaged: 7\n"):
        (tmp_path / "average" / "average.yaml").write_text(garbage)
        assert average.current_average(str(tmp_path)) is None, garbage

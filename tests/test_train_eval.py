"""The trainer's evaluation and observability, end to end on the toy corpus:
dev BLEU 100, TensorBoard event files with the expected tags, the best checkpoint, samples."""

import glob
import os

import pytest
import sacrebleu
import tensorflow as tf
import yaml

from tf_transformer.data import corpus
from tf_transformer.hparams import load_hparams
from tf_transformer.train.run import Result, summary_lines, train
from tf_transformer.train.scores import Scores

# The toy corpus has no dev split: the trainer scores the training pairs instead.
TOY_PAIRS = corpus.corpus_splits("toy")["train"].read().pairs
EVAL_EVERY_EPOCHS = 50  # of the toy preset's 150: evaluations at steps 50, 100 and 150 (one batch an epoch)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    model_dir = str(tmp_path_factory.mktemp("toy-eval"))
    hp = load_hparams("toy", overrides=[f"eval_every_epochs={EVAL_EVERY_EPOCHS}"])
    lines = []
    result = train(hp, corpus.corpus_splits("toy"), model_dir, log=lines.append, samples=0, export=False)
    return hp, model_dir, result, lines


def read_events(log_dir):
    """{tag: [(step, plugin, value), ...]} from every event file under ``log_dir``."""
    tags = {}
    paths = glob.glob(os.path.join(log_dir, "**", "events.out.tfevents.*"), recursive=True)
    assert paths, f"no event files under {log_dir}"
    for path in paths:
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(
                    (event.step, value.metadata.plugin_data.plugin_name, tf.make_ndarray(value.tensor)))
    return tags


@pytest.mark.slow
def test_toy_dev_bleu_reaches_100(run):
    _, _, result, lines = run
    references = [t for _, t in TOY_PAIRS]
    assert result.dev.hypotheses == references
    assert result.dev.bleu == pytest.approx(100.0)
    assert result.dev.chrf == pytest.approx(100.0)
    assert sacrebleu.corpus_bleu(result.dev.hypotheses, [references]).score == pytest.approx(100.0)
    # The log shows the score with sacrebleu's signature.
    assert any("BLEU 100.0" in line and "BLEU signature: nrefs:1|" in line for line in lines), lines


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_expected_tags(run):
    hp, model_dir, result, _ = run
    tags = read_events(os.path.join(model_dir, "logs"))
    for tag in ("train/loss", "train/accuracy", "train/learning_rate", "train/target_tokens_per_sec",
                "dev/bleu", "dev/chrf"):
        assert tag in tags and all(plugin == "scalars" for _, plugin, _ in tags[tag]), (tag, sorted(tags))
    assert len(tags["train/loss"]) == result.step  # one loss per step
    assert float(tags["train/learning_rate"][-1][2]) == pytest.approx(hp.learning_rate)  # constant schedule
    bleu = sorted((step, float(value)) for step, _, value in tags["dev/bleu"])
    assert [step for step, _ in bleu] == [50, 100, 150]
    assert bleu[-1][1] == pytest.approx(100.0)
    assert [plugin for _, plugin, _ in tags["dev/samples"]] == ["text"] * 3
    last_samples = max(tags["dev/samples"], key=lambda event: event[0])[2].item().decode()
    assert TOY_PAIRS[0][1] in last_samples
    assert [plugin for _, plugin, _ in tags["dev/attention"]] == ["images"] * 3
    width, height, png = tags["dev/attention"][-1][2]
    assert png.startswith(b"\x89PNG") and int(width) > 0 and int(height) > 0


@pytest.mark.slow
def test_best_checkpoint_and_samples_are_kept(run):
    _, model_dir, result, _ = run
    best_dir = os.path.join(model_dir, "best")
    assert result.best_checkpoint == tf.train.latest_checkpoint(best_dir)
    assert tf.io.gfile.glob(result.best_checkpoint + ".index")
    with open(os.path.join(best_dir, "best.yaml"), encoding="utf-8") as f:
        record = yaml.safe_load(f)
    tags = read_events(os.path.join(model_dir, "logs"))
    best_bleu, first_step = max((float(v), -step) for step, _, v in tags["dev/bleu"])
    assert record["bleu"] == pytest.approx(best_bleu) == pytest.approx(100.0)
    assert record["step"] == -first_step  # the first evaluation that reached the best score is kept
    assert os.path.basename(result.best_checkpoint) == record["checkpoint"]
    # The samples file of the last evaluation shows every pair (there are 3).
    with open(result.samples_file, encoding="utf-8") as f:
        samples = f.read()
    for source, reference in TOY_PAIRS:
        assert f"source:     {source}" in samples
        assert f"hypothesis: {reference}" in samples


@pytest.mark.slow
def test_training_draws_its_curves_and_says_where(run):
    _, model_dir, _, lines = run
    path = os.path.join(model_dir, "curves.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # Drawn after each evaluation, the last one included: no samples file is newer.
    assert os.path.getmtime(path) >= max(os.path.getmtime(p) for p in glob.glob(os.path.join(model_dir, "samples-*")))
    assert any(line.strip().startswith(f"curves:      {path} ") for line in lines), lines


def _scores(bleu):
    return Scores(bleu=bleu, chrf=50.0, bleu_signature="b", chrf_signature="c", hypotheses=[])


def test_the_last_line_gives_the_dev_bleu_of_the_kept_weights_beside_the_last_checkpoints():
    kept = Result(model=None, step=300, dev=_scores(25.25), test=_scores(27.64), checkpoint="d/ckpt-300",
                          best_checkpoint="d/average/ckpt-300", best_dev_bleu=28.2)
    assert summary_lines(kept, "d")[0] == (
        "done: step 300, dev BLEU 25.2 (last checkpoint), 28.2 (kept weights), test BLEU 27.6")
    none_kept = Result(model=None, step=300, dev=_scores(25.25), checkpoint="d/ckpt-300")
    assert summary_lines(none_kept, "d")[0] == "done: step 300, dev BLEU 25.2"

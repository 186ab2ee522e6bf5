"""The trainer's evaluation and observability, end to end on the toy corpus:
dev BLEU 100, TensorBoard event files with the expected tags, the best checkpoint, samples."""

import glob
import os

import pytest
import sacrebleu
import tensorflow as tf
import yaml

from tests.toy_model import toy_train_py_run
from tf_transformer.data import corpus
from tf_transformer.train.run import Result, summary_lines
from tf_transformer.train.scores import Scores

# The toy corpus has no dev split: the trainer scores the training pairs instead.
TOY_PAIRS = corpus.corpus_splits("toy")["train"].read().pairs


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """The session's toy train.py run (tests/toy_model.py): evaluations at steps 50, 100 and 150, one batch an
    epoch. test_end_to_end.py reads it too."""
    result = toy_train_py_run(tmp_path_factory)
    assert result.returncode == 0, result.stderr
    return result


def printed(run, label):
    """The first word after ``label`` on the line of train.py's output that starts with it (leading spaces
    aside): the paths of its last lines."""
    lines = [line.strip() for line in run.stdout.splitlines() if line.strip().startswith(label)]
    assert lines, (label, run.stdout)
    return lines[0][len(label):].split()[0]


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
    references = [t for _, t in TOY_PAIRS]
    last = [line for line in run.stdout.splitlines() if line.startswith("dev at step 150 ")]
    # The log shows the score with sacrebleu's signature.
    assert len(last) == 1 and "BLEU 100.0 chrF 100.0" in last[0] and "BLEU signature: nrefs:1|" in last[0]
    # The samples printed at the end: every source with its reference as hypothesis.
    hypotheses = {s.strip(): h.strip() for s, h in (line.split("  ->  ") for line in run.stdout.splitlines()
                                                    if "  ->  " in line)}
    assert [hypotheses[s] for s, _ in TOY_PAIRS] == references
    assert sacrebleu.corpus_bleu([hypotheses[s] for s, _ in TOY_PAIRS], [references]).score == pytest.approx(100.0)


@pytest.mark.slow
def test_tensorboard_event_files_hold_the_expected_tags(run):
    tags = read_events(os.path.join(run.model_dir, "logs"))
    for tag in ("train/loss", "train/accuracy", "train/learning_rate", "train/target_tokens_per_sec",
                "dev/bleu", "dev/chrf"):
        assert tag in tags and all(plugin == "scalars" for _, plugin, _ in tags[tag]), (tag, sorted(tags))
    assert printed(run, "done: step") == "150,"
    assert len(tags["train/loss"]) == 150  # one loss per step
    with open(os.path.join(run.model_dir, "hparams.yaml"), encoding="utf-8") as f:
        learning_rate = yaml.safe_load(f)["learning_rate"]
    assert float(tags["train/learning_rate"][-1][2]) == pytest.approx(learning_rate)  # constant schedule
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
    best_dir = os.path.join(run.model_dir, "best")
    best_checkpoint = printed(run, "best checkpoint:")
    assert best_checkpoint == tf.train.latest_checkpoint(best_dir)
    assert tf.io.gfile.glob(best_checkpoint + ".index")
    with open(os.path.join(best_dir, "best.yaml"), encoding="utf-8") as f:
        record = yaml.safe_load(f)
    tags = read_events(os.path.join(run.model_dir, "logs"))
    best_bleu, first_step = max((float(v), -step) for step, _, v in tags["dev/bleu"])
    assert record["bleu"] == pytest.approx(best_bleu) == pytest.approx(100.0)
    assert record["step"] == -first_step  # the first evaluation that reached the best score is kept
    assert os.path.basename(best_checkpoint) == record["checkpoint"]
    # The samples file of the last evaluation shows every pair (there are 3).
    samples_file = printed(run, "samples:")
    assert samples_file == os.path.join(run.model_dir, "samples-step150.txt")
    with open(samples_file, encoding="utf-8") as f:
        samples = f.read()
    for source, reference in TOY_PAIRS:
        assert f"source:     {source}" in samples
        assert f"hypothesis: {reference}" in samples


@pytest.mark.slow
def test_training_draws_its_curves_and_says_where(run):
    path = os.path.join(run.model_dir, "curves.png")
    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # Drawn after each evaluation, the last one included: no samples file is newer.
    model_dir = run.model_dir
    assert os.path.getmtime(path) >= max(os.path.getmtime(p) for p in glob.glob(os.path.join(model_dir, "samples-*")))
    assert printed(run, "curves:") == path


def _scores(bleu):
    return Scores(bleu=bleu, chrf=50.0, bleu_signature="b", chrf_signature="c", hypotheses=[])


def test_the_last_line_gives_the_dev_bleu_of_the_kept_weights_beside_the_last_checkpoints():
    kept = Result(model=None, step=300, dev=_scores(25.25), test=_scores(27.64), checkpoint="d/ckpt-300",
                          best_checkpoint="d/average/ckpt-300", best_dev_bleu=28.2)
    assert summary_lines(kept, "d")[0] == (
        "done: step 300, dev BLEU 25.2 (last checkpoint), 28.2 (kept weights), test BLEU 27.6")
    none_kept = Result(model=None, step=300, dev=_scores(25.25), checkpoint="d/ckpt-300")
    assert summary_lines(none_kept, "d")[0] == "done: step 300, dev BLEU 25.2"

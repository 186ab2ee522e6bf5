"""Tests for ``tf_transformer.train.scores``: BLEU/chrF, the best checkpoint, sample files."""

import os

import pytest
import sacrebleu
import tensorflow as tf
import yaml

from tf_transformer.errors import UserError
from tf_transformer.train.scores import BestCheckpoint, Scores, evaluate, format_samples, score, write_samples

SOURCES = ["ich mochte ein bier", "das wetter ist heute schön", "wo ist der bahnhof ?"]
REFERENCES = ["i want a beer", "the weather is nice today", "where is the train station ?"]
HYPOTHESES = ["i want one beer", "the weather is nice today", "where is the station ?"]


def scores_with_bleu(bleu, chrf=50.0):
    return Scores(bleu, chrf, "bleu-signature", "chrf-signature", [])


def test_scores_equal_sacrebleus_functional_api():
    scores = evaluate(SOURCES, REFERENCES, lambda sources: HYPOTHESES)
    expected_bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    expected_chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score
    assert scores.bleu == pytest.approx(expected_bleu, abs=1e-9)
    assert scores.chrf == pytest.approx(expected_chrf, abs=1e-9)
    assert 0 < scores.bleu < 100 and 0 < scores.chrf < 100
    assert scores.hypotheses == HYPOTHESES


def test_identical_text_scores_100():
    scores = score(REFERENCES, REFERENCES)
    assert scores.bleu == pytest.approx(100.0)
    assert scores.chrf == pytest.approx(100.0)


def test_format_prints_both_scores_and_signatures():
    scores = score(HYPOTHESES, REFERENCES)
    line = scores.format()
    assert "\n" not in line
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score
    assert line.startswith(f"BLEU {bleu:.1f} chrF {chrf:.1f} (")
    assert f"version:{sacrebleu.__version__}" in scores.bleu_signature
    assert "tok:13a" in scores.bleu_signature and "nrefs:1" in scores.bleu_signature
    assert "nc:6" in scores.chrf_signature  # chrF's character n-gram order
    assert f"BLEU signature: {scores.bleu_signature}" in line
    assert f"chrF signature: {scores.chrf_signature}" in line


def test_translate_fn_gets_the_sources_in_order_once():
    calls = []

    def translate_fn(sources):
        calls.append(list(sources))
        return [s.upper() for s in sources]

    scores = evaluate(SOURCES, REFERENCES, translate_fn)
    assert calls == [SOURCES]
    assert scores.hypotheses == [s.upper() for s in SOURCES]


def test_bad_input_is_a_clear_error():
    with pytest.raises(UserError, match="empty"):
        evaluate([], [], lambda sources: sources)
    with pytest.raises(UserError, match="3 sources but 2 references"):
        evaluate(SOURCES, REFERENCES[:2], lambda sources: sources)
    with pytest.raises(ValueError, match="returned 1 translations for 3 sources"):
        evaluate(SOURCES, REFERENCES, lambda sources: sources[:1])


def restored_value(path):
    v = tf.Variable(0.0)
    tf.train.Checkpoint(v=v).restore(path).assert_existing_objects_matched()
    return float(v.numpy())


def test_best_checkpoint_keeps_the_strictly_better_and_survives_a_restart(tmp_path):
    model_dir = str(tmp_path)
    v = tf.Variable(1.0)
    best = BestCheckpoint(model_dir, tf.train.Checkpoint(v=v))
    assert best.path is None and best.bleu is None

    assert best.update(scores_with_bleu(10.0), step=100)
    first = best.path
    assert os.path.dirname(first) == os.path.join(model_dir, "best")
    v.assign(2.0)
    assert not best.update(scores_with_bleu(5.0), step=200)  # worse
    assert not best.update(scores_with_bleu(10.0), step=300)  # equal is not better
    assert best.path == first and restored_value(best.path) == 1.0

    v.assign(3.0)
    assert best.update(scores_with_bleu(20.0, chrf=60.0), step=400)
    assert best.path != first and restored_value(best.path) == 3.0
    assert not tf.io.gfile.glob(first + ".*"), "max_to_keep=1: the previous best is deleted"
    # The training run's own checkpoint state in MODEL_DIR is untouched.
    assert tf.train.latest_checkpoint(model_dir) is None

    with open(os.path.join(model_dir, "best", "best.yaml"), encoding="utf-8") as f:
        record = yaml.safe_load(f)
    assert (record["bleu"], record["chrf"], record["step"]) == (20.0, 60.0, 400)

    # A restarted run reads the record back and keeps the bar.
    restarted = BestCheckpoint(model_dir, tf.train.Checkpoint(v=tf.Variable(9.0)))
    assert restarted.bleu == 20.0 and restarted.path == best.path
    assert not restarted.update(scores_with_bleu(15.0), step=500)
    assert restored_value(restarted.path) == 3.0
    assert restarted.update(scores_with_bleu(25.0), step=600)
    assert restored_value(restarted.path) == 9.0


def test_best_checkpoint_killed_before_its_record_keeps_the_checkpoint_on_disk(tmp_path):
    v = tf.Variable(1.0)
    best = BestCheckpoint(str(tmp_path), tf.train.Checkpoint(v=v))
    best.update(scores_with_bleu(10.0), step=1)
    v.assign(2.0)
    best.manager.save(checkpoint_number=2)  # as update() does, then "killed" before the record
    restarted = BestCheckpoint(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(0.0)))
    assert restarted.bleu == 10.0
    assert restored_value(restarted.path) == 2.0


def test_damaged_best_record_is_a_clear_error(tmp_path):
    best = BestCheckpoint(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)))
    best.update(scores_with_bleu(10.0), step=1)
    record = os.path.join(str(tmp_path), "best", "best.yaml")
    with open(record, "w") as f:
        f.write("[not: a record")
    with pytest.raises(UserError, match="best.yaml: not a best-checkpoint record"):
        BestCheckpoint(str(tmp_path), tf.train.Checkpoint(v=tf.Variable(1.0)))


def test_write_samples(tmp_path):
    path = str(tmp_path / "samples.txt")
    write_samples(path, SOURCES, REFERENCES, HYPOTHESES, n=2, header="step 7: BLEU 1.0")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    assert text.endswith("\n")
    blocks = text.strip("\n").split("\n\n")
    assert blocks[0] == "step 7: BLEU 1.0"
    assert len(blocks) == 3  # the header and n=2 samples
    for block, source, reference, hypothesis in zip(blocks[1:], SOURCES, REFERENCES, HYPOTHESES):
        lines = block.split("\n")
        assert len(lines) == 4
        assert lines[1].split(None, 1) == ["source:", source]
        assert lines[2].split(None, 1) == ["reference:", reference]
        assert lines[3].split(None, 1) == ["hypothesis:", hypothesis]
    assert SOURCES[2] not in text
    assert os.listdir(tmp_path) == ["samples.txt"]  # atomic: no temporary file left
    with pytest.raises(ValueError, match="line-aligned"):
        format_samples(SOURCES, REFERENCES[:1], HYPOTHESES)

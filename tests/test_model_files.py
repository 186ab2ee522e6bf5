"""Tests for ``tf_transformer.model_dir.run_files``: what a model directory holds and reading it back."""

import os

import pytest
import tensorflow as tf

from tf_transformer.data.tokenizer import SubwordTokenizer, WordTokenizer
from tf_transformer.data.vocab import WordVocab
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.infer.load import load_for_inference
from tf_transformer.model_dir import checks, run_files


def make_model_dir(path, hp, with_checkpoint=True):
    os.makedirs(path, exist_ok=True)
    hp.save(os.path.join(path, "hparams.yaml"))
    if with_checkpoint:
        tf.train.Checkpoint(v=tf.Variable(1.0)).save(os.path.join(path, "ckpt"))
    return str(path)


def test_check_compatible_different_architecture(tmp_path):
    saved = load_hparams("toy")  # num_blocks=2
    directory = make_model_dir(tmp_path / "run", saved)
    assert tf.train.latest_checkpoint(directory) is not None
    with pytest.raises(UserError) as info:
        checks.check_compatible(directory, saved.replace(num_blocks=7))
    message = str(info.value)
    assert "num_blocks" in message
    segment = [part for part in message.split(";") if "num_blocks" in part][0]
    assert "2" in segment.replace(directory, "") and "7" in segment.replace(directory, "")
    # Only the differing key is named.
    assert "num_units" not in message and "d_ff" not in message


def test_check_compatible_names_every_differing_key(tmp_path):
    saved = load_hparams("toy")
    directory = make_model_dir(tmp_path / "run", saved)
    with pytest.raises(UserError) as info:
        checks.check_compatible(directory, saved.replace(num_units=64, d_ff=96))
    assert "num_units" in str(info.value) and "d_ff" in str(info.value)
    assert "num_blocks" not in str(info.value)


def test_check_compatible_damaged_saved_hparams_is_one_clear_error(tmp_path):
    saved = load_hparams("toy")
    directory = make_model_dir(tmp_path / "run", saved)
    with open(os.path.join(directory, "hparams.yaml"), "wb") as f:
        f.write(b"num_blocks: 2\n\xe9\n")
    with pytest.raises(UserError) as info:
        checks.check_compatible(directory, saved)
    assert os.path.join(directory, "hparams.yaml") + ":2" in str(info.value)


def test_check_compatible_same_hparams(tmp_path):
    hp = load_hparams("toy")
    directory = make_model_dir(tmp_path / "run", hp)
    assert checks.check_compatible(directory, hp) is None
    # Training-only keys may change between runs.
    assert checks.check_compatible(directory, hp.replace(learning_rate=1e-4, num_epochs=3)) is None


def test_check_compatible_without_checkpoint(tmp_path):
    directory = make_model_dir(tmp_path / "run", load_hparams("toy"), with_checkpoint=False)
    assert checks.check_compatible(directory, load_hparams("toy").replace(num_blocks=7)) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert checks.check_compatible(str(empty), load_hparams("toy")) is None


def test_load_for_inference_empty_dir(tmp_path):
    with pytest.raises(UserError) as info:
        load_for_inference(str(tmp_path))
    assert "hparams.yaml" in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_load_for_inference_without_vocabs(tmp_path):
    directory = make_model_dir(tmp_path / "run", load_hparams("toy"), with_checkpoint=False)
    with pytest.raises(UserError) as info:
        load_for_inference(directory)
    assert "source.vocab.tsv" in str(info.value)


def test_load_for_inference_without_sentencepiece_model(tmp_path):
    directory = make_model_dir(tmp_path / "run", load_hparams("small"), with_checkpoint=False)
    with pytest.raises(UserError) as info:
        load_for_inference(directory)
    assert "sentencepiece.model" in str(info.value)


def word_tokenizers(*extra):
    return (WordTokenizer(WordVocab.build(["ich mochte ein bier", *extra])),
            WordTokenizer(WordVocab.build(["i want a beer"])))


@pytest.fixture(scope="module")
def subword():
    lines = [f"satz {i} über straße und größe nummer {i * 7}" for i in range(200)]
    return SubwordTokenizer.train(lines, vocab_size=60)


def test_word_tokenizers_round_trip_through_the_directory(tmp_path):
    hp = load_hparams("toy")
    source, target = word_tokenizers()
    run_files.save_run_files(str(tmp_path), hp, source, target)
    assert sorted(os.listdir(tmp_path)) == ["hparams.yaml", "source.vocab.tsv", "target.vocab.tsv"]
    loaded = run_files.load_tokenizers(str(tmp_path), hp)
    assert loaded[0].vocab.words == source.vocab.words and loaded[1].vocab.words == target.vocab.words
    assert run_files.load_tokenizers(str(tmp_path), hp.replace(tokenizer="sentencepiece")) is None


def test_sentencepiece_model_round_trips_through_the_directory(tmp_path, subword):
    hp = load_hparams("small")
    run_files.save_run_files(str(tmp_path), hp, subword, subword)
    assert sorted(os.listdir(tmp_path)) == ["hparams.yaml", "sentencepiece.model"]
    source, target = run_files.load_tokenizers(str(tmp_path), hp)
    assert source is target
    assert source.model_proto == subword.model_proto
    sentence = tf.constant(["satz 3 über straße"])
    assert source.tokenize(sentence).to_list() == subword.tokenize(sentence).to_list()


def test_damaged_sentencepiece_model_is_one_clear_error(tmp_path):
    hp = load_hparams("small")
    (tmp_path / "sentencepiece.model").write_bytes(b"not a model")
    with pytest.raises(UserError) as info:
        run_files.load_tokenizers(str(tmp_path), hp)
    assert str(tmp_path / "sentencepiece.model") in str(info.value)


def save_checkpoint(directory, tokenizers):
    checkpoint = tf.train.Checkpoint(v=tf.Variable(1.0),
                                     tokenizer_fingerprint=tf.Variable(checks.tokenizer_fingerprint(*tokenizers)))
    return checkpoint.save(os.path.join(directory, "ckpt"))


def test_checkpoint_accepts_the_tokenizer_it_was_trained_with(tmp_path):
    hp = load_hparams("toy")
    path = save_checkpoint(str(tmp_path), word_tokenizers())
    # Equal content, new objects: the same fingerprint.
    assert checks.check_tokenizer(str(tmp_path), hp, path, word_tokenizers()) is None


def test_checkpoint_refuses_another_tokenizer(tmp_path):
    hp = load_hparams("toy")
    path = save_checkpoint(str(tmp_path), word_tokenizers())
    other = word_tokenizers("noch ein wort")
    with pytest.raises(UserError) as info:
        checks.check_tokenizer(str(tmp_path), hp, path, other)
    message = str(info.value)
    assert path in message and "source.vocab.tsv" in message and "target.vocab.tsv" in message


def test_checkpoint_refuses_a_retrained_sentencepiece_model(tmp_path, subword):
    hp = load_hparams("small")
    path = save_checkpoint(str(tmp_path), (subword, subword))
    retrained = SubwordTokenizer.train([f"ganz andere {i} wörter hier" for i in range(100)], vocab_size=40)
    with pytest.raises(UserError) as info:
        checks.check_tokenizer(str(tmp_path), hp, path, (retrained, retrained))
    assert "sentencepiece.model" in str(info.value)

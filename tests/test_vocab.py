"""Tests for ``tf_transformer.data.vocab.WordVocab``."""

import os

import pytest

from tf_transformer.data.vocab import WordVocab
from tf_transformer.errors import UserError

# Word counts: a=4, b=2, c=1, d=1, e=1; c, d, e tie and keep first-appearance order.
LINES = ["a b c a", "b a d", "a e"]


def test_special_ids():
    vocab = WordVocab.build(LINES)
    assert vocab.words[:4] == ["<PAD>", "<UNK>", "<S>", "</S>"]
    assert [vocab.words.index(w) for w in ("<PAD>", "<UNK>", "<S>", "</S>")] == [0, 1, 2, 3]


def test_most_frequent_first():
    vocab = WordVocab.build(LINES)
    assert vocab.words == ["<PAD>", "<UNK>", "<S>", "</S>", "a", "b", "c", "d", "e"]
    assert vocab.counts == [0, 0, 0, 0, 4, 2, 1, 1, 1]
    assert len(vocab) == 9


def test_frequency_beats_first_appearance():
    vocab = WordVocab.build(["x y y z z z"])
    assert vocab.words[4:] == ["z", "y", "x"]


def test_max_size_counts_specials():
    vocab = WordVocab.build(LINES, max_size=6)
    assert len(vocab) == 6
    assert vocab.words == ["<PAD>", "<UNK>", "<S>", "</S>", "a", "b"]


def test_max_size_larger_than_needed():
    assert len(WordVocab.build(LINES, max_size=100)) == 9


def test_min_count_drops_rare_words():
    vocab = WordVocab.build(LINES, min_count=2)
    assert vocab.words == ["<PAD>", "<UNK>", "<S>", "</S>", "a", "b"]
    assert "c" not in vocab.words  # so the tokenizer maps it to <UNK> (tests/test_tokenizer.py)


# Turning words into ids and back is WordTokenizer's job: tests/test_tokenizer.py.


def test_save_load_round_trip(tmp_path):
    vocab = WordVocab.build(LINES)
    path = str(tmp_path / "v.tsv")
    vocab.save(path)
    loaded = WordVocab.load(path)
    assert loaded.words == ["<PAD>", "<UNK>", "<S>", "</S>", "a", "b", "c", "d", "e"]
    assert loaded.counts == [0, 0, 0, 0, 4, 2, 1, 1, 1]
    assert loaded.words == vocab.words
    assert os.listdir(tmp_path) == ["v.tsv"]


def test_saved_format_is_word_tab_count(tmp_path):
    path = tmp_path / "v.tsv"
    WordVocab.build(["a b a"]).save(str(path))
    assert path.read_text(encoding="utf-8") == "<PAD>\t0\n<UNK>\t0\n<S>\t0\n</S>\t0\na\t2\nb\t1\n"


@pytest.mark.parametrize("bad_line", ["b 2", "b\tx", "b\t1\t2", "b"])
def test_load_malformed_names_file_and_line(tmp_path, bad_line):
    path = tmp_path / "v.tsv"
    path.write_text(f"<PAD>\t0\n<UNK>\t0\n<S>\t0\n</S>\t0\na\t4\n{bad_line}\nc\t1\n", encoding="utf-8")
    with pytest.raises(UserError) as info:
        WordVocab.load(str(path))
    assert f"{path}:6" in str(info.value)


def test_load_missing_file(tmp_path):
    path = str(tmp_path / "missing.tsv")
    with pytest.raises(UserError) as info:
        WordVocab.load(path)
    assert path in str(info.value)


def test_constructor_rejects_missing_specials():
    with pytest.raises(UserError, match="<PAD>"):
        WordVocab(["a", "b", "c", "d", "e"])
    with pytest.raises(UserError):
        WordVocab(["<UNK>", "<PAD>", "<S>", "</S>", "a"])  # wrong order
    with pytest.raises(UserError):
        WordVocab(["<PAD>", "<UNK>", "<S>"])  # too short


def test_load_rejects_file_without_specials(tmp_path):
    path = tmp_path / "v.tsv"
    path.write_text("a\t4\nb\t2\nc\t1\nd\t1\ne\t1\n", encoding="utf-8")
    with pytest.raises(UserError):
        WordVocab.load(str(path))


def test_load_directory_is_user_error(tmp_path):
    with pytest.raises(UserError):
        WordVocab.load(str(tmp_path))


def test_load_invalid_utf8_is_user_error(tmp_path):
    path = tmp_path / "v.tsv"
    path.write_bytes(b"<PAD>\t0\n<UNK>\t0\n<S>\t0\n</S>\t0\ncaf\xe9\t1\n")
    with pytest.raises(UserError):
        WordVocab.load(str(path))

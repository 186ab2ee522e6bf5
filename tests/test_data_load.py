"""Tests for ``tf_transformer.data_load`` and ``tf_transformer.model_dir``."""

import collections
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer import model_dir
from tf_transformer.files import read_text_lines as read_lines
from tf_transformer.data_load import (
    TOY_CORPUS, encode_pairs, make_dataset, pad_batch, read_parallel,
)
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.vocab import WordVocab


def write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


# ---- read_lines --------------------------------------------------------------


def test_read_lines_invalid_utf8_names_line(tmp_path):
    path = write_bytes(tmp_path / "bad.txt", b"ok one\nok two\nbad \xff\xfe here\nok four\n")
    with pytest.raises(UserError) as info:
        read_lines(path)
    message = str(info.value)
    assert path in message
    assert f"{path}:3" in message


def test_read_lines_missing_file(tmp_path):
    path = str(tmp_path / "missing.txt")
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert path in str(info.value)


def test_read_lines_directory(tmp_path):
    with pytest.raises(UserError) as info:
        read_lines(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert "directory" in str(info.value)


def test_read_lines_strips_crlf(tmp_path):
    path = write_bytes(tmp_path / "crlf.txt", b"guten tag\r\nhallo welt\r\n")
    assert read_lines(path) == ["guten tag", "hallo welt"]


def test_read_lines_no_trailing_empty_line(tmp_path):
    with_newline = write_bytes(tmp_path / "a.txt", b"a\nb\n")
    without_newline = write_bytes(tmp_path / "b.txt", b"a\nb")
    assert read_lines(with_newline) == ["a", "b"]
    assert read_lines(without_newline) == ["a", "b"]


def test_read_lines_keeps_inner_blank_lines_and_utf8(tmp_path):
    path = write_bytes(tmp_path / "u.txt", "für\n\nmöchte\n".encode("utf-8"))
    assert read_lines(path) == ["für", "", "möchte"]


def test_read_lines_empty_file(tmp_path):
    assert read_lines(write_bytes(tmp_path / "e.txt", b"")) == []


# ---- read_parallel -----------------------------------------------------------


def test_read_parallel_different_line_counts(tmp_path):
    source = write_bytes(tmp_path / "s.de", b"a\nb\nc\n")
    target = write_bytes(tmp_path / "t.en", b"x\ny\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    message = str(info.value)
    assert source in message and target in message
    rest = message.replace(source, "").replace(target, "")
    assert re.search(r"\b3\b", rest) and re.search(r"\b2\b", rest)


def test_read_parallel_skips_and_counts_blank_pairs(tmp_path):
    source = write_bytes(tmp_path / "s.de", b"eins\n\ndrei\n  \nfunf\n")
    target = write_bytes(tmp_path / "t.en", b"one\ntwo\n\nfour\n five \n")
    pairs, skipped = read_parallel(source, target)
    assert pairs == [("eins", "one"), ("funf", "five")]
    assert skipped == 3


def test_read_parallel_all_blank(tmp_path):
    source = write_bytes(tmp_path / "s.de", b"\n \n")
    target = write_bytes(tmp_path / "t.en", b"a\n\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    assert source in str(info.value)


def test_read_parallel_bad_utf8_in_target(tmp_path):
    source = write_bytes(tmp_path / "s.de", b"a\nb\n")
    target = write_bytes(tmp_path / "t.en", b"a\n\xc3\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    assert f"{target}:2" in str(info.value)


def test_toy_corpus():
    pairs, skipped = read_parallel(TOY_CORPUS + ".de", TOY_CORPUS + ".en")
    assert pairs == [
        ("ich mochte ein bier", "i want a beer"),
        ("ich mochte ein cola", "i want a coke"),
        ("ich mochte ein orangensaft", "i want a orange juice"),
    ]
    assert skipped == 0


# ---- encode_pairs / pad_batch ------------------------------------------------


def toy_vocabs():
    # Source: a=4 b=5 c=6; target: x=4 y=5 z=6 (equal counts keep first-appearance order).
    return WordVocab.build(["a b c"]), WordVocab.build(["x y z"])


def test_encode_pairs_appends_eos():
    source, target = toy_vocabs()
    examples, dropped = encode_pairs([("a b", "z"), ("c q", "y x")], source, target, maxlen=10)
    assert examples == [([4, 5, 3], [6, 3]), ([6, 1, 3], [5, 4, 3])]
    assert dropped == 0


def test_encode_pairs_maxlen_counts_eos():
    source, target = toy_vocabs()
    pairs = [
        ("a b c", "x"),  # source 3 words + </S> = 4
        ("a", "x y z"),  # target 3 words + </S> = 4
        ("a b", "x y"),  # 3 and 3
        ("a", "x"),  # 2 and 2
    ]
    examples, dropped = encode_pairs(pairs, source, target, maxlen=4)
    assert len(examples) == 4 and dropped == 0
    examples, dropped = encode_pairs(pairs, source, target, maxlen=3)
    assert examples == [([4, 5, 3], [4, 5, 3]), ([4, 3], [4, 3])]
    assert dropped == 2
    examples, dropped = encode_pairs(pairs, source, target, maxlen=1)
    assert examples == []
    assert dropped == 4


def test_pad_batch():
    batch = pad_batch([[5, 6, 3], [7, 3], [8, 9, 10, 11, 3]])
    assert batch.dtype == np.int32
    np.testing.assert_array_equal(
        batch, np.array([[5, 6, 3, 0, 0], [7, 3, 0, 0, 0], [8, 9, 10, 11, 3]], np.int32)
    )


# ---- make_dataset ------------------------------------------------------------


def unpad(row):
    row = list(int(v) for v in row)
    while row and row[-1] == 0:
        row.pop()
    return tuple(row)


def varied_examples():
    # Lengths differ per example and between source and target; no id is 0.
    return [
        ([4, 3], [5, 6, 3]),
        ([4, 5, 6, 7, 3], [8, 3]),
        ([9, 3], [4, 4, 4, 4, 4, 4, 3]),
        ([5, 5, 3], [6, 3]),
        ([7, 8, 9, 10, 11, 12, 3], [9, 9, 3]),
        ([6, 3], [7, 3]),
        ([10, 10, 10, 3], [11, 12, 13, 3]),
    ]


@pytest.mark.parametrize("batch_size,expected_sizes", [(3, [3, 3, 1]), (7, [7]), (2, [2, 2, 2, 1])])
def test_make_dataset_one_epoch(batch_size, expected_sizes):
    examples = varied_examples()
    dataset = make_dataset(examples, batch_size=batch_size, shuffle=True, seed=1)
    seen = []
    sizes = []
    for x, y in dataset:
        x, y = x.numpy(), y.numpy()
        assert x.dtype == np.int32 and y.dtype == np.int32
        assert x.shape[0] == y.shape[0]
        sizes.append(x.shape[0])
        xs = [unpad(row) for row in x]
        ys = [unpad(row) for row in y]
        # Each batch is padded to its own longest row, not the corpus' longest.
        assert x.shape[1] == max(len(r) for r in xs)
        assert y.shape[1] == max(len(r) for r in ys)
        seen += list(zip(xs, ys))
    assert sizes == expected_sizes
    expected = collections.Counter((tuple(x), tuple(y)) for x, y in examples)
    assert collections.Counter(seen) == expected


def test_make_dataset_without_shuffle_keeps_order():
    examples = varied_examples()
    seen = []
    for x, y in make_dataset(examples, batch_size=3, shuffle=False):
        seen += [(unpad(a), unpad(b)) for a, b in zip(x.numpy(), y.numpy())]
    assert seen == [(tuple(x), tuple(y)) for x, y in examples]


def test_make_dataset_pads_each_batch_separately():
    examples = [([4, 3], [4, 3]), ([5, 3], [5, 3]), ([4, 5, 6, 7, 8, 3], [4, 5, 6, 7, 8, 9, 10, 3])]
    batches = [(x.numpy(), y.numpy()) for x, y in make_dataset(examples, batch_size=2, shuffle=False)]
    assert [b[0].shape for b in batches] == [(2, 2), (1, 6)]
    assert [b[1].shape for b in batches] == [(2, 2), (1, 8)]


def test_make_dataset_equal_lengths():
    examples = [([4, 3], [5, 3]), ([6, 3], [7, 3])]
    (x, y), = [(x.numpy(), y.numpy()) for x, y in make_dataset(examples, batch_size=2, shuffle=False)]
    np.testing.assert_array_equal(x, [[4, 3], [6, 3]])
    np.testing.assert_array_equal(y, [[5, 3], [7, 3]])


def test_make_dataset_reshuffles_each_epoch():
    examples = [([i, 3], [i, 3]) for i in range(4, 24)]
    dataset = make_dataset(examples, batch_size=20, shuffle=True, seed=3)
    orders = [tuple(int(v) for v in x.numpy()[:, 0]) for _ in range(3) for x, _ in dataset]
    assert all(sorted(o) == list(range(4, 24)) for o in orders)
    assert len(set(orders)) > 1


# ---- model_dir ---------------------------------------------------------------


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
        model_dir.check_compatible(directory, saved.replace(num_blocks=7))
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
        model_dir.check_compatible(directory, saved.replace(num_units=64, d_ff=96))
    assert "num_units" in str(info.value) and "d_ff" in str(info.value)
    assert "num_blocks" not in str(info.value)


def test_check_compatible_damaged_saved_hparams_is_one_clear_error(tmp_path):
    saved = load_hparams("toy")
    directory = make_model_dir(tmp_path / "run", saved)
    with open(os.path.join(directory, "hparams.yaml"), "wb") as f:
        f.write(b"num_blocks: 2\n\xe9\n")
    with pytest.raises(UserError) as info:
        model_dir.check_compatible(directory, saved)
    assert os.path.join(directory, "hparams.yaml") + ":2" in str(info.value)


def test_check_compatible_same_hparams(tmp_path):
    hp = load_hparams("toy")
    directory = make_model_dir(tmp_path / "run", hp)
    assert model_dir.check_compatible(directory, hp) is None
    # Training-only keys may change between runs.
    assert model_dir.check_compatible(directory, hp.replace(learning_rate=1e-4, num_epochs=3)) is None


def test_check_compatible_without_checkpoint(tmp_path):
    directory = make_model_dir(tmp_path / "run", load_hparams("toy"), with_checkpoint=False)
    assert model_dir.check_compatible(directory, load_hparams("toy").replace(num_blocks=7)) is None
    empty = tmp_path / "empty"
    empty.mkdir()
    assert model_dir.check_compatible(str(empty), load_hparams("toy")) is None


def test_load_for_inference_empty_dir(tmp_path):
    with pytest.raises(UserError) as info:
        model_dir.load_for_inference(str(tmp_path))
    assert "hparams.yaml" in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_load_for_inference_without_vocabs(tmp_path):
    directory = make_model_dir(tmp_path / "run", load_hparams("toy"), with_checkpoint=False)
    with pytest.raises(UserError) as info:
        model_dir.load_for_inference(directory)
    assert "source.vocab.tsv" in str(info.value)

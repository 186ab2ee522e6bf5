"""Tests for ``tf_transformer.data.data_load``: tokenizing a corpus and batching it."""

import collections

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.data.data_load import (
    Examples, bucket_boundaries, encode_pairs, make_dataset, padding_stats, tokenize_with_eos,
)
from tf_transformer.data.tokenizer import WordTokenizer
from tf_transformer.data.vocab import EOS_ID, WordVocab
from tf_transformer.hparams import load_hparams


def unpad(row):
    row = [int(v) for v in row]
    while row and row[-1] == 0:
        row.pop()
    return tuple(row)


def examples_from(pairs):
    """Examples from (source ids, target ids) lists, as encode_pairs would give."""
    return Examples(tf.ragged.constant([x for x, _ in pairs], dtype=tf.int32, ragged_rank=1),
                    tf.ragged.constant([y for _, y in pairs], dtype=tf.int32, ragged_rank=1))


def random_pairs(n, maxlen, seed=0):
    """Pairs whose target length follows the source length, as in real text; no id is 0."""
    rng = np.random.default_rng(seed)
    pairs = []
    for _ in range(n):
        lx = int(rng.integers(1, maxlen + 1))
        ly = int(np.clip(lx + rng.integers(-3, 4), 1, maxlen))
        pairs.append((list(rng.integers(4, 50, lx - 1)) + [EOS_ID], list(rng.integers(4, 50, ly - 1)) + [EOS_ID]))
    return pairs


def one_epoch(dataset):
    """[(x, y)] numpy batches of one pass."""
    return [(x.numpy(), y.numpy()) for x, y in dataset]


def seen_pairs(batches):
    return collections.Counter((unpad(a), unpad(b)) for x, y in batches for a, b in zip(x, y))


# ---- encode_pairs ------------------------------------------------------------


def toy_tokenizers():
    # Source: a=4 b=5 c=6; target: x=4 y=5 z=6 (equal counts keep first-appearance order).
    return WordTokenizer(WordVocab.build(["a b c"])), WordTokenizer(WordVocab.build(["x y z"]))


def test_tokenize_with_eos_ends_every_row_with_eos():
    source, _ = toy_tokenizers()
    assert tokenize_with_eos(source, ["a b", "c", "", "a zz"]).to_list() == [[4, 5, 3], [6, 3], [3], [4, 1, 3]]


def test_encode_pairs_appends_eos_to_both_sides():
    examples = encode_pairs([("a b c", "z y"), ("c", "x x x")], *toy_tokenizers(), maxlen=10)
    assert examples.sources.to_list() == [[4, 5, 6, 3], [6, 3]]
    assert examples.targets.to_list() == [[6, 5, 3], [4, 4, 4, 3]]
    assert examples.too_long == 0 and len(examples) == 2


def test_encode_pairs_maxlen_counts_eos_and_the_longer_side():
    pairs = [("a b", "x"),            # 3 / 2 tokens: kept at maxlen 3
             ("a b c", "x"),          # source 4: dropped
             ("a", "x y z"),          # target 4: dropped
             ("c c", "z z")]          # 3 / 3: kept
    examples = encode_pairs(pairs, *toy_tokenizers(), maxlen=3)
    assert examples.sources.to_list() == [[4, 5, 3], [6, 6, 3]]
    assert examples.targets.to_list() == [[4, 3], [6, 6, 3]]
    assert examples.too_long == 2


def test_encode_pairs_all_too_long():
    examples = encode_pairs([("a b c", "x y z")], *toy_tokenizers(), maxlen=2)
    assert len(examples) == 0 and examples.too_long == 1


# ---- bucketing by a token budget -----------------------------------------------


@pytest.mark.parametrize("maxlen", [1, 7, 8, 9, 24, 100, 256])
def test_bucket_boundaries_cover_every_length_once(maxlen):
    boundaries = bucket_boundaries(maxlen)
    assert boundaries == sorted(set(boundaries))
    assert boundaries[-1] == maxlen + 1
    assert all(b <= maxlen for b in boundaries[:-1])
    # Edges grow by about 10%, never by less than one token.
    for low, high in zip(boundaries[:-2], boundaries[1:-1]):
        assert high == max(low + 1, int(low * 1.1))


@pytest.mark.parametrize("batch_tokens,maxlen", [(64, 16), (200, 30), (1000, 50)])
def test_every_batch_respects_the_token_budget(batch_tokens, maxlen):
    hp = load_hparams("small", overrides=[f"batch_tokens={batch_tokens}", f"maxlen={maxlen}"])
    batches = one_epoch(make_dataset(examples_from(random_pairs(600, maxlen)), hp, seed=1))
    for x, y in batches:
        assert x.dtype == np.int32 and y.dtype == np.int32 and x.shape[0] == y.shape[0]
        assert x.shape[0] * x.shape[1] <= batch_tokens
        assert y.shape[0] * y.shape[1] <= batch_tokens
        # Padded to the batch's own longest row on each side.
        assert x.shape[1] == max(len(unpad(r)) for r in x)
        assert y.shape[1] == max(len(unpad(r)) for r in y)


def test_no_example_is_lost_or_duplicated_within_an_epoch():
    pairs = random_pairs(500, 40, seed=2)
    hp = load_hparams("small", overrides=["batch_tokens=160", "maxlen=40"])
    dataset = make_dataset(examples_from(pairs), hp, seed=3)
    expected = collections.Counter((tuple(x), tuple(y)) for x, y in pairs)
    orders = []
    for _ in range(3):  # every epoch, reshuffled
        batches = one_epoch(dataset)
        assert seen_pairs(batches) == expected
        orders.append(tuple(unpad(x[0]) for x, _ in batches))
    assert len(set(orders)) > 1


def test_lengths_filtered_as_configured_never_reach_a_batch():
    tokenizers = toy_tokenizers()
    pairs = [(" ".join("abc"[i % 3] for i in range(n)), " ".join("xyz"[i % 3] for i in range(m)))
             for n, m in [(1, 1), (5, 2), (9, 9), (12, 3), (3, 15), (6, 6)]]
    hp = load_hparams("small", overrides=["batch_tokens=40", "maxlen=10"])
    examples = encode_pairs(pairs, *tokenizers, hp.maxlen)
    assert examples.too_long == 2  # 12 + </S> and 15 + </S> tokens
    batches = one_epoch(make_dataset(examples, hp, seed=0))
    assert sum(x.shape[0] for x, _ in batches) == 4
    assert max(max(x.shape[1], y.shape[1]) for x, y in batches) == 10


def test_buckets_pad_less_than_maxlen_and_less_than_random_batches():
    examples = examples_from(random_pairs(2000, 60, seed=4))
    bucketed = load_hparams("small", overrides=["batch_tokens=600", "maxlen=60"])
    stats = padding_stats(make_dataset(examples, bucketed, seed=5), maxlen=60)
    assert stats["pairs"] == 2000
    assert stats["padding"] < stats["padding_at_maxlen"]
    random_batches = padding_stats(make_dataset(examples, bucketed.replace(batch_tokens=0, batch_size=20), seed=5))
    assert stats["padding"] < random_batches["padding"] / 2


def test_pad_to_maxlen_gives_one_shape_and_keeps_the_budget():
    hp = load_hparams("small", overrides=["batch_tokens=100", "maxlen=20", "pad_to_maxlen=true"])
    batches = one_epoch(make_dataset(examples_from(random_pairs(300, 20)), hp, seed=6))
    assert {x.shape[1] for x, _ in batches} == {20} == {y.shape[1] for _, y in batches}
    assert max(x.shape[0] for x, _ in batches) == 5  # 100 tokens / 20


# ---- batches of batch_size pairs (the blog) -------------------------------------


@pytest.mark.parametrize("batch_size,expected_sizes", [(3, [3, 3, 1]), (7, [7]), (2, [2, 2, 2, 1])])
def test_sentence_batches_have_batch_size_pairs(batch_size, expected_sizes):
    pairs = random_pairs(7, 9, seed=7)
    hp = load_hparams("toy", overrides=[f"batch_size={batch_size}"])
    batches = one_epoch(make_dataset(examples_from(pairs), hp, seed=1))
    assert [x.shape[0] for x, _ in batches] == expected_sizes
    assert seen_pairs(batches) == collections.Counter((tuple(x), tuple(y)) for x, y in pairs)


def test_sentence_batches_without_shuffle_keep_corpus_order():
    pairs = random_pairs(7, 9, seed=8)
    hp = load_hparams("toy", overrides=["batch_size=3"])
    seen = [(unpad(a), unpad(b)) for x, y in one_epoch(make_dataset(examples_from(pairs), hp, shuffle=False))
            for a, b in zip(x, y)]
    assert seen == [(tuple(x), tuple(y)) for x, y in pairs]


def test_blog_batches_are_padded_to_maxlen():
    hp = load_hparams("blog")  # batch_size 32, maxlen 10, pad_to_maxlen
    batches = one_epoch(make_dataset(examples_from(random_pairs(40, 10, seed=9)), hp, seed=1))
    assert [x.shape for x, _ in batches] == [(32, 10), (8, 10)]
    assert [y.shape for _, y in batches] == [(32, 10), (8, 10)]


# ---- padding_stats ---------------------------------------------------------------


def test_padding_stats_counts_pad_positions_on_both_sides():
    x = np.array([[4, 3, 0], [5, 6, 3]], np.int32)   # 5 tokens of 6
    y = np.array([[7, 3], [3, 0]], np.int32)          # 3 tokens of 4
    dataset = tf.data.Dataset.from_tensors((x, y))
    stats = padding_stats(dataset, maxlen=5)
    assert stats == {"batches": 1, "pairs": 2, "tokens": 8, "padding": pytest.approx(2 / 10),
                     "padding_at_maxlen": pytest.approx(1 - 8 / 20)}

"""``translate.source_batch`` and ``source_ids``: the input rules (cut to ``maxlen - 1`` tokens, then ``</S>``,
``<PAD>`` after; invalid UTF-8 replaced) against a restatement in Python lists."""

import pytest
import tensorflow as tf

from tf_transformer.data.tokenizer import WordTokenizer
from tf_transformer.data.vocab import EOS_ID, PAD_ID, WordVocab
from tf_transformer.infer.translate import source_batch, source_ids

# Word ids: a=4 b=5 c=6 (by count, then order).
TOKENIZER = WordTokenizer(WordVocab.build(["a a a b b c"]))
IDS = {"a": 4, "b": 5, "c": 6}
SENTENCES = ["a b c a b", "c", "", "   ", "b \xff a", "a a a a a a a a"]


def expected_rows(sentences, maxlen):
    """Each sentence's word ids (1 for a word out of the vocabulary), cut, then ``</S>``."""
    rows = []
    for sentence in sentences:
        words = [IDS.get(w, 1) for w in sentence.split()]
        rows.append((words if maxlen is None else words[: maxlen - 1]) + [EOS_ID])
    return rows


@pytest.mark.parametrize("maxlen", [None, 3, 4, 100])
def test_padded_batch_and_ragged_ids_follow_the_input_rules(maxlen):
    inputs = tf.constant([s.encode("latin-1") if "\xff" in s else s.encode() for s in SENTENCES])
    rows = expected_rows([s.replace("\xff", "\ufffd") for s in SENTENCES], maxlen)
    batch = source_batch(TOKENIZER, inputs, maxlen)
    width = max(len(r) for r in rows)
    assert batch.ids.dtype == tf.int32 and batch.lengths.dtype == tf.int32
    assert batch.ids.numpy().tolist() == [r + [PAD_ID] * (width - len(r)) for r in rows]
    assert batch.lengths.numpy().tolist() == [len(r) for r in rows]
    assert source_ids(TOKENIZER, inputs, maxlen).to_list() == rows


def test_in_a_graph_of_unknown_batch_size_and_of_no_sentence():
    traced = tf.function(lambda s: source_batch(TOKENIZER, s, 3), input_signature=[tf.TensorSpec([None], tf.string)])
    assert traced(tf.constant(["a b c", "b"])).ids.numpy().tolist() == [[4, 5, EOS_ID], [5, EOS_ID, PAD_ID]]
    empty = traced(tf.constant([], tf.string))
    assert empty.ids.shape == (0, 1) and empty.lengths.shape == (0,)

"""Tests for ``tf_transformer.data.tokenizer``: word and SentencePiece tokenizers in the graph."""

import random
import re
import types

import keras
import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from tf_transformer.data.tokenizer import SubwordTokenizer, WordTokenizer, train_tokenizers, trim_output
from tf_transformer.data.vocab import WordVocab
from tf_transformer.errors import UserError

# Word counts: a=4, b=2, c=1, d=1, e=1; ids a=4 b=5 c=6 d=7 e=8.
LINES = ["a b c a", "b a d", "a e"]


def ragged(rows):
    return tf.ragged.constant(rows, dtype=tf.int32, ragged_rank=1)


def strings(tensor):
    return [s.decode("utf-8") for s in tensor.numpy()]


# ---- trim_output ------------------------------------------------------------------


def test_trim_output_dense():
    ids = tf.constant([[2, 4, 0, 5, 3, 6, 7],
                       [4, 5, 6, 7, 8, 0, 0],
                       [3, 4, 5, 0, 0, 0, 0],
                       [0, 0, 0, 0, 0, 0, 0]], tf.int32)
    result = trim_output(ids)
    assert isinstance(result, tf.RaggedTensor)
    assert result.dtype == tf.int32
    assert result.to_list() == [[4, 5], [4, 5, 6, 7, 8], [], []]


def test_trim_output_ragged():
    result = trim_output(ragged([[2, 9, 3, 3, 9], [9, 1, 10], [], [3]]))
    assert result.to_list() == [[9], [9, 1, 10], [], []]


def test_trim_output_numpy_and_lists():
    assert trim_output(np.array([[2, 4, 5, 3, 6]], np.int32)).to_list() == [[4, 5]]
    assert trim_output([[4, 1, 3]]).to_list() == [[4, 1]]


def test_trim_output_keeps_unk_and_later_pad_free_tokens():
    # <UNK> (1) is a token to print; only <PAD> (0), <S> (2) and what follows </S> (3) go.
    assert trim_output(ragged([[1, 0, 1, 2, 1, 3, 1]])).to_list() == [[1, 1, 1]]


# ---- WordTokenizer ------------------------------------------------------------------


@pytest.fixture(scope="module")
def word_tokenizer():
    return WordTokenizer(WordVocab.build(LINES))


def test_word_tokenize(word_tokenizer):
    ids = word_tokenizer.tokenize(tf.constant(["a b c d e", "e a", ""]))
    assert isinstance(ids, tf.RaggedTensor)
    assert ids.dtype == tf.int32
    assert ids.to_list() == [[4, 5, 6, 7, 8], [8, 4], []]


def test_word_unknown_is_one(word_tokenizer):
    assert word_tokenizer.to_ids(["a zzz e", "A"]) == [[4, 1, 8], [1]]


def test_word_runs_of_whitespace(word_tokenizer):
    assert word_tokenizer.to_ids(["  b   c ", "a\tb\nc", "   "]) == [[5, 6], [4, 5, 6], []]


def test_word_docstring_example():
    tokenizer = WordTokenizer(WordVocab.build(["ich mochte ein bier"]))
    assert tokenizer.to_ids(["ich bier cola"]) == [[4, 7, 1]]
    assert strings(tokenizer.detokenize(ragged([[4, 7, 3, 0]]))) == ["ich bier"]


def test_word_min_count_rare_word_is_unknown():
    tokenizer = WordTokenizer(WordVocab.build(LINES, min_count=2))
    assert tokenizer.to_ids(["a b c"]) == [[4, 5, 1]]


def test_word_detokenize_cuts_at_eos_drops_pad_and_bos(word_tokenizer):
    ids = ragged([[2, 4, 0, 5, 3, 6, 7], [4, 1, 8], [3, 4], []])
    assert strings(word_tokenizer.detokenize(ids)) == ["a b", "a <UNK> e", "", ""]


def test_word_detokenize_dense(word_tokenizer):
    ids = tf.constant([[4, 5, 3, 0], [8, 0, 0, 0]], tf.int32)
    assert strings(word_tokenizer.detokenize(ids)) == ["a b", "e"]


def test_word_decode_accepts_numpy_and_lists(word_tokenizer):
    assert word_tokenizer.to_texts(np.array([[4, 5, 3, 0]], np.int32)) == ["a b"]
    assert word_tokenizer.to_texts([[2, 6, 7], [5]]) == ["c d", "b"]
    assert word_tokenizer.to_texts([]) == []
    assert word_tokenizer.to_ids([]) == []


def test_word_round_trip_non_ascii():
    lines = ["Die Straße ist groß .", "Äpfel und Öl , 42 !"]
    tokenizer = WordTokenizer(WordVocab.build(lines))
    assert tokenizer.to_texts(tokenizer.to_ids(lines)) == lines


def test_word_in_graph(word_tokenizer):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(sentences):
        assert not tf.executing_eagerly()
        ids = word_tokenizer.tokenize(sentences)
        return ids.to_tensor(), word_tokenizer.detokenize(ids.to_tensor())

    ids, text = round_trip(tf.constant(["a   b zzz", "e"]))
    assert ids.numpy().tolist() == [[4, 5, 1], [8, 0, 0]]
    assert strings(text) == ["a b <UNK>", "e"]


def test_word_vocab_size_and_id_to_token(word_tokenizer):
    assert word_tokenizer.vocab_size == 9
    assert [word_tokenizer.id_to_token(i) for i in range(9)] == [
        "<PAD>", "<UNK>", "<S>", "</S>", "a", "b", "c", "d", "e"]
    assert word_tokenizer.kind == "word"


def test_word_fingerprint():
    one = WordTokenizer(WordVocab.build(LINES))
    same = WordTokenizer(WordVocab.build(list(LINES)))
    other = WordTokenizer(WordVocab.build(LINES + ["f"]))
    reordered = WordTokenizer(WordVocab.build(["b b b a"] + LINES))  # same words, other ids
    assert re.fullmatch(r"[0-9a-f]{64}", one.fingerprint())
    assert one.fingerprint() == same.fingerprint()
    assert one.fingerprint() != other.fingerprint()
    assert one.fingerprint() != reordered.fingerprint()


def test_word_fingerprint_survives_save_and_load(tmp_path):
    tokenizer = WordTokenizer(WordVocab.build(LINES))
    path = str(tmp_path / "v.tsv")
    tokenizer.vocab.save(path)
    loaded = WordTokenizer(WordVocab.load(path))
    assert loaded.fingerprint() == tokenizer.fingerprint()
    assert loaded.to_ids(["e d c b a q"]) == tokenizer.to_ids(["e d c b a q"]) == [[8, 7, 6, 5, 4, 1]]


# ---- SubwordTokenizer ------------------------------------------------------------

GERMAN = ("Die Der Das Straße Mädchen Bäcker Brötchen Müller Öl Äpfel Übungen groß weiß heißt "
          "Fuß schön müde über grün läuft kauft kostet Euro Meter breit lang oder und ist sind "
          "er backt Katze Hund Haus Häuser Grüße Tschüß Zürich Köln").split()
ENGLISH = ("The the baker's street girl boy apples pears oil and cost costs dollars meters long "
           "wide isn't it is are big white called foot nice tired over green runs buys cat dog "
           "house houses greetings from").split()
PUNCTUATION = [".", "!", "?", ",", ";", ":"]

SENTENCES = [
    "Die Straße ist 12 Meter breit, oder?",
    "Äpfel, Öl und Übungen kosten 3,50 Euro!",
    "Der Bäcker heißt Müller: er backt 100 Brötchen.",
    "Grüße aus Zürich (und Köln); Tschüß!",
    "The baker's street is 42 meters long; isn't it?",
    "Apples (and pears) cost 7 dollars!",
    "ÄÖÜ äöü ß 0123456789",
]


def training_lines(count=400, seed=0):
    """Varied German and English lines; every character of SENTENCES occurs in them."""
    rng = random.Random(seed)
    lines = []
    for i in range(count):
        words = GERMAN if i % 2 == 0 else ENGLISH
        line = " ".join(rng.choice(words) for _ in range(rng.randint(3, 10)))
        line += rng.choice(PUNCTUATION)
        if rng.random() < 0.5:
            line += f" {rng.randint(0, 9999)} " + rng.choice(["(ja)", "(yes)", "- ok", "3,50", "ÄÖÜ"])
        lines.append(line[0].upper() + line[1:])
    return lines + ["Kosten", "Apples", "Aus"]


@pytest.fixture(scope="module")
def lines():
    return training_lines()


@pytest.fixture(scope="module")
def subword(lines):
    return SubwordTokenizer.train(lines, vocab_size=300)


@pytest.fixture(scope="module")
def processor(subword):
    return sentencepiece.SentencePieceProcessor(model_proto=subword.model_proto)


def test_training_text_covers_test_sentences(lines):
    text = "".join(lines)
    assert set("".join(SENTENCES)) <= set(text)
    assert set("äöüÄÖÜß0123456789.,!?;:()'-") <= set(text)


def test_subword_vocab_size(subword, processor):
    assert subword.vocab_size == 300 == processor.get_piece_size()
    assert subword.kind == "sentencepiece"


def test_subword_special_ids(subword, processor):
    assert [subword.id_to_token(i) for i in range(4)] == ["<PAD>", "<UNK>", "<S>", "</S>"]
    assert [processor.id_to_piece(i) for i in range(4)] == ["<PAD>", "<UNK>", "<S>", "</S>"]
    assert (processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()) == (0, 1, 2, 3)


def test_subword_round_trip(subword):
    ids = subword.tokenize(tf.constant(SENTENCES))
    assert strings(subword.detokenize(ids)) == SENTENCES
    assert subword.to_texts(subword.to_ids(SENTENCES)) == SENTENCES


def test_subword_splits_words_into_pieces(subword):
    # A 300-piece model cannot hold every word whole: some sentence needs more pieces than words.
    encoded = subword.to_ids(SENTENCES)
    assert any(len(ids) > len(s.split()) for ids, s in zip(encoded, SENTENCES))


def test_subword_ids_match_sentencepiece(subword, processor):
    ids = subword.tokenize(tf.constant(SENTENCES))
    assert ids.dtype == tf.int32
    expected = processor.encode(SENTENCES)
    assert ids.to_list() == expected
    assert all(i >= 4 for row in expected for i in row)  # no <S>/</S> added, nothing unknown
    assert [processor.decode(row) for row in expected] == SENTENCES


def test_subword_unseen_character_is_unknown(subword, processor):
    ids = subword.to_ids(["Die 日 Straße"])[0]
    assert ids == processor.encode("Die 日 Straße")
    assert 1 in ids


def test_subword_detokenize_decoder_output(subword, processor):
    # What the decoder emits: <S>, the pieces, </S>, then anything, padded with <PAD>.
    rows = [processor.encode(s) for s in SENTENCES[:3]]
    width = max(map(len, rows)) + 4
    dense = np.zeros((len(rows), width), np.int32)
    for r, row in enumerate(rows):
        out = [2] + row + [3] + [5, 6]
        dense[r, :len(out)] = out[:width]
    assert strings(subword.detokenize(tf.constant(dense))) == SENTENCES[:3]
    assert subword.to_texts(dense) == SENTENCES[:3]


def test_subword_in_graph(subword, processor):
    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def round_trip(sentences):
        assert not tf.executing_eagerly()
        ids = subword.tokenize(sentences)
        padded = ids.to_tensor()  # <PAD> on the right, dropped again by detokenize
        return padded, subword.detokenize(padded)

    padded, text = round_trip(tf.constant(SENTENCES))
    assert strings(text) == SENTENCES
    expected = processor.encode(SENTENCES)
    assert [row[:len(e)].tolist() for row, e in zip(padded.numpy(), expected)] == expected
    assert all(not row[len(e):].any() for row, e in zip(padded.numpy(), expected))


def vocab_size_error(lines, requested):
    """The one-line message training with ``requested`` gives."""
    with pytest.raises(UserError) as info:
        SubwordTokenizer.train(lines, vocab_size=requested)
    message = str(info.value)
    assert "vocab_size" in message and "\n" not in message
    return message


def test_subword_vocab_size_too_large(lines):
    requested = 100_000
    message = vocab_size_error(lines, requested)
    suggested = {int(n) for n in re.findall(r"\d+", message)} - {requested}
    assert len(suggested) == 1, message
    largest = suggested.pop()
    assert 300 < largest < requested
    assert SubwordTokenizer.train(lines, vocab_size=largest).vocab_size == largest
    with pytest.raises(UserError):
        SubwordTokenizer.train(lines, vocab_size=largest + 1)


def test_subword_vocab_size_too_small(lines):
    message = vocab_size_error(lines, 20)
    assert "character_coverage" not in message  # the trainer's advice names an option users cannot set
    # The smallest size: every character (the space becomes "▁") plus the 4 special tokens.
    smallest = len(set("".join(lines))) + 4
    assert str(smallest) in message
    assert SubwordTokenizer.train(lines, vocab_size=smallest).vocab_size == smallest
    with pytest.raises(UserError):
        SubwordTokenizer.train(lines, vocab_size=smallest - 1)


def test_subword_fingerprint(lines, subword):
    again = SubwordTokenizer.train(lines, vocab_size=300)
    assert re.fullmatch(r"[0-9a-f]{64}", subword.fingerprint())
    assert again.model_proto == subword.model_proto  # training is reproducible
    assert again.fingerprint() == subword.fingerprint()
    assert SubwordTokenizer(subword.model_proto).fingerprint() == subword.fingerprint()
    smaller = SubwordTokenizer.train(lines, vocab_size=200)
    other_text = SubwordTokenizer.train(lines[:300], vocab_size=300)
    assert smaller.fingerprint() != subword.fingerprint()
    assert other_text.model_proto != subword.model_proto
    assert other_text.fingerprint() != subword.fingerprint()


# ---- train_tokenizers -----------------------------------------------------------------


def hparams(**overrides):
    values = dict(tokenizer="sentencepiece", vocab_size=300, min_count=1, seed=42)
    values.update(overrides)
    return types.SimpleNamespace(**values)


def pairs_from(lines):
    german = [line for i, line in enumerate(lines[:400]) if i % 2 == 0]
    english = [line for i, line in enumerate(lines[:400]) if i % 2 == 1]
    return list(zip(german, english))


def test_train_tokenizers_sentencepiece_is_joint(lines):
    pairs = pairs_from(lines)
    source, target = train_tokenizers(hparams(), pairs)
    assert source is target
    assert isinstance(source, SubwordTokenizer)
    assert source.vocab_size == 300
    processor = sentencepiece.SentencePieceProcessor(model_proto=source.model_proto)
    # Trained on both sides: German and English round-trip with nothing unknown.
    german, english = "Der Bäcker heißt Müller.", "The baker's street is long."
    for sentence in (german, english):
        assert source.to_ids([sentence])[0] == processor.encode(sentence)
        assert 1 not in processor.encode(sentence)
        assert source.to_texts(source.to_ids([sentence])) == [sentence]


def test_train_tokenizers_word_one_vocabulary_per_side():
    pairs = [("ich mochte ein bier", "i want a beer"), ("ich mochte ein cola", "i want a coke"),
             ("ein bier", "a beer")]
    source, target = train_tokenizers(hparams(tokenizer="word", vocab_size=100), pairs)
    assert isinstance(source, WordTokenizer) and isinstance(target, WordTokenizer)
    assert source is not target
    # Most frequent first, ties in order of first appearance: ein=3, ich=mochte=bier=2, cola=1.
    assert source.vocab.words == ["<PAD>", "<UNK>", "<S>", "</S>", "ein", "ich", "mochte", "bier", "cola"]
    assert target.vocab.words == ["<PAD>", "<UNK>", "<S>", "</S>", "a", "i", "want", "beer", "coke"]
    assert source.to_ids(["ein beer"]) == [[4, 1]]
    assert target.to_ids(["a beer bier"]) == [[4, 7, 1]]


def test_train_tokenizers_word_vocab_size_and_min_count():
    pairs = [("x x x y y z", "p p q"), ("x y", "p r")]
    source, target = train_tokenizers(hparams(tokenizer="word", vocab_size=6), pairs)
    assert source.vocab.words[4:] == ["x", "y"]
    assert target.vocab.words[4:] == ["p", "q"]
    source, target = train_tokenizers(hparams(tokenizer="word", vocab_size=100, min_count=2), pairs)
    assert source.vocab.words[4:] == ["x", "y"]
    assert target.vocab.words[4:] == ["p"]


def test_tokenizers_survive_keras_set_random_seed(subword, word_tokenizer):
    """tf.random.set_seed clears TensorFlow's kernel cache; tokenizers made before it keep working."""
    before = subword.tokenize(tf.constant(["Größe 12"])).to_list(), word_tokenizer.tokenize(tf.constant(["a"])).to_list()
    keras.utils.set_random_seed(7)
    after = subword.tokenize(tf.constant(["Größe 12"])).to_list(), word_tokenizer.tokenize(tf.constant(["a"])).to_list()
    assert after == before
    assert subword.to_texts(after[0]) == ["Größe 12"]

"""Word alignments from the encoder-decoder attention: merging subwords to words, a model that must align
the toy corpus's words aligns them as they are known, and translate.py --alignments with one-line errors."""

import random

import keras
import numpy as np
import tensorflow as tf

from test_translate_cli import assert_one_line_error, run, same_model  # noqa: F401 (a fixture)
from tests.toy_model import TOY
from tf_transformer.data.data_load import tokenize_with_eos
from tf_transformer.data.tokenizer import WordTokenizer
from tf_transformer.data.vocab import WordVocab
from tf_transformer.hparams import load_hparams
from tf_transformer.infer import align
from tf_transformer.infer.translate import source_ids, translate_nbest
from tf_transformer.model_dir.checkpoint_files import build_model
from tf_transformer.nn.model import shift_right

# The toy corpus's words and their translations ("orangensaft" is two words in English).
WORDS = {"ich": "i", "mochte": "want", "ein": "a", "bier": "beer", "cola": "coke", "orangensaft": "orange juice"}


def test_subwords_merge_to_words_and_end_of_sentence_is_left_out(toy_loaded):
    """Source pieces ▁ich ▁moch te ▁bier </S>, outputs ▁i ▁want ▁be er </S> <PAD> and ▁i <S> ▁want."""
    pieces = ["<PAD>", "<UNK>", "<S>", "</S>", "▁ich", "▁moch", "te", "▁bier", "▁i", "▁want", "▁be", "er"]
    starts = np.array([p.startswith("▁") for p in pieces])
    sources = np.array([[4, 5, 6, 7, 3, 0]] * 2)
    output = np.array([[8, 9, 10, 11, 3, 0], [8, 2, 9, 3, 0, 0]])
    np.testing.assert_array_equal(align.word_indices(sources[0, :4], starts), [0, 1, 1, 2])
    best = np.array([[0, 2, 3, 1, 4, 0], [0, 0, 1, 0, 0, 0]])  # "er" -> "▁moch"; </S> and <PAD> left out
    assert align.word_links(best, sources, output, (starts, starts)) == [[(0, 0), (1, 1), (1, 2), (2, 2)],
                                                                          [(0, 0), (1, 1)]]
    assert align.pharaoh([(0, 0), (1, 1), (1, 2), (2, 2)]) == "0-0 1-1 1-2 2-2"
    # best_sources: the argmax of the head average over the source tokens but </S> and <PAD>.
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    x = source_ids(source_tokenizer, tf.constant(["ich mochte ein bier", "ich"]), hp.maxlen).to_tensor()
    y = source_ids(target_tokenizer, tf.constant(["i want a beer", "i"]), None).to_tensor()
    weights = tf.reduce_mean(model.block_attention(x, shift_right(y), -1), axis=1).numpy()
    real = (x.numpy() != 0) & (x.numpy() != 3)
    np.testing.assert_array_equal(align.best_sources(model, x, y, -1),
                                  np.argmax(np.where(real[:, None], weights, -1), axis=-1))
    assert (align.best_sources(model, x, y, -1)[1] == 0).all()  # "ich" is the only source token


def test_block_attention_is_one_block_of_all_of_them(toy_loaded):
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    x = source_ids(source_tokenizer, tf.constant(list(TOY)), hp.maxlen).to_tensor()
    y = source_ids(target_tokenizer, tf.constant(list(TOY.values())), None).to_tensor()
    every = model.attention_weights(x, shift_right(y))
    for block in (0, 1, -1):
        np.testing.assert_allclose(model.block_attention(x, shift_right(y), block), every[block], atol=1e-6)


def aligning_model(steps=700):
    """A one-block word model trained on the toy words recombined at random: to translate a word it must
    attend to it, so its attention is the alignment. (The toy model itself needs attention only for the
    noun: its other target words follow from their positions.) At 300 steps the second subword of a word was
    still aligned to its neighbour in some runs' rounding (one of 4 sentences); from 400 on, none. At 500 steps,
    with the compiled loss's log-sum-exp form (the same loss, rounded differently), one sentence's repeated
    word was still translated as another ("bier bier ein" -> "beer a a"); at 600 and 700, none."""
    keras.utils.set_random_seed(0)
    rng = random.Random(0)
    sources = [" ".join(rng.choice(list(WORDS)) for _ in range(rng.randint(2, 6))) for _ in range(512)]
    targets = [" ".join(WORDS[word] for word in source.split()) for source in sources]
    hp = load_hparams("toy", overrides=["num_blocks=1", "num_heads=2"])
    tokenizers = WordTokenizer(WordVocab.build(sources)), WordTokenizer(WordVocab.build(targets))
    model = build_model(hp, *tokenizers)
    x, y = tokenize_with_eos(tokenizers[0], sources).to_tensor(), tokenize_with_eos(tokenizers[1], targets).to_tensor()
    optimizer = keras.optimizers.Adam(3e-3)

    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(model.target_token_losses(x, y, label_smoothing=0.0, training=True)[0])
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    for step in range(steps):
        start = step * 32 % len(sources)
        train_step(x[start:start + 32], y[start:start + 32])
    return tokenizers, model


def test_a_model_that_must_align_aligns_the_toy_words_as_known():
    tokenizers, model = aligning_model()
    sentences = ["orangensaft ich bier", "ein cola mochte orangensaft ich", "bier bier ein", "mochte orangensaft"]
    expected = [("orange juice i beer", "0-0 0-1 1-2 2-3"), ("a coke want orange juice i", "0-0 1-1 2-2 3-3 3-4 4-5"),
                ("beer beer a", "0-0 1-1 2-2"), ("want orange juice", "0-0 1-1 1-2")]
    results = translate_nbest(sentences, *tokenizers, model, alignment_block=-1)
    assert [(r[0].text, r[0].alignment) for r in results] == expected


def test_alignments_cli_and_its_errors(toy_loaded, toy_dir, capsys, same_model):
    sentences = [*TOY, ""]
    code, plain, _ = run(capsys, "--model-dir", toy_dir, *sentences)
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--alignments", *sentences)
    assert code == 0 and [line.split("\t")[0] for line in lines] == plain
    for source, line in zip(TOY, lines):
        text, links = line.split("\t")
        pairs = [tuple(int(i) for i in link.split("-")) for link in links.split()]
        assert {j for _, j in pairs} == set(range(len(text.split())))  # every target word aligned
        assert all(0 <= i < len(source.split()) for i, _ in pairs)
        assert (3, 3) in pairs  # the noun: the one word the toy model must read its source for
    assert lines[-1] == "\t"  # no words, no links
    # Block -2 of the two is block 0; with --nbest a fourth column.
    assert run(capsys, "--model-dir", toy_dir, "--alignments", "--alignment-block", "-2", *TOY)[1] == \
        run(capsys, "--model-dir", toy_dir, "--alignments", "--alignment-block", "0", *TOY)[1]
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--alignments", "--nbest", "2", *TOY)
    assert code == 0 and all(len(line.split("\t")) == 4 for line in lines) and len(lines) == 2 * len(TOY)

    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--alignments", "--alignment-block", "2", "ich"),
                          "--alignment-block 2: the model has 2 decoder blocks; give 0 to 1, or -2 to -1")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--alignment-block", "0", "ich"),
                          "--alignment-block 0: only with --alignments")
    assert_one_line_error(run(capsys, "--rest", "http://localhost:1", "--alignments", "ich"),
                          "--alignments need(s) a local --model-dir")

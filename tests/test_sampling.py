"""Sampling instead of search: top-1 is greedy decoding, a seed draws the same translations in any batch,
the draws follow the model's top-k distribution, and translate.py --sampling-* with one-line errors."""

import numpy as np
import pytest
import tensorflow as tf

from test_translate_cli import assert_one_line_error, run, same_model  # noqa: F401 (a fixture)
from tests.toy_model import TOY
from tf_transformer.infer import decode
from tf_transformer.infer.translate import source_ids, translate_nbest

# The corpus, and sentences it never had, whose translations the model is unsure of.
SENTENCES = [*TOY, "ich mochte", "bier cola ein mochte ich", "ein ein ein"]


def test_top_1_sampling_is_greedy_decoding(toy_loaded):
    hp, source_tokenizer, _, model = toy_loaded
    x = source_ids(source_tokenizer, tf.constant(SENTENCES), hp.maxlen).to_tensor()
    greedy_ids, greedy_scores = decode.generate(model, x, beam_size=1)
    for sampling in (decode.Sampling(1), decode.Sampling(1, temperature=3.0, seed=99)):
        ids, scores = decode.sample(model, x, sampling)
        np.testing.assert_array_equal(ids.numpy(), greedy_ids.numpy())
        # The same log-probabilities by two float32 formulas (greedy's log of a softmax, sampling's log-softmax),
        # summed over the steps: equal to rounding.
        np.testing.assert_allclose(scores.numpy(), greedy_scores.numpy(), rtol=1e-5)
    with pytest.raises(ValueError, match="topk=0"):
        decode.sample(model, x, decode.Sampling(0))
    with pytest.raises(ValueError, match="temperature=0.0"):
        decode.sample(model, x, decode.Sampling(2, 0.0))


def test_a_seed_draws_the_same_translations_in_any_batch_and_another_seed_other_ones(toy_loaded):
    _, source_tokenizer, target_tokenizer, model = toy_loaded

    def draw(seed, batch_size=8):
        results = translate_nbest(SENTENCES, source_tokenizer, target_tokenizer, model, batch_size=batch_size,
                                  sampling=decode.Sampling(10, temperature=2.0, seed=seed))
        return [hypotheses[0].text for hypotheses in results]

    first = draw(7)
    assert draw(7) == first
    assert draw(7, batch_size=1) == first  # a sentence's draw depends on its index, not on its batch
    assert any(draw(seed) != first for seed in (8, 9))
    with pytest.raises(ValueError, match="nbest=1"):
        translate_nbest(SENTENCES, source_tokenizer, target_tokenizer, model, nbest=2, beam_size=2,
                        sampling=decode.Sampling(2))


def test_draws_follow_the_top_k_probabilities_at_the_temperature():
    """The Gumbel-max draw of one logits row, over many sentence keys: the k best tokens in proportion
    to softmax(logits / T) among them, the others never."""
    logits = tf.constant([[0.0, 2.0, 1.0, -1.0, 0.5, 3.0]])
    keys, topk, temperature = 20000, 3, 2.0
    choose = decode._sampler(tf.range(keys), tf.constant(topk), tf.constant(temperature),
                             tf.constant(5, tf.int64))
    draws = choose(tf.repeat(logits, keys, axis=0), tf.constant(4), tf.range(keys)).numpy()
    counts = np.bincount(draws, minlength=6) / keys
    top = np.array([5, 1, 2])
    expected = np.exp(logits.numpy()[0, top] / temperature)
    np.testing.assert_allclose(counts[top], expected / expected.sum(), atol=0.015)
    assert counts.sum() == pytest.approx(counts[top].sum())


def test_sampling_cli_and_its_errors(toy_dir, capsys, same_model):
    code, greedy, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "1", *SENTENCES)
    assert code == 0
    code, lines, err = run(capsys, "--model-dir", toy_dir, "--sampling-topk", "1", *SENTENCES)
    assert (code, lines) == (0, greedy)
    assert "sampling with --seed " in err  # a random seed, said so that the draws can be repeated
    code, first, _ = run(capsys, "--model-dir", toy_dir, "--sampling-topk", "40", "--seed", "3", *SENTENCES)
    assert code == 0 and run(capsys, "--model-dir", toy_dir, "--sampling-topk", "40", "--seed", "3",
                             *SENTENCES)[1] == first

    def error(*argv_and_fragment):
        *argv, fragment = argv_and_fragment
        assert_one_line_error(run(capsys, "--model-dir", toy_dir, *argv, "ich"), fragment)

    error("--sampling-topk", "0", "--sampling-topk 0: must be between 1 and")
    error("--sampling-topk", "2", "--sampling-temperature", "0", "--sampling-temperature 0.0: must be a positive")
    error("--sampling-topk", "2", "--sampling-temperature", "nan", "--sampling-temperature nan: must be a positive")
    error("--sampling-temperature", "2", "--sampling-temperature 2.0: only with --sampling-topk")
    error("--seed", "1", "--seed 1: only with --sampling-topk")
    error("--sampling-topk", "2", "--seed", "-1", "--seed -1: must be between 0 and 4294967295")
    error("--sampling-topk", "2", "--beam-size", "4", "--nbest", "2",
          "--sampling-topk draws one translation per sentence: drop --beam-size, --nbest")
    assert_one_line_error(run(capsys, "--server", "localhost:1", "--sampling-topk", "2", "ich"),
                          "--sampling-topk need(s) a local --model-dir")

"""Scoring given translations (forced decoding): equal to the unsmoothed training loss and to the decoders'
own scores, in input order whatever the batches, and translate.py --score with its one-line errors."""

import numpy as np
import pytest
import tensorflow as tf

from test_translate_cli import assert_one_line_error, run, same_model  # noqa: F401 (a fixture)
from tests.toy_model import TOY
from tf_transformer.data.vocab import BOS_ID, PAD_ID
from tf_transformer.infer import decode, score
from tf_transformer.infer.translate import source_ids

# Pairs the model knows, one it does not, an empty target and an empty source.
PAIRS = [*TOY.items(), ("ich mochte ein bier", "i want a coke"), ("ich mochte ein cola", ""), ("", "i want a beer")]


def ids_of(toy_loaded, pairs):
    hp, source_tokenizer, target_tokenizer, _ = toy_loaded
    x = source_ids(source_tokenizer, tf.constant([s for s, _ in pairs]), hp.maxlen).to_tensor()
    y = score.target_ids(target_tokenizer, tf.constant([t for _, t in pairs])).to_tensor()
    return x, y


def test_forced_decoding_equals_the_unsmoothed_training_loss(toy_loaded):
    """The training loss's own path (target_token_losses, packed rows, label smoothing 0), and a
    restatement from the model's call with the decoder inputs written out, give the same token
    log-probabilities as scoring."""
    model = toy_loaded.model
    x, y = ids_of(toy_loaded, PAIRS)
    log_probs = score.token_log_probs(model, x, y).numpy()
    is_target = y.numpy() != PAD_ID
    decoder_inputs = np.concatenate([np.full([len(PAIRS), 1], BOS_ID), y.numpy()[:, :-1]], axis=1)
    # Packed, the loss has a row for every real decoder input, 0 where the label is <PAD> (after </S>).
    losses, _ = model.target_token_losses(x, y, label_smoothing=0.0, training=False)
    np.testing.assert_allclose(-log_probs[decoder_inputs != PAD_ID], losses.numpy(), rtol=1e-5, atol=1e-5)

    logits = model((x, tf.constant(decoder_inputs, tf.int32)), training=False)
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits).numpy()
    np.testing.assert_allclose(-log_probs[is_target], cross_entropy[is_target], rtol=1e-5, atol=1e-5)
    assert (log_probs[~is_target] == 0).all()

    scores = score.score_ids(model, x, y, 0.6)
    tokens = is_target.sum(axis=1)
    np.testing.assert_array_equal(scores.tokens.numpy(), tokens)
    np.testing.assert_allclose(scores.total.numpy(), log_probs.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(scores.normalised.numpy(), log_probs.sum(axis=1) / ((5 + tokens) / 6) ** 0.6,
                               rtol=1e-6)
    assert scores.total.numpy()[3] < scores.total.numpy()[0]  # "coke" for "bier" is less likely


def test_scoring_a_decoders_output_gives_its_score_back(toy_loaded):
    """The incremental decoders' scores (greedy: the log-probability; beam: divided by the penalty)
    of their own ids are what forced decoding gives them."""
    model = toy_loaded.model
    x, _ = ids_of(toy_loaded, PAIRS[:4])
    for beam_size, alpha in ((1, 0.0), (3, 0.6)):
        ids, scores = decode.generate(model, x, beam_size=beam_size, length_penalty=alpha, nbest=beam_size)
        hypotheses = tf.reshape(ids, [-1, ids.shape[-1]])
        forced = score.score_ids(model, tf.repeat(x, beam_size, axis=0), hypotheses, alpha)
        np.testing.assert_allclose(forced.normalised.numpy(), scores.numpy().ravel(), rtol=1e-4, atol=1e-4)


def test_score_pairs_keeps_the_input_order_whatever_the_batches(toy_loaded):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    sources, targets = [s for s, _ in PAIRS], [t for _, t in PAIRS]
    together = score.score_pairs(sources, targets, source_tokenizer, target_tokenizer, model, batch_size=8)
    alone = [score.score_pairs([s], [t], source_tokenizer, target_tokenizer, model)[0] for s, t in PAIRS]
    for a, b in zip(together, alone):
        assert a.tokens == b.tokens
        np.testing.assert_allclose(a[:3], b[:3], rtol=1e-5, atol=1e-5)
        assert a.per_token == pytest.approx(a.total / a.tokens)
    assert together[4].tokens == 1  # an empty target: </S> alone
    assert score.score_pairs([], [], source_tokenizer, target_tokenizer, model) == []
    with pytest.raises(ValueError, match="2 sources but 1 targets"):
        score.score_pairs(sources[:2], targets[:1], source_tokenizer, target_tokenizer, model)


def test_score_cli_prints_total_per_token_and_normalised(toy_loaded, toy_dir, tmp_path, capsys, same_model):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    source, target = tmp_path / "src", tmp_path / "tgt"
    source.write_text("".join(s + "\n" for s, _ in PAIRS), encoding="utf-8")
    target.write_text("".join(t + "\n" for _, t in PAIRS), encoding="utf-8")
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--score", "--input", str(source), "--target", str(target),
                         "--length-penalty", "1.0", "--batch-size", "2")
    assert code == 0 and len(lines) == len(PAIRS)
    expected = score.score_pairs([s for s, _ in PAIRS], [t for _, t in PAIRS], source_tokenizer, target_tokenizer,
                                 model, length_penalty=1.0)
    np.testing.assert_allclose([[float(v) for v in line.split("\t")] for line in lines],
                               [s[:3] for s in expected], rtol=1e-4, atol=1e-4)

    def error(*argv):
        assert_one_line_error(run(capsys, "--model-dir", toy_dir, *argv), argv[0] if argv[0] != "--score" else "")
    short = tmp_path / "short"
    short.write_text("i want a beer\n", encoding="utf-8")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--score", "--input", str(source)),
                          "--score needs --target FILE")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--target", str(target), "a"),
                          "--target", "only with --score")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--score", "--target", str(target), "--beam-size", "4",
                              "--alignments", "a"), "--score scores the given --target", "--beam-size, --alignments")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--score", "--input", str(source), "--target",
                              str(short)), f"--target {short}: 1 lines, but {len(PAIRS)} source sentences")
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--score", "--target", str(tmp_path / "none"), "a"),
                          str(tmp_path / "none"))
    assert_one_line_error(run(capsys, "--rest", "http://localhost:1", "--score", "--target", str(target), "a"),
                          "--score need(s) a local --model-dir")

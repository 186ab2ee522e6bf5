"""tf_transformer/infer/ct2.py: a tiny random model converted to CTranslate2 scores and decodes as ours;
bench/run.py's rows of bench/ct2.py's figures; bench/ct2.py's contenders of our export."""

import argparse
import os

import numpy as np
import pytest
import tensorflow as tf

from bench import run
from bench.ct2 import ct2_ids, ct2_missing, markdown_table, one_sentence_split, our_ids, session_contender
from tf_transformer.data.tokenizer import WordTokenizer
from tf_transformer.data.vocab import EOS_ID, SPECIALS, WordVocab
from tf_transformer.hparams import load_hparams
from tf_transformer.infer.decode import generate
from tf_transformer.infer.load import LoadedModel
from tf_transformer.nn.model import Transformer, TransformerConfig, shift_right
from tests.toy_model import TOY, toy_export

needs_ct2 = pytest.mark.skipif(ct2_missing() is not None,
                               reason="ctranslate2 is not installed (pip install -e \".[ctranslate2]\")")

VOCAB = 30
TINY = {"num_blocks": 2, "num_units": 16, "num_heads": 2, "d_ff": 32, "maxlen": 12}
# Decoding options (ct2_ids and our_ids read them): one length limit for every sentence, both sides.
HP = load_hparams("toy", overrides=["max_decode_length=15"])
# Sources of several lengths in one batch (padding must not matter), each ending with </S>.
SOURCES = [[5, 9, 17, EOS_ID], [4, EOS_ID], [29, 8, 8, 12, 6, 21, 7, 11, EOS_ID], [13, 22, 5, EOS_ID]]
TARGETS = [[7, 7, 20, EOS_ID], [6, EOS_ID], [28, 4, 19, 10, 9, EOS_ID], [15, 23, EOS_ID]]


def tokenizer():
    return WordTokenizer(WordVocab(list(SPECIALS) + [f"w{i}" for i in range(len(SPECIALS), VOCAB)]))


def random_model(seed=0, **options):
    """(tokenizer, model): a tiny model with every weight (biases and layer norms too) random."""
    model = Transformer(VOCAB, VOCAB, TransformerConfig(**{**TINY, **options}))
    ids = tf.constant([[5, 6]])
    model((ids, ids), training=False)
    rng = np.random.default_rng(seed)
    for variable in model.variables:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(np.float32))
    return tokenizer(), model


def converted(model, words, tmp_path):
    import ctranslate2

    from tf_transformer.infer.ct2 import convert

    return ctranslate2.Translator(convert(model, words, words, str(tmp_path / "ct2")), device="cpu",
                                  compute_type="float32", intra_threads=1)


VARIANTS = {
    "default": {},
    # W^O as the identity, a learned table of 12 positions (later ones reuse its last row), one shared table
    "no W^O, learned positions, shared embeddings": {"output_projection": False, "positional_encoding": "learned",
                                                     "shared_embeddings": True},
}


@needs_ct2
@pytest.mark.parametrize("variant", VARIANTS)
def test_converted_model_gives_our_log_probabilities(variant, tmp_path):
    words, model = random_model(**VARIANTS[variant])
    translator = converted(model, words, tmp_path)
    results = translator.score_batch([[words.id_to_token(i) for i in s] for s in SOURCES],
                                     [[words.id_to_token(i) for i in t[:-1]] for t in TARGETS])
    x = tf.ragged.constant(SOURCES).to_tensor()
    y = tf.ragged.constant(TARGETS).to_tensor()
    log_probs = tf.nn.log_softmax(model((x, shift_right(y)), training=False)).numpy()
    for row, (target, result) in enumerate(zip(TARGETS, results)):
        ours = log_probs[row, np.arange(len(target)), target]  # each target token's, </S> included
        np.testing.assert_allclose(result.log_probs, ours, rtol=1e-4, atol=1e-4)


@needs_ct2
@pytest.mark.parametrize("beam_size", [1, 3])
def test_converted_model_decodes_as_ours(beam_size, tmp_path):
    words, model = random_model()
    translator = converted(model, words, tmp_path)
    ours = our_ids(model, SOURCES, beam_size, HP)
    assert ct2_ids(translator, words, SOURCES, beam_size, HP) == ours
    # Greedy: CTranslate2's plain log-probability (no length penalty) is our score.
    if beam_size == 1:
        _, scores = generate(model, tf.ragged.constant(SOURCES).to_tensor(), beam_size=1,
                             max_length=HP.max_decode_length)
        results = translator.translate_batch([[words.id_to_token(i) for i in s] for s in SOURCES], beam_size=1,
                                             length_penalty=0.0, return_scores=True,
                                             max_decoding_length=HP.max_decode_length)
        # Summed over 15 steps: CTranslate2's vectorised log-softmax is off by a few 1e-5 a token.
        np.testing.assert_allclose([r.scores[0] for r in results], scores.numpy()[:, 0], rtol=1e-3)


@needs_ct2
def test_the_output_ids_index_the_target_vocabulary_once_not_every_batch(tmp_path, monkeypatch):
    words, model = random_model()
    translator = converted(model, words, tmp_path)
    first = ct2_ids(translator, words, SOURCES, 1, HP)
    looked_up = []
    monkeypatch.setattr(words, "id_to_token", lambda i, look=words.id_to_token: looked_up.append(i) or look(i))
    assert ct2_ids(translator, words, SOURCES, 1, HP) == first
    assert sorted(looked_up) == sorted(i for source in SOURCES for i in source)  # the sources' tokens only


@needs_ct2
@pytest.mark.parametrize("beam_size", [1, 2])
def test_the_one_sentence_split_times_both_sides_over_the_steps_they_take(beam_size, tmp_path):
    words, model = random_model()
    translator = converted(model, words, tmp_path)
    sentences = [" ".join(words.id_to_token(i) for i in source[:-1]) for source in SOURCES]
    splits = one_sentence_split(LoadedModel(HP, words, words, model), translator, sentences, beam_size, repeats=1)
    # Each sentence's whole call: its output and </S>, or the limit's steps (both sides decode alike).
    steps = [min(len(ids) + 1, HP.max_decode_length) for ids in our_ids(model, SOURCES, beam_size, HP)]
    assert set(splits) == {"ours translate_xla loop", "CTranslate2 float32"}
    for split in splits.values():
        # Times are measured, not asserted: a per step figure exists where sentences take more than one step.
        assert split.steps == round(float(np.mean(steps)), 1) and split.fixed_ms > 0 and split.step_ms is not None
    setting = {"threads": 1, "load_average_before": 0.0, "rows": [], "one_sentence_split": [
        {"contender": name, "decoder": "greedy", **split._asdict()} for name, split in splits.items()]}
    args = argparse.Namespace(sentences=4, batch_size=4, latency_runs=1, latency_block=1, patience=1.0,
                              split_sentences=4)
    ours, theirs = splits.values()
    row = markdown_table([setting], args, []).splitlines()[-2]
    assert row.startswith("| 1 per pool | greedy | ours translate_xla loop |")
    # x: CTranslate2's milliseconds over ours (above 1: ours faster).
    assert f"| {theirs.fixed_ms / ours.fixed_ms:.2f} |" in row and f"| {theirs.step_ms / ours.step_ms:.2f} |" in row


class EndedHypotheses:
    """A stand-in for a ``ctranslate2.Translator`` whose beam search ended two hypotheses of each sentence,
    the best after 2 tokens and the other after 6 (returned without ``</S>``, as CTranslate2 returns them)."""

    def translate_batch(self, pieces, num_hypotheses=1, **options):
        return [argparse.Namespace(hypotheses=[["w5"] * 2, ["w6"] * 6][:num_hypotheses]) for _ in pieces]


def test_ctranslate2_s_beam_search_takes_the_steps_of_its_last_ended_hypothesis():
    """Beam 2 stops once 2 hypotheses have ended: the split counts CTranslate2's steps to the second's
    ``</S>`` (7), not the best's (3), the steps its search ran."""
    words, model = random_model()
    sentence = " ".join(words.id_to_token(i) for i in SOURCES[1][:-1])
    splits = one_sentence_split(LoadedModel(HP, words, words, model), EndedHypotheses(), [sentence], 2, repeats=1)
    assert splits["CTranslate2 float32"].steps == 7.0


@needs_ct2
@pytest.mark.parametrize("option, value", [("qkv_activation", "relu"), ("mask_source", "inputs")])
def test_a_model_ctranslate2_cannot_represent_is_refused_naming_the_option(option, value, tmp_path):
    from tf_transformer.infer.ct2 import UnsupportedModel, convert

    words, model = random_model(**{option: value})
    with pytest.raises(UnsupportedModel, match=f"{option}: {value}"):
        convert(model, words, words, str(tmp_path / "ct2"))
    assert not (tmp_path / "ct2").exists()


@needs_ct2
def test_a_learned_position_table_is_extended_with_its_last_row():
    from tf_transformer.infer.ct2 import transformer_spec_of, vocabulary

    words, model = random_model(positional_encoding="learned")
    table = model.enc_positions.table.lookup_table.numpy()  # (maxlen, C)
    spec = transformer_spec_of(model, vocabulary(words), vocabulary(words), positions=20)
    encodings = spec.encoder.position_encodings.encodings
    np.testing.assert_array_equal(encodings[:12], table)
    np.testing.assert_array_equal(encodings[12:], np.repeat(table[-1:], 8, axis=0))


def test_translate_xla_run_in_a_session_translates_the_toy_corpus(tmp_path_factory):
    """TF Serving's way (the SavedModel in a Session, its tensors fed and fetched: bench/ct2.py's ``Session``
    contender) translates a batch with an empty input (XLA's loop of buckets at the export's beam size, the toy
    preset's 4) as the toy model learned it, and no sentence at all."""
    session = session_contender("session", toy_export(tmp_path_factory), "translate_xla", threads=1)
    assert session.translate(list(TOY) + [""], 4) == list(TOY.values()) + [""]
    assert session.translate([], 4) == []


def ct2_row(contender, decoder, per_s, p50):
    return {"contender": contender, "decoder": decoder, "batch_sentences_per_s": per_s, "p50_ms": p50,
            "p99_ms": 2 * p50}


def test_run_rows_of_ct2_hold_goals_for_float32_only_and_the_latency_ratio_is_peer_over_ours():
    rows = [ct2_row("ours SavedModel translate", "greedy", 60.0, 30.0),
            ct2_row("CTranslate2 float32", "greedy", 100.0, 20.0), ct2_row("CTranslate2 int8", "greedy", 200.0, 10.0)]
    figures = run.ct2_figures({"settings": [{"threads": 1, "check": {"sentences": 500, "float32 greedy": 0.97},
                                             "rows": rows}]})
    check, batch32, p50_32, batch8, p50_8 = figures
    assert check["met"] and check["ours"] == "97.0%"
    assert (batch32["ratio"], batch32["goal"]) == (0.6, 0.5) and (p50_32["ratio"], p50_32["goal"]) == (20 / 30, 0.67)
    assert (batch8["ratio"], batch8["goal"]) == (0.3, None) and p50_8["ratio"] == 10 / 30
    lines = run.table(figures).splitlines()[2:]
    assert [line.rstrip(" |").split("|")[-1].strip() for line in lines] == ["yes", "yes", "NO", "-", "-"]


# ---- the export for users (python -m tf_transformer.cli.export --format ctranslate2, translate.py --ctranslate2) ----

def test_without_ctranslate2_the_export_and_translate_py_say_how_to_install_it_in_one_line(monkeypatch, tmp_path,
                                                                                         capsys):
    from tf_transformer.cli import export as export_cli
    from tf_transformer.cli import translate as translate_cli
    from tf_transformer.infer import ct2

    monkeypatch.setattr(ct2, "ctranslate2_missing", lambda: "ModuleNotFoundError: No module named 'ctranslate2'")
    for main, argv, flag in ((export_cli.main, ["--model-dir", str(tmp_path), "--format", "ctranslate2"],
                              "--format ctranslate2"),
                             (translate_cli.main, ["--ctranslate2", str(tmp_path), "hallo"], "--ctranslate2")):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {flag} needs the ctranslate2 package")
        assert 'pip install -e ".[ctranslate2]"' in err


@pytest.mark.parametrize("argv, message", [
    (["--format", "ctranslate2", "--xla"], "error: --xla: not an option of --format ctranslate2"),
    (["--quantization", "int8"], "error: --quantization: not an option of --format savedmodel"),
    (["--format", "ctranslate2", "--export-dir", "{file}"], "is a file, expected a directory"),
])
def test_export_options_of_the_other_format_and_a_file_as_output_are_refused_in_one_line(argv, message, tmp_path,
                                                                                          capsys):
    from tf_transformer.cli import export as export_cli
    from tf_transformer.infer import ct2

    if ct2.ctranslate2_missing() is not None and "--export-dir" in argv:
        pytest.skip("ctranslate2 is not installed")
    (tmp_path / "file").write_text("")
    argv = [a.replace("{file}", str(tmp_path / "file")) for a in argv]
    assert export_cli.main(["--model-dir", str(tmp_path)] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize("argv, message", [
    (["--trace"], "--trace: not available with --ctranslate2"),
    (["--model-dir", "m"], "--ctranslate2 translates with a CTranslate2 model; --model-dir too"),
    (["--beam-patience", "0"], "--beam-patience 0: CTranslate2's beam search has no exact rule"),
])
def test_translate_py_refuses_what_ctranslate2_cannot_do_in_one_line(argv, message, capsys):
    from tf_transformer.cli import translate as translate_cli

    assert translate_cli.main(["--ctranslate2", "somewhere", "hallo"] + argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@needs_ct2
def test_the_export_writes_a_checked_model_that_translate_py_translates_as_ours(tmp_path, capsys):
    from tests.test_average import save, tiny_model_dir
    from tests.toy_model import TOY
    from tf_transformer.cli import export as export_cli
    from tf_transformer.cli import translate as translate_cli
    from tf_transformer.infer.load import load_for_inference
    from tf_transformer.infer.translate import translate

    model_dir, data = tmp_path / "model", tmp_path / "data"
    _, tokenizers, model = tiny_model_dir(model_dir, "beam_size=1")
    model((tf.constant([[4, 3]]), tf.constant([[2, 5]])))
    rng = np.random.default_rng(1)
    for variable in model.weights:
        variable.assign(rng.normal(0.0, 0.5, variable.shape).astype(np.float32))
    model.logits_layer.bias[0].assign(-100.0)  # no <PAD> output: a trained model never writes one
    save(str(model_dir), model, tokenizers, 10)
    data.mkdir()
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("".join(f"{s}\t{t}\n" for s, t in TOY.items()))
    assert export_cli.main(["--model-dir", str(model_dir), "--format", "ctranslate2", "--quantization", "int8",
                            "--data", str(data)]) == 0
    out = capsys.readouterr().out
    written = model_dir / "ctranslate2-int8"
    assert f"exported {written}: CTranslate2 model (int8 weights) of its newest checkpoint" in out
    assert "dev BLEU (3 sentences" in out and "CTranslate2 int8" in out
    assert {"model.bin", "hparams.yaml", "source.vocab.tsv", "target.vocab.tsv"} <= set(os.listdir(written))
    # float32: translate.py --ctranslate2 gives our greedy translations
    assert export_cli.main(["--model-dir", str(model_dir), "--format", "ctranslate2"]) == 0
    capsys.readouterr()
    sentences = list(TOY) + ["ich ich bier unbekannt"]
    assert translate_cli.main(["--ctranslate2", str(model_dir / "ctranslate2"), *sentences]) == 0
    loaded = load_for_inference(str(model_dir))
    assert capsys.readouterr().out.splitlines() == translate(sentences, *loaded.tokenizers, loaded.model)

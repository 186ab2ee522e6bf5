"""translate.py with a local model: batching in input order, the input rules, n-best, --trace,
--plot-attention, files, and one-line errors."""

import io
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

from tests.toy_model import TOY
from tf_transformer.cli import translate as translate_cli
from tf_transformer.infer import decode
from tf_transformer.infer import load as inference_load
from tf_transformer.infer import translate as translating
from tf_transformer.infer.export import saved_model_folder
from tf_transformer.infer.translate import attention_figure, source_ids, translate, translate_nbest

BEER = list(TOY)[0]


@pytest.fixture
def same_model(toy_loaded, toy_dir, monkeypatch):
    """translate_cli.main reuses the module's model (and so its traced decoder) instead of loading it again (it
    imports :func:`~tf_transformer.infer.load.load_for_inference` when it loads)."""

    def load(path):
        assert path == toy_dir
        return toy_loaded

    monkeypatch.setattr(inference_load, "load_for_inference", load)


def run(capsys, *argv, stdin=None, monkeypatch=None):
    """translate_cli.main in this process: (exit code, stdout lines, stderr)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    code = translate_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


@pytest.mark.slow  # trains the shared model when it runs first; traces the decoder
def test_batches_sorted_by_length_come_back_in_input_order(toy_loaded):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    sentences = ["ich mochte ein orangensaft bitte bitte", BEER, "", "ich", "ich mochte ein cola", "  ", "ein"]
    one_by_one = [translate([s], source_tokenizer, target_tokenizer, model)[0] for s in sentences]
    assert translate(sentences, source_tokenizer, target_tokenizer, model, batch_size=2) == one_by_one
    assert one_by_one[1] == TOY[BEER] and one_by_one[4] == TOY["ich mochte ein cola"]
    assert one_by_one[2] == one_by_one[5] == ""  # no words, no translation
    assert translate([], source_tokenizer, target_tokenizer, model) == []


def test_decoding_once_runs_one_short_batch_untraced_and_translates_the_same(toy_loaded, monkeypatch):
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    sentences = [BEER, "", "ich mochte ein cola", "ich mochte ein orangensaft bitte bitte"]
    longest = int(max(source_ids(source_tokenizer, tf.constant(sentences), hp.maxlen).row_lengths()))
    loops = []  # (how, kind) of every decoding loop fetched

    def counted(how):
        fetch = getattr(decode, how)

        def fetch_and_count(m, kind):
            loops.append((how, kind))
            return fetch(m, kind)
        return fetch_and_count

    for how in ("_traced", "_untraced"):
        monkeypatch.setattr(decode, how, counted(how))

    def run(**options):
        loops.clear()
        return translate_nbest(sentences, source_tokenizer, target_tokenizer, model, **options), set(loops)

    for kind, options in (("greedy", {}), ("beam", {"beam_size": 3, "nbest": 2}),
                          ("sample", {"sampling": decode.Sampling(3, 1.5, 2**32 - 1)})):
        traced, traced_loops = run(**options)
        untraced, untraced_loops = run(**options, once=True)
        assert (traced_loops, untraced_loops) == ({("_traced", kind)}, {("_untraced", kind)})
        assert [[h.text for h in r] for r in untraced] == [[h.text for h in r] for r in traced]
        assert traced[1] == untraced[1]  # no words: no decoding
        assert kind == "sample" or traced[0][0].text == TOY[BEER]  # a draw need not be the best translation
        np.testing.assert_allclose([[h.score for h in r] for r in untraced], [[h.score for h in r] for r in traced],
                                   rtol=1e-5, atol=1e-6)
        # Once, but in two batches, or with a source over the limit: traced, as a file's sentences are.
        assert run(**options, once=True, batch_size=2)[1] == {("_traced", kind)}
        with monkeypatch.context() as limit:
            limit.setattr(translating, "UNTRACED_SOURCE_TOKENS", longest - 1)
            assert run(**options, once=True)[1] == {("_traced", kind)}
            limit.setattr(translating, "UNTRACED_SOURCE_TOKENS", longest)
            assert run(**options, once=True)[1] == {("_untraced", kind)}


def test_input_rules_cut_long_sources_to_maxlen_tokens(toy_loaded):
    hp, source_tokenizer, _, _ = toy_loaded
    long = "ich mochte ein cola " * 40
    ids = source_ids(source_tokenizer, tf.constant([long, "", " \t", BEER, b"\xff"]), hp.maxlen)
    rows = ids.to_list()
    pieces = source_tokenizer.processor.encode(long)
    assert rows[0] == pieces[: hp.maxlen - 1] + [3]  # the first maxlen - 1 tokens, then </S>
    assert rows[1] == rows[2] == [3]
    assert rows[3] == source_tokenizer.processor.encode(BEER) + [3]
    assert rows[4] == source_tokenizer.processor.encode("\ufffd") + [3]


def test_nbest_lists_are_beam_search_hypotheses_best_first(toy_loaded, capsys, toy_dir, same_model):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    results = translate_nbest([BEER, "", "ich mochte ein cola"], source_tokenizer, target_tokenizer,
                                        model, beam_size=3, nbest=3)
    assert [len(r) for r in results] == [3, 3, 3]
    for hypotheses in (results[0], results[2]):
        scores = [hypothesis.score for hypothesis in hypotheses]
        assert scores == sorted(scores, reverse=True) and len({hypothesis.text for hypothesis in hypotheses}) == 3
    assert results[0][0][0] == TOY[BEER]
    assert results[1] == [("", 0.0, None)] * 3

    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "3", "--nbest", "2", BEER, "")
    assert code == 0
    rows = [line.split("\t") for line in lines]
    assert [(r[0], r[2]) for r in rows] == [("0", results[0][0][0]), ("0", results[0][1][0]), ("1", ""), ("1", "")]
    assert float(rows[0][1]) == pytest.approx(results[0][0][1], abs=1e-3)


def test_sentences_from_stdin_and_files(toy_dir, tmp_path, capsys, monkeypatch, same_model):
    sources = [BEER, "", "ich mochte ein orangensaft"]
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "1",
                         stdin="\r\n".join(sources).encode() + b"\r\n", monkeypatch=monkeypatch)
    assert (code, lines) == (0, [TOY[BEER], "", TOY[sources[2]]])

    source, target = tmp_path / "in.de", tmp_path / "out.en"
    source.write_text("\n".join(sources) + "\n", encoding="utf-8")
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "1", "--batch-size", "1",
                         "--input", str(source), "--output", str(target))
    assert (code, lines) == (0, [])
    assert target.read_text(encoding="utf-8") == f"{TOY[BEER]}\n\n{TOY[sources[2]]}\n"


def test_xla_translates_the_same_and_a_length_factor_cuts_each_sentence_at_its_share(toy_dir, capsys, same_model):
    sources = list(TOY)
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--xla", *sources)
    assert (code, lines) == (0, list(TOY.values()))
    # A factor of 0.5: at most ceil(0.5 x the source's tokens, </S> included) target tokens, so each
    # translation is a cut of the full one (the toy's targets are longer than half their sources).
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "1", "--max-length-factor", "0.5", *sources)
    assert code == 0 and len(lines) == len(sources)
    for line, full in zip(lines, TOY.values()):
        assert len(line) < len(full) and full.startswith(line.rstrip())


def test_trace_shows_every_greedy_step_with_the_input_index(toy_dir, capsys, same_model):
    code, lines, err = run(capsys, "--model-dir", toy_dir, "--trace", "--batch-size", "1",
                           "ich mochte ein orangensaft", BEER)
    assert code == 0 and lines == [TOY["ich mochte ein orangensaft"], TOY[BEER]]
    steps = [line for line in err.splitlines() if " step " in line]
    assert steps[0] == "[0] step 0: <S> ▁i"  # the input order, not the batches' order by length
    beer = [line for line in steps if line.startswith("[1] ")]
    assert [line.split(":")[0] for line in beer] == [f"[1] step {i}" for i in range(len(beer))]
    pieces = beer[-1].split(": <S> ")[1].split()
    assert pieces[-1] == "</S>" and "".join(pieces[:-1]).replace("▁", " ").strip() == TOY[BEER]


def test_plot_attention_draws_every_head_of_every_block(toy_loaded, toy_dir, tmp_path, capsys, same_model):
    hp, source_tokenizer, target_tokenizer, model = toy_loaded
    path = tmp_path / "attention.png"
    code, lines, _ = run(capsys, "--model-dir", toy_dir, "--beam-size", "1", "--plot-attention", str(path),
                         BEER, "ich mochte ein cola")
    assert code == 0 and lines == [TOY[BEER], TOY["ich mochte ein cola"]]
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert_one_line_error(run(capsys, "--model-dir", toy_dir, "--plot-attention", str(tmp_path / "b.png"), " ", BEER),
                          "the sentence has no words")

    x = source_ids(source_tokenizer, tf.constant([BEER]), hp.maxlen).to_tensor()
    output = target_tokenizer.tokenize(tf.constant([TOY[BEER]])).to_list()[0] + [3]
    figure = attention_figure(BEER, source_tokenizer, target_tokenizer, model, output, None)
    panels = figure.axes[: hp.num_blocks * hp.num_heads]
    assert len(figure.axes) == hp.num_blocks * hp.num_heads + 1  # and the colour bar
    source_pieces = [source_tokenizer.id_to_token(i) for i in x[0].numpy()]
    target_pieces = [target_tokenizer.id_to_token(i) for i in output]
    decoder_inputs = tf.constant([[2] + output[:-1]])
    weights = [block[0].numpy() for block in model.attention_weights(x, decoder_inputs)]  # L x (h, T_y, T_x)
    for index, axes in enumerate(panels):
        block, head = divmod(index, hp.num_heads)
        # Labels on the outer panels: source pieces under the last block, output pieces left of head 1.
        assert [t.get_text() for t in axes.get_xticklabels()] == (source_pieces if block == hp.num_blocks - 1 else [])
        assert [t.get_text() for t in axes.get_yticklabels()] == (target_pieces if head == 0 else [])
        np.testing.assert_allclose(axes.images[0].get_array(), weights[block][head], atol=1e-6)
        np.testing.assert_allclose(weights[block][head].sum(-1), 1.0, atol=1e-5)


def assert_one_line_error(result, *fragments):
    code, lines, err = result
    assert code == 2 and lines == []
    assert err.startswith("error: ") and err.count("\n") == 1, err
    for fragment in fragments:
        assert fragment in err, err


def test_mistakes_get_one_line_errors(toy_dir, tmp_path, capsys, monkeypatch):
    def error(*argv, stdin=None):
        return run(capsys, *argv, stdin=stdin, monkeypatch=monkeypatch)

    missing = str(tmp_path / "missing.de")
    assert_one_line_error(error("--model-dir", toy_dir, "--input", missing), missing, "not found")
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"ich\n\xff\n")
    assert_one_line_error(error("--model-dir", toy_dir, "--input", str(bad)), f"{bad}:2", "UTF-8")
    assert_one_line_error(error("--model-dir", toy_dir, stdin=b"ich\nein \xc3\n"), "standard input, line 2",
                          "UTF-8")
    assert_one_line_error(error("--model-dir", toy_dir, "--output", str(tmp_path / "no" / "out.en"), BEER),
                          str(tmp_path / "no" / "out.en"))

    untrained = tmp_path / "untrained"
    untrained.mkdir()
    for name in ("hparams.yaml", "sentencepiece.model"):
        shutil.copy(os.path.join(toy_dir, name), untrained / name)
    assert_one_line_error(error("--model-dir", str(untrained), BEER), str(untrained), "no checkpoint")
    assert_one_line_error(error(BEER), "--model-dir")

    # An export given as --model-dir, the folder of versions or one version: named as one, with its run.
    (untrained / "export" / "3").mkdir(parents=True)
    (untrained / "export" / "3" / "saved_model.pb").write_bytes(b"")
    for export in (untrained / "export", untrained / "export" / "3"):
        assert_one_line_error(error("--model-dir", str(export), BEER), f"{export}: a SavedModel export",
                              f"({untrained})", "--server")
    (tmp_path / "elsewhere").mkdir()
    shutil.copytree(untrained / "export", tmp_path / "elsewhere" / "export")
    message = error("--model-dir", str(tmp_path / "elsewhere" / "export"), BEER)
    assert_one_line_error(message, "a SavedModel export", "give --model-dir the run directory, or serve")
    assert_one_line_error(error("--model-dir", str(tmp_path / "elsewhere"), BEER), "no hparams.yaml there")
    unreadable = tmp_path / "unreadable"
    unreadable.mkdir()
    real_listdir = os.listdir

    def listdir(path):  # as for a folder without read permission (the tests run as root, who reads every folder)
        if str(path) == str(unreadable):
            raise PermissionError(13, "Permission denied")
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    assert_one_line_error(error("--model-dir", str(unreadable), BEER), f"{unreadable}: cannot be read",
                          "Permission denied")
    assert saved_model_folder(str(unreadable)) is None  # as a run would be looked for, without a traceback

    for flags, fragment in ((["--batch-size", "0"], "--batch-size 0"), (["--beam-size", "0"], "--beam-size 0"),
                            (["--nbest", "0"], "--nbest 0"), (["--max-length", "-3"], "--max-length -3"),
                            (["--length-penalty", "-1"], "--length-penalty -1"),
                            (["--beam-size", "2", "--nbest", "3"], "--nbest 3"),
                            (["--plot-attention", str(tmp_path / "no" / "a.png")], "does not exist"),
                            (["--trace", "--beam-size", "2"], "--trace"),
                            (["--plot-attention", "a.pdf"], "a.pdf"),
                            (["--server", "localhost:1", "--rest", "http://localhost:2"], "--rest"),
                            (["--server", "localhost:1"], "--model-dir"),
                            (["--input", missing], "--input")):
        assert_one_line_error(error("--model-dir", toy_dir, *flags, BEER), fragment)
    assert_one_line_error(error("--server", "localhost:1", "--nbest", "2", BEER), "--nbest", "--model-dir")
    assert_one_line_error(error("--server", "localhost:1", "--xla", BEER), "--xla", "--model-dir")


def test_limits_beyond_what_the_decoder_represents_and_its_own_input_as_output_are_refused(toy_dir, tmp_path, capsys,
                                                                                          monkeypatch):
    """Issue 24: a length factor that would overflow int32 in the graph, and --output naming --input."""
    def error(*argv):
        return run(capsys, *argv, monkeypatch=monkeypatch)

    for flags, fragment in ((["--max-length-factor", "1e9"], "--max-length-factor 1000000000.0: must be at most 100"),
                            (["--max-length-factor", "1e9", "--xla"], "--max-length-factor 1000000000.0"),
                            (["--max-length", "3000000000"], "--max-length 3000000000: must be between 1 and 4096"),
                            (["--beam-size", "65"], "--beam-size 65: must be between 1 and 64"),
                            (["--beam-patience", "1e9"], "--beam-patience 1000000000.0: must be at most 100"),
                            (["--beam-patience", "-1"], "--beam-patience -1.0: must be 0 (none) or more"),
                            (["--batch-size", str(2**40)], f"--batch-size {2**40}: must be between"),
                            (["--timeout", "1e300"], "--timeout 1e+300: must be between")):
        assert_one_line_error(error("--model-dir", toy_dir, *flags, BEER), fragment)
    source = tmp_path / "source.de"
    source.write_text(BEER + "\n")
    assert_one_line_error(error("--model-dir", toy_dir, "--input", str(source), "--output", str(source)),
                          "is the --input file")
    assert source.read_text() == BEER + "\n"

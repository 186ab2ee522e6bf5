"""The export loaded as a model server loads it, without Python: tools/c_loader's ``tf_translate``
(TensorFlow's C API, TensorFlow Text's op libraries loaded with TF_LoadLibrary) built with the
system's C compiler, its translations and scores against the Python model's."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from bench import c_loader as bench  # noqa: E402
from tests.toy_model import TOY, toy_export  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.infer.translate import translate_nbest  # noqa: E402


build = bench.c_build()  # tools/c_loader/build.py, the one place that knows how to build the program
# A batch with a sentence the model never saw, words it does not know, and an empty one.
SENTENCES = [*TOY, "ich mochte ein", "bier cola ein mochte ich", "", "unbekannte wörter ü"]


@pytest.fixture(scope="module")
def program(tmp_path_factory):
    if build.compiler() is None:
        pytest.skip("no C compiler found ($CC, cc, gcc or clang) to build tools/c_loader/tf_translate.c")
    return build.build(str(tmp_path_factory.mktemp("c_loader") / "tf_translate"))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    """The toy export's version folder (made once per test session, shared with test_export.py)."""
    return toy_export(tmp_path_factory)


def run_c(program, path, *options, sentences=(), stdin=None):
    """tf_translate's standard output lines, the "# " timing lines apart: (translations, scores, timing)."""
    argv = [program, "--op-library", build.op_library_dir(), "--scores", *options, path, *sentences]
    result = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.split("\n")
    assert lines.pop() == ""
    timing = [line for line in lines if line.startswith("# ")]
    rows = [line.split("\t", 1) for line in lines if not line.startswith("# ")]
    return [t for _, t in rows], np.array([float(s) for s, _ in rows], np.float32), timing


def python_model(toy_loaded, sentences, beam_size):
    _, source_tokenizer, target_tokenizer, model = toy_loaded
    results = translate_nbest(sentences, source_tokenizer, target_tokenizer, model, batch_size=len(sentences),
                              beam_size=beam_size, length_penalty=toy_loaded[0].length_penalty)
    return [r[0][0] for r in results], np.array([r[0][1] for r in results], np.float32)


@pytest.mark.slow  # trains and exports the shared toy model when it runs first
def test_c_program_translates_a_batch_and_one_sentence_as_the_python_model(program, path, toy_loaded):
    expected, expected_scores = python_model(toy_loaded, SENTENCES, toy_loaded[0].beam_size)
    assert expected[:3] == list(TOY.values()) and expected[5] == ""  # the model learnt the corpus

    # serving_default (beam 4) on the batch, then timed: one sentence at a time and the batch.
    translations, scores, timing = run_c(program, path, "--time", "3", "--batch-runs", "1", sentences=SENTENCES)
    assert translations == expected
    np.testing.assert_allclose(scores, expected_scores, rtol=1e-4, atol=1e-4)
    assert len(timing) == 2  # as bench/c_loader.py reads them
    assert bench.ONE.fullmatch(timing[0]) and timing[0].endswith(" over 3 calls")
    assert bench.BATCH.fullmatch(timing[1]) and timing[1].startswith(f"# batch of {len(SENTENCES)}: ")

    # The translate signature with its beam_size input fed (greedy), the sentences from standard input.
    greedy, greedy_scores = python_model(toy_loaded, SENTENCES, 1)
    translations, scores, _ = run_c(program, path, "--signature", "translate", "--beam-size", "1", "--threads", "1",
                                    stdin="".join(f"{s}\n" for s in SENTENCES))
    assert translations == greedy
    np.testing.assert_allclose(scores, greedy_scores, rtol=1e-4, atol=1e-4)

    # A batch of one, through the XLA-compiled signature at its default beam size (read from the SignatureDef).
    translations, scores, _ = run_c(program, path, "--signature", "translate_xla", sentences=SENTENCES[4:5])
    assert translations == expected[4:5]
    np.testing.assert_allclose(scores, expected_scores[4:5], rtol=1e-4, atol=1e-4)


def test_c_program_names_the_signatures_when_one_is_missing(program, path):
    result = subprocess.run([program, "--op-library", build.op_library_dir(), "--signature", "nope", path, "x"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert result.returncode == 2
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("tf_translate: the SavedModel has no signature nope (it has: ")
    assert {"serving_default", "translate", "translate_xla", "score"} == set(message.split("(it has: ")[1][:-1].split(", "))


def test_bench_finds_the_latest_version_and_greps_the_speed_flags(tmp_path):
    for version in ("2", "10", "notes"):
        (tmp_path / version).mkdir()
    (tmp_path / "10" / "saved_model.pb").write_bytes(b"")
    assert bench.version_folder(str(tmp_path)) == str(tmp_path / "10")
    assert bench.version_folder(str(tmp_path / "10")) == str(tmp_path / "10")
    with pytest.raises(SystemExit, match="no SavedModel"):
        bench.version_folder(str(tmp_path / "notes"))
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("flags\t: fpu avx2 avx512f avx512_bf16 amx_bf16\nflags\t: fpu avx2 avx512f avx512_bf16 amx_bf16\n")
    assert bench.cpu_flags(str(cpuinfo)) == "amx_bf16 avx2 avx512_bf16 avx512f"  # sort -u's order
    cpuinfo.write_text("flags\t: fpu sse4_2\n")
    assert bench.cpu_flags(str(cpuinfo)) == "none"


def test_bench_trains_its_random_model_on_the_corpus_training_pairs(monkeypatch):
    """Without --export-dir or --model-dir the bench exports a random model whose tokenizers it trains on the
    corpus' training pairs (bench/serving.py's model_under_test): it is given them. Stopped there, before
    any export or C program."""
    given = []

    def stop(args, pairs):
        given.append(pairs)
        raise RuntimeError("stopped before the export")

    monkeypatch.setattr(bench, "model_under_test", stop)
    monkeypatch.setattr(bench, "c_build", lambda: None)
    # This process's TensorFlow has started: its thread pools are set already.
    monkeypatch.setattr(bench.tf.config.threading, "set_intra_op_parallelism_threads", lambda n: None)
    monkeypatch.setattr(bench.tf.config.threading, "set_inter_op_parallelism_threads", lambda n: None)
    with pytest.raises(RuntimeError, match="stopped before the export"):
        bench.main(["--data", "ding-de-en"])
    assert given == [corpus.corpus_splits("ding-de-en")["train"].read().pairs]

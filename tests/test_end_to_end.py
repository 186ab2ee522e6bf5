"""train.py and translate.py as a user runs them: the toy run, its translations and a first mistake in fresh processes;
a rerun, the other mistakes and translate.py's options after its first run by their ``main`` in this process."""

import glob
import io
import os
import shutil

import pytest

from test_quiet import notices, user_env
from tests.toy_model import TOY, main_here, run_script as run, toy_train_py_run, train_here
from tf_transformer.cli import translate as translate_cli


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    """The session's toy train.py run (tests/toy_model.py; test_train_eval.py reads it too)."""
    return toy_train_py_run(tmp_path_factory)


@pytest.fixture(scope="module")
def toy_model_dir(toy_run):
    """The toy run's model directory, which the tests here only read."""
    assert toy_run.returncode == 0, toy_run.stderr
    return toy_run.model_dir


@pytest.fixture
def toy_model_copy(toy_model_dir, tmp_path):
    """A copy of the toy run's model directory, for a test that runs train.py in it."""
    return shutil.copytree(toy_model_dir, tmp_path / "toy-copy")


def test_toy_training_reaches_dev_bleu_100_and_writes_logs_samples_and_an_export(toy_run):
    model_dir = toy_run.model_dir
    assert toy_run.returncode == 0, toy_run.stderr
    evaluations = [line for line in toy_run.stdout.splitlines() if line.startswith("dev at step")]
    assert [line.split(" (")[0] for line in evaluations] == [f"dev at step {s}" for s in (50, 100, 150)]
    assert "BLEU 100.0 chrF 100.0" in evaluations[-1] and "version:2." in evaluations[-1]  # sacrebleu's signature
    assert glob.glob(os.path.join(model_dir, "logs", "events.out.tfevents.*"))
    assert os.path.exists(os.path.join(model_dir, "samples-step150.txt"))
    assert os.path.exists(os.path.join(model_dir, "best", "best.yaml"))
    assert os.path.exists(os.path.join(model_dir, "export", "1", "saved_model.pb"))
    assert "exported SavedModel: " + os.path.join(model_dir, "export", "1") in toy_run.stdout


def test_toy_corpus_trains_to_the_three_exact_translations_and_translate_starts_quietly(toy_model_dir):
    """In the environment of a user who set neither TF_CPP_MIN_LOG_LEVEL nor the quiet choice: standard error holds
    none of TensorFlow's start-up notices (test_quiet.py: ``--verbose`` brings them back)."""
    result = run("translate.py", "--model-dir", toy_model_dir, *TOY, env=user_env())
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == list(TOY.values())
    assert notices(result.stderr) == [], result.stderr


def translate_here(capsys, monkeypatch, *argv, stdin=""):
    """translate.py's ``main`` called in this process with ``stdin`` as its standard input (:func:`main_here`; the
    fresh process's run is the test above's: a TensorFlow import and a model trace fewer each)."""
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8"))
    return main_here(capsys, "translate.py", translate_cli.main, argv)


def test_translate_reads_stdin_in_input_order(toy_model_dir, capsys, monkeypatch):
    sources = list(TOY)[::-1]
    result = translate_here(capsys, monkeypatch, "--model-dir", toy_model_dir, "--batch-size", "2",
                            stdin="\n".join(sources) + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [TOY[s] for s in sources]


def test_trace_shows_the_decoder_state_after_every_step(toy_model_dir, capsys, monkeypatch):
    result = translate_here(capsys, monkeypatch, "--model-dir", toy_model_dir, "--trace", "ich mochte ein bier")
    assert result.returncode == 0, result.stderr
    steps = [line for line in result.stderr.splitlines() if "step" in line]
    assert steps == [
        "[0] step 0: <S> i",
        "[0] step 1: <S> i want",
        "[0] step 2: <S> i want a",
        "[0] step 3: <S> i want a beer",
        "[0] step 4: <S> i want a beer </S>",
    ]
    assert result.stdout.strip() == "i want a beer"


def test_rerun_resumes_instead_of_starting_over(toy_model_copy, capsys):
    result = train_here(capsys, "--preset", "toy", "--data", "toy", "--model-dir", str(toy_model_copy),
                        "--samples", "0", "--no-export")
    assert result.returncode == 0, result.stderr
    assert "resumed from" in result.stdout
    assert not [line for line in result.stdout.splitlines() if line.startswith("epoch ")]  # nothing left to train


def assert_one_line_error(result, *fragments):
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(message) == 1, result.stderr
    for fragment in fragments:
        assert fragment in message[0]


def test_user_mistakes_get_one_line_errors(tmp_path, toy_model_copy, capsys):
    assert_one_line_error(run("train.py", "--set", "num_block=2"), "num_block", "num_blocks")
    assert_one_line_error(train_here(capsys, "--preset", "nope"), "nope", "toy")
    source, target = tmp_path / "a.de", tmp_path / "a.en"
    source.write_text("eins\nzwei\n")
    target.write_text("one\n")
    assert_one_line_error(train_here(capsys, "--source", str(source), "--target", str(target),
                                     "--model-dir", str(tmp_path / "m")), str(source), str(target), "2", "1")
    assert_one_line_error(train_here(capsys, "--preset", "toy", "--data", "toy", "--model-dir", str(toy_model_copy),
                                     "--set", "num_units=64"),
                          "num_units", "32", "64")
    assert_one_line_error(main_here(capsys, "translate.py", translate_cli.main,
                                    ["--model-dir", str(tmp_path / "missing"), "hallo"]), "hparams.yaml")


def test_pairs_over_maxlen_are_dropped_counted_and_samples_stay_aligned(tmp_path):
    from tf_transformer.data.corpus import Split
    from tf_transformer.hparams import load_hparams
    from tf_transformer.train.run import train

    source, target = tmp_path / "s.de", tmp_path / "s.en"
    source.write_text("a b c d e f g h\n\nich mochte ein bier\n")
    target.write_text("x\ny\ni want a beer\n")
    hp = load_hparams("toy", overrides=["maxlen=6", "num_epochs=20", "eval_every_epochs=0"])  # learnt by epoch 6
    lines = []
    train(hp, {"train": Split(str(source), str(target))}, str(tmp_path / "model"), samples=1, log=lines.append,
          export=False)
    corpus_line = [line for line in lines if line.startswith("corpus:")][0]
    assert "corpus: 1 pairs" in corpus_line and "1 with a blank side and 1 longer than maxlen=6 dropped" in corpus_line
    samples = [line.split() for line in lines if "->" in line]
    assert samples == ["ich mochte ein bier -> i want a beer".split()]


def write(path, data):
    path.write_bytes(data.encode("utf-8") if isinstance(data, str) else data)
    return str(path)


def test_data_mistakes_get_one_line_errors_and_write_nothing(tmp_path, capsys):
    """Each bad corpus is refused with the file (and line) at fault, before a model directory appears."""
    model = str(tmp_path / "model")
    good_de, good_en = write(tmp_path / "g.de", "ich mochte ein bier\n"), write(tmp_path / "g.en", "i want a beer\n")
    missing = str(tmp_path / "missing.de")
    assert_one_line_error(train_here(capsys, "--source", missing, "--target", good_en, "--model-dir", model),
                          missing, "not found")
    bad = write(tmp_path / "bad.en", b"i want a beer\n\xff\n")
    two = write(tmp_path / "two.de", "eins\nzwei\n")
    assert_one_line_error(train_here(capsys, "--source", two, "--target", bad, "--model-dir", model),
                          f"{bad}:2", "UTF-8")
    assert_one_line_error(train_here(capsys, "--preset", "toy", "--source", good_de, "--target", good_en,
                                     "--set", "maxlen=2", "--model-dir", model), good_de, "maxlen=2")
    assert_one_line_error(train_here(capsys, "--source", good_de, "--target", good_en, "--set", "vocab_size=5000",
                                     "--model-dir", model), "vocab_size=5000", "at most")
    tsv = write(tmp_path / "c.tsv", "ich\tI\nkein tab hier\n")
    assert_one_line_error(train_here(capsys, "--tsv", tsv, "--model-dir", model), f"{tsv}:2", "tab")
    assert_one_line_error(train_here(capsys, "--data", str(tmp_path / "nowhere"), "--model-dir", model), "nowhere")
    assert not os.path.exists(model)

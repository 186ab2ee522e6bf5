"""bench/quality.py: the keras-hub peer's training and decoding on the toy corpus, and the CLI's errors."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import quality  # noqa: E402
from bench.peers import keras_hub_missing  # noqa: E402
from tf_transformer.data import corpus, data_load  # noqa: E402
from tf_transformer.data.tokenizer import train_tokenizers  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402
from tf_transformer.train.scores import evaluate

needs_keras_hub = pytest.mark.skipif(keras_hub_missing() is not None, reason="keras-hub does not import")


@pytest.fixture(scope="module")
def toy():
    """(hp, tokenizers, examples, pairs) of the toy preset on the embedded toy corpus."""
    hp = load_hparams("toy")
    pairs = corpus.corpus_splits("toy")["train"].read().pairs
    tokenizers = train_tokenizers(hp, pairs)
    return hp, tokenizers, data_load.encode_pairs(pairs, *tokenizers, hp.maxlen), pairs


@needs_keras_hub
@pytest.mark.slow
def test_peer_trained_for_the_toy_epochs_translates_its_corpus(toy):
    hp, tokenizers, examples, pairs = toy
    model, steps, tokens, seconds = quality.train_peer(hp, examples, tokenizers, minutes=10, policy="float32")
    assert steps == hp.num_epochs  # one batch an epoch; the budget is far off
    assert tokens == quality.epochs_and_tokens(examples, hp, steps)[1]
    scores = evaluate([s for s, _ in pairs], [t for _, t in pairs],
                                 quality.peer_translate_fn(model, tokenizers, hp.maxlen))
    assert scores.bleu == pytest.approx(100.0)


@needs_keras_hub
def test_peer_stops_after_the_first_step_past_its_budget(toy):
    hp, tokenizers, examples, _ = toy
    _, steps, tokens, seconds = quality.train_peer(hp, examples, tokenizers, minutes=1e-6, policy="float32")
    assert steps == 1 and seconds >= 1e-6 * 60
    assert tokens == quality.epochs_and_tokens(examples, hp, 1)[1] > 0


def test_a_missing_corpus_is_one_error_line(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    assert quality.main(["--data", missing, "--minutes", "1", "--contenders", "ours"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --data") and missing in err[0]


def test_a_corpus_without_test_split_is_refused(tmp_path, capsys):
    for lang in ("de", "en"):
        (tmp_path / f"train.{lang}").write_text("a\n")
    assert quality.main(["--data", str(tmp_path), "--minutes", "1", "--contenders", "ours"]) == 2
    assert "no test split" in capsys.readouterr().err


def test_an_existing_run_directory_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "out"
    (out / "toy-copy" / "ours").mkdir(parents=True)
    (out / "toy-copy" / "ours" / "checkpoint").write_text("")
    data = tmp_path / "toy-copy"
    data.mkdir()
    for split in ("train", "test"):
        for lang in ("de", "en"):
            (data / f"{split}.{lang}").write_text("a\n")
    assert quality.main(["--data", str(data), "--minutes", "1", "--out", str(out), "--contenders", "ours"]) == 2
    assert "--overwrite" in capsys.readouterr().err


@pytest.mark.parametrize("args, fault", [(["--minutes", "0"], "--minutes"),
                                         (["--minutes", "1", "--contenders", "ours,fairseq"], "fairseq")])
def test_bad_flags_are_refused(args, fault, capsys):
    with pytest.raises(SystemExit) as raised:
        quality.parse_args(["--data", "toy"] + args)
    assert raised.value.code == 2 and fault in capsys.readouterr().err


def test_two_corpora_of_one_name_are_refused(tmp_path, capsys):
    for parent in ("a", "b"):
        data = tmp_path / parent / "corpus"
        data.mkdir(parents=True)
        for split in ("train", "test"):
            for lang in ("de", "en"):
                (data / f"{split}.{lang}").write_text("a\n")
    args = ["--data", str(tmp_path / "a" / "corpus"), "--data", str(tmp_path / "b" / "corpus"), "--minutes", "1",
            "--out", str(tmp_path / "out"), "--contenders", "ours"]
    assert quality.main(args) == 2
    assert "same name corpus" in capsys.readouterr().err


def test_keras_hub_not_installed_is_one_error_line(monkeypatch, capsys):
    monkeypatch.setattr(quality, "keras_hub_missing", lambda: "ModuleNotFoundError: No module named 'keras_hub'")
    assert quality.main(["--data", "toy", "--minutes", "1", "--contenders", "keras-hub"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keras-hub does not import" in err[0] and "bench/requirements.txt" in err[0]

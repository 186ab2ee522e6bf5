"""The model directory that release 0.1.0 wrote (``tests/fixtures/release-0.1.0``) loads, translates as
it did then, and resumes training: moving or renaming modules must not break what users have on disk."""

import contextlib
import io
import os
import shutil

import keras
import pytest

from tf_transformer.cli import train as train_cli
from tf_transformer.cli import translate as translate_cli
from tf_transformer.nn import model, modules  # noqa: F401  (registers the Keras names)
from tf_transformer.train import schedules

FIXTURE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "release-0.1.0")


def _fixture_file(name):
    with open(os.path.join(FIXTURE, name), encoding="utf-8") as f:
        return f.read()


@pytest.fixture
def release_dir(tmp_path):
    """A copy of the release's model directory (a test may write into it)."""
    return shutil.copytree(os.path.join(FIXTURE, "model"), tmp_path / "model")


def _translate(model_dir, *flags):
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = translate_cli.main(["--model-dir", os.fspath(model_dir),
                                   "--input", os.path.join(FIXTURE, "sources.txt"), *flags])
    assert code == 0
    return out.getvalue()


def test_greedy_translations_are_the_release_s(release_dir):
    assert _translate(release_dir, "--beam-size", "1") == _fixture_file("greedy.txt")


def test_beam_nbest_is_the_release_s(release_dir):
    """The same hypotheses in the same order; the scores (4 decimals) to within 1e-3, as another CPU may round."""
    got = [line.split("\t") for line in _translate(release_dir, "--beam-size", "4", "--nbest", "2").splitlines()]
    want = [line.split("\t") for line in _fixture_file("beam-nbest2.txt").splitlines()]
    assert [(g[0], g[2]) for g in got] == [(w[0], w[2]) for w in want]
    assert [float(g[1]) for g in got] == pytest.approx([float(w[1]) for w in want], abs=1e-3)


def test_keras_registered_names_are_the_release_s():
    for name in _fixture_file("registered-names.txt").split():
        assert keras.saving.get_registered_object(name) is not None, name


def test_training_resumes_from_the_release_s_checkpoint(release_dir):
    with contextlib.redirect_stdout(io.StringIO()) as log:
        code = train_cli.main(["--config", os.fspath(release_dir / "hparams.yaml"), "--data", "toy",
                               "--model-dir", os.fspath(release_dir), "--set", "num_epochs=151",
                               "--samples", "0", "--no-export", "--no-progress"])
    assert code == 0, log.getvalue()
    assert f"resumed from {release_dir / 'ckpt-150'} (step 150, epoch 151, batch 0)" in log.getvalue()
    assert (release_dir / "ckpt-151.index").exists()

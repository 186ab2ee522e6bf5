"""The tiny trained model and its export that the export, serving and translate.py tests share
(not tests themselves)."""

import contextlib
import io
import os

from tf_transformer.cli import train as train_cli
from tf_transformer.infer import export

# The seeds' toy corpus, which the model below learns exactly.
TOY = {
    "ich mochte ein bier": "i want a beer",
    "ich mochte ein cola": "i want a coke",
    "ich mochte ein orangensaft": "i want a orange juice",
}
_DONE = ".done"


def toy_model_dir(tmp_path_factory):
    """A model directory of the ``toy`` preset (2 blocks x 32 units, maxlen 20, beam size 4) with
    a 40-piece SentencePiece tokenizer, trained on the toy corpus.

    Made once per test session in pytest's base temporary directory: the
    module-scoped fixtures of several test files call this, later ones reuse it.
    """
    path = tmp_path_factory.getbasetemp() / "toy-sentencepiece-model"
    if not (path / _DONE).exists():
        with contextlib.redirect_stdout(io.StringIO()) as log:
            code = train_cli.main(["--preset", "toy", "--data", "toy", "--model-dir", str(path),
                               "--set", "tokenizer=sentencepiece", "--set", "vocab_size=40",
                               "--set", "num_epochs=60", "--set", "eval_every_epochs=0",
                               "--samples", "0", "--no-export", "--no-progress"])
        assert code == 0, log.getvalue()
        (path / _DONE).write_text("")
    return os.fspath(path)


def toy_export(tmp_path_factory):
    """The SavedModel of :func:`toy_model_dir` (the version folder), exported once per test session,
    with the XLA-compiled signature too."""
    export_dir = tmp_path_factory.getbasetemp() / "toy-sentencepiece-export"
    if not (export_dir / _DONE).exists():
        path = export.export_model_dir(toy_model_dir(tmp_path_factory), os.fspath(export_dir), xla=True)
        assert path == os.fspath(export_dir / "1")
        (export_dir / _DONE).write_text("")
    return os.fspath(export_dir / "1")

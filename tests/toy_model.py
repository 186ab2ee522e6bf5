"""The tiny trained models that many test files share (not tests themselves): the toy model and its
export that the export, serving and translate.py tests use, and the toy ``train.py`` run of the
end-to-end and evaluation tests.

Each is made once per test session, by whichever test process asks first, in the base temporary
directory that pytest-xdist's processes share. Every process works on a copy of its own of the toy
model and export (tests lock, export from and write into the model directory, which two processes
must not do to one directory); the ``train.py`` run is read where it was made, since its output names
its paths.
"""

import contextlib
import dataclasses
import fcntl
import io
import os
import shutil
import subprocess
import sys

from tf_transformer.cli import train as train_cli
from tf_transformer.infer import export

# The seeds' toy corpus, which the model below learns exactly.
TOY = {
    "ich mochte ein bier": "i want a beer",
    "ich mochte ein cola": "i want a coke",
    "ich mochte ein orangensaft": "i want a orange juice",
}
_DONE = ".done"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _made_once(tmp_path_factory, name, make):
    """The directory ``make(path)`` writes at ``path``, made once per session in the directory every test
    process shares (pytest-xdist's processes each have a base temporary directory below it).

    The first process to take the lock beside it makes it; the others wait for it.
    """
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / name
    with open(f"{shared}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (shared / _DONE).exists():
            shutil.rmtree(shared, ignore_errors=True)
            make(shared)
            (shared / _DONE).write_text("")
    return shared


def _own_copy(tmp_path_factory, name, make):
    """This test process's copy of :func:`_made_once`'s directory."""
    own = tmp_path_factory.getbasetemp() / name
    if not (own / _DONE).exists():
        shared = _made_once(tmp_path_factory, name, make)
        if shared != own:
            shutil.copytree(shared, own, dirs_exist_ok=True)
    return own


def _train(path):
    with contextlib.redirect_stdout(io.StringIO()) as log:
        code = train_cli.main(["--preset", "toy", "--data", "toy", "--model-dir", str(path),
                               "--set", "tokenizer=sentencepiece", "--set", "vocab_size=40",
                               "--set", "num_epochs=60", "--set", "eval_every_epochs=0",
                               "--samples", "0", "--no-export", "--no-progress"])
    assert code == 0, log.getvalue()


def toy_model_dir(tmp_path_factory):
    """A model directory of the ``toy`` preset (2 blocks x 32 units, maxlen 20, beam size 4) with
    a 40-piece SentencePiece tokenizer, trained on the toy corpus: this test process's copy."""
    return os.fspath(_own_copy(tmp_path_factory, "toy-sentencepiece-model", _train))


def toy_export(tmp_path_factory):
    """The SavedModel of :func:`toy_model_dir` (the version folder), with the XLA-compiled signature too:
    this test process's copy."""
    model_dir = toy_model_dir(tmp_path_factory)

    def make(export_dir):
        path = export.export_model_dir(model_dir, os.fspath(export_dir), xla=True)
        assert path == os.fspath(export_dir / "1")

    return os.fspath(_own_copy(tmp_path_factory, "toy-sentencepiece-export", make) / "1")


def run_script(script, *args, stdin=None, env=None):
    """``python SCRIPT ARGS`` of the checkout's top level (train.py, translate.py) in a fresh process, as a user
    runs it (in ``env``, else this process's environment with TensorFlow's C++ log off): the
    :class:`subprocess.CompletedProcess`, its output as text."""
    env = env or {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, os.path.join(ROOT, script), *args], input=stdin,
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def main_here(capsys, script, main, argv):
    """``script``'s ``main(argv)`` called in this process (a TensorFlow import fewer than :func:`run_script`), its
    output read with pytest's ``capsys``: :class:`subprocess.CompletedProcess` as :func:`run_script` gives it."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess([script, *argv], code, out, err)


def train_here(capsys, *argv):
    """train.py's ``main`` called in this process (:func:`main_here`)."""
    return main_here(capsys, "train.py", train_cli.main, argv)


@dataclasses.dataclass(frozen=True)
class TrainPyRun:
    """A finished ``train.py`` process: the model directory it wrote and what it printed."""
    model_dir: str
    returncode: int
    stdout: str
    stderr: str


def toy_train_py_run(tmp_path_factory):
    """``train.py --preset toy --data toy --set eval_every_epochs=50``: the preset's 150 steps (one batch an
    epoch) with dev evaluations at steps 50, 100 and 150 and the export at the end, in a fresh process.

    Shared by the test processes as it is: copy the model directory before changing it.
    """
    def make(path):
        path.mkdir()
        result = run_script("train.py", "--preset", "toy", "--data", "toy", "--model-dir", str(path / "model"),
                            "--set", "eval_every_epochs=50")
        for name in ("returncode", "stdout", "stderr"):
            (path / name).write_text(str(getattr(result, name)))

    path = _made_once(tmp_path_factory, "toy-train-py-run", make)
    return TrainPyRun(model_dir=os.fspath(path / "model"), returncode=int((path / "returncode").read_text()),
                      stdout=(path / "stdout").read_text(), stderr=(path / "stderr").read_text())

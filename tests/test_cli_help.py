"""Every command line of the package answers ``--help`` with its usage, and exit code 0; each answers ``--help``
and a usage error without importing TensorFlow."""

import importlib
import os
import subprocess
import sys

import pytest

from tests.test_serving import odd_server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMANDS = [
    ("tf_transformer.cli.train", []),
    ("tf_transformer.cli.translate", []),
    ("tf_transformer.cli.export", []),
    ("tf_transformer.cli.average", []),
    ("tf_transformer.cli.plots", []),
    ("tf_transformer.cli.datasets", []),
    ("tf_transformer.cli.datasets", ["build"]),  # argparse expands each "%" of a sub-command's help
]


@pytest.mark.parametrize("module, prefix", COMMANDS, ids=[" ".join([m] + p) for m, p in COMMANDS])
def test_help_prints_usage_and_exits_0(module, prefix, capsys):
    parse_args = importlib.import_module(module).parse_args
    with pytest.raises(SystemExit) as exit_:
        parse_args(prefix + ["--help"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("usage:")


@pytest.fixture(scope="module")
def no_tensorflow(tmp_path_factory):
    """An environment in which ``import tensorflow`` fails: a package of that name, first on the path, raises."""
    shadow = tmp_path_factory.mktemp("shadow") / "tensorflow"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('tensorflow imported')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shadow.parent), ROOT])}
    refused = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True, env=env)
    assert "tensorflow imported" in refused.stderr  # the shadow works
    return env


EXPORT, AVERAGE, PLOTS, DATASETS = (["-m", f"tf_transformer.cli.{name}"]
                                    for name in ("export", "average", "plots", "datasets"))


@pytest.mark.parametrize("command, args, code, out, err", [
    (["train.py"], ["--help"], 0, "usage: train.py", ""),
    (["train.py"], ["--strategy", "nccl"], 2, "", "argument --strategy: invalid choice: 'nccl'"),
    (["train.py"], ["--samples", "-1"], 2, "", "error: --samples -1: must be 0 or more"),
    (["train.py"], ["--init-from", "no-such-dir", "--model-dir", "new"], 2, "",
     "error: --init-from no-such-dir: not a model directory that train.py wrote (no hparams.yaml there)"),
    (["translate.py"], ["--help"], 0, "usage: translate.py", ""),
    (["translate.py"], ["--model-dir", "m", "--beam-size", "65", "Hallo"], 2, "",
     "error: --beam-size 65: must be between 1 and 64"),
    (["translate.py"], ["--model-dir", "m", "--seed", "3", "Hallo"], 2, "",
     "error: --seed 3: only with --sampling-topk"),
    (EXPORT, ["--help"], 0, "usage: python -m tf_transformer.cli.export", ""),
    (EXPORT, ["--model-dir", "m", "--format", "ctranslate2", "--xla"], 2, "",
     "error: --xla: not an option of --format ctranslate2"),
    (EXPORT, ["--model-dir", "m", "--precision", "int8"], 2, "", "argument --precision: invalid choice: 'int8'"),
    (AVERAGE, ["--help"], 0, "usage: python -m tf_transformer.cli.average", ""),
    (AVERAGE, ["--model-dir", "m"], 2, "", "the following arguments are required: --last"),
    (PLOTS, ["--help"], 0, "usage: python -m tf_transformer.cli.plots", ""),
    (PLOTS, ["positional-encoding", "--length", "0"], 2, "", "error: --length 0: must be at least 1"),
    (PLOTS, ["curves", "no-such-dir"], 2, "", "error: no-such-dir: no such model directory"),
    (DATASETS, ["build", "--help"], 0, "usage: python -m tf_transformer.cli.datasets build", ""),
    (DATASETS, ["build", "debian-de-en", "--out", "o", "--dev-size", "-1"], 2, "",
     "--dev-size and --test-size must be 0 or more"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_help_and_usage_errors_come_before_tensorflow(no_tensorflow, command, args, code, out, err):
    result = subprocess.run([sys.executable, *command, *args], capture_output=True, text=True, env=no_tensorflow,
                            cwd=ROOT, timeout=60)
    assert result.returncode == code, result.stderr
    assert result.stdout.startswith(out) and err in result.stderr
    assert "tensorflow imported" not in result.stderr


def test_translate_py_rest_needs_no_tensorflow(no_tensorflow):
    """A client of TF Serving's REST API translates without importing TensorFlow (gRPC's protos do import it)."""
    body = b'{"outputs": {"translations": ["a beer"], "scores": [-1.0]}}'
    with odd_server(body) as url:
        result = subprocess.run([sys.executable, "translate.py", "--rest", url, "ein Bier"], capture_output=True,
                                text=True, env=no_tensorflow, cwd=ROOT, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "a beer\n" and "tensorflow imported" not in result.stderr


def test_a_run_does_import_tensorflow(no_tensorflow, tmp_path):
    """The same environment stops a command that gets past its arguments: the test above can fail."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "--model-dir", str(tmp_path), "Hallo"],
                            capture_output=True, text=True, env=no_tensorflow, cwd=ROOT, timeout=60)
    assert result.returncode != 0 and "tensorflow imported" in result.stderr

"""Every command line of the package answers ``--help`` with its usage, and exit code 0; ``train.py`` and
``translate.py`` answer ``--help`` and a usage error without importing TensorFlow."""

import importlib
import os
import subprocess
import sys

import pytest

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


@pytest.mark.parametrize("command, args, code, out, err", [
    ("train.py", ["--help"], 0, "usage: train.py", ""),
    ("train.py", ["--strategy", "nccl"], 2, "", "argument --strategy: invalid choice: 'nccl'"),
    ("train.py", ["--samples", "-1"], 2, "", "error: --samples -1: must be 0 or more"),
    ("translate.py", ["--help"], 0, "usage: translate.py", ""),
    ("translate.py", ["--model-dir", "m", "--beam-size", "65", "Hallo"], 2, "",
     "error: --beam-size 65: must be between 1 and 64"),
    ("translate.py", ["--model-dir", "m", "--seed", "3", "Hallo"], 2, "", "error: --seed 3: only with --sampling-topk"),
])
def test_help_and_usage_errors_come_before_tensorflow(no_tensorflow, command, args, code, out, err):
    result = subprocess.run([sys.executable, os.path.join(ROOT, command), *args], capture_output=True, text=True,
                            env=no_tensorflow, cwd=ROOT, timeout=60)
    assert result.returncode == code, result.stderr
    assert result.stdout.startswith(out) and err in result.stderr
    assert "tensorflow imported" not in result.stderr


def test_a_run_does_import_tensorflow(no_tensorflow, tmp_path):
    """The same environment stops a command that gets past its arguments: the test above can fail."""
    result = subprocess.run([sys.executable, os.path.join(ROOT, "translate.py"), "--model-dir", str(tmp_path), "Hallo"],
                            capture_output=True, text=True, env=no_tensorflow, cwd=ROOT, timeout=60)
    assert result.returncode != 0 and "tensorflow imported" in result.stderr

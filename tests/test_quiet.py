"""A quiet start (:mod:`tf_transformer.quiet`): translate.py's standard error holds none of TensorFlow's
start-up notices (asserted by test_end_to_end.py's fresh translate.py process), ``--verbose`` brings them back,
a child process inherits the choice, and the filter drops only the notices."""

import os
import re
import subprocess
import sys

import pytest

from tests.toy_model import TOY
from tf_transformer import quiet

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What TensorFlow prints on a CPU machine at start-up (absl's log lines, oneDNN, CUDA, CPU features).
TF_NOTICE = re.compile(r"E0000|W0000|I0000|cuInit|cuda|oneDNN|port\.cc|cpu_feature_guard|absl|This TensorFlow binary",
                       re.IGNORECASE)


def user_env(**extra):
    """The environment of a user who set neither TF_CPP_MIN_LOG_LEVEL nor the quiet choice."""
    env = {name: value for name, value in os.environ.items() if name not in (quiet.LOG_LEVEL, quiet.QUIET)}
    return {**env, "PYTHONPATH": ROOT, **extra}


def run(*argv, env=None):
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env=env or user_env())


def notices(stderr):
    return [line for line in stderr.splitlines() if TF_NOTICE.search(line)]


@pytest.mark.slow  # a translate.py process (and training the shared model when it runs first)
def test_translate_prints_tensorflow_notices_when_verbose(toy_dir):
    """``--verbose`` brings TensorFlow's start-up notices back (without it there are none: test_end_to_end.py's
    fresh translate.py process, run in :func:`user_env`, asserts it, a process fewer)."""
    beer = list(TOY)[0]
    verbose = run("translate.py", "--verbose", "--model-dir", toy_dir, beer)
    assert verbose.returncode == 0, verbose.stderr
    assert verbose.stdout == TOY[beer] + "\n"
    assert re.search(r"^[IWE]0000 .*\.cc:\d+\] ", verbose.stderr, re.MULTILINE), verbose.stderr


def test_a_child_of_a_quiet_command_imports_tensorflow_quietly():
    env = user_env(**{quiet.QUIET: "1", quiet.LOG_LEVEL: quiet.QUIET_LOG_LEVEL})
    done = run("-c", "import tf_transformer, tensorflow; tensorflow.config.list_physical_devices(); print('ok')",
               env=env)
    assert (done.returncode, done.stdout, notices(done.stderr)) == (0, "ok\n", []), done.stderr


def test_the_filter_drops_the_notices_and_passes_everything_else(capfd):
    lines = [b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n",
             b"I0000 00:00:1795653726.780369    5081 port.cc:153] oneDNN custom operations are on.\n",
             b"our own line\n",
             b"I0000 00:00:1795653726.780668    5081 cudart_stub.cc:31] Could not find cuda drivers on your machine\n",
             b"E0000 00:00:1795653811.669873    7546 cuda_platform.cc:52] failed call to cuInit: INTERNAL\n",
             b"E0000 00:00:1795653811.779810    7546 util.cc:131] oneDNN supports DT_INT64 only on platforms\n",
             b"E0000 00:00:1795653811.779810    7546 saver.cc:12] a real error\n",
             b"no newline at the end"]
    with quiet.filtered_stderr():
        for line in lines:
            os.write(2, line)
    os.write(2, b"\nafter\n")
    assert capfd.readouterr().err == ("our own line\n"
                                      "E0000 00:00:1795653811.779810    7546 saver.cc:12] a real error\n"
                                      "no newline at the end" "\nafter\n")

"""Python's garbage collector set for TensorFlow's many objects (:mod:`tf_transformer.collector`): every command's
process collects less often than CPython's defaults, and a threshold set higher is kept."""

import gc
import json
import subprocess
import sys

import pytest

from tests.toy_model import ROOT
from tf_transformer.collector import THRESHOLDS, collect_less_often


@pytest.fixture
def thresholds():
    """Puts the test process's thresholds back after the test."""
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


def test_each_threshold_is_raised_to_the_least_and_a_higher_one_kept(thresholds):
    gc.set_threshold(700, 10, 10)  # CPython's defaults
    assert collect_less_often() == gc.get_threshold() == (50_000, 20, 20)
    gc.set_threshold(100_000, 5, 50)
    assert collect_less_often() == gc.get_threshold() == (100_000, 20, 50)


# A fresh process as train.py and translate.py start: tf_transformer.cli first, TensorFlow's import after it.
COMMAND_PROCESS = """
import gc, json, sys
before = gc.get_threshold()
import tf_transformer.cli
print(json.dumps({"before": before, "after": gc.get_threshold(), "tensorflow": "tensorflow" in sys.modules}))
"""


def test_a_command_process_collects_less_often_than_python_s_defaults():
    done = subprocess.run([sys.executable, "-c", COMMAND_PROCESS], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    process = json.loads(done.stdout)
    assert process["before"] == [700, 10, 10]  # CPython's defaults, in a process that did not start as a test's
    assert process["after"] == list(THRESHOLDS)
    assert not process["tensorflow"]  # set before TensorFlow's import, whose collections it saves

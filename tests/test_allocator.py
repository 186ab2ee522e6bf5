"""TensorFlow's CPU tensors from its BFC allocator (:mod:`tf_transformer.allocator`): every command's process
has it unless the user's environment says otherwise, and TensorFlow then reuses a freed buffer."""

import json
import os
import subprocess
import sys

from tests.toy_model import ROOT
from tf_transformer import allocator

# A command's process as train.py and translate.py start it (tf_transformer.cli first), then 61 MB tensors made
# and freed three times: what TensorFlow's CPU allocator reports (its stats exist for the BFC allocator and
# oneDNN's, not for malloc).
COMMAND_PROCESS = """
import json, os, resource
import tf_transformer.cli
import tensorflow as tf

def faults_of_a_large_tensor():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    tf.fill([3800, 4000], 1.0).numpy()  # 61 MB, over glibc's largest mmap threshold (32 MiB)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

faults = [faults_of_a_large_tensor() for _ in range(3)]
try:
    info = tf.config.experimental.get_memory_info("CPU:0")
except ValueError as e:  # "Allocator stats not available for device 'CPU:0'": malloc's allocator
    info = str(e)
print(json.dumps({"env": os.environ.get("TF_CPU_ALLOCATOR_USE_BFC"), "info": info, "faults": faults}))
"""


def command_process(**env):
    """What :data:`COMMAND_PROCESS` prints, run with the test's environment less the allocator's variable,
    plus ``env``."""
    base = {name: value for name, value in os.environ.items() if name != allocator.USE_BFC}
    done = subprocess.run([sys.executable, "-c", COMMAND_PROCESS], capture_output=True, text=True, cwd=ROOT,
                          timeout=300, env={**base, "PYTHONPATH": ROOT, **env})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_reuse_cpu_memory_turns_the_bfc_allocator_on_unless_the_environment_says(monkeypatch):
    monkeypatch.delenv(allocator.USE_BFC, raising=False)
    assert allocator.reuse_cpu_memory() == "true"
    assert os.environ[allocator.USE_BFC] == "true"
    monkeypatch.setenv(allocator.USE_BFC, "false")
    assert allocator.reuse_cpu_memory() == "false"
    assert os.environ[allocator.USE_BFC] == "false"


def huge_pages_always(path="/sys/kernel/mm/transparent_hugepage/enabled"):
    """Whether the kernel backs every large mapping with 2 MiB pages (then a fresh 61 MB buffer faults ~30 times,
    not ~15,000)."""
    try:
        with open(path) as f:
            return "[always]" in f.read()
    except OSError:
        return False


def test_a_command_process_reuses_a_freed_large_buffer_and_false_keeps_malloc():
    bfc = command_process()
    assert bfc["env"] == "true"
    assert isinstance(bfc["info"], dict) and bfc["info"]["peak"] >= 3800 * 4000 * 4, bfc
    # oneDNN off: on CPUs where TensorFlow turns it on by default (AVX-512 VNNI or bfloat16 instructions), its CPU
    # allocator is oneDNN's, which keeps large buffers whatever the variable says (the module docstring).
    kept = command_process(**{allocator.USE_BFC: "false", "TF_ENABLE_ONEDNN_OPTS": "0"})
    assert kept["env"] == "false" and "not available" in kept["info"], kept
    if sys.platform != "linux" or huge_pages_always():
        return  # the page faults below are those of glibc's mmap of a large buffer in 4 KiB pages
    # The first tensor takes fresh pages (a fault each 4 KiB: ~15,000 for 61 MB); the BFC allocator's later
    # ones reuse them, malloc's are mapped and unmapped each time (~1,000 faults a call are not the tensor's).
    assert bfc["faults"][0] > 10_000 and max(bfc["faults"][1:]) < 5000, bfc
    assert min(kept["faults"]) > 10_000, kept

"""Fixtures shared by several test files: the tiny trained toy model of :mod:`tests.toy_model`."""

import ctypes.util
import os

import pytest

from tf_transformer.collector import collect_less_often

# No persistent XLA cache for the tests' many tiny models (tf_transformer.train.xla_cache keeps a user's choice;
# an empty directory is TensorFlow's "none"): they would fill ~/.cache/tf-transformer/xla run after run.
os.environ.setdefault("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=")
# XLA's LLVM back end without its optimization passes, and its fusions emitted by the elemental IR emitter instead
# of the newer MLIR fusion emitters (the test processes and the train.py, translate.py and C programs they start
# inherit both): the same HLO programs, their machine code unoptimized, compiled in about half the time
# (test_bucketed_decoding.py 175 -> 120 s of CPU on an AVX2 EPYC; then 136 -> 97 s without the fusion emitters); the
# tests' tiny models run in microseconds.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false")
# jemalloc for the test processes pytest-xdist starts after this and every process they start, where the system has
# it (Debian's libjemalloc2; .ci/run installs it): importing graphs, Grappler and XLA's compiler make and free
# millions of small C++ objects, and glibc's malloc and free were a fifth of an XLA compile's CPU samples. The same
# graphs and numbers (TensorFlow's tensors keep their own allocator, tf_transformer/allocator.py); test_export.py
# and test_bucketed_decoding.py in one process: 364 -> 328 s of CPU on the AVX2-only EPYC. The tests' processes
# only: not measured for users' commands (a toy train.py process, all tracing: no change).
_JEMALLOC = ctypes.util.find_library("jemalloc")
if _JEMALLOC and "LD_PRELOAD" not in os.environ:
    os.environ["LD_PRELOAD"] = _JEMALLOC
# Python's garbage collector as every command sets it (tf_transformer.collector: the test processes run the library
# as the commands do; the processes they start get it from tf_transformer.cli).
collect_less_often()

# The files that take longest (toy trainings, train.py and translate.py processes, XLA compiles), longest first:
# README's test command (`-n auto --dist loadfile --no-loadscope-reorder`) hands files to the test processes in
# collection order, so these start first and the many quick files fill in at the end, and both processes finish
# together. (xdist's default order, most tests first, left the few-test, long files such as the two-worker and
# resume runs to the end, where one process ran them while the other had nothing left.)
LONGEST_FIRST = [
    "test_end_to_end.py", "test_export.py", "test_reliability.py", "test_bucketed_decoding.py",
    "test_distribute.py", "test_export_precision.py", "test_train_resume_stream.py", "test_training.py",
    "test_train_resume.py", "test_bench_real_batches.py", "test_average.py", "test_accumulate.py",
    "test_c_loader.py", "test_distribute_stream.py", "test_train_eval.py", "test_serving.py", "test_schedules.py",
    "test_quiet.py", "test_quality.py", "test_alignments.py", "test_train_budget.py", "test_walkthrough.py",
    "test_bench_torch.py", "test_ct2_convert.py", "test_precision.py", "test_fused_update.py",
    "test_defaults_bench.py", "test_decoding.py", "test_beam_search.py",
]


def pytest_collection_modifyitems(items):
    """Collected items in :data:`LONGEST_FIRST`'s order of their files, then the other files' (a stable sort)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def toy_dir(tmp_path_factory):
    """The trained toy model directory (:func:`tests.toy_model.toy_model_dir`)."""
    # Imported here, not at the top: pytest-xdist's controller process imports this file too, and TensorFlow's
    # import would cost it 8 s of CPU for nothing while the test processes start.
    from tests.toy_model import toy_model_dir
    return toy_model_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def toy_loaded(toy_dir):
    """:class:`~tf_transformer.infer.load.LoadedModel` of :func:`toy_dir`."""
    from tf_transformer.infer.load import load_for_inference
    return load_for_inference(toy_dir)

"""A quiet start: TensorFlow's start-up notices kept off a CPU user's standard error.

Importing TensorFlow prints, twice (``_pywrap_cpu_feature_guard.so`` and
``_pywrap_profiler_plugin.so`` each carry their own copy of TensorFlow's logging,
whose static initialisers run as each library loads, before absl's logging is
set up, so ``TF_CPP_MIN_LOG_LEVEL`` does not hold them back)::

  WARNING: All log messages before absl::InitializeLog() is called are written to STDERR
  I0000 ... port.cc:153] oneDNN custom operations are on. ...
  I0000 ... cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU will not be used.

and later, at the first device set-up and the first decoding, ``E0000 ...
cuda_platform.cc:52] failed call to cuInit ...`` and ``E0000 ... util.cc:131]
oneDNN supports DT_INT64 only on platforms with AVX-512 ...``, which
``TF_CPP_MIN_LOG_LEVEL=3`` does hold back.

:func:`quiet_tensorflow` (which :mod:`tf_transformer.cli` calls before anything
imports TensorFlow) sets ``TF_CPP_MIN_LOG_LEVEL=3`` and filters file descriptor
2 while TensorFlow is imported: lines matching :data:`NOTICES` are dropped,
everything else passes unchanged. It does nothing with ``--verbose`` or when
the user set ``TF_CPP_MIN_LOG_LEVEL``. The choice goes to child processes in
:data:`QUIET` (with ``TF_CPP_MIN_LOG_LEVEL``): one that imports this package
filters its own import of TensorFlow too (:func:`filter_tensorflow_import`).
"""

import contextlib
import importlib.abc
import importlib.util
import os
import re
import sys
import threading

# "1": filter TensorFlow's start-up notices; "0": --verbose, show them. Inherited by child processes.
QUIET = "TF_TRANSFORMER_QUIET"
LOG_LEVEL = "TF_CPP_MIN_LOG_LEVEL"
QUIET_LOG_LEVEL = "3"  # the E0000 cuInit and oneDNN DT_INT64 notices are errors; 2 would show them
VERBOSE_HELP = "show TensorFlow's start-up and C++ log lines (hidden by default)"

# TensorFlow's notices to a CPU user: the pre-absl warning, and log lines about oneDNN, CUDA and CPU features.
NOTICES = re.compile(rb"^WARNING: All log messages before absl::InitializeLog\(\) is called"
                     rb"|^[IWE]\d{4} [\d:. ]+\d+ \w+\.cc:\d+\] .*(oneDNN|cuda|CUDA|cuInit|GPU|TensorRT|CPU instructions)"
                     rb"|^To enable the following instructions:")


def quiet_tensorflow(verbose=False):
    """Keeps TensorFlow's notices off standard error unless ``verbose`` or the user set ``TF_CPP_MIN_LOG_LEVEL``
    (a parent command's choice, in :data:`QUIET`, holds). Call it before TensorFlow is imported."""
    if verbose:
        os.environ[QUIET] = "0"
    if os.environ.get(QUIET, "0" if LOG_LEVEL in os.environ else "1") == "0":
        return
    os.environ.setdefault(LOG_LEVEL, QUIET_LOG_LEVEL)
    os.environ.setdefault(QUIET, "1")
    filter_tensorflow_import()


def filter_tensorflow_import():
    """When :data:`QUIET` is ``"1"``, the coming ``import tensorflow`` runs with :func:`filtered_stderr`
    (nothing to do once TensorFlow is imported)."""
    if os.environ.get(QUIET) != "1" or "tensorflow" in sys.modules \
            or any(isinstance(finder, _FilteredImport) for finder in sys.meta_path):
        return
    sys.meta_path.insert(0, _FilteredImport())


@contextlib.contextmanager
def filtered_stderr(drop=NOTICES):
    """File descriptor 2 goes through a pipe: lines matching ``drop`` are dropped, the others pass unchanged
    (nothing is filtered where there is no file descriptor 2)."""
    _flush_stderr()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    copier = threading.Thread(target=_copy_lines, args=(read_end, saved, drop), name="quiet-stderr", daemon=True)
    copier.start()
    try:
        yield
    finally:
        _flush_stderr()
        os.dup2(saved, 2)  # closes the pipe's last write end: the copier reads to the end and stops
        copier.join()
        os.close(read_end)
        os.close(saved)


def _flush_stderr():
    """Writes out what Python holds for standard error, so it goes where file descriptor 2 is now."""
    if sys.stderr is not None:
        sys.stderr.flush()


def _copy_lines(read_end, out, drop):
    """Copies the lines read from ``read_end`` to ``out``, except those matching ``drop``."""
    pending = b""
    while chunk := os.read(read_end, 65536):
        *lines, pending = (pending + chunk).split(b"\n")
        _write(out, [line + b"\n" for line in lines if not drop.search(line)])
    if pending and not drop.search(pending):
        _write(out, [pending])


def _write(fd, lines):
    data = b"".join(lines)
    while data:
        data = data[os.write(fd, data):]


class _FilteredImport(importlib.abc.MetaPathFinder):
    """Finds ``tensorflow`` once, with a loader that imports it in :func:`filtered_stderr`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "tensorflow":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _FilteredLoader(spec.loader)
        return spec


class _FilteredLoader(importlib.abc.Loader):
    """``loader``, whose module runs with standard error filtered."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        with filtered_stderr():
            self.loader.exec_module(module)
        module.__spec__.loader = module.__loader__ = self.loader

    def __getattr__(self, name):
        return getattr(self.loader, name)

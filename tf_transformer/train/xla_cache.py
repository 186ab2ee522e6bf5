"""XLA's compiled computations kept between runs: TensorFlow's persistent compilation cache.

Training compiles its XLA parts (the sub-layer tails, :mod:`tf_transformer.nn.fused`, and the
loss, :mod:`tf_transformer.nn.loss`) once for every bucketed count of packed rows
(:class:`~tf_transformer.nn.modules.Packing`), about half a second each on a CPU.
TensorFlow's ``--tf_xla_persistent_cache_directory`` flag keeps them on disk, and a later run
of the same sizes on the same machine loads them: measured a third to a fifth of the first
compile (the TensorFlow-to-XLA translation still runs). The flag is read at the first compile of
the process, so :func:`use_persistent_cache` is called before any. Each run adds what it compiled
(about 6 MB for README command 1), so the cache is kept to :data:`KEEP_BYTES` (:func:`prune`).
"""

import os

from tf_transformer.train.precision import cache_path

FLAG = "--tf_xla_persistent_cache_directory"
# The cache's size after :func:`prune`: the programs of a few dozen runs. A program pruned is compiled again.
KEEP_BYTES = 256 * 2**20


def cache_directory():
    """``$XDG_CACHE_HOME/tf-transformer/xla`` (``~/.cache`` by default), beside the precision cache."""
    return os.path.join(os.path.dirname(cache_path()), "xla")


def use_persistent_cache(directory=None):
    """Adds :data:`FLAG` for ``directory`` (default :func:`cache_directory`) to ``TF_XLA_FLAGS``, unless the
    variable names a directory already (the user's choice). Returns the directory in use, or None if the
    directory cannot be made (no cache then: compiling again is only slower)."""
    flags = os.environ.get("TF_XLA_FLAGS", "")
    for flag in flags.split():
        if flag.startswith(FLAG + "="):
            return flag.split("=", 1)[1]
    directory = directory or cache_directory()
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError:
        return None
    prune(directory, KEEP_BYTES)
    os.environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={directory}".strip()
    return directory


def prune(directory, keep_bytes=KEEP_BYTES):
    """Removes the oldest-written files of ``directory`` until the others hold at most ``keep_bytes``
    (another run's removals or writes meanwhile are skipped over). Returns the number of files removed."""
    files = []
    for entry in os.scandir(directory):
        try:
            if entry.is_file(follow_symlinks=False):
                stat = entry.stat(follow_symlinks=False)
                files.append((stat.st_mtime, stat.st_size, entry.path))
        except OSError:
            continue
    total, removed = sum(size for _, size, _ in files), 0
    for _, size, path in sorted(files):
        if total <= keep_bytes:
            break
        try:
            os.remove(path)
        except OSError:
            continue
        total, removed = total - size, removed + 1
    return removed

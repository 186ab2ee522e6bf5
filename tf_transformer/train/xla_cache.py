"""XLA's compiled computations kept between runs: TensorFlow's persistent compilation cache.

Training compiles its XLA parts (the sub-layer tails, :mod:`tf_transformer.nn.fused`, and the
loss, :mod:`tf_transformer.nn.loss`) once for every bucketed count of packed rows
(:class:`~tf_transformer.nn.modules.Packing`), about half a second each on a CPU.
TensorFlow's ``--tf_xla_persistent_cache_directory`` flag keeps them on disk, and a later run
of the same sizes on the same machine loads them: measured a third to a fifth of the first
compile (the TensorFlow-to-XLA translation still runs). The flag is read at the first compile of
the process, so :func:`use_persistent_cache` is called before any.
"""

import os

from tf_transformer.train.precision import cache_path

FLAG = "--tf_xla_persistent_cache_directory"


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
    os.environ["TF_XLA_FLAGS"] = f"{flags} {FLAG}={directory}".strip()
    return directory

"""``precision: auto`` on a CPU: float32 or mixed bfloat16, whichever multiplies the model's matrices faster.

Without ``avx512_bf16`` or ``amx_bf16`` TensorFlow emulates bfloat16 on the
float32 units (several times slower): float32, nothing measured. With them,
:func:`measure_matmul_speed` times one matmul of the model's feed-forward shape
((rows, C) x (C, d_ff)) in float32 and in bfloat16, best of a few repeats
(well under a second), and mixed bfloat16 is chosen when bfloat16 is at least
:data:`BF16_MIN_SPEEDUP` times faster: a training step gains less than its
matmuls, since mixed precision keeps layer norm, softmax, the loss and the
optimizer in float32 and adds casts around them.

The figures are kept in a per-user cache file (:func:`cache_path`), keyed by
the CPU model, its speed flags, the TensorFlow version and the shape: the
machine, not the run, decides, so every run on it (and every resume of a run,
which must train in the precision it started in to stay bit-identical) makes
the same choice, and only the first one pays for the measurement.
"""

import json
import os
import time
from typing import NamedTuple

import tensorflow as tf

from tf_transformer.cpu import cpu_flags_of, cpu_model, cpu_speed_flags
from tf_transformer.files import write_atomic

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU instructions that run bfloat16 matmuls natively
BF16_MIN_SPEEDUP = 1.2  # bfloat16 matmuls must be this much faster for mixed bfloat16 to pay
MAX_ROWS = 4096  # the measured matmul's rows at most (its time stays well under a second)


class MatmulSpeed(NamedTuple):
    """GFLOP/s of one matmul shape in float32 and in bfloat16."""

    float32: float
    bfloat16: float

    @property
    def speedup(self):
        """bfloat16 over float32."""
        return self.bfloat16 / self.float32


class Choice(NamedTuple):
    """What ``precision: auto`` picked on a CPU (a Keras dtype policy name) and why, in one line."""

    policy: str
    reason: str


def matmul_shape(hp):
    """(rows, C, d_ff): the feed-forward's first matmul on a batch of ``hp``'s size (at most :data:`MAX_ROWS` rows)."""
    rows = hp.batch_tokens or hp.batch_size * hp.maxlen
    return min(rows, MAX_ROWS), hp.num_units, hp.d_ff


def matmul_gflops(dtype, shape, calls=4, repeats=5):
    """GFLOP/s of a (m, k) x (k, n) ``tf.matmul`` in ``dtype`` (``shape`` = (m, k, n)) in a ``tf.function``:
    ``calls`` calls timed together, ``repeats`` times after a warm-up call, the fastest kept."""
    m, k, n = shape
    a = tf.cast(tf.random.stateless_uniform([m, k], [1, 2]), dtype)
    b = tf.cast(tf.random.stateless_uniform([k, n], [3, 4]), dtype)
    matmul = tf.function(lambda a, b: tf.matmul(a, b)[0, 0])
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            last = matmul(a, b)
        last.numpy()
        best = min(best, (time.perf_counter() - started) / calls)
    return 2 * m * k * n / best / 1e9


def measure_matmul_speed(shape):
    """:class:`MatmulSpeed` of :func:`matmul_gflops` of ``shape`` in float32 and in bfloat16."""
    return MatmulSpeed(matmul_gflops(tf.float32, shape), matmul_gflops(tf.bfloat16, shape))


def cache_path():
    """The per-user cache file: ``$XDG_CACHE_HOME/tf-transformer/precision.json`` (``~/.cache`` by default)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tf-transformer", "precision.json")


def machine_key(shape, cpu_flags):
    """What the figures depend on: CPU model, speed flags, TensorFlow version and the matmul shape, one string."""
    return f"{cpu_model()} | {cpu_speed_flags(cpu_flags)} | TensorFlow {tf.__version__} | matmul {'x'.join(map(str, shape))}"


def _read_cache(path):
    """The cache's {key: [float32, bfloat16]}; empty when it is missing or unreadable (it is measured again)."""
    try:
        with open(path, encoding="utf-8") as f:
            entries = json.load(f)
        return entries if isinstance(entries, dict) else {}
    except (OSError, ValueError):
        return {}


def _write_cache(path, entries):
    """Writes the cache (:func:`~tf_transformer.files.write_atomic`); False when it cannot be written."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_atomic(path, json.dumps(entries, indent=1, sort_keys=True))
        return True
    except OSError:
        return False


def cached_speed(key, path, measure):
    """(:class:`MatmulSpeed`, where it came from): the cache's figures for ``key``, else ``measure()``'s, stored."""
    entries = _read_cache(path)
    entry = entries.get(key)
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in entry):
        return MatmulSpeed(*entry), f"measured earlier, cached in {path}"
    started = time.perf_counter()
    speed = measure()
    seconds = time.perf_counter() - started
    stored = _write_cache(path, {**entries, key: list(speed)})
    return speed, f"measured in {seconds:.1f}s, " + (f"cached in {path}" if stored else f"{path} not writable")


def auto_cpu_precision(shape, cpu_flags=None, measure=None, path=None):
    """The :class:`Choice` of ``precision: auto`` on a CPU for a model whose matmuls have ``shape``
    (:func:`matmul_shape`).

    Args:
      cpu_flags: the CPU's flags; /proc/cpuinfo's by default.
      measure: ``() -> MatmulSpeed``; :func:`measure_matmul_speed` of ``shape`` by default.
      path: the cache file; :func:`cache_path` by default.
    """
    flags = cpu_flags_of() if cpu_flags is None else set(cpu_flags)
    present = [flag for flag in BF16_FLAGS if flag in flags]
    if not present:
        return Choice("float32", f"auto: this CPU has no {' or '.join(BF16_FLAGS)}, flags {cpu_speed_flags(flags)}: "
                                 f"bfloat16 would be emulated, so it is not measured")
    speed, source = cached_speed(machine_key(shape, flags), path or cache_path(),
                                 measure or (lambda: measure_matmul_speed(shape)))
    figures = (f"bfloat16 matmul {speed.speedup:.2f}x float32 here ({speed.bfloat16:.0f} vs {speed.float32:.0f} "
               f"GFLOP/s, {'x'.join(map(str, shape))}, {source}; CPU has {', '.join(present)})")
    if speed.speedup >= BF16_MIN_SPEEDUP:
        return Choice("mixed_bfloat16", f"auto: {figures}")
    return Choice("float32", f"auto: {figures}, under the {BF16_MIN_SPEEDUP}x that mixed bfloat16 needs")

"""``precision: auto`` on a CPU: float32 or mixed bfloat16, whichever trains the model faster here.

Without ``avx512_bf16`` or ``amx_bf16`` TensorFlow emulates bfloat16 on the
float32 units (several times slower): float32, nothing measured. With them,
the whole training step is timed, not one matmul: mixed precision keeps layer
norm, softmax, the loss and the optimizer in float32 and adds casts around
them, so a step gains less than its matmuls, and how much less depends on the
CPU and the model (on an AMX Xeon bfloat16 matmuls ran 2.7x float32 and the
step 1.15x). :func:`tf_transformer.train.step_speed.measure_step_speed` runs a
few steps of the model on synthetic batches of its size in each precision
(10-40 seconds, once), and mixed bfloat16 is chosen when its step is at least
:data:`BF16_MIN_SPEEDUP` times faster.

The figures are kept in a per-user cache file (:func:`cache_path`), keyed by
the CPU model, its speed flags, the TensorFlow version and the model's sizes
(:func:`step_shape`): the machine, not the run, decides, so every run on it
(and every resume of a run, which must train in the precision it started in
to stay bit-identical) makes the same choice, and only the first one pays for
the measurement.
"""

import json
import os
import time
from typing import NamedTuple

import tensorflow as tf

from tf_transformer.cpu import cpu_flags_of, cpu_model, cpu_speed_flags
from tf_transformer.files import write_atomic

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU instructions that run bfloat16 matmuls natively
BF16_MIN_SPEEDUP = 1.1  # mixed bfloat16's whole step must be this much faster than float32's to be chosen
MAX_ROWS = 4096  # the measured matmul's rows at most (:func:`matmul_gflops`, the benchmarks' peak)


class StepSpeed(NamedTuple):
    """Target tokens per second of one model's training step in float32 and in mixed bfloat16."""

    float32: float
    bfloat16: float

    @property
    def speedup(self):
        """mixed bfloat16 over float32."""
        return self.bfloat16 / self.float32


class Choice(NamedTuple):
    """What ``precision: auto`` picked on a CPU (a Keras dtype policy name) and why, in one line."""

    policy: str
    reason: str


def step_shape(hp):
    """What the step's speed depends on besides the machine, one string, e.g.
    ``1+1 blocks x 256 units, 4 heads, d_ff 1024, vocab 8000, 4096 tokens a batch``."""
    batch = f"{hp.batch_tokens} tokens" if hp.batch_tokens else f"{hp.batch_size} pairs"
    return (f"{hp.num_blocks}+{hp.num_blocks} blocks x {hp.num_units} units, {hp.num_heads} heads, d_ff {hp.d_ff}, "
            f"vocab {hp.vocab_size}, {batch} a batch")


def matmul_gflops(dtype, shape, calls=4, repeats=5):
    """GFLOP/s of a (m, k) x (k, n) ``tf.matmul`` in ``dtype`` (``shape`` = (m, k, n)) in a ``tf.function``:
    ``calls`` calls timed together, ``repeats`` times after a warm-up call, the fastest kept."""
    m, k, n = shape
    a = tf.cast(tf.random.stateless_uniform([m, k], [1, 2]), dtype)
    b = tf.cast(tf.random.stateless_uniform([k, n], [3, 4]), dtype)
    matmul = tf.function(lambda a, b: tf.matmul(a, b)[0, 0], autograph=False)
    matmul(a, b).numpy()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            last = matmul(a, b)
        last.numpy()
        best = min(best, (time.perf_counter() - started) / calls)
    return 2 * m * k * n / best / 1e9


def cache_path():
    """The per-user cache file: ``$XDG_CACHE_HOME/tf-transformer/precision.json`` (``~/.cache`` by default)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "tf-transformer", "precision.json")


def machine_key(shape, cpu_flags):
    """What the figures depend on: CPU model, speed flags, TensorFlow version and the model (:func:`step_shape`)."""
    return f"{cpu_model()} | {cpu_speed_flags(cpu_flags)} | TensorFlow {tf.__version__} | step {shape}"


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
    """(:class:`StepSpeed`, where it came from): the cache's figures for ``key``, else ``measure()``'s, stored."""
    entries = _read_cache(path)
    entry = entries.get(key)
    if isinstance(entry, list) and len(entry) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in entry):
        return StepSpeed(*entry), f"measured earlier, cached in {path}"
    started = time.perf_counter()
    speed = measure()
    seconds = time.perf_counter() - started
    stored = _write_cache(path, {**entries, key: list(speed)})
    return speed, f"measured in {seconds:.1f}s, " + (f"cached in {path}" if stored else f"{path} not writable")


def auto_cpu_precision(shape, measure, cpu_flags=None, path=None):
    """The :class:`Choice` of ``precision: auto`` on a CPU for the model ``shape`` describes (:func:`step_shape`).

    Args:
      measure: ``() -> StepSpeed`` of that model
        (:func:`tf_transformer.train.step_speed.measure_step_speed`); called only where the CPU has bfloat16
        instructions and the cache has no figures for this machine and model.
      cpu_flags: the CPU's flags; /proc/cpuinfo's by default.
      path: the cache file; :func:`cache_path` by default.
    """
    flags = cpu_flags_of() if cpu_flags is None else set(cpu_flags)
    present = [flag for flag in BF16_FLAGS if flag in flags]
    if not present:
        return Choice("float32", f"auto: this CPU has no {' or '.join(BF16_FLAGS)}, flags {cpu_speed_flags(flags)}: "
                                 f"bfloat16 would be emulated, so it is not measured")
    speed, source = cached_speed(machine_key(shape, flags), path or cache_path(), measure)
    figures = (f"the training step in mixed bfloat16 {speed.speedup:.2f}x float32 here ({speed.bfloat16:.0f} vs "
               f"{speed.float32:.0f} target tokens/s, {shape}, {source}; CPU has {', '.join(present)})")
    if speed.speedup >= BF16_MIN_SPEEDUP:
        return Choice("mixed_bfloat16", f"auto: {figures}")
    return Choice("float32", f"auto: {figures}, under the {BF16_MIN_SPEEDUP}x that mixed bfloat16 needs")

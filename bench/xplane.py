"""Reading the TensorFlow profiler's XPlane: the op executions of a profiled run, each with its self time.

Each op event of the host threads (named ``node name:op type``) counts its self time (its duration less the op
events nested in it on its thread); an XLA-compiled function runs no TensorFlow op events, and its kernels (one
per fusion) count as ops of type :data:`XLA_KERNEL`, named ``module/HLO instruction``. Shared by
``bench/step_profile.py`` (a training step) and ``bench/serving_profile.py`` (a SavedModel call), with
the per-type sums of both (:func:`op_profile`).
"""

import collections
import dataclasses
import glob
import os
import time
from typing import NamedTuple

import tensorflow as tf

XLA_KERNEL = "XLA kernel"  # the op type :func:`op_events` gives a compiled function's kernels


@dataclasses.dataclass
class OpEvent:
    """One op execution of a profile: node name, op type, self time in seconds."""

    name: str
    type: str
    seconds: float


def xla_kernel_name(plane, event):
    """``module/instruction`` of an XLA kernel's event (its ``hlo_module`` and ``hlo_op`` stats), else None."""
    stats = {plane.stat_metadata[s.metadata_id].name: s for s in event.stats}
    if "hlo_module" not in stats or "hlo_op" not in stats:
        return None
    module, instruction = (plane.stat_metadata[stats[key].ref_value].name if stats[key].ref_value
                           else stats[key].str_value for key in ("hlo_module", "hlo_op"))
    return f"{module}/{instruction}"


def op_events(space):
    """The op executions of an ``XSpace``'s host plane: events named ``node:Type`` whose metadata carries the type
    (``display_name``), and XLA kernels (:func:`xla_kernel_name`, type :data:`XLA_KERNEL`), on any thread;
    self time = duration less the op events nested in it on its thread."""
    events = []
    for plane in space.planes:
        if not plane.name.startswith("/host:"):
            continue
        for line in plane.lines:
            ops = []
            for event in line.events:
                meta = plane.event_metadata[event.metadata_id]
                if meta.display_name and ":" in meta.name:
                    node, op_type = meta.name.rsplit(":", 1)[0], meta.display_name
                else:
                    node, op_type = xla_kernel_name(plane, event), XLA_KERNEL
                if node:
                    ops.append((event.offset_ps, event.offset_ps + event.duration_ps, node, op_type))
            ops.sort(key=lambda op: (op[0], -op[1]))
            stack, selves = [], []  # stack of indices into selves: the enclosing op events
            for start, end, node, op_type in ops:
                while stack and selves[stack[-1]][1] <= start:
                    stack.pop()
                if stack:
                    selves[stack[-1]][3] -= end - start
                selves.append([start, end, (node, op_type), end - start])
                stack.append(len(selves) - 1)
            events += [OpEvent(node, op_type, max(self_ps, 0) * 1e-12) for _, _, (node, op_type), self_ps in selves]
    return events


def read_xspace(logdir):
    """The ``XSpace`` of the one ``.xplane.pb`` under ``logdir`` (the newest when there are several)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True), key=os.path.getmtime)
    if not paths:
        raise RuntimeError(f"the profiler wrote no .xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(paths[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def profiled(run, logdir):
    """Calls ``run()`` (which waits for its results) under the TensorFlow profiler, host ops only, writing to
    ``logdir``: (the op events, :func:`op_events`; the wall seconds of the call)."""
    options = tf.profiler.experimental.ProfilerOptions(host_tracer_level=2, python_tracer_level=0,
                                                       device_tracer_level=0)
    tf.profiler.experimental.start(logdir, options=options)
    try:
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    finally:
        tf.profiler.experimental.stop()
    return op_events(read_xspace(logdir)), seconds


class TypeRow(NamedTuple):
    """One op type's self time in a profile of ``batches`` runs (a bench's batches, or a training step's steps)."""

    type: str
    share: float  # of the summed op self time
    ms_per_batch: float
    calls_per_batch: float
    us_per_call: float


class OpProfile(NamedTuple):
    """A profile's op types, most self time first, and its totals."""

    types: list  # of TypeRow, every type
    matmul_share: float  # of the summed op self time, op types with "MatMul" in their name
    op_ms_per_batch: float  # summed op self time


def op_profile(events, batches):
    """:class:`OpProfile` of :func:`op_events` ``events`` of ``batches`` runs (batches, or steps)."""
    seconds, calls = collections.Counter(), collections.Counter()
    for event in events:
        seconds[event.type] += event.seconds
        calls[event.type] += 1
    total = sum(seconds.values()) or 1.0
    types = [TypeRow(name, spent / total, 1e3 * spent / batches, calls[name] / batches, 1e6 * spent / calls[name])
             for name, spent in seconds.most_common()]
    matmuls = sum(row.share for row in types if "MatMul" in row.type)
    return OpProfile(types, matmuls, 1e3 * sum(seconds.values()) / batches)

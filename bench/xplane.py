"""Reading the TensorFlow profiler's XPlane: the op executions of a profiled run, each with its self time.

Each op event of the host threads (named ``node name:op type``) counts its self time (its duration less the op
events nested in it on its thread); an XLA-compiled function runs no TensorFlow op events, and its kernels (one
per fusion) count as ops of type :data:`XLA_KERNEL`, named ``module/HLO instruction``. Shared by
``bench/step_profile.py`` (a training step) and ``bench/serving_profile.py`` (a SavedModel call).
"""

import dataclasses
import glob
import os
import time

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

"""The training benchmark's timing (``bench/train.py``): a group of contenders timed in turns in its own
process, the matmul peak, and the parent that follows the groups' processes."""

import dataclasses
import multiprocessing
import queue
import time

import numpy as np
import tensorflow as tf

from bench.train_batches import batch_flops
from bench.train_contenders import Result
from tf_transformer.cpu import cpu_speed_flags
from tf_transformer.train.precision import BF16_FLAGS, matmul_gflops

PEAK_SIZE = 2048  # the matmul peak multiplies two PEAK_SIZE x PEAK_SIZE matrices


# ---- measuring, in a group's own process ----------------------------------------

@dataclasses.dataclass
class Event:
    """What a group's process reports, as it happens.

    kind: ``start`` (contender ``index`` of the group begins its build and warm-up, or a round),
    ``result`` (its ``result`` of one round), ``failed`` (it raised: ``error``), ``peaks`` (the matmul
    ``peaks`` of a round, GFLOP/s by compute dtype), ``done``; and, on the parent's side of the pipe,
    ``died`` (the process ended early) and ``timeout`` (nothing came in time), ``error`` saying which.
    """

    kind: str
    index: int = None
    result: Result = None
    peaks: dict = None
    error: str = None


def _first(outputs):
    return outputs[0] if isinstance(outputs, (tuple, list)) else outputs


def warm_up(contender, tensors):
    """Builds the model and its step under the contender's precision and runs its warm-up steps on the first
    of ``tensors`` (the first traces, and with XLA compiles), then one step on each other batch of ``tensors``
    (a shape seen for the first time may trace or compile again: ours compiles its XLA parts once per bucketed
    row count, ``torch.compile`` may recompile): the rounds time the steady state. Returns the step."""
    started = time.perf_counter()
    with contender.policy():  # layers keep the policy they were built with (tf-models' build in their first call)
        contender.step = contender.build()
        for i in range(max(contender.warmup_steps, len(tensors))):
            outputs = contender.step(*tensors[i % len(tensors)])
        _first(outputs).numpy()
    contender.warmup_seconds = time.perf_counter() - started
    print(f"  {contender.label:<48} built, traced, {max(contender.warmup_steps, len(tensors))} warm-up step(s): "
          f"{contender.warmup_seconds:.0f}s", flush=True)
    return contender.step


def timed_steps(step, batches):
    """Seconds for ``step`` over ``batches``, one after the other."""
    started = time.perf_counter()
    for x, y in batches:
        outputs = step(x, y)
    _first(outputs).numpy()  # steps run in order (each reads the last one's weights): the last ends them all
    return time.perf_counter() - started


def time_round(contender, tensors, indices):
    """One round of ``contender``: its steps on ``tensors[i] for i in indices`` -> a :class:`Result` of it."""
    seconds = timed_steps(contender.step, [tensors[i] for i in indices])
    chunk = [contender.batches.batches[i] for i in indices]
    tokens = sum(int(np.count_nonzero(y)) for _, y in chunk)
    return dataclasses.replace(Result.of(contender), steps=len(indices), seconds=seconds,
                               target_tokens_per_sec=tokens / seconds, warmup_seconds=contender.warmup_seconds,
                               flops_per_sec=batch_flops(chunk, contender.hp, contender.batches.vocab) / seconds)


def per_round(contender, rounds):
    """Timed steps of ``contender`` in each of ``rounds`` rounds (at least 2)."""
    return max(2, contender.steps // rounds)


def measure_group(group, rounds, report):
    """Times the contenders of ``group`` in turns on their one :class:`BatchSet`, telling ``report``
    each :class:`Event` as it happens.

    Every contender is built and warmed up on the first batches; then each of
    ``rounds`` rounds measures the matmul peaks again and runs every contender
    still standing for its :func:`per_round` steps, all on the same batches in
    the same order, so that load from other processes falls on all of them
    alike. A contender that raises is reported ``failed`` and leaves the turns;
    the others go on.
    """
    tensors = [(tf.constant(x), tf.constant(y)) for x, y in group[0].batches.batches]

    def attempt(index, work, *args):
        """``work(*args)``, or None after reporting contender ``index`` failed."""
        try:
            return work(*args)
        except Exception as e:  # one contender's failure, whatever it is, must not stop the others
            group[index].step = None
            report(Event("failed", index, error=f"{type(e).__name__}: {e}".splitlines()[0][:300]))
            return None

    standing = []
    for index, contender in enumerate(group):
        report(Event("start", index))
        if attempt(index, warm_up, contender, tensors) is not None:
            standing.append(index)
    offset = max(c.warmup_steps for c in group)
    for _ in range(rounds):
        report(Event("peaks", peaks=measure_peaks(peak_dtypes(group))))
        for index in list(standing):
            report(Event("start", index))
            indices = [(offset + i) % len(tensors) for i in range(per_round(group[index], rounds))]
            result = attempt(index, time_round, group[index], tensors, indices)
            if result is None:
                standing.remove(index)
            else:
                report(Event("result", index, result=result))
        offset += max(per_round(c, rounds) for c in group)
    for contender in group:
        contender.step = None  # let the models go
    report(Event("done"))


def has_bf16(cpu_flags=None):
    """Whether the CPU runs bfloat16 matmuls natively (one of :data:`BF16_FLAGS`); ``cpu_flags`` defaults to
    /proc/cpuinfo's."""
    return bool(set(cpu_speed_flags(cpu_flags).split()) & set(BF16_FLAGS))


def peak_dtype(precision, bf16):
    """The compute dtype whose matmul peak a precision's MFU is held to: bfloat16's for mixed_bfloat16 on a
    CPU with bfloat16 instructions (``bf16``); else float32's, the CPU's own peak (emulated bfloat16 runs on
    the float32 units)."""
    return "bfloat16" if precision == "mixed_bfloat16" and bf16 else "float32"


def peak_dtypes(contenders, bf16=None):
    """The compute dtypes whose peaks the MFU of ``contenders`` needs (float32 always); ``bf16``:
    :func:`has_bf16` by default."""
    bf16 = has_bf16() if bf16 is None else bf16
    return sorted({"float32"} | {peak_dtype(c.hp.precision, bf16) for c in contenders})


def measure_peaks(dtypes):
    """{dtype name: GFLOP/s of :func:`matmul_peak`} for each name in ``dtypes``."""
    return {name: matmul_peak(tf.as_dtype(name)) for name in dtypes}


def merge_peaks(peaks, measured):
    """Keeps in ``peaks`` the highest of each dtype's peaks; returns ``peaks``."""
    for name, value in measured.items():
        peaks[name] = max(peaks.get(name, 0.0), value)
    return peaks


def matmul_peak(dtype, size=PEAK_SIZE, repeats=10):
    """GFLOP/s of a (size, size) @ (size, size) ``tf.matmul`` in a ``tf.function``, best of 3 runs of
    ``repeats`` calls (:func:`tf_transformer.train.precision.matmul_gflops`)."""
    return matmul_gflops(dtype, (size, size, size), calls=repeats, repeats=3)


def _group_child(group, rounds, outbox):
    measure_group(group, rounds, outbox.put)


# ---- running groups, in the parent process ----------------------------------------

def start_group(group, rounds):
    """Starts :func:`measure_group` of ``group`` in a fresh (spawned) process.

    Returns:
      ``(next_event, stop)``: ``next_event(timeout)`` -> the process's next
      :class:`Event` (``died`` when it ended without one), raising
      ``queue.Empty`` after ``timeout`` seconds without one; ``stop(finished)``
      waits for a finished process to exit and ends an unfinished one.
    """
    context = multiprocessing.get_context("spawn")
    outbox = context.Queue()
    child = context.Process(target=_group_child, args=(group, rounds, outbox))
    child.start()

    def next_event(timeout):
        deadline = time.perf_counter() + timeout
        while True:
            try:
                return outbox.get(timeout=min(1.0, max(0.0, deadline - time.perf_counter())))
            except queue.Empty:
                if not child.is_alive():
                    try:  # what it sent just before it ended
                        return outbox.get(timeout=1.0)
                    except queue.Empty:
                        return Event("died", error=f"failed: its process ended (exit status {child.exitcode})")
                if time.perf_counter() >= deadline:
                    raise

    def stop(finished):
        child.join(timeout=30 if finished else 0)
        if child.is_alive():
            child.terminate()
            child.join()

    return next_event, stop


def follow(next_event, members, results, budget, peaks):
    """Reads the events of one group process into ``results`` until it is done (True), or until the
    contender at work has spent ``budget`` seconds in it or the process ended (False: that contender's
    note says so; before any contender started, every member's).

    A contender's seconds run from each of its ``start`` events to the next
    event: its build and warm-up, its turns, and the matmul peak measured
    after the last turn of a round when it is the last in the group. The
    process's start (imports) has a budget of its own.

    Args:
      next_event: ``timeout -> Event``, raising ``queue.Empty`` after ``timeout`` seconds without one.
      members: the index in ``results`` of each contender of the process (events give its place there).
      results: one :class:`Result` per contender of the whole group, updated in place.
      budget: seconds each contender may spend.
      peaks: GFLOP/s by compute dtype, the highest kept.
    """
    current, spent, mark = None, {}, time.perf_counter()
    while True:
        try:
            event = next_event(max(0.0, budget - spent.get(current, 0.0)))
        except queue.Empty:
            event = Event("timeout", error=f"timed out: over its {budget:.0f}s (build, warm-up and rounds)")
        now = time.perf_counter()
        spent[current], mark = spent.get(current, 0.0) + now - mark, now
        if event.kind == "start":
            current = event.index
        elif event.kind == "result":
            results[members[event.index]].add_round(event.result)
        elif event.kind == "failed":
            set_note(results[members[event.index]], f"failed: {event.error}")
        elif event.kind == "peaks":
            merge_peaks(peaks, event.peaks)
        elif event.kind == "done":
            return True
        else:  # timeout or died: the contender at work is to blame
            for index in members if current is None else [members[current]]:
                set_note(results[index], event.error)
            return False


def set_note(result, note):
    """Notes why ``result`` stopped, and says so at once."""
    result.note = note
    print(f"  {result.label:<48} {note}", flush=True)


def run_group(group, rounds, budget, peaks, start=start_group):
    """Measures ``group`` with :func:`measure_group` in a fresh process: memory comes back after each group,
    and a contender that hangs or is very slow cannot stall the run.

    Each contender may spend ``budget`` seconds. When one runs over or its
    process dies, that process is stopped and the contenders without a figure
    or a note go on in a new one; figures already measured are kept. A group
    whose contenders have fewer than ``2 * rounds`` steps runs one round.

    Args:
      start: ``(contenders, rounds) -> (next_event, stop)``, as :func:`start_group`.
      peaks: GFLOP/s by compute dtype, the highest kept.
    Returns:
      one :class:`Result` per contender, in order.
    """
    rounds = rounds if all(c.steps >= 2 * rounds for c in group) else 1
    results = [Result.of(c) for c in group]
    members = list(range(len(group)))
    while members:
        next_event, stop = start([group[i] for i in members], rounds)
        finished = False
        try:
            finished = follow(next_event, members, results, budget, peaks)
        finally:
            stop(finished)
        members = [] if finished else [i for i in members if not results[i].rounds and results[i].note is None]
    for result in results:
        if 0 < result.rounds < rounds and result.note is None:
            result.note = f"{result.rounds} of {rounds} rounds"
        if result.rounds:
            print(f"  {result.label:<48} best of {result.rounds} round(s) of {result.steps} steps: "
                  f"{result.target_tokens_per_sec:7.0f} target tokens/s ({result.seconds / result.steps:.2f}s a step)",
                  flush=True)
    return results

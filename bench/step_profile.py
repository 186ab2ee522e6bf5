"""Where a training step's op time goes: ours and the peers on the same real batches, under the TensorFlow profiler.

For each contender (ours; keras-hub and tf-models when they import, else
skipped with the reason) and each precision the CPU has (float32; mixed
bfloat16 where it has ``avx512_bf16`` or ``amx_bf16``), on the trainer's own
batches of a real corpus (:func:`bench.train_batches.real_batch_sets`, the
embedded ``ding-de-en`` by default, batch_tokens 1024): the step is built as
``bench/train.py`` builds it (:data:`bench.train_contenders.BUILDERS`), warmed
up, then a few steps run under ``tf.profiler.experimental``. The XPlane it
writes is read directly (``xplane_pb2``): each op event of the host threads
(named ``node name:op type``) counts its self time (its duration less the op
events nested in it), and its category comes from :data:`OP_CATEGORIES` and
:data:`SCOPE_CATEGORIES` (:func:`category`). It prints, per contender and
precision, the share of summed op self time per category, its ms a step, and
the ops run per step.

An XLA-compiled function (``tf.function(jit_compile=True)``, e.g. the step's compiled
sub-layer tails and loss, or the optimizer update when asked for,
:class:`tf_transformer.train.step.CompiledUpdate`) runs no TensorFlow op events: its
kernels (one per fusion, on the intra-op threads) count as ops of type
:data:`bench.xplane.XLA_KERNEL`, named ``module/HLO instruction``, and take the category of their
module's name (``a_inference__optimizer_update_...``: the optimizer).

The inter-op threads run ops at the same time, so summed op time exceeds the
wall time of a step: shares are of summed op self time, not of wall time.
Reshape, Shape and Identity-like ops often do not appear as events.

Two figures that do not depend on the CPU's speed, for ours (float32, the first
batch): the ops of the optimized step (the Grappler-optimized function graph of
the step, as TensorFlow instantiates it: ``RunMetadata.function_graphs``;
``_Arg``, ``_Retval``, ``NoOp`` and ``Const`` nodes not counted), and the bytes
written by ops other than matmuls per target token (every op the step runs on
that batch, with its output shapes, read from ``tf.debugging`` dumps in SHAPE
mode; ops that write no new tensor, :data:`NO_WRITE_TYPES`, not counted; the
traced graph, before Grappler). An XLA-compiled function (``jit_compile=True``,
e.g. the step's compiled tails) counts as one op that writes only its
outputs: the dump does not instrument the ops inside it (XLA fuses them, and has
no kernel for the debug ops). In-place variable updates write no output tensor
and are not counted, compiled or not (``ResourceApplyAdam`` writes none either).

Not named ``profile.py``: a script's directory comes first on ``sys.path``, and a
``bench/profile.py`` would hide the standard library's ``profile``, which
``cProfile`` (imported by torch) needs, from every bench script.

    python bench/step_profile.py                       # ours and the installed peers, every precision the CPU has
    python bench/step_profile.py --steps 10 --only ours --json /tmp/profile.json
"""

import argparse
import collections
import contextlib
import json
import os
import re
import shlex
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tf_transformer.allocator import allocator_setting, reuse_cpu_memory  # noqa: E402
from tf_transformer.quiet import quiet_tensorflow  # noqa: E402

quiet_tensorflow()  # TensorFlow's start-up notices off stderr, as the commands do (TF_CPP_MIN_LOG_LEVEL set: shown)
reuse_cpu_memory()  # TensorFlow's CPU tensors from its BFC allocator, as the commands do

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.train_batches import real_batch_sets  # noqa: E402
from bench.train_contenders import PEERS, Contender  # noqa: E402
from bench.xplane import op_profile, profiled  # noqa: E402
from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.data import corpus  # noqa: E402
from tf_transformer.hparams import load_hparams  # noqa: E402

MATMULS, LOSS, SOFTMAX, LAYER_NORM, CASTS, ELEMENTWISE, DROPOUT, GATHER, RESHAPES, OPTIMIZER, OTHER = CATEGORIES = (
    "matmuls", "loss", "softmax and masks", "layer norm", "casts", "other element-wise and reductions",
    "dropout (random numbers, masks)", "gather/scatter (packing, embeddings)", "transposes, reshapes, concat",
    "optimizer update", "other")

# Op type -> category: the one table. Types not listed are "other". oneDNN's variants (_Mkl..., _MklNative...)
# are looked up without that prefix (_MklNativeFusedMatMul as FusedMatMul).
OP_CATEGORIES = {
    **dict.fromkeys(("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul", "FusedMatMul",
                     "FusedBatchMatMulV2", "Einsum", "_FusedBatchMatMulV2"), MATMULS),
    **dict.fromkeys(("SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits", "OneHot", "ArgMax",
                     "LogSoftmax"), LOSS),
    **dict.fromkeys(("Softmax", "SelectV2", "Select", "Sign", "NotEqual", "Equal", "Less", "LessEqual", "Greater",
                     "GreaterEqual", "LogicalAnd", "LogicalNot", "MatrixBandPart"), SOFTMAX),
    **dict.fromkeys(("Mean", "SquaredDifference", "Rsqrt", "RsqrtGrad", "FusedLayerNorm"), LAYER_NORM),
    "Cast": CASTS,
    **dict.fromkeys(("Mul", "AddV2", "Add", "Sub", "RealDiv", "Div", "DivNoNan", "Neg", "Relu", "ReluGrad",
                     "BiasAdd", "BiasAddGrad", "Sum", "AddN", "Maximum", "Minimum", "Sqrt", "Pow", "Exp", "Log",
                     "Abs", "Square", "FloorMod", "FloorDiv", "Reciprocal", "Max", "Prod", "Tanh", "Erf",
                     "Sin", "Cos", "Gelu", "GeluGrad", "SqrtGrad", "TanhGrad", "ClipByValue"), ELEMENTWISE),
    **dict.fromkeys(("StatelessRandomUniformV2", "StatelessRandomGetKeyCounter", "StatelessRandomUniform",
                     "RandomUniform", "StatelessRandomGetKeyCounterAlg", "StatelessRandomGetAlg",
                     "RngReadAndSkip", "StatelessRandomNormalV2"), DROPOUT),
    **dict.fromkeys(("GatherNd", "ScatterNd", "GatherV2", "ResourceGather", "UnsortedSegmentSum", "Where",
                     "TensorScatterUpdate", "TensorScatterAdd", "SparseSegmentSum"), GATHER),
    **dict.fromkeys(("Transpose", "Reshape", "ConcatV2", "Concat", "Split", "SplitV", "Slice", "StridedSlice",
                     "StridedSliceGrad", "Pack", "Unpack", "Tile", "BroadcastTo", "ExpandDims", "Squeeze", "Pad",
                     "Fill", "ZerosLike", "OnesLike", "ConcatOffset", "BroadcastGradientArgs", "ConjugateTranspose",
                     "Identity", "Shape", "ShapeN"), RESHAPES),
    **dict.fromkeys(("ResourceApplyAdam", "ApplyAdam", "ResourceApplyAdamWithAmsgrad", "AssignAddVariableOp",
                     "AssignSubVariableOp", "AssignVariableOp"), OPTIMIZER),
}
# Categories an op type keeps wherever it runs; other types take the category of their name scope first.
FIXED_CATEGORIES = (MATMULS, LOSS, CASTS, GATHER, OPTIMIZER)
# (substring of the lower-cased node name, category), the first that matches: a Mul inside the optimizer's scope
# is the optimizer's, inside a dropout layer's (forward or gradient) dropout's, inside a layer norm's layer norm.
SCOPE_CATEGORIES = (("adam/", OPTIMIZER), ("/adam", OPTIMIZER), ("optimizer", OPTIMIZER),
                    ("dropout", DROPOUT),
                    ("layer_norm", LAYER_NORM), ("layernorm", LAYER_NORM), ("layer_normalization", LAYER_NORM),
                    ("softmax", SOFTMAX),
                    ("compiled_tail", LAYER_NORM),  # XLA modules of the compiled sub-layer tails (nn/fused.py)
                    ("smoothed_loss", LOSS))  # and of the compiled loss (nn/loss.py)
# Ops that write no new tensor (an alias of an input or a variable's buffer, a constant, a shape).
NO_WRITE_TYPES = ("Const", "Shape", "ShapeN", "ReadVariableOp", "Identity", "IdentityN", "Reshape", "ExpandDims",
                  "Squeeze", "NoOp", "Placeholder", "StopGradient", "EnsureShape", "Size", "Rank")
FUNCTION_CALLS = ("StatefulPartitionedCall", "PartitionedCall")
STRUCTURAL = ("_Arg", "_Retval", "NoOp", "Const", "_Send", "_Recv", "_DeviceArg", "_DeviceRetval")
DEFAULT_STEPS, DEFAULT_WARMUP = 5, 2


def op_type_key(op_type):
    """The type :data:`OP_CATEGORIES` lists: oneDNN's ``_Mkl``/``_MklNative`` prefix dropped when the table does
    not name the type itself."""
    if op_type in OP_CATEGORIES:
        return op_type
    return re.sub(r"^_Mkl(Native)?", "", op_type)


def category(name, op_type):
    """The category of one op: its type's when the type is a matmul, loss, cast, gather/scatter or optimizer op;
    else its name scope's (:data:`SCOPE_CATEGORIES`) when one matches; else its type's; else "other"."""
    by_type = OP_CATEGORIES.get(op_type_key(op_type))
    if by_type in FIXED_CATEGORIES:
        return by_type
    lowered = name.lower()
    for scope, scope_category in SCOPE_CATEGORIES:
        if scope in lowered:
            return scope_category
    return by_type or OTHER


# ---- profiling steps ------------------------------------------------------------

def profile_steps(step, tensors, logdir):
    """Runs ``step`` on each (x, y) of ``tensors`` under the TensorFlow profiler; returns the op events
    (:func:`bench.xplane.op_events`) and the wall seconds."""
    def run():
        for x, y in tensors:
            outputs = step(x, y)
        (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()

    return profiled(run, logdir)


def summarize(events, steps):
    """{category: {"share", "ms_per_step", "ops_per_step"}} over every category (each share of the summed op self
    time), plus the totals: "ops_per_step", "op_ms_per_step"."""
    seconds, counts = collections.Counter(), collections.Counter()
    for event in events:
        key = category(event.name, event.type)
        seconds[key] += event.seconds
        counts[key] += 1
    total = sum(seconds.values()) or 1.0
    shares = {key: {"share": seconds[key] / total, "ms_per_step": 1e3 * seconds[key] / steps,
                    "ops_per_step": counts[key] / steps} for key in CATEGORIES}
    return {"categories": shares, "ops_per_step": len(events) / steps,
            "op_ms_per_step": 1e3 * sum(seconds.values()) / steps}


def top_types(events, steps, count=8):
    """The ``count`` op types of most self time: [(type, ms a step)] (:func:`bench.xplane.op_profile`)."""
    return [(row.type, row.ms_per_batch) for row in op_profile(events, steps).types[:count]]


# ---- figures of the graph, independent of the CPU's speed -------------------------

def optimized_graph_ops(build, x, y):
    """Nodes of the Grappler-optimized step, as TensorFlow instantiates it for its first call: the largest
    ``post_optimization_graph`` of the function graphs ``RunMetadata`` collects, less :data:`STRUCTURAL` nodes.
    ``build``: () -> a fresh step (x, y), not called yet."""
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx.enable_run_metadata()
    try:
        step = build()
        outputs = step(x, y)
        (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    graphs = [g.post_optimization_graph for g in metadata.function_graphs]
    if not graphs:
        return None
    graph = max(graphs, key=lambda g: len(g.node))
    return sum(1 for node in graph.node if node.op not in STRUCTURAL)


def written_bytes(traces, compiled=None):
    """(ops, bytes written by non-matmul ops) of graph execution traces in SHAPE mode: (op name, op type,
    debug tensor value) with the value ``[tensor id, dtype enum, rank, elements, shape...]``; ops of
    :data:`NO_WRITE_TYPES` write nothing; ops count once whatever their outputs. ``compiled``: {compiled
    function: bytes of its outputs} (:func:`compiled_functions_whole`), one op each."""
    compiled = compiled or {}
    ops, written = set(compiled), sum(compiled.values())
    for name, op_type, value in traces:
        if op_type in STRUCTURAL or op_type == "DebugIdentityV2":
            continue
        ops.add(name)
        if op_type in NO_WRITE_TYPES or category(name, op_type) == MATMULS:
            continue
        dtype = tf.as_dtype(int(value[1]))
        written += int(value[3]) * (dtype.size if dtype.is_numpy_compatible else 0)
    return len(ops), written


def output_bytes(graph):
    """Bytes of a function graph's outputs (resources and unknown shapes: 0)."""
    return sum((t.shape.num_elements() or 0) * (t.dtype.size if t.dtype.is_numpy_compatible else 0)
               for t in graph.outputs)


@contextlib.contextmanager
def compiled_functions_whole(compiled):
    """While ``tf.debugging`` dumps: the ops inside XLA-compiled functions are not instrumented (XLA has no kernel
    for the debug ops); on exit ``compiled`` (a dict) holds {function graph: :func:`output_bytes`} of each
    compiled function traced meanwhile (once per trace: the step calls its fused update once).

    Patches the dumping callback (``tensorflow.python.debug.lib.dumping_callback``; a function's call op reaches
    no op callback): an op belongs to a compiled function while a graph enclosing its graph is in an XLA context,
    which ``tf.function(jit_compile=True)`` enters around tracing it."""
    from tensorflow.python.debug.lib import dumping_callback
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext

    original, graphs = dumping_callback._DumpingCallback.callback, {}

    def callback(self, op_type, inputs, attrs, outputs, op_name=None, graph=None):
        outer = getattr(graph, "outer_graph", None)
        if outer is not None and GraphOrParentsInXlaContext(outer):
            graphs[id(graph)] = graph
            return None
        return original(self, op_type, inputs, attrs, outputs, op_name, graph)

    dumping_callback._DumpingCallback.callback = callback
    try:
        yield compiled
    finally:
        dumping_callback._DumpingCallback.callback = original
        # the compiled functions themselves, not the graphs inside them (a tf.cond's branches)
        compiled.update({g: output_bytes(g) for g in graphs.values() if id(g.outer_graph) not in graphs})


def traced_bytes(build, x, y, dump_dir):
    """:func:`written_bytes` of one call of a fresh step from ``build`` on (x, y), dumped by
    ``tf.debugging.experimental.enable_dump_debug_info`` in SHAPE mode into ``dump_dir``; compiled functions
    whole (:func:`compiled_functions_whole`)."""
    from tensorflow.python.debug.lib import debug_events_reader

    compiled = {}
    with compiled_functions_whole(compiled):  # before the dump takes its callback
        writer = tf.debugging.experimental.enable_dump_debug_info(dump_dir, tensor_debug_mode="SHAPE",
                                                                  circular_buffer_size=-1)
        try:
            step = build()
            outputs = step(x, y)
            (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()
            writer.FlushNonExecutionFiles()
            writer.FlushExecutionFiles()
        finally:
            tf.debugging.experimental.disable_dump_debug_info()
    with debug_events_reader.DebugDataReader(dump_dir) as reader:
        reader.update()
        return written_bytes(((t.op_name, t.op_type, t.debug_tensor_value) for t in reader.graph_execution_traces()),
                             compiled)


def graph_figures(hp, batch_set, scratch):
    """Ours' CPU-independent figures on the first batch of ``batch_set`` (float32): {"optimized_graph_ops",
    "traced_ops", "non_matmul_bytes_per_target_token", "target_tokens"}."""
    x, y = batch_set.batches[0]
    tokens = int(np.count_nonzero(y))
    contender = Contender("ours", "small", hp.replace(precision="float32"), 1, batch_set)
    with contender.policy():
        graph_ops = optimized_graph_ops(contender.build, tf.constant(x), tf.constant(y))
        traced_ops, written = traced_bytes(contender.build, tf.constant(x), tf.constant(y),
                                           os.path.join(scratch, "dump"))
    return {"optimized_graph_ops": graph_ops, "traced_ops": traced_ops, "target_tokens": tokens,
            "non_matmul_bytes_per_target_token": written / tokens}


# ---- running and reporting ------------------------------------------------------

def profile_contender(contender, warmup, scratch):
    """Builds ``contender`` under its policy, warms it up on the first ``warmup`` batches, profiles the rest:
    its :func:`summarize` with "target_tokens_per_sec" (profiled) and "top" (:func:`top_types`)."""
    batches = contender.batches.batches
    tensors = [(tf.constant(x), tf.constant(y)) for x, y in batches]
    with contender.policy():
        step = contender.build()
        for i in range(warmup):
            outputs = step(*tensors[i % len(tensors)])
        (outputs[0] if isinstance(outputs, (tuple, list)) else outputs).numpy()
        profiled = tensors[warmup:] or tensors
        logdir = tempfile.mkdtemp(dir=scratch)
        events, seconds = profile_steps(step, profiled, logdir)
    tokens = sum(int(np.count_nonzero(y)) for _, y in (batches[warmup:] or batches))
    summary = summarize(events, len(profiled))
    summary.update(target_tokens_per_sec=tokens / seconds, steps=len(profiled), top=top_types(events, len(profiled)))
    return summary


def table(rows):
    """A Markdown table: a row per category (and the totals), a column per profiled contender and precision."""
    header = ["category"] + [f"{r['contender']} {r['precision']}" for r in rows]
    lines = [header, ["---"] + ["---:"] * len(rows)]
    for key in CATEGORIES:
        lines.append([key] + [f"{r['categories'][key]['share']:.1%} ({r['categories'][key]['ms_per_step']:.1f} ms, "
                              f"{r['categories'][key]['ops_per_step']:.0f})" for r in rows])
    lines.append(["op self time, ms a step"] + [f"{r['op_ms_per_step']:.0f}" for r in rows])
    lines.append(["ops run per step"] + [f"{r['ops_per_step']:.0f}" for r in rows])
    lines.append(["target tokens/s, profiled"] + [f"{r['target_tokens_per_sec']:,.0f}" for r in rows])
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def parser():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default=corpus.DEFAULT_CORPUS,
                   help="corpus directory or embedded corpus of the real batches (default: %(default)s)")
    p.add_argument("--batch-tokens", type=int, default=1024, help="the batches' batch_tokens (default: %(default)s)")
    p.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="profiled steps (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=DEFAULT_WARMUP,
                   help="unprofiled steps first, on the first batches (default: %(default)s)")
    p.add_argument("--only", help="profile only the contenders whose 'name precision' contains this")
    p.add_argument("--bf16", choices=("auto", "force", "off"), default="auto",
                   help="mixed_bfloat16: auto where the CPU has avx512_bf16 or amx_bf16 (default: %(default)s)")
    p.add_argument("--no-graph", action="store_true", help="leave out the two graph figures of ours")
    p.add_argument("--json", help="also write the figures here")
    return p


def planned(batch_set, steps, bf16_reason, missing, only, hp):
    """[(Contender or None, reason skipped or None)] for ours and the peers, each precision."""
    plan = []
    for precision in ("float32", "mixed_bfloat16"):
        for name in ("ours",) + PEERS:
            if only and only not in f"{name} {precision}":
                continue
            contender = Contender(name, "small", hp.replace(precision=precision), steps, batch_set)
            reason = (f"{name} does not import" if name in missing
                      else bf16_reason if precision == "mixed_bfloat16" else None)
            plan.append((contender, reason))
    return plan


def main(argv=None):
    from bench.train import bf16_skip_reason, missing_peers

    args = parser().parse_args(argv)
    command = shlex.join(["python", "bench/step_profile.py"] + (sys.argv[1:] if argv is None else list(argv)))
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    cpu = f"{cpu_model()} ({cpu_speed_flags()}), {os.cpu_count()} CPUs"
    print(f"{date}; {cpu}; TensorFlow {tf.__version__}, Keras {keras.__version__}; "
          f"{allocator_setting()}\ncommand: {command}", flush=True)
    hp = load_hparams("small").replace(lr_schedule="constant")
    (batch_set,) = real_batch_sets(args.data, args.warmup + args.steps, (args.batch_tokens,))
    print(batch_set.describe(), flush=True)
    missing = missing_peers()
    for name, reason in missing.items():
        print(f"{name} skipped: it does not import ({reason.splitlines()[0][:120]})")
    bf16_reason = bf16_skip_reason(args.bf16)
    rows, skipped = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        for contender, reason in planned(batch_set, args.steps, bf16_reason, missing, args.only, hp):
            label = f"{contender.name} {contender.hp.precision}"
            if reason:
                skipped[label] = reason
                continue
            summary = profile_contender(contender, args.warmup, scratch)
            rows.append({"contender": contender.name, "precision": contender.hp.precision, **summary})
            print(f"  {label}: {summary['ops_per_step']:.0f} ops a step, {summary['op_ms_per_step']:.0f} ms op time "
                  f"a step; top: " + ", ".join(f"{t} {ms:.1f} ms" for t, ms in summary["top"][:5]), flush=True)
        graph = None if args.no_graph else graph_figures(hp, batch_set, scratch)
    print(f"\nshare of summed op self time (ms a step, ops a step), {batch_set.name} batches, CPU: {cpu}\n")
    print(table(rows))
    for label, reason in skipped.items():
        print(f"{label} skipped: {reason}")
    if graph:
        print(f"\nours, float32, first batch ({graph['target_tokens']} target tokens): "
              f"{graph['optimized_graph_ops']} ops in the optimized step graph (Grappler), "
              f"{graph['traced_ops']} ops run in the traced graph, "
              f"{graph['non_matmul_bytes_per_target_token']:,.0f} bytes written by non-matmul ops per target token")
    record = {"date": date, "command": command, "cpu": cpu_model(), "cpu_flags": cpu_speed_flags(),
              "cores": os.cpu_count(), "batches": batch_set.describe(), "rows": rows, "skipped": skipped,
              "graph": graph}
    print(json.dumps(record))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=2)
    return record


if __name__ == "__main__":
    main()

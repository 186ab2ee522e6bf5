"""Where a step of the compiled decoding loop spends its time, by parts (CPU time, one thread per pool).

Each part runs alone for ``--steps`` steps in an XLA-compiled ``tf.while_loop`` on ``R`` rows
(hypotheses) whose self-attention caches are preallocated for ``--length`` positions, as
:func:`~tf_transformer.infer.decode.compiled_decoder`'s loop runs them, the parts taking turns
(best of ``--repeats``):

* ``step``: :meth:`~tf_transformer.nn.model.Transformer.decode_step` (embedding, decoder blocks,
  output projection), its logits summed (a consumer XLA cannot drop);
* ``step+tail``: and the choice of the next tokens: greedy ``argmax`` and ``log_softmax`` (beam 1),
  beam search :func:`~tf_transformer.infer.decode.top_k_of_rows` of ``2k`` and the log-sum-exp;
* ``step+tail+reorder`` (beam search): and the caches reordered by parents, as every beam step does;
* ``projection``: the output projection alone on (R, C) states, logits summed;
* ``start``: no step, one value of the encoder output read: :meth:`~tf_transformer.nn.model.Transformer.start_decoding`
  (the encoder on R sources, once per loop) and the loop itself, per step.

So the decoder blocks cost about ``step - projection - start``, the tail ``step+tail - step`` and the
reorder ``step+tail+reorder - step+tail``. Rows that the real loop drops as sentences finish are kept here.

    python bench/decode_parts.py --model-dir /work/decode-model --rows 64,256 --length 100
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from tf_transformer.cpu import cpu_model, cpu_speed_flags  # noqa: E402
from tf_transformer.infer import decode  # noqa: E402

SOURCE_WIDTH = 32  # source positions of the encoder output the steps attend to


def tail(logits, beam_size):
    """The next tokens' choice on (R, V) float32 logits: ((R,) int32 ids, () float32 to consume)."""
    if beam_size == 1:
        ids = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return ids, tf.reduce_sum(tf.gather(tf.nn.log_softmax(logits), ids, batch_dims=1))
    values, ids = decode.top_k_of_rows(logits, 2 * beam_size)
    return ids[:, 0], tf.reduce_sum(values - tf.reduce_logsumexp(logits, axis=-1, keepdims=True))


def part_steps(model, rows, beam_size):
    """{part: ``step(t, ids, context, caches) -> (ids, caches, consumed)``} on (R, 1) ids (R = ``rows``)."""
    def step(t, ids, context, caches, with_tail=False, reorder=False):
        logits, caches = model.decode_step(ids, t, context, caches, in_place=True)
        logits = tf.cast(logits[:, 0], tf.float32)
        if not with_tail:
            return ids, caches, tf.reduce_sum(logits)
        next_ids, consumed = tail(logits, beam_size)
        if reorder:  # each hypothesis' parent: one of the k of its sentence
            parents = rows_of_sentence(rows, beam_size) + next_ids % beam_size
            caches = model.reorder_caches(caches, parents)
        return next_ids[:, None], caches, consumed

    def projection(t, ids, context, caches):
        states = model.dec_embedding(ids[:, 0]) + context["positions"][t]
        return ids, caches, tf.reduce_sum(tf.cast(model.logits_layer(states), tf.float32))

    parts = {"step": step, "step+tail": lambda *a: step(*a, with_tail=True)}
    if beam_size > 1:
        parts["step+tail+reorder"] = lambda *a: step(*a, with_tail=True, reorder=True)
    parts["projection"] = projection
    parts["start"] = lambda t, ids, context, caches: (ids, caches, tf.reduce_sum(context["memory"][0]["key"][:, 0]))
    return parts


def rows_of_sentence(rows, beam_size):
    """(R,) int32: the first row of each row's sentence (k rows per sentence)."""
    return tf.range(rows) // beam_size * beam_size


def compiled_loop(model, part, rows, length, steps):
    """A ``tf.function`` (XLA) of no argument running ``part`` ``steps`` times: () float32."""
    @tf.function(jit_compile=True)
    def run():
        x = tf.fill([rows, SOURCE_WIDTH], 5)  # one source per row: the encoder-decoder attention of R rows
        context = model.start_decoding(x, length)

        def body(t, ids, caches, total):
            ids, caches, consumed = part(t, ids, context, caches)
            return t + 1, ids, caches, total + consumed

        start = (tf.constant(0), tf.fill([rows, 1], 5), model.empty_caches(rows, length), tf.constant(0.0))
        return tf.while_loop(lambda t, *_: t < steps, body, start)[-1]
    return run


def measure(model, rows, length, steps, repeats, beam_size):
    """{part: CPU milliseconds per step, best of ``repeats``}, the parts taking turns."""
    loops = {name: compiled_loop(model, part, rows, length, steps)
             for name, part in part_steps(model, rows, beam_size).items()}
    for run in loops.values():
        run().numpy()  # compiles
    best = {}
    for _ in range(repeats):
        for name, run in loops.items():
            start = time.process_time()
            run().numpy()
            best[name] = min(best.get(name, float("inf")), (time.process_time() - start) / steps * 1e3)
    return best


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", required=True, help="a trained model directory (its average when it has one)")
    p.add_argument("--rows", default="64,256", help="comma-separated row counts (hypotheses) per step")
    p.add_argument("--length", type=int, default=100, help="preallocated cache positions")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from bench.serving import current_average
    from tf_transformer.infer.load import load_for_inference

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    model = load_for_inference(current_average(args.model_dir) or args.model_dir).model
    print(f"**{cpu_model()}** ({cpu_speed_flags()}); one thread per pool; cache length {args.length}; "
          f"CPU ms per step, best of {args.repeats} x {args.steps} steps")
    for rows in (int(r) for r in args.rows.split(",")):
        for beam_size in (1, 4):
            figures = measure(model, rows, args.length, args.steps, args.repeats, beam_size)
            print(f"rows {rows}, beam {beam_size}: " + ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decoding: turning a source batch into target ids.

:func:`greedy_decode` is the original's algorithm and the reference for every
faster decoder: at each step the decoder re-reads the whole prefix it has
produced so far (no cache), takes the argmax at the last position and feeds it
back, starting from ``<S>``.

:func:`generate` is the fast path, greedy or beam search, a batch at a time in one
``tf.while_loop``: each step feeds only the newest token of every hypothesis
(:meth:`~tf_transformer.nn.model.Transformer.decode_step`); the decoder's
self-attention keys and values of the earlier positions are cached and the
encoder output is projected once per sentence. It runs eagerly (through
``tf.function``s traced once per model for any batch shape) and inside a
caller's ``tf.function`` (the SavedModel export), where the beam size may be a
tensor. Each sentence has its own length limit (:func:`length_limits`), its source length
+ 50 unless told otherwise, so a translation does not depend on the batch it is in.

Beam search (tensor2tensor's): at step ``t`` the ``k`` alive hypotheses of a
sentence propose their ``2k`` best one-token extensions; those that end with
``</S>`` compete for the ``k`` finished slots by their GNMT score
``log p / ((5 + length) / 6) ** alpha`` (length counts ``</S>``), the best ``k``
others stay alive. At the sentence's length limit the alive hypotheses are cut
(as greedy decoding cuts) and compete for the finished slots too. A sentence is
done when no alive hypothesis can still beat its ``nbest``-th finished one
(log-probabilities only fall, and the penalty is at its largest at the limit);
the loop stops when every sentence is done. With a ``patience`` p > 0 a sentence is
also done once ceil(p x k) hypotheses have ended among the ``k`` best extensions
of their steps: CTranslate2's rule (its ``patience``, https://arxiv.org/abs/2204.05424;
Hugging Face's ``early_stopping=True`` at 1), cheaper, and it may miss a longer
hypothesis that would have won.

A sentence that is done (greedy: it ended; beam search: as above) leaves the
batch, with its caches and its encoder output, so that a batch costs what its
unfinished sentences cost rather than its longest sentence times its size.

With ``jit_compile`` the same loops run compiled by XLA (:func:`compiled_decoder`),
which fuses the many small ops of a step: XLA needs every shape in the loop static,
so the caches and the output ids are preallocated for the longest length limit
and each step writes its position in place
(:meth:`~tf_transformer.nn.modules.MultiheadAttention.call_cached`'s ``position``);
positions not written yet are masked, so the results are the growing loop's.
With ``buckets=1`` its rows stay to the end (static shapes): it suits one sentence, or
batches of sentences of similar length. With ``buckets=b > 1`` (the export's
``translate_xla``) the batch moves down fixed row buckets as its sentences finish: one
``while_loop`` per bucket of ceil(N / 2**i) rows, i < b, each leaving as soon as no more
than the next bucket's rows are unfinished; those rows (then finished ones, to fill the
bucket) move there with their caches and encoder output, and the others' results are
written out. Every shape stays static (the bucket sizes follow from N), so XLA compiles
one program per batch shape, and a batch costs about what its unfinished sentences cost.
Beam search moves whole sentences (their k hypotheses). Compiled, its caches are not
reordered by the parents of the k new hypotheses at every step (which wrote the whole
preallocated cache out, and the loop copied it back): each hypothesis writes its new
position in its own rows and keeps an ancestry, the hypothesis whose rows hold each
position of its prefix, taken from its parent's (L ints); attention gathers its prefix
inside the fused products (parent pointers,
:meth:`~tf_transformer.nn.modules.MultiheadAttention.empty_beam_cache`). The growing loop
still reorders its caches, which hold only the positions so far.

:func:`sample` draws instead of searching (back-translation): greedy decoding's loop,
each step drawing the next token among the ``topk`` best at a ``temperature``
(:class:`Sampling`), by the Gumbel-max trick with noise hashed from the seed, the
sentence's key (its index in the input) and the step, so that a draw is reproducible
and does not depend on the batch it is in.
"""

import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID
from tf_transformer.nn import modules

# Decoding stops at the source length plus this many tokens unless told otherwise.
EXTRA_LENGTH = 50
_NO_SCORE = float("-inf")
# The XLA-compiled loop pads the sources' width to a multiple of this (one compile per multiple).
XLA_WIDTH_STEP = 8
# The greedy growing loop's finished rows leave the batch once they are at least 1 / GREEDY_LEAVE of its rows:
# each leave gathers the other rows' caches and encoder output, which costs more than a few done rows' steps
# (batches of 64, one thread, AVX2 EPYC: +1-3% against leaving at every finished row; docs/benchmarks.md).
GREEDY_LEAVE = 4
# The compiled loop's row buckets: at most this many (N, N/2, N/4, ...).
MAX_BUCKETS = 6
# top_k_of_rows reduces blocks of this many values to their maximum first.
TOP_K_BLOCK = 32


@tf.function(autograph=False, reduce_retracing=True)
def _encode(model, x):
    return model.encode(x, training=False)


@tf.function(autograph=False, reduce_retracing=True)
def _next_token(model, prefix, memory, source_masks):
    """(N, t) prefix -> (N,) argmax of the logits at the last position."""
    logits = model.decode(prefix, memory, source_masks, training=False)
    return tf.argmax(logits[:, -1, :], axis=-1, output_type=tf.int32)


def greedy_decode(model, x, max_length=None, on_step=None, max_length_factor=0.0):
    """Greedy decoding by full recompute, a batch at a time.

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated and ``<PAD>``-padded.
      max_length, max_length_factor: each sentence's length limit, as :func:`generate`'s.
      on_step: optional ``callable(step, tokens)`` called after every step
        with the (N, step + 1) tokens generated so far (for ``--trace``).
    Returns:
      (N, T_out) int32 numpy ids; each row ends with ``</S>`` unless it hit
      its length limit, followed by ``<PAD>``.
    """
    x = tf.convert_to_tensor(x, tf.int32)
    limits = length_limits(x, max_length, max_length_factor).numpy()
    memory, source_masks, _ = _encode(model, x)
    batch = int(x.shape[0])
    prefix = np.full([batch, 1], BOS_ID, np.int32)
    finished = limits <= 0
    for step in range(int(limits.max(initial=0))):
        next_ids = _next_token(model, tf.constant(prefix), memory, source_masks).numpy()
        next_ids = np.where(finished, PAD_ID, next_ids)
        prefix = np.concatenate([prefix, next_ids[:, None]], axis=1)
        finished |= (next_ids == EOS_ID) | (step + 1 >= limits)
        if on_step is not None:
            on_step(step, prefix[:, 1:])
        if finished.all():
            break
    return prefix[:, 1:]


def generate(model, x, beam_size=1, length_penalty=0.6, max_length=None, nbest=1, jit_compile=False,
             max_length_factor=0.0, buckets=1, patience=0.0, traced=True):
    """Cached greedy decoding (``beam_size`` 1) or beam search, a batch at a time.

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated and ``<PAD>``-padded
        (N may be 0).
      beam_size: hypotheses kept per sentence; an int, or a scalar int32 tensor
        inside a ``tf.function``.
      length_penalty: GNMT alpha (0: plain log-probability); beam search only.
      max_length: most tokens to generate per sentence; None or <= 0: the limit
        :func:`length_limits` gives each sentence. An int or a scalar int32 tensor.
      nbest: hypotheses returned per sentence, 1 <= nbest <= beam_size.
      jit_compile: run the decoding loop compiled by XLA (:func:`compiled_decoder`): the
        caches and the ids are preallocated for the longest limit (``max_length``, or the
        batch's source width + 50) and written in place. The same translations; compiled
        once per model, beam size, ``max_length`` and batch shape. ``beam_size``, ``nbest``
        and ``max_length`` must then be Python ints (or None), also inside a ``tf.function``.
      max_length_factor: > 0: no sentence gets more than this many tokens per source token
        (:func:`length_limits`); a float or a scalar float32 tensor.
      buckets: with ``jit_compile``, the row buckets of the compiled loop (:func:`compiled_decoder`):
        1, every row to the end; b > 1, the batch moves down to ceil(N / 2), ..., ceil(N / 2**(b-1))
        rows as sentences finish (one sentence: 1). The same translations. Ignored without ``jit_compile``.
      patience: beam search only. 0: a sentence is done when no alive hypothesis can beat
        its ``nbest``-th finished one (tensor2tensor's exact rule); p > 0: also once
        ``max(nbest, ceil(p * beam_size))`` hypotheses have ended among the ``beam_size`` best
        extensions of their steps (CTranslate2's ``patience``). A float or a scalar float32 tensor.
      traced: True, the loop runs as a ``tf.function`` traced on its first call for the model (1-3 s) and
        reused; False, op by op when called eagerly (40-100 ms a step on a 2-core CPU): faster for a process
        that decodes one batch of short sentences once. The same translations. Ignored with ``jit_compile``.
    Returns:
      ``(ids, scores)``: (N, nbest, T) int32 ids, ``<PAD>`` after ``</S>`` (a
      hypothesis without ``</S>`` was cut at its length limit), T the steps taken;
      (N, nbest) float32 scores, best first: beam search's length-penalised
      log-probability, greedy decoding's plain log-probability.
    Raises:
      ValueError: (eagerly) a beam size below 1, nbest outside [1, beam_size] or ``buckets`` not an int
        from 1 to :data:`MAX_BUCKETS`;
        inside a ``tf.function`` the same check fails the graph with
        InvalidArgumentError.
    """
    x = tf.cast(x, tf.int32)
    limits = length_limits(x, max_length, max_length_factor)
    decoded = _decode(model, x, limits, beam_size, length_penalty, max_length, nbest, jit_compile, buckets, patience,
                      traced)
    return decoded.ids[:, :, :decoded.steps], decoded.scores  # preallocated ids: the steps taken


def _decode(model, x, limits, beam_size, length_penalty, max_length, nbest, jit_compile, buckets=1, patience=0.0,
            traced=True):
    """:func:`generate`'s :class:`_Decoded`, from the loop that fits where it runs."""
    if jit_compile:
        _check_beam(beam_size, nbest)
        args = compiled_width(model, x), limits, tf.cast(length_penalty, tf.float32), tf.cast(patience, tf.float32)
        decoder = compiled_decoder(model, beam_size, nbest, max_length, buckets)
        if buckets == 1:
            return decoder(*args)
        # One sentence: one bucket (every smaller bucket has its one row: empty loops, whole moves).
        single = compiled_decoder(model, beam_size, nbest, max_length, 1)
        return tf.cond(tf.shape(x)[0] > 1, lambda: decoder(*args), lambda: single(*args))
    if not tf.inside_function():
        beam_size, nbest = int(beam_size), int(nbest)
    return _generate(model, x, limits, beam_size, length_penalty, nbest, patience, traced)


def compiled_width(model, x):
    """(N, T_x) source ids as :func:`compiled_decoder` takes them: padded to a multiple of
    :data:`XLA_WIDTH_STEP` where pads change nothing (``mask_source: embedding``), fewer shapes to compile."""
    if model.config.mask_source != "embedding":
        return x
    return tf.pad(x, [[0, 0], [0, -tf.shape(x)[1] % XLA_WIDTH_STEP]])


def check_buckets(buckets):
    """Refuses a ``buckets`` value that is not an int from 1 to :data:`MAX_BUCKETS`, naming it."""
    if isinstance(buckets, bool) or not isinstance(buckets, (int, np.integer)) or not 1 <= buckets <= MAX_BUCKETS:
        raise ValueError(f"buckets={buckets!r}: must be an int from 1 (every row to the end) to {MAX_BUCKETS}")
    return int(buckets)


def _check_beam(beam_size, nbest):
    if beam_size < 1:
        raise ValueError(f"beam_size={beam_size}: must be at least 1")
    if not 1 <= nbest <= beam_size:
        raise ValueError(f"nbest={nbest}: must be between 1 and beam_size={beam_size}")


def length_limits(x, max_length=None, max_length_factor=0.0):
    """The most tokens to generate for each sentence.

    Args:
      x: (N, T_x) int32 source ids.
      max_length: > 0: every sentence's limit; None or <= 0: by the sentence's length
        (its non-``<PAD>`` ids, ``</S>`` included), as below. An int or a scalar tensor.
      max_length_factor: <= 0: the length + 50; > 0 (Marian's ``--max-length-factor``):
        at most ``ceil(max_length_factor * length)`` too, which stops a hypothesis that
        never ends long before + 50 would. A float or a scalar tensor.
    Returns:
      (N,) int32.
    """
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(x, PAD_ID), tf.int32), axis=1)
    max_length = tf.cast(0 if max_length is None else max_length, tf.int32)
    factor = tf.cast(max_length_factor, tf.float32)
    # The minimum is taken in float32, before the cast: a huge factor cannot overflow int32.
    by_factor = tf.minimum(tf.math.ceil(factor * tf.cast(lengths, tf.float32)),
                           tf.cast(lengths + EXTRA_LENGTH, tf.float32))
    by_source = tf.where(factor > 0, tf.cast(by_factor, tf.int32), lengths + EXTRA_LENGTH)
    return tf.where(max_length > 0, tf.fill(tf.shape(lengths), max_length), by_source)


def _generate(model, x, limits, beam_size, length_penalty, nbest, patience, traced=True):
    """:func:`generate`'s growing loops, eager or inside a ``tf.function``: each a call of its own
    function (:func:`_traced`), which a graph does not inline (a call runs one loop; inlined, the
    other's thousand-odd nodes would be walked as dead ones). In a graph, with a tensor ``beam_size``,
    one ``tf.switch_case`` chooses greedy decoding, beam search, or nothing for a batch of no sentence.
    ``traced`` False: the loops as they are (:func:`_untraced`)."""
    loop = _traced if traced else _untraced
    greedy = lambda: loop(model, "greedy")(x, limits)  # noqa: E731
    beam = lambda: loop(model, "beam")(x, limits, beam_size, length_penalty, nbest, patience)  # noqa: E731
    if isinstance(beam_size, int) and isinstance(nbest, int):
        _check_beam(beam_size, nbest)
        return greedy() if beam_size == 1 else beam()
    beam_size, nbest = tf.cast(beam_size, tf.int32), tf.cast(nbest, tf.int32)
    checks = [
        tf.debugging.assert_greater_equal(beam_size, 1, message="beam_size must be at least 1"),
        tf.debugging.assert_greater_equal(nbest, 1, message="nbest must be at least 1"),
        tf.debugging.assert_less_equal(nbest, beam_size, message="nbest must be at most beam_size"),
    ]
    beam_size = checked(beam_size, *checks)

    def nothing():
        return _Decoded(tf.zeros([0, nbest, 0], tf.int32), tf.zeros([0, nbest], tf.float32), tf.constant(0))

    index = tf.where(tf.shape(x)[0] == 0, 0, tf.where(tf.equal(beam_size, 1), 1, 2))
    return tf.switch_case(index, [nothing, greedy, beam])


def checked(tensor, *checks):
    """``tensor``, available once the assertions ``checks`` have passed: what reads it waits for them, so a bad
    input fails with their message, not with an error of the computation it would have run."""
    with tf.control_dependencies(checks):
        return tf.identity(tensor)


# The growing loops run as one tf.function per model and kind, traced once with (None, None) ids, so
# eager batches of new shapes and new beam sizes do not retrace; a graph calls them without inlining them.
_TRACED = weakref.WeakKeyDictionary()
_IDS, _LIMITS = tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32)
_SIGNATURES = {
    "greedy": [_IDS, _LIMITS],
    "sample": [_IDS, _LIMITS, _LIMITS, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32),
               tf.TensorSpec([], tf.int64)],
    "beam": [_IDS, _LIMITS, tf.TensorSpec([], tf.int32), tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32),
             tf.TensorSpec([], tf.float32)],
}


def _traced(model, kind):
    """The growing loop ``kind`` ("greedy", "sample" or "beam") of ``model`` as a ``tf.function``, traced once
    per model and kind (its first call costs 1-3 s of tracing)."""
    functions = _TRACED.setdefault(model, {})
    if kind not in functions:
        functions[kind] = tf.function(_loop(weakref.ref(model), kind), input_signature=_SIGNATURES[kind],
                                      experimental_attributes={"_noinline": True}, autograph=False)
    return functions[kind]


def _untraced(model, kind):
    """:func:`_traced`'s loop run as it is: op by op when called eagerly (no trace first)."""
    return _loop(lambda: model, kind)


def _loop(model_ref, kind):
    """The Python function of the growing loop ``kind``, on the model ``model_ref()`` returns (a weak reference
    in :func:`_traced`'s cache, which must not keep the model alive)."""
    if kind == "greedy":
        def run(x, limits):
            return _greedy(model_ref(), x, limits)
    elif kind == "sample":
        def run(x, limits, keys, topk, temperature, seed):
            return _greedy(model_ref(), x, limits, choose=_sampler(keys, topk, temperature, seed))
    else:
        def run(x, limits, beam_size, length_penalty, nbest, patience):
            return _beam_search(model_ref(), x, limits, beam_size, length_penalty, nbest, patience=patience)
    return run


def compiled_decoder(model, beam_size=1, nbest=1, max_length=None, buckets=1):
    """The XLA-compiled decoding loop of ``model`` (one per model and arguments, kept).

    Args:
      beam_size, nbest: ints, as :func:`generate`'s (1: greedy).
      max_length: None or an int, the longest limit: <= 0 or None, the batch's source
        width + 50 (:func:`length_limits`' largest).
      buckets: an int, 1 to :data:`MAX_BUCKETS`: the loop's row buckets. 1: every row stays to the
        end. b > 1: one ``while_loop`` per bucket of ceil(N / 2**i) rows (sentences), i < b; when
        no more than the next bucket's rows are unfinished, those rows (unfinished first, then
        finished ones to fill it) move there with their caches and encoder output, and the
        finished rows' results are written out: a batch gets cheaper as its sentences end.
    Returns:
      a ``tf.function`` with ``jit_compile=True``: ``((N, T_x) int32 source ids, (N,) int32
      :func:`length_limits`, () float32 length penalty, () float32 patience) ->`` :class:`_Decoded`, ids
      (N, nbest, L) of the preallocated length L, to be cut at ``steps``; XLA compiles it
      once per input shape.
    """
    max_length = int(max_length or 0)
    buckets = check_buckets(buckets)
    key = ("xla", int(beam_size), int(nbest), max_length, buckets)
    functions = _TRACED.setdefault(model, {})
    if key not in functions:
        model_ref = weakref.ref(model)

        def run(x, limits, length_penalty, patience):
            length = max_length if max_length > 0 else tf.shape(x)[1] + EXTRA_LENGTH
            if beam_size == 1:
                return _greedy(model_ref(), x, limits, length, buckets=buckets)
            return _beam_search(model_ref(), x, limits, beam_size, length_penalty, nbest, length, buckets, patience)
        functions[key] = tf.function(run, jit_compile=True, input_signature=[
            _IDS, _LIMITS, tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.float32)], autograph=False)
    return functions[key]


def _cache_invariants(caches):
    """Shape invariants of the self-attention caches: rows and positions change, the head width does not."""
    return tf.nest.map_structure(lambda c: tf.TensorShape([None, None] + c.shape[2:]), caches)


def _longest(limits):
    """The largest of (N,) length limits; 0 when N = 0."""
    return tf.reduce_max(tf.concat([limits, [0]], axis=0))


class _Decoded(NamedTuple):
    """What a decoding loop returns: ``ids`` (N, nbest, T) int32, ``<PAD>`` after ``</S>``;
    ``scores`` (N, nbest) float32, best first; ``steps`` () int32, the steps taken: T, or
    with preallocated sequences (T = the preallocated length) the columns to keep."""
    ids: tf.Tensor
    scores: tf.Tensor
    steps: tf.Tensor


def _no_tokens(shape, length):
    """(*shape, 0) int32 to grow, or (*shape, length) ``<PAD>`` preallocated (``length`` not None)."""
    return tf.fill(shape + [0 if length is None else length], PAD_ID)


def _append(tokens, ids, t, length):
    """(..., T) ``tokens`` with (...) ``ids`` at step ``t``: appended, or written at column t
    of preallocated tokens (``length`` not None)."""
    if length is None:
        return tf.concat([tokens, ids[..., None]], axis=-1)
    return modules.write_at(tokens, ids[..., None], t, axis=tokens.shape.rank - 1)


def _greedy(model, x, limits, length=None, choose=None, buckets=1):
    """Cached greedy decoding: :class:`_Decoded` with (N, 1, T) ids and (N, 1) summed log-probabilities.

    ``choose``: None (the argmax), or ``callable((A, V) logits, step, (A,) rows) -> (A,) int32``
    ids, the next token of the A sentences still in the batch (``rows``: their indices in ``x``),
    as :func:`_sampler` draws them.

    ``limits``: (N,) int32, each sentence's :func:`length_limits`. ``length``: None, or the
    static number of positions to preallocate for the caches and the ids (at least every
    limit): every shape in the loop is then static (XLA). Without it, the sentences that
    have ended leave the batch (their caches and their encoder output too) once they are
    1 / :data:`GREEDY_LEAVE` of its rows, so that a batch costs about what its unfinished
    sentences cost, not its longest sentence times its size.
    """
    n = tf.shape(x)[0]
    compact = length is None  # the growing loop: finished rows leave, the encoder skips the pads
    context = model.start_decoding(x, _longest(limits) if compact else length, pack=compact)

    def not_done(t, rows, last, finished, row_limits, scores, tokens, memory, caches):
        return ~tf.reduce_all(finished)  # also when every row has left

    def step(t, rows, last, finished, row_limits, scores, tokens, memory, caches):
        logits, caches = model.decode_step(last[:, None], t, {**context, "memory": memory}, caches,
                                           in_place=not compact)
        logits = logits[:, 0]
        if choose is None:  # the argmax of the logits themselves, exactly as greedy_decode takes it
            picked, picked_scores = _argmax(logits, compiled=not compact)
        else:
            picked = choose(logits, t, rows)
            picked_scores = _log_probability(logits, picked)
        next_ids = tf.where(finished, PAD_ID, picked)
        token_scores = tf.where(finished, 0.0, picked_scores)
        finished |= tf.equal(next_ids, EOS_ID) | (t + 1 >= row_limits)
        if not compact:
            return t + 1, rows, next_ids, finished, row_limits, scores + token_scores, \
                _append(tokens, next_ids, t, length), memory, caches
        # rows: the sentences still in the batch (done ones too, until they are 1 / GREEDY_LEAVE of it); the
        # others get <PAD>.
        scores = tf.tensor_scatter_nd_add(scores, rows[:, None], token_scores)
        tokens = tf.concat([tokens, tf.scatter_nd(rows[:, None], next_ids, [n])[:, None]], axis=1)

        def leave():
            keep = tf.cast(tf.where(~finished)[:, 0], tf.int32)
            return ([tf.gather(v, keep) for v in (rows, next_ids, finished, row_limits)],
                    model.reorder_caches(memory, keep), model.reorder_caches(caches, keep))

        (rows, next_ids, finished, row_limits), memory, caches = tf.cond(
            tf.reduce_sum(tf.cast(finished, tf.int32)) * GREEDY_LEAVE >= tf.maximum(tf.size(finished), 1), leave,
            lambda: ([rows, next_ids, finished, row_limits], memory, caches))
        return t + 1, rows, next_ids, finished, row_limits, scores, tokens, memory, caches

    start = (tf.constant(0), tf.range(n), tf.fill([n], BOS_ID), limits <= 0, limits, tf.zeros([n], tf.float32),
             _no_tokens([n], length), context["memory"], model.empty_caches(n, 0 if length is None else length))
    vector = tf.TensorShape([None])
    invariants = None if length is not None else (
        tf.TensorShape([]), vector, vector, vector, vector, vector, tf.TensorShape([None, None]),
        _cache_invariants(start[-2]), _cache_invariants(start[-1]))
    if length is not None and buckets > 1:
        def write_out(out, state):
            _, rows, _, _, _, scores, tokens, _, _ = state
            return (tf.tensor_scatter_nd_update(out[0], rows[:, None], tokens),
                    tf.tensor_scatter_nd_update(out[1], rows[:, None], scores))

        def move(state, keep):
            t, rows, last, finished, row_limits, scores, tokens, memory, caches = state
            return (t, *[tf.gather(v, keep) for v in (rows, last, finished, row_limits, scores, tokens)],
                    model.reorder_caches(memory, keep), model.reorder_caches(caches, keep))

        steps, (tokens, scores) = _bucketed_loop(not_done, step, start, buckets, lambda state: ~state[3], write_out,
                                                 move, (start[6], start[5]))
        return _Decoded(tokens[:, None, :], scores[:, None], steps)
    steps, _, _, _, _, scores, tokens, _, _ = tf.while_loop(not_done, step, start, shape_invariants=invariants)
    return _Decoded(tokens[:, None, :], scores[:, None], steps)


def _argmax(logits, compiled):
    """((A,) int32 argmax, (A,) float32 its log-probability) of (A, V) ``logits``, the first of equal maxima.

    XLA (``compiled``): the argmax as the least index holding the maximum, and its log-probability as
    -log sum exp(z - max z): three plain reductions, which XLA vectorizes (its argmax, a reduction of
    (value, index) pairs, is not: 6 µs of a one-sentence step on 4,000 logits), and the maximum shared.
    Elsewhere TensorFlow's ``ArgMax`` and :func:`_log_p_of_max` at it.
    """
    logits = tf.cast(logits, tf.float32)  # exact from bfloat16: the same argmax (ArgMax of bfloat16: 2x the time)
    if not compiled:
        picked = tf.argmax(logits, axis=-1, output_type=tf.int32)
        return picked, _log_p_of_max(logits, picked)
    largest = tf.reduce_max(logits, axis=-1, keepdims=True)
    columns = tf.range(tf.shape(logits)[-1], dtype=tf.int32)
    picked = tf.reduce_min(tf.where(tf.equal(logits, largest), columns, tf.shape(logits)[-1]), axis=-1)
    return picked, -tf.math.log(tf.reduce_sum(tf.exp(logits - largest), axis=-1))


def _log_p_of_max(logits, picked):
    """(A,) float32 log-probability of the largest of each row of (A, V) ``logits``, outside XLA: the
    log of its softmax, which is at least 1/V (as exact as a log-softmax: no underflow), at ``picked``
    ((A,) int32, the argmax). One softmax (a oneDNN kernel on a CPU) costs 0.6x TensorFlow's
    ``LogSoftmax`` on a batch's (64, 4000) logits. Greedy decoding's score.
    """
    return tf.math.log(tf.gather(tf.nn.softmax(tf.cast(logits, tf.float32)), picked, batch_dims=1))


def _block_maxima_and_log_sum_exp(logits):
    """((A, blocks) float32 maxima of :data:`TOP_K_BLOCK` columns, (A,) float32 log-sum-exp) of (A, V)
    ``logits`` of the model's dtype, outside XLA: one softmax in float32 reads them whole, the rest only one
    block a row, cast once gathered (Grappler gives each reader of a bfloat16 model's logits cast whole that
    reorders values, as a reshape to blocks does, a full cast of its own). A row's log-sum-exp is its largest
    logit (read in the block of the largest probability) less the log of that probability (at least 1/V: no
    underflow); a block's maximum is the log of its largest probability plus the log-sum-exp (equal to its
    largest logit to rounding: blocks within that of each other may be searched in either order), -inf where
    every probability of the block underflows (more than about 100 below the largest logit: searched last)."""
    probabilities = tf.reduce_max(_blocks(tf.nn.softmax(tf.cast(logits, tf.float32)), 0.0), axis=-1)  # (A, blocks)
    largest_block = tf.argmax(probabilities, axis=-1, output_type=tf.int32)  # (A,)
    largest_row = tf.gather(_blocks(logits, _NO_SCORE), largest_block, batch_dims=1)  # (A, TOP_K_BLOCK)
    largest = tf.reduce_max(tf.cast(largest_row, tf.float32), axis=-1)
    log_sum_exp = largest - tf.math.log(tf.reduce_max(probabilities, axis=-1))
    return tf.math.log(probabilities) + log_sum_exp[:, None], log_sum_exp


def _log_probability(logits, ids):
    """(A,) float32 log-probabilities of drawn tokens ``ids`` ((A,) int32) under (A, V) ``logits``: a
    log-softmax (a drawn token's probability may underflow; the argmax's: :func:`_log_p_of_max`)."""
    return tf.gather(tf.nn.log_softmax(tf.cast(logits, tf.float32)), ids, batch_dims=1)


def _bucketed_loop(not_done, step, start, buckets, unfinished, write_out, move, out):
    """:func:`compiled_decoder`'s loop over row buckets (static shapes in each).

    ``start``: the loop state of N rows, ``(t, rows, ...)``, ``rows`` the rows' indices in the
    batch; ``step`` as ``tf.while_loop``'s body. ``unfinished(state)``: (B,) bool. ``write_out(out,
    state) -> out``: the results of the bucket's rows written at their ``rows``. ``move(state,
    keep) -> state``: the state of the rows ``keep`` ((B',) int32). Returns ``(steps, out)``.
    """
    n = tf.shape(start[1])[0]
    state = start
    for i in range(buckets):
        if i + 1 < buckets:
            size = (n + 2 ** (i + 1) - 1) // 2 ** (i + 1)

            def go_on(*state, size=size):
                return not_done(*state) & (tf.reduce_sum(tf.cast(unfinished(state), tf.int32)) > size)
        else:
            go_on = not_done
        state = tf.while_loop(go_on, step, state)
        out = write_out(out, state)
        if i + 1 < buckets:
            # The unfinished rows first (top_k keeps the lower index first among equals), then finished ones.
            _, keep = tf.math.top_k(tf.cast(unfinished(state), tf.float32), size)
            state = move(state, keep)
    return state[0], out


class Sampling(NamedTuple):
    """How :func:`sample` draws: among the ``topk`` (>= 1) most likely tokens of each step (all of
    them when ``topk`` is the vocabulary or more), by their probabilities at ``temperature`` (> 0;
    below 1 sharper, above 1 flatter), from the noise of ``seed`` (0 to 2**32 - 1)."""
    topk: int
    temperature: float = 1.0
    seed: int = 0


def sample(model, x, sampling, keys=None, max_length=None, max_length_factor=0.0, traced=True):
    """Draws one translation per sentence instead of searching (cached, as greedy decoding).

    Args:
      model, x, max_length, max_length_factor: as :func:`generate`'s.
      sampling: a :class:`Sampling`.
      keys: optional (N,) int ids of the sentences (default 0..N-1): a sentence's draw depends on
        the seed, its key and the model only, not on the other sentences of the batch.
      traced: as :func:`generate`'s: False runs the loop op by op when called eagerly. The same draws.
    Returns:
      ``(ids, scores)`` as :func:`generate`'s with ``beam_size=1``: (N, 1, T) int32 and (N, 1)
      float32, the model's log-probability of the drawn tokens (temperature 1, every token).
      ``topk=1`` gives greedy decoding's translations and scores.
    Raises:
      ValueError: ``topk`` below 1, or ``temperature`` not a positive finite number.
    """
    topk, temperature = int(sampling.topk), float(sampling.temperature)
    if topk < 1:
        raise ValueError(f"topk={topk}: must be at least 1")
    if not 0 < temperature < float("inf"):
        raise ValueError(f"temperature={temperature}: must be a positive finite number")
    x = tf.cast(x, tf.int32)
    keys = tf.range(tf.shape(x)[0]) if keys is None else tf.cast(keys, tf.int32)
    values = (x, length_limits(x, max_length, max_length_factor), keys, min(topk, model.target_vocab_size),
              temperature, int(sampling.seed))
    # The traced loop's argument types, for the untraced one too: the same draws.
    args = [tf.convert_to_tensor(value, spec.dtype) for value, spec in zip(values, _SIGNATURES["sample"])]
    decoded = (_traced if traced else _untraced)(model, "sample")(*args)
    return decoded.ids[:, :, :decoded.steps], decoded.scores


def _sampler(keys, topk, temperature, seed):
    """:func:`_greedy`'s ``choose`` for :func:`sample`: the Gumbel-max trick over the ``topk`` best of
    the logits / ``temperature``, which draws token i with probability softmax(logits / temperature)_i
    among them. ``keys``: (N,) int32 sentence keys; topk: () int32 <= V; temperature: () float32;
    seed: () int64."""

    def choose(logits, t, rows):
        values, ids = top_k_of_rows(tf.cast(logits, tf.float32) / temperature, topk)  # (A, k)
        uniform = _hashed_uniform([seed, tf.gather(keys, rows)[:, None], t, tf.range(tf.shape(values)[1])[None]])
        choice = tf.argmax(values - tf.math.log(-tf.math.log(uniform)), axis=-1, output_type=tf.int32)
        return tf.gather(ids, choice, batch_dims=1)

    return choose


def _hashed_uniform(parts):
    """Uniform numbers in (0, 1), float32, one per element of the broadcast of the integer tensors
    ``parts``: a 32-bit integer hash (Wellons' lowbias32) chained over the parts. The same parts
    give the same numbers on any machine and in any batch."""
    h = tf.zeros([], tf.uint32)
    for part in parts:
        h = _lowbias32(h + tf.cast(part, tf.uint32))
    return (tf.cast(tf.bitwise.right_shift(h, 8), tf.float32) + 0.5) / float(1 << 24)


def _lowbias32(x):
    """(...) uint32 -> (...) uint32, a well-mixed bijection (wrapping arithmetic)."""
    for shift, factor in ((16, 0x7FEB352D), (15, 0x846CA68B)):
        x = tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, shift)) * tf.constant(factor, tf.uint32)
    return tf.bitwise.bitwise_xor(x, tf.bitwise.right_shift(x, 16))


def _beam_search(model, x, limits, beam_size, length_penalty, nbest, length=None, buckets=1, patience=0.0):
    """Beam search (see the module docstring): :class:`_Decoded` with (N, nbest, T) ids and
    (N, nbest) GNMT scores; ``limits`` and ``length`` as :func:`_greedy`'s (without ``length``,
    a sentence leaves the batch when it is done); ``patience`` as :func:`generate`'s."""
    n, k = tf.shape(x)[0], beam_size
    vocab_size = model.target_vocab_size
    compact = length is None  # the growing loop: finished rows leave, the encoder skips the pads
    context = model.start_decoding(x, _longest(limits) if compact else length, pack=compact)

    patience = tf.cast(patience, tf.float32)
    # CTranslate2's rule: done once this many hypotheses have ended (never, with patience 0).
    enough = tf.where(patience > 0, tf.maximum(tf.cast(tf.math.ceil(patience * tf.cast(k, tf.float32)), tf.int32),
                                               nbest), tf.int32.max)

    def penalty(length):
        return gnmt_penalty(length, length_penalty)

    def done(t, beams, row_limits):
        """(A,) bool, before step ``t``: no alive hypothesis can still beat the ``nbest``-th finished
        one, at any length up to the limit (none can once the limit has cut them all), or (with a
        patience) ``enough`` hypotheses have ended."""
        best_reachable = beams["alive_log_probs"][:, 0] / tf.maximum(penalty(t + 1), penalty(row_limits))
        return (beams["finished_scores"][:, nbest - 1] >= best_reachable) | (beams["ended"] >= enough)

    def not_done(t, rows, row_limits, beams, out, memory, caches):
        if compact:  # the sentences that are done have left at the step before (none is done before the first)
            return tf.size(rows) > 0
        return ~tf.reduce_all(done(t, beams, row_limits))

    def extend(t, beams, row_limits, memory, caches, first=False):
        """Step ``t`` of the A sentences in the batch: (beams, caches with step t, not yet reordered,
        (A*k,) int32 parents: the cache row each new hypothesis continues). ``first``: the step from
        ``<S>``, whose k hypotheses of a sentence are one: the decoder runs on one row a sentence (caches of
        A rows) and its logits stand for all k (only the first has a log-probability above -inf)."""
        a = tf.shape(row_limits)[0]
        logits, caches = model.decode_step(beams["last"][:, :1] if first else beams["last"], t,
                                           {**context, "memory": memory}, caches, in_place=not compact)  # (A, k, V)
        if first:
            logits = tf.tile(logits, [1, k, 1])
        logits = tf.reshape(logits, [a * k, vocab_size])  # the model's dtype
        # The 2k best extensions of a sentence (at least k of them do not end, whatever
        # ends): log p(hypothesis) + log p(token), among the k * V of its hypotheses.
        if compact:  # one top_k of each sentence's k rows together (TF's top_k: its cost is per row)
            maxima, log_sum_exp = _block_maxima_and_log_sum_exp(logits)
            offsets = tf.reshape(beams["alive_log_probs"], [-1]) - log_sum_exp
            top_log_probs, top_index = top_k_of_rows(logits, 2 * k, offsets, group=k, maxima=maxima)  # (A, 2k)
            top_beams, top_ids = top_index // vocab_size, top_index % vocab_size
        else:  # XLA: the 2k best of each hypothesis first (faster there: one sentence 1.1x), its log-sum-exp fused
            logits = tf.cast(logits, tf.float32)
            row_logits, row_ids = top_k_of_rows(logits, tf.minimum(2 * k, vocab_size))  # (A*k, m)
            row_log_probs = row_logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
            log_probs = beams["alive_log_probs"][:, :, None] + tf.reshape(row_log_probs, [a, k, -1])  # (A, k, m)
            top_log_probs, top_index = tf.math.top_k(tf.reshape(log_probs, [a, -1]), 2 * k)
            top_beams = top_index // tf.shape(row_ids)[1]
            top_ids = tf.gather(tf.reshape(row_ids, [a, -1]), top_index, batch_dims=1)
        top_seq = _append(tf.gather(beams["alive_seq"], top_beams, batch_dims=1), top_ids, t, length)
        ended = tf.equal(top_ids, EOS_ID)

        alive_log_probs, keep = tf.math.top_k(tf.where(ended, _NO_SCORE, top_log_probs), k)
        alive_seq = tf.gather(top_seq, keep, batch_dims=1)
        parents = tf.gather(top_beams, keep, batch_dims=1) + k * tf.range(a)[:, None]
        if first:
            parents //= k  # the cache row of the sentence's one hypothesis

        # Finished: the best k of those kept, those ending now, and at the limit those cut there.
        cut = (t + 1 >= row_limits)[:, None]
        scores = tf.concat([beams["finished_scores"], tf.where(ended, top_log_probs, _NO_SCORE) / penalty(t + 1),
                            tf.where(cut, alive_log_probs, _NO_SCORE) / penalty(t + 1)], axis=1)
        kept = beams["finished_seq"] if not compact else _pad_step(beams["finished_seq"])
        finished_scores, keep_finished = tf.math.top_k(scores, k)
        finished_seq = tf.gather(tf.concat([kept, top_seq, alive_seq], axis=1), keep_finished, batch_dims=1)
        # Patience counts those that end among the k best extensions (CTranslate2's count).
        ended_in_beam = ended[:, :k] & (top_log_probs[:, :k] > _NO_SCORE)
        return {"ended": beams["ended"] + tf.reduce_sum(tf.cast(ended_in_beam, tf.int32), axis=1),
                "last": tf.gather(top_ids, keep, batch_dims=1), "alive_seq": alive_seq,
                "alive_log_probs": tf.where(cut, _NO_SCORE, alive_log_probs), "finished_seq": finished_seq,
                "finished_scores": finished_scores}, caches, tf.reshape(parents, [-1])

    def step(t, rows, row_limits, beams, out, memory, caches, first=False):
        beams, caches, parents = extend(t, beams, row_limits, memory, caches, first)
        if not compact:  # beam caches: their keys and values stay, the hypotheses follow their parents' ancestry
            return t + 1, rows, row_limits, beams, out, memory, model.follow_parents(caches, parents)
        # rows: the sentences still in the batch; a sentence that is done leaves it, its n-best into `out`.
        out = {"seq": _pad_step(out["seq"]), "scores": out["scores"]}
        leaving = done(t + 1, beams, row_limits)

        def leave():
            gone, keep = tf.where(leaving), tf.cast(tf.where(~leaving)[:, 0], tf.int32)
            indices = tf.gather_nd(rows, gone)[:, None]
            left = {"seq": tf.tensor_scatter_nd_update(out["seq"], indices, tf.gather_nd(beams["finished_seq"], gone)),
                    "scores": tf.tensor_scatter_nd_update(out["scores"], indices,
                                                          tf.gather_nd(beams["finished_scores"], gone))}
            hypotheses = tf.reshape(keep[:, None] * k + tf.range(k)[None], [-1])
            return (tf.gather(rows, keep), tf.gather(row_limits, keep),
                    tf.nest.map_structure(lambda v: tf.gather(v, keep), beams), left,
                    model.reorder_caches(memory, keep), model.reorder_caches(caches, tf.gather(parents, hypotheses)))

        # The caches are reordered once: by the parents of the hypotheses that stay.
        return (t + 1, *tf.cond(tf.reduce_any(leaving), leave, lambda: (
            rows, row_limits, beams, out, memory, model.reorder_caches(caches, parents))))

    only_first = tf.where(tf.range(k) == 0, 0.0, _NO_SCORE)  # k copies of <S>: expand one
    beams = {"ended": tf.zeros([n], tf.int32), "last": tf.fill([n, k], BOS_ID), "alive_seq": _no_tokens([n, k], length),
             "alive_log_probs": tf.tile(only_first[None], [n, 1]), "finished_seq": _no_tokens([n, k], length),
             "finished_scores": tf.fill([n, k], _NO_SCORE)}
    out = {"seq": _no_tokens([n, k], length), "scores": tf.fill([n, k], _NO_SCORE)}
    start = (tf.constant(0), tf.range(n), limits, beams, out, context["memory"],
             model.empty_caches(n * k) if compact else model.empty_beam_caches(n, k, length))
    if compact:  # the first step outside the loop, on one row a sentence (none is done before it)
        start = tf.cond(n > 0, lambda: step(*start[:-1], model.empty_caches(n), first=True), lambda: start)
    invariants = None if length is not None else (
        tf.TensorShape([]), tf.TensorShape([None]), tf.TensorShape([None]), _leading_unknown(beams),
        _leading_unknown(out),
        _cache_invariants(start[-2]), _cache_invariants(start[-1]))
    if length is not None and buckets > 1:
        def write_out(out, state):
            _, rows, _, beams, _, _, _ = state
            return {"seq": tf.tensor_scatter_nd_update(out["seq"], rows[:, None], beams["finished_seq"]),
                    "scores": tf.tensor_scatter_nd_update(out["scores"], rows[:, None], beams["finished_scores"])}

        def move(state, keep):
            t, rows, row_limits, beams, out, memory, caches = state
            hypotheses = tf.reshape(keep[:, None] * k + tf.range(k)[None], [-1])
            return (t, tf.gather(rows, keep), tf.gather(row_limits, keep),
                    tf.nest.map_structure(lambda v: tf.gather(v, keep), beams), out,
                    model.reorder_caches(memory, keep), model.reorder_caches(caches, hypotheses))

        # No `out` in the loops' state: a loop variable that never changes trips XLA's constant propagation.
        start = start[:4] + ({},) + start[5:]
        steps, out = _bucketed_loop(not_done, step, start, buckets, lambda state: ~done(state[0], state[3], state[2]),
                                    write_out, move, out)
        return _Decoded(out["seq"][:, :nbest], out["scores"][:, :nbest], steps)
    steps, _, _, beams, out, _, _ = tf.while_loop(not_done, step, start, shape_invariants=invariants)
    result = out if compact else {"seq": beams["finished_seq"], "scores": beams["finished_scores"]}
    return _Decoded(result["seq"][:, :nbest], result["scores"][:, :nbest], steps)  # sorted by top_k


def gnmt_penalty(length, alpha):
    """GNMT's length penalty ``((5 + length) / 6) ** alpha`` (float32, the shape of ``length``): beam search
    divides a hypothesis' log-probability by it, ``length`` counting ``</S>``."""
    return ((5.0 + tf.cast(length, tf.float32)) / 6.0) ** tf.cast(alpha, tf.float32)


def _pad_step(sequences):
    """(..., T) int32 ids -> (..., T + 1), ``<PAD>`` in the new column."""
    return tf.pad(sequences, [[0, 0]] * (sequences.shape.rank - 1) + [[0, 1]], constant_values=PAD_ID)


def _leading_unknown(structure):
    """Shape invariants of tensors whose first dimension (the sentences in the batch) and, for
    ids, last (the steps) change."""
    return tf.nest.map_structure(lambda v: tf.TensorShape([None] + v.shape[1:-1] + [None]) if v.shape.rank == 3
                                 else tf.TensorShape([None] + v.shape[1:]), structure)


def _blocks(values, pad_value):
    """(R, W) -> (R, blocks, TOP_K_BLOCK): ``values`` in blocks of :data:`TOP_K_BLOCK` columns (static W), the
    last one padded with ``pad_value``."""
    blocks = -(-values.shape[-1] // TOP_K_BLOCK)
    if blocks * TOP_K_BLOCK != values.shape[-1]:
        values = tf.pad(values, [[0, 0], [0, blocks * TOP_K_BLOCK - values.shape[-1]]], constant_values=pad_value)
    return tf.reshape(values, [tf.shape(values)[0], blocks, TOP_K_BLOCK])


def top_k_of_rows(values, k, offsets=None, group=1, maxima=None):
    """``tf.math.top_k(values, k)`` of (R, W) float32 rows (static W), quicker on CPUs; with
    ``offsets`` and ``group``, the k best of each ``group`` consecutive rows as one row.

    TF's top_k sorts partially through every value, about 3 ns each on a CPU: more
    than the vocabulary projection that made them. Here blocks of ``TOP_K_BLOCK``
    values are reduced to their maximum first, and only the k best blocks are
    searched: they hold the k best values, since a block ranks above the block of
    one of them only by holding a greater value, and at most k - 1 values are.
    Equal values may come in another order than top_k's.

    Args:
      values: (R, W) float32, or with ``maxima`` of another float dtype, the searched blocks cast to float32.
      k: an int or () int32, at most ``group * W``.
      offsets: None, or (R,) float32 added to each row's values (beam search: a hypothesis'
        log-probability, added to its next tokens' log-probabilities). A block's maximum plus its
        row's offset is exactly its best value plus the offset (rounding is monotonic).
      group: an int or () int32 dividing R: the k best of each ``group`` rows together (beam
        search: a sentence's k hypotheses), one top_k of R / group rows, not one per row.
      maxima: (R, blocks) the maxima of each row's blocks when computed already (a block whose
        maximum is -inf is searched last), else None.
    Returns:
      (R / group, k) values (plus offsets), best first, and their (R / group, k) int32 indices
      into the group's ``group * W`` values: row in the group * W + column.
    """
    rows, width = tf.shape(values)[0], values.shape[-1]
    blocked = _blocks(values, _NO_SCORE)  # (R, blocks, TOP_K_BLOCK)
    blocks = blocked.shape[1]
    if maxima is None:
        maxima = tf.reduce_max(blocked, axis=-1)  # (R, blocks)
    if offsets is not None:
        maxima += offsets[:, None]
    groups = rows // group
    by_block = tf.reshape(blocked, [groups, group * blocks, TOP_K_BLOCK])
    searched = tf.minimum(k, group * blocks)  # blocks searched: no -1 in the reshapes (G may be 0)
    _, best_blocks = tf.math.top_k(tf.reshape(maxima, [groups, group * blocks]), searched)
    candidates = tf.cast(tf.gather(by_block, best_blocks, batch_dims=1), tf.float32)  # (G, searched, TOP_K_BLOCK)
    if offsets is not None:
        candidates += tf.gather(tf.reshape(offsets, [groups, group]), best_blocks // blocks, batch_dims=1)[:, :, None]
    top_values, best = tf.math.top_k(tf.reshape(candidates, [groups, searched * TOP_K_BLOCK]), k)
    block = tf.gather(best_blocks, best // TOP_K_BLOCK, batch_dims=1)
    # A padded column wins only a tie of -inf values (rows of dead hypotheses): any real one will do.
    column = tf.minimum(block % blocks * TOP_K_BLOCK + best % TOP_K_BLOCK, width - 1)
    return top_values, block // blocks * width + column

"""Beam search's self-attention caches that are never reordered (parent pointers,
``MultiheadAttention.empty_beam_cache``): at every step the outputs of a preallocated cache that is
reordered by the parents (``gather_cache``, what the compiled beam loop did before), eager and
compiled by XLA, float32 and bfloat16, with masked positions, and after sentences leave the batch."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.nn.modules import MultiheadAttention

UNITS, HEADS, SENTENCES, BEAM, STEPS, LENGTH = 8, 2, 3, 3, 6, 9


def make_layer(dtype="float32"):
    layer = MultiheadAttention(num_units=UNITS, num_heads=HEADS, causality=True, output_projection=True, dtype=dtype)
    layer(tf.zeros([1, 1, UNITS]), tf.zeros([1, 1, UNITS]))
    rng = np.random.default_rng(7)
    for w in layer.weights:
        w.assign(rng.normal(scale=0.5, size=tuple(w.shape)).astype("float32") + (w.name == "gamma"))
    return layer


def beam_inputs(seed=0):
    """(steps, sentences*beam, 1, C) inputs, (steps, sentences*beam) 0/1 masks (some 0), and
    (steps, sentences*beam) parents: for each hypothesis a random hypothesis of its own sentence."""
    rng = np.random.default_rng(seed)
    rows = SENTENCES * BEAM
    inputs = rng.normal(size=(STEPS, rows, 1, UNITS)).astype("float32")
    masks = (rng.random((STEPS, rows)) > 0.2).astype("float32")
    masks[:, 0] = 1.0  # one hypothesis sees every position
    parents = rng.integers(0, BEAM, size=(STEPS, rows)) + np.repeat(np.arange(SENTENCES) * BEAM, BEAM)
    return tf.constant(inputs), tf.constant(masks), tf.constant(parents, tf.int32)


def decode(layer, inputs, masks, parents, beam_cache, leave_at=None, keep=(2, 0)):
    """The outputs of every step, (steps, rows, C) float32: the k new positions attend to the cache,
    then the hypotheses continue their parents; at step ``leave_at`` only the sentences ``keep`` stay."""
    rows = inputs.shape[1]
    dtype = layer.compute_dtype
    cache = layer.empty_beam_cache(SENTENCES, BEAM, LENGTH) if beam_cache else layer.empty_cache(rows, LENGTH)
    outputs = []
    for t in range(STEPS):
        x, m = tf.cast(inputs[t], dtype), masks[t][:, None]
        live = rows if leave_at is None or t < leave_at else len(keep) * BEAM
        if leave_at is not None and t >= leave_at:
            hypotheses = tf.reshape(tf.constant(keep)[:, None] * BEAM + tf.range(BEAM), [-1])
            x, m = tf.gather(x, hypotheses), tf.gather(m, hypotheses)
        out, cache = layer.call_cached(x, cache, keys=x, query_masks=m, key_masks=m, position=t)
        outputs.append(tf.cast(out[:, 0], tf.float32))
        step_parents = parents[t][:live]
        if leave_at is not None and t >= leave_at:  # the kept sentences' own rows, renumbered
            step_parents = step_parents % BEAM + tf.repeat(tf.range(len(keep)) * BEAM, BEAM)
        cache = layer.follow_parents(cache, step_parents) if beam_cache else layer.gather_cache(cache, step_parents)
        if leave_at is not None and t + 1 == leave_at:
            cache = layer.gather_cache(cache, tf.reshape(tf.constant(keep)[:, None] * BEAM + tf.range(BEAM), [-1]))
    return outputs


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("leave_at", [None, 3])
def test_a_beam_cache_attends_as_the_reordered_cache(compiled, leave_at):
    layer = make_layer()
    inputs, masks, parents = beam_inputs()

    def run(beam_cache):
        return decode(layer, inputs, masks, parents, beam_cache, leave_at)

    if compiled:
        got, expected = (tf.function(lambda b=b: run(b), jit_compile=True)() for b in (True, False))
    else:
        got, expected = run(True), run(False)
    for t, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-5, err_msg=f"step {t}")
    # The test can fail: without following the parents the outputs differ from the first reorder on.
    unfollowed = decode(layer, inputs, masks, tf.tile(tf.range(SENTENCES * BEAM)[None], [STEPS, 1]), True, leave_at)
    assert not np.allclose(unfollowed[2].numpy(), expected[2].numpy(), atol=1e-3)


def test_a_bfloat16_beam_cache_attends_as_the_reordered_cache():
    layer = make_layer("mixed_bfloat16")
    inputs, masks, parents = beam_inputs(seed=1)
    got, expected = (tf.function(lambda b=b: decode(layer, inputs, masks, parents, b), jit_compile=True)()
                     for b in (True, False))
    for t, (a, b) in enumerate(zip(got, expected)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=0.05, atol=0.05, err_msg=f"step {t}")


def test_a_beam_cache_keeps_its_keys_in_place_and_the_parents_in_its_ancestry():
    layer = make_layer()
    inputs, masks, parents = beam_inputs(seed=2)
    cache = layer.empty_beam_cache(SENTENCES, BEAM, LENGTH)
    _, cache = layer.call_cached(inputs[0], cache, keys=inputs[0], query_masks=masks[0][:, None],
                                 key_masks=masks[0][:, None], position=0)
    followed = layer.follow_parents(cache, parents[0])
    for name in ("key", "value", "key_masks"):
        np.testing.assert_array_equal(followed[name].numpy(), cache[name].numpy())
    ancestry = followed["ancestry"].numpy().reshape(SENTENCES * BEAM, LENGTH)
    np.testing.assert_array_equal(ancestry[:, 0], parents[0].numpy() % BEAM)

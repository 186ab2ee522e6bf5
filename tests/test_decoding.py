"""Reference greedy decoding."""

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.decoding import greedy_decode
from tf_transformer.model import Transformer
from tf_transformer.vocab import BOS_ID, EOS_ID, PAD_ID


def make_model(mask_source="embedding"):
    tf.random.set_seed(1)
    model = Transformer(30, 25, num_blocks=2, num_units=16, num_heads=2, d_ff=32,
                        positional_encoding="sinusoid", mask_source=mask_source)
    ids = tf.constant([[5, 6]])
    model((ids, ids))
    return model


SOURCE = np.array([[5, 9, 7, 3, 0], [8, 3, 0, 0, 0], [11, 12, 13, 14, 3]], np.int32)


def favour_token(model, token):
    """Makes ``token`` the argmax everywhere by biasing the output layer."""
    bias = np.zeros(25, np.float32)
    bias[token] = 1e4
    model.logits_layer.bias.assign(bias)


@pytest.mark.parametrize("mask_source", ["embedding", "inputs"])
def test_each_token_is_the_argmax_given_the_prefix(mask_source):
    """The defining property of greedy decoding, checked with one teacher-forced
    pass of the whole model over the decoded sequence."""
    model = make_model(mask_source)
    if mask_source == "inputs":
        # With gamma=1, beta=0 (untrained) every LayerNorm output row sums to ~0
        # in float32, so the blog's sign(abs(sum(x))) masks rows at random: the
        # original's defect. Trained-like values make the rule well defined.
        rng = np.random.default_rng(0)
        for weight in model.weights:
            if weight.path.endswith(("gamma", "beta")):
                weight.assign(rng.normal(scale=0.5, size=weight.shape).astype(np.float32))
    tokens = greedy_decode(model, SOURCE, max_length=8)
    decoder_inputs = np.concatenate([np.full([3, 1], BOS_ID), tokens[:, :-1]], axis=1)
    logits = model((tf.constant(SOURCE), tf.constant(decoder_inputs)), training=False).numpy()
    for row in range(3):
        ends = np.flatnonzero(tokens[row] == EOS_ID)
        length = ends[0] + 1 if ends.size else tokens.shape[1]
        np.testing.assert_array_equal(tokens[row, :length], logits[row, :length].argmax(-1))
        assert (tokens[row, length:] == PAD_ID).all()


def test_stops_as_soon_as_every_sentence_has_ended():
    model = make_model()
    favour_token(model, EOS_ID)
    np.testing.assert_array_equal(greedy_decode(model, SOURCE), [[EOS_ID]] * 3)


def test_default_length_limit_is_source_length_plus_50():
    model = make_model()
    favour_token(model, 7)
    tokens = greedy_decode(model, SOURCE)
    assert tokens.shape == (3, SOURCE.shape[1] + 50)
    assert (tokens == 7).all()
    assert greedy_decode(model, SOURCE, max_length=4).shape == (3, 4)


def test_on_step_sees_the_growing_output():
    model = make_model()
    seen = []
    tokens = greedy_decode(model, SOURCE, max_length=5, on_step=lambda step, t: seen.append((step, t.copy())))
    assert [step for step, _ in seen] == list(range(len(seen)))
    for step, partial in seen:
        np.testing.assert_array_equal(partial, tokens[:, : step + 1])

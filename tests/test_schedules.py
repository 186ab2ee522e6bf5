"""Tests for ``NoamSchedule`` (the 2019 ``noam_scheme``) and ``label_smoothing``."""

import math

import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_transformer.modules import NoamSchedule, label_smoothing


def noam(init_lr, warmup, step):
    """lr = init_lr * warmup^0.5 * min(step * warmup^-1.5, step^-0.5), step 1-based."""
    return init_lr * warmup**0.5 * min(step * warmup**-1.5, step**-0.5)


@pytest.mark.parametrize("init_lr,warmup", [(3e-4, 4000), (1e-3, 10), (1.0, 1)])
def test_noam_key_points(init_lr, warmup):
    schedule = NoamSchedule(init_lr, warmup_steps=warmup)
    at = lambda iteration: float(schedule(tf.constant(iteration, tf.int64)))
    # Iteration 0 is step 1.
    assert at(0) == pytest.approx(init_lr / warmup, rel=1e-6)
    assert at(0) == pytest.approx(noam(init_lr, warmup, 1), rel=1e-6)
    # Peak at step == warmup, i.e. iteration warmup - 1.
    assert at(warmup - 1) == pytest.approx(init_lr, rel=1e-6)
    assert at(warmup - 1) == pytest.approx(noam(init_lr, warmup, warmup), rel=1e-6)
    # Step 10 * warmup: decayed by 1/sqrt(10).
    assert at(10 * warmup - 1) == pytest.approx(init_lr / math.sqrt(10), rel=1e-6)
    assert at(10 * warmup - 1) == pytest.approx(noam(init_lr, warmup, 10 * warmup), rel=1e-6)


def test_noam_matches_formula_everywhere():
    init_lr, warmup = 5e-4, 50
    schedule = NoamSchedule(init_lr, warmup_steps=warmup)
    iterations = np.arange(0, 400)
    got = schedule(tf.constant(iterations)).numpy()
    expected = [noam(init_lr, warmup, i + 1) for i in iterations]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # Rises linearly up to the peak, then decays.
    assert np.all(np.diff(got[:warmup]) > 0)
    assert np.all(np.diff(got[warmup - 1 :]) < 0)
    assert np.argmax(got) == warmup - 1


def test_noam_in_optimizer_uses_zero_based_iterations():
    init_lr, warmup = 1e-3, 10
    optimizer = keras.optimizers.Adam(learning_rate=NoamSchedule(init_lr, warmup_steps=warmup))
    assert int(optimizer.iterations) == 0
    assert float(optimizer.learning_rate) == pytest.approx(init_lr / warmup, rel=1e-6)
    var = keras.Variable([1.0, 2.0])
    for _ in range(warmup - 1):
        optimizer.apply_gradients([(tf.constant([0.1, 0.1]), var)])
    assert int(optimizer.iterations) == warmup - 1
    assert float(optimizer.learning_rate) == pytest.approx(init_lr, rel=1e-6)


def test_noam_get_config_round_trip():
    schedule = NoamSchedule(3e-4, warmup_steps=4000)
    config = schedule.get_config()
    assert config == {"init_lr": 3e-4, "warmup_steps": 4000}
    restored = NoamSchedule.from_config(config)
    assert float(restored(123)) == float(schedule(123))
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(again, NoamSchedule) and again.get_config() == config


@pytest.mark.parametrize("epsilon", [0.1, 0.0, 0.3])
def test_label_smoothing_values(epsilon):
    vocab = 5
    ids = np.array([[0, 3, 4], [2, 2, 1]])
    onehot = np.eye(vocab, dtype=np.float64)[ids]
    got = label_smoothing(tf.constant(onehot, tf.float32), epsilon=epsilon).numpy()
    expected = (1 - epsilon) * onehot + epsilon / vocab
    assert got.shape == (2, 3, vocab)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)
    # Target gets 1 - eps + eps/V, every other class eps/V.
    np.testing.assert_allclose(got[0, 1, 3], 1 - epsilon + epsilon / vocab, atol=1e-7)
    np.testing.assert_allclose(got[0, 1, 0], epsilon / vocab, atol=1e-7)


def test_label_smoothing_default_epsilon_by_hand():
    got = label_smoothing(tf.constant([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])).numpy()
    third = 0.1 / 3
    np.testing.assert_allclose(got, [[third, third, 0.9 + third], [third, 0.9 + third, third]], atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)


def test_label_smoothing_of_a_distribution_is_a_distribution():
    probs = tf.nn.softmax(tf.random.stateless_normal([4, 7], seed=[3, 4]))
    got = label_smoothing(probs, epsilon=0.2).numpy()
    np.testing.assert_allclose(got, 0.8 * probs.numpy() + 0.2 / 7, atol=1e-7)
    np.testing.assert_allclose(got.sum(-1), 1.0, atol=1e-6)

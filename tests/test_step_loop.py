"""loop.fetching_first_during: the first batch is read while the step is traced, and nothing is lost."""

import threading

import numpy as np
import pytest
import tensorflow as tf

from tf_transformer.train.loop import fetching_first_during, finite_check


def test_every_element_comes_once_in_order_after_the_work_ran():
    ran = []
    dataset = tf.data.Dataset.range(5)
    values = []
    for value in fetching_first_during(dataset, lambda: ran.append(len(values))):
        values.append(int(value))
    assert values == [0, 1, 2, 3, 4]
    assert ran == [0]  # once, before the first element was handed out


def test_the_first_element_is_read_while_the_work_runs():
    read = threading.Event()

    def mark(value):
        read.set()
        return value

    dataset = tf.data.Dataset.range(3).map(lambda v: tf.numpy_function(mark, [v], tf.int64))
    seen_during_work = []
    values = list(fetching_first_during(dataset, lambda: seen_during_work.append(read.wait(timeout=30))))
    assert seen_during_work == [True]  # the work waited for the read, so the read did not wait for the work
    assert [int(v) for v in values] == [0, 1, 2]


def test_an_empty_dataset_gives_nothing_and_still_runs_the_work():
    ran = []
    assert list(fetching_first_during(tf.data.Dataset.range(0), lambda: ran.append(1))) == []
    assert ran == [1]


def test_an_error_reading_the_first_element_is_raised_in_the_caller():
    def check(value):
        with tf.control_dependencies([tf.debugging.assert_non_negative(value, message="corrupt record")]):
            return tf.identity(value)

    dataset = tf.data.Dataset.from_tensors(np.float32(-1.0)).map(check)
    with pytest.raises(tf.errors.InvalidArgumentError, match="corrupt record"):
        list(fetching_first_during(dataset, lambda: None))


def test_the_finite_check_reads_the_weights_as_they_are_at_each_call():
    """finite_check traces once with the variables captured: each call must see their current values, as numpy
    judges them, not those of the trace."""
    weights = [tf.Variable(np.ones([2, 3], np.float32)), tf.Variable(np.zeros([4], np.float32))]
    check = finite_check(weights)
    for bad in (np.inf, -np.inf, np.nan, 1.0):
        values = np.zeros([4], np.float32)
        values[2] = bad
        weights[1].assign(values)
        assert bool(check()) == bool(np.isfinite(values).all() and np.isfinite(weights[0].numpy()).all())
    assert check.experimental_get_tracing_count() == 1

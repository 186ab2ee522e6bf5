"""Gradient accumulation (``accumulate_steps``): one update from K batches equals one batch of their pairs,
on one device and on two replicas."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import built_model_and_optimizer, padded_ids
from tf_transformer.hparams import HParamsError, load_hparams
from tf_transformer.nn.model import masked_loss, shift_right
from tf_transformer.data import data_load
from tf_transformer.train.step import count_updates, epoch_batches, make_train_step, update_groups

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = 23
# A large epsilon makes Adam's update proportional to the gradient, so a wrong normalisation shows.
TINY = ["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32", "label_smoothing=0.1", "adam_epsilon=1.0",
        "learning_rate=0.5"]
# Three batches of different rows, widths and target tokens (14, 4 and 21).
SHAPES = [([3, 5, 2], [4, 1, 9]), ([7], [4]), ([1, 2, 4, 4, 3], [5, 5, 5, 1, 5])]


def tiny_hp(*overrides):
    return load_hparams("toy", overrides=TINY + list(overrides))


def batches(shapes=SHAPES):
    return [(tf.constant(padded_ids(seed, lx, max(lx), VOCAB)), tf.constant(padded_ids(seed + 7, ly, max(ly), VOCAB)))
            for seed, (lx, ly) in enumerate(shapes)]


def groups():
    """Two updates: three batches, then the two an epoch's end leaves (the step fills in an empty one)."""
    return [batches(), batches(SHAPES[::-1])[:2]]


def one_batch(pairs):
    """The rows of every batch in ``pairs`` as one batch, padded to the widest."""
    def stack(side):
        width = max(int(ids.shape[1]) for ids in side)
        return tf.concat([tf.pad(ids, [[0, 0], [0, width - int(ids.shape[1])]]) for ids in side], 0)

    return stack([x for x, _ in pairs]), stack([y for _, y in pairs])


def updated(hp, calls, strategy=None):
    """{"loss", "accuracy": per call, "weights"} after one step call per element of ``calls`` (lists of (x, y))."""
    strategy = strategy or tf.distribute.get_strategy()
    with strategy.scope():
        model, optimizer = built_model_and_optimizer(hp, VOCAB)
    step = make_train_step(model, optimizer, hp, strategy)
    results = [step(*[ids for pair in group for ids in pair]) for group in calls]
    assert step.traces == 1 and int(optimizer.iterations.numpy()) == len(calls)
    return {"loss": [float(r[0]) for r in results], "accuracy": [float(r[1]) for r in results],
            "weights": [v.numpy() for v in model.trainable_variables]}


# Run apart: two replicas need two logical CPU devices, configured before TensorFlow starts.
ON_TWO_REPLICAS = """
import json, sys
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
sys.path.insert(0, "tests")
from test_accumulate import groups, one_batch, tiny_hp, updated
runs = {"one batch": updated(tiny_hp(), [[one_batch(g)] for g in groups()]),
        "accumulated": updated(tiny_hp("accumulate_steps=3"), groups()),
        "accumulated, 2 replicas": updated(tiny_hp("accumulate_steps=3"), groups(),
                                           tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))}
reference = runs["one batch"]["weights"]
for run in runs.values():
    run["weights"] = max(float(np.abs(a - b).max()) for a, b in zip(run.pop("weights"), reference))
print(json.dumps(runs))
"""


def test_accumulated_updates_equal_one_batch_of_the_same_pairs_on_one_device_and_on_two_replicas():
    result = subprocess.run([sys.executable, "-c", ON_TWO_REPLICAS], capture_output=True, text=True, timeout=300,
                            cwd=ROOT, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert result.returncode == 0, result.stderr[-2000:]
    runs = json.loads(result.stdout.strip().splitlines()[-1])
    reference = runs.pop("one batch")
    for name, run in runs.items():
        np.testing.assert_allclose(run["loss"], reference["loss"], rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(run["accuracy"], reference["accuracy"], rtol=1e-5, err_msg=name)
        assert run["weights"] < 1e-5, name  # the largest difference of a weight (they move by about 1e-2)
    # The mean of the three batches' means (OpenNMT-py#2209) would be another loss.
    model, _ = built_model_and_optimizer(tiny_hp(), VOCAB)
    means = [float(masked_loss(y, model((x, shift_right(y)), training=False), 0.1)) for x, y in groups()[0]]
    assert abs(np.mean(means) - reference["loss"][0]) > 0.01


def test_an_epochs_batches_are_grouped_by_accumulate_steps_and_the_last_group_takes_the_rest():
    hp = tiny_hp("accumulate_steps=3")
    assert [len(g) for g in update_groups(range(8), hp)] == [3, 3, 2]
    assert list(update_groups(range(6), hp)) == [[0, 1, 2], [3, 4, 5]]
    assert list(update_groups(range(2), tiny_hp())) == [[0], [1]]


def test_a_run_resumed_after_n_updates_sees_the_groups_an_uninterrupted_one_would():
    """A checkpoint after n updates holds batch n x K of its epoch (the step takes a whole group per call), so
    the resumed epoch, skipping to that batch, groups the batches left as the uninterrupted epoch did."""
    rng = np.random.default_rng(3)
    sides = [[rng.integers(4, VOCAB, size=rng.integers(1, 9)).tolist() + [3] for _ in range(23)] for _ in "xy"]
    examples = data_load.Examples(*(tf.ragged.constant(side, tf.int32) for side in sides))
    hp = tiny_hp("accumulate_steps=3", "batch_size=2")  # 12 batches, 4 updates (the last one of 3)
    hp_uneven = hp.replace(accumulate_steps=5)  # 3 updates, the last one of 2

    def ids(groups):
        return [[(x.numpy().tolist(), y.numpy().tolist()) for x, y in group] for group in groups]

    for hp in (hp, hp_uneven):
        epoch = ids(update_groups(epoch_batches(examples, hp, 1), hp))
        assert len(epoch) == count_updates(examples, hp)
        for n in range(len(epoch)):
            assert ids(update_groups(epoch_batches(examples, hp, 1, skip=n * hp.accumulate_steps), hp)) == epoch[n:]


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "true"])
def test_accumulate_steps_must_be_a_positive_integer(value):
    with pytest.raises(HParamsError, match="accumulate_steps="):
        tiny_hp(f"accumulate_steps={value}")

"""Mixed precision on CPU: bfloat16 and float16 training steps, loss scaling, masks that do not overflow."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import padded_ids
from tf_transformer.hparams import load_hparams
from tf_transformer.nn.model import Transformer
from tf_transformer.nn.modules import MASK_VALUE, MultiheadAttention
from tf_transformer.train.step import make_optimizer, make_train_step, precision_policy

VOCAB = 19


def tiny_hp(*overrides):
    return load_hparams("toy", overrides=["num_blocks=1", "num_units=16", "num_heads=2", "d_ff=32",
                                          "learning_rate=0.01", *overrides])


def train_steps(policy, steps):
    """Builds a tiny model under ``policy`` and trains it on one fixed batch; returns (model, optimizer, losses)."""
    hp = tiny_hp()
    x = tf.constant(padded_ids(0, [5, 3, 6, 2], 6, VOCAB))
    y = tf.constant(padded_ids(1, [4, 6, 2, 5], 6, VOCAB))
    with precision_policy(policy):
        keras.utils.set_random_seed(0)
        model = Transformer.from_hparams(hp, VOCAB, VOCAB)
        model((x, y))
        optimizer = make_optimizer(hp)
        optimizer.build(model.trainable_variables)
        step = make_train_step(model, optimizer, hp)
        losses = [float(step(x, y)[0]) for _ in range(steps)]
    return model, optimizer, losses


def test_the_policy_is_set_inside_and_restored_after_even_on_error():
    assert keras.mixed_precision.global_policy().name == "float32"
    with pytest.raises(RuntimeError):
        with precision_policy("mixed_bfloat16"):
            assert keras.mixed_precision.global_policy().name == "mixed_bfloat16"
            raise RuntimeError("boom")
    assert keras.mixed_precision.global_policy().name == "float32"


@pytest.mark.slow
def test_bfloat16_step_on_cpu_gives_a_finite_decreasing_loss():
    model, optimizer, losses = train_steps("mixed_bfloat16", steps=8)
    assert model.encoder_blocks[0].self_attention.compute_dtype == "bfloat16"
    assert all(v.dtype == "float32" for v in model.trainable_variables)  # weights stay float32
    assert not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)  # bfloat16 has float32's range
    assert np.all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.1, losses


def test_float16_step_on_cpu_scales_the_loss():
    model, optimizer, losses = train_steps("mixed_float16", steps=6)
    assert model.logits_layer.compute_dtype == "float16"
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert np.all(np.isfinite(losses))
    # Steps whose scaled gradients overflow are skipped and halve the scale; the others update.
    applied = int(optimizer.iterations.numpy())
    halvings = np.log2(optimizer.initial_scale / float(optimizer.dynamic_scale.numpy()))
    assert applied >= 1 and applied + halvings == 6
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("causality", [False, True])
def test_a_fully_masked_attention_row_gives_no_nan(policy, causality):
    # The blog's mask constant does not fit a 16-bit float: applied in float16 it would be -inf.
    assert np.isinf(tf.cast(tf.constant(MASK_VALUE), tf.float16).numpy())
    queries = tf.random.stateless_normal([2, 4, 8], seed=[1, 2])
    key_masks = tf.constant([[0, 0, 0, 0], [1, 1, 0, 0]], tf.float32)  # row 0: every key masked
    query_masks = tf.ones([2, 4])
    with precision_policy(policy):
        attention = MultiheadAttention(num_units=8, num_heads=2, causality=causality, qkv_activation=None,
                                       output_projection=True)
        outputs = attention(queries, queries, key_masks=key_masks, query_masks=query_masks)
    assert outputs.dtype == keras.mixed_precision.Policy(policy).compute_dtype
    assert np.all(np.isfinite(tf.cast(outputs, tf.float32).numpy()))

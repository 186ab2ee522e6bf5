"""The encoder-decoder: masks, causality, loss and accuracy."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import padded_ids
from tf_transformer.hparams import load_hparams
from tf_transformer.nn.model import (BuiltAtFirstCall, Transformer, TransformerConfig, masked_accuracy, masked_loss,
                                     shift_right)
from tf_transformer.nn.modules import label_smoothing

SMALL = dict(num_blocks=3, num_units=16, num_heads=4, d_ff=32, dropout_rate=0.1, residual_dropout_rate=0.1,
             qkv_activation="relu", output_projection=False, positional_encoding="learned", maxlen=10,
             attention_init="glorot")


def make_model(**overrides):
    tf.random.set_seed(0)
    config = {**SMALL, **overrides}
    model = Transformer(40, 50, **config)
    ids = tf.constant([[5, 6]])
    model((ids, ids))
    return model


def with_extra_padding(ids, extra):
    return np.concatenate([ids, np.zeros([ids.shape[0], extra], np.int32)], axis=1)


def real_positions_difference(a, b, lengths):
    return max(float(np.abs(a[r, :n] - b[r, :n]).max()) for r, n in enumerate(lengths))


X_LENGTHS, Y_LENGTHS = [7, 3, 5], [6, 2, 4]


def outputs_with_padding(model, extra):
    x = with_extra_padding(padded_ids(1, X_LENGTHS, 7, 40), extra)
    y = with_extra_padding(padded_ids(2, Y_LENGTHS, 6, 50), extra)
    memory, source_masks, _ = model.encode(tf.constant(x), training=False)
    logits = model.decode(tf.constant(y), memory, source_masks, training=False)
    return memory.numpy(), logits.numpy()


@pytest.mark.parametrize("positional_encoding", ["sinusoid", "learned"])
@pytest.mark.parametrize("output_projection,qkv_activation", [(True, None), (False, "relu")])
def test_default_masks_make_outputs_independent_of_padding(positional_encoding, output_projection, qkv_activation):
    model = make_model(positional_encoding=positional_encoding, maxlen=20,
                       output_projection=output_projection, qkv_activation=qkv_activation)
    memory, logits = outputs_with_padding(model, extra=0)
    memory_padded, logits_padded = outputs_with_padding(model, extra=4)
    assert real_positions_difference(memory, memory_padded, X_LENGTHS) < 1e-5
    assert real_positions_difference(logits, logits_padded, Y_LENGTHS) < 1e-5


def test_blog_masks_from_inputs_are_not_padding_invariant():
    """The original's defect, kept under mask_source='inputs': once positions are
    added, pad rows are no longer zero and sign(sum(keys)) masks nothing."""
    model = make_model(mask_source="inputs", positional_encoding="learned", maxlen=20,
                       qkv_activation="relu", output_projection=False)
    memory, logits = outputs_with_padding(model, extra=0)
    memory_padded, logits_padded = outputs_with_padding(model, extra=4)
    assert real_positions_difference(memory, memory_padded, X_LENGTHS) > 1e-3
    assert real_positions_difference(logits, logits_padded, Y_LENGTHS) > 1e-3


def test_inputs_mode_breaks_after_the_first_block_even_without_positions():
    """Without positions the embedding's zero pad rows reach block 1 intact, so
    block 1 masks correctly; once trained, its output at pad rows is beta plus
    biases, not zero, so the blocks after it mask nothing."""
    model = make_model(mask_source="inputs", num_blocks=2, qkv_activation="relu", output_projection=False)
    rng = np.random.default_rng(0)
    for weight in model.weights:  # biases and beta start at 0; give them trained-like values
        if weight.path.endswith(("bias", "beta")):
            weight.assign(rng.normal(scale=0.5, size=weight.shape).astype(np.float32))
    model.enc_positions.call = lambda ids: tf.zeros([1, tf.shape(ids)[1], SMALL["num_units"]])
    x = padded_ids(1, X_LENGTHS, 7, 40)

    def after_blocks(ids, count):
        enc, _ = model._embed(tf.constant(ids), model.enc_embedding, model.enc_positions,
                              model.enc_dropout, training=False)
        for block in model.encoder_blocks[:count]:
            enc = block(enc, training=False)
        return enc.numpy()

    padded = with_extra_padding(x, 4)
    assert real_positions_difference(after_blocks(x, 1), after_blocks(padded, 1), X_LENGTHS) < 1e-5
    assert real_positions_difference(after_blocks(x, 2), after_blocks(padded, 2), X_LENGTHS) > 1e-3


@pytest.mark.parametrize("mask_source", ["embedding", "inputs"])
def test_decoder_is_causal(mask_source):
    model = make_model(mask_source=mask_source)
    x = tf.constant(padded_ids(3, [5, 5], 5, 40))
    y = padded_ids(4, [6, 6], 6, 50)
    memory, source_masks, _ = model.encode(x, training=False)
    logits = model.decode(tf.constant(y), memory, source_masks, training=False).numpy()
    for t in range(5):
        changed = y.copy()
        changed[:, t + 1:] = np.random.default_rng(t).integers(4, 50, size=changed[:, t + 1:].shape)
        assert (changed != y).any()
        other = model.decode(tf.constant(changed), memory, source_masks, training=False).numpy()
        np.testing.assert_allclose(other[:, : t + 1], logits[:, : t + 1], atol=1e-5)
        assert np.abs(other[:, t + 1:] - logits[:, t + 1:]).max() > 1e-4


def test_masks_come_from_the_embedding_before_positions():
    model = make_model()
    x = tf.constant([[5, 6, 0, 0], [7, 0, 0, 0]])
    _, masks = model._embed(x, model.enc_embedding, model.enc_positions, model.enc_dropout, training=False)
    np.testing.assert_array_equal(masks.numpy(), [[1, 1, 0, 0], [1, 0, 0, 0]])


def test_loss_matches_one_hot_label_smoothing_and_ignores_pads():
    rng = np.random.default_rng(0)
    logits = tf.constant(rng.normal(size=(2, 4, 9)) * 3, tf.float32)
    labels = tf.constant([[4, 5, 3, 0], [6, 3, 0, 0]], tf.int32)
    # Independent restatement: the original's one-hot + label_smoothing + softmax CE,
    # summed over non-pad targets and divided by their count.
    smoothed = label_smoothing(tf.one_hot(labels, 9), 0.1)
    per_token = tf.nn.softmax_cross_entropy_with_logits(labels=smoothed, logits=logits).numpy()
    istarget = (labels.numpy() != 0).astype(np.float32)
    expected = (per_token * istarget).sum() / istarget.sum()
    assert float(masked_loss(labels, logits, 0.1)) == pytest.approx(expected, rel=1e-5)
    # Changing logits at pad positions changes nothing.
    noisy = logits.numpy()
    noisy[labels.numpy() == 0] += 100 * rng.normal(size=noisy[labels.numpy() == 0].shape)
    assert float(masked_loss(labels, tf.constant(noisy), 0.1)) == pytest.approx(expected, rel=1e-5)


def test_accuracy_counts_non_pad_targets_only():
    labels = tf.constant([[4, 5, 0], [6, 0, 0]], tf.int32)
    logits = np.zeros((2, 3, 8), np.float32)
    logits[0, 0, 4] = logits[0, 1, 7] = logits[1, 0, 6] = 1.0  # 2 of 3 real targets right
    logits[0, 2, 0] = logits[1, 1, 0] = logits[1, 2, 0] = 1.0  # pads "right" too; must not count
    assert float(masked_accuracy(labels, tf.constant(logits))) == pytest.approx(2 / 3)


def test_shift_right_starts_with_bos():
    y = tf.constant([[7, 8, 3, 0], [9, 3, 0, 0]])
    np.testing.assert_array_equal(shift_right(y).numpy(), [[2, 7, 8, 3], [2, 9, 3, 0]])


def test_dropout_only_when_training():
    model = make_model()
    x, y = tf.constant(padded_ids(5, [4], 4, 40)), tf.constant(padded_ids(6, [4], 4, 50))
    a, b = model((x, y), training=False), model((x, y), training=False)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert np.abs(model((x, y), training=True).numpy() - a.numpy()).max() > 1e-4


def test_config_round_trip_and_checkpoint_covers_every_weight(tmp_path):
    model = make_model(positional_encoding="learned", maxlen=12)
    clone = Transformer.from_config(model.get_config())
    ids = tf.constant([[5, 6]])
    clone((ids, ids))
    assert clone.get_config() == model.get_config()
    path = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    tf.train.Checkpoint(model=clone).restore(path).assert_existing_objects_matched()
    assert len(clone.weights) == len(model.weights)
    for a, b in zip(model.weights, clone.weights):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


@pytest.mark.parametrize("mask_source", ["embedding", "inputs"])
@pytest.mark.parametrize("pack", [True, False])
def test_target_token_losses_sum_to_masked_loss_with_equal_gradients(mask_source, pack):
    """Packed (every position-wise layer on the real tokens, or the output layer alone with the
    blog's masks) or not, the per-token losses sum to the padded model's masked loss, gradients too."""
    model = make_model(mask_source=mask_source, dropout_rate=0.0, residual_dropout_rate=0.0)
    x = tf.constant(padded_ids(1, X_LENGTHS, 7, 40))
    y = padded_ids(2, Y_LENGTHS, 6, 50)
    for row, length in enumerate(Y_LENGTHS):
        y[row, length - 1] = 3  # </S>
    y = tf.constant(y)
    targets = float(np.count_nonzero(y))
    with tf.GradientTape(persistent=True) as tape:
        losses, hits = model.target_token_losses(x, y, 0.1, training=True, pack=pack)
        loss = tf.reduce_sum(losses) / targets
        logits = model((x, shift_right(y)), training=True)
        reference = masked_loss(y, logits, 0.1)
    assert float(loss) == pytest.approx(float(reference), rel=1e-5)
    assert float(tf.reduce_sum(hits)) / targets == pytest.approx(float(masked_accuracy(y, logits)), abs=1e-6)
    for got, want in zip(tape.gradient(loss, model.trainable_variables),
                         tape.gradient(reference, model.trainable_variables)):
        np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), tf.convert_to_tensor(want).numpy(),
                                   atol=1e-5)


def test_shared_embeddings_are_one_table_used_three_times_in_values_and_gradients():
    """The tied model restated as an untied one whose three tables are copies of the shared table:
    equal logits, and the shared table's gradient is the sum of the three copies' gradients."""
    tied = Transformer(50, 50, **{**SMALL, "dropout_rate": 0.0, "residual_dropout_rate": 0.0},
                       shared_embeddings=True)
    untied = Transformer(50, 50, **{**SMALL, "dropout_rate": 0.0, "residual_dropout_rate": 0.0})
    x, y = tf.constant(padded_ids(1, X_LENGTHS, 7, 50)), tf.constant(padded_ids(2, Y_LENGTHS, 6, 50))
    decoder_inputs = shift_right(y)
    tied((x, decoder_inputs)), untied((x, decoder_inputs))
    assert tied.dec_embedding is tied.enc_embedding
    assert len(tied.trainable_variables) == len(untied.trainable_variables) - 2  # no dec table, no kernel
    table = tied.enc_embedding.lookup_table
    untied.enc_embedding.lookup_table.assign(table)
    untied.dec_embedding.lookup_table.assign(table)
    untied.logits_layer.kernel.assign(tf.transpose(table))
    untied.logits_layer.bias.assign(tied.logits_layer.bias + 0.1)
    tied.logits_layer.bias.assign(tied.logits_layer.bias + 0.1)
    untied_blocks = [v for v in untied.trainable_variables if "embedding" not in v.path and "logits" not in v.path]
    tied_blocks = [v for v in tied.trainable_variables if "embedding" not in v.path and "logits" not in v.path]
    for u, t in zip(untied_blocks, tied_blocks):
        u.assign(t)

    def loss_and_gradients(model, variables):
        with tf.GradientTape() as tape:
            loss = masked_loss(y, model((x, decoder_inputs), training=True), 0.1)
        return loss, tape.gradient(loss, variables)

    tied_loss, (tied_grad,) = loss_and_gradients(tied, [table])
    untied_loss, (enc, dec, kernel) = loss_and_gradients(
        untied, [untied.enc_embedding.lookup_table, untied.dec_embedding.lookup_table, untied.logits_layer.kernel])
    np.testing.assert_allclose(tied_loss.numpy(), untied_loss.numpy(), rtol=1e-6)
    expected = tf.convert_to_tensor(enc) + tf.convert_to_tensor(dec) + tf.transpose(kernel)
    np.testing.assert_allclose(tf.convert_to_tensor(tied_grad).numpy(), expected.numpy(), rtol=1e-4, atol=1e-7)
    assert float(tf.reduce_max(tf.abs(tf.convert_to_tensor(dec)))) > 0  # each use does contribute


def test_shared_embeddings_need_one_vocabulary():
    with pytest.raises(ValueError, match="one vocabulary for both sides, got 40 source and 50 target"):
        Transformer(40, 50, **SMALL, shared_embeddings=True)


# Every model option away from its default, each to a value the built model must show.
NOT_DEFAULT = dict(num_blocks=2, num_units=12, num_heads=3, d_ff=20, dropout_rate=0.2, residual_dropout_rate=0.3,
                   qkv_activation="relu", output_projection=False, positional_encoding="learned",
                   mask_source="inputs", layer_norm_epsilon=1e-6, attention_init="glorot", shared_embeddings=True,
                   maxlen=7)


def carried_options(model):
    """The options as the built model's layers and weights show them (not as its config says)."""
    blocks = {w.path.split("/")[1] for w in model.weights if "_block_" in w.path}
    attention = [layer for block in model.encoder_blocks + model.decoder_blocks
                 for layer in (block.self_attention, getattr(block, "vanilla_attention", block.self_attention))]
    feedforward = [block.feedforward for block in model.encoder_blocks + model.decoder_blocks]
    layer_norms = [layer.layer_norm for layer in attention + feedforward]

    def one(values):
        assert len(set(values)) == 1, values
        return values[0]

    ids = tf.constant([[5, 6, 0]])
    return dict(
        num_blocks=one([sum(b.startswith(side) for b in blocks) for side in ("encoder", "decoder")]),
        num_units=int(model.enc_embedding.lookup_table.shape[1]),
        num_heads=one([layer.num_heads for layer in attention]),
        d_ff=one([int(layer.inner_kernel.shape[1]) for layer in feedforward]),
        dropout_rate=one([layer.dropout.rate for layer in attention] + [model.enc_dropout.rate]),
        residual_dropout_rate=one([layer.residual_dropout.rate for layer in attention + feedforward]),
        qkv_activation=one([layer.qkv_activation for layer in attention]),
        output_projection=one([hasattr(layer, "output_kernel") for layer in attention]),
        positional_encoding=one([model.enc_positions.kind, model.dec_positions.kind]),
        mask_source="embedding" if model.encode(ids, training=False).source_masks is not None else "inputs",
        layer_norm_epsilon=one([layer.epsilon for layer in layer_norms]),
        attention_init=one([layer.attention_init for layer in attention]),
        shared_embeddings=model.dec_embedding is model.enc_embedding,
        maxlen=one([int(p.table.lookup_table.shape[0]) for p in (model.enc_positions, model.dec_positions)]),
    )


def test_every_hparams_model_option_reaches_the_model():
    assert set(NOT_DEFAULT) == set(TransformerConfig.names()), "a new model option needs a value here"
    assert all(getattr(TransformerConfig(), key) != value for key, value in NOT_DEFAULT.items())
    model = Transformer.from_hparams(load_hparams().replace(**NOT_DEFAULT), 30, 30)
    ids = tf.constant([[5, 6]])
    model((ids, ids))
    assert carried_options(model) == NOT_DEFAULT
    assert {key: model.get_config()[key] for key in NOT_DEFAULT} == NOT_DEFAULT


@pytest.mark.parametrize("shared_embeddings", [False, True])
def test_the_first_call_creates_the_weights_keras_symbolic_build_creates(monkeypatch, shared_embeddings):
    """The blocks' and the model's own ``build`` leave every weight to the sub-layers' first call: the same
    weights, in the same order and shapes, as Keras' default build (a symbolic run of ``call`` first) makes,
    and a first call that gives the same outputs from the same weights."""
    options = dict(SMALL, shared_embeddings=shared_embeddings)
    ids = tf.constant([[5, 6, 7], [8, 0, 0]])
    ours = Transformer(40, 40, **options)
    first = ours((ids, ids), training=False)
    monkeypatch.setattr(BuiltAtFirstCall, "build", keras.layers.Layer.build)
    keras_built = Transformer(40, 40, **options)
    keras_built((ids, ids), training=False)

    def described(model):
        return [(w.path.split("/", 1)[1], tuple(w.shape)) for w in model.weights]

    assert described(ours) == described(keras_built)
    for mine, theirs in zip(ours.weights, keras_built.weights):
        theirs.assign(mine)
    np.testing.assert_allclose(keras_built((ids, ids), training=False), first, rtol=1e-6)

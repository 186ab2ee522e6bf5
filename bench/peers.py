"""The peers' models at our configuration, shared by the benchmarks.

* :class:`KerasHubTransformer`: keras-hub's ``TokenAndPositionEmbedding``,
  ``TransformerEncoder`` and ``TransformerDecoder`` (keras-hub 0.32, Keras 3)
  wired into an encoder-decoder the way keras-hub's own translation example
  does, with an untied dense output layer.

* :func:`tf_models_transformer`: tf-models' ``Seq2SeqTransformer`` with its
  ``TransformerEncoder``/``TransformerDecoder`` (tf-models-official 2.20 on
  tf_keras, Keras 2), with :func:`tf_keras_policy` for its mixed precision and
  :func:`tf_models_optimizer` for its Adam.

* :func:`plain_step`: a peer's training step, written plainly.

Peers are installed from ``bench/requirements.txt``, never as dependencies of
the project; :func:`keras_hub_missing` and :func:`tf_models_missing` say why one is unavailable.
"""

import keras
import tensorflow as tf

from tf_transformer.data.vocab import PAD_ID
from tf_transformer.nn.model import masked_loss, shift_right
from tf_transformer.train.step import precision_policy


class KerasHubTransformer(keras.Model):
    """The small encoder-decoder from keras-hub's layers (post-norm, like ours), padding masks explicit."""

    def __init__(self, hp, source_vocab_size, target_vocab_size, max_length, **kwargs):
        super().__init__(**kwargs)
        import keras_hub

        layers = keras_hub.layers
        self.enc_embedding = layers.TokenAndPositionEmbedding(source_vocab_size, max_length, hp.num_units)
        self.dec_embedding = layers.TokenAndPositionEmbedding(target_vocab_size, max_length, hp.num_units)
        self.enc_dropout = keras.layers.Dropout(hp.dropout_rate)
        self.dec_dropout = keras.layers.Dropout(hp.dropout_rate)
        self.encoders = [layers.TransformerEncoder(hp.d_ff, hp.num_heads, dropout=hp.dropout_rate)
                         for _ in range(hp.num_blocks)]
        self.decoders = [layers.TransformerDecoder(hp.d_ff, hp.num_heads, dropout=hp.dropout_rate)
                         for _ in range(hp.num_blocks)]
        self.logits_layer = keras.layers.Dense(target_vocab_size)

    def call(self, inputs, training=None):
        x, decoder_inputs = inputs
        source_mask, target_mask = tf.not_equal(x, PAD_ID), tf.not_equal(decoder_inputs, PAD_ID)
        enc = self.enc_dropout(self.enc_embedding(x), training=training)
        for encoder in self.encoders:
            enc = encoder(enc, padding_mask=source_mask, training=training)
        dec = self.dec_dropout(self.dec_embedding(decoder_inputs), training=training)
        for decoder in self.decoders:
            dec = decoder(dec, enc, decoder_padding_mask=target_mask, encoder_padding_mask=source_mask,
                          training=training)
        return self.logits_layer(dec)


def keras_hub_missing():
    """None when keras-hub imports, else why not."""
    try:
        import keras_hub  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def tf_models_missing():
    """None when tf-models' ``Seq2SeqTransformer`` imports, else why not."""
    try:
        from official.nlp.modeling.models import seq2seq_transformer  # noqa: F401
    except Exception as e:  # ImportError (tf-models, tf_keras, gin-config), or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def tf_keras_policy(policy):
    """Sets tf_keras' (Keras 2's) global dtype policy inside the block and restores it on exit."""
    import tf_keras

    return precision_policy(policy, tf_keras.mixed_precision)


def tf_models_transformer(hp, vocab_size, decode_length=None, beam_size=4):
    """tf-models' ``Seq2SeqTransformer`` (tf_keras) at our configuration; build it under :func:`tf_keras_policy`.

    One vocabulary of ``vocab_size`` for both sides, its embedding tied to the
    output projection (tf-models has no untied option); the projection runs on
    every target position, pad included. Dropout ``hp.dropout_rate`` like ours;
    pre-norm, tf-models' default (ours is post-norm: the same matmuls, but
    ``norm_first=False`` fails under mixed_bfloat16 in tf-models 2.20, a
    float32 + bfloat16 add in its ``TransformerDecoderBlock``).

    Training: ``model({"inputs": x, "targets": y}, training=True)`` -> (N, T_y, V)
    float32 logits (it shifts ``y`` right itself). Decoding:
    ``model({"inputs": x})["outputs"]`` -> (N, decode_length) ids from its own
    beam search (``beam_size`` 1 is its greedy). Its end id is set to
    ``vocab_size``, an id no step can produce, so no hypothesis ends early and
    every sentence gets exactly ``decode_length`` tokens (the forced lengths
    of the decoding benchmark).
    """
    from official.nlp.modeling.models import seq2seq_transformer as s2s

    def stack(cls):
        return cls(num_layers=hp.num_blocks, num_attention_heads=hp.num_heads, intermediate_size=hp.d_ff,
                   dropout_rate=hp.dropout_rate)

    return s2s.Seq2SeqTransformer(vocab_size=vocab_size, embedding_width=hp.num_units, dropout_rate=hp.dropout_rate,
                                  decode_max_length=decode_length, beam_size=beam_size,
                                  alpha=hp.length_penalty, eos_id=vocab_size,
                                  encoder_layer=stack(s2s.TransformerEncoder),
                                  decoder_layer=stack(s2s.TransformerDecoder))


def tf_models_optimizer(hp):
    """A tf_keras Adam with :func:`~tf_transformer.train.step.make_optimizer`'s settings (constant learning rate):
    tf-models' variables are tf_keras ones, which a Keras 3 optimizer does not update."""
    import tf_keras

    if hp.lr_schedule != "constant":
        raise ValueError(f"lr_schedule={hp.lr_schedule}: the tf-models peer takes only 'constant'")
    return tf_keras.optimizers.Adam(hp.learning_rate, beta_1=hp.adam_beta1, beta_2=hp.adam_beta2,
                                    epsilon=hp.adam_epsilon, global_clipnorm=hp.clip_norm or None)


def plain_step(forward, model, optimizer, hp):
    """A peer's compiled training step ``(x, y) -> loss``: tape, the label-smoothed loss over the
    non-pad targets (:func:`~tf_transformer.nn.model.masked_loss`, logits of every position), the update.

    Args:
      forward: ``(x, y) -> (N, T_y, V)`` logits of the targets ``y`` (it shifts them right).
      model: whose ``trainable_variables`` are updated.
      optimizer: a Keras 3 optimizer (its ``scale_loss`` serves loss scaling) or a tf_keras one.
    """
    spec = tf.TensorSpec([None, None], tf.int32)
    scale = getattr(optimizer, "scale_loss", None) or (lambda loss: loss)  # tf_keras optimizers have none

    @tf.function(input_signature=[spec, spec])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = masked_loss(y, forward(x, y), hp.label_smoothing)
            scaled = scale(loss)
        variables = model.trainable_variables
        optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        return loss

    return step


def keras_hub_train_step(model, optimizer, hp):
    """:func:`plain_step` of a :class:`KerasHubTransformer`."""
    return plain_step(lambda x, y: model((x, shift_right(y)), training=True), model, optimizer, hp)

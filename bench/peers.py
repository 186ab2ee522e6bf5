"""The peers' models at our configuration, shared by the benchmarks.

* :class:`KerasHubTransformer`: keras-hub's ``TokenAndPositionEmbedding``,
  ``TransformerEncoder`` and ``TransformerDecoder`` (keras-hub 0.32, Keras 3)
  wired into an encoder-decoder the way keras-hub's own translation example
  does, with an untied dense output layer.

Peers are installed from ``bench/requirements.txt``, never as dependencies of
the project; :func:`keras_hub_missing` says why one is unavailable.
"""

import keras
import tensorflow as tf

from tf_transformer.vocab import PAD_ID


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

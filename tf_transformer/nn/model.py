"""The Transformer: encoder and decoder stacks built from :mod:`tf_transformer.nn.modules`.

Read top to bottom: :class:`TransformerConfig` (every option), :class:`EncoderBlock`, :class:`DecoderBlock`,
:class:`Transformer` (embedding -> blocks -> output projection), then the loss
and accuracy the original ``train.py`` computes.

Masks (``mask_source``):
  * ``"embedding"`` (default): key/query masks are computed once per side, as
    the sign of the zero-padded token embedding *before* positions are added,
    and handed to every attention layer: the source mask to encoder
    self-attention and to the keys of encoder-decoder attention, the target
    mask to decoder self-attention and to the queries of encoder-decoder
    attention. Padding then has no effect on real positions in any block.
  * ``"inputs"``: the blog. Every attention layer recomputes its masks from its
    own inputs, which stops masking anything once positions are added.
"""

import dataclasses
import inspect
from typing import Literal, NamedTuple, Optional

import keras
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, PAD_ID
from tf_transformer.nn import fused, modules
from tf_transformer.nn.loss import argmax_hits, compiled_smoothed_cross_entropy, smoothed_targets

# Field metadata of an option that fixes the weights (their shapes, or what each one means): a
# checkpoint only fits a model built with the same value (hparams.ARCHITECTURE_KEYS).
_FIXES_WEIGHTS = {"fixes_weights": True}


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Every option of the model, passed whole to :class:`Transformer` and its blocks.

    The defaults are ``hparams.yaml``'s ``defaults`` (a test ties them), which document each
    option; :class:`~tf_transformer.hparams.HParams` extends this class, so each option is
    a hyper-parameter of the same name and type. A new option is one field here, its
    default in ``hparams.yaml``, and its use: the attention and feed-forward layers receive
    the fields their constructors name (:func:`layer_options`), ``get_config`` and
    ``from_hparams`` list every field.
    """

    num_blocks: int = dataclasses.field(default=3, metadata=_FIXES_WEIGHTS)
    num_units: int = dataclasses.field(default=256, metadata=_FIXES_WEIGHTS)
    num_heads: int = dataclasses.field(default=4, metadata=_FIXES_WEIGHTS)
    d_ff: int = dataclasses.field(default=1024, metadata=_FIXES_WEIGHTS)
    dropout_rate: float = 0.1
    residual_dropout_rate: float = 0.1
    qkv_activation: Optional[Literal["relu"]] = None
    output_projection: bool = dataclasses.field(default=True, metadata=_FIXES_WEIGHTS)
    positional_encoding: Literal["sinusoid", "learned"] = dataclasses.field(default="sinusoid",
                                                                            metadata=_FIXES_WEIGHTS)
    mask_source: Literal["embedding", "inputs"] = "embedding"
    layer_norm_epsilon: float = 1e-8
    attention_init: Literal["glorot", "per_head"] = "per_head"
    shared_embeddings: bool = dataclasses.field(default=False, metadata=_FIXES_WEIGHTS)
    maxlen: int = dataclasses.field(default=100, metadata=_FIXES_WEIGHTS)

    @classmethod
    def names(cls):
        """The options' names, in field order."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def weight_names(cls):
        """The options that fix the weights, in field order."""
        return tuple(field.name for field in dataclasses.fields(cls) if field.metadata.get("fixes_weights"))

    @classmethod
    def of(cls, options):
        """The config of any object with these options as attributes (an ``HParams``)."""
        return cls(**{name: getattr(options, name) for name in cls.names()})


def layer_options(layer_class, config):
    """The options of ``config`` that ``layer_class``'s constructor takes, by name."""
    parameters = inspect.signature(layer_class.__init__).parameters
    return {name: getattr(config, name) for name in TransformerConfig.names() if name in parameters}


class Encoded(NamedTuple):
    """:meth:`Transformer.encode`'s result."""

    memory: tf.Tensor  # (N, T_x, C) encoder output; packed: (M_x, C) rows of the real tokens
    source_masks: Optional[tf.Tensor]  # (N, T_x) 0/1, or None (mask_source: inputs)
    packing: Optional[modules.Packing] = None  # of the real tokens, when packed


class DecoderStates(NamedTuple):
    """:meth:`Transformer.decoder_states`' result."""

    states: tf.Tensor  # (N, T_y, C) last decoder block's output; packed: (M_y, C) rows of the real positions
    packing: Optional[modules.Packing] = None  # of the real positions, when packed


class BuiltAtFirstCall:
    """For layers made only of sub-layers (the blocks, the model): ``build`` just marks the layer built, and
    each sub-layer creates its weights at its first call, from its own ``build``.

    Without a ``build`` of its own, Keras builds such a layer by running its whole ``call`` symbolically
    first, each nested block again inside its parent's run: most of a small model's construction time.
    """

    def build(self, input_shape):
        pass


class _Block(BuiltAtFirstCall, keras.layers.Layer):
    """What encoder and decoder blocks share: their :class:`TransformerConfig` and sub-layer factories."""

    def __init__(self, config, **kwargs):
        super().__init__(**kwargs)
        self.config = config

    def _attention(self, causality, name):
        return modules.MultiheadAttention(causality=causality, name=name,
                                          **layer_options(modules.MultiheadAttention, self.config))

    def _feedforward(self):
        return modules.FeedForward(name="feedforward", **layer_options(modules.FeedForward, self.config))

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config)}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(TransformerConfig(**config.pop("config")), **config)


@keras.saving.register_keras_serializable(package="tf_transformer")
class EncoderBlock(_Block):
    """One encoder block: self-attention, then feed-forward.

    Call args:
      enc: (N, T_x, C).
      masks: optional (N, T_x) source masks (None: recomputed, the blog).
      packing: optional :class:`~tf_transformer.nn.modules.Packing` of ``masks``: ``enc`` is then
        its (M_x, C) real rows, and so is the output.
    Returns:
      (N, T_x, C).
    """

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.self_attention = self._attention(causality=False, name="self_attention")
        self.feedforward = self._feedforward()

    def call(self, enc, training=None, masks=None, packing=None):
        enc = self.self_attention(enc, enc, training=training, key_masks=masks, query_masks=masks,
                                  query_packing=packing, key_packing=packing)
        return self.feedforward(enc, training=training, packing=packing)


@keras.saving.register_keras_serializable(package="tf_transformer")
class DecoderBlock(_Block):
    """One decoder block: causal self-attention, encoder-decoder attention
    (the blog's ``vanilla_attention``: queries = decoder state, keys = encoder
    output), then feed-forward.

    Call args:
      dec: (N, T_y, C).
      memory: (N, T_x, C) encoder output.
      source_masks: optional (N, T_x); target_masks: optional (N, T_y).
      source_packing, target_packing: optional :class:`~tf_transformer.nn.modules.Packing` of the
        masks: ``memory`` and ``dec`` are then their real rows, and so is the output.
    Returns:
      (N, T_y, C).
    """

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.self_attention = self._attention(causality=True, name="self_attention")
        self.vanilla_attention = self._attention(causality=False, name="vanilla_attention")
        self.feedforward = self._feedforward()

    def call(self, dec, memory, training=None, source_masks=None, target_masks=None, source_packing=None,
             target_packing=None):
        dec = self.self_attention(dec, dec, training=training, key_masks=target_masks, query_masks=target_masks,
                                  query_packing=target_packing, key_packing=target_packing)
        return self._after_self_attention(dec, memory, training, source_masks, target_masks, source_packing,
                                          target_packing)

    def _after_self_attention(self, dec, memory, training, source_masks, target_masks, source_packing=None,
                              target_packing=None):
        dec = self.vanilla_attention(dec, memory, training=training, key_masks=source_masks,
                                     query_masks=target_masks, query_packing=target_packing,
                                     key_packing=source_packing)
        return self.feedforward(dec, training=training, packing=target_packing)

    def step(self, dec, memory, feedforward_weights, cache, target_masks=None, position=None):
        """Incremental decoding (inference): one new position of k hypotheses per sentence.

        Args:
          dec: (N, k, C) this block's input at the new position of each hypothesis.
          memory: the encoder output projected for ``vanilla_attention``
            (:meth:`~tf_transformer.nn.modules.MultiheadAttention.project_keys`), N rows.
          feedforward_weights: ``feedforward``'s
            :meth:`~tf_transformer.nn.modules.FeedForward.decoding_weights`.
          cache: ``self_attention``'s cache of the earlier positions, N*k rows (hypothesis
            j of sentence n is row n*k + j).
          target_masks: optional (N, k) masks of the new tokens (None: the blog's rule).
          position: None (the cache grows), or the new position, written in place into a
            preallocated cache (:meth:`~tf_transformer.nn.modules.MultiheadAttention.call_cached`).
        Returns:
          ((N, k, C), the cache with the new position).
        """
        rows = tf.reshape(dec, [-1, 1, dec.shape[-1]])  # every hypothesis its own sequence
        row_masks = None if target_masks is None else tf.reshape(target_masks, [-1, 1])
        rows, cache = self.self_attention.call_cached(rows, cache, keys=rows, query_masks=row_masks,
                                                      key_masks=row_masks, position=position)
        # The k hypotheses of a sentence query its source together, as k positions would.
        dec, _ = self.vanilla_attention.call_cached(tf.reshape(rows, [-1, *modules.inner_dims(dec)]), memory,
                                                    query_masks=target_masks)
        return self.feedforward.step(dec, feedforward_weights), cache

    def call_with_weights(self, dec, memory, source_masks=None, target_masks=None):
        """:meth:`call` (inference), with the encoder-decoder attention weights it used.

        Returns:
          ((N, T_y, C) outputs, (N, h, T_y, T_x) float32 ``vanilla_attention`` weights).
        """
        dec, weights = self.self_attention_and_weights(dec, memory, source_masks, target_masks)
        return self._after_self_attention(dec, memory, False, source_masks, target_masks), weights

    def self_attention_and_weights(self, dec, memory, source_masks=None, target_masks=None):
        """The first half of :meth:`call_with_weights`: ((N, T_y, C) self-attention outputs, (N, h, T_y, T_x)
        float32 encoder-decoder attention weights); the rest of the block is not run."""
        dec = self.self_attention(dec, dec, training=False, key_masks=target_masks, query_masks=target_masks)
        return dec, self.vanilla_attention.attention_weights(dec, memory, source_masks, target_masks)


@keras.saving.register_keras_serializable(package="tf_transformer")
class Transformer(BuiltAtFirstCall, keras.Model):
    """The encoder-decoder Transformer of the original ``train.py``.

    Source and target have their own :class:`~tf_transformer.nn.modules.Embedding`
    (zero ``<PAD>`` row, scaled by sqrt(C)), positions are added, dropout, then
    ``num_blocks`` encoder and decoder blocks, and an untied dense projection to
    the target vocabulary; with ``shared_embeddings`` one table serves both sides
    and the output layer (:class:`~tf_transformer.nn.modules.SharedLogits`).

    Call args:
      inputs: ``(x, decoder_inputs)``: (N, T_x) source ids and (N, T_y) decoder
        input ids (``<S>`` followed by the target shifted right).
    Returns:
      (N, T_y, V_target) logits.

    Args:
      source_vocab_size, target_vocab_size: V_source and V_target.
      config: a :class:`TransformerConfig`; None: its defaults.
      **kwargs: options named like ``config``'s fields replace them (Keras'
        ``from_config`` passes :meth:`get_config`'s flat mapping); the rest go to ``keras.Model``.

    Example:
      >>> config = TransformerConfig(num_blocks=1, num_units=16, num_heads=2, d_ff=32)
      >>> model = Transformer(20, 30, config)
      >>> model((tf.constant([[5, 6, 0]]), tf.constant([[2, 7]]))).shape
      TensorShape([1, 2, 30])
    """

    def __init__(self, source_vocab_size, target_vocab_size, config=None, **kwargs):
        options = {name: kwargs.pop(name) for name in TransformerConfig.names() if name in kwargs}
        config = dataclasses.replace(config or TransformerConfig(), **options)
        super().__init__(**kwargs)
        if config.mask_source not in ("embedding", "inputs"):
            raise ValueError(f"mask_source must be 'embedding' or 'inputs', got {config.mask_source!r}")
        if config.shared_embeddings and source_vocab_size != target_vocab_size:
            raise ValueError(f"shared_embeddings needs one vocabulary for both sides, got {source_vocab_size} "
                             f"source and {target_vocab_size} target ids")
        self.source_vocab_size, self.target_vocab_size = source_vocab_size, target_vocab_size
        self.config = config
        c = config
        self.enc_embedding = modules.Embedding(source_vocab_size, c.num_units, name="enc_embedding")
        # shared_embeddings (Press & Wolf 2017, the paper's section 3.4): one table for the source, the
        # target and, transposed, the output layer
        self.dec_embedding = self.enc_embedding if c.shared_embeddings else \
            modules.Embedding(target_vocab_size, c.num_units, name="dec_embedding")
        self.enc_positions = modules.PositionalEncoding(c.num_units, c.positional_encoding, c.maxlen,
                                                        name="enc_positions")
        self.dec_positions = modules.PositionalEncoding(c.num_units, c.positional_encoding, c.maxlen,
                                                        name="dec_positions")
        self.enc_dropout = keras.layers.Dropout(c.dropout_rate)
        self.dec_dropout = keras.layers.Dropout(c.dropout_rate)
        # One attribute per block (not a list): tf.train.Checkpoint follows
        # attributes, and Keras 3 lists of layers are invisible to it.
        for i in range(c.num_blocks):
            setattr(self, f"encoder_block_{i}", EncoderBlock(c, name=f"encoder_block_{i}"))
        for i in range(c.num_blocks):
            setattr(self, f"decoder_block_{i}", DecoderBlock(c, name=f"decoder_block_{i}"))
        self.logits_layer = modules.SharedLogits(self.enc_embedding, name="logits") if c.shared_embeddings else \
            modules.Logits(target_vocab_size, name="logits")

    @property
    def encoder_blocks(self):
        return [getattr(self, f"encoder_block_{i}") for i in range(self.config.num_blocks)]

    @property
    def decoder_blocks(self):
        return [getattr(self, f"decoder_block_{i}") for i in range(self.config.num_blocks)]

    @classmethod
    def from_hparams(cls, hp, source_vocab_size, target_vocab_size):
        """Builds the model an :class:`~tf_transformer.hparams.HParams` describes."""
        return cls(source_vocab_size, target_vocab_size, TransformerConfig.of(hp))

    def _embed(self, ids, embedding, positions, dropout, training):
        """ids (N, T) -> (inputs (N, T, C), masks (N, T) or None)."""
        embedded = embedding(ids)
        masks = modules.masks_from_embedding(embedded) if self.config.mask_source == "embedding" else None
        outputs = dropout(embedded + positions(ids), training=training)
        return outputs, masks

    def _embed_rows(self, ids, embedding, positions, dropout, training, pack, bucketed, least_rows):
        """:meth:`_embed`, then with ``pack`` the real positions' (M, C) rows and their
        :class:`~tf_transformer.nn.modules.Packing` (``bucketed``: training's few row counts, at least
        ``least_rows``, and the dropout of the packed rows, :func:`~tf_transformer.nn.modules.packed_dropout`,
        not of the padded positions): (inputs, masks, packing or None)."""
        inputs, masks = self._embed(ids, embedding, positions, dropout, training and not bucketed)
        if not pack:
            return inputs, masks, None
        packing = modules.Packing(masks, bucketed=bucketed, least_rows=least_rows)
        rows = packing.pack(inputs)
        return (modules.packed_dropout(dropout, rows) if bucketed else rows), masks, packing

    def encode(self, x, training=None, pack=False, least_rows=modules.LEAST_ROWS):
        """(N, T_x) ids -> :class:`Encoded`: memory (N, T_x, C), source_masks (N, T_x) or None.

        ``pack`` (``mask_source: embedding``): the memory is the (M_x, C) rows of the real
        tokens, and ``packing`` their :class:`~tf_transformer.nn.modules.Packing`, ``bucketed``
        when ``training`` is True (a few row counts, at least ``least_rows``, for the XLA-compiled sub-layer
        tails), and then the embeddings' dropout is of the packed rows
        (:func:`~tf_transformer.nn.modules.packed_dropout`).
        """
        enc, source_masks, packing = self._embed_rows(x, self.enc_embedding, self.enc_positions, self.enc_dropout,
                                                      training, pack, bucketed=pack and training is True,
                                                      least_rows=least_rows)
        for block in self.encoder_blocks:
            enc = block(enc, training=training, masks=source_masks, packing=packing)
        return Encoded(enc, source_masks, packing)

    def decoder_states(self, decoder_inputs, memory, source_masks=None, training=None, source_packing=None):
        """(N, T_y) decoder input ids and the encoder's output -> :class:`DecoderStates`: the
        (N, T_y, C) last block's output.

        With ``source_packing`` (``memory`` packed by :meth:`encode`), the decoder packs too: the
        states are the (M_y, C) rows of the real positions, ``packing`` their
        :class:`~tf_transformer.nn.modules.Packing`.
        """
        dec, target_masks, packing = self._embed_rows(
            decoder_inputs, self.dec_embedding, self.dec_positions, self.dec_dropout, training,
            pack=source_packing is not None, bucketed=source_packing is not None and source_packing.bucketed,
            least_rows=source_packing.least_rows if source_packing is not None else modules.LEAST_ROWS)
        for block in self.decoder_blocks:
            dec = block(dec, memory, training=training, source_masks=source_masks, target_masks=target_masks,
                        source_packing=source_packing, target_packing=packing)
        return DecoderStates(dec, packing)

    def decode(self, decoder_inputs, memory, source_masks=None, training=None):
        """(N, T_y) decoder input ids and the encoder's output -> (N, T_y, V) logits."""
        return self.logits_layer(self.decoder_states(decoder_inputs, memory, source_masks, training).states)

    def call(self, inputs, training=None):
        x, decoder_inputs = inputs
        encoded = self.encode(x, training=training)
        return self.decode(decoder_inputs, encoded.memory, encoded.source_masks, training=training)

    def target_token_losses(self, x, y, label_smoothing=0.1, training=None, pack=True,
                            least_rows=modules.LEAST_ROWS):
        """Per-token training loss of the non-pad targets, computed on the real tokens only.

        With ``mask_source: embedding`` pads never reach a real position, so every
        position-wise layer (projections, feed-forward, layer norms, the output
        layer) runs on the real rows alone (:class:`~tf_transformer.nn.modules.Packing`);
        with the blog's masks only the output layer, the largest matmul, skips
        the pads. ``sum(losses) / M == masked_loss(y, model((x, shift_right(y))))``.

        Args:
          x: (N, T_x) source ids; y: (N, T_y) target ids, ``</S>``-terminated, 0 = ``<PAD>``.
          pack: False projects all N*T_y rows and zeroes the pads' losses instead: every
            shape stays static, which XLA needs (packed (M, V) logits have a data-dependent
            M, and XLA's compile of their gradient did not finish at V = 8000).
          least_rows: training's least packed row count (:class:`~tf_transformer.nn.modules.Packing`).
        Returns:
          (losses, hits): (M,) float32 label-smoothed cross-entropy and (M,) float32 1/0 argmax hits
          for the M non-pad targets, in row-major order; with ``pack=False`` (N*T_y,), 0 at pads.
        """
        is_target = tf.not_equal(y, PAD_ID)
        if pack and self.config.mask_source == "embedding":
            # Every position-wise layer on the real tokens only (modules.Packing); the decoder's
            # real positions are the targets' (shift_right keeps the count of each row).
            encoded = self.encode(x, training=training, pack=True, least_rows=least_rows)
            states, packing = self.decoder_states(shift_right(y), encoded.memory, encoded.source_masks, training,
                                                  encoded.packing)
            logits = self.logits_layer(states, training=training)  # (M, V)
            labels = packing.pack(y)
            weights = tf.cast(packing.pack(is_target), tf.float32)  # 1s, unless an embedding row is all zeros
            if packing.bucketed:  # a few row counts: the loss as XLA computations, then the dummy rows dropped
                compiled = compiled_smoothed_cross_entropy(labels, logits, label_smoothing)
                return (compiled.losses * weights)[:packing.real], (compiled.hits * weights)[:packing.real]
            return (smoothed_cross_entropy(labels, logits, label_smoothing) * weights,
                    argmax_hits(labels, logits) * weights)
        encoded = self.encode(x, training=training)
        states = self.decoder_states(shift_right(y), encoded.memory, encoded.source_masks, training=training).states
        if pack:  # the blog's masks: pads take part, only the output layer skips them
            logits = self.logits_layer(tf.boolean_mask(states, is_target), training=training)  # (M, V)
            labels = tf.boolean_mask(y, is_target)
            return smoothed_cross_entropy(labels, logits, label_smoothing), argmax_hits(labels, logits)
        logits = self.logits_layer(tf.reshape(states, [-1, states.shape[-1]]), training=training)  # (N*T_y, V)
        labels, weights = tf.reshape(y, [-1]), tf.reshape(tf.cast(is_target, tf.float32), [-1])
        return smoothed_cross_entropy(labels, logits, label_smoothing) * weights, argmax_hits(labels, logits) * weights

    def attention_weights(self, x, decoder_inputs):
        """Encoder-decoder ("vanilla") attention weights of every decoder block (inference).

        Args:
          x: (N, T_x) source ids; decoder_inputs: (N, T_y) ids, ``<S>`` + target shifted right.
        Returns:
          list of ``num_blocks`` (N, h, T_y, T_x) float32; a row sums to 1 over the
          unmasked source tokens (0 for a masked decoder position).
        """
        encoded = self.encode(x, training=False)
        dec, target_masks = self._embed(decoder_inputs, self.dec_embedding, self.dec_positions,
                                        self.dec_dropout, False)
        weights = []
        for block in self.decoder_blocks:
            dec, block_weights = block.call_with_weights(dec, encoded.memory, encoded.source_masks, target_masks)
            weights.append(block_weights)
        return weights

    def block_attention(self, x, decoder_inputs, block):
        """The encoder-decoder attention weights of one decoder block (inference), at the cost of the
        blocks before it and its self-attention: as :meth:`attention_weights`' ``[block]``.

        Args:
          x, decoder_inputs: as :meth:`attention_weights`'; block: a Python index (-1: the last).
        Returns:
          (N, h, T_y, T_x) float32.
        """
        encoded = self.encode(x, training=False)
        dec, target_masks = self._embed(decoder_inputs, self.dec_embedding, self.dec_positions,
                                        self.dec_dropout, False)
        blocks = self.decoder_blocks[: range(self.config.num_blocks)[block] + 1]
        for earlier in blocks[:-1]:
            dec = earlier(dec, encoded.memory, training=False, source_masks=encoded.source_masks,
                          target_masks=target_masks)
        return blocks[-1].self_attention_and_weights(dec, encoded.memory, encoded.source_masks, target_masks)[1]

    # Incremental decoding (tf_transformer.infer.decode): each step reads one new
    # position per hypothesis; the decoder's self-attention keys/values of the
    # earlier positions are cached, the encoder output's are projected once.

    def start_decoding(self, x, max_length, pack=False):
        """What every decoding step reuses, computed once (inference).

        Args:
          x: (N, T_x) source ids; max_length: scalar int, most positions to decode.
          pack: with ``mask_source: embedding``, the encoder runs on the real tokens only
            (:meth:`encode`'s ``pack``; dynamic shapes, so not inside XLA); ignored otherwise.
        Returns:
          dict: ``memory``: per decoder block, the encoder output projected for its
          encoder-decoder attention (N rows); ``positions``: (max_length, C) the decoder's positions;
          ``feedforward``: per decoder block, its feed-forward's
          :meth:`~tf_transformer.nn.modules.FeedForward.decoding_weights`; ``logits``: the output layer's
          :class:`~tf_transformer.nn.modules.DenseWeights`. Outside XLA aligned and transposed once here;
          XLA's loops (small batches, whose products the padding does not speed up) multiply the weights
          as they are, and plan their own layouts.
        """
        outside_xla = not fused.in_xla()
        encoded = self.encode(x, training=False, pack=pack and self.config.mask_source == "embedding")
        return {
            "memory": [block.vanilla_attention.project_keys(encoded.memory, encoded.source_masks, decoding=True,
                                                            packing=encoded.packing)
                       for block in self.decoder_blocks],
            "positions": self.dec_positions(tf.zeros([1, max_length], tf.int32))[0],
            "feedforward": [block.feedforward.decoding_weights(aligned=outside_xla) for block in self.decoder_blocks],
            "logits": self.logits_layer.decoding_weights(transposed=outside_xla),
        }

    def empty_caches(self, rows, length=0):
        """Self-attention caches for ``rows`` hypotheses, one per decoder block: of no position
        yet, or preallocated for ``length`` positions (see :meth:`decode_step`'s ``in_place``)."""
        return [block.self_attention.empty_cache(rows, length) for block in self.decoder_blocks]

    def empty_beam_caches(self, sentences, beam_size, length):
        """Self-attention caches of ``beam_size`` hypotheses a sentence, preallocated for ``length``
        positions, that beam search does not reorder (parent pointers, :meth:`follow_parents`; see
        :meth:`~tf_transformer.nn.modules.MultiheadAttention.empty_beam_cache`), one per decoder block."""
        return [block.self_attention.empty_beam_cache(sentences, beam_size, length)
                for block in self.decoder_blocks]

    def decode_step(self, ids, position, context, caches, in_place=False):
        """One incremental step (inference): equal to the last position of :meth:`decode` over each
        hypothesis' whole prefix, at the cost of one position.

        Args:
          ids: (N, k) int32, the newest token of k hypotheses per sentence (``<S>`` at position 0).
          position: scalar int32, their position.
          context: :meth:`start_decoding`'s dict.
          caches: per decoder block, the self-attention cache of the positions before (N*k rows).
          in_place: the caches are preallocated (:meth:`empty_caches` with a ``length``) and the
            new position is written into them: every shape stays static, as XLA needs.
        Returns:
          ((N, k, V) logits, the caches with the new position).
        """
        embedded = self.dec_embedding(ids)  # the step's rows only: a lookup, not the whole table scaled
        target_masks = modules.masks_from_embedding(embedded) if self.config.mask_source == "embedding" else None
        dec = embedded + tf.gather(context["positions"], position)
        grown = []
        for block, memory, weights, cache in zip(self.decoder_blocks, context["memory"], context["feedforward"],
                                                 caches):
            dec, cache = block.step(dec, memory, weights, cache, target_masks, position if in_place else None)
            grown.append(cache)
        # The output layer on (N*k, C) rows: one plain matrix product.
        output = context["logits"]
        logits = modules.dense(tf.reshape(dec, [-1, dec.shape[-1]]), output.kernel, output.bias,
                               transpose_kernel=output.transpose_kernel)
        return tf.reshape(logits, [-1, *modules.inner_dims(ids), logits.shape[-1]]), grown

    def reorder_caches(self, caches, rows):
        """Keeps (and repeats) the hypotheses ``rows`` ((M,) int32) of every block's cache: the
        self-attention caches, or :meth:`start_decoding`'s ``memory`` (the same layout)."""
        return [block.self_attention.gather_cache(cache, rows) for block, cache in zip(self.decoder_blocks, caches)]

    def follow_parents(self, caches, parents):
        """Every block's beam cache (:meth:`empty_beam_caches`) for beam search's new hypotheses, hypothesis j
        continuing ``parents[j]`` ((A*k,) int32): they follow their parents' ancestry, nothing is reordered."""
        return [block.self_attention.follow_parents(cache, parents)
                for block, cache in zip(self.decoder_blocks, caches)]

    def get_config(self):
        return {**super().get_config(), "source_vocab_size": self.source_vocab_size,
                "target_vocab_size": self.target_vocab_size, **dataclasses.asdict(self.config)}


def shift_right(y):
    """Decoder inputs: ``<S>`` followed by the target without its last token.

    (N, T_y) -> (N, T_y).
    """
    bos = tf.fill([tf.shape(y)[0], 1], tf.constant(BOS_ID, y.dtype))
    return tf.concat([bos, y[:, :-1]], axis=1)


def smoothed_cross_entropy(labels, logits, epsilon=0.1):
    """Label-smoothed cross-entropy of each position: the blog's
    ``softmax_cross_entropy(label_smoothing(one_hot(labels)), logits)``.

    The smoothed one-hot is made by ``one_hot``'s on/off values,
    ``1 - epsilon + epsilon / V`` and ``epsilon / V`` (the blog's
    ``label_smoothing``), and TensorFlow's fused cross-entropy op computes the
    softmax, the loss and its gradient in one pass over the (..., V) logits.
    The gradient is the logits' only, ``softmax(logits) - targets`` (that op's
    backprop output) times the upstream gradient: the op's registered gradient
    also computes the targets', three more (..., V) tensors. (Being a
    ``tf.custom_gradient``, it leaves one dead ``ZerosLike`` of the logits in a
    traced gradient, which Grappler prunes.)

    Args:
      labels: (...) int ids; logits: (..., V).
    Returns:
      (...) float32.
    """
    vocab = logits.shape[-1] or tf.shape(logits)[-1]
    if logits.shape.rank != 2:  # the fused op takes (M, V)
        flat = smoothed_cross_entropy(tf.reshape(labels, [-1]), tf.reshape(logits, [-1, vocab]), epsilon)
        return tf.reshape(flat, tf.shape(labels))
    targets = smoothed_targets(labels, vocab, epsilon)

    @tf.custom_gradient
    def cross_entropy(logits):
        loss, backprop = tf.raw_ops.SoftmaxCrossEntropyWithLogits(features=logits, labels=targets)
        return loss, lambda upstream: upstream[:, None] * backprop

    return cross_entropy(tf.cast(logits, tf.float32))


def masked_loss(labels, logits, epsilon=0.1):
    """Label-smoothed cross-entropy, summed over non-pad targets / their count.

    Args:
      labels: (N, T) target ids, 0 = ``<PAD>``.
      logits: (N, T, V).
    Returns:
      scalar float32.
    """
    istarget = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    loss = smoothed_cross_entropy(labels, logits, epsilon)
    return tf.reduce_sum(loss * istarget) / tf.maximum(tf.reduce_sum(istarget), 1.0)


def masked_accuracy(labels, logits):
    """Share of non-pad targets whose argmax prediction is right. Scalar float32."""
    istarget = tf.cast(tf.not_equal(labels, PAD_ID), tf.float32)
    return tf.reduce_sum(argmax_hits(labels, logits) * istarget) / tf.maximum(tf.reduce_sum(istarget), 1.0)

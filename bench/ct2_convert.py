"""Our Transformer as a CTranslate2 model, for the CTranslate2 contender of ``bench/ct2.py``.

CTranslate2 (``pip install -r bench/requirements.txt``; never a dependency of the
project) runs encoder-decoder Transformers in C++. :func:`convert` copies a
:class:`~tf_transformer.nn.model.Transformer`'s weights into CTranslate2's own
``TransformerSpec`` through its ``Converter`` base class (which validates,
optionally quantizes and writes the model directory):

* post-norm blocks (``pre_norm=False``): ``LayerNorm(x + Attn(x))``,
  ``LayerNorm(x + FF(x))``, ReLU feed-forward, our ``layer_norm_epsilon`` in the
  model's config (CTranslate2 reads it from there; its own default differs);
* attention: self-attention's Q, K and V kernels concatenated into CTranslate2's
  one (3C, C) projection, encoder-decoder attention's K and V into one (2C, C),
  every kernel transposed ((in, out) -> (out, in)); heads are consecutive C/h
  channels and scores are scaled by 1/sqrt(C/h) in both. Without
  ``output_projection`` W^O is the identity;
* embeddings scaled by sqrt(C) in both, with our ``<PAD>`` row zero; the
  position table is ours, given as CTranslate2's position encodings (our
  sinusoids interleave sin and cos, CTranslate2's own formula concatenates
  them), with ``positions`` rows (a ``learned`` table of ``maxlen`` rows
  repeats its last row beyond, as our model does);
* the output layer: our ``logits`` kernel and bias, or with
  ``shared_embeddings`` the embedding table (unscaled) and the bias;
* vocabularies: the tokenizer's own tokens (``id_to_token``), so that id ``i`` is
  token ``i`` on both sides; ``<S>`` starts decoding, ``</S>`` ends it.

Models it refuses (:class:`UnsupportedModel`, naming the option):
``qkv_activation: relu`` (CTranslate2's projections are linear) and
``mask_source: inputs`` (the blog's masks let padding into attention once
positions are added; CTranslate2 masks padding by length, so a batch would
translate differently).
"""

import numpy as np
from ctranslate2.converters import Converter
from ctranslate2.specs import common_spec, transformer_spec

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from tf_transformer.nn import modules


class UnsupportedModel(ValueError):
    """The model has an option CTranslate2's ``TransformerSpec`` cannot represent."""


def check_convertible(config):
    """Raises :class:`UnsupportedModel`, one line naming each option at fault, unless ``config``
    (a :class:`~tf_transformer.nn.model.TransformerConfig` or hparams) converts exactly."""
    problems = []
    if config.qkv_activation is not None:
        problems.append(f"qkv_activation: {config.qkv_activation} (CTranslate2's Q/K/V projections are linear; "
                        "valid: null)")
    if config.mask_source != "embedding":
        problems.append(f"mask_source: {config.mask_source} (the blog's masks let padding into attention; "
                        "CTranslate2 masks padding by length; valid: embedding)")
    if problems:
        raise UnsupportedModel("cannot convert to CTranslate2: " + "; ".join(problems))


def vocabulary(tokenizer):
    """The tokenizer's tokens by id: CTranslate2's vocabulary, token ``i`` for our id ``i``."""
    return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]


class TransformerConverter(Converter):
    """CTranslate2's ``Converter`` of a built :class:`~tf_transformer.nn.model.Transformer`.

    Args:
      model: the model, weights loaded.
      source_tokens, target_tokens: :func:`vocabulary` of each side.
      positions: rows of the position table (most source or target tokens CTranslate2 may see).
    """

    def __init__(self, model, source_tokens, target_tokens, positions):
        check_convertible(model.config)
        self.model, self.positions = model, positions
        self.source_tokens, self.target_tokens = source_tokens, target_tokens

    def _load(self):
        model, c = self.model, self.model.config
        encoder = transformer_spec.TransformerEncoderSpec(c.num_blocks, c.num_heads, pre_norm=False)
        decoder = transformer_spec.TransformerDecoderSpec(c.num_blocks, c.num_heads, pre_norm=False)
        encoder.embeddings[0].weight = _embedding_table(model.enc_embedding)
        decoder.embeddings.weight = _embedding_table(model.dec_embedding)
        encoder.position_encodings.encodings = self._position_table(model.enc_positions)
        decoder.position_encodings.encodings = self._position_table(model.dec_positions)
        for layer, block in zip(encoder.layer, model.encoder_blocks):
            _set_attention(layer.self_attention, block.self_attention, self_attention=True)
            _set_feedforward(layer.ffn, block.feedforward)
        for layer, block in zip(decoder.layer, model.decoder_blocks):
            _set_attention(layer.self_attention, block.self_attention, self_attention=True)
            _set_attention(layer.attention, block.vanilla_attention, self_attention=False)
            _set_feedforward(layer.ffn, block.feedforward)
        if c.shared_embeddings:
            _set_linear(decoder.projection, model.enc_embedding.lookup_table.numpy().T, model.logits_layer.bias.numpy())
        else:
            _set_linear(decoder.projection, model.logits_layer.kernel.numpy(), model.logits_layer.bias.numpy())

        spec = transformer_spec.TransformerSpec(encoder, decoder)
        tokens = self.target_tokens
        spec.config.unk_token, spec.config.bos_token = tokens[UNK_ID], tokens[BOS_ID]
        spec.config.eos_token, spec.config.decoder_start_token = tokens[EOS_ID], tokens[BOS_ID]
        spec.config.add_source_bos = spec.config.add_source_eos = False  # our ids carry their </S>
        spec.config.layer_norm_epsilon = c.layer_norm_epsilon
        spec.register_source_vocabulary(self.source_tokens)
        spec.register_target_vocabulary(self.target_tokens)
        return spec

    def _position_table(self, layer):
        """(positions, C) float32: what our :class:`~tf_transformer.nn.modules.PositionalEncoding` adds."""
        if layer.kind == "sinusoid":
            return modules.sinusoid_table(self.positions, layer.num_units).numpy().astype(np.float32)
        rows = np.minimum(np.arange(self.positions), layer.maxlen - 1)
        return layer.table.lookup_table.numpy()[rows]


def _embedding_table(embedding):
    """(V, C) float32 table with our ``<PAD>`` row zero (CTranslate2 scales by sqrt(C) itself)."""
    table = embedding.lookup_table.numpy().copy()
    table[PAD_ID] = 0.0
    return table


def _set_linear(spec, kernel, bias):
    """CTranslate2's (out, in) weight from our (in, out) kernel."""
    spec.weight = np.ascontiguousarray(np.asarray(kernel, np.float32).T)
    spec.bias = np.asarray(bias, np.float32)


def _set_layer_norm(spec, layer_norm):
    spec.gamma, spec.beta = layer_norm.gamma.numpy(), layer_norm.beta.numpy()


def _set_attention(spec, attention, self_attention):
    """Q, K, V (fused as CTranslate2 wants them), W^O (identity without ``output_projection``), layer norm."""
    def weights(*names):
        return (np.concatenate([getattr(attention, f"{n}_kernel").numpy() for n in names], axis=1),
                np.concatenate([getattr(attention, f"{n}_bias").numpy() for n in names]))

    if self_attention:
        _set_linear(spec.linear[0], *weights("query", "key", "value"))
    else:
        _set_linear(spec.linear[0], *weights("query"))
        _set_linear(spec.linear[1], *weights("key", "value"))
    units = attention.query_kernel.shape[-1]
    output = weights("output") if attention.output_projection else (np.eye(units), np.zeros(units))
    _set_linear(spec.linear[-1], *output)
    _set_layer_norm(spec.layer_norm, attention.layer_norm)


def _set_feedforward(spec, feedforward):
    _set_linear(spec.linear_0, feedforward.inner_kernel.numpy(), feedforward.inner_bias.numpy())
    _set_linear(spec.linear_1, feedforward.outer_kernel.numpy(), feedforward.outer_bias.numpy())
    _set_layer_norm(spec.layer_norm, feedforward.layer_norm)


def convert(model, source_tokenizer, target_tokenizer, output_dir, positions=1024, quantization=None):
    """Writes ``model`` as a CTranslate2 model directory ``output_dir`` (replaced if it exists).

    Args:
      model: a :class:`~tf_transformer.nn.model.Transformer`, weights loaded.
      source_tokenizer, target_tokenizer: its tokenizers (their tokens become the vocabularies).
      positions: rows of the position tables, at least the longest source and the longest
        decoding (``<S>`` included) CTranslate2 will see.
      quantization: CTranslate2's weight type on disk (None: float32; a ``compute_type`` at
        load time quantizes too).
    Returns:
      ``output_dir``.
    Raises:
      UnsupportedModel: an option CTranslate2 cannot represent (:func:`check_convertible`).
    """
    converter = TransformerConverter(model, vocabulary(source_tokenizer), vocabulary(target_tokenizer), positions)
    return converter.convert(output_dir, quantization=quantization, force=True)

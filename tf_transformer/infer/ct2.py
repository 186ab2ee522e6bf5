"""CTranslate2: our Transformer converted to a CTranslate2 model directory, checked, and translating.

CTranslate2 (a C++ inference engine; an optional dependency: ``pip install -e
".[ctranslate2]"``) runs encoder-decoder Transformers on CPUs and GPUs, with
weights quantized to int8 if asked. ``python -m tf_transformer.cli.export
--format ctranslate2`` runs :func:`export_ctranslate2`; ``translate.py
--ctranslate2 DIR`` translates with :class:`Ct2Model`.

:func:`convert` copies a :class:`~tf_transformer.nn.model.Transformer`'s weights
into CTranslate2's own ``TransformerSpec`` (:func:`transformer_spec_of`) and
writes it through CTranslate2's ``Converter`` (which validates, optionally
quantizes and writes the model directory):

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

The export's checks (:func:`export_ctranslate2`): the converted model's
log-probabilities of random token sequences equal ours (:func:`check_scores`,
always; the export fails otherwise), and with a dev split, the share of
sentences whose greedy output ids equal ours (:func:`same_outputs`) and the dev
BLEU of ours, of CTranslate2 float32 and of CTranslate2 int8.

Decoding differences (so beam outputs may differ where greedy ones do not):
CTranslate2's length limit (``max_decoding_length``) is one per batch, ours:
each sentence's own (source length + 50, or ``max_decode_length``); its length
penalty is ``log p / length ** alpha`` (without ``</S>``) over the first
``k x patience`` finished hypotheses (:data:`PATIENCE`), ours GNMT's
``log p / ((5 + length) / 6) ** alpha`` over all that can still win; it has no
``max_length_factor``.
"""

import os
import shutil
import tempfile
import weakref
from typing import NamedTuple

import numpy as np
import tensorflow as tf

from tf_transformer.data.vocab import BOS_ID, EOS_ID, PAD_ID, SPECIALS, UNK_ID
from tf_transformer.errors import UserError
from tf_transformer.hparams import load_hparams
from tf_transformer.infer import decode
from tf_transformer.infer.load import load_for_inference
from tf_transformer.infer.translate import source_ids, translate
from tf_transformer.model_dir.run_files import HPARAMS_FILE, load_tokenizers, tokenizer_files
from tf_transformer.nn import modules
from tf_transformer.nn.model import shift_right
from tf_transformer.train.average import kept_weights
from tf_transformer.train.scores import evaluate

INSTALL = 'pip install -e ".[ctranslate2]" (or pip install ctranslate2==4.8.5)'
# Compute types of the export's dev BLEU comparison.
COMPUTE_TYPES = ("float32", "int8")
# The float32 conversion's log-probabilities may differ from ours by this much a token (CTranslate2's
# vectorised log-softmax is off by a few 1e-5).
SCORE_TOLERANCE = 1e-3
# Share of dev sentences whose greedy output ids should equal ours (bench/ct2.py's goal).
SAME_OUTPUTS_GOAL = 0.95
# CTranslate2's beam search stops a sentence once beam_size x patience hypotheses finished; with its default, 1,
# short poor ones finish first (beam 4 on the toy model: "i beer" for "i want a beer", log p -2.7 against -0.04).
PATIENCE = 2


def ctranslate2_missing():
    """None when ctranslate2 imports, else why not (one line)."""
    try:
        import ctranslate2  # noqa: F401
    except Exception as e:  # ImportError, or a broken install
        return f"{type(e).__name__}: {e}"
    return None


def require_ctranslate2(what):
    """Raises :class:`UserError` (how to install it) unless ctranslate2 imports; ``what`` needs it."""
    missing = ctranslate2_missing()
    if missing:
        raise UserError(f"{what} needs the ctranslate2 package, which does not import ({missing}); "
                        f"install it with {INSTALL}")


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


def transformer_spec_of(model, source_tokens, target_tokens, positions):
    """CTranslate2's ``TransformerSpec`` of a built :class:`~tf_transformer.nn.model.Transformer`.

    Args:
      model: the model, weights loaded.
      source_tokens, target_tokens: :func:`vocabulary` of each side.
      positions: rows of the position table (most source or target tokens CTranslate2 may see).
    Raises:
      UnsupportedModel: an option CTranslate2 cannot represent (:func:`check_convertible`).
    """
    from ctranslate2.specs import transformer_spec

    c = model.config
    check_convertible(c)
    encoder = transformer_spec.TransformerEncoderSpec(c.num_blocks, c.num_heads, pre_norm=False)
    decoder = transformer_spec.TransformerDecoderSpec(c.num_blocks, c.num_heads, pre_norm=False)
    encoder.embeddings[0].weight = _embedding_table(model.enc_embedding)
    decoder.embeddings.weight = _embedding_table(model.dec_embedding)
    encoder.position_encodings.encodings = _position_table(model.enc_positions, positions)
    decoder.position_encodings.encodings = _position_table(model.dec_positions, positions)
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
    spec.config.unk_token, spec.config.bos_token = target_tokens[UNK_ID], target_tokens[BOS_ID]
    spec.config.eos_token, spec.config.decoder_start_token = target_tokens[EOS_ID], target_tokens[BOS_ID]
    spec.config.add_source_bos = spec.config.add_source_eos = False  # our ids carry their </S>
    spec.config.layer_norm_epsilon = c.layer_norm_epsilon
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)
    return spec


def _position_table(layer, positions):
    """(positions, C) float32: what our :class:`~tf_transformer.nn.modules.PositionalEncoding` adds."""
    if layer.kind == "sinusoid":
        return modules.sinusoid_table(positions, layer.num_units).numpy().astype(np.float32)
    rows = np.minimum(np.arange(positions), layer.maxlen - 1)
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
      UnsupportedModel: an option CTranslate2 cannot represent (:func:`check_convertible`); nothing is written.
    """
    from ctranslate2.converters import Converter

    spec = transformer_spec_of(model, vocabulary(source_tokenizer), vocabulary(target_tokenizer), positions)

    class SpecConverter(Converter):
        def _load(self):
            return spec

    return SpecConverter().convert(output_dir, quantization=quantization, force=True)


def positions_for(hp):
    """Rows of the position tables: the longest source (``maxlen``) + 50, or ``max_decode_length``, at least 1024."""
    return max(1024, hp.maxlen + decode.EXTRA_LENGTH + 1, hp.max_decode_length + 1)


def length_limit(hp, source_lengths, max_length=None):
    """CTranslate2's ``max_decoding_length`` for a batch (``</S>`` counted, as ours): ``max_length``, else
    ``max_decode_length``, else the longest source (``</S>`` included) + :data:`~tf_transformer.infer.decode.EXTRA_LENGTH`."""
    return max_length or hp.max_decode_length or max(source_lengths) + decode.EXTRA_LENGTH


class Ct2Model(NamedTuple):
    """A CTranslate2 model directory that :func:`export_ctranslate2` wrote (its translator, with our
    hyper-parameters and tokenizers, copied there), translating text by our input rules."""

    hp: object
    source_tokenizer: object
    target_tokenizer: object
    translator: object  # ctranslate2.Translator

    @classmethod
    def load(cls, directory, compute_type="default", threads=0):
        """Reads ``directory``; ``compute_type``: CTranslate2's (``default``: the weights' own type on disk).

        Raises:
          UserError: ctranslate2 is missing, or the directory is not one the export wrote.
        """
        require_ctranslate2("--ctranslate2")
        import ctranslate2

        hparams = os.path.join(directory, HPARAMS_FILE)
        if not os.path.isfile(os.path.join(directory, "model.bin")) or not os.path.isfile(hparams):
            raise UserError(f"--ctranslate2 {directory}: not a CTranslate2 model directory written by "
                            f"python -m tf_transformer.cli.export --format ctranslate2 (model.bin and {HPARAMS_FILE} "
                            f"expected there)")
        hp = load_hparams(config=hparams)
        tokenizers = load_tokenizers(directory, hp)
        if tokenizers is None:
            raise UserError(f"--ctranslate2 {directory}: missing {' or '.join(tokenizer_files(hp))}")
        translator = ctranslate2.Translator(directory, device="cpu", compute_type=compute_type, intra_threads=threads)
        return cls(hp, *tokenizers, translator)

    def output_ids(self, sources, *, beam_size=1, length_penalty=0.0, max_length=None, nbest=1, patience=PATIENCE):
        """[[(ids, score)] * nbest] of source id lists (``</S>`` included), ids cut before ``</S>``."""
        if not sources:
            return []
        tokens = [[self.source_tokenizer.id_to_token(i) for i in row] for row in sources]
        results = self.translator.translate_batch(
            tokens, beam_size=beam_size, length_penalty=length_penalty, num_hypotheses=nbest, return_scores=True,
            patience=patience,
            max_decoding_length=length_limit(self.hp, [len(row) for row in sources], max_length))
        index = _token_ids(self.target_tokenizer)
        return [[([index[t] for t in hypothesis], score) for hypothesis, score in zip(r.hypotheses, r.scores)]
                for r in results]

    def translate_nbest(self, sentences, *, batch_size=32, max_length=None, beam_size=1, length_penalty=0.6,
                        nbest=1, patience=PATIENCE):
        """As :func:`~tf_transformer.infer.translate.translate_nbest` (the same input rules, batches of
        sentences of similar length): each sentence's ``nbest`` best ``(translation, CTranslate2's score)``;
        ``patience`` > 0, CTranslate2's."""
        sources = source_ids(self.source_tokenizer, tf.constant(sentences, tf.string), self.hp.maxlen).to_list()
        results = [[("", 0.0)] * nbest for _ in sentences]
        order = [i for i in np.argsort([len(s) for s in sources], kind="stable") if len(sources[i]) > 1]
        for start in range(0, len(order), batch_size):
            rows = [int(i) for i in order[start:start + batch_size]]
            outputs = self.output_ids([sources[i] for i in rows], beam_size=beam_size,
                                      length_penalty=length_penalty, max_length=max_length, nbest=nbest,
                                      patience=patience)
            for row, hypotheses in zip(rows, outputs):
                texts = self.target_tokenizer.to_texts([ids + [EOS_ID] for ids, _ in hypotheses])
                results[row] = [(text, float(score)) for text, (_, score) in zip(texts, hypotheses)]
        return results

    def translate(self, sentences, beam_size, batch_size=32):
        """The best translation of each sentence, with the hparams' length penalty and limit."""
        return [h[0][0] for h in self.translate_nbest(sentences, batch_size=batch_size, beam_size=beam_size,
                                                      length_penalty=self.hp.length_penalty)]


_TOKEN_IDS = weakref.WeakKeyDictionary()


def _token_ids(tokenizer):
    """{token: id} of a tokenizer's vocabulary, made once per tokenizer (CTranslate2 gives tokens; made again for
    every batch it cost 2-5 ms a batch with a 4,000-piece vocabulary on an AVX2 EPYC)."""
    if tokenizer not in _TOKEN_IDS:
        _TOKEN_IDS[tokenizer] = {tokenizer.id_to_token(i): i for i in range(tokenizer.vocab_size)}
    return _TOKEN_IDS[tokenizer]


def check_scores(model, tokenizers, translator, sequences=8, seed=0):
    """The largest difference between CTranslate2's and our log-probability of a target token, over
    ``sequences`` random source and target id sequences (``</S>``-terminated, of 1 to 12 tokens)."""
    rng = np.random.default_rng(seed)
    source_tokenizer, target_tokenizer = tokenizers

    def draw(vocab_size):
        return [rng.integers(len(SPECIALS), vocab_size, size=rng.integers(1, 12)).tolist() + [EOS_ID]
                for _ in range(sequences)]

    sources, targets = draw(source_tokenizer.vocab_size), draw(target_tokenizer.vocab_size)
    results = translator.score_batch([[source_tokenizer.id_to_token(i) for i in s] for s in sources],
                                     [[target_tokenizer.id_to_token(i) for i in t[:-1]] for t in targets])
    x, y = tf.ragged.constant(sources).to_tensor(), tf.ragged.constant(targets).to_tensor()
    log_probs = tf.nn.log_softmax(model((x, shift_right(y)), training=False)).numpy()
    return max(float(np.abs(np.asarray(r.log_probs) - log_probs[row, np.arange(len(t)), t]).max())
               for row, (t, r) in enumerate(zip(targets, results)))


def same_outputs(loaded, models, sentences, batch_size=32):
    """{compute type: the share of ``sentences`` whose greedy output ids from ``models[type]``
    (:class:`Ct2Model`) equal ours}."""
    sources = source_ids(loaded.source_tokenizer, tf.constant(sentences), loaded.hp.maxlen).to_list()
    same = {compute_type: [] for compute_type in models}
    for start in range(0, len(sources), batch_size):
        batch = sources[start:start + batch_size]
        ids, _ = decode.generate(loaded.model, tf.ragged.constant(batch, tf.int32).to_tensor(),
                                 max_length=loaded.hp.max_decode_length)
        ours = [list(row[: row.index(EOS_ID)] if EOS_ID in row else row) for row in ids.numpy()[:, 0].tolist()]
        for compute_type, model in models.items():
            theirs = [hypotheses[0][0] for hypotheses in model.output_ids(batch)]
            same[compute_type] += [a == b for a, b in zip(ours, theirs)]
    return {compute_type: float(np.mean(shares)) for compute_type, shares in same.items()}


class Ct2Export(NamedTuple):
    """What :func:`export_ctranslate2` wrote and measured."""

    path: str
    weights: str  # which weights were converted
    score_difference: float  # check_scores of the float32 conversion
    same_outputs: dict | None  # same_outputs on the dev split, when given
    bleu: dict | None  # {"ours", "CTranslate2 float32", "CTranslate2 int8": dev BLEU}, when a dev split is given
    beam_size: int  # of the dev BLEU


def export_ctranslate2(model_dir, output_dir, quantization=None, checkpoint=None, dev_pairs=None, log=print):
    """Converts a model directory's kept weights (:func:`~tf_transformer.train.average.kept_weights`, or
    ``checkpoint``) into the CTranslate2 model directory ``output_dir`` (replaced when it holds one), with
    our hparams.yaml and tokenizer files, after the checks of the module docstring.

    Args:
      quantization: CTranslate2's weight type on disk (None: float32).
      dev_pairs: (source, reference) pairs: the dev split whose BLEU is compared (None: not compared).
    Returns:
      :class:`Ct2Export`.
    Raises:
      UserError: ctranslate2 is missing, the model cannot be converted or read, the check fails,
        ``output_dir`` holds something else.
    """
    require_ctranslate2("--format ctranslate2")
    import ctranslate2

    _check_output(output_dir)
    weights = kept_weights(model_dir) if checkpoint is None else None
    loaded = load_for_inference(*(weights[:2] if weights else (model_dir, checkpoint)), log=log)
    try:
        check_convertible(loaded.hp)
    except UnsupportedModel as e:
        raise UserError(f"--model-dir {model_dir}: {e}") from None
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output_dir))) as scratch:
        float32 = convert(loaded.model, *loaded.tokenizers, os.path.join(scratch, "float32"), positions_for(loaded.hp))
        _copy_run_files(model_dir if weights is None else weights.model_dir, loaded.hp, float32)
        models = {t: Ct2Model(loaded.hp, *loaded.tokenizers, ctranslate2.Translator(float32, compute_type=t))
                  for t in COMPUTE_TYPES}
        difference = check_scores(loaded.model, loaded.tokenizers, models["float32"].translator)
        if not difference <= SCORE_TOLERANCE:
            raise UserError(f"conversion check failed: CTranslate2's log-probabilities differ from ours by up to "
                            f"{difference:.2g} (at most {SCORE_TOLERANCE:g} expected); nothing was written")
        same, bleu = (None, None) if not dev_pairs else _dev_comparison(loaded, models, dev_pairs)
        written = os.path.join(scratch, "output")
        if quantization:
            convert(loaded.model, *loaded.tokenizers, written, positions_for(loaded.hp), quantization)
            _copy_run_files(model_dir if weights is None else weights.model_dir, loaded.hp, written)
        else:
            written = float32
        shutil.rmtree(output_dir, ignore_errors=True)
        os.rename(written, output_dir)
    return Ct2Export(output_dir, weights.description if weights else checkpoint, difference, same, bleu,
                     loaded.hp.beam_size)


def _dev_comparison(loaded, models, dev_pairs):
    """(same_outputs, {name: dev BLEU}) of ours and of each CTranslate2 compute type (beam ``hp.beam_size``)."""
    hp = loaded.hp
    sources, references = [s for s, _ in dev_pairs], [t for _, t in dev_pairs]
    bleu = {"ours": evaluate(sources, references, lambda batch: translate(
        batch, *loaded.tokenizers, loaded.model, beam_size=hp.beam_size, length_penalty=hp.length_penalty,
        max_length=hp.max_decode_length or None, max_length_factor=hp.max_length_factor)).bleu}
    for compute_type, model in models.items():
        bleu[f"CTranslate2 {compute_type}"] = evaluate(
            sources, references, lambda batch, m=model: m.translate(batch, hp.beam_size)).bleu
    return same_outputs(loaded, models, sources), bleu


def _check_output(output_dir):
    """Refuses an output directory that holds something other than a CTranslate2 model."""
    if os.path.isfile(output_dir):
        raise UserError(f"--export-dir {output_dir}: is a file, expected a directory (replaced when it holds a "
                        f"CTranslate2 model)")
    if os.path.isdir(output_dir) and os.listdir(output_dir) and \
            not os.path.isfile(os.path.join(output_dir, "model.bin")):
        raise UserError(f"--export-dir {output_dir}: holds files but no CTranslate2 model (model.bin); give an "
                        f"empty or new directory")


def _copy_run_files(model_dir, hp, output_dir):
    """Our hparams.yaml and tokenizer files, next to CTranslate2's: what :meth:`Ct2Model.load` reads."""
    for name in [HPARAMS_FILE] + tokenizer_files(hp):
        shutil.copyfile(os.path.join(model_dir, name), os.path.join(output_dir, name))

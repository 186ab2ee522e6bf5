"""SavedModel export for TF Serving (the command line: ``python -m tf_transformer.cli.export --model-dir DIR
[--checkpoint PATH] [--export-dir DIR] [--version N]``).

Text in, text out: the export holds the tokenizer(s) (SentencePiece as
``tensorflow_text`` ops, or the word vocabularies as lookup tables), the
model's variables and the cached greedy/beam decoder of
:func:`tf_transformer.infer.decode.generate`, all in one graph of core TensorFlow
and TensorFlow Text ops, which the stock ``tensorflow/serving`` binary runs.

Layout, as TF Serving expects: ``EXPORT_DIR/<version>/`` (``saved_model.pb``,
``variables/``, ``assets/``, and ``assets.extra/tf_serving_warmup_requests``: requests TF Serving
replays while it loads the version, :mod:`tf_transformer.infer.warmup`), ``version`` by default one
more than the largest there. The SavedModel is written to a hidden sibling (``.tmp-export-*``: not a
number, so TF Serving ignores it) and renamed into place, so a new version
appears complete or not at all; a failed export leaves nothing behind.

An export from a model directory holds its lock (:mod:`tf_transformer.locks`;
it fails at once, naming the process, while ``train.py`` writes there), and
every export holds the export directory's lock while it picks the version and
writes: concurrent exports to one directory wait their turn and get consecutive
versions. Temporary folders that a killed export left are removed then.

Signatures (method ``tensorflow/serving/predict``):

* ``serving_default``: ``inputs`` (N,) string -> ``translations`` (N,) string,
  ``scores`` (N,) float32, with the beam size the model was exported with
  (``beam_size`` of its hparams). One input, so every TF Serving version and
  both REST formats take it (``{"instances": ["Guten Morgen."]}``).
* ``translate``: the same with a second input ``beam_size``, () int32, 1 to 64.
  Its default (the exported beam size) is stored in the SignatureDef's
  ``defaults``, so TF Serving versions that read them may leave it out of a
  gRPC request; the REST API wants every input of a signature with more than
  one, in the columnar format:
  ``{"signature_name": "translate", "inputs": {"inputs": [...], "beam_size": 1}}``.
* ``translate_xla`` (only with ``xla=True``, ``export --xla``): ``translate`` with
  its decoding loop compiled by XLA (``decoding.generate(jit_compile=True)``), the
  same translations, faster once compiled. XLA needs the beam size at compile
  time, so ``beam_size`` is 1 (greedy) or the exported one (its default), and
  XLA compiles again for each new batch shape (batch size and the longest source,
  rounded up to a multiple of 8): it suits steady traffic of similar batches.
  TF Serving runs it with ``--xla_cpu_compilation_enabled=true``; without that
  flag it fails and the other signatures still serve.
  Its loop moves the batch down to smaller row buckets as sentences finish
  (:data:`XLA_BUCKETS`, :func:`tf_transformer.infer.decode.compiled_decoder`; one sentence: one). Beam
  search is compiled for up to :data:`XLA_BEAM_BATCH` sentences, greedy decoding for up to
  :data:`XLA_GREEDY_BATCH`; a larger batch runs ``translate``'s loop, which is
  faster there (bench/ct2.py). The default signature
  stays the growing loop without XLA: it needs no server flag.

``precision="bfloat16"`` (``export --precision bfloat16``): every signature decodes with
the weights cast to bfloat16 once at export and bfloat16 matrix products (layer
normalisation and softmax in float32; :func:`reduced_precision`): for CPUs with
``avx512_bf16`` or ``amx_bf16``. Stock ops only, so any TF Serving runs it. Except
``translate_xla``'s compiled loops (its one sentence and small batches), which run the
float32 weights, saved beside the bfloat16 ones: XLA:CPU computes bfloat16 products in
float32 anyway and would convert the weights at every call (one sentence greedy 1.36x
faster so; its larger batches run the bfloat16 growing loop).

* ``score``: ``sources`` and ``targets`` (N,) string -> ``scores`` (N,) float32, the model's
  log-probability of each target given its source divided by the GNMT length penalty
  (the exported ``length_penalty``; the beam scores' scale), ``log_probs`` (N,) float32,
  the plain sum, and ``tokens`` (N,) int32, the target tokens with ``</S>``
  (:mod:`tf_transformer.infer.score`). Sources and targets of different lengths are an
  ``INVALID_ARGUMENT`` error.

The score is the decoder's: the translation's log-probability, divided by the
GNMT length penalty for beam search (greedy decoding: the plain log-probability).

Input rules (shared with ``translate.py``, see
:func:`tf_transformer.infer.translate.source_batch`): invalid UTF-8 bytes become
U+FFFD; a source is cut to its first ``maxlen - 1`` tokens, then ``</S>``;
an empty or whitespace-only input translates to ``""`` with score 0 and
costs no decoding; a batch of 0 returns two empty tensors. A beam size outside
1-64 is an ``INVALID_ARGUMENT`` error naming it.
"""

import glob
import os
import shutil
import sys
import tempfile

import tensorflow as tf
from tensorflow.python.ops import cond_v2  # a Case kept a call, not lowered to Switch / Merge: no public API says

from tf_transformer.data.vocab import BOS_ID, EOS_ID
from tf_transformer.errors import UserError
from tf_transformer.files import disk_error, is_disk_problem
from tf_transformer.options import MAX_BEAM_SIZE, PRECISIONS
from tf_transformer.infer import decode as decoding
from tf_transformer.infer.load import load_for_inference
from tf_transformer.infer.score import score_ids
from tf_transformer.infer.signatures import (BEAM_SIGNATURE, BEAM_SIZE, INPUTS, LOG_PROBS, SCORE_SIGNATURE, SCORES,
                                             SERVING_SIGNATURE, SOURCES, TARGETS, TOKENS, TRANSLATIONS, XLA_SIGNATURE)
from tf_transformer.infer.translate import source_batch
from tf_transformer.infer.warmup import warmup_requests, write_warmup_requests
from tf_transformer.locks import DirectoryLock
from tf_transformer.nn.model import Transformer

_TEMPORARY_PREFIX = ".tmp-export-"
# The row buckets of translate_xla's compiled loop (decode.compiled_decoder): measured in bench/ct2.py.
XLA_BUCKETS = 4
# translate_xla's beam search is compiled for batches of at most this many sentences; larger ones run the
# growing loop (translate's), faster there (its finished rows leave and its caches hold only the positions so
# far): compiled 1.77x at 2 sentences, 1.53x at 4, 1.15x at 8, 0.94x at 16, 0.6x at 64 (docs/benchmarks.md).
XLA_BEAM_BATCH = 8
# translate_xla's greedy decoding is compiled for batches of at most this many sentences; larger ones run the
# growing loop, faster there (its finished rows leave and its encoder skips the pads): 1.56x at 64, 0.9x at 16.
XLA_GREEDY_BATCH = 16
_INPUTS_SPEC = tf.TensorSpec([None], tf.string, name=INPUTS)
_BEAM_SPEC = tf.TensorSpec([], tf.int32, name=BEAM_SIZE)
_PAIR_SPECS = [tf.TensorSpec([None], tf.string, name=SOURCES), tf.TensorSpec([None], tf.string, name=TARGETS)]


class _Untracked:
    """Hides an object from tf.Module's tracking (see :class:`Translator`)."""

    def __init__(self, value):
        self.value = value


def _variables_read(model):
    """The tf.Variables inside a Keras model's variables: those the functions read. A Keras variable itself is
    saved as a copy that only Python's loader fills, so TF Serving's would run on uninitialized weights."""
    return [v if isinstance(v, tf.Variable) else v.value for v in model.variables]


class Translator(tf.Module):
    """Strings in, translations out, as one ``tf.Module`` that ``tf.saved_model.save`` can write.

    The Keras model itself is kept out of the object graph (Keras' own
    SavedModel hooks would trace it with made-up inputs); the module tracks its
    variables, which the functions capture.

    Args:
      source_tokenizer, target_tokenizer, model: as :func:`~tf_transformer.infer.load.load_for_inference` returns them.
      beam_size: the default beam size (1 = greedy).
      length_penalty: GNMT alpha.
      max_decode_length: most target tokens; 0 = source length + 50.
      xla: also the ``translate_xla`` signature.
      max_length_factor: > 0: at most this many target tokens per source token too.
      xla_buckets: the row buckets of ``translate_xla``'s loop (:func:`~tf_transformer.infer.decode.compiled_decoder`).
      xla_beam_batch: ``translate_xla``'s beam search is compiled for batches of at most this many
        sentences; larger batches run ``translate``'s loop.
      xla_greedy_batch: the same for its greedy decoding.
      beam_patience: beam search's ``patience`` (:func:`~tf_transformer.infer.decode.generate`): 0,
        tensor2tensor's exact rule; p > 0, CTranslate2's (a sentence is done once ceil(p x beam size)
        hypotheses ended).
      xla_model: the model of ``translate_xla``'s compiled loops (None: ``model``), its variables
        tracked too: the float32 model of a bfloat16 export (:func:`export_saved_model`).
    Attributes:
      beam_size: the default beam size (int), of ``serving_default`` and ``translate``.
      serve: ``serving_default``, ``(inputs) -> {"translations", "scores"}``.
      translate: ``translate``, ``(inputs, beam_size=beam_size) -> {"translations", "scores"}``.
      translate_xla: ``translate_xla`` (or None), as ``translate`` for beam sizes 1 and ``beam_size``,
        compiled by XLA.
      score: ``score``, ``(sources, targets) -> {"scores", "log_probs", "tokens"}``.
    """

    def __init__(self, source_tokenizer, target_tokenizer, model, beam_size=1, length_penalty=0.6,
                 max_decode_length=0, xla=False, max_length_factor=0.0, xla_buckets=XLA_BUCKETS,
                 xla_beam_batch=XLA_BEAM_BATCH, xla_greedy_batch=XLA_GREEDY_BATCH, beam_patience=0.0, xla_model=None):
        super().__init__(name="translator")
        if not 1 <= beam_size <= MAX_BEAM_SIZE:
            raise UserError(f"beam_size={beam_size}: must be between 1 and {MAX_BEAM_SIZE}")
        self.beam_size = int(beam_size)
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.model_variables = _variables_read(model)
        self._model = _Untracked(model)
        self._xla_model = _Untracked(model if xla_model is None else xla_model)
        if xla and xla_model is not None and xla_model is not model:
            self.xla_model_variables = _variables_read(xla_model)
        self.length_penalty = float(length_penalty)
        self.max_decode_length = int(max_decode_length)  # 0: source length + 50
        self.max_length_factor = float(max_length_factor)
        self.beam_patience = float(beam_patience)
        self.xla_buckets = decoding.check_buckets(xla_buckets)
        self.xla_beam_batch = int(xla_beam_batch)
        self.xla_greedy_batch = int(xla_greedy_batch)
        default_beam = tf.constant(beam_size, tf.int32)
        self.serve = tf.function(lambda inputs: self._translate(inputs, default_beam),
                                 input_signature=[_INPUTS_SPEC], autograph=False)

        @tf.function(autograph=False, input_signature=[_INPUTS_SPEC, _BEAM_SPEC])
        def translate(inputs, beam_size=default_beam):  # a Tensor default becomes the SignatureDef's default
            return self._translate(inputs, beam_size)

        self.translate = translate
        self.score = tf.function(self._score, input_signature=_PAIR_SPECS, autograph=False)
        self.translate_xla = None
        if xla:
            exported_beam = int(beam_size)

            @tf.function(autograph=False, input_signature=[_INPUTS_SPEC, _BEAM_SPEC])
            def translate_xla(inputs, beam_size=default_beam):  # XLA needs the beam size when it compiles
                beam_size = decoding.checked(beam_size, tf.debugging.assert_equal(
                    (beam_size == 1) | (beam_size == exported_beam), True,
                    message=f"{BEAM_SIZE} of {XLA_SIGNATURE} must be 1 or {exported_beam}"))
                return self._translate(inputs, beam_size, lambda x: self._xla_choice(x, beam_size, exported_beam))

            self.translate_xla = translate_xla

    def signatures(self):
        """The ``signatures`` argument of ``tf.saved_model.save``."""
        xla = {XLA_SIGNATURE: self.translate_xla} if self.translate_xla is not None else {}
        return {SERVING_SIGNATURE: self.serve, BEAM_SIGNATURE: self.translate, SCORE_SIGNATURE: self.score, **xla}

    def _translate(self, inputs, beam_size, decode=None):
        """(N,) string, () int32 -> {"translations": (N,) string, "scores": (N,) float32}: the inputs
        tokenized once, the sentences with words decoded by ``decode`` (None: :meth:`_best_translations`'
        growing loops at ``beam_size``; it takes a batch of 0 sentences too), the others "" with score 0.
        (No ``tf.cond`` of its own: each level of branches in a graph passes every weight of the model
        through a ``Switch``, and an ``Identity`` in the branch taken.)"""
        beam_size = decoding.checked(
            beam_size, tf.debugging.assert_greater_equal(beam_size, 1, message=f"{BEAM_SIZE} must be at least 1"),
            tf.debugging.assert_less_equal(beam_size, MAX_BEAM_SIZE, message=f"{BEAM_SIZE} must be at most {MAX_BEAM_SIZE}"))
        if decode is None:
            decode = lambda x: self._best_translations(x, beam_size)  # noqa: E731
        sources = source_batch(self.source_tokenizer, inputs, self._model.value.config.maxlen)
        has_words = sources.lengths > 1  # `</S>` alone: empty or whitespace only
        busy, idle = tf.cast(tf.where(has_words)[:, 0], tf.int32), tf.cast(tf.where(~has_words)[:, 0], tf.int32)

        ids, scores = decode(tf.gather(sources.ids, busy))
        texts = self.target_tokenizer.detokenize(ids)
        idle_count = tf.shape(idle)[:1]
        return {TRANSLATIONS: tf.dynamic_stitch([busy, idle], [texts, tf.fill(idle_count, "")]),
                SCORES: tf.dynamic_stitch([busy, idle], [scores, tf.zeros(idle_count, tf.float32)])}

    def _best_translations(self, x, beam_size, buckets=0):
        """(B, T_x) int32 source ids -> ((B, T) int32 ids of the best translations, (B,) float32 their
        scores), from the growing loop (``buckets`` 0), or XLA's with ``buckets`` row buckets (``beam_size``
        then an int), which runs the XLA model (``xla_model``)."""
        model = self._xla_model.value if buckets > 0 else self._model.value
        ids, scores = decoding.generate(model, x, beam_size=beam_size, length_penalty=self.length_penalty,
                                        max_length=self.max_decode_length, jit_compile=buckets > 0,
                                        max_length_factor=self.max_length_factor, buckets=max(buckets, 1),
                                        patience=self.beam_patience)
        return ids[:, 0], scores[:, 0]

    def _xla_choice(self, x, beam_size, exported_beam):
        """:meth:`_best_translations` of ``translate_xla`` (``beam_size`` 1 or ``exported_beam``): XLA's loop for
        batches of 1 to ``xla_greedy_batch`` (``xla_beam_batch``) sentences, of one bucket for one sentence,
        the growing loop for larger ones, nothing for none, chosen by one ``Case`` op rather than nested conds,
        kept a call: ``tf.switch_case`` lowers it to ``Switch`` and ``Merge`` nodes, which pass every weight and
        input through a ``SwitchN`` (a one-sentence greedy call 1.04-1.055x faster as a call; each level of
        nested conds cost about 3% more)."""
        n = tf.shape(x)[0]
        loops = (0, 1, self.xla_buckets)  # growing, XLA of one bucket, XLA of buckets (_best_translations' buckets)
        runs = [(beam, buckets) for beam in (1, exported_beam) for buckets in loops]
        up_to = tf.where(beam_size == 1, self.xla_greedy_batch, self.xla_beam_batch)
        loop = tf.where(n > up_to, 0, tf.where(n == 1, 1, 2))
        index = tf.where(n == 0, len(runs), loop + tf.where(beam_size == 1, 0, len(loops)))
        branches = [lambda run=run: self._best_translations(x, *run) for run in runs]
        branches.append(lambda: (tf.zeros([0, 0], tf.int32), tf.zeros([0], tf.float32)))  # no sentence
        return cond_v2.indexed_case(index, branches, lower_using_switch_merge=False)

    def _score(self, sources, targets):
        """(N,) string sources and targets -> {"scores": (N,) float32 length-normalised, "log_probs": (N,)
        float32, "tokens": (N,) int32}."""
        sources = decoding.checked(sources, tf.debugging.assert_equal(
            tf.size(sources), tf.size(targets), message=f"{SOURCES} and {TARGETS} must have the same length"))
        model = self._model.value

        def score():
            x = source_batch(self.source_tokenizer, sources, model.config.maxlen).ids
            y = source_batch(self.target_tokenizer, targets, maxlen=None).ids  # targets are not cut
            scores = score_ids(model, x, y, self.length_penalty)
            return scores.normalised, scores.total, scores.tokens

        def nothing():  # a batch of 0 pairs
            return tf.zeros([0], tf.float32), tf.zeros([0], tf.float32), tf.zeros([0], tf.int32)

        normalised, total, tokens = tf.cond(tf.size(sources) > 0, score, nothing)
        return {SCORES: normalised, LOG_PROBS: total, TOKENS: tokens}


def versions(export_dir):
    """The numbers of ``export_dir``'s numeric sub-folders, largest first (none when it is not a folder)."""
    return sorted((int(name) for name in os.listdir(export_dir) if name.isdigit()), reverse=True) \
        if os.path.isdir(export_dir) else []


def next_version(export_dir):
    """One more than the largest numeric sub-folder of ``export_dir`` (1 when there is none)."""
    return max(versions(export_dir), default=0) + 1


def saved_model_folder(path):
    """``path`` itself when it holds ``saved_model.pb``, else its largest numeric sub-folder that does (the
    layout above), else None (also for a folder that cannot be listed)."""
    if os.path.isfile(os.path.join(path, "saved_model.pb")):
        return path
    try:
        folders = [os.path.join(path, str(v)) for v in versions(path)]
    except OSError:  # not readable
        return None
    return next((f for f in folders if os.path.isfile(os.path.join(f, "saved_model.pb"))), None)


def reduced_precision(model, precision):
    """``model`` to decode with ``precision`` (one of :data:`PRECISIONS`): float32, ``model`` itself;
    bfloat16, a copy of it whose weights are cast to bfloat16 once (half the size on disk) and whose
    matrix products run in bfloat16 (Keras' ``bfloat16`` policy), layer normalisation and softmax still
    in float32 (:class:`~tf_transformer.nn.modules.LayerNorm`,
    :class:`~tf_transformer.nn.modules.MultiheadAttention`), as in ``mixed_bfloat16`` training. Fast
    on CPUs with ``avx512_bf16`` or ``amx_bf16`` (oneDNN); elsewhere bfloat16 is emulated, slower.

    Raises:
      UserError: ``precision`` is not one of :data:`PRECISIONS`, naming it and them.
    """
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r}: must be one of {', '.join(PRECISIONS)}")
    if precision == "float32" or model.compute_dtype == precision:
        return model
    from tf_transformer.train.step import precision_policy  # the global Keras policy, restored after

    with precision_policy(precision):
        copy = Transformer(model.source_vocab_size, model.target_vocab_size, model.config)
        ids = tf.constant([[BOS_ID, EOS_ID]])
        copy((ids, ids))
    def within(variable):  # the path without the model's own name
        return variable.path.split("/", 1)[-1]

    sources = {within(v): v for v in model.variables}
    for variable in copy.variables:
        variable.assign(tf.cast(sources[within(variable)], variable.dtype))
    return copy


def export_saved_model(loaded, export_dir, version=None, log=None, xla=False, precision="float32",
                       xla_buckets=XLA_BUCKETS, xla_beam_batch=XLA_BEAM_BATCH, xla_greedy_batch=XLA_GREEDY_BATCH):
    """Exports a loaded model as ``export_dir/<version>/``, atomically.

    Args:
      loaded: :class:`~tf_transformer.infer.load.LoadedModel` (what
        :func:`~tf_transformer.infer.load.load_for_inference` returns); its hparams give the
        beam size, length penalty and length limit.
      export_dir: TF Serving's base path of the model; created if missing.
      version: a positive int; default :func:`next_version`.
      log: ``callable(str)`` for waiting on the export directory's lock (default: standard error).
      xla: also export the ``translate_xla`` signature.
      precision: one of :data:`PRECISIONS`, the weights' and matrix products' type (:func:`reduced_precision`).
      xla_buckets: the row buckets of ``translate_xla``'s loop (1: every row to the end).
      xla_beam_batch: the largest batch whose beam search ``translate_xla`` compiles (:class:`Translator`).
      xla_greedy_batch: the same for its greedy decoding.
    Returns:
      the path of the new version folder.
    Raises:
      UserError: the export directory is a file, the version is unusable (it exists), or ``precision``
        is not one of :data:`PRECISIONS`.
    """
    _check_target(export_dir, version)
    log = log or _stderr
    hp = loaded.hp
    model = reduced_precision(loaded.model, precision)
    # XLA:CPU computes bfloat16 products in float32, the weights converted at every call: its loops run float32's.
    translator = Translator(*loaded.tokenizers, model, hp.beam_size, hp.length_penalty, hp.max_decode_length,
                            xla, hp.max_length_factor, xla_buckets, xla_beam_batch, xla_greedy_batch,
                            hp.beam_patience, xla_model=loaded.model)
    with DirectoryLock(export_dir, "--export-dir", wait=True, on_wait=log):
        _remove_temporaries(export_dir)
        version = next_version(export_dir) if version is None else version
        _check_free(export_dir, version)
        return _save(translator, export_dir, os.path.join(export_dir, str(version)))


def export_model_dir(model_dir, export_dir, version=None, checkpoint=None, log=None, xla=False, precision="float32",
                     beam_patience=None):
    """Exports a model directory written by ``train.py`` (:func:`export_saved_model`), holding its lock.

    Args:
      checkpoint: this checkpoint instead of the newest readable one.
      log: ``callable(str)`` for warnings and waiting (default: standard error).
      xla: also export the ``translate_xla`` signature.
      precision: as :func:`export_saved_model`'s.
      beam_patience: the signatures' beam patience (:class:`Translator`); None: the model's ``beam_patience``.
    Raises:
      UserError: as :func:`export_saved_model`; also the model directory or checkpoint is
        unusable, or the model directory is in use by another process.
    """
    _check_target(export_dir, version)
    if precision not in PRECISIONS:
        raise UserError(f"--precision {precision!r}: must be one of {', '.join(PRECISIONS)}")
    if not os.path.isdir(model_dir):
        raise UserError(f"--model-dir {os.fspath(model_dir)}: not a directory that train.py wrote")
    log = log or _stderr
    with DirectoryLock(os.fspath(model_dir), "--model-dir"):
        loaded = load_for_inference(os.fspath(model_dir), checkpoint, log)
        if beam_patience is not None:
            loaded = loaded._replace(hp=loaded.hp.replace(beam_patience=beam_patience))
        return export_saved_model(loaded, export_dir, version, log, xla, precision)


def _stderr(line):
    print(line, file=sys.stderr)


def _check_target(export_dir, version):
    """Refuses an export directory that is a file, and a version that is not positive or exists already."""
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise UserError(f"--export-dir {export_dir}: is a file, expected a directory")
    if version is not None and version < 1:
        raise UserError(f"--version {version}: TF Serving versions are positive integers")
    _check_free(export_dir, version)


def _check_free(export_dir, version):
    """Refuses an explicit ``version`` that exists already."""
    target = os.path.join(export_dir, str(version))
    if version is not None and os.path.exists(target):
        raise UserError(f"{target} exists already; give another --version, or none for {next_version(export_dir)}")


def _remove_temporaries(export_dir):
    """Removes the temporary folders of exports that were killed (the caller holds the directory's lock)."""
    for path in glob.glob(os.path.join(glob.escape(export_dir), _TEMPORARY_PREFIX + "*")):
        shutil.rmtree(path, ignore_errors=True)


def _save(translator, export_dir, target):
    """Writes the SavedModel into a temporary sibling of ``target``, then renames it into place.

    Raises:
      UserError: the disk is full or read-only (naming the folder and its free space); nothing is left.
    """
    try:
        return _save_whole(translator, export_dir, target)
    except (OSError, tf.errors.OpError) as e:
        if not is_disk_problem(e):
            raise
        raise disk_error(e, "--export-dir", export_dir, "no version was written; free some space and "
                         "export again") from None


def _save_whole(translator, export_dir, target):
    temporary = tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX, dir=export_dir)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)  # mkdtemp makes it 0700; the server may run as another user
        tf.saved_model.save(translator, temporary, signatures=translator.signatures())
        write_warmup_requests(temporary, warmup_requests(translator.beam_size))
        os.rename(temporary, target)  # fails if `target` appeared meanwhile: no version is overwritten
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target

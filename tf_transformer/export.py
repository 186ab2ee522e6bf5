"""SavedModel export for TF Serving: ``python -m tf_transformer.export --model-dir DIR
[--checkpoint PATH] [--export-dir DIR] [--version N]``.

Text in, text out: the export holds the tokenizer(s) (SentencePiece as
``tensorflow_text`` ops, or the word vocabularies as lookup tables), the
model's variables and the cached greedy/beam decoder of
:func:`tf_transformer.decoding.generate`, all in one graph of core TensorFlow
and TensorFlow Text ops, which the stock ``tensorflow/serving`` binary runs.

Layout, as TF Serving expects: ``EXPORT_DIR/<version>/`` (``saved_model.pb``,
``variables/``, ``assets/``), ``version`` by default one more than the largest
there. The SavedModel is written to a hidden sibling (``.tmp-export-*``: not a
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

The score is the decoder's: the translation's log-probability, divided by the
GNMT length penalty for beam search (greedy decoding: the plain log-probability).

Input rules (shared with ``translate.py``, see
:func:`tf_transformer.translate.source_ids`): invalid UTF-8 bytes become
U+FFFD; a source is cut to its first ``maxlen - 1`` tokens, then ``</S>``;
an empty or whitespace-only input translates to ``""`` with score 0 and
costs no decoding; a batch of 0 returns two empty tensors. A beam size outside
1-64 is an ``INVALID_ARGUMENT`` error naming it.
"""

import argparse
import contextlib
import glob
import os
import shutil
import sys
import tempfile

import tensorflow as tf

from tf_transformer import decoding
from tf_transformer.errors import UserError, report_user_errors
from tf_transformer.hparams import MAX_BEAM_SIZE
from tf_transformer.locks import DirectoryLock
from tf_transformer.model_dir import EXPORT_SUBDIR, first_line, load_for_inference
from tf_transformer.serving import BEAM_SIGNATURE, BEAM_SIZE, INPUTS, SCORES, SERVING_SIGNATURE, TRANSLATIONS
from tf_transformer.translate import source_ids

_TEMPORARY_PREFIX = ".tmp-export-"
_INPUTS_SPEC = tf.TensorSpec([None], tf.string, name=INPUTS)
_BEAM_SPEC = tf.TensorSpec([], tf.int32, name=BEAM_SIZE)


class _Untracked:
    """Hides an object from tf.Module's tracking (see :class:`Translator`)."""

    def __init__(self, value):
        self.value = value


class Translator(tf.Module):
    """Strings in, translations out, as one ``tf.Module`` that ``tf.saved_model.save`` can write.

    The Keras model itself is kept out of the object graph (Keras' own
    SavedModel hooks would trace it with made-up inputs); the module tracks its
    variables, which the functions capture.

    Args:
      source_tokenizer, target_tokenizer, model: as ``model_dir.load_for_inference`` returns them.
      beam_size: the default beam size (1 = greedy).
      length_penalty: GNMT alpha.
      max_decode_length: most target tokens; 0 = source length + 50.
    Attributes:
      serve: ``serving_default``, ``(inputs) -> {"translations", "scores"}``.
      translate: ``translate``, ``(inputs, beam_size=beam_size) -> {"translations", "scores"}``.
    """

    def __init__(self, source_tokenizer, target_tokenizer, model, beam_size=1, length_penalty=0.6,
                 max_decode_length=0):
        super().__init__(name="translator")
        if not 1 <= beam_size <= MAX_BEAM_SIZE:
            raise UserError(f"beam_size={beam_size}: must be between 1 and {MAX_BEAM_SIZE}")
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.model_variables = list(model.variables)
        self._model = _Untracked(model)
        self.length_penalty = float(length_penalty)
        self.max_decode_length = int(max_decode_length)  # 0: source length + 50
        default_beam = tf.constant(beam_size, tf.int32)
        self.serve = tf.function(lambda inputs: self._translate(inputs, default_beam),
                                 input_signature=[_INPUTS_SPEC])

        @tf.function(input_signature=[_INPUTS_SPEC, _BEAM_SPEC])
        def translate(inputs, beam_size=default_beam):  # a Tensor default becomes the SignatureDef's default
            return self._translate(inputs, beam_size)

        self.translate = translate

    def signatures(self):
        """The ``signatures`` argument of ``tf.saved_model.save``."""
        return {SERVING_SIGNATURE: self.serve, BEAM_SIGNATURE: self.translate}

    def _translate(self, inputs, beam_size):
        """(N,) string, () int32 -> {"translations": (N,) string, "scores": (N,) float32}."""
        tf.debugging.assert_greater_equal(beam_size, 1, message=f"{BEAM_SIZE} must be at least 1")
        tf.debugging.assert_less_equal(beam_size, MAX_BEAM_SIZE,
                                       message=f"{BEAM_SIZE} must be at most {MAX_BEAM_SIZE}")
        model = self._model.value
        sources = source_ids(self.source_tokenizer, inputs, model.config.maxlen)
        has_words = sources.row_lengths() > 1  # `</S>` alone: empty or whitespace only
        positions = tf.range(tf.shape(inputs)[0])
        busy, idle = tf.boolean_mask(positions, has_words), tf.boolean_mask(positions, ~has_words)

        def decode():
            ids, scores = decoding.generate(model, tf.gather(sources, busy).to_tensor(), beam_size=beam_size,
                                          length_penalty=self.length_penalty, max_length=self.max_decode_length)
            return self.target_tokenizer.detokenize(ids[:, 0]), scores[:, 0]

        def nothing():
            return tf.zeros([0], tf.string), tf.zeros([0], tf.float32)

        texts, scores = tf.cond(tf.size(busy) > 0, decode, nothing)
        idle_count = tf.shape(idle)[:1]
        return {TRANSLATIONS: tf.dynamic_stitch([busy, idle], [texts, tf.fill(idle_count, "")]),
                SCORES: tf.dynamic_stitch([busy, idle], [scores, tf.zeros(idle_count, tf.float32)])}


def next_version(export_dir):
    """One more than the largest numeric sub-folder of ``export_dir`` (1 when there is none)."""
    versions = [int(name) for name in os.listdir(export_dir) if name.isdigit()] if os.path.isdir(export_dir) else []
    return max(versions, default=0) + 1


def export_saved_model(model, export_dir, version=None, checkpoint=None, log=None):
    """Exports a trained model as ``export_dir/<version>/``, atomically.

    Args:
      model: a model directory written by ``train.py`` (locked while exporting), or the
        ``(hp, source_tokenizer, target_tokenizer, model)`` that
        :func:`~tf_transformer.model_dir.load_for_inference` returns.
      export_dir: TF Serving's base path of the model; created if missing.
      version: a positive int; default :func:`next_version`.
      checkpoint: with a model directory, this checkpoint instead of the newest readable one.
      log: ``callable(str)`` for warnings and waiting (default: standard error).
    Returns:
      the path of the new version folder.
    Raises:
      UserError: the model directory, checkpoint or version is unusable (the version exists),
        or the model directory is in use by another process.
    """
    if os.path.exists(export_dir) and not os.path.isdir(export_dir):
        raise UserError(f"--export-dir {export_dir}: is a file, expected a directory")
    if version is not None and version < 1:
        raise UserError(f"--version {version}: TF Serving versions are positive integers")
    _check_free(export_dir, version)
    log = log or (lambda line: print(line, file=sys.stderr))
    from_directory = isinstance(model, (str, os.PathLike))
    if checkpoint is not None and not from_directory:
        raise ValueError("checkpoint goes with a model directory, not with a loaded model")
    if from_directory and not os.path.isdir(model):
        raise UserError(f"--model-dir {os.fspath(model)}: not a directory that train.py wrote")
    with DirectoryLock(os.fspath(model), "--model-dir") if from_directory else contextlib.nullcontext():
        if from_directory:
            model = load_for_inference(os.fspath(model), checkpoint, log)
        hp, source_tokenizer, target_tokenizer, keras_model = model
        translator = Translator(source_tokenizer, target_tokenizer, keras_model, hp.beam_size, hp.length_penalty,
                                hp.max_decode_length)
        with DirectoryLock(export_dir, "--export-dir", wait=True, on_wait=log):
            _remove_temporaries(export_dir)
            version = next_version(export_dir) if version is None else version
            _check_free(export_dir, version)
            return _save(translator, export_dir, os.path.join(export_dir, str(version)))


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
    """Writes the SavedModel into a temporary sibling of ``target``, then renames it into place."""
    temporary = tempfile.mkdtemp(prefix=_TEMPORARY_PREFIX, dir=export_dir)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o777 & ~umask)  # mkdtemp makes it 0700; the server may run as another user
        tf.saved_model.save(translator, temporary, signatures=translator.signatures())
        os.rename(temporary, target)  # fails if `target` appeared meanwhile: no version is overwritten
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    return target


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m tf_transformer.export", description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", required=True, help="a directory written by train.py")
    parser.add_argument("--checkpoint", help="a checkpoint prefix, e.g. DIR/ckpt-1200 (default: the latest)")
    parser.add_argument("--export-dir", help=f"TF Serving's model base path (default: MODEL_DIR/{EXPORT_SUBDIR})")
    parser.add_argument("--version", type=int, help="version folder (default: one more than the largest there)")
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    export_dir = args.export_dir or os.path.join(args.model_dir, EXPORT_SUBDIR)
    try:
        path = export_saved_model(args.model_dir, export_dir, args.version, args.checkpoint)
    except (OSError, tf.errors.OpError) as e:
        raise UserError(f"--export-dir {export_dir}: cannot write the export there ({first_line(e)})") from None
    print(f"exported {path} (signatures: {SERVING_SIGNATURE}, {BEAM_SIGNATURE})")


if __name__ == "__main__":
    sys.exit(main())

"""What a model directory holds, and reading it back.

::

  MODEL_DIR/
    hparams.yaml          resolved hyper-parameters (flat; `--config` reads it)
    sentencepiece.model   the joint subword model (tokenizer: sentencepiece), or
    source.vocab.tsv      the source vocabulary, one `word<TAB>count` per id, and
    target.vocab.tsv      the target vocabulary (tokenizer: word)
    checkpoint, ckpt-N.*  tf.train.CheckpointManager files, N = the training step
                          (tf_transformer.checkpoints: weights, optimizer, data position)
    best/                 the checkpoint with the best dev BLEU, and best.yaml (its scores)
    average/              the average of the last checkpoints (tf_transformer.average), itself a model
                          directory: translate.py --model-dir MODEL_DIR/average reads it
    samples-stepN.txt     dev translations at step N
    logs/                 TensorBoard event files
    export/<version>/     the SavedModel for TF Serving (tf_transformer.export)

Every file is written atomically, so a killed run leaves the previous version.
Each checkpoint also stores the sha256 of the tokenizer it was trained with, so
a replaced tokenizer file is caught before it silently shifts every id.
"""

import os

import numpy as np
import tensorflow as tf

from tf_transformer.errors import UserError
from tf_transformer.files import write_atomic
from tf_transformer.hparams import ARCHITECTURE_KEYS, load_hparams
from tf_transformer.model import Transformer
from tf_transformer.tokenizer import SubwordTokenizer, WordTokenizer
from tf_transformer.vocab import WordVocab

HPARAMS_FILE = "hparams.yaml"
SENTENCEPIECE_FILE = "sentencepiece.model"
SOURCE_VOCAB_FILE = "source.vocab.tsv"
TARGET_VOCAB_FILE = "target.vocab.tsv"
# The checkpoint key of the tokenizer's sha256 (see `tokenizer_fingerprint`).
_FINGERPRINT_KEY = "tokenizer_fingerprint/.ATTRIBUTES/VARIABLE_VALUE"


def _path(model_dir, name):
    return os.path.join(model_dir, name)


def check_compatible(model_dir, hp):
    """Refuses to reuse a model directory trained with other architecture hyper-parameters.

    Raises:
      UserError: naming every differing key with both values.
    """
    saved_path = _path(model_dir, HPARAMS_FILE)
    if not os.path.exists(saved_path) or tf.train.latest_checkpoint(model_dir) is None:
        return
    saved, current = load_hparams(config=saved_path).to_dict(), hp.to_dict()
    differing = [f"{k}: {saved[k]!r} in {saved_path}, {current[k]!r} now"
                 for k in ARCHITECTURE_KEYS if saved[k] != current[k]]
    if differing:
        raise UserError(
            f"{model_dir} holds a checkpoint of a different architecture ({'; '.join(differing)}); "
            f"use another --model-dir, or the same values"
        )


def tokenizer_files(hp):
    """The files that hold the tokenizers of ``hp.tokenizer``."""
    if hp.tokenizer == "sentencepiece":
        return [SENTENCEPIECE_FILE]
    return [SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE]


def save_run_files(model_dir, hp, source_tokenizer, target_tokenizer):
    """Writes hparams.yaml and the tokenizer files, each atomically."""
    os.makedirs(model_dir, exist_ok=True)
    hp.save(_path(model_dir, HPARAMS_FILE))
    if hp.tokenizer == "sentencepiece":
        write_atomic(_path(model_dir, SENTENCEPIECE_FILE), source_tokenizer.model_proto)
    else:
        source_tokenizer.vocab.save(_path(model_dir, SOURCE_VOCAB_FILE))
        target_tokenizer.vocab.save(_path(model_dir, TARGET_VOCAB_FILE))


def load_tokenizers(model_dir, hp):
    """The saved (source, target) tokenizers of kind ``hp.tokenizer``, or None when absent."""
    paths = [_path(model_dir, name) for name in tokenizer_files(hp)]
    if not all(os.path.exists(p) for p in paths):
        return None
    if hp.tokenizer == "sentencepiece":
        with open(paths[0], "rb") as f:
            proto = f.read()
        try:
            joint = SubwordTokenizer(proto)
        except Exception as e:  # sentencepiece raises RuntimeError/OSError on a damaged model
            raise UserError(f"{paths[0]}: not a readable SentencePiece model ({e})") from None
        return joint, joint
    return WordTokenizer(WordVocab.load(paths[0])), WordTokenizer(WordVocab.load(paths[1]))


def tokenizer_fingerprint(source_tokenizer, target_tokenizer):
    """The sha256 of both tokenizers, as a checkpoint stores it (``tokenizer_fingerprint``)."""
    return source_tokenizer.fingerprint() + "/" + target_tokenizer.fingerprint()


def check_tokenizer(model_dir, hp, checkpoint_path, tokenizers):
    """Refuses a checkpoint trained with another tokenizer than the one in ``model_dir``.

    Raises:
      UserError: naming the tokenizer file(s) and the checkpoint.
    """
    try:
        saved = tf.train.load_variable(checkpoint_path, _FINGERPRINT_KEY)
    except (tf.errors.NotFoundError, ValueError):
        return  # written before fingerprints were stored
    if saved.decode() != tokenizer_fingerprint(*tokenizers):
        files = " and ".join(_path(model_dir, name) for name in tokenizer_files(hp))
        raise UserError(
            f"{files} is not the tokenizer that {checkpoint_path} was trained with (their sha256 differ); "
            f"put the original file(s) back, or train in a new --model-dir")


def build_model(hp, source_tokenizer, target_tokenizer):
    """A :class:`Transformer` with its variables created (so a checkpoint can fill them)."""
    model = Transformer.from_hparams(hp, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    ids = tf.constant(np.full([1, 2], 4, np.int32))
    model((ids, ids), training=False)
    return model


def load_for_inference(model_dir):
    """Reads a trained model directory.

    Returns:
      (hp, source_tokenizer, target_tokenizer, model) with the latest checkpoint restored.
    Raises:
      UserError: the directory, its hparams, tokenizer or checkpoint are missing,
        or the tokenizer is not the one the checkpoint was trained with.
    """
    hparams_path = _path(model_dir, HPARAMS_FILE)
    if not os.path.exists(hparams_path):
        raise UserError(f"{model_dir}: no {HPARAMS_FILE} there; is it a directory that train.py wrote?")
    hp = load_hparams(config=hparams_path)
    tokenizers = load_tokenizers(model_dir, hp)
    if tokenizers is None:
        raise UserError(f"{model_dir}: missing {' or '.join(tokenizer_files(hp))}")
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        raise UserError(f"{model_dir}: no checkpoint yet; train first with train.py --model-dir {model_dir}")
    check_tokenizer(model_dir, hp, latest, tokenizers)
    model = build_model(hp, *tokenizers)
    # The file also holds the optimizer; every variable of the model must be in it.
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    return hp, tokenizers[0], tokenizers[1], model

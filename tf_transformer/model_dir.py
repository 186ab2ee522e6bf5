"""What a model directory holds, and reading it back.

::

  MODEL_DIR/
    hparams.yaml          resolved hyper-parameters (flat; `--config` reads it)
    source.vocab.tsv      source vocabulary, one `word<TAB>count` per id
    target.vocab.tsv      target vocabulary
    checkpoint, ckpt-N.*  tf.train.CheckpointManager files

Every file is written atomically, so a killed run leaves the previous version.
"""

import os

import numpy as np
import tensorflow as tf

from tf_transformer.errors import UserError
from tf_transformer.hparams import ARCHITECTURE_KEYS, load_hparams
from tf_transformer.model import Transformer
from tf_transformer.vocab import WordVocab

HPARAMS_FILE = "hparams.yaml"
SOURCE_VOCAB_FILE = "source.vocab.tsv"
TARGET_VOCAB_FILE = "target.vocab.tsv"


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


def save_run_files(model_dir, hp, source_vocab, target_vocab):
    os.makedirs(model_dir, exist_ok=True)
    hp.save(_path(model_dir, HPARAMS_FILE))
    source_vocab.save(_path(model_dir, SOURCE_VOCAB_FILE))
    target_vocab.save(_path(model_dir, TARGET_VOCAB_FILE))


def load_vocabs(model_dir):
    """The saved (source, target) vocabularies, or None when the directory has none."""
    paths = [_path(model_dir, SOURCE_VOCAB_FILE), _path(model_dir, TARGET_VOCAB_FILE)]
    if not all(os.path.exists(p) for p in paths):
        return None
    return WordVocab.load(paths[0]), WordVocab.load(paths[1])


def build_model(hp, source_vocab, target_vocab):
    """A :class:`Transformer` with its variables created (so a checkpoint can fill them)."""
    model = Transformer.from_hparams(hp, len(source_vocab), len(target_vocab))
    ids = tf.constant(np.full([1, 2], 4, np.int32))
    model((ids, ids), training=False)
    return model


def load_for_inference(model_dir):
    """Reads a trained model directory.

    Returns:
      (hp, source_vocab, target_vocab, model) with the latest checkpoint restored.
    Raises:
      UserError: the directory, its hparams, vocabularies or checkpoint are missing.
    """
    hparams_path = _path(model_dir, HPARAMS_FILE)
    if not os.path.exists(hparams_path):
        raise UserError(f"{model_dir}: no {HPARAMS_FILE} there; is it a directory that train.py wrote?")
    hp = load_hparams(config=hparams_path)
    vocabs = load_vocabs(model_dir)
    if vocabs is None:
        raise UserError(f"{model_dir}: missing {SOURCE_VOCAB_FILE} or {TARGET_VOCAB_FILE}")
    latest = tf.train.latest_checkpoint(model_dir)
    if latest is None:
        raise UserError(f"{model_dir}: no checkpoint yet; train first with train.py --model-dir {model_dir}")
    model = build_model(hp, *vocabs)
    # The file also holds the optimizer; every variable of the model must be in it.
    tf.train.Checkpoint(model=model).restore(latest).expect_partial().assert_existing_objects_matched()
    return hp, vocabs[0], vocabs[1], model

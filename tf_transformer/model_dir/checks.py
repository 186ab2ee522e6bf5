"""Checks of a model directory against the hyper-parameters: its architecture, its tokenizer.

Each checkpoint also stores the sha256 of the tokenizer it was trained with, so
a replaced tokenizer file is caught before it silently shifts every id, and
the architecture hyper-parameters it was built with, so that a checkpoint is
never read into a model of other shapes.
"""

import json
import os

import tensorflow as tf

from tf_transformer.data.tokenizer import tokenizer_fingerprint
from tf_transformer.errors import UserError
from tf_transformer.hparams import ARCHITECTURE_KEYS, load_hparams
from tf_transformer.model_dir.checkpoint_files import find_checkpoints
from tf_transformer.model_dir.run_files import HPARAMS_FILE, tokenizer_files

# The checkpoint key of the tokenizers' sha256 (:func:`~tf_transformer.data.tokenizer.tokenizer_fingerprint`).
_FINGERPRINT_KEY = "tokenizer_fingerprint/.ATTRIBUTES/VARIABLE_VALUE"
# The checkpoint key of the architecture record (see `architecture_record`).
_ARCHITECTURE_KEY = "architecture/.ATTRIBUTES/VARIABLE_VALUE"


def check_compatible(model_dir, hp):
    """Refuses to reuse a model directory trained with other architecture hyper-parameters.

    Raises:
      UserError: naming every differing key with both values.
    """
    saved_path = os.path.join(model_dir, HPARAMS_FILE)
    if not os.path.exists(saved_path) or not find_checkpoints(model_dir):
        return
    differing = _differing_architecture(saved_path, hp)
    if differing:
        raise UserError(
            f"{model_dir} holds a checkpoint of a different architecture ({'; '.join(differing)}); "
            f"use another --model-dir, or the same values"
        )


def check_same_architecture(source_dir, hp):
    """Refuses to fine-tune ``source_dir``'s weights (``train.py --init-from``) with other architecture
    hyper-parameters than it was trained with.

    Raises:
      UserError: no hparams.yaml there, or naming every differing key with both values.
    """
    saved_path = os.path.join(source_dir, HPARAMS_FILE)
    if not os.path.isfile(saved_path):
        raise UserError(f"--init-from {source_dir}: no {HPARAMS_FILE} there; is it a directory that train.py wrote?")
    differing = _differing_architecture(saved_path, hp)
    if differing:
        raise UserError(f"--init-from {source_dir}: fine-tuning keeps its architecture and tokenizer, but "
                        f"{'; '.join(differing)}; drop those --set/--config values")


def _differing_architecture(saved_path, hp):
    """``key: saved in PATH, current now`` for each architecture key whose value differs."""
    saved, current = load_hparams(config=saved_path).to_dict(), hp.to_dict()
    return [f"{k}: {saved[k]!r} in {saved_path}, {current[k]!r} now" for k in ARCHITECTURE_KEYS if saved[k] != current[k]]


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
        files = " and ".join(os.path.join(model_dir, name) for name in tokenizer_files(hp))
        raise UserError(
            f"{files} is not the tokenizer that {checkpoint_path} was trained with (their sha256 differ); "
            f"put the original file(s) back, or train in a new --model-dir")


def architecture_record(hp):
    """The architecture hyper-parameters (``ARCHITECTURE_KEYS``) as the JSON text a checkpoint stores."""
    return json.dumps({key: getattr(hp, key) for key in ARCHITECTURE_KEYS}, sort_keys=True)


def check_architecture(checkpoint_path, hp, source, advice):
    """Refuses a checkpoint built with other architecture hyper-parameters than ``hp``.

    Args:
      source: who gives ``hp``, for the message (e.g. ``"MODEL_DIR/hparams.yaml says"``).
      advice: what to do about it, for the message.
    Raises:
      UserError: e.g. ``ckpt-3 has num_units 32, hparams.yaml says 64; ...``.
    """
    try:
        saved = json.loads(tf.train.load_variable(checkpoint_path, _ARCHITECTURE_KEY).decode())
    except (tf.errors.NotFoundError, ValueError):
        return  # written before the record was stored: the restore compares the shapes
    differing = [key for key in ARCHITECTURE_KEYS if key in saved and saved[key] != getattr(hp, key)]
    if differing:
        has = " and ".join(f"{key} {saved[key]}" for key in differing)
        says = " and ".join(f"{key} {getattr(hp, key)}" for key in differing)
        raise UserError(f"{checkpoint_path} has {has}, {source} {says}; {advice}")

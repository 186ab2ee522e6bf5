"""Reading a trained model directory for inference: its hyper-parameters, tokenizers and newest checkpoint."""

import os
import sys
from typing import NamedTuple

import tensorflow as tf

from tf_transformer.data.tokenizer import SubwordTokenizer, WordTokenizer
from tf_transformer.errors import UserError, first_line
from tf_transformer.hparams import HParams, load_hparams
from tf_transformer.model_dir.checkpoint_files import build_model, restore_model, restore_newest
from tf_transformer.model_dir.checks import check_architecture, check_tokenizer
from tf_transformer.model_dir.run_files import HPARAMS_FILE, load_tokenizers, tokenizer_files
from tf_transformer.nn.model import Transformer


class LoadedModel(NamedTuple):
    """A trained model read back from its directory (:func:`load_for_inference`)."""

    hp: HParams
    source_tokenizer: SubwordTokenizer | WordTokenizer
    target_tokenizer: SubwordTokenizer | WordTokenizer
    model: Transformer

    @property
    def tokenizers(self):
        """(source_tokenizer, target_tokenizer)."""
        return self.source_tokenizer, self.target_tokenizer


def load_for_inference(model_dir, checkpoint=None, log=None):
    """Reads a trained model directory: :func:`restore_newest` with the same checks as the trainer.

    Args:
      checkpoint: restore this checkpoint prefix instead (no fallback).
      log: ``callable(str)`` for warnings (default: standard error).
    Returns:
      :class:`LoadedModel`, its model holding the checkpoint's weights.
    Raises:
      UserError: the directory, its hparams, tokenizer or checkpoint are missing or
        unreadable, the tokenizer is not the one the checkpoint was trained with, or
        hparams.yaml describes other shapes than the checkpoint's.
    """
    hparams_path = os.path.join(model_dir, HPARAMS_FILE)
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise UserError(f"--model-dir {model_dir}: is a file, expected a directory that train.py wrote")
    if not os.path.exists(hparams_path):
        raise UserError(_not_a_run_directory(model_dir))
    hp = load_hparams(config=hparams_path)
    tokenizers = load_tokenizers(model_dir, hp)
    if tokenizers is None:
        raise UserError(f"{model_dir}: missing {' or '.join(tokenizer_files(hp))}")
    model = build_model(hp, *tokenizers)

    def check(path):
        check_tokenizer(model_dir, hp, path, tokenizers)
        check_architecture(path, hp, f"{hparams_path} says",
                           f"put back the {HPARAMS_FILE} it was trained with (those keys as in the checkpoint)")

    def restore(path):
        status = restore_model(model, path)
        try:  # the file also holds the optimizer; every variable of the model must be in it
            status.assert_existing_objects_matched()
        except AssertionError as e:
            raise UserError(f"{path}: does not hold this model's weights ({first_line(e)})") from None

    log = log or (lambda line: print(line, file=sys.stderr))
    if checkpoint is not None:
        _restore_given(checkpoint, check, restore)
    elif restore_newest(model_dir, restore, log, check) is None:
        raise UserError(f"{model_dir}: no checkpoint yet; train first with train.py --model-dir {model_dir}")
    return LoadedModel(hp, tokenizers[0], tokenizers[1], model)


def _not_a_run_directory(model_dir):
    """The one-line error for a ``model_dir`` without hparams.yaml: a SavedModel export is named as one, with
    the run directory that wrote it when a parent holds hparams.yaml."""
    from tf_transformer.infer.export import saved_model_folder  # here: export imports this module

    if saved_model_folder(model_dir) is None:
        return f"{model_dir}: no {HPARAMS_FILE} there; is it a directory that train.py wrote?"
    parent = os.path.dirname(os.path.normpath(model_dir)) or os.curdir  # as the user wrote it, relative or not
    parents = [parent, os.path.normpath(os.path.join(parent, os.pardir))]
    run = next((p for p in parents if os.path.isfile(os.path.join(p, HPARAMS_FILE))), None)
    return (f"{model_dir}: a SavedModel export, not a directory that train.py wrote (no {HPARAMS_FILE} there); "
            f"give --model-dir the run directory{f' ({run})' if run else ''}, or serve the export with TF Serving "
            f"and translate with translate.py --server HOST:PORT or --rest URL")


def _restore_given(checkpoint, check, restore):
    """Restores one named checkpoint, or fails with one line."""
    if not tf.io.gfile.exists(checkpoint + ".index"):
        raise UserError(f"--checkpoint {checkpoint}: no such checkpoint (expected {checkpoint}.index)")
    try:
        check(checkpoint)
        restore(checkpoint)
    except (tf.errors.OpError, ValueError, IndexError) as e:
        raise UserError(f"--checkpoint {checkpoint}: unreadable ({first_line(e)})") from None

"""The run files a training writes into its model directory (their names and the directory's layout:
:mod:`tf_transformer.model_dir.layout`), and reading its tokenizers back.

Every file is written atomically, so a killed run leaves the previous version. The checks of a
directory against the hyper-parameters are in :mod:`tf_transformer.model_dir.checks`, its checkpoints in
:mod:`tf_transformer.model_dir.checkpoint_files`, reading a model for inference in
:mod:`tf_transformer.infer.load`.
"""

import os
import time

from tf_transformer.data.tokenizer import SubwordTokenizer, WordTokenizer
from tf_transformer.data.vocab import WordVocab
from tf_transformer.errors import UserError
from tf_transformer.files import write_atomic
from tf_transformer.model_dir.layout import (EXPORT_SUBDIR, HPARAMS_FILE, PREVIOUS_PREFIX,
                                             SENTENCEPIECE_FILE, SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE)


def tokenizer_files(hp):
    """The files that hold the tokenizers of ``hp.tokenizer``."""
    if hp.tokenizer == "sentencepiece":
        return [SENTENCEPIECE_FILE]
    return [SOURCE_VOCAB_FILE, TARGET_VOCAB_FILE]


def save_run_files(model_dir, hp, source_tokenizer, target_tokenizer):
    """Writes hparams.yaml and the tokenizer files, each atomically."""
    os.makedirs(model_dir, exist_ok=True)
    hp.save(os.path.join(model_dir, HPARAMS_FILE))
    if hp.tokenizer == "sentencepiece":
        write_atomic(os.path.join(model_dir, SENTENCEPIECE_FILE), source_tokenizer.model_proto)
    else:
        source_tokenizer.vocab.save(os.path.join(model_dir, SOURCE_VOCAB_FILE))
        target_tokenizer.vocab.save(os.path.join(model_dir, TARGET_VOCAB_FILE))


def copy_tokenizer_files(source_dir, model_dir, hp):
    """Copies ``source_dir``'s tokenizer files into ``model_dir`` (created) where it has none; returns
    whether it copied (``train.py --init-from``: the new run keeps the old run's tokenizer)."""
    if all(os.path.exists(os.path.join(model_dir, name)) for name in tokenizer_files(hp)):
        return False
    os.makedirs(model_dir, exist_ok=True)
    for name in tokenizer_files(hp):
        with open(os.path.join(source_dir, name), "rb") as f:
            write_atomic(os.path.join(model_dir, name), f.read())
    return True


def load_tokenizers(model_dir, hp):
    """The saved (source, target) tokenizers of kind ``hp.tokenizer``, or None when absent."""
    paths = [os.path.join(model_dir, name) for name in tokenizer_files(hp)]
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


def set_aside(model_dir):
    """Moves what earlier runs wrote in ``model_dir`` (all but ``export/``, hidden files and
    earlier ``previous-*``) into a new ``model_dir/previous-YYYYmmdd-HHMMSS/``.

    Returns:
      the new folder, or None when there was nothing to move.
    """
    names = [name for name in (os.listdir(model_dir) if os.path.isdir(model_dir) else [])
             if not name.startswith((".", PREVIOUS_PREFIX)) and name != EXPORT_SUBDIR]
    if not names:
        return None
    target = os.path.join(model_dir, PREVIOUS_PREFIX + time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    while os.path.exists(target):
        target += "-1"
    os.makedirs(target)
    for name in names:
        os.rename(os.path.join(model_dir, name), os.path.join(target, name))
    return target

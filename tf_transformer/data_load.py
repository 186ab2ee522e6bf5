"""Reading parallel text and batching it (the original's ``data_load.py``).

A corpus is two line-aligned UTF-8 files, one sentence per line: line k of
the source file translates line k of the target file.
"""

import os

import numpy as np
import tensorflow as tf

from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines
from tf_transformer.vocab import EOS_ID

TOY_CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora", "toy", "train")


def read_parallel(source_path, target_path):
    """Line-aligned sentence pairs; pairs where either side is blank are skipped.

    Returns:
      (pairs, skipped): a list of (source, target) strings and the number of
      blank pairs dropped.
    Raises:
      UserError: missing files, bad UTF-8, or different line counts (both named).
    """
    sources, targets = read_text_lines(source_path), read_text_lines(target_path)
    if len(sources) != len(targets):
        raise UserError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}; "
            f"a parallel corpus needs the same number of lines on both sides"
        )
    pairs = [(s.strip(), t.strip()) for s, t in zip(sources, targets)]
    kept = [(s, t) for s, t in pairs if s and t]
    if not kept:
        raise UserError(f"{source_path} / {target_path}: no sentence pairs (all {len(pairs)} lines are blank)")
    return kept, len(pairs) - len(kept)


def encode_pairs(pairs, source_vocab, target_vocab, maxlen):
    """Sentence pairs -> id lists with ``</S>`` appended, dropping pairs longer than ``maxlen``.

    Returns:
      (examples, dropped): a list of (source ids, target ids) and how many
      pairs were longer than ``maxlen`` tokens (``</S>`` included).
    """
    examples = []
    for source, target in pairs:
        x = source_vocab.encode(source) + [EOS_ID]
        y = target_vocab.encode(target) + [EOS_ID]
        if len(x) <= maxlen and len(y) <= maxlen:
            examples.append((x, y))
    return examples, len(pairs) - len(examples)


def pad_batch(sequences):
    """A list of id lists -> (N, T) int32 array, ``<PAD>``-padded to the longest."""
    batch = np.zeros([len(sequences), max(len(s) for s in sequences)], np.int32)
    for row, ids in enumerate(sequences):
        batch[row, : len(ids)] = ids
    return batch


def make_dataset(examples, batch_size, shuffle=True, seed=None):
    """``tf.data`` batches of (x, y), each padded to its own longest sentence.

    Yields:
      x: (N, T_x) int32 source ids; y: (N, T_y) int32 target ids.
    """
    sources = tf.ragged.constant([x for x, _ in examples], dtype=tf.int32)
    targets = tf.ragged.constant([y for _, y in examples], dtype=tf.int32)
    dataset = tf.data.Dataset.from_tensor_slices((sources, targets))
    if shuffle:
        dataset = dataset.shuffle(len(examples), seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.batch(batch_size)
    dataset = dataset.map(lambda x, y: (x.to_tensor(), y.to_tensor()))
    return dataset.prefetch(tf.data.AUTOTUNE)

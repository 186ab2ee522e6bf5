"""Small helpers shared by the test files (not tests themselves)."""

import keras
import numpy as np
import tensorflow as tf

from tf_transformer.nn.model import Transformer
from tf_transformer.train import step


def padded_ids(seed, lengths, width, vocab):
    """(len(lengths), width) int32 ids drawn from [4, vocab) (no special
    tokens); row r is real for lengths[r] tokens, then <PAD> (0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(len(lengths), width)).astype(np.int32)
    for row, length in enumerate(lengths):
        ids[row, length:] = 0
    return ids


def built_model_and_optimizer(hp, vocab_size, seed=0):
    """A seeded :class:`~tf_transformer.nn.model.Transformer` of ``hp`` (``vocab_size`` on both sides)
    and the trainer's optimizer, both built (their variables exist)."""
    keras.utils.set_random_seed(seed)
    model = Transformer.from_hparams(hp, vocab_size, vocab_size)
    model((tf.ones([1, 2], tf.int32), tf.ones([1, 2], tf.int32)))
    optimizer = step.make_optimizer(hp)
    optimizer.build(model.trainable_variables)
    return model, optimizer

"""Decoding: turning a source batch into target ids.

:func:`greedy_decode` is the original's algorithm and the reference for every
faster decoder: at each step the decoder re-reads the whole prefix it has
produced so far (no cache), takes the argmax at the last position and feeds it
back, starting from ``<S>``.
"""

import numpy as np
import tensorflow as tf

from tf_transformer.vocab import BOS_ID, EOS_ID, PAD_ID


@tf.function(reduce_retracing=True)
def _encode(model, x):
    return model.encode(x, training=False)


@tf.function(reduce_retracing=True)
def _next_token(model, prefix, memory, source_masks):
    """(N, t) prefix -> (N,) argmax of the logits at the last position."""
    logits = model.decode(prefix, memory, source_masks, training=False)
    return tf.argmax(logits[:, -1, :], axis=-1, output_type=tf.int32)


def greedy_decode(model, x, max_length=None, on_step=None):
    """Greedy decoding by full recompute, a batch at a time.

    Args:
      model: a :class:`~tf_transformer.model.Transformer`.
      x: (N, T_x) int32 source ids, ``</S>``-terminated and ``<PAD>``-padded.
      max_length: most tokens to generate; default ``T_x + 50``.
      on_step: optional ``callable(step, tokens)`` called after every step
        with the (N, step + 1) tokens generated so far (for ``--trace``).
    Returns:
      (N, T_out) int32 numpy ids; each row ends with ``</S>`` unless it hit
      ``max_length``, followed by ``<PAD>``.
    """
    x = tf.convert_to_tensor(x, tf.int32)
    if max_length is None:
        max_length = int(x.shape[1]) + 50
    memory, source_masks = _encode(model, x)
    batch = int(x.shape[0])
    prefix = np.full([batch, 1], BOS_ID, np.int32)
    finished = np.zeros([batch], bool)
    for step in range(max_length):
        next_ids = _next_token(model, tf.constant(prefix), memory, source_masks).numpy()
        next_ids = np.where(finished, PAD_ID, next_ids)
        prefix = np.concatenate([prefix, next_ids[:, None]], axis=1)
        finished |= next_ids == EOS_ID
        if on_step is not None:
            on_step(step, prefix[:, 1:])
        if finished.all():
            break
    return prefix[:, 1:]

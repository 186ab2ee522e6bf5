"""Small helpers shared by the test files (not tests themselves)."""

import contextlib
import os
import shutil
import socket
import subprocess

import keras
import numpy as np
import pytest
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


def tiny_batches(count, vocab):
    """``count`` (x, y) batches of 3 pairs of width 6, lengths varying, ``</S>`` last (the bench tests' real batches)."""
    from tf_transformer.data.vocab import EOS_ID

    batches = []
    for i in range(count):
        x, y = padded_ids(i, [5, 3, 1 + i % 4], 6, vocab), padded_ids(100 + i, [2, 6, 4], 6, vocab)
        for ids in (x, y):
            ids[np.arange(3), np.count_nonzero(ids, axis=1) - 1] = EOS_ID
        batches.append((x, y))
    return batches


def built_model_and_optimizer(hp, vocab_size, seed=0):
    """A seeded :class:`~tf_transformer.nn.model.Transformer` of ``hp`` (``vocab_size`` on both sides)
    and the trainer's optimizer, both built (their variables exist)."""
    keras.utils.set_random_seed(seed)
    model = Transformer.from_hparams(hp, vocab_size, vocab_size)
    model((tf.ones([1, 2], tf.int32), tf.ones([1, 2], tf.int32)))
    optimizer = step.make_optimizer(hp)
    optimizer.build(model.trainable_variables)
    return model, optimizer


@contextlib.contextmanager
def small_disk(path, kib):
    """``path`` (created) is a tmpfs of ``kib`` KiB while the block runs: a disk that fills up.
    Skips the test where mounting is not allowed (not root)."""
    os.makedirs(path, exist_ok=True)
    _mount_or_skip(["mount", "-t", "tmpfs", "-o", f"size={kib}k", "tmpfs", str(path)])
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def read_only(path):
    """``path`` (a directory) is read-only while the block runs, as a read-only mount makes it (even
    root cannot write). Skips the test where mounting is not allowed (not root)."""
    _mount_or_skip(["mount", "--bind", str(path), str(path)])
    try:
        _mount_or_skip(["mount", "-o", "remount,bind,ro", str(path)])
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _mount_or_skip(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"cannot mount here ({done.stderr.strip()}): needs root")


def fill(directory, leave_bytes):
    """Writes a ballast file in ``directory`` that leaves about ``leave_bytes`` free on its disk."""
    free = shutil.disk_usage(directory).free
    with open(os.path.join(directory, "ballast"), "wb") as f:
        f.write(bytes(max(0, free - leave_bytes)))


def free_ports(count):
    """``count`` distinct local ports that were free a moment ago."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports

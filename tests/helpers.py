"""Small helpers shared by the test files (not tests themselves)."""

import numpy as np


def padded_ids(seed, lengths, width, vocab):
    """(len(lengths), width) int32 ids drawn from [4, vocab) (no special
    tokens); row r is real for lengths[r] tokens, then <PAD> (0)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, vocab, size=(len(lengths), width)).astype(np.int32)
    for row, length in enumerate(lengths):
        ids[row, length:] = 0
    return ids

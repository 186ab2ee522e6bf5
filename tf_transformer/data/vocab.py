"""Whitespace-word vocabulary, as in the blog version (``prepro.py``/``load_de_vocab``).

Ids 0-3 are reserved: ``<PAD>``=0, ``<UNK>``=1, ``<S>``=2, ``</S>``=3. The file
format is the original's ``*.vocab.tsv``: one ``word<TAB>count`` line per id.
Turning text into ids is :class:`tf_transformer.data.tokenizer.WordTokenizer`'s job,
in the graph; a word is what ``tf.strings.split`` separates, here and there.
"""

import collections
import itertools

import tensorflow as tf

from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines, write_atomic

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
SPECIALS = ("<PAD>", "<UNK>", "<S>", "</S>")
_CHUNK = 65536  # lines split at a time


class WordVocab:
    """The words of one language, most frequent first: word ``words[i]`` has id ``i``.

    Example:
      >>> vocab = WordVocab.build(["ich mochte ein bier", "ich"])
      >>> vocab.words[4:], vocab.counts[4:]
      (['ich', 'mochte', 'ein', 'bier'], [2, 1, 1, 1])
    """

    def __init__(self, words, counts=None):
        if tuple(words[: len(SPECIALS)]) != SPECIALS:
            raise UserError(f"a vocabulary must start with {', '.join(SPECIALS)}; got {list(words[:4])}")
        self.words = list(words)
        self.counts = list(counts) if counts is not None else [0] * len(words)

    def __len__(self):
        return len(self.words)

    @classmethod
    def build(cls, lines, max_size=None, min_count=1):
        """Most frequent words first (ties by first appearance), at most ``max_size`` ids in all."""
        counter, lines = collections.Counter(), iter(lines)
        while chunk := list(itertools.islice(lines, _CHUNK)):  # a corpus larger than memory is never held
            words = tf.strings.split(tf.constant(chunk, tf.string)).flat_values.numpy()
            counter.update(word.decode("utf-8") for word in words)
        ranked = [(w, c) for w, c in counter.most_common() if c >= min_count]
        if max_size is not None:
            ranked = ranked[: max(0, max_size - len(SPECIALS))]
        return cls(list(SPECIALS) + [w for w, _ in ranked], [0] * len(SPECIALS) + [c for _, c in ranked])

    def save(self, path):
        """Writes the tsv atomically (a temporary file, then a rename)."""
        text = "".join(f"{w}\t{c}\n" for w, c in zip(self.words, self.counts))
        write_atomic(path, text)

    @classmethod
    def load(cls, path):
        rows = [line.split("\t") for line in read_text_lines(path)]
        for number, row in enumerate(rows, 1):
            if len(row) != 2 or not row[1].isdigit():
                raise UserError(f"{path}:{number}: expected 'word<TAB>count', got {row!r}")
        return cls([r[0] for r in rows], [int(r[1]) for r in rows])


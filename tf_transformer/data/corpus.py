"""Parallel corpora on disk: which files hold them, and reading them into sentence pairs.

Three layouts are read:

* **line-aligned** files, one sentence per line: line k of the source file
  translates line k of the target file (``train.de`` / ``train.en``, optionally
  ``.gz``; what the corpus builder writes);
* **TSV**: one file, ``source<TAB>target`` per line;
* **IWSLT**, as the original used it: ``train.tags.de-en.de`` (lines that start
  with ``<`` are talk metadata and are skipped) and ``*.xml`` dev/test files
  (the text of each ``<seg id="N">...</seg>``).

A corpus directory holds ``train``, and optionally ``dev`` and ``test``, in
one of these layouts. Blank lines (either side blank) are skipped and counted.
"""

import dataclasses
import glob
import html
import itertools
import os
import re

from tf_transformer.errors import UserError
from tf_transformer.files import iter_text_lines

CORPORA_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpora")
# Corpora shipped in the package, by name (``train.py --data NAME``).
EMBEDDED = {"ding-de-en": os.path.join(CORPORA_DIR, "ding-de-en"), "toy": os.path.join(CORPORA_DIR, "toy")}
DEFAULT_CORPUS = "ding-de-en"
SPLITS = ("train", "dev", "test")

_SEGMENT = re.compile(r"<seg[^>]*>(.*)</seg>", re.IGNORECASE)


@dataclasses.dataclass
class Pairs:
    """Sentence pairs read from one split, and what reading skipped."""

    pairs: list  # of (source, target) str
    blank: int  # line pairs skipped because either side was blank
    origin: str  # the file(s) they came from, for messages


@dataclasses.dataclass(frozen=True)
class Split:
    """Where one split lives: two line-aligned/IWSLT files, or one TSV file (target None)."""

    source: str
    target: str = None

    def read(self):
        """All its pairs in memory: :class:`Pairs`."""
        return self.stream().read()

    def stream(self):
        """Its pairs read from disk while iterated: :class:`PairStream`."""
        return PairStream(self)

    @property
    def files(self):
        """The file(s) it is read from."""
        return [self.source] if self.target is None else [self.source, self.target]


class PairStream:
    """The sentence pairs of a :class:`Split`, read a block at a time each time it is iterated, so
    that a corpus larger than memory can be tokenized (:mod:`tf_transformer.data.shards`).

    Iterating yields ``(source, target)`` str, stripped, line pairs with a blank side skipped.
    After a complete pass, :attr:`blank` counts those skipped.

    Raises (while iterating):
      UserError: as :func:`read_parallel` and :func:`read_tsv`.
    """

    def __init__(self, split):
        self.split, self.blank = split, None
        self.origin = split.source if split.target is None else f"{split.source} / {split.target}"

    def _rows(self):
        if self.split.target is None:
            return _tsv_rows(self.split.source)
        return _parallel_rows(self.split.source, self.split.target)

    def __iter__(self):
        rows = blank = 0
        for source, target in self._rows():
            rows += 1
            source, target = source.strip(), target.strip()
            if source and target:
                yield source, target
            else:
                blank += 1
        if rows == blank:
            raise UserError(f"{self.origin}: no sentence pairs (all {rows} lines are blank)")
        self.blank = blank

    def read(self):
        """All pairs in memory: :class:`Pairs`."""
        pairs = list(self)
        return Pairs(pairs, self.blank, self.origin)


def _side(path):
    """The sentences of one side of a corpus, in order, as listed in the module docstring."""
    lines = iter_text_lines(path)
    name = os.path.basename(path)
    if name.endswith(".xml") or name.endswith(".xml.gz"):
        return (html.unescape(m.group(1)).strip() for m in map(_SEGMENT.search, lines) if m)
    if name.startswith("train.tags."):
        return (line for line in lines if not line.lstrip().startswith("<"))
    return lines


def _parallel_rows(source_path, target_path):
    """(source, target) of two line-aligned (or IWSLT) files, blank ones included."""
    sources, targets = _side(source_path), _side(target_path)
    missing = object()
    for count, (source, target) in enumerate(itertools.zip_longest(sources, targets, fillvalue=missing)):
        if source is missing or target is missing:
            counts = [count + (side is not missing) + sum(1 for _ in rest)
                      for side, rest in ((source, sources), (target, targets))]
            raise UserError(
                f"{source_path} has {counts[0]} sentences but {target_path} has {counts[1]}; "
                f"a parallel corpus needs the same number on both sides, line k translating line k"
            )
        yield source, target


def _tsv_rows(path):
    """(source, target) of a ``source<TAB>target`` file, blank lines as ("", "")."""
    for number, line in enumerate(iter_text_lines(path), 1):
        fields = line.split("\t")
        if len(fields) != 2 and line.strip():
            raise UserError(f"{path}:{number}: expected 'source<TAB>target' (one tab), "
                            f"found {len(fields) - 1} tabs")
        yield fields if len(fields) == 2 else ("", "")


def read_parallel(source_path, target_path):
    """Sentence pairs of two line-aligned (or IWSLT) files.

    Raises:
      UserError: a missing file, bad UTF-8 (file and line), or sides with
        different numbers of sentences (both counts and both paths).
    """
    return Split(source_path, target_path).read()


def read_tsv(path):
    """Sentence pairs of a ``source<TAB>target`` file.

    Raises:
      UserError: a non-blank line without exactly one tab (file and line).
    """
    return Split(path).read()


def _find(directory, patterns):
    for pattern in patterns:
        found = sorted(glob.glob(os.path.join(glob.escape(directory), pattern)))
        if found:
            return found[0]
    return None


def corpus_splits(directory, source_lang="de", target_lang="en"):
    """The splits a corpus directory holds, as ``{"train": Split, "dev": ..., "test": ...}``.

    Looks for ``SPLIT.LANG`` (or ``.gz``), ``SPLIT.tsv``, and the IWSLT names
    (``train.tags.S-T.LANG``, ``*.dev2010.S-T.LANG.xml`` as dev,
    ``*.tst2013.S-T.LANG.xml`` as test, the original's choice; ``T-S`` too, so
    that the de-en download also trains en->de).
    ``directory`` may also be the name of an embedded corpus (:data:`EMBEDDED`).

    Raises:
      UserError: no such directory, or no training split in it (says what was looked for).
    """
    directory = EMBEDDED.get(directory, directory)
    if not os.path.isdir(directory):
        raise UserError(f"--data {directory}: not a directory nor an embedded corpus "
                        f"({', '.join(EMBEDDED)})")
    pair = f"{source_lang}-{target_lang}"
    iwslt = {"train": "train.tags.{pair}.{lang}", "dev": "*.dev2010.{pair}.{lang}.xml",
             "test": "*.tst2013.{pair}.{lang}.xml"}
    splits = {}
    for split in SPLITS:
        sides = [_find(directory, [f"{split}.{lang}", f"{split}.{lang}.gz"] +
                       [iwslt[split].format(pair=p, lang=lang) for p in (pair, f"{target_lang}-{source_lang}")])
                 for lang in (source_lang, target_lang)]
        tsv = _find(directory, [f"{split}.tsv", f"{split}.tsv.gz"])
        if all(sides):
            splits[split] = Split(*sides)
        elif tsv:
            splits[split] = Split(tsv)
    if "train" not in splits:
        raise UserError(
            f"--data {directory}: no training split; expected train.{source_lang} and "
            f"train.{target_lang} (optionally .gz), train.tsv, or IWSLT's train.tags.{pair}.{source_lang}/"
            f".{target_lang} (languages are set by --source-lang/--target-lang)")
    return splits

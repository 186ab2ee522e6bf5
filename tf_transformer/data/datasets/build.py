"""Building the corpus: every chosen source's documents to ``OUT/{train,dev,test}.{de,en}``.

The steps, in order:

1. collect each source's documents (downloads happen here, through the cache);
2. normalise each pair, split paragraph pairs into sentence pairs and drop
   the pairs a cleaning filter rejects (:mod:`.cleaning`);
3. drop exact duplicate pairs across all sources (the first copy stays);
4. split by document: documents are ordered by a seeded hash of their id and
   dev, then test, take documents until each holds its size (at most 5% of
   the pairs each); the rest is train. No document is in two splits;
5. drop dev and test pairs whose German side occurs in train (and test pairs
   whose German side occurs in dev): leakage;
6. write the six files and ``SOURCES.md`` into a temporary folder inside OUT
   and rename them into place once all are complete.

Nothing is written before every source is collected, so a failed download
leaves the previous corpus (or none). The output depends only on the sources'
text and the options: a rebuild from the same cache is byte-identical.
"""

import collections
import dataclasses
import hashlib
import os
import shutil
import tempfile
import time
import urllib.parse

from tf_transformer.data.datasets import cleaning
from tf_transformer.data.datasets.debian import DebianCache, DownloadError
from tf_transformer.data.datasets.sources import BUILT_ON_FIRST_USE, SOURCES, load_source, source_names

CORPUS = BUILT_ON_FIRST_USE
SPLITS = ("train", "dev", "test")
LANGUAGES = ("de", "en")
COMPLETE_MARKER = "SOURCES.md"
DEV_SIZE = 2000
TEST_SIZE = 2000
MAX_HELDOUT_FRACTION = 0.05
SEED = 1


@dataclasses.dataclass
class SourceCounts:
    """What happened to one source's text, step by step."""

    documents: int = 0
    segments: int = 0
    sentences: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    duplicates: int = 0
    kept: int = 0
    leaked: int = 0
    split: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def row(self):
        """The counts in the order of :data:`COLUMNS`."""
        return ([self.documents, self.segments, self.sentences]
                + [self.dropped[r] for r in cleaning.REASONS]
                + [self.duplicates, self.kept, self.leaked] + [self.split[s] for s in SPLITS])


COLUMNS = (("source", "documents", "segments", "sentences") + cleaning.REASONS
           + ("duplicates", "kept", "leaked") + SPLITS)


@dataclasses.dataclass
class Document:
    """One document of a source, with its cleaned pairs."""

    source: str
    id: str
    pairs: list


@dataclasses.dataclass
class Corpus:
    """A built corpus: ``splits[name]`` is a list of (German, English) pairs."""

    splits: dict
    counts: dict  # source name -> SourceCounts
    licenses: dict  # source name -> license of its text
    provenance: dict  # source name -> lines naming the archive files used


def collect(module, cache, log):
    """``module``'s documents as ``{document_id: raw pairs}`` (a repeated id extends its
    document); a DownloadError names the source."""
    documents = {}
    try:
        for document_id, pairs in module.documents(cache, log):
            documents.setdefault(document_id, []).extend(pairs)
    except DownloadError as e:
        raise DownloadError(f"source {module.NAME}: {e}") from None
    return documents


def clean(source, raw_documents, counts):
    """The :class:`Document` list of one source's raw documents: pairs normalised,
    split into sentences and filtered; ``counts`` records each step."""
    documents = []
    for document_id, raw_pairs in raw_documents.items():
        counts.documents += 1
        counts.segments += len(raw_pairs)
        kept = []
        for german, english in raw_pairs:
            for pair in cleaning.split_pair(cleaning.normalize(german), cleaning.normalize(english)):
                counts.sentences += 1
                reason = cleaning.rejection(*pair)
                if reason:
                    counts.dropped[reason] += 1
                else:
                    kept.append(pair)
        documents.append(Document(source, document_id, kept))
    return documents


def remove_duplicates(documents, counts):
    """Drops every pair already seen in an earlier document (or earlier in its own)."""
    seen = set()
    for document in documents:
        unique = []
        for pair in document.pairs:
            if pair in seen:
                counts[document.source].duplicates += 1
            else:
                seen.add(pair)
                unique.append(pair)
        document.pairs = unique
        counts[document.source].kept += len(unique)


def _hash_key(document_id, seed):
    """A document's place in the seeded split order: stable across runs and machines."""
    return hashlib.sha256(f"{seed}:{document_id}".encode("utf-8")).hexdigest()


def assign_splits(documents, dev_size, test_size, seed):
    """``{document_id: split}``: in seeded-hash order, dev takes documents until it holds
    ``dev_size`` pairs, then test until ``test_size``, each at most
    :data:`MAX_HELDOUT_FRACTION` of all pairs; train takes the rest."""
    total = sum(len(d.pairs) for d in documents)
    limit = int(total * MAX_HELDOUT_FRACTION)
    targets = [("dev", min(dev_size, limit)), ("test", min(test_size, limit))]
    assignment, filled = {}, collections.Counter()
    for document in sorted(documents, key=lambda d: _hash_key(d.id, seed)):
        split = next((name for name, target in targets if filled[name] < target), "train")
        assignment[document.id] = split
        filled[split] += len(document.pairs)
    return assignment


def split_pairs(documents, assignment, counts):
    """``{split: [(German, English), ...]}`` in document order, without dev/test pairs whose
    German side occurs in train (or, for test, in dev)."""
    tagged = {name: [] for name in SPLITS}  # split -> [(pair, source)]
    for document in documents:
        tagged[assignment[document.id]].extend((pair, document.source) for pair in document.pairs)
    earlier_german = {pair[0] for pair, _ in tagged["train"]}
    for name in ("dev", "test"):
        kept = []
        for pair, source in tagged[name]:
            if pair[0] in earlier_german:
                counts[source].leaked += 1
            else:
                kept.append((pair, source))
        tagged[name] = kept
        earlier_german.update(pair[0] for pair, _ in kept)
    for name, items in tagged.items():
        for _, source in items:
            counts[source].split[name] += 1
    return {name: [pair for pair, _ in items] for name, items in tagged.items()}


def package_versions(module, cache):
    """Lines naming each Debian package ``module`` used, with the version from its .deb name."""
    lines = []
    for package in module.PACKAGES:
        deb = os.path.basename(cache.deb(package))
        version = urllib.parse.unquote(deb.split("_")[1]) if deb.count("_") >= 2 else "?"
        lines.append(f"Debian package `{package}` {version} (`{deb}`)")
    return lines


def build_corpus(names, cache, dev_size=DEV_SIZE, test_size=TEST_SIZE, seed=SEED, log=print):
    """The :class:`Corpus` of the sources called ``names`` (built in the order of
    :data:`SOURCES`), downloading through ``cache`` (a :class:`DebianCache`). Writes nothing."""
    modules = [load_source(name) for name in source_names(names)]  # fails before any download
    counts = {module.NAME: SourceCounts() for module in modules}
    documents, provenance = [], {}
    for module in modules:
        started = time.monotonic()
        with cache.fetching(module.NAME, module.PACKAGES):
            raw = collect(module, cache, log)
        documents.extend(clean(module.NAME, raw, counts[module.NAME]))
        describe = getattr(module, "provenance", None)
        provenance[module.NAME] = describe(cache) if describe else package_versions(module, cache)
        log(f"{module.NAME}: {len(raw)} documents collected and cleaned in {time.monotonic() - started:.1f} s")
    remove_duplicates(documents, counts)
    documents = [d for d in documents if d.pairs]
    assignment = assign_splits(documents, dev_size, test_size, seed)
    licenses = {module.NAME: module.LICENSE for module in modules}
    return Corpus(split_pairs(documents, assignment, counts), counts, licenses, provenance)


def format_table(corpus):
    """The per-source counts as a Markdown table, with a total row."""
    rows = [[name] + counts.row() for name, counts in corpus.counts.items()]
    if len(rows) > 1:
        rows.append(["total"] + [sum(column) for column in zip(*(row[1:] for row in rows))])
    cells = [list(COLUMNS)] + [[str(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(COLUMNS))]

    def line(row):
        return "| " + " | ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                                 for i, (cell, w) in enumerate(zip(row, widths))) + " |"

    rule = "|" + "|".join("-" * (w + 1) + ":" if i else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(cells[0]), rule] + [line(row) for row in cells[1:]])


def sources_markdown(corpus, options):
    """The text of ``SOURCES.md``: how the corpus was built, its counts, and per source
    the archive files used and the license."""
    sizes = ", ".join(f"{name} {len(corpus.splits[name])}" for name in SPLITS)
    parts = [f"# {CORPUS}: German-English pairs from Debian's package archive", "",
             f"Built with `python -m tf_transformer.cli.datasets build {CORPUS} {options}`.", "",
             f"Pairs: {sizes}. Files `SPLIT.de` and `SPLIT.en` are line-aligned UTF-8, one segment a line.", "",
             "Counts per source (pairs; `segments` as the source aligned them, `sentences` after sentence "
             "splitting, then the drops per reason, duplicates, and dev/test pairs whose German side "
             "occurs in an earlier split, `leaked`):", "",
             format_table(corpus), ""]
    for name in corpus.counts:
        parts += [f"## {name}", "", f"License: {corpus.licenses[name]}", ""]
        parts += [f"- {line}" for line in corpus.provenance[name]] + [""]
    return "\n".join(parts)


def write_corpus(out_dir, corpus, sources_text):
    """Writes ``OUT/{train,dev,test}.{de,en}`` and ``OUT/SOURCES.md``: all into a temporary
    folder in ``out_dir`` first, renamed into place only once every file is complete."""
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mkdtemp(dir=out_dir, prefix=".build-")
    try:
        files = {f"{name}.{language}": "".join(pair[side] + "\n" for pair in corpus.splits[name])
                 for name in SPLITS for side, language in enumerate(LANGUAGES)}
        files[COMPLETE_MARKER] = sources_text  # renamed into place last: its presence means a complete corpus
        for filename, text in files.items():
            with open(os.path.join(tmp, filename), "w", encoding="utf-8", newline="\n") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        marker = os.path.join(out_dir, COMPLETE_MARKER)
        if os.path.exists(marker):  # a rebuild cut short must not look complete with old and new files mixed
            os.remove(marker)
        for filename in files:
            os.replace(os.path.join(tmp, filename), os.path.join(out_dir, filename))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_complete(out_dir):
    """Whether ``out_dir`` holds a corpus that :func:`write_corpus` finished (every split's files
    and, renamed into place after them, ``SOURCES.md``)."""
    names = [f"{name}.{language}" for name in SPLITS for language in LANGUAGES] + [COMPLETE_MARKER]
    return all(os.path.isfile(os.path.join(out_dir, name)) for name in names)


def build(out_dir, sources=SOURCES, cache_dir=None, dev_size=DEV_SIZE, test_size=TEST_SIZE,
          seed=SEED, log=print):
    """Builds the corpus of ``sources`` (names from :data:`SOURCES`, built in that order)
    into ``out_dir``, downloading into ``cache_dir`` (default ``out_dir/cache``).
    Prints the per-source table and returns the :class:`Corpus`.

    Raises:
      UserError: an unknown or unavailable source; DownloadError (a UserError)
        naming the source and the package or index that could not be fetched.
    """
    names = source_names(sources)
    cache = DebianCache(cache_dir or os.path.join(out_dir, "cache"), log)
    corpus = build_corpus(names, cache, dev_size, test_size, seed, log)
    options = f"--sources {','.join(names)} --dev-size {dev_size} --test-size {test_size} --seed {seed}"
    write_corpus(out_dir, corpus, sources_markdown(corpus, options))
    log(format_table(corpus))
    log("wrote " + ", ".join(f"{name} {len(corpus.splits[name])} pairs" for name in SPLITS)
        + f" to {out_dir}")
    return corpus

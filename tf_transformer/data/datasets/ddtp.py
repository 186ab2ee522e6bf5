"""Debian package descriptions and their German translations (the DDTP).

The apt indexes ``Translation-de`` and ``Translation-en`` hold one record per
package: ``Package:``, ``Description-md5:`` and ``Description-de:`` or
``Description-en:``. A description's first line is the short summary; the
long part follows as lines starting with one space, ``" ."`` separating
paragraphs. A German record translates the English record with the same
``Description-md5`` (the md5 of the English text).

Alignment of one matched German/English record:

* summary with summary, always;
* paragraph k with paragraph k when both sides hold as many paragraphs;
  when they do not, the long description is left out (its paragraphs cannot
  be paired safely) and only the summary pair is kept;
* inside a paragraph, each bullet-list item (a line starting with ``*``, ``-``,
  ``+``, ``o`` or ``•``, with its indented continuation lines) is a block of
  its own, and so is the text around the list; block k is paired with block k
  when both paragraphs hold as many blocks, else the paragraphs are paired
  whole.

German records whose text equals the English (untranslated copies) are
skipped. All records of a package form one document, ``ddtp:<package>``.
"""

import os
import re

NAME = "ddtp"
LICENSE = "free, per package (the DDTP translations are under the licence of each package's description)"
PACKAGES = ()  # the text comes from the apt indexes, not from packages

_RELEASE_OF_INDEX = re.compile(r"(.*_dists_[^_]+)_.*")
_BULLET = re.compile(r"( *)[*+o•-] +(\S.*)")


def records(text):
    """The records of a Debian control-style index, as dicts of field -> value.

    A field's continuation lines are kept, each after a newline, with their
    leading space.
    """
    record, field = {}, None
    for line in text.split("\n"):
        if not line.strip():
            if record:
                yield record
            record, field = {}, None
        elif line[0] in " \t":
            if field is not None:
                record[field] += "\n" + line
        else:
            field, _, value = line.partition(":")
            record[field] = value.strip()
    if record:
        yield record


def _blocks(lines):
    """The blocks of one paragraph's lines (without the leading space): the
    text around a bullet list, and each item of it with its continuation lines."""
    blocks, item_indent = [], None
    for line in lines:
        bullet = _BULLET.fullmatch(line)
        indent = len(line) - len(line.lstrip(" "))
        if bullet:
            blocks.append([bullet.group(2)])
            item_indent = len(bullet.group(1))
        elif blocks and (item_indent is None or indent > item_indent):
            blocks[-1].append(line.strip())
        else:
            blocks.append([line.strip()])
            item_indent = None
    return [" ".join(" ".join(block).split()) for block in blocks]


def parse_description(description):
    """``(summary, paragraphs)`` of a description field, each paragraph a list of blocks."""
    summary, *long_lines = description.split("\n")
    paragraphs, current = [], []
    for line in long_lines:
        line = line[1:]  # the space that marks a continuation line
        if line.strip() == ".":
            paragraphs.append(current)
            current = []
        else:
            current.append(line)
    paragraphs.append(current)
    return " ".join(summary.split()), [_blocks(p) for p in paragraphs if any(l.strip() for l in p)]


def align(german, english):
    """(German, English) pairs of two parsed descriptions (see the module notes), and
    whether the long descriptions could be paired."""
    (german_summary, german_paragraphs), (english_summary, english_paragraphs) = german, english
    pairs = [(german_summary, english_summary)]
    if len(german_paragraphs) != len(english_paragraphs):
        return pairs, False
    for de, en in zip(german_paragraphs, english_paragraphs):
        if len(de) == len(en):
            pairs.extend(zip(de, en))
        else:
            pairs.append((" ".join(de), " ".join(en)))
    return [(de, en) for de, en in pairs if de and en], True


def english_descriptions(texts):
    """Description-md5 -> English description of every record in the ``Translation-en`` texts."""
    found = {}
    for text in texts:
        for record in records(text):
            if "Description-md5" in record and "Description-en" in record:
                found.setdefault(record["Description-md5"], record["Description-en"])
    return found


def match(german_texts, english, log=print):
    """Documents ``(ddtp:<package>, pairs)`` for the ``Translation-de`` texts' records
    whose Description-md5 is in ``english`` (md5 -> English description), in index order."""
    documents = {}
    counts = dict(records=0, unmatched=0, untranslated=0, summary_only=0)
    for text in german_texts:
        for record in records(text):
            if "Description-de" not in record or "Package" not in record:
                continue
            counts["records"] += 1
            english_text = english.get(record.get("Description-md5"))
            if english_text is None:
                counts["unmatched"] += 1
            elif record["Description-de"].split() == english_text.split():
                counts["untranslated"] += 1
            else:
                pairs, whole = align(parse_description(record["Description-de"]), parse_description(english_text))
                counts["summary_only"] += not whole
                documents.setdefault(f"{NAME}:{record['Package']}", []).extend(pairs)
    log(f"ddtp: {counts['records']} German records; {counts['unmatched']} without an English record of "
        f"the same Description-md5, {counts['untranslated']} untranslated copies (skipped), "
        f"{counts['summary_only']} with different paragraph counts (summary only)")
    return list(documents.items())


def documents(cache, log):
    """Yields ``(ddtp:<package>, [(german, english), ...])`` for every package with a
    German description, from the indexes the cache fetches."""
    english = english_descriptions(cache.read_index(p) for p in cache.translation_indexes("en"))
    german_texts = [cache.read_index(p) for p in cache.translation_indexes("de")]
    yield from match(german_texts, english, log)


def provenance(cache):
    """Lines naming the indexes used, each with the version and date of its Release file."""
    lines = []
    for language in ("de", "en"):
        for path in cache.translation_indexes(language):
            release = _release_fields(_RELEASE_OF_INDEX.sub(r"\1_InRelease", path))
            about = ", ".join(f"{key} {release[key]}" for key in ("Version", "Date") if key in release)
            lines.append(f"apt index `{os.path.basename(path)}`" + (f" (Release {about})" if about else ""))
    return lines


def _release_fields(path):
    """The Version and Date fields of a Release file, as far as it has them (none when missing)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except FileNotFoundError:
        return {}
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key in ("Version", "Date"):
            fields.setdefault(key, value.strip())
    return fields

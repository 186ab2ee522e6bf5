"""The example sentences of the Ding German-English dictionary (Debian package ``trans-de-en``).

The dictionary ``/usr/share/trans/de-en`` has one entry per line,
``German :: English``; ``#`` lines are comments. Each side holds sub-entries
separated by `` | `` in the same order on both sides, and each sub-entry holds
synonyms separated by ``;``. Sub-entry k of the German side translates
sub-entry k of the English side.

What this module keeps, and why:

* Annotations are removed from a sub-entry before anything else: grammar
  ``{f}`` ``{vt}``, labels ``[Br.]`` ``[ugs.]``, glosses and optional words
  ``(...)`` (nested too; "Es tut mir (schrecklich) leid." becomes "Es tut mir
  leid." on both sides), search keys ``<...>`` and chat acronyms ``/TGIF/``.
* Synonyms are paired k with k when both sides have as many, else only the
  first with the first (every synonym of a sentence translates every synonym
  of the other side, so the first pair is always a right one).
* A pair is kept only when both sides are whole sentences: the first letter
  is upper case and the text ends in ``.``, ``!`` or ``?`` (closing quotes
  allowed). This leaves out the dictionary phrases ("etw. pelletieren",
  "to pellet sth.").
* Pairs are left out when a side holds an alternative with a slash
  ("Fingern/Knöcheln", "held / owned"; which words an alternative spans
  is not marked, so no single reading can be recovered), a gap ``…``
  (templates) or a dictionary placeholder (``jdm.``, ``etw.``, ``sb.``, ``sth.``).

A document is a headword, the first synonym of an entry's first German
sub-entry: ``ding:<headword>``; entries with the same headword form one
document.
"""

import os
import re

from tf_transformer.data.datasets.cleaning import CLOSERS, OPENERS
from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines

NAME = "ding"
LICENSE = "GPL-2+"
PACKAGES = ("trans-de-en",)
DICTIONARY = "usr/share/trans/de-en"

_ANNOTATION = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]|<[^<>]*>|/[A-Z0-9]{2,}/")
_INNERMOST_PARENTHESES = re.compile(r"\([^()]*\)")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([.,!?;:])")
_SLASH_ALTERNATIVE = re.compile(r"[^\W\d_]\s*/|/\s*[^\W\d_]|\s/\s")
_PLACEHOLDER_WORD = re.compile(r"(?<!\w)(?:etw|jd|jdm|jdn|jds|sb|sth)\.", re.IGNORECASE)


def strip_annotations(text):
    """``text`` without Ding's annotations ({...}, [...], <...>, /ACRONYM/, (...)),
    whitespace collapsed and no space before punctuation."""
    text = _ANNOTATION.sub(" ", text)
    while True:
        stripped = _INNERMOST_PARENTHESES.sub(" ", text)
        if stripped == text:
            break
        text = stripped
    text = " ".join(text.split())
    return _SPACE_BEFORE_PUNCTUATION.sub(r"\1", text)


def is_sentence(text):
    """Whether an annotation-free synonym is a whole sentence (see the module notes)."""
    body = text.lstrip(OPENERS)
    return bool(body) and body[0].isupper() and text.rstrip(CLOSERS)[-1:] in (".", "!", "?")


def _is_plain(text):
    """Whether a sentence is free of alternatives, gaps and dictionary placeholders."""
    return not (_SLASH_ALTERNATIVE.search(text) or "…" in text or "..." in text
                or _PLACEHOLDER_WORD.search(text))


def synonyms(sub_entry):
    """The annotation-free, non-empty synonyms of one sub-entry, in order."""
    return [s.strip() for s in strip_annotations(sub_entry).split(";") if s.strip()]


def sentence_pairs(german_sub_entry, english_sub_entry):
    """The (German, English) example sentences of one pair of sub-entries (see the module notes)."""
    german, english = synonyms(german_sub_entry), synonyms(english_sub_entry)
    if not german or not english:
        return []
    paired = zip(german, english) if len(german) == len(english) else [(german[0], english[0])]
    return [(de, en) for de, en in paired
            if is_sentence(de) and is_sentence(en) and _is_plain(de) and _is_plain(en)]


def headword(german_side):
    """An entry's headword: the first synonym of its first German sub-entry."""
    first = german_side.split(" | ", 1)[0]
    found = synonyms(first)
    return found[0] if found else " ".join(first.split())


def parse(lines, path="de-en", log=print):
    """Documents ``(ding:<headword>, pairs)`` of the dictionary's ``lines``, in file order,
    only those holding at least one example sentence. Entries whose sides hold
    different numbers of sub-entries cannot be paired; they are counted in a
    ``log`` line (the real dictionary has none).

    Raises:
      UserError: a line that is neither a comment nor ``German :: English``
        (the message names ``path`` and the line).
    """
    documents, unpaired = {}, 0
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        german, separator, english = line.partition(" :: ")
        if not separator:
            raise UserError(f"{path}:{number}: expected 'German :: English', got {line[:60]!r}")
        german_subs, english_subs = german.split(" | "), english.split(" | ")
        if len(german_subs) != len(english_subs):
            unpaired += 1
            continue
        pairs = [pair for de, en in zip(german_subs, english_subs) for pair in sentence_pairs(de, en)]
        if pairs:
            documents.setdefault(f"{NAME}:{headword(german)}", []).extend(pairs)
    if unpaired:
        log(f"ding: {path}: skipped {unpaired} entries whose sides hold different numbers of sub-entries")
    return list(documents.items())


def documents(cache, log):
    """Yields ``(ding:<headword>, [(german, english), ...])`` for every headword with example sentences."""
    path = os.path.join(cache.package_tree(PACKAGES[0]), DICTIONARY)
    found = parse(read_text_lines(path), path, log)
    log(f"ding: {sum(len(p) for _, p in found)} example sentences under {len(found)} headwords")
    yield from found

"""Sentence splitting and the cleaning filters applied to every source's pairs.

The filters are those that worked on this data (see the reference notes on data
sources): each side holds 3 to 80 words, the character-length ratio
German/English lies in 0.5..2.2, the German differs from the English (else it
is an untranslated copy), and neither side holds a printf, ICU or HTML
placeholder. Each filter returns the reason it rejects a pair, or ``None``, so
the builder can count drops per reason.
"""

import re
import unicodedata

MIN_WORDS = 3
MAX_WORDS = 80
MIN_RATIO = 0.5
MAX_RATIO = 2.2

_PLACEHOLDER = re.compile(
    r"%(?:\d+\$)?[-+0#]*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t)?[diouxXeEfFgGaAcspn](?![^\W\d_])"  # %s %1$s %-5.2f
    r"|%\(\w+\)[-+0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrs]"  # %(name)s
    r"|%%|%\d+\b|%[A-Z][A-Z_]+\b"                      # %% %1 %PRODUCTNAME
    r"|\{\s*[\w.-]*\s*(?:,[^{}]*)?\}"                  # {0} {name} {n, number}
    r"|\{\s*\w+\s*,\s*(?:plural|select|selectordinal)\b"  # {n, plural, one {...} other {...}}
    r"|</?[A-Za-z][\w:-]*(?:\s[^<>]*)?/?>"             # <b> </b> <br/> <a href="...">
    r"|&(?:[A-Za-z][A-Za-z0-9]*|#\d+|#[xX][0-9A-Fa-f]+);")  # &amp; &#160;

# Words that end in a full stop without ending a sentence (compared lower-cased,
# without the final stop). Single letters and words with an inner stop
# ("z.B.", "e.g.") and numbers ("am 5. März") are never sentence ends either.
_ABBREVIATIONS = frozenset("""
    abb abs allg bd bspw bzw ca dr dt engl einschl entspr etw evtl geb gest ggf ggü
    hr fr inkl insb jdm jdn jds jh max min mio mrd nr prof sog st str tel usw vgl zzgl
    jan feb mär apr jun jul aug sep sept okt oct nov dez dec
    approx cf co corp dept esp est etc fig inc incl jr ltd mr mrs ms no resp sb sr sth vol vs
""".split())

# Quotes and brackets that may open a sentence or close one after its final stop.
OPENERS = "\"'„“‚‘»«(["
CLOSERS = "\"'»«“”‘’)]"
_CANDIDATE_END = re.compile(f"[.!?]+[{re.escape(CLOSERS)}]*\\s+")


def normalize(text):
    """``text`` in Unicode NFC with every whitespace run turned into one space,
    control and format characters (soft hyphens, zero-width spaces) removed,
    and no leading or trailing space."""
    text = unicodedata.normalize("NFC", text)
    text = "".join(" " if ch.isspace() else ch for ch in text
                   if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf"))
    return " ".join(text.split())


def _ends_sentence(text, stop, after):
    """Whether the punctuation run at ``text[stop:after]`` ends a sentence."""
    following = text[after:].lstrip(OPENERS)
    if not following or not following[0].isupper():
        return False
    run = text[stop:after].rstrip().rstrip(CLOSERS)
    if run != ".":
        return "!" in run or "?" in run  # an ellipsis "..." stays inside its sentence
    word = text[:stop].rsplit(" ", 1)[-1].lstrip(OPENERS)
    return not (len(word) <= 1 or "." in word or word.isdigit()
                or word.lower() in _ABBREVIATIONS)


def split_sentences(text):
    """The sentences of one normalised paragraph, in order.

    A sentence ends at ``.``, ``!`` or ``?`` (closing quotes and brackets
    included) followed by a space and an upper-case letter, except after an
    abbreviation, a single letter, a number or an ellipsis.

    Example:
      >>> split_sentences("Das geht z. B. so. Am 5. März nicht!")
      ['Das geht z. B. so.', 'Am 5. März nicht!']
    """
    sentences, start = [], 0
    for match in _CANDIDATE_END.finditer(text):
        if _ends_sentence(text, match.start(), match.end()):
            sentences.append(text[start:match.end()].strip())
            start = match.end()
    sentences.append(text[start:].strip())
    return [s for s in sentences if s]


def split_pair(german, english):
    """Sentence pairs of one aligned paragraph pair: sentence k with sentence k
    when both sides hold the same number of sentences, else the pair whole."""
    german_sentences, english_sentences = split_sentences(german), split_sentences(english)
    if len(german_sentences) == len(english_sentences):
        return list(zip(german_sentences, english_sentences))
    return [(german, english)]


def untranslated(german, english):
    """The German is the English text (ignoring case): an untranslated copy."""
    return "untranslated" if german.casefold() == english.casefold() else None


def placeholder(german, english):
    """Either side holds a printf, ICU or HTML placeholder (``%s``, ``{0}``, ``<b>``, ``&amp;``)."""
    return "placeholder" if _PLACEHOLDER.search(german) or _PLACEHOLDER.search(english) else None


def too_short(german, english):
    """Either side has fewer than :data:`MIN_WORDS` words."""
    return "too short" if min(len(german.split()), len(english.split())) < MIN_WORDS else None


def too_long(german, english):
    """Either side has more than :data:`MAX_WORDS` words."""
    return "too long" if max(len(german.split()), len(english.split())) > MAX_WORDS else None


def length_ratio(german, english):
    """German characters / English characters lies outside MIN_RATIO..MAX_RATIO."""
    ratio = len(german) / max(len(english), 1)
    return None if MIN_RATIO <= ratio <= MAX_RATIO else "length ratio"


# In the order they are tried: a pair's drop is counted under the first that rejects it.
FILTERS = (untranslated, placeholder, too_short, too_long, length_ratio)
REASONS = ("untranslated", "placeholder", "too short", "too long", "length ratio")


def rejection(german, english):
    """The reason the first filter rejecting the normalised pair gives, or ``None`` to keep it."""
    for check in FILTERS:
        reason = check(german, english)
        if reason:
            return reason
    return None

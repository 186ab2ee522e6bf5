"""LibreOffice help pages, German and English paragraphs paired by paragraph id.

Debian's ``libreoffice-help-de`` and ``libreoffice-help-en-us`` ship the help
rendered to HTML, one tree per language with the same files::

  usr/share/libreoffice/help/de/text/swriter/main0000.html
  usr/share/libreoffice/help/en-US/text/swriter/main0000.html

Every translatable paragraph or heading carries an id from the .xhp source
(``<p id="par_id3146060">``, ``<h2 id="hd_id3158421">``). A paragraph of a
German file is paired with the English paragraph of the same file that has the
same id; when an id occurs more than once in a file (pages that embed the same
snippet several times), its k-th German occurrence pairs with its k-th English
one. Document ids are ``libreoffice:<file relative to the language folder>``.

What is kept of a paragraph is its visible text: markup is dropped, the text
of links, emphasis, menu items and the like is kept, and of a platform or
module switch (``<span class="switchinline">``) only the default case stays,
the others (``<span hidden ...>`` for MAC, WRITER, ...) are left out.
Left out entirely: paragraphs without an id (embedded snippets, page furniture),
the debug footer, paragraphs whose class names code (``code``,
``codeintable``, ``smathcode``, ...), and paragraphs with no letter in them
(numbers, symbols, empty).
"""

import html.parser
import os

from tf_transformer.errors import UserError

NAME = "libreoffice"
LICENSE = "MPL-2.0"
PACKAGES = ("libreoffice-help-de", "libreoffice-help-en-us")

_HELP = os.path.join("usr", "share", "libreoffice", "help")
_LANGUAGE_FOLDERS = {"libreoffice-help-de": "de", "libreoffice-help-en-us": "en-US"}
_PARAGRAPH_TAGS = {"p", "h", "h1", "h2", "h3", "h4", "h5", "h6"}


class _ParagraphParser(html.parser.HTMLParser):
    """Collects ``(id, visible text)`` of every paragraph and heading that has an id."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs = []
        self._in_footer = False
        self._open = None        # (tag, id, text parts, is code) of the paragraph being read
        self._spans = []         # for each open <span> in it: whether it hides its text

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "footer":
            self._in_footer = True
        elif self._open is None:
            if tag in _PARAGRAPH_TAGS and attrs.get("id") and not self._in_footer:
                is_code = "code" in (attrs.get("class") or "")
                self._open = (tag, attrs["id"], [], is_code)
                self._spans = []
        elif tag == "span":
            self._spans.append("hidden" in attrs and not (attrs.get("id") or "").startswith("default"))
        elif tag == "br":
            self._open[2].append(" ")

    def handle_endtag(self, tag):
        if tag == "footer":
            self._in_footer = False
        elif self._open is None:
            return
        elif tag == "span" and self._spans:
            self._spans.pop()
        elif tag == self._open[0]:
            _, paragraph_id, parts, is_code = self._open
            self._open = None
            text = " ".join("".join(parts).split())
            if not is_code and any(c.isalpha() for c in text):
                self.paragraphs.append((paragraph_id, text))

    def handle_data(self, data):
        if self._open is not None and not any(self._spans):
            self._open[2].append(data)


def paragraphs(page_html):
    """``{(id, k): text}`` for the k-th (from 0) paragraph with that id in a help page."""
    parser = _ParagraphParser()
    parser.feed(page_html)
    parser.close()
    found, seen = {}, {}
    for paragraph_id, text in parser.paragraphs:
        k = seen.get(paragraph_id, 0)
        seen[paragraph_id] = k + 1
        found[(paragraph_id, k)] = text
    return found


def pair_paragraphs(german_html, english_html):
    """``[(german, english), ...]`` for the paragraph ids present in both pages, in German order."""
    english = paragraphs(english_html)
    return [(text, english[key]) for key, text in paragraphs(german_html).items() if key in english]


def _language_root(cache, package):
    """The help folder of one language inside ``package``'s unpacked tree."""
    root = os.path.join(cache.package_tree(package), _HELP, _LANGUAGE_FOLDERS[package])
    if not os.path.isdir(root):
        raise UserError(f"package {package} has no help folder {_HELP}/{_LANGUAGE_FOLDERS[package]}; "
                        f"expected the HTML help of LibreOffice 7.x")
    return root


def _html_files(root):
    """Paths of the .html files under ``root``, relative to it, sorted."""
    found = []
    for folder, _, names in os.walk(root):
        found.extend(os.path.relpath(os.path.join(folder, name), root)
                     for name in names if name.endswith(".html"))
    return sorted(found)


def _read(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def documents(cache, log):
    """Yields ``(document_id, [(german, english), ...])`` for every help page present in both
    languages that has at least one pair."""
    german_root, english_root = (_language_root(cache, package) for package in PACKAGES)
    files = _html_files(german_root)
    log(f"libreoffice: {len(files)} German help pages")
    for relative in files:
        english_path = os.path.join(english_root, relative)
        if not os.path.isfile(english_path):
            continue
        pairs = pair_paragraphs(_read(os.path.join(german_root, relative)), _read(english_path))
        if pairs:
            yield f"{NAME}:{relative.replace(os.sep, '/')}", pairs

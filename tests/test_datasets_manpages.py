"""German man pages: rendering, paragraph splitting, length-based alignment, page lookup."""

import gzip
import os
import shutil

import pytest

from tf_transformer.data.datasets import manpages

needs_groff = pytest.mark.skipif(shutil.which("groff") is None,
                                 reason="groff is not installed (apt-get install groff-base)")

GERMAN_ROFF = r""".\" -*- coding: UTF-8 -*-
.TH DEMO 1 "Mai 2024" "demo 1.0" "Benutzerbefehle"
.SH BEZEICHNUNG
demo \- kopiert Dateien
.SH BESCHREIBUNG
.B demo
kopiert Dateien von einer Quelle zu einem Ziel, wobei außerordentlich
lange Zeilen niemals getrennt werden.
.TP
\fB\-v\fR, \fB\-\-verbose\fR
Gibt ausführliche Meldungen aus.
.SH ÜBERSETZUNG
Die deutsche Übersetzung dieser Handbuchseite wurde von einem Übersetzer erstellt.
"""

ENGLISH_ROFF = r""".TH DEMO 1 "May 2024" "demo 1.0" "User Commands"
.SH NAME
demo \- copies files
.SH DESCRIPTION
.B demo
copies files from a source to a destination, never
hyphenating extraordinarily long lines.
.TP
\fB\-v\fR, \fB\-\-verbose\fR
Prints verbose messages.
"""

GERMAN_PARAGRAPHS = [
    "BEZEICHNUNG",
    "demo - kopiert Dateien",
    "BESCHREIBUNG",
    "demo kopiert Dateien von einer Quelle zu einem Ziel, wobei außerordentlich lange Zeilen "
    "niemals getrennt werden.",
    "-v, --verbose",
    "Gibt ausführliche Meldungen aus.",
    "ÜBERSETZUNG",
    "Die deutsche Übersetzung dieser Handbuchseite wurde von einem Übersetzer erstellt.",
]

ALIGNED = [
    ("BEZEICHNUNG", "NAME"),
    ("demo - kopiert Dateien", "demo - copies files"),
    ("BESCHREIBUNG", "DESCRIPTION"),
    ("demo kopiert Dateien von einer Quelle zu einem Ziel, wobei außerordentlich lange Zeilen "
     "niemals getrennt werden.",
     "demo copies files from a source to a destination, never hyphenating extraordinarily long lines."),
    ("-v, --verbose", "-v, --verbose"),
    ("Gibt ausführliche Meldungen aus.", "Prints verbose messages."),
]


def test_align_skips_an_insertion_on_each_side():
    german = [
        "BESCHREIBUNG",
        "Das Programm kopiert Dateien von einer Quelle zu einem Ziel.",
        "Dieser Absatz wurde nur in der deutschen Übersetzung ergänzt und hat im englischen "
        "Original kein Gegenstück, er muss also übersprungen werden.",
        "-v, --verbose",
        "Gibt ausführliche Meldungen aus.",
        "SIEHE AUCH",
        "cp(1), mv(1)",
    ]
    english = [
        "DESCRIPTION",
        "The program copies files from a source to a destination.",
        "-v, --verbose",
        "Prints verbose messages.",
        "This option is deprecated and will be removed in a future release of the program, "
        "so scripts should stop using it now.",
        "SEE ALSO",
        "cp(1), mv(1)",
    ]
    assert manpages.align(german, english) == [
        ("BESCHREIBUNG", "DESCRIPTION"),
        ("Das Programm kopiert Dateien von einer Quelle zu einem Ziel.",
         "The program copies files from a source to a destination."),
        ("-v, --verbose", "-v, --verbose"),
        ("Gibt ausführliche Meldungen aus.", "Prints verbose messages."),
        ("SIEHE AUCH", "SEE ALSO"),
        ("cp(1), mv(1)", "cp(1), mv(1)"),
    ]


def test_align_of_empty_sides():
    assert manpages.align([], ["only English"]) == []
    assert manpages.align(["nur Deutsch"], []) == []


def test_match_cost_is_low_when_lengths_fit():
    fitting = manpages._match_cost("Gibt ausführliche Meldungen aus.", "Prints verbose messages.")
    unfitting = manpages._match_cost("Gibt ausführliche Meldungen aus.", "x" * 300)
    assert manpages._match_cost("-v, --verbose", "-v, --verbose") == 0.0
    assert fitting < manpages._SKIP_COST < unfitting


def test_paragraphs_are_lines_without_header_and_footer():
    rendered = ("LS(1)      User Commands      LS(1)\n\n\n"
                "NAME\n       ls - list   directory contents\n\n"
                "       -a, --all\n              do not ignore entries\n\n"
                "GNU coreutils 9.1      September 2022      LS(1)\n")
    assert manpages.paragraphs(rendered) == [
        "NAME", "ls - list directory contents", "-a, --all", "do not ignore entries"]


@needs_groff
def test_render_puts_each_paragraph_on_one_line():
    assert manpages.paragraphs(manpages.render(GERMAN_ROFF)) == GERMAN_PARAGRAPHS


@needs_groff
def test_render_ignores_the_callers_locale(monkeypatch):
    monkeypatch.setenv("LC_ALL", "POSIX")
    monkeypatch.setenv("GROFF_TYPESETTER", "ascii")
    assert manpages.paragraphs(manpages.render(GERMAN_ROFF)) == GERMAN_PARAGRAPHS


class FakeCache:
    """Stands in for DebianCache: package trees are folders under ``root`` (empty unless written)."""

    def __init__(self, root):
        self.root = root

    def package_tree(self, package):
        return os.path.join(self.root, package)


def write_page(root, package, path, roff):
    full = os.path.join(root, package, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with gzip.open(full, "wt", encoding="utf-8") as f:
        f.write(roff)
    return full


def man_trees(root):
    """demo.1 in German with a .so alias and a symlink alias, a German page without an English
    one, and English demo.1 in manpages (wins) and coreutils."""
    write_page(root, "manpages-de", "usr/share/man/de/man1/demo.1.gz", GERMAN_ROFF)
    write_page(root, "manpages-de", "usr/share/man/de/man1/alias.1.gz", ".so man1/demo.1\n")
    os.symlink("demo.1.gz", os.path.join(root, "manpages-de/usr/share/man/de/man1/link.1.gz"))
    write_page(root, "manpages-de-dev", "usr/share/man/de/man3/nur.3.gz", GERMAN_ROFF)
    write_page(root, "manpages", "usr/share/man/man1/demo.1.gz", ENGLISH_ROFF)
    write_page(root, "coreutils", "usr/share/man/man1/demo.1.gz", ".TH DEMO 1\n.SH NAME\nother\n")
    return FakeCache(root)


def test_redirects_resolve_to_the_page_they_show(tmp_path):
    cache = man_trees(str(tmp_path))
    index = manpages.page_index([os.path.join(cache.package_tree(p), "usr/share/man/de")
                                 for p in manpages.GERMAN_PACKAGES])
    assert sorted(index) == ["alias.1", "demo.1", "link.1", "nur.3"]
    assert [manpages.resolve(k, index) for k in ("alias.1", "link.1", "demo.1", "gone.1")] == [
        "demo.1", "demo.1", "demo.1", None]


@needs_groff
def test_documents_align_each_german_page_once(tmp_path):
    cache = man_trees(str(tmp_path))
    assert list(manpages.documents(cache, log=lambda *a: None)) == [("manpages:demo.1", ALIGNED)]

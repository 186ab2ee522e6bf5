"""LibreOffice help: paragraphs of the German and English help pages paired by id."""

import os

import pytest

from tf_transformer.data.datasets import libreoffice
from tf_transformer.errors import UserError

GERMAN_PAGE = """<!DOCTYPE html>
<html lang="de"><head><title>AutoKorrektur</title></head><body>
<div id="DisplayArea">
<h1 id="hd_id1" dir="auto">AutoKorrektur <a href="x.html">anpassen</a></h1>
<p id="par_id2" class="paragraph">Drücken Sie <span class="switchinline"><span hidden="true"
 id="MACtext_1" class="MAC"><span class="keycode">Befehl</span></span><span hidden="true"
 id="defaulttext_1"><span class="keycode">Strg</span></span></span><span class="keycode">+F</span>,
 um die <span class="emph">Suchleiste</span>&nbsp;zu&#160;öffnen.<br>Fertig.</p>
<p id="par_id3" class="paragraph">Nur auf Deutsch vorhanden.</p>
<div class="embedded"><p class="embedded">Eingebettet, ohne Kennung.</p></div>
<p id="par_id4" class="code">Dim a As Integer</p>
<p id="par_id5" class="tablecontentintable">42</p>
<p id="par_id6">Erste Verwendung.</p>
<p id="par_id6">Zweite Verwendung.</p>
<img src="a.png" alt="Symbol">
</div>
<footer><p id="bm_module" dir="auto">Hilfe-Debug</p></footer>
</body></html>
"""

ENGLISH_PAGE = """<!DOCTYPE html>
<html lang="en-US"><head><title>AutoCorrect</title></head><body>
<div id="DisplayArea">
<h1 id="hd_id1" dir="auto">Customize <a href="x.html">AutoCorrect</a></h1>
<p id="par_id6">First use.</p>
<p id="par_id2" class="paragraph">Press <span class="switchinline"><span hidden="true"
 id="MACtext_1" class="MAC"><span class="keycode">Command</span></span><span hidden="true"
 id="defaulttext_1"><span class="keycode">Ctrl</span></span></span><span class="keycode">+F</span>
 to open the <span class="emph">Find</span> toolbar.<br>Done.</p>
<p id="par_id4" class="code">Dim a As Integer</p>
<p id="par_id5" class="tablecontentintable">42</p>
<p id="par_id7">Only in English.</p>
<p id="par_id6">Second use.</p>
</div>
<footer><p id="bm_module" dir="auto">Help debug</p></footer>
</body></html>
"""

EXPECTED_PAIRS = [
    ("AutoKorrektur anpassen", "Customize AutoCorrect"),
    ("Drücken Sie Strg+F, um die Suchleiste zu öffnen. Fertig.",
     "Press Ctrl+F to open the Find toolbar. Done."),
    ("Erste Verwendung.", "First use."),
    ("Zweite Verwendung.", "Second use."),
]


class FakeCache:
    """Stands in for DebianCache: package trees are folders under ``root``."""

    def __init__(self, root):
        self.root = root

    def package_tree(self, package):
        return os.path.join(self.root, package)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def help_trees(root, pages):
    """Writes ``{relative path: (german html or None, english html or None)}`` as the two
    help packages' trees under ``root``."""
    for relative, (german, english) in pages.items():
        for package, folder, page in (("libreoffice-help-de", "de", german),
                                      ("libreoffice-help-en-us", "en-US", english)):
            if page is not None:
                write(os.path.join(root, package, "usr/share/libreoffice/help", folder, relative), page)
    return FakeCache(root)


def test_paragraphs_are_paired_by_id_with_markup_stripped():
    assert libreoffice.pair_paragraphs(GERMAN_PAGE, ENGLISH_PAGE) == EXPECTED_PAIRS


def test_paragraphs_keys_count_repeated_ids_and_skip_code_numbers_and_footer():
    found = libreoffice.paragraphs(GERMAN_PAGE)
    assert list(found) == [("hd_id1", 0), ("par_id2", 0), ("par_id3", 0), ("par_id6", 0), ("par_id6", 1)]
    assert found[("par_id3", 0)] == "Nur auf Deutsch vorhanden."


def test_documents_pair_the_same_file_in_both_trees(tmp_path):
    empty = "<html><body><p id='par_id1'>123</p></body></html>"
    cache = help_trees(str(tmp_path), {
        "text/swriter/main0000.html": (GERMAN_PAGE, ENGLISH_PAGE),
        "text/scalc/only_german.html": (GERMAN_PAGE, None),
        "text/scalc/no_pairs.html": (empty, empty),
    })
    assert list(libreoffice.documents(cache, log=lambda *a: None)) == [
        ("libreoffice:text/swriter/main0000.html", EXPECTED_PAIRS)]


def test_missing_help_folder_is_a_user_error(tmp_path):
    os.makedirs(tmp_path / "libreoffice-help-de")
    with pytest.raises(UserError, match="no help folder"):
        list(libreoffice.documents(FakeCache(str(tmp_path)), log=lambda *a: None))

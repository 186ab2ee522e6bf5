"""Tests for ``tf_transformer.data.datasets.ddtp``: Debian package descriptions and their translations."""

from tf_transformer.data.datasets import ddtp

ENGLISH = """\
Package: editor
Description-md5: 11111111111111111111111111111111
Description-en: small text editor
 Editor is a small text editor. It starts fast.
 .
 Features:
  * syntax colouring for many
    languages;
  * spell checking.

Package: editor-doc
Description-md5: 22222222222222222222222222222222
Description-en: documentation for the small text editor
 This package contains the manual.
 .
 It is written in HTML.

Package: tool
Description-md5: 33333333333333333333333333333333
Description-en: command-line tool
 The tool does one thing well.

Package: editor
Description-md5: 44444444444444444444444444444444
Description-en: small text editor (old description)
 An older description of the editor.
"""

GERMAN = """\
Package: editor
Description-md5: 11111111111111111111111111111111
Description-de: kleiner Texteditor
 Editor ist ein kleiner Texteditor. Er startet
 schnell.
 .
 Funktionen:
  * Syntaxhervorhebung für viele
    Sprachen;
  * Rechtschreibprüfung.

Package: editor
Description-md5: 44444444444444444444444444444444
Description-de: kleiner Texteditor (alte Beschreibung)
 Eine ältere Beschreibung des Editors.

Package: editor-doc
Description-md5: 22222222222222222222222222222222
Description-de: Dokumentation für den kleinen Texteditor
 Dieses Paket enthält das Handbuch. Es ist in HTML geschrieben.

Package: tool
Description-md5: 33333333333333333333333333333333
Description-de: command-line tool
 The tool does one thing well.

Package: orphan
Description-md5: 99999999999999999999999999999999
Description-de: verwaiste Beschreibung
 Zu dieser Beschreibung gibt es keinen englischen Text.
"""


def _quiet(_):
    pass


def test_records_keep_continuation_lines():
    first = next(ddtp.records(ENGLISH))
    assert first["Package"] == "editor"
    assert first["Description-md5"] == "11111111111111111111111111111111"
    assert first["Description-en"].split("\n")[:3] == [
        "small text editor", " Editor is a small text editor. It starts fast.", " ."]


def test_parse_description_splits_paragraphs_and_bullets():
    english = ddtp.english_descriptions([ENGLISH])
    summary, paragraphs = ddtp.parse_description(english["11111111111111111111111111111111"])
    assert summary == "small text editor"
    assert paragraphs == [["Editor is a small text editor. It starts fast."],
                          ["Features:", "syntax colouring for many languages;", "spell checking."]]


def test_bullets_with_one_space_and_dashes():
    _, paragraphs = ddtp.parse_description("summary\n Tools:\n - one: does\n   this\n - two\n After the list.")
    assert paragraphs == [["Tools:", "one: does this", "two", "After the list."]]


def test_match_pairs_records_by_md5_and_paragraphs():
    messages = []
    documents = dict(ddtp.match([GERMAN], ddtp.english_descriptions([ENGLISH]), messages.append))
    assert documents["ddtp:editor"] == [
        ("kleiner Texteditor", "small text editor"),
        ("Editor ist ein kleiner Texteditor. Er startet schnell.",
         "Editor is a small text editor. It starts fast."),
        ("Funktionen:", "Features:"),
        ("Syntaxhervorhebung für viele Sprachen;", "syntax colouring for many languages;"),
        ("Rechtschreibprüfung.", "spell checking."),
        # the package's second record joins the same document
        ("kleiner Texteditor (alte Beschreibung)", "small text editor (old description)"),
        ("Eine ältere Beschreibung des Editors.", "An older description of the editor."),
    ]
    assert messages == ["ddtp: 5 German records; 1 without an English record of the same Description-md5, "
                        "1 untranslated copies (skipped), 1 with different paragraph counts (summary only)"]


def test_different_paragraph_counts_keep_only_the_summary():
    documents = dict(ddtp.match([GERMAN], ddtp.english_descriptions([ENGLISH]), _quiet))
    assert documents["ddtp:editor-doc"] == [("Dokumentation für den kleinen Texteditor",
                                             "documentation for the small text editor")]


def test_untranslated_and_unmatched_records_are_skipped():
    documents = dict(ddtp.match([GERMAN], ddtp.english_descriptions([ENGLISH]), _quiet))
    assert list(documents) == ["ddtp:editor", "ddtp:editor-doc"]


def test_blocks_paired_whole_when_counts_differ():
    german = ddtp.parse_description("z\n Funktionen:\n  * eins\n  * zwei")
    english = ddtp.parse_description("s\n Features: one and two.")
    pairs, whole = ddtp.align(german, english)
    assert whole
    assert pairs == [("z", "s"), ("Funktionen: eins zwei", "Features: one and two.")]


def test_documents_reads_the_cache_indexes():
    class FakeCache:
        def translation_indexes(self, language):
            return [f"Translation-{language}"]

        @staticmethod
        def read_index(path):
            return {"Translation-de": GERMAN, "Translation-en": ENGLISH}[path]

    documents = list(ddtp.documents(FakeCache(), _quiet))
    assert [document_id for document_id, _ in documents] == ["ddtp:editor", "ddtp:editor-doc"]

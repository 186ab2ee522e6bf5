"""Tests for ``tf_transformer.data.datasets.cleaning``: normalising, sentence splitting, filters."""

import pytest

from tf_transformer.data.datasets import cleaning
from tf_transformer.data.datasets.cleaning import (length_ratio, normalize, placeholder, rejection,
                                              split_pair, split_sentences, too_long, too_short,
                                              untranslated)


def test_normalize_collapses_whitespace_and_strips_control_characters():
    assert normalize("  Ein\tkleiner\n\nTest\u00a0hier  ") == "Ein kleiner Test hier"
    assert normalize("Silben\u00adtrennung und\u200b Null\x07breite") == "Silbentrennung und Nullbreite"


def test_normalize_composes_umlauts():
    assert normalize("Mu\u0308ller") == "M\u00fcller"


@pytest.mark.parametrize("text, sentences", [
    ("Das ist gut. Das ist schlecht.", ["Das ist gut.", "Das ist schlecht."]),
    ("Wirklich? Ja! Na gut.", ["Wirklich?", "Ja!", "Na gut."]),
    ("Er sagte: „Nein.“ Dann ging er.", ["Er sagte: „Nein.“", "Dann ging er."]),
    ("Das kostet z. B. fünf Euro. Danach nicht.", ["Das kostet z. B. fünf Euro.", "Danach nicht."]),
    ("Use e.g. Emacs. It works.", ["Use e.g. Emacs.", "It works."]),
    ("Am 5. März kam Dr. Meier.", ["Am 5. März kam Dr. Meier."]),
    ("Version 2.0 is out. Mr. Smith said so.", ["Version 2.0 is out.", "Mr. Smith said so."]),
    ("Warte... Ich komme.", ["Warte... Ich komme."]),
    ("Lies die Datei config.txt. sie ist kurz.", ["Lies die Datei config.txt. sie ist kurz."]),
    ("Ein Satz ohne Ende", ["Ein Satz ohne Ende"]),
])
def test_split_sentences(text, sentences):
    assert split_sentences(text) == sentences


def test_split_pair_pairs_sentences_when_counts_match():
    assert split_pair("Eins ist da. Zwei auch.", "One is here. Two as well.") == [
        ("Eins ist da.", "One is here."), ("Zwei auch.", "Two as well.")]


def test_split_pair_keeps_paragraph_whole_when_counts_differ():
    pair = ("Eins ist da. Zwei auch.", "One is here, and two as well.")
    assert split_pair(*pair) == [pair]


def test_untranslated():
    assert untranslated("GNU Emacs text editor", "GNU Emacs text editor") == "untranslated"
    assert untranslated("Gnu emacs Text Editor", "GNU Emacs text editor") == "untranslated"
    assert untranslated("GNU Emacs Texteditor", "GNU Emacs text editor") is None


@pytest.mark.parametrize("text", [
    "Datei %s nicht gefunden", "Es sind %d Dateien", "Wert %1$s ist falsch", "Breite %-5.2f mm",
    "Name %(name)s fehlt", "Noch %1 Minuten", "%PRODUCTNAME startet jetzt", "100%% fertig",
    "Es sind {0} Dateien", "Hallo {name} und so", "{count, plural, one {# Datei} other {# Dateien}}",
    "Das ist <b>fett</b> hier", "Zeile<br/>neu", '<a href="x">hier</a> klicken', "Tom &amp; Jerry sind da",
    "Ein&#160;Leerzeichen ist da",
])
def test_placeholder_found(text):
    assert placeholder(text, "some English text") == "placeholder"
    assert placeholder("etwas deutscher Text", text) == "placeholder"


@pytest.mark.parametrize("text", [
    "Sie haben 100%ige Sicherheit", "50 % der Leute", "Wenn a < b und c > d gilt",
    "Schreiben Sie an <debian@example.org> bitte", "Tom & Jerry sind da", "Der Preis ist 5 $ pro Tag",
])
def test_placeholder_not_found(text):
    assert placeholder(text, "some English text") is None


def test_word_limits():
    assert too_short("zwei Wörter", "three words here") == "too short"
    assert too_short("drei Wörter hier", "two words") == "too short"
    assert too_short("drei Wörter hier", "three words here") is None
    eighty, eighty_one = " ".join(["Wort"] * 80), " ".join(["Wort"] * 81)
    assert too_long(eighty, eighty) is None
    assert too_long(eighty_one, eighty) == "too long"
    assert too_long(eighty, eighty_one) == "too long"


def test_length_ratio_bounds():
    english = "x" * 100
    assert length_ratio("x" * 50, english) is None
    assert length_ratio("x" * 220, english) is None
    assert length_ratio("x" * 49, english) == "length ratio"
    assert length_ratio("x" * 221, english) == "length ratio"


def test_rejection_reports_the_first_failing_filter():
    assert rejection("Das ist ein guter Satz.", "That is a good sentence.") is None
    assert rejection("Kurz", "Kurz") == "untranslated"
    assert rejection("Datei %s", "File %s") == "placeholder"
    assert rejection("Datei fehlt", "File is missing") == "too short"
    assert rejection("Ein sehr sehr langer deutscher Satz hier.", "Go on now.") == "length ratio"


def test_reasons_match_filters():
    assert len(cleaning.REASONS) == len(cleaning.FILTERS)
    rejecting = [("Gleich und gleich", "Gleich und gleich"), ("Datei %s fehlt", "File %s is missing"),
                 ("zu kurz", "too short"), (" ".join(["a"] * 81), " ".join(["b"] * 81)),
                 ("drei Wörter hier", "three words here, and then a lot more")]
    assert [f(*pair) for f, pair in zip(cleaning.FILTERS, rejecting)] == list(cleaning.REASONS)

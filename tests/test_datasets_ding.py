"""Tests for ``tf_transformer.data.datasets.ding``: the Ding dictionary's example sentences."""

import os

import pytest

from tf_transformer.data.datasets import ding
from tf_transformer.errors import UserError

DICTIONARY = """\
# Version :: devel 2023-01-30
# License :: GPL Version 2 or later; GNU General Public License
Abend {m} | Guten Abend! | Er kommt am Abend. :: evening | Good evening! | He comes in the evening.
Es tut mir (schrecklich) leid. :: I am (awfully) sorry. [Am.]
Achtung {f} | Sie fiel ihm um den Hals.; Sie umarmte ihn. :: attention | She flung her arms around his neck.; She hugged him.
Achtung {f} [mil.] | Achtung, fertig, los! :: attention | Ready, steady, go! [Br.]
Na los! | Na los, trau dich!; Na geh, mach schon! :: Go on! | You go, girl!
etw. pelletieren {vt} | Ich pelletiere. :: to pellet sth. | i pellet.
Wort {n} | Die Warnung klang in meinen Ohren/meinem Kopf. | Ich habe mit … gute Erfahrungen. :: word | The warning echoed in my ears/head. | I had good experiences with …
Rat {m} | Sie gab jdm. einen Rat. | Das ist es wert. :: advice | She gave sb. advice. | It is worth it.
Endlich Freitag! :: Thank God It's Friday! /TGIF/
Tag {m} | Tage {pl} :: day | days | extra
"""

# (document id, [(German, English), ...]) expected from DICTIONARY, in file order.
EXPECTED = [
    ("ding:Abend", [("Guten Abend!", "Good evening!"), ("Er kommt am Abend.", "He comes in the evening.")]),
    ("ding:Es tut mir leid.", [("Es tut mir leid.", "I am sorry.")]),
    ("ding:Achtung", [("Sie fiel ihm um den Hals.", "She flung her arms around his neck."),
                      ("Sie umarmte ihn.", "She hugged him."),
                      ("Achtung, fertig, los!", "Ready, steady, go!")]),
    ("ding:Na los!", [("Na los!", "Go on!"), ("Na los, trau dich!", "You go, girl!")]),
    ("ding:Rat", [("Das ist es wert.", "It is worth it.")]),
    ("ding:Endlich Freitag!", [("Endlich Freitag!", "Thank God It's Friday!")]),
]


def test_parse_pairs_example_sentences():
    assert ding.parse(DICTIONARY.splitlines(), "de-en", log=lambda _: None) == EXPECTED


def test_parse_logs_entries_with_unequal_sub_entries():
    messages = []
    ding.parse(DICTIONARY.splitlines(), "de-en", log=messages.append)
    assert messages == ["ding: de-en: skipped 1 entries whose sides hold different numbers of sub-entries"]


def test_malformed_line_names_file_and_line():
    with pytest.raises(UserError, match=r"^dict:3: expected 'German :: English', got 'kein Trenner'$"):
        ding.parse(["# comment", "A :: B", "kein Trenner"], "dict")


@pytest.mark.parametrize("text, stripped", [
    ("Aal {m} (auf der Speisekarte) [cook.]", "Aal"),
    ("Es tut mir (sehr (sehr)) leid .", "Es tut mir leid."),
    ("eel smokery <eelsmoking business>", "eel smokery"),
    ("See you! /CU/ (leaving phrase)", "See you!"),
])
def test_strip_annotations(text, stripped):
    assert ding.strip_annotations(text) == stripped


@pytest.mark.parametrize("text, expected", [
    ("Er kommt.", True), ("Kommt er?", True), ("„Nein!“", True), ("Good evening!", True),
    ("to pellet sth.", False), ("etw. pelletieren", False), ("Er kommt", False), ("jdn. ärgern.", False),
])
def test_is_sentence(text, expected):
    assert ding.is_sentence(text) is expected


def test_documents_reads_the_package_tree(tmp_path):
    path = tmp_path / ding.DICTIONARY
    os.makedirs(path.parent)
    path.write_text(DICTIONARY, encoding="utf-8")

    class FakeCache:
        def package_tree(self, package):
            assert package == "trans-de-en"
            return str(tmp_path)

    messages = []
    assert list(ding.documents(FakeCache(), messages.append)) == EXPECTED
    assert messages[-1] == "ding: 10 example sentences under 6 headwords"

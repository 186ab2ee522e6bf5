"""Tests for ``tf_transformer.data.corpus``: parallel files, TSV, IWSLT and corpus directories."""

import gzip
import os
import re

import pytest

from tf_transformer.data import corpus
from tf_transformer.data.corpus import Split, corpus_splits, read_parallel, read_tsv
from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines


def write(path, text):
    """Writes UTF-8 text (gzip-compressed when the name ends in .gz); returns str(path)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    if str(path).endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return str(path)


def assert_one_line(message):
    assert "\n" not in message, message


# ---- read_parallel -----------------------------------------------------------------


def test_read_parallel_pairs_line_k_with_line_k(tmp_path):
    source = write(tmp_path / "s.de", "Guten Morgen\nWie geht's?\nDanke schön.\n")
    target = write(tmp_path / "t.en", "Good morning\nHow are you?\nThank you.\n")
    result = read_parallel(source, target)
    assert result.pairs == [("Guten Morgen", "Good morning"), ("Wie geht's?", "How are you?"),
                            ("Danke schön.", "Thank you.")]
    assert result.blank == 0
    assert source in result.origin and target in result.origin


def test_read_parallel_different_sentence_counts(tmp_path):
    source = write(tmp_path / "s.de", "a\nb\nc\nd\ne\n")
    target = write(tmp_path / "t.en", "x\ny\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    message = str(info.value)
    assert_one_line(message)
    assert source in message and target in message
    rest = message.replace(source, "").replace(target, "")
    assert re.search(r"\b5\b", rest) and re.search(r"\b2\b", rest)


def test_read_parallel_skips_and_counts_blank_pairs(tmp_path):
    # Line 2 blank on the source side, 3 on the target side, 4 whitespace on the source side.
    source = write(tmp_path / "s.de", "eins\n\ndrei\n  \nfunf\n")
    target = write(tmp_path / "t.en", "one\ntwo\n\nfour\n five \n")
    result = read_parallel(source, target)
    assert result.pairs == [("eins", "one"), ("funf", "five")]
    assert result.blank == 3


def test_read_parallel_all_blank(tmp_path):
    source = write(tmp_path / "s.de", "\n \n")
    target = write(tmp_path / "t.en", "a\n\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    assert source in str(info.value)
    assert_one_line(str(info.value))


def test_read_parallel_bad_utf8_in_target(tmp_path):
    source = write(tmp_path / "s.de", b"a\nb\nc\n")
    target = write(tmp_path / "t.en", b"a\nb\n\xc3(\n")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    assert f"{target}:3" in str(info.value)


def test_read_parallel_missing_file(tmp_path):
    source = write(tmp_path / "s.de", "a\n")
    target = str(tmp_path / "nope.en")
    with pytest.raises(UserError) as info:
        read_parallel(source, target)
    assert target in str(info.value)


def test_read_parallel_gz_and_crlf(tmp_path):
    source = write(tmp_path / "s.de.gz", "Größe\r\nÄpfel\r\n")
    target = write(tmp_path / "t.en", "size\napples\n")
    assert read_parallel(source, target).pairs == [("Größe", "size"), ("Äpfel", "apples")]


# ---- read_tsv ----------------------------------------------------------------------


def test_read_tsv(tmp_path):
    path = write(tmp_path / "train.tsv", "Hallo Welt\thello world\nTschüß\tbye\n")
    result = read_tsv(path)
    assert result.pairs == [("Hallo Welt", "hello world"), ("Tschüß", "bye")]
    assert result.blank == 0


def test_read_tsv_blank_lines_skipped_and_counted(tmp_path):
    path = write(tmp_path / "train.tsv", "a\tx\n\n   \nb\t\n\ty\n \t \nc\tz\n")
    result = read_tsv(path)
    assert result.pairs == [("a", "x"), ("c", "z")]
    assert result.blank == 5


@pytest.mark.parametrize("bad_line", ["no tab here", "one\ttwo\tthree"])
def test_read_tsv_wrong_number_of_tabs_names_file_and_line(tmp_path, bad_line):
    path = write(tmp_path / "train.tsv", f"a\tx\nb\ty\n{bad_line}\nc\tz\n")
    with pytest.raises(UserError) as info:
        read_tsv(path)
    assert f"{path}:3" in str(info.value)
    assert_one_line(str(info.value))


def test_read_tsv_all_blank(tmp_path):
    path = write(tmp_path / "train.tsv", "\n\t\n")
    with pytest.raises(UserError) as info:
        read_tsv(path)
    assert path in str(info.value)


# ---- IWSLT layout ------------------------------------------------------------------

IWSLT_TRAIN_DE = """<url>http://www.ted.com/talks/a_talk.html</url>
<keywords>talks, science</keywords>
<speaker>Jane Doe</speaker>
<talkid>1</talkid>
<title>Jane Doe: Über Brücken</title>
<description>TED Talk Subtitles and Transcript: Über Brücken.</description>
Vielen Dank, Chris.
Es ist mir eine große Ehre.
  <reviewer href="x">R</reviewer>
Ich bin begeistert.
"""

IWSLT_TRAIN_EN = """<url>http://www.ted.com/talks/a_talk.html</url>
<keywords>talks, science</keywords>
<speaker>Jane Doe</speaker>
<talkid>1</talkid>
<title>Jane Doe: About bridges</title>
<description>TED Talk Subtitles and Transcript: About bridges.</description>
Thank you so much, Chris.
It's truly a great honor.
  <reviewer href="x">R</reviewer>
I have been blown away.
"""


def iwslt_xml(lang, sentences):
    segments = "".join(f'<seg id="{i}"> {s} </seg>\n' for i, s in enumerate(sentences, 1))
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<mteval>\n<srcset setid="x" srclang="{lang}">\n'
            f'<doc docid="535" genre="lectures">\n<url>http://www.ted.com/talks/x.html</url>\n'
            f"<description>A description &amp; more</description>\n<talkid>535</talkid>\n"
            f"<title>Title</title>\n{segments}</doc>\n</srcset>\n</mteval>\n")


DEV_DE = ["Tom &amp; Jerry sind hier.", "Es ist &quot;groß&quot; &lt;sehr&gt;.", "Das heißt: 5 &gt; 3."]
DEV_EN = ["Tom &amp; Jerry are here.", "It is &quot;big&quot; &lt;very&gt;.", "That is: 5 &gt; 3."]


def test_iwslt_train_tags_skip_metadata(tmp_path):
    source = write(tmp_path / "train.tags.de-en.de", IWSLT_TRAIN_DE)
    target = write(tmp_path / "train.tags.de-en.en", IWSLT_TRAIN_EN)
    result = read_parallel(source, target)
    assert result.pairs == [
        ("Vielen Dank, Chris.", "Thank you so much, Chris."),
        ("Es ist mir eine große Ehre.", "It's truly a great honor."),
        ("Ich bin begeistert.", "I have been blown away."),
    ]


def test_iwslt_xml_segments_unescaped(tmp_path):
    source = write(tmp_path / "IWSLT16.TED.dev2010.de-en.de.xml", iwslt_xml("de", DEV_DE))
    target = write(tmp_path / "IWSLT16.TED.dev2010.de-en.en.xml", iwslt_xml("en", DEV_EN))
    result = read_parallel(source, target)
    assert result.pairs == [
        ("Tom & Jerry sind hier.", "Tom & Jerry are here."),
        ('Es ist "groß" <sehr>.', 'It is "big" <very>.'),
        ("Das heißt: 5 > 3.", "That is: 5 > 3."),
    ]
    assert result.blank == 0


def test_plain_file_keeps_lines_starting_with_angle_bracket(tmp_path):
    # Only IWSLT's train.tags.* files have metadata lines.
    source = write(tmp_path / "train.de", "<b> fett\nnormal\n")
    target = write(tmp_path / "train.en", "<b> bold\nplain\n")
    assert read_parallel(source, target).pairs == [("<b> fett", "<b> bold"), ("normal", "plain")]


# ---- corpus_splits -----------------------------------------------------------------


def make_split_files(directory, splits=("train", "dev", "test"), langs=("de", "en"), suffix=""):
    directory.mkdir(exist_ok=True)
    for split in splits:
        for lang in langs:
            write(directory / f"{split}.{lang}{suffix}", f"{split} {lang} eins\n{split} {lang} zwei\n")
    return str(directory)


def test_corpus_splits_line_aligned(tmp_path):
    directory = make_split_files(tmp_path / "c")
    splits = corpus_splits(directory)
    assert set(splits) == {"train", "dev", "test"}
    for name in ("train", "dev", "test"):
        assert splits[name] == Split(os.path.join(directory, f"{name}.de"), os.path.join(directory, f"{name}.en"))
        assert splits[name].read().pairs == [(f"{name} de eins", f"{name} en eins"),
                                             (f"{name} de zwei", f"{name} en zwei")]


def test_corpus_splits_only_train(tmp_path):
    directory = make_split_files(tmp_path / "c", splits=("train",))
    assert set(corpus_splits(directory)) == {"train"}


def test_corpus_splits_gz(tmp_path):
    directory = make_split_files(tmp_path / "c", suffix=".gz")
    splits = corpus_splits(directory)
    assert set(splits) == {"train", "dev", "test"}
    assert splits["dev"].source == os.path.join(directory, "dev.de.gz")
    assert splits["dev"].read().pairs == [("dev de eins", "dev en eins"), ("dev de zwei", "dev en zwei")]


def test_corpus_splits_tsv(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    write(directory / "train.tsv", "ein Haus\ta house\nzwei Häuser\ttwo houses\n")
    write(directory / "test.tsv.gz", "drei\tthree\n")
    splits = corpus_splits(str(directory))
    assert set(splits) == {"train", "test"}
    assert splits["train"].target is None
    assert splits["train"].read().pairs == [("ein Haus", "a house"), ("zwei Häuser", "two houses")]
    assert splits["test"].read().pairs == [("drei", "three")]


def make_iwslt(directory, pair="de-en"):
    directory.mkdir()
    write(directory / f"train.tags.{pair}.de", IWSLT_TRAIN_DE)
    write(directory / f"train.tags.{pair}.en", IWSLT_TRAIN_EN)
    for year, kind in (("dev2010", "dev"), ("tst2010", "other"), ("tst2013", "test")):
        write(directory / f"IWSLT16.TED.{year}.{pair}.de.xml", iwslt_xml("de", [f"{kind} satz &amp; ß"]))
        write(directory / f"IWSLT16.TED.{year}.{pair}.en.xml", iwslt_xml("en", [f"{kind} sentence &amp; ss"]))
    return str(directory)


def test_corpus_splits_iwslt_names(tmp_path):
    directory = make_iwslt(tmp_path / "iwslt")
    splits = corpus_splits(directory)
    assert splits["train"] == Split(os.path.join(directory, "train.tags.de-en.de"),
                                    os.path.join(directory, "train.tags.de-en.en"))
    assert splits["dev"] == Split(os.path.join(directory, "IWSLT16.TED.dev2010.de-en.de.xml"),
                                  os.path.join(directory, "IWSLT16.TED.dev2010.de-en.en.xml"))
    assert splits["test"] == Split(os.path.join(directory, "IWSLT16.TED.tst2013.de-en.de.xml"),
                                   os.path.join(directory, "IWSLT16.TED.tst2013.de-en.en.xml"))
    assert len(splits["train"].read().pairs) == 3
    assert splits["dev"].read().pairs == [("dev satz & ß", "dev sentence & ss")]
    assert splits["test"].read().pairs == [("test satz & ß", "test sentence & ss")]


def test_corpus_splits_iwslt_reverse_direction(tmp_path):
    # The de-en download also serves en->de: the pair in the names is the download's.
    directory = make_iwslt(tmp_path / "iwslt")
    splits = corpus_splits(directory, source_lang="en", target_lang="de")
    assert splits["train"].source == os.path.join(directory, "train.tags.de-en.en")
    assert splits["train"].read().pairs[0] == ("Thank you so much, Chris.", "Vielen Dank, Chris.")
    assert splits["test"].read().pairs == [("test sentence & ss", "test satz & ß")]


def test_corpus_splits_other_languages(tmp_path):
    directory = make_split_files(tmp_path / "c", langs=("fr", "en", "de"))
    splits = corpus_splits(directory, source_lang="fr", target_lang="en")
    assert splits["train"] == Split(os.path.join(directory, "train.fr"), os.path.join(directory, "train.en"))
    assert splits["test"].read().pairs[0] == ("test fr eins", "test en eins")
    reverse = corpus_splits(directory, source_lang="en", target_lang="fr")
    assert reverse["train"] == Split(os.path.join(directory, "train.en"), os.path.join(directory, "train.fr"))


def test_corpus_splits_language_missing(tmp_path):
    directory = make_split_files(tmp_path / "c")
    with pytest.raises(UserError) as info:
        corpus_splits(directory, source_lang="fr", target_lang="en")
    message = str(info.value)
    assert_one_line(message)
    assert "train.fr" in message and "train.en" in message


def test_corpus_splits_missing_directory(tmp_path):
    missing = str(tmp_path / "no-such-corpus")
    with pytest.raises(UserError) as info:
        corpus_splits(missing)
    message = str(info.value)
    assert_one_line(message)
    assert missing in message
    assert "directory" in message
    assert "toy" in message  # the embedded corpora that would be valid


def test_corpus_splits_file_is_not_a_directory(tmp_path):
    path = write(tmp_path / "train.de", "a\n")
    with pytest.raises(UserError) as info:
        corpus_splits(path)
    assert path in str(info.value)


def test_corpus_splits_without_train(tmp_path):
    directory = make_split_files(tmp_path / "c", splits=("dev", "test"))
    with pytest.raises(UserError) as info:
        corpus_splits(directory)
    message = str(info.value)
    assert_one_line(message)
    assert directory in message
    for expected in ("train.de", "train.en", "train.tsv", "train.tags.de-en"):
        assert expected in message


def test_corpus_splits_only_one_side_of_train(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    write(directory / "train.de", "a\n")
    with pytest.raises(UserError) as info:
        corpus_splits(str(directory))
    assert "train.en" in str(info.value)


def test_corpus_splits_directory_with_glob_characters(tmp_path):
    directory = make_split_files(tmp_path / "c[1]")
    assert set(corpus_splits(directory)) == {"train", "dev", "test"}


# ---- embedded corpora ------------------------------------------------------------


def test_toy_corpus():
    splits = corpus_splits("toy")
    result = splits["train"].read()
    assert result.pairs == [
        ("ich mochte ein bier", "i want a beer"),
        ("ich mochte ein cola", "i want a coke"),
        ("ich mochte ein orangensaft", "i want a orange juice"),
    ]
    assert result.blank == 0


def test_embedded_names_are_directories_in_the_package():
    assert os.path.isdir(corpus.EMBEDDED["toy"])
    assert corpus.DEFAULT_CORPUS in corpus.EMBEDDED


def test_ding_de_en_corpus():
    directory = corpus.EMBEDDED.get("ding-de-en")
    if directory is None or not os.path.isdir(directory):
        pytest.skip("the embedded ding-de-en corpus is not built yet (tf_transformer/corpora/ding-de-en missing)")
    splits = corpus_splits("ding-de-en")
    assert set(splits) == {"train", "dev", "test"}
    read = {}
    for name, split in splits.items():
        if split.target is not None:  # line-aligned: the raw files have equal line counts
            assert len(read_text_lines(split.source)) == len(read_text_lines(split.target)), name
        read[name] = split.read()
        assert read[name].pairs, name
    assert len(read["train"].pairs) >= 2000
    assert len(read["train"].pairs) > len(read["test"].pairs)
    shared = set(read["train"].pairs) & set(read["test"].pairs)
    assert not shared, f"{len(shared)} pairs in both train and test, e.g. {sorted(shared)[:3]}"
    german = "".join(source for source, _ in read["train"].pairs)
    for character in "äöüß":
        assert character in german, f"no {character!r} in the German side"

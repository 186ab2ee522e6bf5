"""Tests for the corpus builder (``tf_transformer.data.datasets.build`` and its command line).

The builder runs on fake source modules; one integration test builds the Ding
corpus for real, downloading from Debian's archive (skipped without apt or
network).
"""

import io
import os
import shutil
import subprocess
import sys
import types

import pytest

from tf_transformer.cli.datasets import main
from tf_transformer.data import datasets
from tf_transformer.data.datasets import build
from tf_transformer.data.datasets.debian import DebianCache, DownloadError
from tf_transformer.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED_GERMAN = "Dieses Paket enthält die Dokumentation."
FILES = ["SOURCES.md"] + [f"{split}.{lang}" for split in build.SPLITS for lang in ("de", "en")]


def document(source, number):
    """A fake document: five sentence pairs of its own and one whose German side
    every document shares (with an English side of its own)."""
    name = f"{source}-{number}"
    pairs = [(f"Das ist der Satz Nummer {i} aus Dokument {name}.",
              f"This is sentence number {i} from document {name}.") for i in range(5)]
    pairs.append((SHARED_GERMAN, f"This package contains the documentation, from document {name}."))
    return f"{source}:doc{number}", pairs


def fake_source(name, documents, packages=(), fail_after=None):
    """A source module yielding ``documents``; raises RuntimeError after ``fail_after`` of them."""
    def generate(cache, log):
        for count, doc in enumerate(documents):
            if count == fail_after:
                raise RuntimeError("parser failed mid-way")
            yield doc
    return types.SimpleNamespace(NAME=name, LICENSE=f"{name} license", PACKAGES=packages, documents=generate)


DING = [document("ding", n) for n in range(100)]
DDTP = [document("ddtp", n) for n in range(100)] + [("ddtp:copy", DING[0][1])]


@pytest.fixture
def sources(monkeypatch):
    """Installs fake ``ding`` and ``ddtp`` modules; returns the dict, which tests may change."""
    modules = {"ding": fake_source("ding", DING), "ddtp": fake_source("ddtp", DDTP)}
    monkeypatch.setattr(build, "load_source", lambda name: modules[name])
    return modules


def read_splits(out):
    """``{split: [(German, English), ...]}`` read back from ``out``."""
    splits = {}
    for split in build.SPLITS:
        with open(os.path.join(out, f"{split}.de"), encoding="utf-8") as de, \
                open(os.path.join(out, f"{split}.en"), encoding="utf-8") as en:
            german, english = de.read().splitlines(), en.read().splitlines()
        assert len(german) == len(english)
        splits[split] = list(zip(german, english))
    return splits


def file_bytes(out):
    return {name: open(os.path.join(out, name), "rb").read() for name in FILES}


def run_build(out, **options):
    messages = []
    corpus = build.build(str(out), ("ding", "ddtp"), cache_dir=str(out / "cache"), log=messages.append, **options)
    return corpus, messages


def test_no_document_in_two_splits(sources, tmp_path):
    run_build(tmp_path)
    splits = read_splits(tmp_path)
    owner = {}
    for document_id, pairs in DING + DDTP[:-1]:
        for pair in pairs:
            owner[pair] = document_id
    documents = {split: {owner[pair] for pair in pairs} for split, pairs in splits.items()}
    assert documents["dev"] and documents["test"]
    assert not documents["train"] & documents["dev"]
    assert not documents["train"] & documents["test"]
    assert not documents["dev"] & documents["test"]


def test_heldout_sizes(sources, tmp_path):
    corpus, _ = run_build(tmp_path, dev_size=20, test_size=2000)
    kept = sum(counts.kept for counts in corpus.counts.values())  # 1200 pairs, 5% = 60
    largest_document = 6
    assert 20 - largest_document <= len(corpus.splits["dev"]) <= 20 + largest_document
    assert len(corpus.splits["test"]) <= kept * build.MAX_HELDOUT_FRACTION + largest_document
    assert len(corpus.splits["test"]) >= kept * build.MAX_HELDOUT_FRACTION - 2 * largest_document


def test_duplicates_removed(sources, tmp_path):
    corpus, _ = run_build(tmp_path)
    pairs = [pair for split in read_splits(tmp_path).values() for pair in split]
    assert len(pairs) == len(set(pairs))
    assert corpus.counts["ddtp"].duplicates == 6  # ddtp:copy repeats ding:doc0 exactly
    assert corpus.counts["ding"].duplicates == 0


def test_leakage_removed(sources, tmp_path):
    corpus, _ = run_build(tmp_path)
    splits = read_splits(tmp_path)
    train_german = {german for german, _ in splits["train"]}
    dev_german = {german for german, _ in splits["dev"]}
    assert SHARED_GERMAN in train_german
    assert not train_german & dev_german
    assert not (train_german | dev_german) & {german for german, _ in splits["test"]}
    heldout_documents = {english.rsplit(" from document ", 1)[1]
                         for split in ("dev", "test") for _, english in splits[split]}
    assert sum(counts.leaked for counts in corpus.counts.values()) == len(heldout_documents)


def test_output_is_deterministic(sources, tmp_path):
    run_build(tmp_path / "a")
    run_build(tmp_path / "b")
    assert file_bytes(tmp_path / "a") == file_bytes(tmp_path / "b")
    run_build(tmp_path / "c", seed=2)
    assert read_splits(tmp_path / "c")["dev"] != read_splits(tmp_path / "a")["dev"]


def test_failing_source_leaves_previous_corpus(sources, tmp_path):
    run_build(tmp_path)
    before = file_bytes(tmp_path)
    sources["ddtp"] = fake_source("ddtp", DDTP, fail_after=50)
    with pytest.raises(RuntimeError, match="mid-way"):
        run_build(tmp_path)
    assert file_bytes(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == sorted(FILES)  # no temporary folder left


def test_failing_write_leaves_previous_corpus(sources, tmp_path, monkeypatch):
    run_build(tmp_path)
    before = file_bytes(tmp_path)
    sources["ding"] = fake_source("ding", DING[:90])
    written = []

    def failing_fsync(fd):
        written.append(fd)
        if len(written) == 4:
            raise OSError("disk full")

    monkeypatch.setattr(build.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        run_build(tmp_path)
    assert file_bytes(tmp_path) == before
    assert sorted(os.listdir(tmp_path)) == sorted(FILES)  # no temporary folder left


def test_report_counts_each_step(monkeypatch, tmp_path):
    documents = [
        ("ding:a", [("Eins ist da. Zwei ist hier.", "One is there. Two is here."),
                    ("Hallo.", "Hello."),
                    ("Das ist ein Test.", "Das ist ein Test."),
                    ("Datei %s wurde nicht gefunden.", "File %s was not found."),
                    ("Ein sehr sehr langer deutscher Satz hier.", "Go on now, yes.")]),
        ("ding:b", [("Eins ist da.", "One is there.")]),
    ]
    monkeypatch.setattr(build, "load_source", lambda name: fake_source(name, documents))
    messages = []
    corpus = build.build(str(tmp_path), ["ding"], cache_dir=str(tmp_path / "cache"), log=messages.append)
    assert dict(zip(build.COLUMNS[1:], corpus.counts["ding"].row())) == {
        "documents": 2, "segments": 6, "sentences": 7, "untranslated": 1, "placeholder": 1,
        "too short": 1, "too long": 0, "length ratio": 1, "duplicates": 1, "kept": 2, "leaked": 0,
        "train": 2, "dev": 0, "test": 0}
    table = build.format_table(corpus)
    assert table.splitlines()[0].split("|")[1:4] == [" source ", " documents ", " segments "]
    assert table.splitlines()[2] == ("| ding   |         2 |        6 |         7 |            1 |"
                                     "           1 |         1 |        0 |            1 |          1 |"
                                     "    2 |      0 |     2 |   0 |    0 |")
    assert table in messages
    assert messages[-1] == f"wrote train 2 pairs, dev 0 pairs, test 0 pairs to {tmp_path}"
    assert table in (tmp_path / "SOURCES.md").read_text(encoding="utf-8")


def test_sources_md_names_packages_versions_and_licenses(monkeypatch, tmp_path):
    debs = tmp_path / "cache" / "debs"
    debs.mkdir(parents=True)
    (debs / "trans-de-en_1.9-6_all.deb").write_bytes(b"")
    (debs / "libreoffice-help-de_4%3a7.4.7-1_all.deb").write_bytes(b"")
    modules = {"ding": fake_source("ding", DING, packages=("trans-de-en",)),
               "libreoffice": fake_source("libreoffice", [document("libreoffice", 1)],
                                          packages=("libreoffice-help-de",))}
    monkeypatch.setattr(build, "load_source", lambda name: modules[name])
    build.build(str(tmp_path), ["libreoffice", "ding"], log=lambda _: None)
    text = (tmp_path / "SOURCES.md").read_text(encoding="utf-8")
    assert "--sources ding,libreoffice " in text
    assert "## ding\n\nLicense: ding license\n\n- Debian package `trans-de-en` 1.9-6 (`trans-de-en_1.9-6_all.deb`)" in text
    assert "- Debian package `libreoffice-help-de` 4:7.4.7-1" in text


def test_cli_unknown_source_is_one_line(tmp_path, capsys):
    assert main(["build", "debian-de-en", "--out", str(tmp_path), "--sources", "ding,wikipedia"]) == 2
    assert capsys.readouterr().err == ("error: unknown source 'wikipedia'; "
                                       "valid sources: ding, ddtp, libreoffice, manpages\n")
    assert os.listdir(tmp_path) == []


def test_cli_download_error_is_one_line(monkeypatch, tmp_path, capsys):
    def unreachable(cache, log):
        raise DownloadError("package trans-de-en: E: Failed to fetch http://deb.debian.org/... "
                            "Temporary failure resolving 'deb.debian.org'")
        yield  # a generator, like the real sources

    module = types.SimpleNamespace(NAME="ding", LICENSE="GPL-2+", PACKAGES=("trans-de-en",), documents=unreachable)
    monkeypatch.setattr(build, "load_source", lambda name: module)
    assert main(["build", "debian-de-en", "--out", str(tmp_path), "--sources", "ding"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: source ding: package trans-de-en: E: Failed to fetch")
    assert err.count("\n") == 1
    assert not [name for name in os.listdir(tmp_path) if name != "cache"]


class Terminal(io.StringIO):
    """Standard error as a terminal."""

    def isatty(self):
        return True


def test_downloads_show_one_bar_per_source_and_log_the_package_names(monkeypatch, tmp_path, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    apt_get = bin_dir / "apt-get"  # `apt-get download -q NAME` writes an empty NAME_1.0_all.deb here
    apt_get.write_text('#!/bin/sh\ntouch "$3_1.0_all.deb"\n')
    apt_get.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    packages = ("pkg-alpha", "pkg-beta", "pkg-gamma")

    def download(cache, log):
        for package in packages:
            cache.deb(package)
        yield from DING

    module = types.SimpleNamespace(NAME="ding", LICENSE="GPL-2+", PACKAGES=packages, documents=download)
    monkeypatch.setattr(build, "load_source", lambda name: module)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)  # the bar is drawn on a terminal only
    assert main(["build", "debian-de-en", "--out", str(tmp_path / "out"), "--sources", "ding"]) == 0
    out, err = capsys.readouterr()[0], terminal.getvalue()
    log = tmp_path / "out" / "cache" / "downloads.log"
    assert log.read_text().splitlines() == [f"downloading {package} (apt-get download)" for package in packages]
    assert [line for line in out.splitlines() if str(log) in line] == [
        f"ding: downloading 3 Debian package(s) with apt-get download (names in {log})"]
    assert not [package for package in packages if package in out + err]
    assert "3/3" in err  # the bar


def _download_or_skip(cache_dir):
    """Fetches trans-de-en into ``cache_dir``, or skips the test saying why it cannot."""
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed: the corpus builder needs Debian's apt and dpkg")
    try:
        DebianCache(cache_dir, log=lambda _: None).deb("trans-de-en")
    except DownloadError as e:
        pytest.skip(f"Debian's archive is unreachable: {e}")


def test_real_ding_corpus(tmp_path):
    cache, out = str(tmp_path / "cache"), str(tmp_path / "corpus")
    _download_or_skip(cache)
    done = subprocess.run([sys.executable, "-m", "tf_transformer.cli.datasets", "build", "debian-de-en",
                           "--sources", "ding", "--out", out, "--cache", cache],
                          cwd=REPO, capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr
    assert "| ding " in done.stdout
    splits = read_splits(out)
    assert len(splits["train"]) > 10000
    assert 500 < len(splits["dev"]) <= 2000 and 500 < len(splits["test"]) <= 2000
    german = "\n".join(de for de, _ in splits["train"])
    assert sum(german.count(ch) for ch in "äöüÄÖÜß") > 5000
    train_german = {de for de, _ in splits["train"]}
    assert not train_german & {de for de, _ in splits["dev"]}
    assert not train_german & {de for de, _ in splits["test"]}
    assert not set(splits["dev"]) & set(splits["test"])
    assert "trans-de-en" in open(os.path.join(out, "SOURCES.md"), encoding="utf-8").read()


# ---- built on first use: train.py --data debian-de-en ----------------------------------

def test_first_use_builds_then_reuses_the_complete_corpus(sources, tmp_path, monkeypatch):
    monkeypatch.setenv("TF_TRANSFORMER_DATA", str(tmp_path / "home"))
    calls = []
    real_build = build.build
    monkeypatch.setattr(build, "build", lambda out, log: calls.append(out) or real_build(
        out, ("ding", "ddtp"), log=log))
    messages = []
    directory = datasets.ensure_built("debian-de-en", log=messages.append)
    assert directory == str(tmp_path / "home" / "debian-de-en")
    assert calls == [directory] and build.is_complete(directory)
    assert read_splits(directory)["train"]
    assert datasets.ensure_built("debian-de-en", log=messages.append) == directory
    assert calls == [directory]  # the second call built nothing
    assert messages[-1] == f"corpus debian-de-en: reusing {directory}"


def test_a_corpus_without_its_marker_is_built_again(sources, tmp_path):
    run_build(tmp_path)
    assert build.is_complete(str(tmp_path))
    os.remove(tmp_path / build.COMPLETE_MARKER)  # as a rebuild cut short between two renames leaves it
    assert not build.is_complete(str(tmp_path))


def test_unknown_corpus_name_names_the_one_the_builder_makes(tmp_path):
    with pytest.raises(UserError, match="unknown corpus 'wmt14'; the builder makes debian-de-en"):
        datasets.ensure_built("wmt14", home=str(tmp_path))


def test_train_falls_back_to_the_embedded_corpus_when_the_archive_is_unreachable(tmp_path, monkeypatch):
    from tf_transformer.cli import train
    from tf_transformer.data import corpus

    def unreachable(name, log):
        raise DownloadError("package trans-de-en: Temporary failure resolving 'deb.debian.org'")

    monkeypatch.setattr(datasets, "ensure_built", unreachable)
    monkeypatch.chdir(tmp_path)  # no folder called debian-de-en here
    lines = []
    splits = train.corpus_from_args(train.parse_args(["--data", "debian-de-en"]), log=lines.append)
    assert splits == corpus.corpus_splits(corpus.DEFAULT_CORPUS)
    assert lines == ["warning: cannot build debian-de-en (package trans-de-en: Temporary failure resolving "
                     "'deb.debian.org'); training on the embedded corpus ding-de-en instead"]

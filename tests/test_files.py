"""Tests for ``tf_transformer.files``: reading text (plain or .gz) and atomic writes."""

import gzip
import os

import pytest

from tf_transformer import files
from tf_transformer.errors import UserError
from tf_transformer.files import read_text_lines as read_lines
from tf_transformer.files import iter_text_lines, write_atomic


def write_bytes(path, data):
    path.write_bytes(data)
    return str(path)


def write_gzip(path, data):
    with gzip.open(path, "wb") as f:
        f.write(data)
    return str(path)


def assert_one_line_naming(error, path):
    message = str(error)
    assert str(path) in message
    assert "\n" not in message


def assert_damaged_gzip(error, path):
    assert_one_line_naming(error, path)
    assert "gzip" in str(error)
    assert not str(error).rstrip().endswith("()")  # an explanation, not an empty one


# ---- read_text_lines: plain files ----------------------------------------------


def test_read_lines_invalid_utf8_names_line(tmp_path):
    path = write_bytes(tmp_path / "bad.txt", b"ok one\nok two\nbad \xff\xfe here\nok four\n")
    with pytest.raises(UserError) as info:
        read_lines(path)
    message = str(info.value)
    assert path in message
    assert f"{path}:3" in message


def test_read_lines_missing_file(tmp_path):
    path = str(tmp_path / "missing.txt")
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert path in str(info.value)


def test_read_lines_directory(tmp_path):
    with pytest.raises(UserError) as info:
        read_lines(str(tmp_path))
    assert str(tmp_path) in str(info.value)
    assert "directory" in str(info.value)


def test_read_lines_strips_crlf(tmp_path):
    path = write_bytes(tmp_path / "crlf.txt", b"guten tag\r\nhallo welt\r\n")
    assert read_lines(path) == ["guten tag", "hallo welt"]


def test_read_lines_no_trailing_empty_line(tmp_path):
    with_newline = write_bytes(tmp_path / "a.txt", b"a\nb\n")
    without_newline = write_bytes(tmp_path / "b.txt", b"a\nb")
    assert read_lines(with_newline) == ["a", "b"]
    assert read_lines(without_newline) == ["a", "b"]


def test_read_lines_keeps_inner_blank_lines_and_utf8(tmp_path):
    path = write_bytes(tmp_path / "u.txt", "für\n\nmöchte\n".encode("utf-8"))
    assert read_lines(path) == ["für", "", "möchte"]


def test_read_lines_empty_file(tmp_path):
    assert read_lines(write_bytes(tmp_path / "e.txt", b"")) == []


def test_read_lines_accepts_path_objects(tmp_path):
    path = tmp_path / "p.txt"
    path.write_bytes("Straße\n".encode("utf-8"))
    assert read_lines(path) == ["Straße"]


# ---- read_text_lines: .gz files ------------------------------------------------


def test_read_gz_transparently(tmp_path):
    text = "Grüße aus Köln\r\n\nÄrger über Öl\nlast line without newline"
    path = write_gzip(tmp_path / "train.de.gz", text.encode("utf-8"))
    assert read_lines(path) == ["Grüße aus Köln", "", "Ärger über Öl", "last line without newline"]


def test_read_gz_same_lines_as_plain(tmp_path):
    data = "".join(f"Zeile {i} mit ß und ü\n" for i in range(500)).encode("utf-8")
    plain = write_bytes(tmp_path / "x.txt", data)
    packed = write_gzip(tmp_path / "x.txt.gz", data)
    assert read_lines(packed) == read_lines(plain)
    assert len(read_lines(packed)) == 500


def test_read_empty_gz(tmp_path):
    assert read_lines(write_gzip(tmp_path / "e.gz", b"")) == []


def test_truncated_gz_is_one_line_user_error(tmp_path):
    full = tmp_path / "full.gz"
    write_gzip(full, os.urandom(20000))  # incompressible, so the cut lands inside the data
    data = full.read_bytes()
    path = write_bytes(tmp_path / "cut.de.gz", data[: len(data) // 2])
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert_damaged_gzip(info.value, path)


def test_damaged_gz_is_one_line_user_error(tmp_path):
    full = tmp_path / "full.gz"
    write_gzip(full, ("hallo welt\n" * 1000).encode("utf-8"))
    data = bytearray(full.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 8] = bytes(b ^ 0xFF for b in data[middle:middle + 8])
    path = write_bytes(tmp_path / "damaged.gz", bytes(data))
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert_damaged_gzip(info.value, path)


def test_not_gzip_named_gz_is_one_line_user_error(tmp_path):
    path = write_bytes(tmp_path / "plain.txt.gz", b"just text, not gzip\n")
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert_damaged_gzip(info.value, path)


def test_invalid_utf8_in_gz_names_file_and_line(tmp_path):
    path = write_gzip(tmp_path / "bad.en.gz", b"one\ntwo\nthree\nfo\xc3ur\n")
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert f"{path}:4" in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_gz_file(tmp_path):
    path = str(tmp_path / "missing.gz")
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert_one_line_naming(info.value, path)


@pytest.mark.parametrize("error", [EOFError(), EOFError("ended early")])
def test_gzip_eof_error_message_is_never_empty(tmp_path, monkeypatch, error):
    path = write_gzip(tmp_path / "x.gz", b"a\n")

    def failing_open(*args, **kwargs):
        raise error

    monkeypatch.setattr(files.gzip, "open", failing_open)
    with pytest.raises(UserError) as info:
        read_lines(path)
    assert_damaged_gzip(info.value, path)


# ---- write_atomic ----------------------------------------------------------------


def test_write_atomic_str_is_utf8(tmp_path):
    path = tmp_path / "out.txt"
    write_atomic(str(path), "Maß\nÜbung\n")
    assert path.read_bytes() == "Maß\nÜbung\n".encode("utf-8")
    assert os.listdir(tmp_path) == ["out.txt"]


def test_write_atomic_bytes(tmp_path):
    path = tmp_path / "out.bin"
    payload = bytes(range(256)) * 3
    write_atomic(str(path), payload)
    assert path.read_bytes() == payload
    assert os.listdir(tmp_path) == ["out.bin"]


def test_write_atomic_replaces_existing_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old contents that are longer than the new ones\n", encoding="utf-8")
    write_atomic(str(path), "new\n")
    assert path.read_text(encoding="utf-8") == "new\n"
    assert os.listdir(tmp_path) == ["out.txt"]


def test_write_atomic_relative_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_atomic("rel.txt", "x")
    assert (tmp_path / "rel.txt").read_text(encoding="utf-8") == "x"
    assert os.listdir(tmp_path) == ["rel.txt"]


def test_write_atomic_failed_rename_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "vocab.tsv"
    path.write_bytes(b"previous\n")

    def failing_replace(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(files.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk on fire"):
        write_atomic(str(path), "replacement\n")
    assert path.read_bytes() == b"previous\n"
    assert os.listdir(tmp_path) == ["vocab.tsv"]


def test_write_atomic_failed_write_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    path.write_bytes(b"previous")

    def failing_fsync(fd):
        raise OSError("fsync failed")

    monkeypatch.setattr(files.os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="fsync failed"):
        write_atomic(str(path), b"replacement")
    assert path.read_bytes() == b"previous"
    assert os.listdir(tmp_path) == ["model.bin"]


def test_write_atomic_interrupted_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "out.txt"

    def interrupted(src, dst):
        raise KeyboardInterrupt

    monkeypatch.setattr(files.os, "replace", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_atomic(str(path), "data")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("block_size", [1, 3, 7, 1 << 20])
def test_lines_read_a_block_at_a_time_are_the_lines_of_the_whole_file(tmp_path, block_size):
    path = tmp_path / "text.txt"
    path.write_bytes("eins\r\nzwei drei\n\nGröße\nletzte".encode("utf-8"))
    assert list(iter_text_lines(str(path), block_size)) == ["eins", "zwei drei", "", "Größe", "letzte"]
    path.write_bytes(b"ok\n\xff bad\n")
    with pytest.raises(UserError, match=r"text.txt:2: not valid UTF-8"):
        list(iter_text_lines(str(path), block_size))

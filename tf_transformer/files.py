"""Small file helpers shared by the entry points."""

import os
import tempfile

from tf_transformer.errors import UserError


def write_atomic(path, text):
    """Writes ``text`` to ``path`` so that readers see the old file or the whole new one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_text_lines(path):
    """All lines of a UTF-8 text file, without line ends (``\\r\\n`` too).

    Raises:
      UserError: the file is missing or a directory, or a line is not valid
        UTF-8 (the message names the file and the line).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read().split(b"\n")
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a text file") from None
    if raw and raw[-1] == b"":
        raw.pop()
    lines = []
    for number, line in enumerate(raw, 1):
        try:
            lines.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise UserError(f"{path}:{number}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    return lines

"""Small file helpers shared by the entry points."""

import errno
import gzip
import os
import shutil
import tempfile
import zlib

from tf_transformer.errors import UserError


def write_atomic(path, data):
    """Writes ``data`` (str as UTF-8, or bytes) to ``path`` so that readers see the
    old file or the whole new one."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes it 0600; give it the usual permissions
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def replace_directory(new, path):
    """Moves the complete directory ``new`` to ``path``, replacing what is there: the old one is
    renamed away first (beside ``new``), then deleted."""
    old = None
    if os.path.exists(path):
        old = tempfile.mkdtemp(dir=os.path.dirname(new), prefix=".tmp-old-")
        os.rename(path, os.path.join(old, os.path.basename(path)))
    os.rename(new, path)
    if old:
        shutil.rmtree(old, ignore_errors=True)


def read_text_lines(path):
    """All lines of a UTF-8 text file: :func:`iter_text_lines` as a list."""
    return list(iter_text_lines(path))


def iter_text_lines(path, block_size=1 << 20):
    """The lines of a UTF-8 text file (gzip-compressed when the name ends in
    ``.gz``), read a block at a time, without line ends (``\\r\\n`` too; a file
    whose first block has no ``\\n`` but a ``\\r`` has its lines ended by ``\\r``,
    as old Mac files: see :func:`split_lines`).

    Raises (while iterating):
      UserError: the file is missing, a directory or a damaged .gz, or a line
        is not valid UTF-8 (the message names the file and the line).
    """
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            pending = f.read(block_size)
            separator = line_separator(pending)
            number = 0
            while True:
                block = f.read(block_size)
                raw = pending.split(separator)
                pending = raw.pop()
                if not block:  # the last line, unless the file ends with a line end
                    raw += [pending] if pending else []
                yield from decode_lines(raw, f"{path}:", first=number + 1, last_is_line=True)
                number += len(raw)
                if not block:
                    return
                pending += block
    except FileNotFoundError:
        raise UserError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a text file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise UserError(f"{path}: a damaged gzip file ({str(e) or 'it ends too early'})") from None


def line_separator(data):
    """The line end of ``bytes`` text: ``\\n``; ``\\r`` for a text without any ``\\n``
    but with ``\\r`` (CR-only line ends). A lone ``\\r`` inside a ``\\n``-ended line
    stays part of it, so one side of a parallel corpus never gains lines that the
    other side lacks."""
    return b"\r" if b"\n" not in data and b"\r" in data else b"\n"


def split_lines(data):
    """``bytes`` -> lines, split at :func:`line_separator`."""
    return data.split(line_separator(data))


def decode_lines(raw, where, first=1, last_is_line=False):
    """UTF-8 ``bytes`` lines (a final empty one dropped unless ``last_is_line``) -> str lines
    without ``\\r``; ``first`` is the number of ``raw[0]``.

    Raises:
      UserError: ``"{where}{line}: not valid UTF-8 ..."`` for the first bad line.
    """
    if raw and raw[-1] == b"" and not last_is_line:
        raw = raw[:-1]
    lines = []
    for number, line in enumerate(raw, first):
        try:
            lines.append(line.decode("utf-8").rstrip("\r"))
        except UnicodeDecodeError as e:
            raise UserError(f"{where}{number}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    return lines


def check_writable_directory(path, what):
    """Refuses a directory that could not be created or written, without creating it: the
    nearest existing ancestor must be a directory where a folder can be made (it is tried).

    Raises:
      UserError: naming ``what`` (e.g. ``--export-dir``), ``path`` and the reason.
    """
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UserError(f"{what} {path}: {existing} is a file, expected a directory")
    try:
        os.rmdir(tempfile.mkdtemp(dir=existing, prefix=".tmp-probe-"))
    except OSError as e:
        raise UserError(f"{what} {path}: cannot write in {existing} ({e.strerror})") from None


# What a write meets on a full, read-only or forbidden disk: errno values, and the words of
# TensorFlow's errors (which carry no errno).
_DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
_DISK_WORDS = ("No space left on device", "Disk quota exceeded", "Read-only file system", "Permission denied")


def is_disk_problem(error):
    """Whether ``error`` (an ``OSError`` or a TensorFlow error) says the disk is full, read-only or
    forbidden: a fault of the place, not of the program."""
    return getattr(error, "errno", None) in _DISK_ERRNOS or any(word in str(error) for word in _DISK_WORDS)


def free_space(path):
    """The free space of the file system holding ``path`` (or its nearest existing ancestor), as text."""
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    free = shutil.disk_usage(existing).free
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if free >= size:
            return f"{free / size:.1f} {unit}"
    return f"{free} bytes"


def disk_error(error, what, path, advice="free some space (or choose another place) and run the same command again"):
    """A one-line :class:`UserError` for a write of ``path`` that failed on its disk (see
    :func:`is_disk_problem`): names ``what`` (e.g. ``--output``), the folder, the reason, and the
    free space there."""
    reason = os.strerror(error.errno) if getattr(error, "errno", None) else \
        next((word for word in _DISK_WORDS if word in str(error)), str(error).strip().splitlines()[0])
    return UserError(f"{what} {path}: cannot write it ({reason}; {free_space(path)} free there); {advice}")

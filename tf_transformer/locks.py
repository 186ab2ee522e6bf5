"""One writer per directory: an OS file lock held while a process writes there.

:class:`DirectoryLock` takes ``fcntl.flock`` on ``DIRECTORY/.lock`` and writes
its PID into it. The kernel releases the lock when the process ends in any way
(SIGKILL included), so a dead holder never leaves a stale lock: its file may
stay behind, but the next process locks it at once. A live holder makes a
second process fail with one line naming the directory and the holder's PID
(``wait=False``, a model directory) or wait its turn (``wait=True``, an
export directory, so that concurrent exports get consecutive versions).

Locks are re-entrant within a process: ``train.py`` holds its model
directory's lock and exports from it, which takes the same lock again.
"""

import fcntl
import os

from tf_transformer.errors import UserError

LOCK_FILE = ".lock"
# realpath of a locked directory -> [file descriptor, depth, whether to remove it if empty], for this process.
_HELD = {}


def prepare_directory(path, what):
    """Creates ``path`` (and its parents) if missing.

    Raises:
      UserError: ``path`` is a file, or cannot be created (naming ``what``, e.g. ``--model-dir``).
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"{what} {path}: is a file, expected a directory")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise UserError(f"{what} {path}: cannot create it ({e.strerror})") from None


def holder(path):
    """The PID written in ``path``'s lock file, as text ("unknown" when unreadable)."""
    try:
        with open(os.path.join(path, LOCK_FILE), encoding="ascii") as f:
            return f.read().strip() or "unknown"
    except (OSError, ValueError):
        return "unknown"


class DirectoryLock:
    """``with DirectoryLock(path, what):`` holds the exclusive lock of directory ``path``.

    Args:
      path: the directory (created if missing, see :func:`prepare_directory`).
      remove_if_unused: remove it again on release if this lock created it and it is still
        empty (so a run refused early leaves no model directory behind).
      what: how messages name it, e.g. ``--model-dir``.
      wait: wait for a live holder instead of failing; ``on_wait(line)`` is told once.
    Raises:
      UserError: (``wait=False``) another process holds it: the directory and its PID are named.
    """

    def __init__(self, path, what, wait=False, on_wait=None, remove_if_unused=False):
        self.path, self.what, self.wait, self.on_wait = path, what, wait, on_wait
        self.remove_if_unused = remove_if_unused
        self.key = None
        self.created = False

    def __enter__(self):
        self.created = self.remove_if_unused and not os.path.exists(self.path)
        prepare_directory(self.path, self.what)
        self.key = os.path.realpath(self.path)
        if self.key in _HELD:
            _HELD[self.key][1] += 1
            return self
        fd = self._acquire(os.path.join(self.path, LOCK_FILE))
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        _HELD[self.key] = [fd, 1, self.created]
        return self

    def _acquire(self, lock_path):
        """Locks ``lock_path``; returns its descriptor. Retries when the file was replaced meanwhile
        (a holder removes it as it releases), so that the lock held is the file's lock."""
        while True:
            try:
                fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as e:
                raise UserError(f"{self.what} {self.path}: cannot write there ({e.strerror})") from None
            try:
                self._lock(fd)
                if os.path.samestat(os.fstat(fd), os.stat(lock_path)):
                    return fd
            except FileNotFoundError:
                pass  # removed by the holder as it released: lock the new one
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)

    def _lock(self, fd):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pid = holder(self.path)
        if not self.wait:
            raise UserError(f"{self.what} {self.path}: in use by process {pid} (another train.py or export "
                            f"writes there); wait until it ends, or use another directory")
        if self.on_wait is not None:
            self.on_wait(f"{self.path}: waiting for process {pid}, which writes there")
        fcntl.flock(fd, fcntl.LOCK_EX)

    def __exit__(self, *exc_info):
        entry = _HELD[self.key]
        entry[1] -= 1
        if entry[1] == 0:
            del _HELD[self.key]
            try:
                os.unlink(os.path.join(self.path, LOCK_FILE))  # still locked: no one else holds this file
                if entry[2] and not os.listdir(self.path):
                    os.rmdir(self.path)
            except OSError:
                pass
            os.close(entry[0])

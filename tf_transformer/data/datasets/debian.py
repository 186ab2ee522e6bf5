"""Fetching from Debian's package archive, the only source of text this machine reaches.

A :class:`DebianCache` keeps everything under one folder, so a second build
reuses what the first downloaded::

  CACHE/
    debs/NAME_VERSION_ARCH.deb     from `apt-get download NAME`
    tree/NAME/...                  the unpacked package (`dpkg-deb -x`)
    lists/*_i18n_Translation-LL.lz4  description indexes (a private `apt-get update`)
    downloads.log                  one line per package downloaded

While a source downloads (:meth:`DebianCache.fetching`), one progress bar
counts its packages; their names go to ``downloads.log``, not to the output.

Each step writes into a temporary sibling and renames it into place when it
is complete, so an interrupted build never leaves a half-written package tree.
The system's own apt state is never changed.
"""

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile

from tf_transformer.errors import UserError
from tf_transformer.progress import Progress

APT_HELPER = "/usr/lib/apt/apt-helper"
DOWNLOAD_LOG = "downloads.log"  # in the cache: the packages downloaded, one line each

# Download the description translations too; the base image sets
# Acquire::Languages "none", so `apt-get update` would skip them.
_LANGUAGES_CONFIG = """#clear Acquire::Languages;
Acquire::Languages {{ {languages} }};
"""


class DownloadError(UserError):
    """A package or index could not be fetched; the message names it."""


def _run(command, what, cwd=None):
    """Runs ``command``; a failure raises DownloadError naming ``what`` and apt's last line."""
    try:
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise DownloadError(f"{what}: '{command[0]}' is not installed; the corpus builder needs "
                            f"Debian's apt and dpkg") from None
    if done.returncode != 0:
        lines = [line for line in (done.stderr + done.stdout).splitlines()
                 if line.strip() and not line.startswith("W: Download is performed unsandboxed")]
        detail = lines[-1] if lines else f"exit code {done.returncode}"
        raise DownloadError(f"{what}: {detail}")
    return done.stdout


class DebianCache:
    """Downloads and unpacks Debian packages and indexes into ``root``, once.

    Example:
      >>> cache = DebianCache("data/cache")
      >>> tree = cache.package_tree("trans-de-en")   # doctest: +SKIP
      >>> os.path.join(tree, "usr/share/trans/de-en")  # doctest: +SKIP
    """

    def __init__(self, root, log=print):
        self.root = os.path.abspath(root)
        self.log = log
        self.download_log = os.path.join(self.root, DOWNLOAD_LOG)
        self._bar = None  # the progress bar of :meth:`fetching`

    @contextlib.contextmanager
    def fetching(self, source, packages):
        """One progress bar (on a terminal) for the ``packages`` of ``source`` that are not cached yet (none
        when all are), after one line naming :attr:`download_log`, where each package downloaded is written."""
        missing = [package for package in packages if not self._cached(package)]
        if missing:
            self.log(f"{source}: downloading {len(missing)} Debian package(s) with apt-get download "
                     f"(names in {self.download_log})")
        # drawn on a terminal only (disable=None); a failed source's bar goes, leaving its error the last line
        self._bar = Progress(len(missing), disable=None if missing else True, unit="package", desc=source)
        try:
            yield
            self._bar.close()
        finally:
            self._bar.close(leave=False)
            self._bar = None

    def _cached(self, package):
        """Whether ``package`` is unpacked or downloaded already."""
        return os.path.isdir(os.path.join(self.root, "tree", package)) \
            or bool(glob.glob(os.path.join(self.root, "debs", f"{package}_*.deb")))

    def _downloading(self, package):
        """Writes ``package`` to :attr:`download_log` (and the bar of :meth:`fetching`, if any, counts it)."""
        with open(self.download_log, "a", encoding="utf-8") as f:
            f.write(f"downloading {package} (apt-get download)\n")
        if self._bar is not None:
            self._bar.update(1)

    def deb(self, package):
        """Path of ``package``'s .deb, downloaded with ``apt-get download`` unless cached."""
        debs = os.path.join(self.root, "debs")
        os.makedirs(debs, exist_ok=True)
        found = sorted(glob.glob(os.path.join(debs, f"{package}_*.deb")))
        if found:
            return found[-1]
        with tempfile.TemporaryDirectory(dir=debs, prefix=".download-") as tmp:
            os.chmod(tmp, 0o755)  # lets apt's sandbox user write into it
            _run(["apt-get", "download", "-q", package], f"package {package}", cwd=tmp)
            got = glob.glob(os.path.join(tmp, f"{package}_*.deb"))
            if not got:
                raise DownloadError(f"package {package}: apt-get download produced no .deb")
            final = os.path.join(debs, os.path.basename(got[0]))
            os.replace(got[0], final)
        self._downloading(package)
        return final

    def package_tree(self, package):
        """Folder holding ``package``'s unpacked files (``dpkg-deb -x``), unpacked once."""
        tree = os.path.join(self.root, "tree", package)
        if os.path.isdir(tree):
            return tree
        deb = self.deb(package)
        os.makedirs(os.path.dirname(tree), exist_ok=True)
        tmp = tempfile.mkdtemp(dir=os.path.dirname(tree), prefix=f".{package}-")
        try:
            _run(["dpkg-deb", "-x", deb, tmp], f"package {package} ({deb})")
            os.replace(tmp, tree)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        return tree

    def translation_indexes(self, language, languages=("en", "de")):
        """Paths of the ``Translation-<language>`` indexes (lz4), fetched with a private
        ``apt-get update`` into ``CACHE/lists`` once; the system's lists are untouched."""
        lists = os.path.join(self.root, "lists")
        pattern = os.path.join(lists, f"*_i18n_Translation-{language}*")
        if not glob.glob(pattern):
            tmp = tempfile.mkdtemp(dir=self.root, prefix=".lists-")
            try:
                os.makedirs(os.path.join(tmp, "partial"))
                config = os.path.join(tmp, "apt.conf")
                with open(config, "w") as f:
                    f.write(_LANGUAGES_CONFIG.format(languages=" ".join(f'"{l}";' for l in languages)))
                self.log(f"fetching the description indexes ({', '.join(languages)}) with a private apt-get update")
                _run(["apt-get", "update", "-q", "-c", config, "-o", f"Dir::State::Lists={tmp}"],
                     "apt-get update (description indexes)")
                shutil.rmtree(lists, ignore_errors=True)
                os.replace(tmp, lists)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
        found = sorted(p for p in glob.glob(pattern) if not p.endswith(".partial"))
        if not found:
            raise DownloadError(f"apt-get update fetched no Translation-{language} index; "
                                f"check the sources in /etc/apt/sources.list.d")
        return found

    @staticmethod
    def read_index(path):
        """An index file's text, decompressed with apt-helper (lz4, xz, gz or plain)."""
        return _run([APT_HELPER, "cat-file", path], f"index {path}")
